"""Interleaved A/B: relaunch and bench A, B, A, B … and decide with the launch as the unit.

Why the launch: NCCL variables and speculative settings are read once at process start, and a
launch brings its own placement, clocks and graph capture. Requests of one launch share all of
that, so they are not independent samples of the configuration; treating them as such makes tiny
launch-to-launch differences look significant. Each launch therefore contributes one number (its
median decode tok/s; at concurrency > 1 its goodput, all streams together), and A and B
alternate so that drift over time (thermal, other tenants) hits both arms alike. GPU telemetry
runs for the whole comparison: a launch measured while clocks were capped or a GPU straggled,
beside launches measured without, makes the verdict "not comparable".

The arms are positional (A is the first preset given, B the second), never told apart by name:
two presets may share a ``name:``, and ``ab X X`` is a deliberate A/A run that measures how
different two identical arms look.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from tuitune.base.events import Event
from tuitune.measure import stats
from tuitune.measure.bench import BenchConfig, run_bench
from tuitune.preset import Preset
from tuitune.target import telemetry
from tuitune.target.cluster import controlling
from tuitune.target.transport import Transport

ALPHA = 0.05  # stats.compare's significance level


def min_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the exact Mann-Whitney test can give with these sample sizes: the
    two most extreme of the C(n_a + n_b, n_a) equally likely orderings (complete separation)."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a)) if n_a and n_b else 1.0


def min_rounds(alpha: float = ALPHA) -> int:
    """The fewest launches per arm with which a verdict can be significant (4 at p < 0.05)."""
    n = 1
    while min_p(n, n) >= alpha:
        n += 1
    return n


MIN_ROUNDS = min_rounds()  # with fewer launches per arm the exact two-sided U test cannot reach p < 0.05
NO_VERDICT = "measurement only"


class RoundsError(ValueError):
    """Too few rounds for a verdict, refused before any relaunch; the message is one sentence."""


def rounds_refusal(rounds: int, flag: str = "--rounds", override: str = "--no-verdict") -> str | None:
    """Why ``rounds`` launches per arm cannot give a verdict, and what can (None: they can)."""
    if rounds >= MIN_ROUNDS:
        return None
    return (
        f"{flag} {rounds} cannot reach significance: with {rounds} + {rounds} launches the exact "
        f"Mann-Whitney p is never below {min_p(rounds, rounds):.2f} (a verdict needs p < {ALPHA}), so no "
        f"difference could be found however large; {flag} {MIN_ROUNDS} is the smallest that can "
        f"(or add {override} to run it as a measurement without a verdict)"
    )


PRIOR_SPREAD = 0.02  # launch-to-launch spread (sd, relative) assumed before any is measured: tune's NOISE, FACTS §7
POWER = 0.8  # "can detect": the verdict says faster this often when the effect is real
_TRIALS = 4000


def _u_critical(n: int, alpha: float) -> int | None:
    """The largest U (pairs where A beats B) at which the exact two-sided test of n against n
    launches still gives p < alpha; None when no U does (too few launches)."""
    counts = stats._u_counts(n, n)
    total = sum(counts)
    crit, tail = None, 0
    for u, c in enumerate(counts):
        tail += c
        if 2 * tail / total >= alpha:
            break
        crit = u
    return crit


def detectable_effect(
    rounds: int, spread: float, min_effect: float = 0.01, alpha: float = 0.05, power: float = POWER
) -> float | None:
    """The smallest gain (relative, B over A) that an A/B of ``rounds`` launches a side calls
    "faster" with probability ``power``, when launches spread by ``spread`` (sd of log goodput).

    Both halves of the verdict rule of ``stats.compare`` are modelled: the exact Mann-Whitney test
    (simulated with common random numbers, so the answer is deterministic and monotone) and the
    ratio-of-medians interval beyond ``min_effect`` (a normal interval on the log ratio, the
    median's variance π σ² / 2n standing for the bootstrap). None: no effect can be detected."""
    import random

    if rounds < 1 or spread < 0:
        return None
    crit = _u_critical(rounds, alpha)
    if crit is None:
        return None
    rng = random.Random(25)
    draws = [
        ([rng.gauss(0, 1) for _ in range(rounds)], [rng.gauss(0, 1) for _ in range(rounds)]) for _ in range(_TRIALS)
    ]
    half = 1.96 * spread * math.sqrt(math.pi / rounds)  # 95 % half-width of the log ratio of medians
    floor = math.log1p(min_effect)

    def detected(effect: float) -> float:
        shift = math.log1p(effect)
        hits = 0
        for za, zb in draws:
            a = [spread * z for z in za]
            b = [shift + spread * z for z in zb]
            u = sum(1 for x in a for y in b if x > y)
            if u <= crit and stats.median(b) - stats.median(a) - half > floor:
                hits += 1
        return hits / len(draws)

    lo, hi = 0.0, 1.0
    if detected(hi) < power:
        return None
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if detected(mid) >= power else (mid, hi)
    return hi


def power_note(rounds: int, spread: float, source: str, min_effect: float = 0.01) -> dict:
    """What an A/B of ``rounds`` launches a side can detect, and the sentence that says it."""
    eff = detectable_effect(rounds, spread, min_effect)
    what = f"launch-to-launch spread {spread:.1%}, {source}"
    if eff is None:
        sentence = f"with {rounds} launch(es) a side no effect can be detected ({what})"
    else:
        sentence = (
            f"with {rounds} launches a side this A/B detects a change of {eff:.1%} or more "
            f"{POWER:.0%} of the time ({what}; minimum effect {min_effect:.0%}); smaller real gains "
            "will mostly read 'no significant difference'"
        )
    return {"rounds": rounds, "spread": spread, "spread_source": source, "detectable": eff, "sentence": sentence}


def measured_spread(launches: list[dict], key: str) -> float | None:
    """The pooled within-arm sd of log goodput (or median tok/s) of an A/B's launches."""
    ss, dof = 0.0, 0
    for arm in ("A", "B"):
        v = [math.log(x[key]) for x in launches if x["arm"] == arm and x[key] > 0 and math.isfinite(x[key])]
        if len(v) >= 2:
            m = sum(v) / len(v)
            ss += sum((x - m) ** 2 for x in v)
            dof += len(v) - 1
    return math.sqrt(ss / dof) if dof else None


def ab_notes(a: Preset, b: Preset, rounds: int) -> list[str]:
    """What the user should know before the run starts (one sentence each)."""
    notes = []
    if a.hash() == b.hash():
        notes.append(
            f"A/A run: both arms launch the same configuration ({a.name}), so any 'significant' difference is noise"
        )
    if rounds < MIN_ROUNDS:
        notes.append(
            f"--rounds {rounds} cannot reach p < {ALPHA} with the exact Mann-Whitney test "
            f"(it needs {MIN_ROUNDS} launches per arm), so this is a measurement without a verdict"
        )
    return notes


async def bench_launch(
    t: Transport,
    p: Preset,
    overrides: dict,
    timeout_s: float,
    listeners: list | None = None,
    allowed: set[str] | None = None,
    allow_any: bool = False,
) -> dict:
    """Relaunch ``p`` (replacing only a server of a preset in ``allowed``), bench it, return one
    launch's row (``listeners``: where telemetry is handed)."""
    async with controlling(t, p) as control:
        rec, ready = await control.relaunch(timeout_s, allowed=allowed, allow_any=allow_any)
        assert ready is not None  # it waited: ready, or an error was raised
    port = await t.forward_port(p.server.port)
    watch = telemetry.RunWatch()
    if listeners is not None:
        listeners.append(watch.feed)
    try:
        run = await run_bench(BenchConfig.for_preset(t.url(port), p, overrides))
    finally:
        if listeners is not None:
            listeners.remove(watch.feed)
    s = run.summary()
    tok = s.get("tok_s") or {}
    return {
        "preset": p.name,
        "hash": p.hash(),
        "pid": rec.pid,
        "ready_s": ready.elapsed_s,
        "concurrency": run.config.concurrency,
        "goodput": (s.get("goodput") or {}).get("tok_s", math.nan),
        "median_tok_s": tok.get("median", math.nan),
        "ci95": tok.get("ci95"),
        "accept_len": (s.get("accept_len") or {}).get("mean"),
        "requests": s["requests"],
        "failed": s["failed"],
        "errors": s["errors"],
        "server": s.get("server"),
        "time": time.time(),
        "gpu_note": watch.note(),
    }


def verdict(launches: list[dict], min_effect: float, judge: bool = True) -> dict:
    """Arm B against arm A, each launch one sample (rows carry their arm, "A" or "B"); with
    ``judge`` False (too few rounds, run on purpose) the medians and ratio without a verdict."""
    bad = [x for x in launches if x["failed"]]
    if bad:
        return {
            "verdict": "not comparable",
            "reason": f"{len(bad)} launch(es) had failed requests ({bad[0]['preset']}: {', '.join(bad[0]['errors'])})",
        }
    held = [x for x in launches if x.get("gpu_note")]
    if held and len(held) < len(launches):
        x = held[0]
        return {
            "verdict": "not comparable",
            "reason": f"GPUs were held back during {len(held)} of {len(launches)} launches "
            f"({x['preset']}, round {x.get('round', '?')}: {x['gpu_note']})",
        }
    key = metric(launches)
    va = [x[key] for x in launches if x["arm"] == "A"]
    vb = [x[key] for x in launches if x["arm"] == "B"]
    out = {**stats.compare(va, vb, min_effect), "metric": key}
    if not judge:
        out["verdict"] = NO_VERDICT
        out["reason"] = (
            f"{len(va)} + {len(vb)} launches cannot reach significance (p is never below "
            f"{min_p(len(va), len(vb)):.2f}): a measurement without a verdict"
        )
    return out


def metric(launches: list[dict]) -> str:
    """One stream: its decode speed; several: the goodput of all of them (what a server sells)."""
    return "goodput" if any(x.get("concurrency", 1) > 1 for x in launches) else "median_tok_s"


async def run_ab(
    t: Transport,
    a: Preset,
    b: Preset,
    rounds: int,
    overrides: dict,
    min_effect: float = 0.01,
    timeout_s: float = 900.0,
    progress: Callable[[str], None] | None = None,
    stop_at_end: bool = True,
    allow_any: bool = False,
    spread: float | None = None,
    spread_source: str = "",
    judge: bool = True,
) -> dict:
    """``rounds`` launches per arm, interleaved. Too few rounds for a verdict are refused
    (RoundsError) before anything is relaunched, unless ``judge`` is False (allowed on purpose):
    then the run is a measurement, its result says so and gives no verdict.

    ``spread``: the launch-to-launch spread measured before (``spread_source`` says where);
    without it the stated prior PRIOR_SPREAD. Either way the A/B says, before it relaunches, the
    smallest effect it can detect with ``rounds``; after, the same from the spread it measured."""
    why = rounds_refusal(rounds)
    if why and judge:
        raise RoundsError(why)
    judge = why is None  # enough rounds: a verdict, whatever was allowed
    before = (
        power_note(rounds, spread, spread_source or "measured before", min_effect)
        if spread is not None
        else power_note(rounds, PRIOR_SPREAD, "a prior: nothing measured yet", min_effect)
    )
    if progress:
        progress(f"power: {before['sentence']}")
    launches: list[dict] = []
    listeners: list[Callable[[list[Event]], None]] = []
    allowed = {a.name, b.name}

    def to_listeners(evs: list[Event]) -> None:
        for f in list(listeners):
            f(evs)

    gpus = (
        telemetry.Collector(t, telemetry.for_preset(a), to_listeners, a.telemetry.period_ms)
        if a.telemetry.enabled
        else None
    )
    task = asyncio.ensure_future(gpus.run()) if gpus else None
    try:
        for r in range(1, rounds + 1):
            for arm, p in (("A", a), ("B", b)):
                if progress:
                    progress(f"round {r}/{rounds}: launching {arm} ({p.name})")
                row = await bench_launch(t, p, overrides, timeout_s, listeners, allowed, allow_any and not launches)
                row["round"], row["arm"] = r, arm
                launches.append(row)
                if a.server.port != b.server.port:  # one server at a time, or the arms share the GPUs
                    async with controlling(t, p) as control:
                        await control.stop()
                if progress:
                    progress(
                        f"  {p.name}: {row['median_tok_s']:.2f} tok/s median"
                        + (f", {row['failed']} failed" if row["failed"] else "")
                        + (f", GPUs held back: {row['gpu_note']}" if row["gpu_note"] else "")
                    )
    finally:
        await telemetry.stop(gpus, task)
    if stop_at_end:
        async with controlling(t, b) as control:
            await control.stop()
    got = measured_spread(launches, metric(launches))
    after = power_note(rounds, got, "measured in this A/B", min_effect) if got is not None else None
    return {
        "a": a.name,
        "b": b.name,
        "aa": a.hash() == b.hash(),
        "rounds": rounds,
        "launches": launches,
        "notes": ab_notes(a, b, rounds),
        "power": {"before": before, "after": after},
        "verdict": verdict(launches, min_effect, judge),
    }


def format_ab(result: dict) -> str:
    lines = [
        f"{'round':>5}  {'arm':<3} {'preset':<28} {'tok/s':>9} {'95% CI':>17} {'goodput':>9} {'accept':>7} {'failed':>6}"
    ]
    for x in result["launches"]:
        ci = x.get("ci95") or [math.nan, math.nan]
        acc = f"{x['accept_len']:.2f}" if x.get("accept_len") else "-"
        lines.append(
            f"{x['round']:>5}  {x['arm']:<3} {x['preset']:<28} {x['median_tok_s']:>9.2f} "
            f"{ci[0]:>8.2f}-{ci[1]:<8.2f} {x.get('goodput', math.nan):>9.1f} {acc:>7} {x['failed']:>6}"
            + (f"  ⚠ GPUs: {x['gpu_note']}" if x.get("gpu_note") else "")
        )
    v = result["verdict"]
    if v["verdict"] == "not comparable":
        lines.append(f"\nverdict: not comparable: {v['reason']}")
        return "\n".join(lines)
    lo, hi = v["ratio_ci"]
    a, b = f"A ({result['a']})", f"B ({result['b']})"
    what = (
        "goodputs at concurrency " + str(result["launches"][0].get("concurrency"))
        if v.get("metric") == "goodput"
        else "launch medians"
    )
    lines.append(f"\nmedians of {what}: {a} {v['baseline_median']:.2f}, {b} {v['candidate_median']:.2f} tok/s")
    lines.append(
        f"ratio B/A = {v['ratio']:.4f} (95% CI {lo:.4f}-{hi:.4f}), "
        f"Mann-Whitney p = {v['p_value']:.3f} over {v['n_baseline']}+{v['n_candidate']} launches"
    )
    if v["verdict"] == NO_VERDICT:
        lines.append(f"no verdict: {v['reason']}")
    else:
        lines.append(
            f"verdict: {b} is {v['verdict']}"
            if v["verdict"] != "no significant difference"
            else f"verdict: no significant difference (minimum effect {v['min_effect']:.0%})"
        )
        lines.append(
            f"why: {stats.verdict_why(v)} (faster or slower needs both p < 0.05 and the interval entirely beyond "
            f"1 ± {v['min_effect']:.0%})"
        )
    after = (result.get("power") or {}).get("after")
    if after:
        lines.append(f"power: {after['sentence']}")
    if result.get("aa"):
        lines.append("this was an A/A run (the same configuration in both arms): a difference here is noise")
    return "\n".join(lines)
