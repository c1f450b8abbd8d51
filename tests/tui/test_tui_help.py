"""Issue 28, what a newcomer trips on: every tab and action reachable by a key and in the palette,
the footer's keys at 80×24, tuitune's own help with the first five minutes, a save dialog that
starts on the name and warns about real mismatches only, shipped names asked about, and the runs
table explaining its marks. On the deterministic replay, plus the simulator for the live footer."""

from __future__ import annotations

import re

import pytest
from textual.widgets import Footer, Input

from tuitune import preset as P
from tuitune.machine.session import Session
from tuitune.tui.app import TuituneApp
from tuitune.tui.describe import mentions, stale_description
from tuitune.tui.help import GROUPS, TOUR, HelpScreen
from tuitune.tui.palette import TuituneCommands
from tuitune.tui.runs import legend
from tuitune.tui.screens import ConfirmScreen, RelaunchScreen, SaveScreen
from tuitune.tui.settings import UserConfig
from tuitune_support.paths import ROOT
from tuitune_support.pilot import until
from tuitune_support.presets import make_preset
from tuitune_support.scenes import _runs, scene_app

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
TOUR_KEYS = ["l", "b", "3", "a", "r", "b", "m", "s"]  # l load → b bench → advisor → a → r → b → m → s


def footer_keys(app) -> list[str]:
    footer = app.screen.query_one(Footer)
    return [k.key for k in footer.query("FooterKey") if k.region.width > 0 and k.region.right <= app.size.width]


# ---- keys, tabs and the palette ---------------------------------------------------------------------


async def test_every_tab_is_reachable_by_a_key():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        seen = []
        for _ in range(3):  # g: log → chart → advisor → log
            await pilot.press("g")
            seen.append(app.tabs.active)
        assert seen == ["tab-chart", "tab-advisor", "tab-log"]
        for key, tab in (("3", "tab-advisor"), ("2", "tab-chart"), ("1", "tab-log")):
            await pilot.press(key)
            assert app.tabs.active == tab
        await pilot.press("3")
        await pilot.pause()
        assert app.advisor.rows and app.advisor.region.height > 0  # the advisor drew, from the keyboard


def test_every_action_with_a_key_is_in_the_palette():
    palette = {action for _, action, _, _ in TuituneCommands.COMMANDS}
    system = {"quit_app", "help"}  # Quit (through the dialog) and Keys (tuitune's help) are system commands
    for b in TuituneApp.BINDINGS:
        if b.action in ("leave_input",):  # Esc leaves a text field: not a command
            continue
        assert b.action in palette | system, f"{b.key} ({b.action}) is not in the command palette"
    for _, action, bid, _ in TuituneCommands.COMMANDS:
        name = action.split("(")[0]
        assert hasattr(TuituneApp, f"action_{name}"), action
        assert bid is None or any(b.id == bid for b in TuituneApp.BINDINGS), bid


def palette_prompts(app) -> list[str]:
    found = app.screen.query("CommandList")
    if not found:
        return []
    options = found.first()
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def test_the_palette_finds_the_advisor_and_quit_says_it_asks():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"advisor")
        await until(pilot, lambda: palette_prompts(app), 5, "palette hits")
        prompts = palette_prompts(app)
        assert prompts[0].startswith("Show the advisor") and "3 · " in prompts[0], prompts
        await pilot.press("enter")
        await until(pilot, lambda: app.tabs.active == "tab-advisor", 5, "the advisor tab")
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"quit")
        await until(pilot, lambda: any("Quit" in p for p in palette_prompts(app)), 5, "palette hits")
        text = " ".join(palette_prompts(app))
        assert "as soon as possible" not in text and "asks first while a server" in text, text


async def test_the_live_footer_at_80x24_shows_the_tour_keys(tmp_path):
    p = make_preset(tmp_path, "foot")
    session = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(session, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: session.state.state == "ready" and not isinstance(app.screen, RelaunchScreen), 30, "ready"
        )
        await until(pilot, lambda: footer_keys(app), 5, "the footer")
        keys = footer_keys(app)
        assert keys[:2] == ["question_mark", "q"], keys
        assert {"l", "b", "g", "a", "r", "m", "s", "e"} <= set(keys), keys  # the tour's keys, whole
        await session.close(stop_server=True)


# ---- the help ------------------------------------------------------------------------------------


@SIZES
async def test_help_is_tuitunes_own_by_task_and_fits(size):
    app = scene_app()
    app.user_config = UserConfig(keymap={"tuitune.save": "S"})
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        assert isinstance(app.screen, HelpScreen) and not app.screen.query("HelpPanel")
        box = app.screen.query_one("#help-box")
        screen = app.screen.region
        assert screen.contains_region(box.region)
        text = {}
        for group in app.screen.query(".group"):
            assert screen.contains_region(group.region) and box.region.contains_region(group.region), group
            text[group.id] = str(group.render())
        titles = [t.splitlines()[0] for t in text.values()]
        assert sorted(titles) == sorted(title for title, _ in GROUPS)  # watch, change…, measure, decide, save
        every = "\n".join(text.values())
        assert re.search(r"^ S +save as a preset of yours$", every, re.M), every  # the keymap's key
        assert re.search(r"^ 3 +advisor: predicted goodput$", every, re.M)
        assert "seek 10 s" in every and "background load" not in every  # a replay: its own keys only
        assert "cursor" not in every.lower() and "page left" not in every.lower()  # not Textual's panel
        tour = app.screen.query_one("#tour")
        box.scroll_end(animate=False)  # applied after a refresh: under CI's load one pause was not enough
        await until(pilot, lambda: box.region.contains_region(tour.region), 5, "the tour, reached by scrolling")
        lines = str(tour.render()).splitlines()
        assert lines[0].startswith("the first five minutes")
        assert [ln.split()[1] for ln in lines[1:]] == ["l", "b", "3", "a", "r", "b", "m", "S"]
        await pilot.press("question_mark")  # ? again closes it
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"keys", "enter")  # the palette's Keys is tuitune's help too
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "the help from the palette")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


def test_the_tour_page_says_what_the_help_says():
    """docs/tour.md walks the same steps, with the same keys, in the same order as the help's tour."""
    text = (ROOT / "docs" / "tour.md").read_text()
    steps = re.findall(r"^\d+\. \*\*`([^`]+)`\*\*", text, re.M)
    keys = {b.id: b.key for b in TuituneApp.BINDINGS}
    assert steps == [keys[bid] for bid, _ in TOUR] == TOUR_KEYS, steps
    assert "tuitune demo" in text and "80×24" in text


# ---- the save dialog -----------------------------------------------------------------------------


def test_numbers_in_a_description_are_matched_as_numbers():
    d = "EAGLE-3, 2 steps, topk 1 on Kimi-K2.5 (H200 x8), 0.88 memory"
    assert not mentions(d, 3) and not mentions(d, 8) and mentions(d, 1) and mentions(d, "0.88")
    assert mentions("EAGLE-3, 2 steps", 2) and not mentions("EAGLE-3, 2 steps", 3)
    assert not mentions("Kimi-K2.5 on H200", 2.5) and not mentions("Kimi-K2.5 on H200", 200)
    assert mentions("mem 0.88", 0.88) and mentions("mem 0.880", "0.88") and not mentions("3.5 GB", 3)
    assert mentions("3-step EAGLE", 3) and mentions("ends with 3.", 3) and not mentions(d, True)
    assert mentions("NCCL LL only", "LL") and not mentions("LL128 only", "LL")


async def test_save_starts_on_the_name_and_warns_only_about_a_real_mismatch(tmp_path, monkeypatch):
    """The issue's keys: s, End, 4× Backspace, a name, Enter. The description "EAGLE-3, 2 steps…" said
    "mentions 3" (of EAGLE-3) and took the typed name, as the focus started in it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.preset_path = None
        app.loaded = app.draft = P.with_changes(app.draft, {"name": "demo", "description": "EAGLE-3 with topk 1"})
        app.config.load(app.draft)
        app.config.query_one("#spec-num-steps").value = "3"  # 2 → 3; draft tokens 3 → 4 (derived)
        await pilot.pause()
        assert stale_description(app.loaded, app.draft) == ""  # no 2, and the 3 is EAGLE-3's
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, SaveScreen)
        assert app.focused is app.screen.query_one("#save-path", Input)
        assert not app.screen.query_one("#save-stale").display
        await pilot.press("end", *["backspace"] * 4, *"nc-demo-topk2", "enter")
        await pilot.pause()
        saved = P.load(P.user_dir() / "nc-demo-topk2.yaml")
        assert saved.name == "nc-demo-topk2" and saved.description == "EAGLE-3 with topk 1"
        assert saved.speculative.num_steps == 3
        # a description that does mention the old value is flagged, and the flag goes as it is fixed
        app.loaded = app.draft = P.with_changes(saved, {"description": "EAGLE-3, 3 steps, topk 1"})
        app.config.load(app.draft)
        app.config.query_one("#spec-num-steps").value = "4"
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        note = app.screen.query_one("#save-stale")
        assert note.display and "mentions 3, but speculative.num_steps is now 4" in str(note.render())
        desc = app.screen.query_one("#save-description", Input)
        desc.value = "EAGLE-3, 4 steps, topk 1"
        await pilot.pause()
        assert not note.display
        await pilot.press("escape")


def test_a_stale_description_is_put_right_where_the_mention_is_sure():
    from tuitune.tui.describe import rewrite_description

    base = P.load(P.find("demo"))
    loaded = P.with_changes(base, {"description": "EAGLE-3, 2 steps, topk 1, TP 8"})
    draft = P.with_changes(loaded, {"speculative.num_steps": 4})
    # the 2 beside "steps" (the derived draft tokens 3 -> 5 is not mentioned); EAGLE-3 and TP 8 stay
    assert rewrite_description(loaded, draft, loaded.description) == "EAGLE-3, 4 steps, topk 1, TP 8"
    assert rewrite_description(loaded, loaded, loaded.description) is None  # nothing changed
    # a value named twice, neither beside the key's words: not placed surely, not rewritten
    twice = P.with_changes(base, {"description": "NCCL LL, and LL only", "env.NCCL_PROTO": "LL"})
    assert rewrite_description(twice, P.with_changes(twice, {"env.NCCL_PROTO": "Simple"}), twice.description) is None
    once = P.with_changes(base, {"description": "NCCL LL", "env.NCCL_PROTO": "LL"})
    assert rewrite_description(once, P.with_changes(once, {"env.NCCL_PROTO": "Simple"}), "NCCL LL") == "NCCL Simple"


async def test_the_save_dialog_fixes_the_description_and_gives_a_new_name_its_own_log(tmp_path, monkeypatch):
    """The save dialog warned about a stale description and offered no way to fix it, and a preset
    saved under a new name kept the old one's log (both would write, and read, one file)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    app = scene_app()
    async with app.run_test(size=(100, 30)) as pilot:
        app.preset_path = None
        app.loaded = app.draft = P.with_changes(
            app.draft, {"name": "demo", "description": "EAGLE-3, 2 steps", "server.log": "~/logs/demo.log"}
        )
        app.config.load(app.draft)
        app.config.query_one("#spec-num-steps").value = "5"
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        note = app.screen.query_one("#save-stale")
        assert note.display and "ctrl+r makes it: EAGLE-3, 5 steps" in str(note.render())
        await pilot.press(*["backspace"] * 4, *"five")
        await pilot.pause()
        slot = str(app.screen.query_one("#save-slot").render())
        assert "log ~/logs/five.log" in slot and "the port is demo's: one of them runs at a time" in slot, slot
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.screen.query_one("#save-description", Input).value == "EAGLE-3, 5 steps" and not note.display
        await pilot.press("enter")
        await pilot.pause()
    saved = P.load(P.user_dir() / "five.yaml")
    assert saved.description == "EAGLE-3, 5 steps" and str(saved.server.log) == "~/logs/five.log"
    assert saved.server.port == app.loaded.server.port


async def test_saving_over_a_shipped_name_asks_and_the_list_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.preset_path = None
        app.loaded = app.draft = P.with_changes(app.draft, {"name": "demo"})
        await pilot.press("s")
        await pilot.pause()
        assert app.screen.query_one("#save-shadow").display  # said before Enter
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and "shipped preset's name" in app.screen.question
        await pilot.press("escape")  # no: back to the dialog, the name as typed
        await pilot.pause()
        assert isinstance(app.screen, SaveScreen) and app.screen.query_one("#save-path", Input).value == "demo"
        assert not (P.user_dir() / "demo.yaml").exists()
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert (P.user_dir() / "demo.yaml").exists() and "hides the shipped demo" in app.messages[-1]
        await pilot.press("s", "enter")  # yours already hides it: nothing more to ask
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen | SaveScreen)
    mine = next(e for e in P.entries() if e.origin == "user")
    assert mine.shadows == P.shipped_dir() / "demo.yaml"
    assert "(hides the shipped demo)" in P.format_listing([mine])


# ---- the runs table ----------------------------------------------------------------------------------


async def test_runs_table_selects_a_new_run_and_explains_its_marks():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        _runs(app)
        await pilot.pause(0.3)
        assert app.runs_table.cursor_row == 2  # the newest: m marks it
        assert str(app.runs_table.border_subtitle) == legend(app.book)
        assert "▲▼ p<0.05 and ratio CI beyond ±1%" in legend(app.book)
        app.set_focus(None)
        await pilot.press("m")
        assert app.book.baseline_id == 3
