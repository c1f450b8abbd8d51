"""Interleaved A/B: relaunch and bench A, B, A, B … and decide with the launch as the unit.

Why the launch: NCCL variables and speculative settings are read once at process start, and a
launch brings its own placement, clocks and graph capture. Requests of one launch share all of
that, so they are not independent samples of the configuration; treating them as such makes tiny
launch-to-launch differences look significant. Each launch therefore contributes one number (its
median decode tok/s; at concurrency > 1 its goodput, all streams together), and A and B
alternate so that drift over time (thermal, other tenants) hits both arms alike. GPU telemetry
runs for the whole comparison: a launch measured while clocks were capped or a GPU straggled,
beside launches measured without, makes the verdict "not comparable".

The verdict is the exact Mann-Whitney test on the launches and its interval of the ratio is that
test inverted, so they always agree; the minimum effect is practical only (a decided difference is
reported against it, never discarded). With ``max_rounds`` the A/B is sequential: a look after
every round, stopping when the interval decides, the false positives held at 5 % over the looks
(``stats.design``: group-sequential, Pocock-type spending). Before relaunching it states the
smallest effect its rounds detect, from a measured launch-to-launch spread or a stated prior.

The arms are positional (A is the first preset given, B the second), never told apart by name:
two presets may share a ``name:``, and ``ab X X`` is a deliberate A/A run that measures how
different two identical arms look.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import msgspec

from tuitune.base.errors import TuituneError
from tuitune.base.events import Event
from tuitune.experiments.results import AbLook, AbPower, AbPowers, AbResult
from tuitune.machine import telemetry
from tuitune.machine.cluster import controlling, stop_started
from tuitune.machine.transport import Transport
from tuitune.measure import stats, workload
from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.serverinfo import limit_confound
from tuitune.preset import Preset

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


class RoundsError(TuituneError, ValueError):
    """An A/B refused before any relaunch (too few rounds for a verdict, arms on different prompts);
    the message is one sentence, bad input (exit 2)."""

    code = 2


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
MAX_ROUNDS = 40  # the most launches a side a sequential A/B may plan (its boundaries are simulated up to it)
MIN_EFFECT = 0.01  # the default minimum practical effect (--min-effect): reported against, never a reason to discard


def ab_design(rounds: int, max_rounds: int | None = None, alpha: float = ALPHA) -> stats.Design:
    """The looks of an A/B: one after ``rounds`` launches a side, or (``max_rounds`` above it) one
    after every round from ``rounds`` to ``max_rounds``, stopping at the first that decides."""
    return stats.design(rounds, max(rounds, max_rounds or rounds), alpha)


def detectable_effect(
    rounds: int, spread: float, alpha: float = ALPHA, power: float = POWER, max_rounds: int | None = None
) -> float | None:
    """The smallest gain (relative, B over A) that an A/B of ``rounds`` launches a side (adding
    rounds up to ``max_rounds``, sequentially) calls "faster" with probability ``power``, when
    launches spread by ``spread`` (sd of log goodput, log-normal). The verdict is the exact
    Mann-Whitney decision of ``stats.decide``, simulated with common random numbers (deterministic,
    monotone); it depends on the effect only through effect / spread. None: no effect can be."""
    if rounds < 1 or spread < 0 or not math.isfinite(spread):
        return None
    k = stats.detectable_shift(ab_design(rounds, max_rounds, alpha), power)
    return None if k is None else math.expm1(k * spread)


def power_note(rounds: int, spread: float, source: str, max_rounds: int | None = None) -> dict:
    """What an A/B of ``rounds`` launches a side (up to ``max_rounds``) can detect, and the sentence."""
    d = ab_design(rounds, max_rounds)
    eff = detectable_effect(rounds, spread, max_rounds=max_rounds)
    what = f"launch-to-launch spread {spread:.1%}, {source}"
    out = {"rounds": rounds, "max_rounds": d.last, "spread": spread, "spread_source": source, "detectable": eff}
    if eff is None:
        out["sentence"] = f"with {d.last} launch(es) a side no effect can be detected ({what})"
        return out
    if d.sequential:
        k = stats.detectable_shift(d, POWER)
        mean_rounds = stats.design_power(d, k or 0.0)[1]
        fixed = detectable_effect(rounds, spread)
        out["mean_rounds"] = mean_rounds
        out["sentence"] = (
            f"adding rounds from {rounds} up to {d.last} launches a side until the interval decides, this A/B "
            f"detects a change of {eff:.1%} or more {POWER:.0%} of the time, after {mean_rounds:.1f} rounds on "
            f"average at that size ({what}); "
            + (f"{rounds} fixed rounds would need {fixed:.1%}" if fixed is not None else f"{rounds} rounds alone: none")
        )
    else:
        out["sentence"] = (
            f"with {rounds} launches a side this A/B detects a change of {eff:.1%} or more "
            f"{POWER:.0%} of the time ({what}); smaller real gains will mostly read 'no significant difference'"
        )
    return out


def pooled_spread(groups: list[list]) -> tuple[float | None, int]:
    """The pooled sd of log value within groups (launches of one configuration each), and the
    launches it rests on (None, 0: no group has two usable values)."""
    ss, dof, used = 0.0, 0, 0
    for g in groups:
        v = [math.log(x) for x in g if isinstance(x, int | float) and x > 0 and math.isfinite(x)]
        if len(v) >= 2:
            m = sum(v) / len(v)
            ss += sum((x - m) ** 2 for x in v)
            dof += len(v) - 1
            used += len(v)
    return (math.sqrt(ss / dof), used) if dof else (None, 0)


def measured_spread(launches: list[dict], key: str) -> float | None:
    """The pooled within-arm sd of log goodput (or median tok/s) of an A/B's launches."""
    return pooled_spread([[x[key] for x in launches if x["arm"] == arm] for arm in ("A", "B")])[0]


def earlier_launches(doc) -> list[dict]:
    """The launch rows of an earlier `ab --json` (or `tune --json`, a tune.jsonl) document."""
    if isinstance(doc, list):
        return [x for d in doc for x in earlier_launches(d)]
    if not isinstance(doc, dict):
        return []
    rows = [x for x in doc.get("launches") or [] if isinstance(x, dict) and "hash" in x]
    return rows + (earlier_launches(doc["ab"]) if isinstance(doc.get("ab"), dict) else [])


def spread_from(paths: list[str], presets: list[Preset], concurrency: int | None = None) -> tuple[float, str]:
    """The launch-to-launch spread of earlier launches of ``presets`` (matched by what is launched:
    the preset hash, and the concurrency) in earlier A/B results; ValueError (one sentence) when the
    files hold no two such launches of one preset."""
    import json
    from pathlib import Path

    rows: list[dict] = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"--spread-from {path}: cannot read it ({e.strerror or e})") from None
        try:
            docs = [json.loads(text)]
        except ValueError:
            try:  # a JSON-lines log (tune.jsonl): one document a line
                docs = [json.loads(x) for x in text.splitlines() if x.strip()]
            except ValueError:
                raise ValueError(f"--spread-from {path}: not an `ab --json` or `tune` result (not JSON)") from None
        rows += earlier_launches(docs)
    groups = []
    for p in presets:
        mine = [x for x in rows if x.get("hash") == p.hash()]
        if concurrency is not None:
            mine = [x for x in mine if x.get("concurrency", 1) == concurrency]
        if mine:
            groups.append([x.get(metric(mine)) for x in mine])
    sd, used = pooled_spread(groups)
    if sd is None:
        raise ValueError(
            f"--spread-from {', '.join(paths)}: no two launches of {' or '.join(sorted({p.name for p in presets}))} "
            f"(the same launch command{f', at concurrency {concurrency}' if concurrency else ''}) to measure a spread from"
        )
    return sd, f"measured: {used} earlier launches of these presets"


def ab_notes(a: Preset, b: Preset, rounds: int, max_rounds: int | None = None) -> list[str]:
    """What the user should know before the run starts (one sentence each); ``max_rounds``: the
    budget of a sequential A/B (its first looks may come before a verdict is possible)."""
    notes = []
    if a.hash() == b.hash():
        notes.append(
            f"A/A run: both arms launch the same configuration ({a.name}), so any 'significant' difference is noise"
        )
    if max(rounds, max_rounds or rounds) < MIN_ROUNDS:
        notes.append(
            f"--rounds {rounds} cannot reach p < {ALPHA} with the exact Mann-Whitney test "
            f"(it needs {MIN_ROUNDS} launches per arm), so this is a measurement without a verdict"
        )
    elif rounds < MIN_ROUNDS:
        notes.append(
            f"the looks after fewer than {MIN_ROUNDS} rounds cannot decide (the exact Mann-Whitney test needs "
            f"{MIN_ROUNDS} launches per arm): the first look that can comes after round {MIN_ROUNDS}"
        )
    return notes


async def bench_launch(  # noqa: PLR0913
    t: Transport,
    p: Preset,
    overrides: dict,
    timeout_s: float,
    listeners: list | None = None,
    allowed: set[str] | None = None,
    allow_any: bool = False,
    running: list[Preset] | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> dict:
    """Relaunch ``p`` (replacing only a server of a preset in ``allowed``), bench it, return one
    launch's row (``listeners``: where telemetry is handed). ``running``: ``p`` is put there once
    its server is started (one running at a time: the A/B's clean-up stops it); a relaunch cut
    short stops its half-started server itself and says so to ``on_cleanup``."""

    async def started(_rec) -> None:
        if running is not None:
            running[:] = [p]

    async with controlling(t, p) as control:
        try:
            rec, ready = await control.relaunch(timeout_s, allowed=allowed, allow_any=allow_any, after_start=started)
        except asyncio.CancelledError:
            if running is not None:
                running.clear()
            if control.cleanup and on_cleanup is not None:
                on_cleanup(control.cleanup)
            raise
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
        "workload": s.get("workload"),
    }


def verdict(
    launches: list[dict],
    min_effect: float = MIN_EFFECT,
    judge: bool = True,
    d: stats.Design | None = None,
    bootstrap: bool = True,
) -> dict:
    """Arm B against arm A, each launch one sample (rows carry their arm, "A" or "B"); with
    ``judge`` False (too few rounds, run on purpose) the medians and ratio without a verdict.

    The decision is ``stats.decide`` at the look after these launches of design ``d`` (default:
    one look, the exact Mann-Whitney test at 5 %): "faster" / "slower" exactly when the ratio's
    interval (the test inverted) lies wholly above / below 1, whatever ``min_effect``. The minimum
    practical effect only says whether a decided difference is surely at least that large
    (``practical``), and whether an undecided interval shows the difference is smaller
    (``equivalent``): it never turns a decided result into "no significant difference".
    ``bootstrap`` False leaves out the medians' bootstrap interval (a description only)."""
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
    other = next(
        (why for x in launches if (why := workload.differ(x.get("workload"), launches[0].get("workload")))), None
    )
    if other:
        return {"verdict": "not comparable", "reason": f"the launches ran different workloads ({other})"}
    confound = limit_confound(
        {
            arm: [(x.get("server") or {}).get("max_running_requests") for x in launches if x["arm"] == arm]
            for arm in "AB"
        },
        max((x.get("concurrency") or 1) for x in launches),
    )
    if confound and confound[0]:
        return {"verdict": "not comparable", "reason": confound[1]}
    key = metric(launches)
    va = [x[key] for x in launches if x["arm"] == "A"]
    vb = [x[key] for x in launches if x["arm"] == "B"]
    out = {**stats.compare(va, vb, min_effect, n_boot=2000 if bootstrap else 0), "metric": key}
    if why := metric_why(launches, key):
        out["metric_why"] = why
    out["median_ratio_ci"] = out.pop("ratio_ci")  # the bootstrap of the medians: a description, not the decision
    if not judge:
        out["ratio_ci"] = out["median_ratio_ci"]
        out["verdict"] = NO_VERDICT
        out["reason"] = (
            f"{len(va)} + {len(vb)} launches cannot reach significance (p is never below "
            f"{min_p(len(va), len(vb)):.2f}): a measurement without a verdict"
        )
        return out
    blank = next(
        (x for x in launches if not (isinstance(x[key], int | float) and x[key] > 0 and x[key] < math.inf)), None
    )
    if blank is not None:
        return {
            "verdict": "not comparable",
            "reason": f"launch {blank['arm']} of round {blank.get('round', '?')} ({blank['preset']}) measured no {key}",
        }
    if len(va) != len(vb):
        return {"verdict": "not comparable", "reason": f"the arms have {len(va)} and {len(vb)} launches"}
    d = d or ab_design(len(va))
    look = stats.decide(va, vb, d)
    lo, hi = look["interval"]
    out.update(
        ratio_ci=[lo, hi],
        interval_level=look["interval_level"],
        shift=look["shift"],
        u=look["u"],
        pairs=look["pairs"],
        critical_u=look["critical_u"],
        nominal_level=look["nominal_level"],
        method=d.method,
        alpha=d.alpha,
        sequential=d.sequential,
        design_rounds=[d.first, d.last],
    )
    if look["decision"] == "faster":
        out.update(verdict="faster", at_least=lo - 1, practical=lo >= 1 + min_effect)
    elif look["decision"] == "slower":
        out.update(verdict="slower", at_least=1 - hi, practical=hi <= 1 - min_effect)
    else:
        out.update(
            verdict="no significant difference",
            equivalent=bool(min_effect > 0 and lo >= 1 - min_effect and hi <= 1 + min_effect),
        )
    return out


def rate_said(row: dict) -> str:
    """A launch's (or a live block's) rate in a few words: its median decode rate, or why it has none
    (no request came back; or its outputs came whole, no chunk times: its goodput then, what a
    verdict falls back to)."""
    rate, goodput = row["median_tok_s"], row.get("goodput", math.nan)
    if math.isfinite(rate):
        return f"{rate:.2f} tok/s median"
    if row["failed"] >= row["requests"]:
        return "no successful request"
    if not math.isfinite(goodput):
        return "no rate"
    return f"no decode rate (its outputs came whole), goodput {goodput:.2f} tok/s"


def cell(v, width: int, digits: int) -> str:
    """A number in a table's column, or "-" where there is none (None, NaN: no decode rate)."""
    return f"{v:>{width}.{digits}f}" if isinstance(v, int | float) and math.isfinite(v) else f"{'-':>{width}}"


def ci_cell(ci: list) -> str:
    """An interval in the table's 17 columns, or "-" where there is none."""
    return f"{ci[0]:>8.2f}-{ci[1]:<8.2f}" if all(map(_rate, ci)) else f"{'-':>8} {'':<8}"


def _rate(v) -> bool:
    return isinstance(v, int | float) and 0 < v < math.inf


def metric(launches: list[dict]) -> str:
    """One stream: its decode speed; several: the goodput of all of them (what a server sells). At one
    stream, where a launch measured no decode rate (its server sent its outputs whole: no chunk times,
    docs/benchmarks.md) but every launch a goodput, the goodput, for all of them alike (``metric_why``)."""
    if any(x.get("concurrency", 1) > 1 for x in launches):
        return "goodput"
    if any(not _rate(x.get("median_tok_s")) for x in launches) and all(_rate(x.get("goodput")) for x in launches):
        return "goodput"
    return "median_tok_s"


def metric_why(launches: list[dict], key: str) -> str | None:
    """Why one stream's launches are compared by goodput (None: they are not, or by the usual rule)."""
    if key != "goodput" or any(x.get("concurrency", 1) > 1 for x in launches):
        return None
    n = sum(1 for x in launches if not _rate(x.get("median_tok_s")))
    return (
        f"{n} of {len(launches)} measured no decode rate (the server sent their outputs whole): compared by "
        "goodput, each request's tokens over its whole time, the first token's wait included"
    )


def look_line(v: dict, rounds: int, last: int) -> str:
    """One look of a sequential A/B, in one line."""
    if v["verdict"] == "not comparable":
        return f"look after {rounds} rounds: not comparable ({v['reason']}): stopping"
    lo, hi = v["ratio_ci"]
    where = f"look after {rounds} of up to {last} rounds: B/A {v['shift']:.4f}, "
    if v["critical_u"] is None:
        return where + "this look cannot decide yet (its boundary is beyond reach): adding a round"
    what = f"{v['interval_level']:.1%} interval {lo:.4f}-{hi:.4f}, p = {v['p_value']:.4f} (boundary {v['nominal_level']:.4f})"
    if v["verdict"] in ("faster", "slower"):
        return where + what + f": decided, B is {v['verdict']}"
    if v.get("equivalent"):
        return where + what + f": decided, any difference is inside ±{v['min_effect']:.1%}"
    return where + what + (": undecided, adding a round" if rounds < last else ": undecided, no rounds left")


def stop_reason(v: dict, rounds: int, last: int) -> str:
    """Why a sequential A/B stops after this look ("undecided …": it goes on while rounds are left)."""
    if v["verdict"] == "not comparable":
        return f"not comparable after {rounds} rounds"
    if v["verdict"] != "no significant difference":
        return f"decided after {rounds} of up to {last} rounds"
    if v.get("equivalent"):
        return f"decided after {rounds} of up to {last} rounds: any difference is inside ±{v['min_effect']:.1%}"
    if rounds < last:
        return f"undecided after {rounds} rounds"
    return f"undecided after {last} rounds: the budget ({last} rounds) is spent"


async def run_ab(  # noqa: C901, PLR0913
    t: Transport,
    a: Preset,
    b: Preset,
    rounds: int,
    overrides: dict,
    min_effect: float = MIN_EFFECT,
    timeout_s: float = 900.0,
    progress: Callable[[str], None] | None = None,
    stop_at_end: bool = True,
    allow_any: bool = False,
    spread: float | None = None,
    spread_source: str = "",
    judge: bool = True,
    max_rounds: int | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> AbResult:
    """``rounds`` launches per arm, interleaved; with ``max_rounds`` above ``rounds`` a sequential
    A/B: after round ``rounds`` and every round after it, a look (``stats.decide`` with the design's
    boundary); it stops at the first look that decides (or shows any difference is inside
    ``min_effect``), else when ``max_rounds`` are spent. Too few rounds for a verdict are refused
    (RoundsError) before anything is relaunched, unless ``judge`` is False (allowed on purpose, fixed
    rounds only): then the run is a measurement, its result says so and gives no verdict.

    ``spread``: the launch-to-launch spread measured before (``spread_source`` says where);
    without it the stated prior PRIOR_SPREAD. Either way the A/B says, before it relaunches, the
    smallest effect it can detect with its rounds; after, the same from the spread it measured.

    Interrupted (Ctrl-C, SIGTERM), it stops the arm's server it started, as a completed A/B stops
    its last, and says so to ``on_cleanup``."""
    last = max(rounds, max_rounds or rounds)
    if last > MAX_ROUNDS:
        raise RoundsError(f"--max-rounds {last} is more than {MAX_ROUNDS}, the most a sequential A/B plans")
    if "prompts" not in overrides and a.bench.prompts != b.bench.prompts:
        raise RoundsError(
            f"the arms benchmark different prompts (bench.prompts: {a.name} {a.bench.prompts or 'built-in'}, "
            f"{b.name} {b.bench.prompts or 'built-in'}): a difference would be partly the workload's; "
            "pass --prompts FILE to use one for both"
        )
    why = rounds_refusal(last, "--max-rounds" if last > rounds else "--rounds")
    if why and (judge or last > rounds):
        raise RoundsError(why)
    judge = why is None  # enough rounds: a verdict, whatever was allowed
    d = ab_design(rounds, last)
    before = (
        power_note(rounds, spread, spread_source or "measured before", last)
        if spread is not None
        else power_note(rounds, PRIOR_SPREAD, "a prior: nothing measured yet", last)
    )
    if progress:
        progress(f"power: {before['sentence']}")
        if judge:
            progress(
                f"design: {d.method}; false positives at most {d.alpha:.0%}"
                + (f" over the looks after {d.first} to {d.last} rounds" if d.sequential else "")
                + (
                    f"; minimum practical effect {min_effect:.1%} (--min-effect): reported against, never a reason "
                    "to discard a decided result"
                    if min_effect > 0
                    else "; no minimum practical effect: any decided difference counts"
                )
            )
    launches: list[dict] = []
    looks: list[dict] = []
    stopped = f"{last} rounds run"
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
    running: list[Preset] = []  # the arm whose server this A/B started and has not stopped yet
    try:
        for r in range(1, last + 1):
            for arm, p in (("A", a), ("B", b)):
                if progress:
                    progress(f"round {r}/{last}: launching {arm} ({p.name})")
                row = await bench_launch(
                    t, p, overrides, timeout_s, listeners, allowed, allow_any and not launches, running, on_cleanup
                )
                row["round"], row["arm"] = r, arm
                launches.append(row)
                if a.server.port != b.server.port:  # one server at a time, or the arms share the GPUs
                    async with controlling(t, p) as control:
                        await control.stop()
                    running.clear()
                if progress:
                    progress(
                        f"  {p.name}: {rate_said(row)}"
                        + (f", {row['failed']} failed" if row["failed"] else "")
                        + (f", GPUs held back: {row['gpu_note']}" if row["gpu_note"] else "")
                    )
            if d.sequential and r >= d.first:
                v = verdict(launches, min_effect, True, d)
                looks.append(
                    {
                        "rounds": r,
                        **{k: v.get(k) for k in ("verdict", "ratio_ci", "shift", "p_value", "u", "critical_u")},
                    }
                )
                if progress:
                    progress(look_line(v, r, last))
                stopped = stop_reason(v, r, last)
                if r < last and not stopped.startswith("undecided"):
                    break
    except asyncio.CancelledError:
        for p in running:
            async with controlling(t, p) as control:
                said = await stop_started(control, p.name)
            if said and on_cleanup is not None:
                on_cleanup(said)
        raise
    finally:
        await telemetry.stop(gpus, task)
    if stop_at_end:
        async with controlling(t, b) as control:
            await control.stop()
    got = measured_spread(launches, metric(launches))
    after = power_note(rounds, got, "measured in this A/B", last) if got is not None else None
    return AbResult(
        a=a.name,
        b=b.name,
        aa=a.hash() == b.hash(),
        rounds=len(launches) // 2,
        first_look=rounds,
        max_rounds=last,
        launches=launches,
        notes=ab_notes(a, b, rounds, last),
        power=AbPowers(msgspec.convert(before, AbPower), msgspec.convert(after, AbPower) if after else None),
        design=d.to_dict() if judge else None,
        looks=[msgspec.convert(x, AbLook) for x in looks],
        stopped=stopped,
        verdict=verdict(launches, min_effect, judge, d),
    )
