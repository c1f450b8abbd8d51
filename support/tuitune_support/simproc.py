"""The simulator (``python -m tuitune.sim``) as a process of its own: ``Sim`` for the tests (its log in
a file; tests/conftest.py's ``sim_factory`` makes them), ``running_sim`` for the benchmarks (on a free
port, ready when /health says 200, stopped on leaving the block), and the simulator's command lines
and settings the tests share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tuitune_support.ports import free_port, http_status
from tuitune_support.procs import wait_for


@contextlib.contextmanager
def running_sim(*args: str, env: dict[str, str] | None = None, log=None):
    """Yields the server's URL; ``env`` is added to this environment less its NCCL variables."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    full.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuitune.sim", "--port", str(port), "--sim-load-seconds", "0.3", *args],
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=full,
    )
    try:
        for _ in range(400):
            if proc.poll() is not None:
                raise SystemExit(f"the simulator exited with status {proc.returncode}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)


class Sim:
    """``python -m tuitune.sim`` as a subprocess, its log in a file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None):
        self.port = free_port()
        self.log = tmp / f"sim-{self.port}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        full_env.update(env or {})
        self.args = ["--port", str(self.port), *args]
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuitune.sim", *self.args],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_bytes().decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        wait_for(
            lambda: http_status(self.url + "/health") == 200 or self.proc.poll() is not None,
            timeout,
            what="sim /health 200",
        )
        assert self.proc.poll() is None, f"sim exited: {self.text()[-2000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(5)


SPEC2 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/d",
    "--speculative-num-steps",
    "2",
    "--speculative-eagle-topk",
    "1",
]
SEED_ARGS = [
    "--tp-size",
    "8",
    "--mem-fraction-static",
    "0.88",
    "--num-continuous-decode-steps",
    "4",
    "--disable-custom-all-reduce",
]
TUNED_NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


def sim_argv(port: int, steps: int = 2) -> list[str]:
    """The simulator's command line as a person types it: EAGLE-3 with ``steps`` steps (no draft
    token count: SGLang derives it), fast (a 0.3 s load, ten times the modelled speed)."""
    return [
        *(sys.executable, "-m", "tuitune.sim", "--model-path", "/m/llama", "--port", str(port), "--tp-size", "2"),
        *("--sim-speedup", "10", "--sim-load-seconds", "0.3", "--decode-log-interval", "10"),
        *("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"),
        *("--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1"),
    ]
