"""Charts that a person reads (issue 41, item 6): the chart tab gets usable height at 80×24, the
runs chart does not start at zero, the phase chart's legend is off its lines, sweep's plot has the
baseline in its series, crossover's arms have markers of their own."""

from __future__ import annotations

import re
from types import SimpleNamespace

import plotext as plt
from test_gpu_panel import tick

from tuitune.base.events import TelemetryState
from tuitune.tui.chart import render
from tuitune_support.pilot import until
from tuitune_support.scenes import scene_app


def ticks(text: str) -> list[float]:
    """The y axis' tick values of a plotext chart."""
    return [float(m) for m in re.findall(r"^\s*(-?[\d.]+)┤", plt.uncolorize(text), re.M)]


def test_runs_chart_does_not_start_at_zero():
    book = SimpleNamespace(runs=[SimpleNamespace(id=1, median=97.6), SimpleNamespace(id=2, median=94.4)], baseline_id=1)
    text = render("runs", None, book, 60, 14)
    assert "axis from 8" in text  # said where the axis starts
    assert min(ticks(text)) > 50  # the axis starts near the runs, so 97.6 and 94.4 do not look alike


class Series:
    def __init__(self, vals):
        self.vals = vals

    def values(self):
        return self.vals


def test_phase_legend_is_under_the_plot():
    store = {
        "verify_ms": Series([20.0 + i % 3 for i in range(30)]),
        "cycle_ms": Series([22.0 + i % 3 for i in range(30)]),
        "draft_ms": Series([1.0] * 30),
        "extend_ms": Series([]),
    }
    text = plt.uncolorize(render("phases", store, None, 70, 14))
    lines = text.splitlines()
    assert len(lines) <= 14  # the legend fits the panel's rows, not one below them
    plot_lines = [ln for ln in lines if "│" in ln or "┤" in ln]
    assert not any("verify" in ln or "cycle" in ln for ln in plot_lines)  # nothing written on the lines
    assert "verify" in lines[-1] and "cycle" in lines[-1] and "draft" in lines[-1]


async def test_chart_tab_gets_rows_at_80x24():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.session.publish([TelemetryState("on", None, 2), *tick(0, n=2)])
        await until(pilot, lambda: app.gpu_panel.display, 5, "the GPU panel")
        await pilot.press("2")
        await pilot.pause()
        await pilot.pause()
        assert app.chart.content_size.height >= 12, app.chart.content_size
        assert app.runs_table.region.height == 0 and not app.gpu_panel.display
        app.session.publish(tick(1, n=2))  # a GPU sample does not bring its panel back over the chart
        await pilot.pause(0.3)
        assert not app.gpu_panel.display
        await pilot.press("3")  # the advisor too: its rows need the height
        await pilot.pause()
        assert app.runs_table.region.height == 0 and app.advisor.region.height >= 12
        await pilot.press("1")
        await pilot.pause()
        assert app.runs_table.region.height > 0 and app.gpu_panel.display  # back with the log


def test_sweep_plot_has_the_baseline_in_its_series(monkeypatch):
    import msgspec

    from tuitune.experiments.results import SweepResult
    from tuitune.experiments.sweep import plot

    drawn = []
    real = plt.plot
    monkeypatch.setattr(plt, "plot", lambda xs, ys, **kw: (drawn.append((list(xs), list(ys))), real(xs, ys, **kw)))

    result = {
        "preset": "p",
        "best": None,
        "table": [
            {
                "label": f"num_steps={s}",
                "kind": "config",
                "tok_s": t,
                "changes": {"speculative.num_steps": s},
                "axes": {"speculative.num_steps": s},
            }
            for s, t in ((1, 100.0), (3, 104.0))
        ]
        + [{"label": "baseline", "kind": "baseline", "tok_s": 130.0, "changes": {}, "axes": {}}],
        "baseline_axes": {"speculative.num_steps": 2},
    }
    text = plot(msgspec.convert(result, SweepResult), width=100, height=14, colour=False)
    assert "the point at steps 2" in text
    assert drawn == [([1, 2, 3], [100.0, 130.0, 104.0])]  # steps 1, 2 (the baseline), 3 in one line


def test_crossover_arms_have_their_own_markers():
    from tuitune.experiments.crossover import plot_text
    from tuitune.experiments.results import CrossoverArm, CrossoverLevel, CrossoverResult

    def arm(goodput: float) -> CrossoverArm:
        return CrossoverArm(goodput=goodput, batch_size=None, accept_len=None)

    levels = [
        CrossoverLevel(concurrency=c, on=arm(100 * c**0.8), off=arm(90 * c), speedup=1.0, ci95=[1.0, 1.0], verdict="-")
        for c in (1, 4, 16)
    ]
    r = CrossoverResult(preset="p", twin="p-off", levels=levels, crossover=None, min_effect=0.02, comparable=True)
    text = plt.uncolorize(plot_text(r, 70, 14))
    on = next(ln for ln in text.splitlines() if "speculation on" in ln)
    off = next(ln for ln in text.splitlines() if "speculation off" in ln)
    mark = lambda ln: ln.split("│" if "│" in ln.split("speculation")[0] else "┤")[1].split("speculation")[0].strip()  # noqa: E731
    assert mark(on) and mark(off) and mark(on) != mark(off)
