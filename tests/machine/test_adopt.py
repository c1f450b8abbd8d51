"""Issue 41 item 1: a server tuitune did not start (a person ran it by hand) is watched read-only, its
relaunch and stop refused with one sentence, until `tuitune adopt PRESET` makes it tuitune's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.machine.control import ServerControl
from tuitune.machine.errors import ControlError
from tuitune.machine.session import Session
from tuitune.machine.transport import LocalTransport
from tuitune.measure.capture import read_capture
from tuitune.tui.app import TuituneApp
from tuitune.tui.settings import UserConfig
from tuitune_support.pilot import collect_says, until
from tuitune_support.presets import make_preset
from tuitune_support.procs import HandServer, tuitune_cli

NOT_OURS = "running, not started by tuitune: attach read-only, or `tuitune adopt"
REFUSED = "in use by a server tuitune did not start"


class ByHand:
    """The simulator started as a person would (`nohup python3 -m … > log &`): a plain child of this
    test, no tuitune state, its log in the file the preset names; the flags given differ from the
    preset's in one value and its environment lacks one of the preset's NCCL variables."""

    def __init__(self, tmp_path: Path, name: str = "hand"):
        self.preset = make_preset(tmp_path, name, env={"NCCL_ALGO": "Ring"})
        self.path = P.save(self.preset, tmp_path / f"{name}.yaml")
        argv = list(self.preset.flags())
        argv[argv.index("--speculative-num-steps") + 1] = "3"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        env["EAGLE3_PROFILE"] = "1"  # the simulator's own profile lines (a real engine needs the probe too)
        self.log = Path(self.preset.server.log)
        self.hand = HandServer([sys.executable, "-m", "tuitune.sim", *argv], self.preset.server.port, env, self.log)
        self.proc = self.hand.proc

    def stop(self) -> None:
        self.hand.stop()


@pytest.fixture
def by_hand(tmp_path):
    s = ByHand(tmp_path)
    yield s
    s.stop()


def test_status_says_running_not_ours_with_drift_and_adopt_lets_stop_work(by_hand, tmp_path):
    home = {"HOME": str(tmp_path)}
    path = str(by_hand.path)
    r = tuitune_cli("status", path, env=home)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert NOT_OURS in r.stdout and f"pid {by_hand.proc.pid}" in r.stdout
    assert "flag --speculative-num-steps: running 3, preset 2" in r.stdout
    assert "env.NCCL_ALGO: running (unset), preset Ring" in r.stdout
    r = tuitune_cli("status", path, "--json", env=home)
    assert r.returncode == 5 and '"ours": false' in r.stdout
    # stop and launch are refused with one sentence, and the server keeps running
    for cmd in ("stop", "launch"):
        r = tuitune_cli(cmd, path, env=home)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert REFUSED in r.stderr and f"tuitune adopt {by_hand.preset.name}" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert by_hand.proc.poll() is None
    # adopt shows the drift, then records the server as tuitune's
    r = tuitune_cli("adopt", path, env=home)
    assert r.returncode == 0, r.stderr
    assert "flag --speculative-num-steps: running 3, preset 2" in r.stdout
    assert f"adopted server {by_hand.proc.pid}" in r.stdout
    state = tmp_path / ".cache" / "tuitune" / "servers" / f"{by_hand.preset.server.port}.json"
    assert state.exists() and oct(state.stat().st_mode & 0o777) == "0o600"
    r = tuitune_cli("status", path, env=home)
    assert r.returncode == 4 and "running, pid" in r.stdout and NOT_OURS not in r.stdout, r.stdout
    assert tuitune_cli("adopt", path, env=home).returncode == 2  # already tuitune's
    r = tuitune_cli("stop", path, env=home)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stderr
    assert by_hand.proc.wait(10) is not None


async def test_adopt_refuses_when_nothing_listens(tmp_path):
    p = make_preset(tmp_path, "idle")
    with pytest.raises(ControlError, match="no server listens on port .*nothing to adopt"):
        await ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state")).adopt()


def test_record_captures_a_hand_started_server_without_relaunching_it(by_hand, tmp_path):
    home = {"HOME": str(tmp_path)}
    out = tmp_path / "hand.jsonl"
    r = tuitune_cli("--record", str(out), str(by_hand.path), "--load", "--duration", "4", env=home, timeout=90)
    assert r.returncode == 0, r.stderr
    assert by_hand.proc.poll() is None  # not relaunched, not stopped
    events = [x.event for x in read_capture(out).records]
    assert any(isinstance(e, ProfileWindow) for e in events)
    assert any(isinstance(e, DecodeStats) for e in events)
    r = tuitune_cli("--record", str(tmp_path / "x.jsonl"), str(by_hand.path), "--relaunch", env=home)
    assert r.returncode == 2 and REFUSED in r.stderr, r.stderr
    assert by_hand.proc.poll() is None


async def test_tui_shows_live_numbers_and_refuses_relaunch_and_stop(by_hand, tmp_path):
    session = Session(by_hand.preset, state_dir=str(tmp_path / "state"))
    app = TuituneApp(session, user_config=UserConfig())
    said = collect_says(app)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: session.state.state == "ready", 20, "attached")
        assert session.read_only and session.state.pid == by_hand.proc.pid
        # said once the attach has read the log's history (ready comes first: under load, well before)
        await until(pilot, lambda: any(NOT_OURS in m for m in said), 20, f"the read-only notice: {said}")
        await session.set_load(True)
        await until(pilot, lambda: session.store.last_profile is not None, 20, "profile windows from its log")
        await pilot.press("r")
        await pilot.pause()
        assert any(REFUSED in m for m in said), said
        n = len(said)
        app.action_confirm_stop_server()
        await pilot.pause()
        assert any(REFUSED in m for m in said[n:]), said[n:]
        assert by_hand.proc.poll() is None and session.state.state == "ready"
        await session.close(stop_server=False)
    assert by_hand.proc.poll() is None


def test_status_adopt_and_stop_over_a_real_sshd(sshd, tmp_path):
    """The same life over SSH (a real sshd on loopback): the listener, its flags and environment are
    read from the box's /proc through the link, the record written there under the port's lock."""
    by_hand = ByHand(tmp_path, "remote-hand")
    try:
        data = P.to_dict(by_hand.preset)
        data["target"] = sshd.target()
        path = P.save(P.loads(__import__("yaml").safe_dump(data)), tmp_path / "remote.yaml")
        home = {"HOME": str(tmp_path)}
        r = tuitune_cli("status", str(path), env=home)
        assert r.returncode == 5 and NOT_OURS in r.stdout, (r.stdout, r.stderr)
        assert "flag --speculative-num-steps: running 3, preset 2" in r.stdout
        r = tuitune_cli("stop", str(path), env=home)
        assert r.returncode == 2 and REFUSED in r.stderr and by_hand.proc.poll() is None, r.stderr
        r = tuitune_cli("adopt", str(path), env=home)
        assert r.returncode == 0 and f"adopted server {by_hand.proc.pid}" in r.stdout, r.stderr
        r = tuitune_cli("stop", str(path), env=home)
        assert r.returncode == 0 and "stopped" in r.stdout, r.stderr
        by_hand.proc.wait(10)
    finally:
        by_hand.stop()
