"""`tune` in one launch against `tune` by relaunches (docs/switch.md, issue 44): the same start, the same
budget, the same workload and level, on the same engine, one run after the other (then the other order
again with --pairs 2): each run's wall time, its launches (relaunches and measurements held live), what
it chose, and what it measured.

The start is EAGLE-3 at --start K, prepared to switch --ks (``speculative.switch``): tune in one launch
holds every chain of those K inside its launch and relaunches only for the rest (speculation off, K
outside the list); `--no-live` relaunches for every configuration. By default both end without the
final A/B (``--ab-rounds 0``: it would cost both the same static launches). With ``--ab-rounds R``
each ends with its proof: tune in one launch with ``--proof live`` (blocks in its launch, where the
choice is a chain it holds), tune by relaunches with the static A/B (R to ``--ab-max-rounds`` launches
a side): the whole of what each spends to an answer.

World: vLLM's CPU build (tuitune_support.real_vllm) on the machine it runs on, with SmolLM2-135M-Instruct
and a checkpoint of the EAGLE-3 head tuitune_support.real_draft trains (real acceptance), or the tiny
random Llama and its random draft (--model tiny: acceptance 1.00). A CPU launch is tens of seconds;
a GPU server's is minutes, so the ratio printed here understates what one launch saves there.

    python benchmarks/tune_live.py [--model smollm2] [--draft final] [--prompts tests/data/workloads/code.txt]
        [--api chat] [--ks 1-4] [--start 2] [--budget 3] [--concurrency 1] [--requests 3] [--max-tokens 64]
        [--ab-rounds 0] [--ab-max-rounds R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import real_engine_grid as grid
import yaml
from real_engine_grid import free_port, ks

from tuitune_support import real_vllm


def prepared_preset(start: int, switch: list[int], max_tokens: int) -> Path:
    """The start's preset (EAGLE-3 at K ``start``), prepared to switch ``switch``, on a port of its own."""
    path = grid.write("tl", free_port(), "EAGLE3", start, "tl.yaml", max_tokens)
    data = yaml.safe_load(path.read_text())
    data["speculative"]["switch"] = switch
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one(preset: Path, live: bool, ns: argparse.Namespace, n: int) -> dict:
    """One `tuitune tune` run to its end: wall time, launches, choice and measurements."""
    out = grid.HOME / f"tune-{'live' if live else 'relaunch'}-{n}"
    args = ["tune", str(preset), "--budget", str(ns.budget), "--ab-rounds", str(ns.ab_rounds)]
    if ns.ab_rounds:
        args += ["--ab-max-rounds", str(ns.ab_max_rounds or ns.ab_rounds)] + (["--proof", "live"] if live else [])
    args += ["--concurrency", str(ns.concurrency), "--levels", str(ns.concurrency)]
    args += ["--requests", str(ns.requests * ns.concurrency), "--warmup", "1", "--max-tokens", str(ns.max_tokens)]
    args += ["--out", str(out), "--json", str(out / "tune.json")] + ([] if live else ["--no-live"])
    t0 = time.monotonic()
    r = grid.tt(*args, timeout=7200)
    wall = time.monotonic() - t0
    grid.tt("stop", str(preset), timeout=300)
    if r.returncode != 0:
        sys.exit(f"tune ({'live' if live else '--no-live'}) failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    res = json.loads((out / "tune.json").read_text())
    return {
        "mode": "in one launch" if live else "relaunches (--no-live)",
        "wall_s": wall,
        "relaunches": res.get("relaunches"),
        "held_live": res.get("held_live", 0),
        "chosen": res["chosen_label"],
        "measured": res["measured"],
        "proof": res.get("proof"),
        "proof_why": res.get("proof_why"),
        "verdict": res["verdict"].get("verdict"),
        "ab_rounds_run": (res.get("ab") or {}).get("rounds"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="smollm2")
    ap.add_argument("--draft", choices=("early", "mid", "final"), default="final")
    ap.add_argument("--prompts", type=Path, default=Path("tests/data/workloads/code.txt"))
    ap.add_argument("--api", choices=("openai", "chat"), default="chat")
    ap.add_argument("--ks", default="1-4", help="the K the launch is prepared to hold (default 1-4)")
    ap.add_argument("--start", type=int, default=2, help="the start's K (default 2)")
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=3, help="requests per stream (default 3)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ab-rounds", type=int, default=0, help="the final A/B's first look (default 0: none)")
    ap.add_argument("--ab-max-rounds", type=int, help="its most rounds a side (default: --ab-rounds, fixed)")
    ap.add_argument("--pairs", type=int, default=1, help="live then relaunch, (then relaunch then live), ...")
    ap.add_argument("--json", type=Path, help="also write the runs as JSON")
    ns = ap.parse_args()
    draft = ns.draft if ns.model == "smollm2" else None
    grid.set_world(ns.model, ns.api, draft, "1,3", ns.prompts, eagle=True)
    try:
        real_vllm.build()
    except real_vllm.Unreachable as e:
        sys.exit(f"the engine cannot be built: the package registry is unreachable ({e})")
    switch = ks(ns.ks)
    if ns.start not in switch:
        sys.exit(f"--start {ns.start} must be one of --ks {switch}")
    preset = prepared_preset(ns.start, switch, ns.max_tokens)
    print(f"world: {grid.world_name()}")
    print(
        f"tune --budget {ns.budget} --ab-rounds {ns.ab_rounds}"
        + (f" --ab-max-rounds {ns.ab_max_rounds or ns.ab_rounds} (in one launch: --proof live)" if ns.ab_rounds else "")
        + f" at concurrency {ns.concurrency} from EAGLE-3 K {ns.start} prepared for K {switch}"
    )
    runs = []
    for n in range(ns.pairs):
        for live in (True, False) if n % 2 == 0 else (False, True):
            run = one(preset, live, ns, n)
            runs.append(run)
            print(
                f"  {run['mode']:<24} {run['wall_s']:7.0f} s  relaunches {run['relaunches']}, held live "
                f"{run['held_live']}; chose {run['chosen']}  measured "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(run["measured"].items(), key=lambda kv: -kv[1]))
                + (
                    f"; proof {run['proof']} ({run['ab_rounds_run']} rounds): {run['verdict']}"
                    + (f" [{run['proof_why']}]" if run["proof_why"] else "")
                    if run["proof"]
                    else f"; {run['verdict']}"
                )
            )
    live = [r["wall_s"] for r in runs if r["held_live"]]
    relaunch = [r["wall_s"] for r in runs if not r["held_live"]]
    if live and relaunch:
        print(f"wall time, relaunches / one launch: {sum(relaunch) / len(relaunch) / (sum(live) / len(live)):.2f}x")
    if ns.json:
        ns.json.write_text(json.dumps({"world": grid.world_name(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
