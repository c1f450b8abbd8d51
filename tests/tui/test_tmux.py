"""The real `tuitune demo` in a real terminal (tmux): change the steps with keys, relaunch, see it;
and at 80×24 the cycle bars, the log and the footer's `?` and `q` are all on screen.

Each test has its own tmux socket (-L, unique name), HOME and simulator port (`demo --port`), so it
never meets another test run's demo."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tuitune_support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (.ci/run installs it)")


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class Term:
    def __init__(self, tmp_path: Path, cols: int, rows: int):
        self.sock = f"tt-{uuid.uuid4().hex[:12]}"
        self.home = tmp_path
        self.port = free_port()
        exe = Path(sys.executable).parent / "tuitune"
        cmd = f"{exe} demo" if exe.exists() else f"{sys.executable} -m tuitune demo"
        # tmux may hand the pane COLUMNS/LINES from the test process; the pty has the real size
        env = f"env -u COLUMNS -u LINES HOME={tmp_path} XDG_CONFIG_HOME={tmp_path}/cfg TERM=xterm-256color"
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "app",
            "-x",
            str(cols),
            "-y",
            str(rows),
            f"{env} {cmd} --port {self.port}; echo EXITED=$?; sleep 30",
        )
        size = self.tmux("display", "-p", "-t", "app", "#{window_width}x#{window_height}").strip()
        assert size == f"{cols}x{rows}", size

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.sock, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=10
        ).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "app")

    def keys(self, *keys: str, gap: float = 0.3) -> None:
        for k in keys:
            self.tmux("send-keys", "-t", "app", k)
            time.sleep(gap)

    def until(self, keys: tuple[str, ...], what: str, tries: int = 3, timeout: float = 8.0, gap: float = 0.3) -> str:
        """Send keys until ``what`` shows: on a loaded machine a key can land before the focus it
        was meant for has moved (the terminal, not tuitune, decides when bytes arrive)."""
        for attempt in range(tries):
            self.keys(*keys, gap=gap)
            try:
                return self.wait(what, timeout, dump=attempt == tries - 1)
            except AssertionError:
                if attempt == tries - 1:
                    raise
        raise AssertionError("unreachable")

    def wait(self, what, timeout: float = 40.0, dump: bool = True) -> str:
        test = what if callable(what) else (lambda s: what in s)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = self.screen()
            if test(s):
                return s
            time.sleep(0.2)
        raise AssertionError(f"{what!r} never appeared on screen:\n{self.screen()}{self.dump() if dump else ''}")

    def dump(self) -> str:
        """Where the pane's tuitune waits (SIGUSR1: its tasks, written under its HOME), if it runs."""
        shell = self.tmux("display", "-p", "-t", "app", "#{pane_pid}").strip()
        kids = subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True).stdout.split()
        if not kids:
            return ""
        kids = [p for p in kids if b"tuitune" in _cmdline(p)]  # not the `sleep` after it
        if not kids:
            return ""
        for pid in kids:
            subprocess.run(["kill", "-USR1", pid], capture_output=True)
        time.sleep(2)
        found = sorted((self.home / ".cache" / "tuitune" / "dumps").glob("tuitune-*.txt"))
        return "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-8000:]}" for p in found)

    def close(self) -> None:
        self.tmux("kill-server")
        self.cli("stop")  # whatever the test left running on its port

    def cli(self, command: str) -> int:
        """`tuitune COMMAND` for the demo as this test runs it (its port and log)."""
        from tuitune import preset as P

        p = P.with_changes(
            P.resolve("demo"), {"server.port": self.port, "server.log": f"~/.cache/tuitune/logs/demo-{self.port}.log"}
        )
        path = P.save(p, self.home / "demo-here.yaml")
        return subprocess.run(
            [sys.executable, "-m", "tuitune", command, str(path)],
            capture_output=True,
            timeout=60,
            env={**os.environ, "HOME": str(self.home)},
        ).returncode


def demo_status(term: Term) -> int:
    """`tuitune status` of the demo on this test's port (3: not running)."""
    return term.cli("status")


def test_demo_in_tmux_change_steps_and_relaunch(tmp_path):
    t = Term(tmp_path, 160, 44)
    try:
        t.wait("steps 2 topk 1")  # the simulator is up, under load, profiling with 2 steps
        t.wait("load on")
        shown = t.wait("gpus · 8 × NVIDIA H200")  # the GPU panel, fed by the simulator's nvidia-smi
        end = time.monotonic() + 20
        while shown.count("/1980") < 8 and time.monotonic() < end:  # one row per GPU, SM clock vs max
            time.sleep(0.2)
            shown = t.screen()
        assert shown.count("/1980") == 8, shown
        # focus the config panel (algorithm) -> steps (text selected on focus) -> 3, leave the panel
        t.until(("e", "Tab", "3", "Escape"), "(modified)", gap=1.0)
        time.sleep(0.6)  # ESC then a key at once reads as Alt+key
        t.keys("r")
        t.wait("steps 3 topk 1", 60)  # new numbers from the relaunched server
        assert "ready" in t.screen()
        t.until(("q",), "Leave it running [y]")
        t.until(("y",), "EXITED=0", timeout=20)  # leave it: the next start attaches to it
        assert demo_status(t) == 4  # running, and not what the shipped demo says (steps 3)
    finally:
        t.close()


def test_demo_at_80x24_shows_bars_log_and_footer_then_quit_stops_it(tmp_path):
    t = Term(tmp_path, 80, 24)
    try:
        # the numbers, and a whole log line (not under a notification, which fades after a few seconds)
        s = t.wait(lambda s: re.search(r"accept len \d", s) and "EAGLE3_PROFILE v=" in s, 60)
        lines = s.splitlines()
        assert len(lines) <= 24
        assert any(ln.startswith("│ verify █") for ln in lines), s  # a bar, on one line
        assert any("EAGLE3_PROFILE v=" in ln for ln in lines), s  # the log pane has rows
        footer = lines[-1]
        assert "? help" in footer and "q quit" in footer, footer
        t.until(("q",), "Stop the server [s] ⏎")  # the demo's default: stop the simulator it started
        t.until(("Enter",), "EXITED=0", timeout=30)
        assert demo_status(t) == 3  # nothing left behind
    finally:
        t.close()


def test_the_first_five_minutes_with_keys_only_at_80x24(tmp_path):
    """Issue 28: the tour of the help (l load → b bench → advisor → a → r → b → m → s) in the real
    demo at 80×24, keys only, reaching every tab on the way; the footer shows the tour's keys."""
    t = Term(tmp_path, 80, 24)
    rows = re.compile(r"^│ (\d+) (★)? ")

    def runs(s: str) -> dict[int, bool]:  # run id -> baseline?
        return {int(m[1]): bool(m[2]) for ln in s.splitlines() if (m := rows.match(ln))}

    try:
        s = t.wait(lambda s: re.search(r"accept len \d", s) and "load on ×1" in s.splitlines()[0], 60)
        footer = s.splitlines()[-1]
        assert footer.startswith("? help q quit l load b bench g tabs a apply r relaunch m base s save e edit"), footer
        t.until(("l",), lambda s: "load off" in s.splitlines()[0])  # 1. the load (on in the demo): off, on
        t.until(("l",), lambda s: "load on ×1" in s.splitlines()[0])
        t.until(("b",), lambda s: runs(s) == {1: True}, timeout=90)  # 2. a benchmark: run 1, the baseline
        t.until(("2",), "chart (c switches)")  # every tab by key: the chart …
        t.until(("1",), "filter (substring)")  # … the log …
        t.until(("3",), "predicted goodput at concurrency")  # 3. … and the advisor
        t.until(("g",), "filter (substring)")  # g goes round: advisor → log
        t.until(("g", "g"), "predicted goodput at concurrency")
        t.wait(lambda s: "▶ " in s or "▷ " in s, 30)  # its suggestion (or the measurement worth making)
        # 4. into the config panel: a sure gain goes at once; one within the interval (≈) or a measurement
        # (▷) asks first, and y applies it
        s = t.until(("a",), lambda s: "(modified)" in s.splitlines()[0] or "Apply [y]" in s)
        if "(modified)" not in s.splitlines()[0]:
            t.until(("y",), lambda s: "(modified)" in s.splitlines()[0])
        t.until(("r",), "relaunching demo")  # 5. relaunch with it
        t.wait(lambda s: "relaunching demo" not in s and " ready" in s.splitlines()[0], 60)
        t.until(("1",), "filter (substring)")  # the log tab: at 24 rows the advisor's tab hides the runs panel
        t.until(("b",), lambda s: set(runs(s)) == {1, 2}, timeout=90)  # 6. benchmark again: Δ vs base
        assert re.search(r"^│ 2 +1 .*[+-]\d+\.\d% [▲▼≈]", t.screen(), re.M), t.screen()
        t.until(("m",), lambda s: runs(s) == {1: False, 2: True})  # 7. the new run is the baseline
        t.until(("s",), "save the current configuration as")  # 8. save: the name first
        t.keys("End", *["BSpace"] * 10)
        t.tmux("send-keys", "-t", "app", "-l", "tour-topk")
        time.sleep(0.5)
        t.keys("Enter")
        saved = tmp_path / "cfg" / "tuitune" / "presets" / "tour-topk.yaml"
        t.wait(lambda s: saved.exists(), 10)
        assert "The built-in simulator" in saved.read_text()  # the description kept, not the typed name
        t.until(("?",), "the first five minutes")  # the help has the tour, at 80×24
        t.until(("Escape",), lambda s: "the first five minutes" not in s)
        time.sleep(0.6)
        t.until(("q",), "Stop the server [s] ⏎")
        t.until(("Enter",), "EXITED=0", timeout=30)
        assert demo_status(t) == 3
    finally:
        t.close()
