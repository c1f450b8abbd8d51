"""A simulator process for the benchmarks: started on a free port, ready when /health says 200,
stopped on leaving the block. (Imported by the benchmark scripts; running it does nothing.)"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
