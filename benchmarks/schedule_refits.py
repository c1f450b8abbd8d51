"""How far an emitted vLLM schedule's per-bucket K can be trusted, on the real engine (issue 25).

Each run is `benchmarks/dsd_compare.py`'s first step on the real vLLM CPU engine (ngram, lookup
1-3): `tuitune tune` from ngram K=3 with one relaunch at levels 1, 4 and 16 streams, then
`tuitune advise CAPTURES --emit vllm-dsd`. Printed per run: the schedule, and per bucket the K it
chose, the share of the model's refits to resampled profile windows in which that K is within 2 %
of the refit's best (`advise`'s "in N% of 64 refits"), whether advise marked it UNSURE, and, where
a measured grid of this machine has the bucket's batch size (`--grid`, JSONs of
`benchmarks/real_engine_grid.py`; their concurrencies), the grid's figure for that K against the
grid's best; where the per-request verify cost decides the bucket (advise's PER-REQUEST COST
DECIDES), both models' choices, and what the fit alone would have chosen. The captures of each run
are kept under `--keep` (a run's `captures/`), so a schedule can be refitted later without the
engine: `--from DIR` advises the kept runs of DIR again with today's code, with no engine.

    python benchmarks/schedule_refits.py [--runs 3] [--grid benchmarks/data/real_engine_grid_c11_….json] [--keep DIR]
    python benchmarks/schedule_refits.py --from benchmarks/data/schedule_refits_2026-12-03 --grid …

World: the real engine on this machine; the grids' truth is of the machine and day they were
measured on, so compare runs and grids of one session.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import dsd_compare as D

ROOT = Path(__file__).resolve().parent.parent


def grid_truth(paths: list[str]) -> dict[int, dict[int, float]]:
    """concurrency -> ngram K (0: off) -> the grid's goodput (tok/s), from real_engine_grid JSONs."""
    out: dict[int, dict[int, float]] = {}
    for p in paths:
        g = json.loads(Path(p).read_text())["grid"]
        for label, per in g["truth"].items():
            k = 0 if label == "off" else int(label.split("K=")[1]) if label.startswith("ngram") else None
            if k is None:
                continue
            for c, v in per.items():
                out.setdefault(int(c), {})[k] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--grid", action="append", default=[], help="a real_engine_grid.py JSON (repeatable)")
    ap.add_argument("--keep", help="copy each run's captures here (run-1/, run-2/, …)")
    ap.add_argument("--from", dest="source", help="advise the runs kept in this directory again (no engine)")
    args = ap.parse_args()
    truth = grid_truth(args.grid)
    if args.source:
        shutil.rmtree(D.HOME, ignore_errors=True)  # the one dsd_compare made when imported
        print(f"world: the real vLLM CPU engine's captures kept in {args.source}, advised again; grids at "
              f"concurrency {', '.join(map(str, sorted(truth))) or 'none'}")  # fmt: skip
        for run in sorted(Path(args.source).glob("run-*"), key=lambda p: int(p.name.split("-")[1])):
            with tempfile.TemporaryDirectory(prefix="tuitune-refits-") as tmp:
                D.HOME = Path(tmp)
                report(run.name, sorted(str(x) for x in (run / "captures").glob("launch-*")), truth)
        return
    try:
        D.real_vllm.build()
    except D.real_vllm.Unreachable as e:
        print(f"the real vLLM engine was not installed: the package registry is unreachable ({e})")
        return
    shutil.rmtree(D.HOME, ignore_errors=True)  # the one dsd_compare made when imported: each run makes its own
    print(
        f"world: the real vLLM {D.real_vllm.RELEASE} CPU build, tiny random Llama, ngram (lookup 1-3), "
        f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at start); grids at concurrency "
        f"{', '.join(map(str, sorted(truth))) or 'none'}"
    )
    for run in range(1, args.runs + 1):
        D.HOME = Path(tempfile.mkdtemp(prefix="tuitune-refits-"))
        try:
            f, said = D.emit_schedule(args)
            caps = D.HOME / "fit" / "captures"
            if args.keep:
                dest = Path(args.keep) / f"run-{run}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(caps, dest / "captures")
                shutil.copy(f, dest / "dsd.json")
            report(f"run {run}", sorted(str(x) for x in caps.glob("launch-*")), truth, f)
        finally:
            shutil.rmtree(D.HOME, ignore_errors=True)


def report(name: str, caps: list[str], truth: dict[int, dict[int, float]], emitted: Path | None = None) -> None:
    """Advise the captures again (in ``D.HOME``, which ``D.tt`` runs tuitune in), print the schedule
    and each bucket against the grids."""
    again = D.HOME / "again.json"
    r = D.tt("advise", *caps, "--concurrency", "1,16", "--emit", "vllm-dsd", str(again), "--json")
    if r.returncode:
        print(f"\n== {name}: advise failed: {r.stderr.strip()}")
        return
    buckets = json.loads(r.stdout)["vllm_dsd"]["buckets"]
    table = json.loads((emitted or again).read_text())["num_speculative_tokens_per_batch_size"]
    print(f"\n== {name}: {json.dumps(table)}")
    for w in buckets:
        k, bs = w["k"], w["batch_size"]
        share = (w.get("sure") or {}).get(str(k))
        grid = ""
        for c, row in sorted(truth.items()):
            if w["key"] <= c <= w["end"] and k in row:
                grid += f"; grid at {c}: K {k} {row[k] / max(row.values()):.3f} of its best (K {max(row, key=row.get)})"
        p = w.get("per_request")
        print(
            f"  batch sizes {w['key']}-{w['end']} (judged at {bs}): K {k}, candidates {w['candidates']}"
            + (f" (the fit alone: {w['fit_alone']})" if w.get("fit_alone") else "")
            + (f", in {share:.0%} of the refits" if share is not None and not p else "")
            + ("  UNSURE" if w.get("unsure") else "")
            + (f"  PER-REQUEST (fit K {p['fit_best']}, plane K {p['best']}, {p['ratio']:.3f} with both)" if p else "")
            + grid
        )


if __name__ == "__main__":
    main()
