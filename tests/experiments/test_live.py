"""`sweep --live` (tuitune.experiments.live, docs/switch.md): step counts measured as blocks inside one
launch prepared to switch. Unit tests of the plan, the checks and the verdicts on rows written
here; the command end to end on the simulator playing vLLM (a real process, real HTTP, the switch
through the probe's protocol), where every block's profile windows must have run at its step count."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.base.events import ProfileWindow
from tuitune.experiments import live as L
from tuitune_support.ports import free_port
from tuitune_support.presets import vllm_sim_data
from tuitune_support.procs import tuitune_cli


def data(tmp_path: Path, port: int = 30001, **spec) -> dict:
    return vllm_sim_data(tmp_path, "lv", port, env={"VLLM_LOG_STATS_INTERVAL": "1"}, **spec)


def test_the_grid_must_be_the_step_key_with_prepared_values(tmp_path):
    p = P.from_dict(data(tmp_path, switch=[1, 2, 4]))
    assert L.step_values(p, {"speculative.num_speculative_tokens": [4, 1, 4]}) == [4, 1]
    for grid, why in (
        (
            {"speculative.num_speculative_tokens": [1, 3]},
            r"K 3 is not one the launch is prepared to hold \(\[1, 2, 4\]\)",
        ),
        ({"env.NCCL_PROTO": ["LL"]}, "env.NCCL_PROTO needs a relaunch"),
        ({"speculative.num_speculative_tokens": ["x"]}, "'x' is not a step count"),
    ):
        with pytest.raises(L.LiveError, match=why):
            L.step_values(p, grid)
    with pytest.raises(L.LiveError, match="set speculative.switch"):
        L.step_values(P.from_dict(data(tmp_path)), {"speculative.num_speculative_tokens": [1]})


def test_arms_and_the_plan_every_arm_once_a_round_in_a_drawn_order(tmp_path):
    p = P.from_dict(data(tmp_path, switch=[1, 2, 4]))
    arms = L.arms(p, [1, 2, 4], aa=True)
    assert arms == [("A", 2), ("B1", 1), ("B2", 4), ("A'", 2)]  # the preset's own K is the reference
    assert L.arms(p, [4, 1], aa=False) == [("A", 4), ("B1", 1)]  # its K not swept: the first value
    order = L.plan(arms, 6, seed=3)
    assert len(order) == 24 and order == L.plan(arms, 6, seed=3) and order != L.plan(arms, 6, seed=4)
    for r in range(1, 7):
        assert sorted(a for rr, a, _k in order if rr == r) == sorted(a for a, _k in arms)
    assert len({tuple(a for rr, a, _k in order if rr == r) for r in range(1, 7)}) > 1  # not one fixed order


def window(steps: int, held: int | None, accept: float = 1.5, cycles: int = 10) -> ProfileWindow:
    return ProfileWindow(1.0, 2.0, 0.5, accept, 3.5, cycles=cycles, steps=steps, held=held)


def test_a_block_is_checked_against_the_windows_the_probe_saw():
    # the windows before the first held at k straddle the switch (the last block's, flushed late; vLLM's
    # worker reading the hold a step late): not the block's, whatever they say
    assert L.block_check([window(2, 2), window(2, None), window(3, 3), window(3, 3)], 3) == (2, 2, 0)
    assert L.block_check([window(3, 3), window(2, 2)], 3) == (2, 1, 1)  # after it, one held at another K
    assert L.block_check([window(3, 3), window(3, None)], 3) == (2, 1, 1)  # ... or not held at all
    assert L.block_check([window(2, 3)], 3) == (1, 0, 1)  # labelled held at 3, yet ran at 2
    assert L.block_check([window(2, 2), window(2, None)], 3) == (0, 0, 0)  # never in force: unchecked
    means = L.window_means([window(3, 3, 2.0, 10), window(3, 3, 1.0, 30)])
    assert means["accept_len"] == pytest.approx(1.25) and means["draft_ms"] == 1.0


def rows(rates: dict[str, list[float]], other: dict | None = None) -> list[dict]:
    out = []
    for arm, values in rates.items():
        for r, v in enumerate(values, 1):
            windows_other = (other or {}).get((arm, r), 0)
            out.append(
                {
                    "arm": arm,
                    "round": r,
                    "steps": {"A": 2, "B1": 1, "A'": 2}[arm],
                    "preset": arm,
                    "median_tok_s": v,
                    "failed": 0,
                    "errors": [],
                    "concurrency": 1,
                    "workload": {"name": "built-in", "hash": "h", "prompts": 12, "lengths": 0},
                    "server": {},
                    "gpu_note": None,
                    "windows": 5,
                    "windows_held": 5 - windows_other,
                    "windows_other": windows_other,
                }
            )
    return out


ARMS = [("A", 2), ("B1", 1), ("A'", 2)]


def test_verdicts_the_aa_check_and_the_best():
    a = [100.0, 101.0, 99.0, 100.5, 100.2, 99.5]
    faster = [x * 1.2 for x in a]
    twin = [100.1, 99.8, 100.9, 99.3, 100.4, 100.0]
    j = L.judge(rows({"A": a, "B1": faster, "A'": twin}), ARMS, 6, 0.01)
    assert j["verdicts"]["B1"]["verdict"] == "faster" and j["aa"]["trusted"] and j["best"] == "B1"
    # the A/A arm decided apart from A: the launch drifted, nothing is called best
    drifted = [x * 1.2 for x in twin]
    j = L.judge(rows({"A": a, "B1": faster, "A'": drifted}), ARMS, 6, 0.01)
    assert j["aa"]["trusted"] is False and "not to be trusted" in j["aa"]["sentence"] and j["best"] == "A"
    # a block whose windows ran under another K: its arm is not comparable, whatever the rates say
    j = L.judge(rows({"A": a, "B1": faster, "A'": twin}, {("B1", 4): 2}), ARMS, 6, 0.01)
    v = j["verdicts"]["B1"]
    assert (
        v["verdict"] == "not comparable"
        and "round 4, B1: 2 of its 5 profile windows after the hold took effect ran under another" in v["reason"]
    )
    assert j["best"] == "A"
    # too few rounds: a measurement, no verdict, no A/A claim
    j = L.judge(rows({"A": a[:2], "B1": faster[:2], "A'": twin[:2]}), ARMS, 2, 0.01)
    assert not j["judged"] and j["aa"]["trusted"] is None and j["verdicts"]["B1"]["verdict"] == "measurement only"


def prepared_preset(tmp_path: Path, switch: list[int]) -> tuple[Path, dict]:
    """The preset file of a simulator prepared to switch ``switch`` on a free port, and tuitune's env."""
    preset = tmp_path / "lv.yaml"
    preset.write_text(yaml.safe_dump(data(tmp_path, free_port(), switch=switch)))
    return preset, {"HOME": str(tmp_path)}


def ok(env: dict, *args: str):
    """`tuitune ARGS` run to a successful end (its output in the failure otherwise)."""
    r = tuitune_cli(*args, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_live_sweep_on_the_simulator_one_launch_every_block_at_its_k(tmp_path):
    preset, env = prepared_preset(tmp_path, [1, 2, 4])
    out = tmp_path / "live"
    try:
        r = ok(
            env,
            *("sweep", str(preset), "--live", "--grid", "speculative.num_speculative_tokens=1,2,4", "--rounds", "4"),
            *("--requests", "2", "--warmup", "1", "--max-tokens", "200", "--out", str(out), "--seed", "7"),
        )
        assert r.stdout.count("launching lv prepared to switch") == 1  # one launch for every block
        res = json.loads((out / "live.json").read_text())
        blocks = res["blocks"]
        assert len(blocks) == 16 and [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()] == blocks
        assert Counter(b["arm"] for b in blocks) == {"A": 4, "B1": 4, "B2": 4, "A'": 4}
        for b in blocks:  # every block measured at the K it claims, as the probe's windows say
            assert b["windows"] and b["windows_held"] and not b["windows_other"] and not b["failed"], b
        assert [(b["round"], b["arm"]) for b in blocks] == [
            (rr, a) for rr, a, _k in L.plan(L.arms(P.load(preset), [1, 2, 4], True), 4, 7)
        ]
        # the simulated engine's verify cost grows with K: its cycle follows the held K
        cyc = res["cycle_ms"]
        assert cyc["B1"] < cyc["A"] < cyc["B2"] and math.isclose(cyc["A"], cyc["A'"], rel_tol=0.05), cyc
        assert "A/A check" in r.stdout and "best: K" in r.stdout and res["unchecked"] == 0
        # released at the end; the server keeps running, nothing held
        r = tuitune_cli("hold", str(preset), env=env)
        assert r.returncode == 0 and "nothing held" in r.stdout, r.stdout + r.stderr
    finally:
        tuitune_cli("stop", str(preset), env=env)


def test_tune_holds_the_prepared_chains_in_one_launch_and_relaunches_for_the_rest(tmp_path):
    """`tune` from a start prepared to switch: the chains it is prepared for are measured held in its one
    launch (rows marked live, no ready time, no relaunch counted), every other configuration the search
    picks (speculation off, a K it is not prepared for) with a relaunch."""
    preset, env = prepared_preset(tmp_path, [1, 2, 3])
    out = tmp_path / "tune"
    try:
        r = ok(
            env,
            *("tune", str(preset), "--budget", "3", "--ab-rounds", "0", "--levels", "1", "--requests", "2"),
            *("--max-tokens", "60", "--out", str(out), "--json", str(tmp_path / "tune.json")),
        )
        assert "prepared to switch K [1, 2, 3]: those chains are measured held live in one launch" in r.stdout
        rows = [json.loads(x) for x in (out / "tune.jsonl").read_text().splitlines()]
        launches = [x for x in rows if x.get("kind") == "launch" and not x.get("failure")]
        assert len(launches) >= 2, rows
        for x in launches:
            c = x["config"]
            prepared = c["topk"] == 1 and c["steps"] in (1, 2, 3) and c["draft_tokens"] == c["steps"] + 1
            assert bool(x.get("live")) == prepared and (x["ready_s"] is None) == prepared, x
        # speculation off first, in a launch of its own; then the start, held in the prepared launch, which
        # holds every chain after it: two launches in all unless the search picks a chain it is not prepared for
        assert (
            launches[0]["config"]["steps"] == 0
            and not launches[0].get("live")
            and "baseline first" in launches[0]["reason"]
        )
        assert launches[1]["live"] and launches[1]["config"]["steps"] == 2, launches[1]
        assert "speculation off first, in a launch of its own" in r.stdout
        res = json.loads((tmp_path / "tune.json").read_text())
        assert res["held_live"] == sum(1 for x in launches if x.get("live")), res
        # every launch but the first: each configuration that is not held, and the prepared start each time a
        # held one follows one that was not
        made = sum(1 for x in launches if not x.get("live"))
        made += sum(1 for a, b in zip(launches, launches[1:], strict=False) if b.get("live") and not a.get("live"))
        assert res["relaunches"] == made - 1, (res, [(x["config"]["steps"], x.get("live")) for x in launches])
        assert "measurement(s) held live in one launch" in r.stdout
    finally:
        tuitune_cli("stop", str(preset), env=env)


def test_live_crossover_holds_both_arms_in_one_launch_and_says_what_k_0_held_is_not(tmp_path):
    """`crossover --live`: the preset's own K against K 0 at each level, in crossover's interleaved order,
    every block held inside one launch (no relaunch), each checked against the probe's windows; the
    result says that K 0 held is not a launch without speculation."""
    preset, env = prepared_preset(tmp_path, [0, 2])
    try:
        r = ok(
            env,
            *("crossover", str(preset), "--live", "--concurrency", "1,2", "--requests", "2", "--warmup", "1"),
            *("--max-tokens", "150", "--no-plot", "--json", str(tmp_path / "x.json")),
        )
        assert r.stdout.count("launching lv prepared to switch") == 1, r.stdout
        res = json.loads((tmp_path / "x.json").read_text())
        assert res["steps"] == [2, 0] and res["step_name"] == "K" and res["twin"] == "lv at K 0", res
        assert [x["concurrency"] for x in res["levels"]] == [1, 2]
        for x in res["levels"]:  # every block ran at its K (the probe's windows), so every level is judged
            assert x["verdict"] != "not comparable" and x["on"]["goodput"] > 0 and x["off"]["goodput"] > 0, x
        assert any("K 0 held is not a launch without speculation" in n for n in res["notes"]), res["notes"]
        assert "K 2 tok/s" in r.stdout and "K 0 tok/s" in r.stdout and "note: " in r.stdout
        assert r.stdout.count("K 2 held:") == 2 and r.stdout.count("K 0 held:") == 2, r.stdout
        r = tuitune_cli("hold", str(preset), env=env)  # released at the end, the server still running
        assert r.returncode == 0 and "nothing held" in r.stdout, r.stdout + r.stderr
    finally:
        tuitune_cli("stop", str(preset), env=env)


def test_live_crossover_refusals_name_what_to_change(tmp_path):
    preset, env = prepared_preset(tmp_path, [1, 2])
    cases = [
        (("--live",), "K 0 is not one the launch is prepared to hold ([1, 2])"),
        (("--live", "--against", "2"), "--against 2: that is lv's own K"),
        (("--against", "1"), "--against is the step count held against the preset's own inside one launch: add --live"),
    ]
    for extra, words in cases:
        r = tuitune_cli("crossover", str(preset), "--concurrency", "1", *extra, env=env, timeout=60)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data(tmp_path, free_port())))
    r = tuitune_cli("crossover", str(plain), "--live", "--concurrency", "1", env=env, timeout=60)
    assert r.returncode == 2 and "set speculative.switch" in r.stderr, r.stderr


def test_a_block_without_a_decode_rate_is_said_as_such_not_as_nan():
    """A block whose outputs all came whole (the real vLLM's API server on two cores) printed "nan tok/s
    median" in the sweep's progress: it now says why there is no rate, with the goodput its verdict
    falls back to; a block whose requests all failed says that."""
    row = {"median_tok_s": 52.644, "goodput": 51.3, "failed": 0, "requests": 2}
    assert L.rate_said(row) == "52.64 tok/s median"
    whole = {**row, "median_tok_s": math.nan}
    assert L.rate_said(whole) == "no decode rate (its outputs came whole), goodput 51.30 tok/s"
    assert L.rate_said({**whole, "goodput": math.nan, "failed": 2}) == "no successful request"


def test_the_typed_result_reads_back_as_its_json_and_its_table_shows_dashes_for_no_rate():
    """`sweep --live`'s result is a typed ``LiveSweepResult``: live.json is its one JSON (NaN as null),
    read back by the same type; an arm with no decode rate shows "-" in the table, not nan."""
    import msgspec

    from tuitune.base.jsonl import dumps
    from tuitune.experiments.results import LiveSweepResult

    blocks = [{"arm": a, "round": 1, "median_tok_s": math.nan if a == "B1" else 50.0} for a in ("A", "B1", "A'")]
    fields = {
        "preset": "lv",
        "hash": "h",
        "engine": "vllm",
        "step_name": "K",
        "rounds": 1,
        "seed": 0,
        "arms": [{"arm": "A", "steps": 2}, {"arm": "B1", "steps": 4}, {"arm": "A'", "steps": 2}],
        "blocks": blocks,
        "median_tok_s": {"A": 50.0, "B1": None, "A'": 50.0},
        "accept_len": {"A": 1.5, "B1": None, "A'": 1.5},
        "cycle_ms": {"A": 20.0, "B1": None, "A'": 20.0},
        "verdicts": {
            "B1": {"steps": 4, "verdict": "measurement only"},
            "A'": {"steps": 2, "verdict": "measurement only"},
        },
        "judged": False,
        "aa": {"verdict": "measurement only", "ratio_ci": [math.nan, math.nan], "trusted": None, "sentence": "s"},
        "best": "A",
        "profiled": True,
        "unchecked": 0,
    }
    res = msgspec.convert(fields, LiveSweepResult)
    back = json.loads(dumps(res))
    assert back["blocks"][1]["median_tok_s"] is None and back["aa"]["trusted"] is None
    assert back["aa"]["ratio_ci"] == [None, None]  # too few rounds: no interval, read back as such
    assert msgspec.convert(back, LiveSweepResult).steps_of("B1") == 4
    table = L.format_live(res)
    b1 = next(line for line in table.splitlines() if line.startswith("B1"))
    assert "nan" not in table and b1.split()[3] == "-", table
    assert "no verdict: 1 rounds cannot decide" in table


def test_tune_proves_its_choice_in_one_launch_with_an_aa_check(tmp_path):
    """`tune --proof live`: where the start and the choice are both chains the launch is prepared to
    hold, the final A/B runs as blocks inside that launch (A, B and A's A/A twin, interleaved, a look
    after every round from --ab-rounds), launches nothing of its own, and writes the static choice to
    best.yaml only on "faster" with the A/A check clean. The simulated world (vLLM, an acceptance high
    enough that long chains win by about 40 %) makes the choice a held chain."""
    preset, env = prepared_preset(tmp_path, list(range(1, 9)))
    d = yaml.safe_load(preset.read_text())
    d["server"]["args"]["sim-acceptance"] = "0.95,0.92,0.9,0.88,0.85,0.8"
    preset.write_text(yaml.safe_dump(d))
    out = tmp_path / "tune"
    try:
        r = ok(
            env,
            *("tune", str(preset), "--budget", "2", "--proof", "live", "--ab-rounds", "4", "--ab-max-rounds", "6"),
            *("--levels", "1", "--requests", "2", "--max-tokens", "60", "--out", str(out)),
            *("--json", str(tmp_path / "tune.json")),
        )
        assert "up to 1 for the final A/B in one launch" in r.stdout and "A/B in one launch:" in r.stdout
        assert "launching A" not in r.stdout and "launching B" not in r.stdout  # no launch of the arms' own
        res = json.loads((tmp_path / "tune.json").read_text())
        # two launches in all: speculation off's, then the prepared start's, which held the search's chains
        # and the A/B's blocks
        assert res["proof"] == "live" and res["relaunches"] == 1 and res["held_live"] == 3, res
        assert r.stdout.count("(held live in the prepared launch: no relaunch)") == 3, r.stdout
        chosen = res["chosen"]["steps"]
        assert chosen != 2 and chosen in range(1, 9), res  # a held chain other than the start's K 2
        ab = res["ab"]
        blocks = ab["blocks"]
        assert ab["live"] and len(blocks) == 3 * ab["rounds"] and 4 <= ab["rounds"] <= 6, ab
        assert [json.loads(x) for x in (out / "proof.jsonl").read_text().splitlines()] == blocks
        assert Counter(b["arm"] for b in blocks) == {"A": ab["rounds"], "B": ab["rounds"], "A'": ab["rounds"]}
        for b in blocks:  # each block ran the step count it claims, as the probe's windows say
            assert b["steps"] == (chosen if b["arm"] == "B" else 2) and b["windows_held"] and not b["windows_other"], b
        assert ab["looks"] and ab["looks"][-1]["rounds"] == ab["rounds"], ab["looks"]
        v = res["verdict"]
        assert v["live"] and v["verdict"] == "faster" and v["ratio_ci"][0] > 1, v
        assert ab["aa"]["verdict"] == "no significant difference", ab["aa"]
        best = P.load(Path(res["best_preset"]))
        assert best.speculative.num_speculative_tokens == chosen and best.switch_steps is None  # static
        assert "proof: in one launch, " in r.stdout and "the cost of being prepared is not resolved" in r.stdout
        assert tuitune_cli("status", str(preset), env=env).returncode == 3  # its server stopped at the end
    finally:
        tuitune_cli("stop", str(preset), env=env)


def test_tune_proof_live_refusals_and_its_fallback_to_launches(tmp_path):
    """`--proof live` without a prepared start, or with --no-live, is refused in one sentence before any
    launch; a choice the launch cannot hold (speculation off, a K not prepared, NCCL variables kept)
    is proved by launches instead, and the result says why."""
    import types

    from tuitune.decide.launch import OFF, Config
    from tuitune.experiments.tune import SessionSource, TuneRun
    from tuitune.experiments.tuneoptions import TuneOptions
    from tuitune.experiments.tunereport import format_result
    from tuitune_support.results import tune_summary

    preset, env = prepared_preset(tmp_path, [1, 2, 3])
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data(tmp_path, free_port())))
    for args, why in (
        ((str(plain),), "lv is not prepared to switch (set speculative.switch"),
        (
            (str(preset), "--no-live"),
            "--proof live proves the choice inside the launch the search held its chains in: drop --no-live",
        ),
    ):
        r = tuitune_cli("tune", *args, "--budget", "1", "--proof", "live", "--out", str(tmp_path / "o"), env=env)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert not (tmp_path / "o").exists()  # refused before anything ran
    base = P.load(preset)
    run = TuneRun(base, TuneOptions(1, 1, tmp_path / "o", proof="live"))
    run.start = Config(2, 1, 3)
    source = SessionSource(None, base, tmp_path / "o")
    held = types.SimpleNamespace(chosen=Config(3, 1, 4))
    assert run.live_refusal(source, held) is None
    for chosen, why in (
        (OFF, "the choice, off, is not a chain"),
        (Config(5, 1, 6), "is not a chain the launch is prepared to hold (K [1, 2, 3])"),
    ):
        said = run.live_refusal(source, types.SimpleNamespace(chosen=chosen))
        assert said and why in said, said
    run.env_label = "NCCL_PROTO=LL"
    assert "keeps NCCL variables (NCCL_PROTO=LL)" in (run.live_refusal(source, held) or "")
    assert run.live_refusal(SessionSource(None, base, tmp_path / "o", live=False), held)  # --no-live's search
    # what the result says where the proof fell back to launches
    res = tune_summary(
        relaunches=1,
        proof="static",
        proof_why="the choice, off, is not a chain the launch is prepared to hold (K [1, 2, 3])",
        verdict={"verdict": "not confirmed", "reason": "x"},
    )
    assert "proof: static, not in one launch: the choice, off, is not a chain" in format_result(res)
