"""`tuitune tune`: measure, fit, advise, relaunch the predicted best, re-fit … then prove it.

The loop (``tune_loop``) is independent of where measurements come from: a ``Source`` launches a
configuration and returns what the launch showed (profile windows, decode lines, goodput per load
level). ``SessionSource`` does it for real: relaunch through the session, benchmark a few load
levels (the target concurrency and two others, so that one launch puts several verify token
counts on the curve), record everything to a capture. ``tune`` wraps the loop with the JSONL log,
``--resume``, and the final interleaved A/B (start vs chosen) that decides whether ``best.yaml``
is written.

Each round: fit the model to every launch so far; if the predicted best unmeasured configuration
beats the best measured goodput by more than the noise, launch it; otherwise launch the
configuration whose interval reaches highest above the best measured (it could still win); stop
when nothing can beat the best by more than the noise, or the relaunch budget is spent. The
choice is the best *measured* configuration: a prediction is never the final word.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tuitune import preset as P
from tuitune.base.jsonl import append_row, read_rows
from tuitune.decide.advise import Advice, advise, space
from tuitune.decide.costmodel import Config, FitError, Launch, fit
from tuitune.experiments.observe import preset_config
from tuitune.target.control import ControlError

NOISE = 0.02  # gains below this are inside launch-to-launch noise (FACTS §7: published gains are ~1-4 %)


class TuneError(Exception):
    """Tuning cannot start or continue (one sentence); code 2 for bad input, 1 for failed work."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Source(Protocol):
    async def measure(self, config: Config, levels: list[int]) -> Launch: ...


def levels_for(concurrency: int) -> list[int]:
    """Load levels benchmarked in one launch: the target and two more, spreading bs × tokens."""
    c = max(1, concurrency)
    return sorted({max(1, c // 4), c, min(2 * c if c > 1 else 4, 256)})


def config_of(p: P.Preset) -> Config:
    c = preset_config(p)
    if c is None:
        raise TuneError(
            f"{p.name}: speculative.num_steps is unset (SGLang picks it at start); set it so that "
            f"tune knows where it starts",
            2,
        )
    return c


def preset_for(base: P.Preset, c: Config, spec_section: dict) -> P.Preset:
    """``base`` running configuration ``c`` (a static one); ``spec_section`` is the speculative
    section to vary (algorithm and draft model kept). The engine spells the configuration."""
    if not c.speculative:
        return P.with_changes(base, {"speculative": None})
    return P.with_changes(base, {"speculative": {**spec_section, **base.engine.config_changes(c)}})


@dataclass
class Step:
    round: int
    config: Config
    reason: str
    predicted: dict | None  # the prediction that chose it (None for the start)
    goodput: dict[int, float] = field(default_factory=dict)
    failure: str | None = None

    def to_dict(self) -> dict:
        return {
            "kind": "launch",
            "round": self.round,
            "config": self.config.to_dict(),
            "label": self.config.label,
            "reason": self.reason,
            "predicted": self.predicted,
            "failure": self.failure,
            "goodput": {str(k): v for k, v in self.goodput.items()},
            "time": time.time(),
        }


@dataclass
class TuneResult:
    start: Config
    chosen: Config
    concurrency: int
    steps: list[Step]
    launches: list[Launch]
    stop_reason: str
    advice: Advice | None

    @property
    def relaunches(self) -> int:
        return max(0, len(self.steps) - 1)

    def measured(self) -> dict[Config, float]:
        out: dict[Config, list[float]] = {}
        for ln in self.launches:
            if self.concurrency in ln.goodput:
                out.setdefault(ln.config, []).append(ln.goodput[self.concurrency])
        return {c: sum(v) / len(v) for c, v in out.items()}


def _best_measured(launches: list[Launch], concurrency: int) -> tuple[Config, float]:
    vals: dict[Config, list[float]] = {}
    for ln in launches:
        g = ln.goodput.get(concurrency)
        if g is not None and math.isfinite(g) and g > 0:
            vals.setdefault(ln.config, []).append(g)
    if not vals:
        raise TuneError("no launch measured any goodput (every benchmark failed)")
    # ties within the noise go to the simpler configuration (fewer steps, smaller tree)
    mean = {c: sum(v) / len(v) for c, v in vals.items()}
    top = max(mean.values())
    near = [c for c, g in mean.items() if g >= top * (1 - NOISE / 4)]
    c = min(near, key=lambda x: (x.steps, x.topk, x.draft_tokens))
    return c, mean[c]


def decide(
    launches: list[Launch],
    concurrency: int,
    configs: list[Config] | None = None,
    noise: float = NOISE,
    describe: Callable[[Config], str] = Config.label.fget,
) -> tuple[Config | None, str, Advice | None]:
    """The next configuration to launch and why; None when tuning should stop. ``describe``
    names a configuration in the engine's words."""
    try:
        model = fit(launches)
    except FitError as e:
        raise TuneError(f"cannot fit the cost model: {e}") from None
    seen = {ln.config for ln in launches}
    adv = advise(model, concurrency, launches[-1].config if launches else None, configs)
    _, best = _best_measured(launches, concurrency)
    open_ = [p for p in adv.ranking if p.config not in seen]
    if not open_:
        return None, "every configuration has been measured", adv
    top = open_[0]
    if top.goodput.mean > best * (1 + noise):
        return (
            top.config,
            (
                f"predicted best: {top.goodput.mean:.1f} tok/s vs {best:.1f} measured "
                f"({top.goodput.mean / best - 1:+.1%})"
            ),
            adv,
        )
    reach = [p for p in open_ if p.goodput.hi > best * (1 + noise)]
    if reach:
        p = max(reach, key=lambda x: x.goodput.hi)
        return (
            p.config,
            (
                f"could still win: predicted {p.goodput.mean:.1f}, interval up to {p.goodput.hi:.1f} "
                f"vs {best:.1f} measured"
            ),
            adv,
        )
    return (
        None,
        (
            f"predicted gain inside the noise: the best unmeasured, {describe(top.config)}, is predicted at "
            f"{top.goodput.mean:.1f} vs {best:.1f} measured"
        ),
        adv,
    )


async def tune_loop(
    source: Source,
    start: Config,
    budget: int,
    concurrency: int,
    levels: list[int] | None = None,
    configs: list[Config] | None = None,
    prior: list[tuple[Step, Launch]] | None = None,
    on_step: Callable[[Step, Launch], None] | None = None,
    progress: Callable[[str], None] | None = None,
    describe: Callable[[Config], str] = Config.label.fget,
) -> TuneResult:
    """Measure ``start``, then up to ``budget`` relaunches chosen by the fitted model."""
    levels = levels or levels_for(concurrency)
    if concurrency not in levels:
        levels = sorted({*levels, concurrency})
    steps = [s for s, _ in prior or []]
    launches = [ln for _, ln in prior or []]

    async def run(c: Config, reason: str, predicted: dict | None) -> None:
        if progress:
            progress(f"launch {len(steps)}: {describe(c)} ({reason})")
        ln = await source.measure(c, levels)
        st = Step(len(steps), c, reason, predicted, dict(ln.goodput), ln.failure)
        steps.append(st)
        launches.append(ln)
        if on_step:
            on_step(st, ln)
        if progress:
            g = ln.goodput.get(concurrency)
            progress(
                f"  launch failed: {ln.failure}"
                if ln.failure
                else f"  goodput at concurrency {concurrency}: " + (f"{g:.1f} tok/s" if g else "not measured")
            )

    if not steps:
        await run(start, "the starting configuration", None)
    stop = "relaunch budget spent"
    adv = None
    while len(steps) - 1 < budget:
        nxt, why, adv = decide(launches, concurrency, configs, describe=describe)
        if nxt is None:
            stop = why
            break
        pred = None
        if adv is not None:
            p = next((x for x in adv.ranking if x.config == nxt), None)
            pred = p.goodput.to_dict() if p else None
        await run(nxt, why, pred)
    else:
        try:
            _, _, adv = decide(launches, concurrency, configs, describe=describe)
        except TuneError:
            adv = None
    chosen, _ = _best_measured(launches, concurrency)
    return TuneResult(start, chosen, concurrency, steps, launches, stop, adv)


# ---- the real thing: a session, captures, the JSONL log, the A/B ---------------------------------


class SessionSource:
    """Relaunch a preset's server with each configuration and benchmark it at a few load levels."""

    def __init__(self, session, base: P.Preset, out: Path, overrides: dict | None = None, settle_s: float = 0.5):
        from tuitune.measure.capture import CaptureWriter, redacted_preset

        self._writer_cls, self._redact = CaptureWriter, redacted_preset
        self.session = session
        self.base = base
        self.spec = base.speculative.model_dump()
        self.out = out
        self.overrides = overrides or {}
        self.settle_s = settle_s
        self.count = 0

    def preset(self, c: Config) -> P.Preset:
        return preset_for(self.base, c, self.spec)

    async def measure(self, config: Config, levels: list[int]) -> Launch:
        from tuitune.base.events import DecodeStats, LogLine, ProfileWindow

        p = self.preset(config)
        (self.out / "captures").mkdir(parents=True, exist_ok=True)
        path = self.out / "captures" / f"launch-{self.count:02d}-{config.short.replace('/', '-')}.jsonl.gz"
        self.count += 1
        writer = self._writer_cls(
            path,
            {
                "preset": self._redact(P.to_dict(p)),
                "preset_hash": p.hash(),
                "target": p.target.label(),
                "tune_config": config.to_dict(),
            },
        )
        launch = Launch(config, label=str(path))
        level_of: list[int] = [0]

        def sink(events) -> None:
            writer.write([e for e in events if not isinstance(e, LogLine)])
            for e in events:
                if isinstance(e, ProfileWindow):
                    launch.windows.append(e)
                elif isinstance(e, DecodeStats) and level_of[0]:
                    launch.decodes.append(e)

        self.session.subscribe(sink)
        try:
            try:
                await self.session.relaunch(p)
            except ControlError as e:  # this configuration does not start (OOM, a refused flag …): the
                launch.failure = str(e)  # loop records it and moves on; the link failing still stops it
                return launch
            for level in levels:
                level_of[0] = level
                b = {**self.overrides, "concurrency": level}
                b["requests"] = max(int(b.get("requests") or p.bench.requests), 2 * level)
                run = await self.session.bench(label=f"{config.short} c={level}", **b)
                gp = run.goodput() if not run.failed else None
                if gp:
                    launch.goodput[level] = gp["tok_s"]
            await asyncio.sleep(self.settle_s)  # the tail's last batch (windows logged at the end)
        finally:
            self.session.subscribers.remove(sink)
            writer.close()
        return launch


def load_log(out: Path) -> list[dict]:
    return read_rows(out / "tune.jsonl")


def _append(out: Path, row: dict) -> None:
    append_row(out / "tune.jsonl", row)


def _replay_prior(rows: list[dict]) -> list[tuple[Step, Launch]]:
    """Launches of an earlier run, rebuilt from the log and their captures (for --resume)."""
    from tuitune.base.events import DecodeStats, ProfileWindow
    from tuitune.measure.capture import CaptureError, read_capture

    prior = []
    for r in rows:
        if r.get("kind") != "launch":
            continue
        c = Config(**r["config"])
        ln = Launch(
            c,
            goodput={int(k): v for k, v in (r.get("goodput") or {}).items()},
            label=r.get("capture", ""),
            failure=r.get("failure"),
        )
        try:
            cap = read_capture(r["capture"])
        except (CaptureError, KeyError):
            continue  # its capture is gone: that launch runs again
        ln.windows = [x.event for x in cap.records if isinstance(x.event, ProfileWindow)]
        ln.decodes = [x.event for x in cap.records if isinstance(x.event, DecodeStats)]
        st = Step(r["round"], c, r.get("reason", ""), r.get("predicted"), dict(ln.goodput), ln.failure)
        prior.append((st, ln))
    return prior


NCCL_GRID = ("env.NCCL_PROTO=LL,LL128,Simple,unset", "env.NCCL_ALGO=Ring,Tree,unset")


async def _nccl_screen(
    session,
    base: P.Preset,
    specs: list[str],
    backend: str,
    hidden_size: int | None,
    progress: Callable[[str], None] | None,
) -> tuple[dict, dict]:
    """nccl-bench's ranking of a grid (default NCCL_PROTO x NCCL_ALGO) at decode sizes:
    (changes of the winner, {} when the current setting wins; the report)."""
    from tuitune.experiments import grid as G
    from tuitune.experiments import ncclbench as NB

    try:
        grid = G.parse(specs or list(NCCL_GRID))
        NB.validate_grid(grid)
    except (G.GridError, NB.NcclBenchError) as e:
        raise TuneError(f"--nccl-grid: {e}", 2) from None
    try:
        report = await NB.run(
            session.transport, base, grid, hidden_size=hidden_size, backend=backend, progress=progress
        )
    except NB.NcclBenchError as e:
        raise TuneError(f"--nccl: {e}", e.code) from None
    if not report["ranking"]:
        raise TuneError("--nccl: no NCCL setting could be measured (see `tuitune nccl-bench` for the errors)")
    row = next(r for r in report["rows"] if r["label"] == report["ranking"][0])
    return ({} if row.get("current") else row["changes"]), report


async def tune(
    base: P.Preset,
    budget: int,
    concurrency: int,
    out: Path,
    *,
    resume: bool = False,
    levels: list[int] | None = None,
    overrides: dict | None = None,
    ab_rounds: int = 4,
    configs: list[Config] | None = None,
    nccl: bool = False,
    nccl_backend: str = "nccl",
    nccl_grid: list[str] | None = None,
    hidden_size: int | None = None,
    progress: Callable[[str], None] | None = None,
    session=None,
) -> dict:
    from tuitune.experiments.ab import run_ab
    from tuitune.target.session import Session

    start = config_of(base)
    if not base.is_speculative:
        raise TuneError(
            f"{base.name} has no speculative section: tune needs the algorithm and draft model "
            f"(speculative.draft_model_path) to try configurations; start from a speculative preset",
            2,
        )
    if not base.profile:
        raise TuneError(
            f"{base.name} has profile: false; tune fits its model to EAGLE3_PROFILE windows, so set profile: true", 2
        )
    out.mkdir(parents=True, exist_ok=True)
    rows = load_log(out)
    if rows and not resume:
        raise TuneError(f"{out} already holds a tune log; pass --resume to continue, or choose another --out", 2)
    session = session or Session(base)
    await session.connect()
    original = base
    try:
        screen = next((r for r in rows if r.get("kind") == "nccl"), None)
        if nccl and screen is None:
            changes, report = await _nccl_screen(session, base, nccl_grid or [], nccl_backend, hidden_size, progress)
            screen = {"kind": "nccl", "changes": changes, "ranking": report["ranking"], "resolved": False}
            _append(out, screen)
        env_label = ""
        if screen is not None and screen["changes"]:
            # one launch of the start with the winner's variables decides whether they stay
            env_label = " ".join(
                f"{k.split('.', 1)[1]}={v if v is not None else 'unset'}" for k, v in screen["changes"].items()
            )
            rows = load_log(out)
            decided = next((r for r in rows if r.get("kind") == "nccl_decision"), None)
            if decided is None:
                cand = P.with_changes(base, screen["changes"])
                cur_src = SessionSource(session, base, out, overrides)
                cur_src.count = sum(1 for r in rows if r.get("kind") == "launch")
                lv = sorted({*(levels or levels_for(concurrency)), concurrency})
                if progress:
                    progress(f"NCCL: nccl-bench ranks {env_label} first; measuring the start with and without it")
                now = await cur_src.measure(start, lv)
                _append(
                    out,
                    {
                        **Step(0, start, "the starting configuration", None, dict(now.goodput)).to_dict(),
                        "capture": now.label,
                        "env": "",
                    },
                )
                cand_src = SessionSource(session, cand, out, overrides)
                cand_src.count = cur_src.count
                new = await cand_src.measure(start, lv)
                _append(
                    out,
                    {
                        **Step(0, start, f"NCCL {env_label}", None, dict(new.goodput)).to_dict(),
                        "capture": new.label,
                        "env": env_label,
                    },
                )
                keep = new.goodput.get(concurrency, 0.0) > now.goodput.get(concurrency, 0.0) * (1 + NOISE)
                decided = {
                    "kind": "nccl_decision",
                    "env": env_label if keep else "",
                    "goodput": {"current": now.goodput.get(concurrency), "candidate": new.goodput.get(concurrency)},
                }
                _append(out, decided)
                if progress:
                    progress(f"NCCL: {'keeping' if keep else 'dropping'} {env_label}")
            budget -= 1  # the launch with the screened variables
            if decided["env"]:
                base = P.with_changes(base, screen["changes"])
            else:
                env_label = ""
        rows = load_log(out)
        prior = _replay_prior([r for r in rows if r.get("kind") == "launch" and r.get("env", "") == env_label])
        source = SessionSource(session, base, out, overrides)
        source.count = sum(1 for r in rows if r.get("kind") == "launch")

        def on_step(st: Step, ln: Launch) -> None:
            _append(out, {**st.to_dict(), "capture": ln.label, "env": env_label})

        describe = base.engine.config_label
        result = await tune_loop(
            source,
            start,
            max(0, budget),
            concurrency,
            levels,
            configs or space(engine=base.engine),
            prior,
            on_step,
            progress,
            describe,
        )
        measured = result.measured()
        summary = {
            "kind": "result",
            "start": start.to_dict(),
            "chosen": result.chosen.to_dict(),
            "chosen_label": describe(result.chosen) + (f" with {env_label}" if env_label else ""),
            "concurrency": concurrency,
            "relaunches": sum(1 for r in load_log(out) if r.get("kind") == "launch") - 1,
            "stop_reason": result.stop_reason,
            "nccl": env_label or None,
            "measured": {describe(c): g for c, g in measured.items()},
            "failed": {describe(st.config): st.failure for st in result.steps if st.failure},
        }
        if result.advice is not None:
            summary["advice"] = result.advice.to_dict(full=False)
        start_preset = preset_for(original, start, source.spec)
        chosen_preset = source.preset(result.chosen)
        if chosen_preset.hash() == start_preset.hash():
            summary["verdict"] = {
                "verdict": "start is already best",
                "reason": f"no configuration measured faster than {describe(start)}",
            }
            await session.stop_server()  # as the A/B (and sweep) do: the search's last server goes
        else:
            b = P.with_changes(
                chosen_preset,
                {
                    "name": f"{original.name}-tuned",
                    "description": f"tuitune tune at concurrency {concurrency}: {summary['chosen_label']}",
                },
            )
            if progress:
                progress(
                    f"A/B: {start_preset.name} ({describe(start)}) vs {summary['chosen_label']}, {ab_rounds} rounds each"
                )
            ab_over = {
                **(overrides or {}),
                "concurrency": concurrency,
                "requests": max(int((overrides or {}).get("requests") or base.bench.requests), 2 * concurrency),
            }
            await session.stop_follow()
            ab = await run_ab(session.transport, start_preset, b, ab_rounds, ab_over, progress=progress)
            summary["ab"] = ab
            v = ab["verdict"]
            summary["verdict"] = v
            if v.get("verdict") == "faster":
                summary["best_preset"] = str(P.save(b, out / "best.yaml"))
        _append(out, summary)
        return summary
    finally:
        await session.close()


def format_result(r: dict) -> str:
    lines = [f"tuned at concurrency {r['concurrency']}: {r['relaunches']} relaunch(es); stopped: {r['stop_reason']}"]
    for label, g in sorted(r["measured"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {label:<32} {g:>10.1f} tok/s measured")
    for label, why in (r.get("failed") or {}).items():
        lines.append(f"  {label:<32} did not start: {why}")
    v = r["verdict"]
    if v.get("verdict") == "start is already best":
        lines.append(f"verdict: the start is already best ({v['reason']})")
    elif v.get("verdict") == "faster":
        lines.append(
            f"verdict: {r['chosen_label']} is faster than the start (ratio {v['ratio']:.4f}, "
            f"95% CI {v['ratio_ci'][0]:.4f}-{v['ratio_ci'][1]:.4f}, p = {v['p_value']:.3f}); "
            f"written to {r.get('best_preset')}"
        )
    else:
        why = v.get("reason") or v.get("verdict")
        lines.append(f"verdict: {why}; the start is kept (no best.yaml)")
    return "\n".join(lines)
