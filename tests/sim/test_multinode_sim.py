"""The simulator across nodes: rendezvous on the dist-init port, rank > 0's dummy health, a node
going away, the inter-node NCCL variables (unit tests of the cost term, real processes else)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tuitune.sim import multinode
from tuitune_support.ports import free_port, http_status
from tuitune_support.procs import wait_for

FAST = ["--sim-load-seconds", "0.3", "--sim-speedup", "10", "--tp-size", "16", "--nnodes", "2"]


def pair(sim_factory, env0=None, env1=None, start1=True):
    """Node 0 and (optionally) node 1 of a two-node simulator joined on a free dist-init port."""
    addr = ["--dist-init-addr", f"127.0.0.1:{free_port()}"]
    n0 = sim_factory(*FAST, *addr, "--node-rank", "0", env=env0)
    n1 = sim_factory(*FAST, *addr, "--node-rank", "1", env=env1) if start1 else None
    return n0, n1, addr


def test_node0_ready_only_after_every_node_joined(sim_factory):
    n0, _, addr = pair(sim_factory, start1=False)
    wait_for(lambda: "Init torch distributed begin" in n0.text(), 15, what="node 0 waiting")
    time.sleep(1.0)
    # alone, node 0 never gets past the rendezvous: no HTTP, no weights loaded
    assert http_status(n0.url + "/health") is None and "Load weight begin" not in n0.text()
    n1 = sim_factory(*FAST, *addr, "--node-rank", "1", env={"NCCL_DEBUG": "INFO"})
    n0.wait_ready()
    wait_for(lambda: http_status(n1.url + "/health") == 200, 15, what="node 1's dummy health")
    # node 1 logs start-up and NCCL, not decode lines or the ready banner
    t1 = n1.text()
    assert "Using network IB" in t1 and "Init torch distributed ends" in t1
    assert "fired up and ready" not in t1 and "Uvicorn running" not in t1
    with urllib.request.urlopen(n0.url + "/server_info", timeout=5) as r:
        info = json.loads(r.read())
    assert info["sim"]["internode_ms"] > 0


def test_node0_going_away_ends_the_others_with_an_error(sim_factory):
    n0, n1, _ = pair(sim_factory)
    n0.wait_ready()
    wait_for(lambda: http_status(n1.url + "/health") == 200, 15, what="node 1 up")
    n0.stop()
    assert n1.proc.wait(10) == 1
    assert "NCCL communicator was aborted: node 0" in n1.text()


def test_a_lost_node_fails_node0(sim_factory):
    n0, n1, _ = pair(sim_factory)
    n0.wait_ready()
    n1.stop()
    assert n0.proc.wait(10) == 1
    assert "node 1 (ranks 8..15) closed the connection" in n0.text()


def test_a_node_with_another_world_size_is_refused(sim_factory):
    n0, _, addr = pair(sim_factory, start1=False)
    bad = sim_factory("--sim-load-seconds", "0.3", "--tp-size", "24", "--nnodes", "3", *addr, "--node-rank", "1")
    assert bad.proc.wait(15) == 1
    assert "nnodes mismatch: node 0 has 2, this node 3" in bad.text()
    assert n0.proc.poll() is None  # still waiting for a node that fits


def test_no_matching_socket_interface_fails_init(sim_factory):
    n0, _, _ = pair(sim_factory, env0={"NCCL_SOCKET_IFNAME": "=nosuchif0"}, start1=False)
    assert n0.proc.wait(15) == 1
    assert "no socket interface found" in n0.text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nnodes", "2"], "--dist-init-addr HOST:PORT is required"),
        (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"], "node_rank (2) must be in"),
        (["--nnodes", "3", "--tp-size", "8", "--dist-init-addr", "h:1"], "must be divisible by nnodes"),
        (["--nnodes", "2", "--tp-size", "2", "--dist-init-addr", "h"], "is not HOST:PORT"),
    ],
)
def test_multinode_flags_checked_like_sglang(args, message):
    p = subprocess.run([sys.executable, "-m", "tuitune.sim", *args], capture_output=True, text=True, timeout=15)
    assert p.returncode == 1 and message in p.stdout


# ---- the inter-node all-reduce term -------------------------------------------------------------


def test_internode_cost_follows_the_network_variables():
    ib = multinode.internode_ms({}, 2, 3)
    assert multinode.internode_ms({}, 1, 3) == 0.0
    assert 0 < ib < multinode.internode_ms({}, 4, 3)
    sock = multinode.internode_ms({"NCCL_IB_DISABLE": "1"}, 2, 3)
    assert sock > 2 * ib
    # an HCA filter that matches no device falls back to sockets, as NCCL does
    assert multinode.internode_ms({"NCCL_IB_HCA": "=mlx9_0"}, 2, 3) == sock
    assert multinode.internode_ms({"NCCL_IB_HCA": "mlx5_1:1"}, 2, 3) == ib
    # GPU Direct RDMA off (level below the NIC-GPU distance) costs; at or above it is the default
    assert multinode.internode_ms({"NCCL_NET_GDR_LEVEL": "LOC"}, 2, 3) > ib
    assert multinode.internode_ms({"NCCL_NET_GDR_LEVEL": "SYS"}, 2, 3) == ib
    more = multinode.internode_ms(
        {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "2"}, 2, 3
    )
    assert more < sock
    assert multinode.internode_ms({"NCCL_PROTO": "LL"}, 2, 3) < ib


def test_interface_filter_follows_nccl_rules():
    names = ["lo", "eth0", "eth1", "docker0", "ib0"]
    assert multinode._filter(names, "eth") == ["eth0", "eth1"]
    assert multinode._filter(names, "=eth1") == ["eth1"]
    assert multinode._filter(names, "^docker,lo") == ["eth0", "eth1", "ib0"]
    assert multinode._filter(names, "^=eth0") == ["lo", "eth1", "docker0", "ib0"]
