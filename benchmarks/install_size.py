"""`pip install .` into a fresh virtual environment outside the repository: its wall time (the
wheel built from this checkout, the dependencies from the package index or pip's cache, as
configured) and the environment's size on disk before and after (so the figure is what the
install adds: tuitune and its dependencies, not pip itself). ``--no-cache`` measures a cold
install (``pip --no-cache-dir``).

    python benchmarks/install_size.py [--no-cache]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def du(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-cache", action="store_true", help="pip --no-cache-dir: a cold install")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        venv = os.path.join(d, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        before = du(venv)
        pip = [
            os.path.join(venv, "bin", "pip"),
            "install",
            "-q",
            *(["--no-cache-dir"] if ns.no_cache else []),
            str(REPO),
        ]
        t0 = time.perf_counter()
        r = subprocess.run(pip, capture_output=True, text=True, cwd=d)
        took = time.perf_counter() - t0
        if r.returncode != 0:
            print(r.stdout + r.stderr, file=sys.stderr)
            return 1
        after = du(venv)
        n = len(list(Path(venv, "lib").glob("python*/site-packages/*.dist-info")))
        print(
            f"pip install . ({'no cache' if ns.no_cache else 'pip cache as configured'}): {took:.1f} s, "
            f"{(after - before) / 1e6:.0f} MB added to a {before / 1e6:.0f} MB fresh venv ({n} distributions)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
