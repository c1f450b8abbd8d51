"""Processes the tests and benchmarks start and wait for: a condition's wait, `python -m tuitune`
from the checkout (one that hangs says where it waited), a server started by hand, a process
group's and the simulators' liveness."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuitune_support.paths import ROOT
from tuitune_support.ports import http_status


def wait_for(cond, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_or_dump(proc: subprocess.Popen, timeout: float, what: str = "tuitune") -> int:
    """``proc.wait(timeout)``; past it, the process is asked where it waits (SIGUSR1: tuitune prints
    its threads and asyncio tasks on stderr), then killed, and the failure shows that answer."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    _dump_and_kill(proc, what, timeout)


def run_dumped(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=...)``, but a process that
    outlives the timeout says where it waits before it is killed (``wait_or_dump``)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = None
    if out is None:
        _dump_and_kill(proc, " ".join(str(a) for a in args[2:5]), timeout)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def tuitune_cmd(*args: str, env: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `python -m tuitune ARGS` from the checkout, with ``env``
    over this environment (for a test that drives the process itself; run it with ``cwd=ROOT``)."""
    return [sys.executable, "-m", "tuitune", *args], {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}


def tuitune_cli(*args: str, env: dict | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m tuitune ARGS` (``tuitune_cmd``); one that outlives ``timeout`` says where it
    waited (``run_dumped``)."""
    argv, full = tuitune_cmd(*args, env=env)
    return run_dumped(argv, timeout, env=full, cwd=ROOT, **kw)


def _dump_and_kill(proc: subprocess.Popen, what: str, timeout: float):
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    proc.kill()
    _, err = proc.communicate(timeout=10)
    err = err.decode("utf-8", "replace") if isinstance(err, bytes) else (err or "")
    raise AssertionError(f"{what} still running after {timeout:.0f} s; where it waited:\n{err[-12000:]}")


class HandServer:
    """A server started as a person starts one (`cd DIR; VAR=… nohup python -m … > LOG 2>&1 &`): a
    plain child of the test, no tuitune state; ``log`` None: its output into a pipe (a supervisor's).
    Ready when ``port`` answers /health. ``group``: it leads a process group of its own (a shell's
    background job; an engine's workers go with it when it stops)."""

    def __init__(
        self, argv: list[str], port: int, env: dict, log: Path | None, cwd=None, timeout: float = 30, group=False
    ):
        self.port, self.log, self.group = port, log, group
        out = log.open("ab") if log else subprocess.PIPE
        try:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=group
            )
        finally:
            if log:
                out.close()
        url = f"http://127.0.0.1:{port}/health"
        wait_for(lambda: http_status(url) == 200 or self.proc.poll() is not None, timeout, what=f"`{argv[2]}` by hand")
        assert self.proc.poll() is None, log.read_text()[-2000:] if log else "exited"

    def stop(self) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        elif self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of this process group is left."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


def sim_pids(base: str) -> list[int]:
    """Simulator processes whose output goes to a file under ``base``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            fd1 = os.readlink(proc / "fd" / "1")
        except OSError:
            continue
        if b"tuitune.sim" in cmd and fd1.startswith(base):
            out.append(int(proc.name))
    return out
