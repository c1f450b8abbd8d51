"""An operator's first day (issue 41): nothing that traps. Each test here failed on the code before
its fix. Real pieces throughout: the command line as a process, real loopback sockets (a closed port,
a listener that never speaks, a name that never resolves), the simulator as a process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
from conftest import free_port, tuitune_cli


def _one_sentence(r, code: int, *needles: str) -> None:
    """The command failed with ``code`` and said why in one line of stderr (no traceback)."""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert lines[0].startswith("tuitune: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, r.stderr)


@contextlib.contextmanager
def silent_listener():
    """A socket that accepts connections and never says a word (a host behind a black hole)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        s.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(s.accept()[0])

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield s.getsockname()[1]
    finally:
        stop.set()
        th.join(2)
        for c in held:
            c.close()
        s.close()


def _ssh_preset(tmp_path, host: str, port: int, name: str = "remote") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntarget:\n  host: {host}\n  port: {port}\n"
        f"  known_hosts: {tmp_path / 'known_hosts'}\n"
        "server:\n  log: /tmp/tuitune-first-day.log\n  port: 30000\n  args:\n    model-path: org/m\n"
    )
    return str(path)


# ---- A: trust, and every command, on a host that refuses, does not resolve or never answers -------


def test_trust_a_closed_port_is_one_sentence(tmp_path):
    port = free_port()  # bound once and released: nothing listens there now
    r = tuitune_cli("trust", "127.0.0.1", "--port", str(port), "--yes", env={"HOME": str(tmp_path)}, timeout=60)
    _one_sentence(r, 1, f"127.0.0.1:{port}", "connection refused")
    r = tuitune_cli("trust", _ssh_preset(tmp_path, "127.0.0.1", port), "--yes", env={"HOME": str(tmp_path)})
    _one_sentence(r, 1, f"127.0.0.1:{port}", "connection refused")
    assert not (tmp_path / "known_hosts").exists()


def test_trust_a_name_that_does_not_resolve_is_one_sentence(tmp_path):
    r = tuitune_cli("trust", "nonexistent.invalid", "--yes", env={"HOME": str(tmp_path)}, timeout=60)
    _one_sentence(r, 1, "nonexistent.invalid", "not a known host name")


def test_trust_a_host_that_never_answers_gives_up_after_its_timeout(tmp_path):
    with silent_listener() as port:
        t0 = time.monotonic()
        r = tuitune_cli(
            "trust", "127.0.0.1", "--port", str(port), "--yes", "--timeout", "1", env={"HOME": str(tmp_path)}
        )
        took = time.monotonic() - t0
    _one_sentence(r, 1, f"127.0.0.1:{port}", "no answer within 1 s")
    assert took < 10, took


@pytest.mark.parametrize("command", ["status", "stop", "logs", "launch"])
def test_every_server_command_on_a_refusing_host_is_one_sentence(tmp_path, command):
    port = free_port()
    r = tuitune_cli(command, _ssh_preset(tmp_path, "127.0.0.1", port), env={"HOME": str(tmp_path)}, timeout=60)
    _one_sentence(r, 1, f"127.0.0.1:{port}", "connection refused")


def test_status_on_a_silent_host_says_it_is_connecting_and_gives_up_on_time(tmp_path):
    """The connect timeout is bounded (~/.ssh/config's ConnectTimeout, as OpenSSH reads it), said while
    it waits (after a second), and named when it runs out."""
    (tmp_path / ".ssh").mkdir(mode=0o700)
    (tmp_path / ".ssh" / "config").write_text("Host 127.0.0.1\n  ConnectTimeout 3\n")
    with silent_listener() as port:
        t0 = time.monotonic()
        r = tuitune_cli("status", _ssh_preset(tmp_path, "127.0.0.1", port), env={"HOME": str(tmp_path)}, timeout=60)
        took = time.monotonic() - t0
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == f"tuitune: connecting to 127.0.0.1:{port}… (gives up after 3 s)", r.stderr
    assert lines[-1] == f"tuitune: 127.0.0.1:{port}: cannot connect (no answer within 3 s)", r.stderr
    assert took < 15, took


def test_a_quick_connection_says_nothing_about_connecting(tmp_path):
    port = free_port()
    r = tuitune_cli("status", _ssh_preset(tmp_path, "127.0.0.1", port), env={"HOME": str(tmp_path)}, timeout=60)
    assert "connecting to" not in r.stderr, r.stderr
