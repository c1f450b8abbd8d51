"""Step counts measured inside one launch (docs/switch.md, "Measuring in one launch"): `sweep --live`.

A launch prepared to switch (``speculative.switch``) holds each step count in turn through the
engine's own switching code (``Session.hold``), and each hold is a **block**: the bench's warm-up
requests after the switch (the windows that straddle it, the engine's caches), then its measured
requests, the same prompts in every block. Each round runs every arm once, in an order drawn at
random for that round (seeded), so that a drift of the machine over the run falls on every arm
alike. The reference arm is the preset's own step count; an **A/A arm** measures it a second time
each round, as an arm of its own: the same verdict between two blocks of one setting says what the
in-launch design can wrongly call a difference.

Verdicts are ``ab``'s (each block one sample, Mann-Whitney, the exact level at the rounds run; too
few rounds are a measurement without a verdict). What the probe saw is checked too: a block during
which a profile window ran under another step count, or none was held, makes its arm not
comparable (the setting the block claims is not the one it measured).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.base.events import Event, ProfileWindow
from tuitune.base.jsonl import dumps
from tuitune.experiments.ab import MIN_EFFECT, ab_design, cell, rate_said, rounds_refusal, verdict
from tuitune.experiments.options import SweepOptions
from tuitune.experiments.results import LiveSweepResult
from tuitune.machine.session import Session

DEFAULT_ROUNDS = 6
REFERENCE, TWIN = "A", "A'"


class LiveError(TuituneError):
    """A live sweep that cannot run as asked (one sentence)."""

    code = 2


def step_values(base: P.Preset, grid: dict) -> list[int]:
    """The step counts of a live sweep's grid: one axis, the engine's step key, each value one the
    preset's launch is prepared to hold; LiveError (one sentence) otherwise."""
    e = base.engine
    prepared = base.switch_steps
    if prepared is None:
        raise LiveError(
            f"{base.name}: --live measures inside one launch prepared to switch; set speculative.switch to the "
            f"{e.step_name} values to try (docs/switch.md)"
        )
    if list(grid) != [e.step_key]:
        others = ", ".join(k for k in grid if k != e.step_key) or "none"
        raise LiveError(
            f"--live switches {e.label}'s step count only (--grid {e.step_key}=...); {others} needs a relaunch: "
            "run the sweep without --live"
        )
    values: list[int] = []
    for v in grid[e.step_key]:
        if type(v) is not int:
            raise LiveError(f"--grid {e.step_key}: {v!r} is not a step count")
        if v not in prepared:
            raise LiveError(
                f"{e.step_name} {v} is not one the launch is prepared to hold ({prepared}): add it to "
                "speculative.switch, or run the sweep without --live"
            )
        if v not in values:
            values.append(v)
    return values


def arms(base: P.Preset, values: list[int], aa: bool) -> list[tuple[str, int]]:
    """(arm, step count): the reference A (the preset's own step count where it is one of the
    values, else the first), each other value B1, B2 …, and the A/A twin of A."""
    own = base.engine.static_config(base) if base.is_speculative else None
    ref = own[0] if own is not None and own[0] in values else values[0]
    out = [(REFERENCE, ref)] + [(f"B{i}", v) for i, v in enumerate([v for v in values if v != ref], 1)]
    return out + ([(TWIN, ref)] if aa else [])


def plan(arm_list: list[tuple[str, int]], rounds: int, seed: int) -> list[tuple[int, str, int]]:
    """(round, arm, step count) in run order: every arm once a round, in an order drawn per round."""
    rng = random.Random(seed)
    out = []
    for r in range(1, rounds + 1):
        order = list(arm_list)
        rng.shuffle(order)
        out += [(r, arm, k) for arm, k in order]
    return out


def in_force(windows: list[ProfileWindow], k: int) -> tuple[list[ProfileWindow], int]:
    """(the block's windows from the first one held at k on, how many came before it). Those before
    straddle the switch: the last block's partial window, flushed only when the engine's next cycle
    begins (and, timed by CUDA events, logged one window late), and vLLM's worker reading the hold a
    step or two late; none of them is the block's."""
    first = next((i for i, w in enumerate(windows) if w.held == k), len(windows))
    return windows[first:], first


def block_check(windows: list[ProfileWindow], k: int) -> tuple[int, int, int]:
    """(windows, held at k, at another setting) among a block's windows from the first held at k
    on (``in_force``): after it every window must be held at k and run k steps."""
    mine, _before = in_force(windows, k)
    held = sum(1 for w in mine if w.held == k and w.steps == k)
    return len(mine), held, len(mine) - held


def window_means(windows: list[ProfileWindow]) -> dict[str, float | None]:
    """A block's accept length and phases from the probe's windows (weighted by their cycles)."""
    total = sum(w.cycles for w in windows)
    if not total:
        return {"accept_len": None, "draft_ms": None, "verify_ms": None, "extend_ms": None}
    return {
        key: sum(getattr(w, key) * w.cycles for w in windows) / total
        for key in ("accept_len", "draft_ms", "verify_ms", "extend_ms")
    }


def block_row(run, r: int, arm: str, k: int, word: str, windows: list[ProfileWindow], position: int) -> dict:
    s = run.summary()
    tok = s.get("tok_s") or {}
    n, held, other = block_check(windows, k)
    probe = window_means(in_force(windows, k)[0])
    return {
        "kind": "block",
        "round": r,
        "position": position,
        "arm": arm,
        "steps": k,
        "preset": f"{arm} ({word} {k})",
        "concurrency": run.config.concurrency,
        "median_tok_s": tok.get("median", math.nan),
        "goodput": (s.get("goodput") or {}).get("tok_s", math.nan),
        # the requests' own (SGLang's meta_info), else the probe's windows
        "accept_len": (s.get("accept_len") or {}).get("mean") or probe["accept_len"],
        "cycle_ms": run.cycle_ms,
        "draft_ms": probe["draft_ms"],
        "verify_ms": probe["verify_ms"],
        "extend_ms": probe["extend_ms"],
        "requests": s["requests"],
        "failed": s["failed"],
        "errors": s["errors"],
        "server": s.get("server"),
        "workload": s.get("workload"),
        "gpu_note": run.gpu_note,
        "windows": n,
        "windows_held": held,
        "windows_other": other,
        "time": time.time(),
    }


def block_problem(rows: list[dict]) -> str | None:
    """Why these blocks do not measure the settings they claim (one sentence), or None: a window,
    after the hold was seen in force, that ran another step count or was not held."""
    for x in rows:
        if x["windows_other"]:
            return (
                f"round {x['round']}, {x['preset']}: {x['windows_other']} of its {x['windows']} profile windows after "
                "the hold took effect ran under another step count than the one held"
            )
    return None


def arm_verdict(rows: list[dict], arm: str, min_effect: float, judge: bool, d) -> dict:
    """Arm ``arm``'s blocks against A's (``ab``'s verdict, each block one sample); not comparable where
    a block of either ran under another step count than its hold (``block_problem``)."""
    pair = [dict(x, arm="A") for x in rows if x["arm"] == REFERENCE]
    pair += [dict(x, arm="B") for x in rows if x["arm"] == arm]
    v = verdict(pair, min_effect, judge, d, bootstrap=False)
    why = block_problem([x for x in rows if x["arm"] in (REFERENCE, arm)])
    return {"verdict": "not comparable", "reason": why} if why and v.get("verdict") != "not comparable" else v


def aa_check(twin: dict, judged: bool, rounds: int) -> dict:
    """The A/A check from A's twin's verdict: whether the verdicts beside it can be trusted (None: too
    few rounds to tell), and the sentence that says so."""
    if not judged:
        return {
            "verdict": twin.get("verdict"),
            "ratio_ci": twin.get("ratio_ci"),
            "trusted": None,
            "sentence": f"the A/A check cannot decide in {rounds} rounds (a measurement without verdicts)",
        }
    wrong = twin.get("verdict") in ("faster", "slower")
    return {
        "verdict": twin.get("verdict"),
        "ratio_ci": twin.get("ratio_ci"),
        "trusted": not wrong and twin.get("verdict") != "not comparable",
        "sentence": (
            "the A/A check found a difference between two blocks of the same setting: the launch drifted "
            "within rounds, so the verdicts above are not to be trusted; run more rounds or a quieter machine"
            if wrong
            else "the A/A check found no difference between two blocks of the same setting"
            if twin.get("verdict") != "not comparable"
            else f"the A/A check is not comparable ({twin.get('reason')})"
        ),
    }


def judge(rows: list[dict], arm_list: list[tuple[str, int]], rounds: int, min_effect: float) -> dict:
    """Each arm against A (ab's verdict, blocks as launches), the A/A check, and the best arm."""
    ok = rounds_refusal(rounds) is None
    d = ab_design(rounds) if ok else None
    out: dict = {"verdicts": {}, "judged": ok}
    for arm, k in arm_list:
        if arm != REFERENCE:
            out["verdicts"][arm] = {"steps": k, **arm_verdict(rows, arm, min_effect, ok, d)}
    twin = out["verdicts"].get(TWIN)
    out["aa"] = None if twin is None else aa_check(twin, ok, rounds)
    faster = [
        (v.get("shift") or 0.0, arm)
        for arm, v in out["verdicts"].items()
        if arm != TWIN and v.get("verdict") == "faster"
    ]
    trusted = out["aa"] is None or out["aa"]["trusted"]
    out["best"] = max(faster)[1] if faster and trusted else REFERENCE
    return out


def medians(rows: list[dict], key: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for arm in dict.fromkeys(x["arm"] for x in rows):
        vals = [
            x[key] for x in rows if x["arm"] == arm and isinstance(x.get(key), int | float) and math.isfinite(x[key])
        ]
        out[arm] = statistics.median(vals) if vals else None
    return out


async def live_sweep(
    base: P.Preset,
    values: list[int],
    o: SweepOptions,
    progress: Callable[[str], None] | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> LiveSweepResult:
    """The blocks of the plan for ``values`` on the preset's server (launched first when it does not
    run this preset, prepared), released at the end; a row a block in OUT/results.jsonl as it comes.
    ``o``: the sweep's options (``--rounds``, ``--seed``, ``--no-aa``, ``--no-verdict``, the bench flags)."""
    say = progress or (lambda _m: None)
    rounds, seed, out, overrides, min_effect = (
        o.rounds or DEFAULT_ROUNDS,
        o.seed,
        Path(o.out),
        o.overrides(),
        MIN_EFFECT,
    )
    why = rounds_refusal(rounds)
    if why and not o.no_verdict:
        raise LiveError(why.replace(" launches", " blocks"))
    word = base.engine.step_name
    arm_list = arms(base, values, not o.no_aa)
    order = plan(arm_list, rounds, seed)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    results.write_text("")
    async with prepared_launch(base, say, on_cleanup) as session:
        say(
            f"{len(order)} blocks: {len(arm_list)} arms ("
            + ", ".join(f"{a} {word} {k}" for a, k in arm_list)
            + f"; A is the reference) x {rounds} rounds, each round in its own random order (seed {seed}), one launch"
        )
        rows = await run_blocks(session, order, overrides, results, say)
    profiled = base.profile
    fields = {
        "preset": base.name,
        "hash": base.hash(),
        "engine": base.engine.name,
        "step_name": word,
        "rounds": rounds,
        "seed": seed,
        "arms": [{"arm": a, "steps": k} for a, k in arm_list],
        "blocks": rows,
        "median_tok_s": medians(rows, "median_tok_s"),
        "accept_len": medians(rows, "accept_len"),
        "cycle_ms": medians(rows, "cycle_ms"),
        **judge(rows, arm_list, rounds, min_effect),
        "profiled": profiled,
        "unchecked": sum(1 for x in rows if not x["windows_held"]) if profiled else len(rows),
    }
    result = msgspec.convert(fields, LiveSweepResult)
    (out / "live.json").write_text(dumps(result, indent=1))
    return result


@contextlib.asynccontextmanager
async def prepared_launch(
    base: P.Preset, say: Callable[[str], None], on_cleanup: Callable[[str], None] | None
) -> AsyncIterator[Session]:
    """A session on the preset's server prepared to switch, launched first where it does not run (or runs
    unprepared). At the end the hold in force before (set with `tuitune hold`) is put back, else the hold
    is released, and the server keeps running; an experiment cut short (an error, Ctrl-C) says what
    became of it to ``on_cleanup``."""
    session = Session(base)
    prior: int | None = None
    cut = True
    try:
        st = await session.connect(backlog=0)
        if not (st.running and st.ours and session.running_preset is not None and st.record and st.record.switch):
            say(f"launching {base.name} prepared to switch {base.engine.step_name} {base.switch_steps}")
            await session.relaunch(base)
        prior = session.held
        yield session
        cut = False
    finally:
        said = await put_back(session, prior, base.engine.step_name, say)
        await session.close()
        if cut and on_cleanup is not None:
            on_cleanup(session.cleanup or said)


@contextlib.contextmanager
def collected_windows(session: Session):
    """The probe's windows as they come, in a list the caller may clear (at each block's hold)."""
    windows: list[ProfileWindow] = []

    def collect(evs: list[Event]) -> None:
        windows.extend(e for e in evs if isinstance(e, ProfileWindow))

    session.subscribe(collect)
    try:
        yield windows
    finally:
        with contextlib.suppress(ValueError):
            session.subscribers.remove(collect)


async def run_blocks(
    session: Session,
    order: list[tuple[int, str, int]],
    overrides: dict,
    results: Path,
    say: Callable[[str], None],
    until: Callable[[list[dict]], bool] | None = None,
) -> list[dict]:
    """Each block of ``order`` in turn: hold, bench (its warm-up first), the probe's windows kept; a row a
    block, appended to ``results`` as it ends. ``until``: asked after each whole round with the rows so
    far, True stops there (a sequential design: `tune --proof live`)."""
    word = session.preset.engine.step_name
    rounds = max((r for r, _a, _k in order), default=0)
    rows: list[dict] = []
    with collected_windows(session) as windows:
        position = 0
        for r, arm, k in order:
            if until is not None and rows and rows[-1]["round"] != r and until(rows):
                break
            position = position + 1 if rows and rows[-1]["round"] == r else 1
            await session.hold(k)
            windows.clear()
            run = await session.bench(label=f"{arm} {word} {k}", **(overrides or {}))
            row = block_row(run, r, arm, k, word, list(windows), position)
            rows.append(row)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            say(
                f"round {r}/{rounds} {arm} ({word} {k}): {rate_said(row)}"
                + (f", {row['failed']} failed" if row["failed"] else "")
                + (f", {row['windows_other']} window(s) at another setting" if row["windows_other"] else "")
            )
    return rows


async def put_back(session: Session, prior: int | None, word: str, say: Callable[[str], None]) -> str:
    """At the end of a live sweep: the hold that was in force before it put back (else released), on
    a server that still runs; what became of it, in a clause (said, never raised over the run's own error).
    `crossover --live` ends the same way."""
    if session.record is None or not session.record.switch or session.state.state != "ready":
        return "no server of the sweep is running"
    try:
        await session.hold(prior)
    except Exception as e:
        say(f"warning: the hold was not {'put back' if prior is not None else 'released'}: {e}")
        return "the server keeps running; its hold may still be in force (`tuitune hold PRESET` says)"
    return (f"{word} {prior} is held again, as before the sweep" if prior is not None else "the hold was released") + (
        "; the server keeps running"
    )


def format_live(result: LiveSweepResult) -> str:
    """The live sweep as a table: each arm's blocks, its median rate, its verdict against A."""
    word = result.step_name
    med, acc, cyc = result.median_tok_s, result.accept_len, result.cycle_ms
    lines = [
        f"{'arm':<5} {word:>5} {'blocks':>6} {'tok/s':>9} {'accept':>7} {'cycle ms':>9}  against A",
    ]
    for a in result.arms:
        n = sum(1 for x in result.blocks if x["arm"] == a.arm)
        against = "(reference)" if a.arm == REFERENCE else _against(result.verdicts.get(a.arm))
        lines.append(
            f"{a.arm:<5} {a.steps:>5} {n:>6} {cell(med.get(a.arm), 9, 2)} {cell(acc.get(a.arm), 7, 2)} "
            f"{cell(cyc.get(a.arm), 9, 1)}  {against}"
        )
    if result.aa is not None:
        lines.append(result.aa.sentence)
    why = next((v["metric_why"] for v in result.verdicts.values() if v.get("metric_why")), None)
    if why:
        lines.append(f"verdicts by goodput, not the tok/s column: {why}")
    if not result.profiled:
        lines.append("profile is off: which step count each block ran under was not checked (set profile: true)")
    elif result.unchecked:
        lines.append(
            f"{result.unchecked} of {len(result.blocks)} blocks ended before the probe wrote a profile window "
            "under their hold: their step count is unchecked (longer blocks, --requests or --max-tokens, check it)"
        )
    k = result.steps_of(result.best)
    if not result.judged:
        lines.append(f"no verdict: {result.rounds} rounds cannot decide (a measurement)")
    elif result.best == REFERENCE:
        lines.append(f"best: {word} {k} (the reference: no other step count is decidedly faster)")
    else:
        lines.append(
            f"best: {word} {k}, decidedly faster than the reference; `tuitune hold {result.preset} {k}` holds it"
        )
    return "\n".join(lines)


def _against(v: dict | None) -> str:
    if not v:
        return "-"
    what = v.get("verdict", "-")
    lo, hi = (v.get("ratio_ci") or [math.nan, math.nan])[:2]
    if what == "not comparable":
        return f"not comparable: {v.get('reason')}"
    ci = f" (B/A {v['shift']:.3f}, interval {lo:.3f}-{hi:.3f})" if v.get("shift") and math.isfinite(lo) else ""
    return what + ci
