"""A multi-node server with the real pieces: two sshd instances on loopback (two ports, two
remote homes) act as two machines, each running one node of the simulator."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.machine.cluster import ClusterControl, control_for
from tuitune.machine.errors import ControlError
from tuitune.machine.transport import for_preset
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.procs import group_alive, sim_pids
from tuitune_support.sshd import SshServer


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Two OpenSSH servers on loopback, each logging users into its own home directory."""
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("OpenSSH server not installed (.ci/run installs it)")
    out = []
    for i in range(2):
        root = tmp_path_factory.mktemp(f"machine{i}")
        home = root / "home"
        home.mkdir()
        s = SshServer(root)
        # its own home; and the code under test (this checkout) when the tests run from one
        code = f" PYTHONPATH={os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else ""
        s.config.write_text(s.config.read_text() + f"SetEnv HOME={home}{code}\n")
        s.home = home
        s.start()
        out.append(s)
    yield out
    for s in out:
        s.stop()


def two_node_preset(machines, name="mn", env=None, node1_env=None) -> P.Preset:
    return P.from_dict(
        {
            "name": name,
            "target": {
                "nodes": [
                    machines[0].target(),
                    {
                        **machines[1].target(),
                        "server": {"port": free_port()},
                        "env": {"NCCL_SOCKET_IFNAME": "lo", **(node1_env or {})},
                    },
                ]
            },
            "server": {
                "python": sys.executable,
                "module": "tuitune.sim",
                "log": "~/logs/server.log",
                "port": free_port(),
                "dist_init_port": free_port(),
                "args": {"sim-load-seconds": 0.3, "sim-speedup": 10, "decode-log-interval": 10, "tp-size": 4},
            },
            "env": {"NCCL_DEBUG": "INFO", "NCCL_PROTO": "LL", **(env or {})},
            "profile": True,
            "bench": {"requests": 2, "warmup": 0, "max_tokens": 40},
        }
    )


def pids_of(machine: SshServer) -> list[int]:
    """Simulator processes logging into this machine's home (what a node left running)."""
    return sim_pids(str(machine.home))


async def test_launch_relaunch_with_changed_nccl_and_stop(machines):
    p = two_node_preset(machines)
    t = for_preset(p)
    c = control_for(t, p)
    assert isinstance(c, ClusterControl)
    try:
        rec, res = await c.relaunch(60)
        assert res.ok
        first = [r.pid for r in c.records]
        # each node's own log confirms the NCCL variables, the per-node one included
        assert [seen.get("NCCL_PROTO") for seen in c.node_nccl] == ["LL", "LL"]
        assert c.node_nccl[1].get("NCCL_SOCKET_IFNAME") == "lo"
        assert (machines[1].home / "logs" / "server.log").exists()
        st = await c.status()
        assert st.running and [n.status.running for n in st.nodes] == [True, True] and st.drift == []

        p2 = (
            P.with_changes(p, {"env.NCCL_PROTO": "LL128"})
            if hasattr(P, "with_changes")
            else p.model_copy(update={"env": {**p.env, "NCCL_PROTO": "LL128"}})
        )
        c2 = control_for(t, p2)
        stopped = []
        rec2, res2 = await c2.relaunch(60, on_stopped=stopped.append)
        assert res2.ok and len(stopped) == 2
        assert [seen.get("NCCL_PROTO") for seen in c2.node_nccl] == ["LL128", "LL128"]
        assert not any(group_alive(pid) for pid in first)
        # the old preset now sees drift on every node
        st = await c.status()
        assert {d.key for d in st.drift} >= {"node0.env.NCCL_PROTO", "node1.env.NCCL_PROTO"}

        msg = await c2.stop()
        assert msg.count("stopped") >= 2
        assert not any(group_alive(r.pid) for r in c2.records)
        assert pids_of(machines[0]) == [] and pids_of(machines[1]) == []
        assert not (await c2.status()).running
    finally:
        await c.close()
        await t.close()


async def test_a_node_dying_at_start_fails_the_server_and_stops_the_rest(machines):
    p = two_node_preset(machines, name="mn-bad", node1_env={"NCCL_SOCKET_IFNAME": "=nosuchif0"})
    t = for_preset(p)
    c = control_for(t, p)
    try:
        with pytest.raises(ControlError) as e:
            await c.relaunch(60)
        assert "node 1 (" in str(e.value) and "every node was stopped" in str(e.value)
        assert any("no socket interface found" in line for line in e.value.log_tail)
        assert pids_of(machines[0]) == [] and pids_of(machines[1]) == []
    finally:
        await c.close()
        await t.close()


async def test_a_node_killed_while_serving_fails_within_5s(machines):
    from tuitune.machine.session import Session

    p = two_node_preset(machines, name="mn-kill")
    s = Session(p)
    try:
        await s.transport.connect()
        await s.relaunch()
        assert s.state.state == "ready"
        rows, note = s.nccl_report()
        assert ("node 1 NCCL_SOCKET_IFNAME", "applied", "lo") in rows and note is None
        assert ("node 0 NCCL_PROTO", "applied", "LL") in rows
        victim = s.control.records[1].pid
        os.killpg(victim, signal.SIGKILL)
        t0 = time.monotonic()
        while s.state.state != "failed" and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.05)
        took = time.monotonic() - t0
        assert s.state.state == "failed" and took < 5, (s.state, took)
        assert "node 1 (" in (s.state.detail or "")
        # the other node was stopped before the failure was reported
        assert pids_of(machines[0]) == [] and pids_of(machines[1]) == []
    finally:
        await s.close()


def test_preset_show_command_lists_every_node(machines, tmp_path):
    p = two_node_preset(machines)
    path = tmp_path / "mn.yaml"
    path.write_text(P.dumps(p))
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "preset", "show", "--command", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("--nnodes 2") == 2 and "--node-rank 0" in out and "--node-rank 1" in out
    assert f"--dist-init-addr 127.0.0.1:{p.server.dist_init_port}" in out
    assert "node 1" in out and "NCCL_SOCKET_IFNAME=lo" in out


async def test_tui_shows_both_nodes(machines):
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.screens import RelaunchScreen
    from tuitune.tui.settings import UserConfig

    p = two_node_preset(machines, name="mn-tui")
    s = Session(p)
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=(140, 44)) as pilot:
        for _ in range(600):
            if s.state.state == "ready" and not isinstance(app.screen, RelaunchScreen):
                break
            await pilot.pause(0.05)
        assert s.state.state == "ready"
        header = str(app.header.render())
        assert f":{machines[0].port}" in header and "+1 node" in header
        log = app.logpane.query_one("#log")
        assert "node 0 of 2" in str(log.border_title)
        # node 1's own start-up lines are kept apart, and n shows them
        for _ in range(100):
            if any("Dummy health check server" in ln for ln in app.logpane.buffer(1)):
                break
            await pilot.pause(0.05)
        await pilot.press("n")
        await pilot.pause()
        assert app.logpane.node == 1 and f":{machines[1].port}" in str(log.border_title)
        assert "Dummy health check server" in "\n".join(log.lines)
        assert "Uvicorn running" not in "\n".join(log.lines)
        await pilot.press("n")
        await pilot.pause()
        assert app.logpane.node == 0 and "Uvicorn running" in "\n".join(log.lines)
        await s.close(stop_server=True)
    assert pids_of(machines[0]) == [] and pids_of(machines[1]) == []


def test_shipped_two_node_preset_runs_locally(tmp_path):
    """presets/sim-2node-eagle3.yaml as shipped, on free ports: launch, status, logs --node, stop."""
    shipped = P.load(P.find("sim-2node-eagle3"))
    data = P.to_dict(shipped)
    data["server"].update(port=free_port(), dist_init_port=free_port(), log=str(tmp_path / "n0.log"))
    data["server"]["args"]["sim-load-seconds"] = 0.3
    data["target"]["nodes"][1]["server"].update(port=free_port(), log=str(tmp_path / "n1.log"))
    path = tmp_path / "two.yaml"
    path.write_text(P.dumps(P.from_dict(data)))

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "tuitune", *args, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT
        )

    r = cli("launch")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node 1 NCCL_SOCKET_IFNAME: applied" in r.stdout and "node 0 NCCL_PROTO: applied" in r.stdout
    # every node's checks at once, timed; the simulator's listing asked (a fresh HOME's first launch)
    assert re.search(
        r"^checked in \d+\.\ds \(flag listing (asked of the engine|cached on the target)\)$", r.stdout, re.M
    ), r.stdout
    r = cli("status")
    assert r.returncode == 0 and "node 0 on local: running" in r.stdout and "node 1 on local: running" in r.stdout
    assert "no drift" in r.stdout
    r = cli("logs", "--node", "1")
    assert "Dummy health check server" in r.stdout and "Uvicorn" not in r.stdout
    r = cli("stop")
    assert r.returncode == 0 and r.stdout.count("stopped") >= 2, r.stdout + r.stderr
    assert sim_pids(str(tmp_path)) == []
