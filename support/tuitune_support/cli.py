"""The command line as the tests run it: `python -m tuitune ARGS` in this environment (no timeout
dump, the caller's cwd), and an earlier `tune` search whose budget is spent, for `--resume`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tuitune import preset as P
from tuitune.decide.launch import OFF
from tuitune.experiments.tuneloop import config_of
from tuitune.measure.capture import CaptureWriter
from tuitune_support.presets import make_preset


def tuitune(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def spent_search(tmp_path: Path, **preset_kw) -> tuple[object, Path, Path]:
    """A simulator preset and a tune log of an earlier search whose budget is spent (for `--resume`):
    speculation off measured twice as fast as the start. (preset, its file, the --out folder)"""
    base = make_preset(tmp_path, **preset_kw)
    path = P.save(base, tmp_path / "p.yaml")
    out = tmp_path / "out"
    (out / "captures").mkdir(parents=True)
    rows = []
    for i, (config, goodput) in enumerate([(config_of(base), 10.0), (OFF, 20.0)]):
        cap = out / "captures" / f"launch-{i:02d}.jsonl.gz"
        CaptureWriter(cap, {"preset": P.to_dict(base), "tune_config": config.to_dict()}).close()
        rows.append(
            {"kind": "launch", "round": i, "config": config.to_dict(), "goodput": {"1": goodput}, "capture": str(cap)}
        )
    (out / "tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return base, path, out
