"""`tuitune tune`: the tuning loop (``experiments.tuneloop``) run for real, then proved.

``SessionSource`` relaunches the preset's server with each configuration through the session (or,
where the start is prepared to switch, holds a chain's step count in its one launch: docs/switch.md),
benchmarks a few load levels (the target concurrency and two others, so that one launch puts several
verify token counts on the curve) and records everything to a capture. ``TuneRun`` wraps the loop
with the JSONL log (OUT/tune.jsonl, which ``--resume`` reads back), the NCCL screen
(``experiments.tunenccl``) and the final interleaved A/B (start vs chosen) that decides whether
``best.yaml`` is written. What it says before and after is ``experiments.tunereport``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from tuitune import preset as P
from tuitune.base.jsonl import plain
from tuitune.decide import ncclstep as NS
from tuitune.decide.advise import space
from tuitune.decide.launch import OFF, Config, Launch
from tuitune.experiments.results import TuneSummary
from tuitune.experiments.tunelog import load_log, log_row, replay_prior
from tuitune.experiments.tuneloop import (
    NOISE,
    Step,
    TuneError,
    TuneResult,
    choice_reason,
    levels_for,
    preset_for,
    tune_loop,
)
from tuitune.experiments.tunenccl import cycle_ms, nccl_gains, nccl_screen, nccl_summary
from tuitune.experiments.tuneoptions import TuneOptions
from tuitune.experiments.tunereport import plan_line
from tuitune.machine.errors import ControlError
from tuitune.machine.switch import SwitchError
from tuitune.measure import workload
from tuitune.measure.levels import bench_levels


class SessionSource:
    """Relaunch a preset's server with each configuration and benchmark it at a few load levels."""

    def __init__(
        self,
        session,
        base: P.Preset,
        out: Path,
        overrides: dict | None = None,
        settle_s: float = 0.5,
        live: bool = True,
    ):
        from tuitune.measure.capture import CaptureWriter, redacted_preset

        self._writer_cls, self._redact = CaptureWriter, redacted_preset
        self.session = session
        self.base = base
        if base.speculative is None:  # (tune() refuses such a preset first)
            raise TuneError(f"{base.name} has no speculative section: there is nothing to tune", 2)
        self.spec = base.speculative.model_dump()
        self.out = out
        self.overrides = overrides or {}
        self.settle_s = settle_s
        self.count = 0
        # levels where a simulator fell behind its clock: configuration -> concurrency -> how far
        self.behind: dict[Config, dict[int, str]] = {}
        # a start prepared to switch: its step counts held in that one launch (docs/switch.md)
        self.live = live and base.switch_steps is not None
        self.prepared_launches = 0  # launches of the prepared start made to hold in (the first is the start's)

    def holdable(self, c: Config) -> bool:
        """Whether ``c`` can be measured by holding its step count in the prepared start's launch: a
        chain whose step count the launch is prepared for (anything else needs a relaunch)."""
        return self.holds(self.base, self.live, c)

    @staticmethod
    def holds(base: P.Preset, live: bool, c: Config) -> bool:
        steps = base.switch_steps or []
        return live and c.speculative and c.topk == 1 and c.draft_tokens == c.steps + 1 and c.steps in steps

    async def _apply(self, c: Config, p: P.Preset) -> bool:
        """Put ``c`` in force: held in the prepared launch (relaunched first when another runs), or a
        relaunch of ``p``; whether it was held."""
        if not self.holdable(c):
            await self.session.relaunch(p)
            return False
        if await self.ensure_prepared():
            self.prepared_launches += 1
        await self.session.hold(c.steps, preset=p)
        return True

    async def ensure_prepared(self) -> bool:
        """Relaunch the prepared start where another configuration (or none) runs; whether it did."""
        launched = self.session.launched_preset
        if self.session.state.state == "ready" and launched is not None and launched.hash() == self.base.hash():
            return False
        await self.session.relaunch(self.base)
        return True

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
                launch.live = await self._apply(config, p)
            except (ControlError, SwitchError) as e:  # this configuration does not start (OOM, a refused flag …)
                launch.failure = str(e)  # or is refused by the engine: the loop records it and moves on; the
                return launch  # link failing still stops it

            def starting(cfg) -> None:
                level_of[0] = cfg.concurrency

            def done(cfg, run) -> None:
                gp = run.goodput() if not run.failed else None
                if gp:
                    launch.goodput[cfg.concurrency] = gp["tok_s"]
                    if behind := run.sim_behind():  # kept (tune decides by it) but said: the choice may rest on it
                        self.behind.setdefault(config, {})[cfg.concurrency] = behind

            # two requests at least, also at concurrency 1 (above it, two per stream: BenchConfig.at_level)
            b = {**self.overrides, "requests": max(int(self.overrides.get("requests") or p.bench.requests), 2)}
            await bench_levels(
                self.session, levels, b, label=lambda c: f"{config.short} c={c}", on_level=starting, on_run=done
            )
            await asyncio.sleep(self.settle_s)  # the tail's last batch (windows logged at the end)
        finally:
            self.session.subscribers.remove(sink)
            writer.close()
        return launch


async def tune(
    base: P.Preset,
    budget: int,
    concurrency: int,
    out: Path,
    *,
    progress: Callable[[str], None] | None = None,
    session=None,
    on_cleanup: Callable[[str], None] | None = None,
    **options,
) -> TuneSummary:
    """The search, then the final A/B (``TuneRun``; ``options``: the rest of ``TuneOptions``)."""
    opts = TuneOptions(budget, concurrency, out, **options)
    return await TuneRun(base, opts, progress=progress, session=session, on_cleanup=on_cleanup).run()


class TuneRun:
    """One `tune`: its phases in order, each writing its rows to OUT/tune.jsonl: the NCCL screen
    (``nccl_phase``), the search (``search``), the result (``summarize``) and the proof, the final
    A/B (``prove``). Interrupted (Ctrl-C, SIGTERM), it stops the server it started (the search's or
    the A/B's) and says so to ``on_cleanup``; ``--resume`` goes on from its log."""

    def __init__(
        self,
        base: P.Preset,
        opts: TuneOptions,
        *,
        progress: Callable[[str], None] | None = None,
        session=None,
        on_cleanup: Callable[[str], None] | None = None,
    ):
        self.original = self.base = base
        self.opts = opts
        self.progress = progress
        self.session = session
        self.on_cleanup = on_cleanup
        self.start = OFF  # the starting configuration (``run`` reads it off the preset, after the checks)
        self.budget = opts.budget
        self.env_label = ""  # the NCCL variables kept, as "K=V …" ("" none)
        self.screen: dict | None = None  # the NCCL screen's row
        self.decided: dict | None = None  # the NCCL decision's row
        self.describe: Callable[[Config], str] = base.engine.config_label

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    def append(self, row: dict) -> None:
        log_row(self.opts.out, row)

    async def run(self) -> TuneSummary:
        from tuitune.machine.session import Session

        opts, base = self.opts, self.base
        self.start = opts.check(base)
        opts.out.mkdir(parents=True, exist_ok=True)
        rows = load_log(opts.out)
        if rows and not opts.resume:
            raise TuneError(
                f"{opts.out} already holds a tune log; pass --resume to continue, or choose another --out", 2
            )
        work = workload.for_preset(base, opts.overrides).as_dict()  # a bad prompt file: said before any launch
        logged = next((r for r in rows if r.get("kind") == "workload"), None)
        if rows and (other := workload.differ(work, logged)):
            raise TuneError(
                f"{opts.out}'s launches were measured on another workload ({other}, the log's): resuming would "
                "compare the two; pass the log's prompts again (--prompts or bench.prompts), or choose another --out",
                2,
            )
        if logged is None:
            self.append({"kind": "workload", **work})
        self.session = self.session or Session(base)
        await self.session.connect()
        first = self.baseline_first(any(r.get("kind") == "launch" for r in rows))
        self.say(plan_line(base, opts.budget, opts.ab_last, rows, self.session.record, opts.proof == "live", first))
        try:
            await self.nccl_phase()
            source, result = await self.search()
            summary = self.summarize(source, result)
            await self.prove(source, result, summary)
            self.append(plain(summary))
            return summary
        except asyncio.CancelledError:
            await self.session.stop_started(self.on_cleanup)  # (the A/B stopped its own arm: nothing left then)
            raise
        finally:
            await self.session.close()

    async def nccl_phase(self) -> None:
        """With --nccl (or a screen in the log): rank NCCL settings with nccl-bench, then one launch of
        the start with the winner's variables decides whether they stay for the rest of the search."""
        opts, session = self.opts, self.session
        rows = load_log(opts.out)
        screen = next((r for r in rows if r.get("kind") == "nccl"), None)
        if opts.nccl and screen is None:
            changes, report, prediction = await nccl_screen(
                session,
                self.base,
                opts.nccl_grid or [],
                opts.nccl_backend,
                opts.hidden_size,
                self.progress,
                opts.concurrency,
            )
            screen = {
                "kind": "nccl",
                "changes": changes,
                "ranking": report.ranking,
                "resolved": False,
                "prediction": prediction,
            }
            self.append(screen)
        self.screen = screen
        if screen is None or not screen["changes"]:
            return
        env_label = " ".join(
            f"{k.split('.', 1)[1]}={v if v is not None else 'unset'}" for k, v in screen["changes"].items()
        )
        rows = load_log(opts.out)
        decided = next((r for r in rows if r.get("kind") == "nccl_decision"), None)
        if decided is None:
            decided = await self._nccl_decide(screen, env_label, rows)
        self.decided = decided
        self.budget -= 1  # the launch with the screened variables
        if decided["env"]:
            self.base = P.with_changes(self.base, screen["changes"])
            self.env_label = env_label

    async def _nccl_decide(self, screen: dict, env_label: str, rows: list[dict]) -> dict:
        """The start measured without, then with the screened variables; kept above the noise."""
        opts, start, concurrency = self.opts, self.start, self.opts.concurrency
        cand = P.with_changes(self.base, screen["changes"])
        cur_src = SessionSource(self.session, self.base, opts.out, opts.overrides)
        cur_src.count = sum(1 for r in rows if r.get("kind") == "launch")
        lv = sorted({*(opts.levels or levels_for(concurrency)), concurrency})
        pred = screen.get("prediction") or {}
        self.say(f"NCCL: nccl-bench ranks {env_label} first; measuring the start with and without it")
        if pred.get("step_saving_us") is not None:
            self.say(
                f"NCCL: predicted to save {pred['step_saving_us']:.1f} µs a decode step at concurrency "
                f"{concurrency} against the current setting; rests on: {pred['basis']}"
            )
        now = await cur_src.measure(start, lv)
        step = Step(0, start, "the starting configuration", None, dict(now.goodput))
        self.append({**step.to_dict(), "capture": now.label, "env": ""})
        cand_src = SessionSource(self.session, cand, opts.out, opts.overrides)
        cand_src.count = cur_src.count
        new = await cand_src.measure(start, lv)
        step = Step(0, start, f"NCCL {env_label}", None, dict(new.goodput))
        self.append({**step.to_dict(), "capture": new.label, "env": env_label})
        keep = new.goodput.get(concurrency, 0.0) > now.goodput.get(concurrency, 0.0) * (1 + NOISE)
        decided: dict = {
            "kind": "nccl_decision",
            "env": env_label if keep else "",
            "goodput": {"current": now.goodput.get(concurrency), "candidate": new.goodput.get(concurrency)},
        }
        # the prediction beside the measurement: the step saving over the start's own cycle
        cycle = cycle_ms(now.windows, concurrency)
        if pred.get("step_saving_us") is not None and cycle:
            decided["predicted_gain"] = NS.predicted_gain(pred["step_saving_us"], cycle)
            decided["cycle_ms"] = cycle
        if now.goodput.get(concurrency) and new.goodput.get(concurrency) is not None:
            decided["measured_gain"] = new.goodput[concurrency] / now.goodput[concurrency] - 1.0
        self.append(decided)
        said = nccl_gains(decided)
        self.say(f"NCCL: {'keeping' if keep else 'dropping'} {env_label}" + (f" ({said})" if said else ""))
        return decided

    async def search(self) -> tuple[SessionSource, TuneResult]:
        """The fitted model's search from the start, within the budget left (``tune_loop``)."""
        opts, session, env_label, base = self.opts, self.session, self.env_label, self.base
        rows = load_log(opts.out)
        prior = replay_prior([r for r in rows if r.get("kind") == "launch" and r.get("env", "") == env_label])
        source = SessionSource(session, base, opts.out, opts.overrides, live=opts.live)
        configs = self.configs()
        baseline_first = self.baseline_first(bool(prior))
        if source.live:
            self.say(
                f"{base.name} is prepared to switch {base.engine.step_name} {base.switch_steps}: those chains are "
                "measured held live in one launch, anything else with a relaunch (--no-live: relaunch for all)"
                + ("; speculation off first, in a launch of its own" if baseline_first else "")
            )
        source.count = sum(1 for r in rows if r.get("kind") == "launch")
        for r in rows:  # (--resume) the earlier launches' levels where the simulator fell behind
            if r.get("kind") == "launch" and r.get("env", "") == env_label and r.get("sim_behind"):
                source.behind[Config(**r["config"])] = {int(k): v for k, v in r["sim_behind"].items()}

        def on_step(st: Step, ln: Launch) -> None:
            ready = session.last_ready.elapsed_s if session.last_ready is not None and not ln.failure else None
            row = {**st.to_dict(), "capture": ln.label, "env": env_label, "ready_s": None if ln.live else ready}
            if ln.live:
                row["live"] = True
            if source.behind.get(st.config):
                row["sim_behind"] = {str(k): v for k, v in source.behind[st.config].items()}
            self.append(row)

        result = await tune_loop(
            source,
            self.start,
            max(0, self.budget),
            opts.concurrency,
            opts.levels,
            configs,
            prior,
            on_step,
            self.progress,
            self.describe,
            baseline_first=baseline_first,
        )
        return source, result

    def configs(self) -> list[Config]:
        return self.opts.configs or space(topks=self.base.engine.search_topks(self.base))

    def baseline_first(self, resumed: bool) -> bool:
        """Whether the search measures speculation off before the prepared start (``tune_loop``): off cannot be
        held, so measured first the chains after the start need no second launch of it."""
        holdable = SessionSource.holds(self.base, self.opts.live, self.start)
        return holdable and not resumed and self.budget >= 1 and OFF in self.configs()

    def summarize(self, source: SessionSource, result: TuneResult) -> TuneSummary:
        """The result row: what was measured, what was chosen and why (the verdict comes from ``prove``)."""
        describe, env_label, screen = self.describe, self.env_label, self.screen
        launches = [r for r in load_log(self.opts.out) if r.get("kind") == "launch"]
        return TuneSummary(
            kind="result",
            start=self.start.to_dict(),
            chosen=result.chosen.to_dict(),
            chosen_label=describe(result.chosen) + (f" with {env_label}" if env_label else ""),
            concurrency=self.opts.concurrency,
            # measurements held live cost none; the prepared start relaunched to hold in again does
            relaunches=sum(1 for r in launches if not r.get("live")) - 1 + source.prepared_launches,
            held_live=sum(1 for r in launches if r.get("live")),
            stop_reason=result.stop_reason,
            nccl=env_label or None,
            nccl_prediction=nccl_summary(screen, self.decided) if screen is not None and screen["changes"] else None,
            measured={describe(c): g for c, g in result.measured().items()},
            failed={describe(st.config): st.failure for st in result.steps if st.failure},
            sim_behind={describe(c): {str(k): v for k, v in lv.items()} for c, lv in source.behind.items()} or None,
            advice=result.advice.to_dict(full=False) if result.advice is not None else None,
            chosen_why=choice_reason(result, describe),
        )

    async def prove(self, source: SessionSource, result: TuneResult, summary: TuneSummary) -> None:
        """The verdict: none needed (the start is best), none asked (--ab-rounds 0), or the final A/B
        of the start against the choice, whose "faster" writes OUT/best.yaml."""
        from tuitune.experiments.ab import run_ab

        opts, session, concurrency = self.opts, self.session, self.opts.concurrency
        start_preset = preset_for(self.original, self.start, source.spec)
        chosen_preset = source.preset(result.chosen)
        if chosen_preset.hash() == start_preset.hash():
            summary.verdict = {"verdict": "start is already best", "reason": summary.chosen_why}
            await session.stop_server()  # as the A/B (and sweep) do: the search's last server goes
            return
        if not opts.ab_rounds:
            summary.verdict = {
                "verdict": "not confirmed",
                "reason": "--ab-rounds 0: no final A/B, and the search launched each configuration once",
            }
            await session.stop_server()
            return
        summary.proof = "static"
        if opts.proof == "live":
            if why := self.live_refusal(source, result):
                self.say(f"A/B: not in one launch: {why}; the start and the choice are launched without the switch")
                summary.proof_why = why
            else:
                await self.prove_live(source, result, summary, start_preset, chosen_preset)
                return
        b = self.tuned(chosen_preset, summary.chosen_label)
        # the final A/B: sequential (a look after every round from --ab-rounds, adding rounds until
        # the interval decides or --ab-max-rounds are spent), its power stated from the launch-to-launch
        # spread measured before when there is one (repeated launches of one configuration in the
        # search, launches of these presets in an earlier A/B of this log), else the prior
        last = opts.ab_last
        spread, spread_source = ab_spread(result.launches, concurrency, load_log(opts.out), [start_preset, b])
        self.say(f"chosen: {summary.chosen_label}: {summary.chosen_why}")
        self.say(
            f"A/B: {start_preset.name} ({self.describe(self.start)}) vs {summary.chosen_label}, "
            + (
                f"{opts.ab_rounds} to {last} rounds each (until the interval decides)"
                if last > opts.ab_rounds
                else f"{opts.ab_rounds} rounds each"
            )
        )
        ab_over = self.ab_overrides()
        await session.stop_follow()
        ab = await run_ab(
            session.transport,
            start_preset,
            b,
            opts.ab_rounds,
            ab_over,
            min_effect=0.0,  # no minimum practical effect: a decided gain is taken (issue 25: p = 0.029 kept the start)
            progress=self.progress,
            judge=opts.ab_judge,
            spread=spread,
            spread_source=spread_source,
            max_rounds=last,
            on_cleanup=self.on_cleanup,
        )
        summary.ab = plain(ab)  # (the log's rows are plain JSON)
        v = ab.verdict
        summary.verdict = v
        if v.get("verdict") == "faster":
            summary.best_preset = str(P.save(b, opts.out / "best.yaml"))

    def live_refusal(self, source: SessionSource, result: TuneResult) -> str | None:
        """Why the choice cannot be proved inside the prepared launch (a clause), or None: both it and the
        start must be chains the launch holds, and no NCCL variable kept (a launch of its own)."""
        word = self.base.engine.step_name
        if self.env_label:
            return f"the choice keeps NCCL variables ({self.env_label}), which only a launch of their own has"
        for what, c in (("the start", self.start), ("the choice", result.chosen)):
            if not source.holdable(c):
                return (
                    f"{what}, {self.describe(c)}, is not a chain the launch is prepared to hold "
                    f"({word} {self.base.switch_steps})"
                )
        return None

    async def prove_live(
        self, source: SessionSource, result: TuneResult, summary: TuneSummary, start_preset: P.Preset, chosen: P.Preset
    ) -> None:
        """The final A/B inside the prepared launch (docs/switch.md, "tune in one launch"): blocks of the
        start (A), the choice (B) and the start again (A', the A/A check), each round in its own random
        order, the same prompts in every block; a look after every round from --ab-rounds on, stopping
        at the first that decides (up to --ab-max-rounds); the verdict ``ab``'s, B against A, and only
        where the A/A arm found no difference. Its "faster" writes the static choice to best.yaml."""
        from tuitune.experiments import live as L
        from tuitune.experiments.ab import ab_design, look_line, stop_reason

        opts, session = self.opts, self.session
        word, last, first = self.base.engine.step_name, self.opts.ab_last, self.opts.ab_rounds
        a_k, b_k = self.start.steps, result.chosen.steps
        arm_list = [(L.REFERENCE, a_k), ("B", b_k), (L.TWIN, a_k)]
        order = L.plan(arm_list, last, 0)
        d = ab_design(first, last) if opts.ab_judge else None
        self.say(f"chosen: {summary.chosen_label}: {summary.chosen_why}")
        self.say(
            f"A/B in one launch: {self.describe(self.start)} (A and its A/A twin A') vs {summary.chosen_label} "
            f"(B), {first} to {last} rounds of 3 blocks (until the interval decides), no launch"
            if last > first
            else f"A/B in one launch: {self.describe(self.start)} (A and its A/A twin A') vs "
            f"{summary.chosen_label} (B), {first} rounds of 3 blocks, no launch"
        )
        if await source.ensure_prepared():
            self.say(f"relaunched {self.base.name} prepared to switch, for the A/B's blocks")
            summary.relaunches += 1
        over = self.ab_overrides()

        def judged(rows: list[dict], arm: str) -> dict:
            rounds = sum(1 for x in rows if x["arm"] == L.REFERENCE)
            return L.arm_verdict(rows, arm, 0.0, opts.ab_judge and rounds >= first, d)

        looks: list[dict] = []

        def decided(rows: list[dict]) -> bool:
            r = rows[-1]["round"]
            if d is None or r < first:
                return False
            v = judged(rows, "B")
            looks.append({"rounds": r, **{k: v.get(k) for k in ("verdict", "ratio_ci", "p_value")}})
            if d.sequential:
                self.say(look_line(v, r, last))
            return not stop_reason(v, r, last).startswith("undecided")

        results = opts.out / "proof.jsonl"
        results.write_text("")
        say = self.progress or (lambda _m: None)
        try:
            rows = await L.run_blocks(session, order, over, results, say, until=decided)
        finally:  # released whatever happens (never raises: says so where it could not)
            await L.put_back(session, None, word, say)
        rounds = rows[-1]["round"] if rows else 0
        v, twin = judged(rows, "B"), judged(rows, L.TWIN)
        if d is not None and rounds >= first and (not looks or looks[-1]["rounds"] != rounds):
            looks.append({"rounds": rounds, **{k: v.get(k) for k in ("verdict", "ratio_ci", "p_value")}})
        stopped = stop_reason(v, rounds, last) if d is not None else f"{rounds} rounds run"
        aa = L.aa_check(twin, d is not None and rounds >= first, rounds)
        summary.proof = "live"
        summary.ab = {
            "live": True,
            "rounds": rounds,
            "first_look": first,
            "max_rounds": last,
            "blocks": rows,
            "looks": looks,
            "stopped": stopped,
            "aa": aa,
            "median_tok_s": L.medians(rows, "median_tok_s"),
            "arms": [{"arm": a, "steps": k} for a, k in arm_list],
        }
        if v.get("verdict") in ("faster", "slower") and not aa["trusted"]:
            v = {"verdict": "not confirmed", "reason": f"{aa['sentence']} ({word} {a_k} against itself)", "shown": v}
        summary.verdict = {**v, "live": True}
        await session.stop_server()  # as the static A/B does: tune's last server goes
        if v.get("verdict") == "faster":
            b = self.tuned(chosen, f"{summary.chosen_label} (proved in one launch)")
            summary.best_preset = str(P.save(b, opts.out / "best.yaml"))

    def ab_overrides(self) -> dict:
        """The final A/B's bench: at the tuned concurrency, two requests a stream at least."""
        ov, c = self.opts.overrides or {}, self.opts.concurrency
        return {**ov, "concurrency": c, "requests": max(int(ov.get("requests") or self.base.bench.requests), 2 * c)}

    def tuned(self, chosen: P.Preset, label: str) -> P.Preset:
        """The choice as best.yaml holds it: named for the start, saying what tune found."""
        return P.with_changes(
            chosen,
            {
                "name": f"{self.original.name}-tuned",
                "description": f"tuitune tune at concurrency {self.opts.concurrency}: {label}",
            },
        )


def ab_spread(launches: list[Launch], concurrency: int, rows: list[dict], presets: list) -> tuple[float | None, str]:
    """The launch-to-launch spread the final A/B states its power from: configurations the search
    launched more than once (goodput at ``concurrency``) and launches of ``presets`` in an earlier
    A/B of this log, pooled (sd of log goodput); (None, ""): nothing was measured twice."""
    from tuitune.experiments.ab import earlier_launches, pooled_spread

    groups: dict[object, list] = {}
    for ln in launches:
        g = ln.goodput.get(concurrency)
        if g:
            groups.setdefault(ln.config, []).append(g)
    earlier = [x for x in earlier_launches([r for r in rows if r.get("kind") == "result"])]
    for p in presets:
        groups[p.hash()] = [
            x.get("goodput") for x in earlier if x.get("hash") == p.hash() and x.get("concurrency") == concurrency
        ]
    sd, used = pooled_spread(list(groups.values()))
    if sd is None:
        return None, ""
    return (
        sd,
        f"measured: {used} launches in this tune log of configurations launched more than once (the search, an earlier A/B)",
    )
