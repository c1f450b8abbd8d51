"""Multi-node presets and the inter-node NCCL variables: pure unit tests."""

from __future__ import annotations

import pytest

from tuitune import preset as P
from tuitune.preset import nccl

BASE = """name: mn
target:
  user: root
  nodes:
    - {host: gpu-a, addr: 10.0.0.11, env: {NCCL_SOCKET_IFNAME: ens1f0}}
    - {host: gpu-b, port: 2222, env: {NCCL_SOCKET_IFNAME: enp3s0}}
server:
  log: /data/log.txt
  port: 30000
  args: {model-path: /m, tp-size: 16}
env: {NCCL_DEBUG: INFO, NCCL_PROTO: LL}
"""


def test_each_node_renders_its_own_command():
    p = P.loads(BASE)
    assert p.is_multinode and p.target.label() == "root@gpu-a+root@gpu-b:2222"
    n0, n1 = p.node_presets()
    assert (n0.name, n1.name) == ("mn.node0", "mn.node1")
    assert n1.target.user == "root" and n1.target.port == 2222  # target's keys are the nodes' defaults
    for i, n in enumerate((n0, n1)):
        flags = n.flags()
        assert flags[flags.index("--nnodes") + 1] == "2" and flags[flags.index("--node-rank") + 1] == str(i)
        assert flags[flags.index("--dist-init-addr") + 1] == "10.0.0.11:5000"  # node 0's addr, default port
    assert n0.env["NCCL_SOCKET_IFNAME"] == "ens1f0" and n1.env["NCCL_SOCKET_IFNAME"] == "enp3s0"
    assert n1.env["NCCL_PROTO"] == "LL"  # the preset's env reaches every node
    script = P.launch_script(p)
    assert script.count("setsid nohup") == 2 and "# node 1 on root@gpu-b:2222" in script
    assert p.hash() != P.with_changes(p, {"env.NCCL_PROTO": "Simple"}).hash()
    assert P.loads(P.dumps(p)).hash() == p.hash()  # round trip
    flat = P.flatten(p)
    assert flat["target.nodes.1.env.NCCL_SOCKET_IFNAME"] == "enp3s0" and flat["server.dist_init_port"] == 5000


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda y: y.replace("tp-size: 16}", "tp-size: 16, nnodes: 2}"), "flag 'nnodes' is set by target.nodes"),
        (lambda y: y.replace("  nodes:\n", "  host: x\n  nodes:\n"), "either target.host or target.nodes"),
        (lambda y: y.replace("addr: 10.0.0.11,", "addr: 10.0.0.11, server: {port: 1},"), "node 0 serves HTTP"),
        (
            lambda y: y.replace("- {host: gpu-b, port: 2222,", "- {host: gpu-a,"),
            "both use server.port 30000 on root@gpu-a",
        ),
        (
            lambda y: y.replace("    - {host: gpu-b, port: 2222, env: {NCCL_SOCKET_IFNAME: enp3s0}}\n", ""),
            "at least two nodes",
        ),
        (lambda y: y.replace("enp3s0", "'eth0,,eth1'"), "empty entry"),
        (lambda y: y.replace("port: 30000", "port: 30000\n  dist_init_port: 30000"), "node 0's HTTP port too"),
        (
            lambda y: y.replace("log: /data", "engine: vllm\n  log: /data").replace("model-path: /m", "model: /m"),
            "multi-node servers are SGLang's",
        ),
    ],
)
def test_multinode_mistakes_are_one_sentence(edit, message):
    with pytest.raises(P.PresetError) as e:
        P.loads(edit(BASE))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lint_per_node_variables_every_rank_shares():
    p = P.loads(
        BASE.replace(
            "env: {NCCL_SOCKET_IFNAME: enp3s0}",
            "env: {NCCL_SOCKET_IFNAME: enp3s0, NCCL_ALGO: Tree, NCCL_IB_DISABLE: 1, NCCL_IB_HCA: mlx5}",
        )
    )
    w = P.warnings(p)
    assert any(x.startswith("target.nodes.1.env.NCCL_ALGO: every rank must use the same") for x in w)
    assert not any("NCCL_SOCKET_IFNAME" in x for x in w)  # a machine's interface may differ
    assert "node1 env: NCCL_IB_DISABLE=1, so NCCL_IB_HCA has no effect" in w


def test_network_variables_follow_nccls_rules():
    ok = {
        "NCCL_SOCKET_IFNAME": "^docker,lo",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
        "NCCL_IB_TIMEOUT": "22",
        "NCCL_IB_RETRY_CNT": "7",
        "NCCL_SOCKET_FAMILY": "AF_INET6",
        "NCCL_CROSS_NIC": "2",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_NET": "Socket",
    }
    for k, v in ok.items():
        assert nccl.check(k, v) == ([], []), k
    bad = {
        "NCCL_IB_TIMEOUT": "40",
        "NCCL_IB_RETRY_CNT": "8",
        "NCCL_IB_SL": "16",
        "NCCL_CROSS_NIC": "3",
        "NCCL_SOCKET_FAMILY": "AF_UNIX",
        "NCCL_IB_HCA": "mlx5_0:a",
        "NCCL_SOCKET_NTHREADS": "17",
        "NCCL_NET_GDR_LEVEL": "pxb",
    }
    for k, v in bad.items():
        assert nccl.check(k, v)[0], k
    assert nccl.check_env({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"})[0] == [
        "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD is 128; NCCL allows at most 64"
    ]
    with pytest.raises(P.PresetError, match="at most 64"):
        P.loads(BASE.replace("NCCL_PROTO: LL", "NCCL_PROTO: LL, NCCL_SOCKET_NTHREADS: 16, NCCL_NSOCKS_PERTHREAD: 8"))
    # the network variables are checked but are not TUI toggles
    assert "NCCL_IB_TIMEOUT" in nccl.NETWORK and "NCCL_IB_TIMEOUT" not in nccl.CATALOGUE
