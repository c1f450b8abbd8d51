"""The real `tuitune demo` in a real terminal (tmux): change the steps with keys, relaunch, see it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (.ci/run installs it)")


def test_demo_in_tmux_change_steps_and_relaunch(tmp_path):
    sock = f"tt-{os.getpid()}"
    exe = Path(sys.executable).parent / "tuitune"
    cmd = f"{exe} demo" if exe.exists() else f"{sys.executable} -m tuitune demo"
    # tmux may hand the pane COLUMNS/LINES from the test process; the pty has the real size
    env = f"env -u COLUMNS -u LINES HOME={tmp_path} XDG_CONFIG_HOME={tmp_path}/cfg TERM=xterm-256color"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", *args], capture_output=True,
                              text=True, timeout=10).stdout

    def screen() -> str:
        return tmux("capture-pane", "-p", "-J", "-t", "app")

    def wait(text: str, timeout: float = 40.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = screen()
            if text in s:
                return s
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared on screen:\n{screen()}")

    tmux("new-session", "-d", "-s", "app", "-x", "140", "-y", "44", f"{env} {cmd}; echo EXITED=$?; sleep 30")
    try:
        size = tmux("display", "-p", "-t", "app", "#{window_width}x#{window_height}").strip()
        assert size == "140x44", size
        wait("steps 2 topk 1")  # the simulator is up, under load, profiling with 2 steps
        wait("load on")
        shown = wait("gpus · 8 × NVIDIA H200")  # the GPU panel, fed by the simulator's nvidia-smi
        end = time.monotonic() + 20
        while shown.count("/1980") < 8 and time.monotonic() < end:  # one row per GPU, SM clock vs max
            time.sleep(0.2)
            shown = screen()
        assert shown.count("/1980") == 8, shown
        tmux("send-keys", "-t", "app", "e")  # focus the config panel (algorithm)
        time.sleep(0.3)
        tmux("send-keys", "-t", "app", "Tab")  # -> steps (its text is selected on focus)
        time.sleep(0.3)
        tmux("send-keys", "-t", "app", "3")
        time.sleep(0.3)
        tmux("send-keys", "-t", "app", "Escape")
        wait("(modified)")
        time.sleep(0.6)  # ESC then a key at once reads as Alt+key
        tmux("send-keys", "-t", "app", "r")
        wait("steps 3 topk 1", 60)  # new numbers from the relaunched server
        assert "ready" in screen()
        tmux("send-keys", "-t", "app", "q")
        wait("Leave the server running?")
        tmux("send-keys", "-t", "app", "s")  # stop it: tests leave nothing behind
        wait("EXITED=0", 20)
    finally:
        tmux("kill-server")
        subprocess.run([sys.executable, "-m", "tuitune", "stop", "demo"], env={**os.environ, "HOME": str(tmp_path)},
                       capture_output=True, timeout=60)
