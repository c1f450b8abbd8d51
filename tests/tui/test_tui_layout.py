"""Layout, focus and dialogs at the sizes people have (80×24, 120×40), on the deterministic replay."""

from __future__ import annotations

import pytest
from textual.widgets import Button, Footer, Input

from tuitune.tui.app import NARROW_COLS, TuituneApp
from tuitune.tui.config import GlyphCheckbox
from tuitune.tui.logpane import FollowLog
from tuitune.tui.screens import ConfirmScreen, QuitScreen, SaveScreen
from tuitune.tui.settings import UserConfig, load_user_config, remember_theme
from tuitune_support.pilot import until
from tuitune_support.scenes import _runs, prepare, scene_app

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])


def visible(widget) -> bool:
    return widget.display and widget.region.width > 0 and widget.region.height > 0


def footer_keys(app) -> list[str]:
    """The keys the footer shows, left to right, and only those inside the screen."""
    footer = app.screen.query_one(Footer)
    return [k.key for k in footer.query("FooterKey") if k.region.width > 0 and k.region.right <= app.size.width]


@SIZES
async def test_small_terminals_keep_every_panel_readable(size):
    app = scene_app()
    async with app.run_test(size=size) as pilot:
        _runs(app)
        # the runs are drawn on the app's next refresh tick (0.3 s was once not enough under load in CI)
        await until(pilot, lambda: app.runs_table.row_count == 3, what="the three runs drawn")
        await until(pilot, lambda: app.runs_table.region.height >= 6, 5, "border, header and three rows")
        assert size[0] < NARROW_COLS and not visible(app.config)  # collapsed below 140 columns
        bars = app.cycle.query_one("#bars")
        assert bars.region.height == 4  # three bars and the summary, none wrapped
        assert "█" in str(bars.render()).splitlines()[1]
        assert app.logpane.query_one(FollowLog).region.height >= 3
        for _ in range(100):  # the footer composes its keys after the first refresh
            keys = footer_keys(app)
            if keys:
                break
            await pilot.pause(0.05)
        assert "question_mark" in keys and "q" in keys, keys
        await pilot.press("e")  # shows the panel, over the right side, focused on the algorithm
        await pilot.pause()
        assert visible(app.config) and app.focused.id == "spec-algorithm"
        assert app.cycle.region.width == size[0]  # the panels keep their width underneath
        await pilot.press("escape")
        await pilot.pause()
        assert not visible(app.config)


async def test_wide_terminal_shows_the_config_panel_beside():
    app = scene_app()
    async with app.run_test(size=(160, 44)) as pilot:
        await pilot.pause()
        assert visible(app.config) and app.cycle.region.right <= app.config.region.x


async def test_help_is_a_screen_of_its_own_and_leaves_the_panels_as_they_were():
    app = scene_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        width = app.cycle.region.width
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "HelpScreen" and not app.screen.query("HelpPanel")
        await pilot.press("escape")
        await pilot.pause()
        assert app.cycle.region.width == width and app.cycle.query_one("#bars").region.height == 4


@SIZES
async def test_quit_dialog_fits_and_offers_both_choices(size):
    app = scene_app()
    async with app.run_test(size=size) as pilot:
        app.push_screen(QuitScreen("demo"))
        await pilot.pause()
        box = app.screen.query_one("QuitScreen > Vertical").content_region
        for bid in ("#leave", "#stop"):
            b = app.screen.query_one(bid, Button)
            assert b.region.height == 3 and box.contains_region(b.region), (bid, b.region, box)
        assert "Stop the server [s]" in str(app.screen.query_one("#stop", Button).label)


async def test_replay_quits_without_a_question():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not isinstance(app.screen, QuitScreen) and app.return_code == 0


async def test_next_node_on_a_replay_says_there_is_one_machine():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_next_node()
        await pilot.pause()
        assert any("one machine" in m for m in app.messages), app.messages


@SIZES
async def test_focused_inputs_show_their_value_and_derived_is_not_an_error(size):
    app = scene_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("e", "tab")  # algorithm -> steps
        await pilot.pause()
        steps = app.focused
        assert steps.id == "spec-num-steps" and steps.region.height == 1
        assert steps.styles.border_top[0] in ("", "none")  # no border row hiding the value
        assert steps.styles.background != app.config.query_one("#spec-eagle-topk").styles.background
        await pilot.press("tab", "tab", "tab")  # through topk and the derived draft tokens
        await pilot.pause()
        draft = app.config.query_one("#spec-num-draft-tokens", Input)
        assert draft.value == "" and not draft.has_class("-invalid")
        assert draft.placeholder == "derived: 3"


async def test_checkbox_state_reads_without_colour():
    app = scene_app()
    async with app.run_test(size=(160, 44)) as pilot:
        box = app.config.query_one("#set-nccl-proto", GlyphCheckbox)
        assert box.value and "X" in str(box.render())
        box.value = False
        await pilot.pause()
        assert "X" not in str(box.render())


async def test_log_follows_until_the_user_scrolls_up_from_any_focus():
    app = scene_app()
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.logpane
        log = pane.query_one(FollowLog)
        pane.add([f"line {i}" for i in range(200)])
        await pilot.pause()
        assert pane.following and log.scroll_y == log.max_scroll_y
        # a panel growing above (the pane shrinks) does not stop following
        app.cycle.styles.height = 20
        await pilot.pause()
        pane.add(["after resize"])
        await pilot.pause(0.2)
        assert pane.following and log.scroll_y == log.max_scroll_y
        log.focus()
        await pilot.press("k", "k")  # j/k move in the log
        pane.add(["x", "y", "z"])
        await pilot.pause()
        assert not pane.following and "paused · 3 new" in pane.status
        assert "paused · 3 new" in str(log.border_subtitle)
        # clearing a filter keeps it paused; End from the runs table resumes
        await pilot.press("slash", "z")
        await pilot.press("backspace")
        app.runs_table.focus()
        await pilot.press("end")
        await pilot.pause()
        assert pane.following and log.scroll_y == log.max_scroll_y and "paused" not in pane.status
        log.focus()
        await pilot.press("k")
        await pilot.pause()
        assert not pane.following
        app.set_focus(None)
        await pilot.press("G")
        await pilot.pause()
        assert pane.following


async def test_runs_table_moves_with_j_and_k():
    app = scene_app()
    async with app.run_test(size=(120, 40)) as pilot:
        _runs(app)
        await until(pilot, lambda: app.runs_table.row_count == 3, what="the three runs drawn")
        app.runs_table.focus()
        app.runs_table.move_cursor(row=0)
        await pilot.press("j", "j")
        assert app.runs_table.cursor_row == 2
        await pilot.press("k")
        assert app.runs_table.cursor_row == 1


async def test_palette_lists_commands_before_typing_once_each():
    app = scene_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause(0.5)
        options = app.screen.query_one("CommandList")
        titles = [str(options.get_option_at_index(i).prompt).split("\n")[0] for i in range(options.option_count)]
        assert titles.count("Clear the runs table") == 1 and "Show the chart" in titles, titles
        assert "Stop the server…" not in titles  # live only: not offered in a replay


async def test_stop_server_asks_first():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.action_confirm_stop_server()
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        q = app.screen.query_one("ConfirmScreen > Vertical").content_region
        assert all(q.contains_region(b.region) for b in app.screen.query(Button))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen) and "stop" not in " ".join(app.messages)


async def test_first_run_hint_until_the_first_profile_window():
    from tuitune.measure.capture import Replay, read_capture
    from tuitune_support.scenes import CAPTURE

    replay = Replay(read_capture(CAPTURE), play=False)
    app = TuituneApp(replay, user_config=UserConfig())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "waiting for the first profile window…" in str(app.cycle.query_one("#bars").render())
        assert "space play/pause" in str(app.cycle.query_one("#bars").render())
        replay.publish_until(replay.duration)
        app._dirty_cycle = True
        await until(pilot, lambda: "waiting" not in str(app.cycle.query_one("#bars").render()), 5, "the bars")


async def test_save_dialog_flags_a_description_that_no_longer_matches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        from tuitune import preset as P

        app.loaded = app.draft = P.with_changes(app.draft, {"description": "EAGLE-3, 2 steps, topk 1"})
        app.config.load(app.draft)
        app.config.query_one("#spec-num-steps").value = "3"
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, SaveScreen)
        note = str(app.screen.query_one("#save-stale").render())
        assert "mentions 2" in note and "speculative.num_steps is now 3" in note
        desc = app.screen.query_one("#save-description", Input)
        assert app.focused is app.screen.query_one("#save-path", Input)  # the name first (issue 28)
        await pilot.press("tab")
        assert app.focused is desc
        desc.value = "EAGLE-3, 3 steps, topk 1"
        await pilot.press("enter")
        await pilot.pause()
        saved = P.load(P.user_dir() / f"{app.draft.name}.yaml")
        assert saved.description == "EAGLE-3, 3 steps, topk 1" and saved.speculative.num_steps == 3


def test_config_file_warns_about_unknown_keys_and_reads_theme(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("# mine\nthme: nord\ntheme: nord\nkeymap:\n  tuitune.relanch: ctrl+r\n")
    cfg = load_user_config(path)
    assert cfg.theme == "nord"
    assert any("unknown key 'thme' (did you mean theme?)" in e for e in cfg.errors), cfg.errors


async def test_config_file_keymap_id_checked_and_theme_remembered(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("# my settings\ntheme: nord\nkeymap:\n  tuitune.relanch: ctrl+r\n  tuitune.bench: B\n")
    app = scene_app()
    app.user_config = load_user_config(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.theme == "nord"
        assert any(
            "no binding with id 'tuitune.relanch' (did you mean tuitune.relaunch?)" in m for m in app.messages
        ), app.messages
        app.theme = "gruvbox"  # as the palette's "Change theme" does
        await pilot.pause()
    text = path.read_text()
    assert "theme: gruvbox" in text and "# my settings" in text and "tuitune.bench: B" in text


def test_remember_theme_appends_when_absent(tmp_path):
    path = tmp_path / "c" / "config.yaml"
    remember_theme(path, "nord")
    remember_theme(path, "dracula")
    assert path.read_text() == "theme: dracula\n"


async def test_unknown_theme_warns():
    app = scene_app()
    app.user_config = UserConfig(theme="nrod")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert any("theme 'nrod' is not a theme (did you mean nord?)" in m for m in app.messages)


@SIZES
async def test_screenshot_scenes_tell_the_truth(size):
    app = scene_app()
    async with app.run_test(size=size) as pilot:
        await prepare(app, pilot, "main")
        assert len(app.book.runs) == 3 and app.runs_table.row_count == 3
    app = scene_app()
    async with app.run_test(size=size) as pilot:
        await prepare(app, pilot, "failure")
        assert app.session.state.state == "failed"
        head = str(app.header.render())
        assert "failed: server exited during start (out of memory)" in head and "ready" not in head


async def test_resizing_to_80x24_lays_out_as_starting_there():
    """A terminal made smaller drops the sparklines (the log keeps its rows) and the footer turns
    compact without the palette key; made wide again, both come back."""
    app = scene_app()
    async with app.run_test(size=(140, 44)) as pilot:
        await pilot.pause()
        assert not app.has_class("-short") and app.footer.show_command_palette
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: app.has_class("-short") and app.has_class("-narrow"), 5, "the small layout")
        assert app.logpane.query_one(FollowLog).region.height >= 3
        assert app.footer.compact and not app.footer.show_command_palette
        await pilot.resize_terminal(140, 44)
        await until(pilot, lambda: not app.has_class("-short"), 5, "the wide layout")
        assert app.footer.show_command_palette and not app.footer.compact
