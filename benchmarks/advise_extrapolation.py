"""What a model fitted at one stream predicts for concurrency 8: the extrapolation advise now flags.

The capture of ``tests/decide/test_advise.py``'s single-stream case: the simulator's h100-llama8b
(EAGLE-3, chain of 3) as a process, 20x clock, benchmarked at one stream only by
`tuitune tune --budget 0` (batch size 1, 4 verify tokens, no launch with speculation off). Then
`tuitune advise CAPTURE --concurrency 8 --json`: printed, each of the model's top configurations
(and "off", and the running chain of 3) with its rank, its predicted goodput (divided by the
capture's 20x clock) and predicted gain over the running chain, beside the simulator's own
expected goodput for it at concurrency 8 and real speed (``sim.model.expected_goodput``: the truth
the model cannot see), and whether advise marked the ranking as extrapolated.

    python benchmarks/advise_extrapolation.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tuitune.decide.launch import Config
from tuitune.sim import model as S
from tuitune_support import simtruth as AA  # the simulator's truth for a configuration
from tuitune_support.captures import single_stream_capture, tuitune  # the test's capture, made the same way

ROOT = Path(__file__).resolve().parent.parent


SPEEDUP = 20  # the capture's simulator clock (single_stream_capture): predictions are of it
RUNNING = Config.chain(3)


def main() -> None:
    m = S.load_machine("h100-llama8b")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        capture = single_stream_capture(tmp)
        r = tuitune(tmp, "advise", str(capture), "--concurrency", "8", "--json")
        if r.returncode != 0:
            raise SystemExit(f"advise failed: {r.stderr.strip()}")
        advice = json.loads(r.stdout)["advice"][0]
    print("fitted at one stream (batch size 1, 4 verify tokens, no launch with speculation off); at concurrency 8:")
    print(f"  {'rank configuration':<30}{'predicted':>12}{'over running':>14}{'simulator':>17}  (tok/s, real speed)")
    ranking = advice["all"]
    rows = [(i + 1, row) for i, row in enumerate(ranking)]
    shown = rows[:5] + [
        (rank, row) for rank, row in rows[5:] if row["config"]["steps"] == 0 or row["config"] == RUNNING.to_dict()
    ]
    for rank, row in shown:
        gain = row.get("gain_over_running")
        truth = AA.truth(m, Config(**row["config"]), 8)
        print(
            f"  {rank:>3} {row['label']:<26}{row['goodput']['mean'] / SPEEDUP:>12.0f}"
            f"{'' if gain is None else f'{gain:+.0%}':>14}{truth:>17.0f}"
        )
    x = advice.get("extrapolation")
    print("advise: " + ("ranking marked extrapolated: " + x["sentence"] if x else "ranking not marked"))


if __name__ == "__main__":
    main()
