"""The advisor says what it means (issue 41, item 5): `▶` only on a configuration predicted faster
than the running one; a gain inside the running configuration's interval is labelled and `a`
asks first; when the running configuration is predicted best, `▷` marks the measurement worth
making next."""

from __future__ import annotations

from tuitune.decide.advise import suggestion
from tuitune.decide.costmodel import Prediction
from tuitune.decide.fitting import Estimate
from tuitune.decide.launch import OFF, Config
from tuitune.tui.screens import ConfirmScreen
from tuitune_support.scenes import SIZE, scene_app

RUN = Config.chain(2)


def pred(c: Config, mean: float, sd: float) -> Prediction:
    return Prediction(c, 1, Estimate(mean, sd), 2.0, 10.0, {})


def rows_running_best():
    # the screenshot's case: every neighbour predicted slower (-0.7 % the closest)
    return [pred(RUN, 100.0, 3.0), pred(Config.chain(3), 99.3, 8.0), pred(Config.chain(1), 90.0, 1.0), pred(OFF, 80, 1)]


def rows_within():
    return [pred(Config.chain(3), 101.0, 2.0), pred(RUN, 100.0, 3.0), pred(OFF, 80, 1)]


def rows_gain():
    return [pred(Config.chain(3), 120.0, 2.0), pred(RUN, 100.0, 3.0), pred(OFF, 80, 1)]


def test_suggestion_kinds():
    s = suggestion(rows_running_best(), RUN)
    assert s.kind == "measure" and s.config == Config.chain(3) and not s.faster and s.gain < 0
    s = suggestion(rows_within(), RUN)
    assert s.kind == "within" and s.config == Config.chain(3) and s.faster
    assert suggestion(rows_gain(), RUN).kind == "gain"
    narrow = [pred(RUN, 100.0, 0.1), pred(Config.chain(1), 90.0, 0.1)]
    assert suggestion(narrow, RUN).kind == "none"  # nothing faster, nothing whose interval reaches above


async def show(app, pilot, rows):
    app.tabs.active = "tab-advisor"
    app.advisor.rows, app.advisor.running = rows, RUN
    app.advisor.update(app.advisor.render_rows())
    await pilot.pause()
    return str(app.advisor.render())


async def test_no_play_mark_on_a_slower_configuration_and_a_asks():
    app = scene_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = await show(app, pilot, rows_running_best())
        assert "▶" not in text and "▷" in text
        assert "running configuration is predicted best" in text and "worth measuring next" in text
        before = app.draft
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.draft is before  # asked, not applied
        await pilot.press("escape")
        await pilot.pause()
        assert app.draft is before and app.config.query_one("#spec-num-steps").value != "3"


async def test_a_gain_inside_the_interval_is_labelled_and_asked_about():
    app = scene_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = await show(app, pilot, rows_within())
        assert "▶" in text and "within the interval: not a sure gain" in text
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert "not a sure gain" in app.messages[-1] or "interval" in app.messages[-1]
        await pilot.press("y")
        await pilot.pause()
        assert app.config.query_one("#spec-num-steps").value == "3"
        text = await show(app, pilot, rows_gain())
        assert "▶" in text and "not a sure gain" not in text
