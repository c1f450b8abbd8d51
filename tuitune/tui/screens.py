"""Modal screens: relaunch progress, save a preset, open a preset (with a diff), quit."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from .. import preset as P
from .. import redact


class RelaunchScreen(ModalScreen[None]):
    """Phase, elapsed time and the last log lines of a relaunch; Esc cancels a start."""

    BINDINGS = [Binding("escape", "cancel", "cancel / close", id="relaunch.cancel")]
    DEFAULT_CSS = """
    RelaunchScreen { align: center middle; }
    RelaunchScreen > Vertical { width: 110; height: 26; border: thick $primary; background: $surface; padding: 0 1; }
    RelaunchScreen #phase { text-style: bold; height: 2; }
    RelaunchScreen #error { color: $error; height: auto; }
    RelaunchScreen #lines { height: 1fr; color: $text-muted; }
    """

    def __init__(self, preset_name: str, command: str):
        super().__init__()
        self.preset_name = preset_name
        self.command = command
        self.lines: list[str] = []
        self.finished = False
        self.failed = False
        # what the view shows, kept as data: updates may arrive before the widgets are composed
        self.phase_text = "preflight…"
        self.error_text = ""
        self.hint_text = "Esc: cancel the start (stops the half-started server)"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"relaunching {self.preset_name}", id="title")
            yield Static(self.phase_text, id="phase")
            yield Static(self.error_text, id="error")
            yield Static("", id="lines")
            yield Static(self.hint_text, id="hint")

    def on_mount(self) -> None:
        self.query_one(Vertical).border_title = "relaunch"
        self._draw()

    def _draw(self) -> None:
        if not self.query("#phase"):
            return  # not composed yet: on_mount draws
        self.query_one("#phase", Static).update(self.phase_text)
        self.query_one("#error", Static).update(self.error_text)
        self.query_one("#lines", Static).update(Text("\n".join(ln[:150] for ln in self.lines)))
        self.query_one("#hint", Static).update(self.hint_text)

    def set_phase(self, state) -> None:
        text = state.phase or state.state
        if state.elapsed_s is not None:
            text += f"  ({state.elapsed_s:.1f} s)"
        self.phase_text = text
        self._draw()

    def add_lines(self, lines: list[str]) -> None:
        self.lines = (self.lines + lines)[-14:]
        self._draw()

    def done(self, ok: bool, message: str = "", log_tail: list[str] | None = None) -> None:
        self.finished = True
        self.failed = not ok
        if ok:
            self.dismiss(None)
            return
        self.phase_text = "failed"
        self.error_text = message
        if log_tail:
            self.lines = log_tail[-14:]
        self.hint_text = "Esc: close (the previous configuration stays loaded)"
        self._draw()

    def action_cancel(self) -> None:
        if self.finished:
            self.dismiss(None)
        else:
            self.app.cancel_relaunch()
            self.phase_text = "cancelling: stopping the half-started server…"
            self._draw()


class SaveScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel", id="save.cancel")]
    DEFAULT_CSS = """
    SaveScreen { align: center middle; }
    SaveScreen > Vertical { width: 90; height: 9; border: thick $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, default_path: str):
        super().__init__()
        self.default_path = default_path

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("save the current configuration as (a name goes to your presets directory):")
            yield Input(value=self.default_path, id="save-path")
            yield Static("", id="save-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class OpenScreen(ModalScreen[Path | None]):
    """Pick a preset; the diff against the current configuration is shown before loading."""

    BINDINGS = [Binding("escape", "cancel", "cancel", id="open.cancel")]
    DEFAULT_CSS = """
    OpenScreen { align: center middle; }
    OpenScreen > Vertical { width: 120; height: 32; border: thick $primary; background: $surface; padding: 0 1; }
    OpenScreen OptionList { height: 12; }
    OpenScreen #preview { height: 1fr; }
    """

    def __init__(self, current: P.Preset):
        super().__init__()
        self.current = current
        self.entries = P.listing()

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("open a preset (Enter loads it; it is not launched until you press r)")
            yield OptionList(*[Option(f"{origin:<8} {name:<28} {desc[:70]}", id=str(i))
                               for i, (origin, _, name, desc) in enumerate(self.entries)], id="presets")
            yield Static("", id="preview")

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        origin, path, name, desc = self.entries[int(event.option.id)]
        try:
            other = P.load(path)
        except P.PresetError as e:
            self.query_one("#preview", Static).update(Text(str(e), style="red"))
            return
        changes = P.diff(self.current, other)
        text = Text(f"{path}\n", style="dim")
        if not changes:
            text.append("same configuration as the current one")
        for key, a, b in changes:
            a, b, note = redact.pair(key, a, b)
            text.append(f"{key}: ", style="bold")
            text.append(f"{'(unset)' if a is None else a}", style="red")
            text.append(" → ")
            text.append(f"{'(unset)' if b is None else b}", style="green")
            text.append(f"{note}\n")
        self.query_one("#preview", Static).update(text)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.entries[int(event.option.id)][1])

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuitScreen(ModalScreen[str | None]):
    """Quit: leave the server running (default) or stop it."""

    BINDINGS = [Binding("escape", "cancel", "cancel", id="quit.cancel"),
                Binding("y,enter", "leave", "leave running", id="quit.leave"),
                Binding("s", "stop", "stop server", id="quit.stop")]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 64; height: 9; border: thick $primary; background: $surface; padding: 0 1; }
    QuitScreen Button { margin: 1 1 0 0; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Quit tuitune. Leave the server running?")
            yield Button("Leave it running [Y/Enter]", id="leave", variant="primary")
            yield Button("Stop the server [s]", id="stop", variant="error")

    def on_mount(self) -> None:
        self.query_one("#leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)

    def action_leave(self) -> None:
        self.dismiss("leave")

    def action_stop(self) -> None:
        self.dismiss("stop")

    def action_cancel(self) -> None:
        self.dismiss(None)
