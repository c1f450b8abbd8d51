"""The screenshots in screenshots/ show what the TUI shows today: taken from the live demo (not a
replay), with the current profile format, the footer's keys as the app binds them now, the GPU
panel and the batch-size line, and tuitune's own help. A stale picture fails here; `make
screenshots` (screenshots/make.py) takes them again."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from textual.app import App

from tuitune.tui.app import WIDE_FOOTER_COLS, TuituneApp
from tuitune.tui.help import GROUPS, TOUR_TITLE
from tuitune_support import scenes as make  # screenshots/make.py's scenes, sizes and file names
from tuitune_support.paths import ROOT

SHOTS = ROOT / "screenshots"

FORMAT = re.search(r"format version (\d+)", (ROOT / "docs" / "profile-format.md").read_text()).group(1)


def svg_lines(path: Path) -> list[str]:
    """The screen's text, line by line, from a Textual SVG screenshot."""
    rows: dict[int, list[tuple[float, str]]] = {}
    for m in re.finditer(
        r'<text[^>]*x="([\d.]+)"[^>]*clip-path="url\(#terminal-(?:\d+-)?line-(\d+)\)"[^>]*>([^<]*)</text>',
        path.read_text(),
    ):
        text = html.unescape(m.group(3)).replace("\xa0", " ").replace("\n", "")
        rows.setdefault(int(m.group(2)), []).append((float(m.group(1)), text))
    out = []
    for line in sorted(rows):
        s = ""
        for x, text in sorted(rows[line]):
            s = s.ljust(round(x / 12.2)) + text
        out.append(s)
    return out


def footer_pairs() -> list[tuple[str, str]]:
    """(key, label) of every binding the live footer shows, in order."""
    app = App()
    return [
        (app.get_key_display(b), b.description)
        for b in TuituneApp.BINDINGS
        if b.show and b.action.split("(")[0] not in TuituneApp.REPLAY_ONLY
    ]


@pytest.mark.parametrize("size", make.SIZES, ids=[f"{w}x{h}" for w, h in make.SIZES])
def test_the_screenshots_are_of_todays_live_demo(size):
    for scene in make.SHOTS:
        assert (SHOTS / make.file_name(scene, size)).exists(), f"run `make screenshots`: {scene} at {size}"
    main = svg_lines(SHOTS / make.file_name("main", size))
    assert len(main) == size[1], len(main)
    head = main[0]
    assert "demo" in head and "ready" in head and "replay" not in head, head  # live, not a replayed capture
    text = "\n".join(main)
    assert "gpus · 8 × NVIDIA H200" in text and "batch sizes" in text, text
    profiles = [
        ln for s in make.SHOTS for ln in svg_lines(SHOTS / make.file_name(s, size)) if "EAGLE3_PROFILE v=" in ln
    ]
    assert profiles and all(f"EAGLE3_PROFILE v={FORMAT} " in ln for ln in profiles), profiles[:3]
    # the footer as the app binds it today: the same keys with the same labels, in the same order
    footer = main[-1]
    fits = [f"{k} {label}" for k, label in footer_pairs()]
    shown = [item for item in fits if item in footer]
    assert shown == fits[: len(shown)] and len(shown) >= 10, (footer, fits)
    assert ("^p palette" in footer) == (size[0] >= WIDE_FOOTER_COLS), footer
    positions = [footer.index(item) for item in shown]
    assert positions == sorted(positions), footer


@pytest.mark.parametrize("size", make.SIZES, ids=[f"{w}x{h}" for w, h in make.SIZES])
def test_the_help_screenshot_is_tuitunes_help(size):
    text = "\n".join(svg_lines(SHOTS / make.file_name("help", size)))
    for title, _ in GROUPS:
        assert re.search(rf"█.*\b{re.escape(title)}\b", text), title
    assert TOUR_TITLE in text


def test_the_package_reads_no_test_data():
    """The scenes of the tests and the screenshots are dev scripts outside the package (issue 23)."""
    assert not (ROOT / "tuitune" / "tui" / "screenshots.py").exists()
    for path in (ROOT / "tuitune").rglob("*.py"):
        assert '"tests"' not in path.read_text(), path
