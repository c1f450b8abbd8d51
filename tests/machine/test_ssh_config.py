"""SSH the way OpenSSH users work: a real ~/.ssh/config (alias, HostName, Port, User, HostKeyAlias,
ProxyJump), a key held only by ssh-agent, a real sshd on loopback, and an empty known_hosts at first.
The jump host is the same sshd, reached under another name, so both hops are checked separately."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tuitune import preset as P
from tuitune.machine.ssh import SshHop, SshTarget, ssh_route
from tuitune_support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="ssh-agent not installed")


@pytest.fixture
def home(sshd, tmp_path):
    """HOME with ~/.ssh/config (bastion + gpu-box behind it), an ssh-agent holding the only key."""
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text(f"""\
Host bastion
    HostName 127.0.0.1
    Port {sshd.port}
    User root

Host gpu-box
    HostName 127.0.0.1
    Port {sshd.port}
    User root
    HostKeyAlias gpu-box-key
    ProxyJump bastion
""")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        from tuitune_support.procs import wait_for

        wait_for(sock.exists, 10, what="ssh-agent socket")
        env = {
            **os.environ,
            "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
            "SSH_AUTH_SOCK": str(sock),
        }
        subprocess.run(["ssh-add", "-q", str(sshd.client_key_path)], env=env, check=True, timeout=10)
        yield tmp_path, env
    finally:
        agent.terminate()
        agent.wait(5)


def tuitune(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_route_resolves_like_openssh(home, sshd, monkeypatch):
    tmp, _ = home
    monkeypatch.setenv("HOME", str(tmp))
    route = ssh_route(SshTarget("gpu-box"))
    assert route == [
        SshHop("bastion", "127.0.0.1", sshd.port, "root", None),
        SshHop("gpu-box", "127.0.0.1", sshd.port, "root", "gpu-box-key"),
    ]
    # OpenSSH looks a HostKeyAlias up as it is; asyncssh appends the port: the line lists both
    assert [h.known_hosts_patterns for h in route] == [
        f"[127.0.0.1]:{sshd.port}",
        f"gpu-box-key,[gpu-box-key]:{sshd.port}",
    ]
    # what the preset says wins over the config (as `ssh -p` does); port 22 is recorded bare
    assert ssh_route(SshTarget("gpu-box", 22, "me"))[-1].known_hosts_name == "gpu-box-key"
    assert ssh_route(SshTarget("gpu-box", 22, "me"))[-1].user == "me"


def test_alias_proxyjump_agent_from_empty_known_hosts_to_status(home, sshd):
    tmp, env = home
    presets = tmp / "cfg" / "tuitune" / "presets"
    presets.mkdir(parents=True)
    port = free_port()
    P.save(
        P.from_dict(
            {
                "name": "gpu",
                "target": {"host": "gpu-box"},
                "server": {
                    "python": sys.executable,
                    "module": "tuitune.sim",
                    "log": str(tmp / "gpu.log"),
                    "port": port,
                    "args": {"tp-size": 2},
                },
            }
        ),
        presets / "gpu.yaml",
    )
    known = tmp / ".ssh" / "known_hosts"
    assert not known.exists()

    r = tuitune(env, "status", "gpu")  # nothing trusted yet: the jump host is named, with its fingerprint
    assert r.returncode == 1, r
    assert f"jump host bastion (127.0.0.1:{sshd.port}): host key is not trusted (ssh-ed25519 SHA256:" in r.stderr
    assert "`tuitune trust gpu`" in r.stderr

    r = tuitune(env, "trust", "gpu", "--yes")
    assert r.returncode == 0, r.stderr
    assert f"jump host bastion (127.0.0.1:{sshd.port}) presents ssh-ed25519 SHA256:" in r.stdout
    assert f"gpu-box (127.0.0.1:{sshd.port}) presents ssh-ed25519 SHA256:" in r.stdout
    lines = known.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == [f"[127.0.0.1]:{sshd.port}", f"gpu-box-key,[gpu-box-key]:{sshd.port}"]
    assert all(ln.split(None, 1)[1] == sshd.host_public for ln in lines)

    r = tuitune(env, "status", "gpu")  # through the jump host, with the agent's key
    assert r.returncode == 3 and r.stdout.strip() == "gpu: not running", r
    assert "CHANGED" not in r.stderr

    r = tuitune(env, "trust", "gpu", "--yes")  # again: nothing to do, nothing appended
    assert r.returncode == 0 and r.stdout.count("already trusted") == 2, r
    assert known.read_text().splitlines() == lines

    # OpenSSH itself accepts what was recorded (same config; its jump child reads -F but not -o)
    cfg = tmp / "openssh_config"
    cfg.write_text(
        (tmp / ".ssh" / "config").read_text()
        + f"\nHost *\n    UserKnownHostsFile {known}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
    )
    r = subprocess.run(
        ["ssh", "-F", str(cfg), "gpu-box", "echo", "via-openssh"], env=env, capture_output=True, text=True, timeout=30
    )
    assert r.stdout.strip() == "via-openssh", r.stderr


def test_changed_target_key_named_under_its_alias(home, sshd):
    import asyncssh

    tmp, env = home
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp / ".ssh" / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_public}\n[gpu-box-key]:{sshd.port} {other}\n")
    r = tuitune(env, "trust", "gpu-box", "--yes")
    assert r.returncode == 1 and "already has a different key for gpu-box-key;" in r.stderr, r
