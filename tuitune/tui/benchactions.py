"""Benchmarks from the app: one run at the preset's or the load's concurrency, or a goodput curve
over levels (in a worker, its progress in the header), each a row of the runs table; the baseline
mark, clearing the table, and the background load that keeps the server decoding."""

from __future__ import annotations

from textual import work

from tuitune.machine.errors import ControlError
from tuitune.machine.transport import TransportError
from tuitune.measure.benchformat import level_row
from tuitune.measure.levels import bench_levels, plan_levels
from tuitune.measure.runs import RunBook, delta_mark
from tuitune.measure.workload import WorkloadError
from tuitune.tui.appbase import AppBase


class BenchActions(AppBase):
    """Bench, mark the baseline, clear the runs, and the load's on/off and streams."""

    def action_bench(self) -> None:
        self._start_bench(None)

    def action_bench_levels(self) -> None:
        self._start_bench(self.user_config.bench_levels)

    def action_bench_at_load(self) -> None:
        self._start_bench([self.session.load.concurrency])

    def _start_bench(self, levels: list[int] | None) -> None:
        if self.bench_running:
            self.say("a benchmark is already running", "warning")
            return
        st = self.session.state
        if st.state != "ready":
            why = f"{st.state}: {st.detail}" if st.detail else st.state
            self.say(f"the server is not ready ({why[:160]}): relaunch (r) first", "warning")
            return
        self.run_bench(levels)

    @work(group="bench", exit_on_error=False)
    async def run_bench(self, levels: list[int] | None = None) -> None:
        """One run at the preset's concurrency, or one run over several levels (a goodput curve)."""
        preset = self.session.running_preset or self.session.preset
        levels = levels or [preset.bench.concurrency]
        # a run under a live hold is marked so in the runs table (no relaunch came between it and the last)
        label = preset.name + (
            f" · live {preset.engine.step_name} {self.session.held}" if self.session.held is not None else ""
        )
        try:
            plan = plan_levels(self.session, levels, label=label)
        except WorkloadError as e:
            self.say(f"benchmark: bench.prompts: {e}", "error")
            return
        self.bench_running = True
        n = sum(c.requests for c in plan)  # 2+ per stream
        done: list[float] = []
        finished = 0  # runs that ended, ok or not
        self.bench_progress = (finished, n, None)
        self.say(
            f"benchmark: {preset.bench.warmup} warm-up + {n} requests of {preset.bench.max_tokens} tokens at "
            f"concurrency {', '.join(map(str, levels))}, workload {plan[0].prompts.label}…"
        )

        logged = self.session.store["decode_accept_len"]
        logged_from = logged.appended

        def progress(_i: int, r) -> None:
            if r.ok and r.decode_tok_s is not None:
                done.append(r.decode_tok_s)
            med = sorted(done)[len(done) // 2] if done else None
            nonlocal finished
            finished += 1
            self.bench_progress = (finished, n, med)

        try:
            runs = await bench_levels(self.session, levels, label=label, on_level=lambda _cfg: progress)
        except (ControlError, TransportError, WorkloadError) as e:
            self.say(str(e), "error")
            return
        finally:
            self.bench_running = False
            self.bench_progress = None
        if not any(run.ok for run in runs):
            errors = "; ".join(e for run in runs for e in run.summary()["errors"])
            self.say(f"benchmark: no request succeeded ({errors[:200]}); no row added", "error")
            return
        first = runs[0]
        summary = first.summary()
        if not (summary.get("accept_len") or {}).get("mean") and preset.is_speculative:
            # vLLM's responses carry no acceptance: the server's own figure, as the cycle panel
            # shows it (its SpecDecoding lines or /metrics), over the run or else the last one
            vals = logged.since(logged_from) or ([logged.last()] if logged.last() is not None else [])
            if vals:
                summary["accept_len"] = {"mean": sum(vals) / len(vals), "source": "server log"}
        r = self.book.add(
            label,
            preset,
            first.tok_s(),
            summary,
            first.cycle_ms,
            started=self.clock(),
            env_drift=first.env_drift,
            gpu_note=next((run.gpu_note for run in runs if run.gpu_note), None),
            levels=[level_row(run.summary()) for run in runs] if len(runs) > 1 else None,
        )
        self._dirty_runs = True
        if len(runs) > 1:
            self.chart.mode = "goodput"
        delta = self.book.delta(r)
        mark = delta_mark(delta)
        why = (delta or {}).get("why")
        self.say(
            f"run #{r.id}: {r.median:.1f} tok/s"
            + ("" if mark == "—" else f", {mark} vs baseline")
            + (f" ({why})" if why else "")
            + (f", {r.failed} failed" if r.failed else "")
            + (f"; GPUs held back: {r.gpu_note}" if r.gpu_note else ""),
            "error" if r.failed else "information",
        )

    def action_mark_baseline(self) -> None:
        table = self.runs_table
        if not self.book.runs:
            self.say("no runs yet: press b to benchmark", "warning")
            return
        row = table.cursor_row if table.cursor_row is not None else len(self.book.runs) - 1
        run = self.book.runs[max(0, min(row, len(self.book.runs) - 1))]
        try:
            self.book.mark_baseline(run.id)
        except ValueError as e:
            self.say(str(e), "warning")
            return
        self._dirty_runs = True
        self.refresh_views()
        self.say(f"run #{run.id} is the baseline")

    async def action_toggle_load(self) -> None:
        await self.session.set_load(not self.session.load.on)
        self.refresh_views()  # show the effect of a key now, not at the next tick

    async def action_load_more(self) -> None:
        await self.session.set_load(True, self.session.load.concurrency + 1)
        self.refresh_views()

    async def action_load_less(self) -> None:
        await self.session.set_load(self.session.load.on, max(1, self.session.load.concurrency - 1))
        self.refresh_views()

    def action_clear_runs(self) -> None:
        self.book = RunBook(max_age_s=self.book.max_age_s)
        self._dirty_runs = True
