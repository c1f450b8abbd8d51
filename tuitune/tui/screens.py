"""Modal screens: relaunch progress, save a preset, open a preset (with a diff), quit, confirm.

Every dialog fits its content (height auto, capped by the terminal), so nothing is clipped at
80×24; `q` reaches the quit dialog from the views that are not text entry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content  # plain text: "[s]" in a label is a key, not markup
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tuitune import preset as P
from tuitune.base import redact


class RelaunchScreen(ModalScreen[None]):
    """Phase, elapsed time and the last log lines of a relaunch; Esc cancels a start."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel / close", id="relaunch.cancel"),
        Binding("q", "app.quit_app", "quit", id="relaunch.quit"),
    ]
    DEFAULT_CSS = """
    RelaunchScreen { align: center middle; }
    RelaunchScreen > Vertical { width: 110; max-width: 100%; height: 26; max-height: 100%; border: thick $primary;
                                background: $surface; padding: 0 1; }
    RelaunchScreen #phase { text-style: bold; height: 2; }
    RelaunchScreen #error { color: $error; height: auto; }
    RelaunchScreen #lines { height: 1fr; color: $text-muted; }
    """

    def __init__(self, preset_name: str, command: str, cancel: Callable[[], None]):
        """``cancel()``: stops the start in progress (the app's relaunch worker)."""
        super().__init__()
        self.preset_name = preset_name
        self.command = command
        self.cancel = cancel
        self.lines: list[str] = []
        self.launched = False  # the new server's process is up: log lines from here on are its own
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
            self.cancel()
            self.phase_text = "cancelling: stopping the half-started server…"
            self._draw()


class SaveScreen(ModalScreen[tuple[str, str] | None]):
    """Where to save, and the description (flagged when it mentions a value that changed)."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel", id="save.cancel"),
        Binding("ctrl+r", "fix_description", "fix the description", id="save.fix"),
    ]
    DEFAULT_CSS = """
    SaveScreen { align: center middle; }
    SaveScreen > Vertical { width: 90; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
                            background: $surface; padding: 0 1; }
    SaveScreen Input { margin-bottom: 1; }
    SaveScreen Label { width: 100%; }
    SaveScreen #save-stale, SaveScreen #save-shadow { color: $warning; height: auto; }
    SaveScreen #save-slot { color: $text-muted; height: auto; }
    SaveScreen #save-shadow { margin-bottom: 1; }
    """

    def __init__(self, default_path: str, description: str = "", stale="", shipped=None, fix=None, slot=None):
        """``stale``: the warning about the description, or a function of the description giving it
        (redrawn as the description is edited); ``shipped(name)``: the shipped preset a name hides;
        ``fix(description)``: the description put right (ctrl+r), or None; ``slot(name)``: the port
        and log a preset saved under that name would use."""
        super().__init__()
        self.default_path = default_path
        self.description = description
        self.stale = stale if callable(stale) else (lambda _d, s=stale: s)
        self.shipped = shipped or (lambda _name: None)
        self.fix = fix or (lambda _d: None)
        self.slot = slot or (lambda _name: "")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("save the current configuration as (a name goes to your presets directory):")
            yield Input(value=self.default_path, id="save-path")
            yield Static("", id="save-shadow")
            yield Static("", id="save-slot")
            yield Label("description:")
            yield Static("", id="save-stale")
            yield Input(value=self.description, id="save-description")
            yield Label("Enter saves · Tab moves · Esc cancels", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#save-path", Input).focus()  # the name first, always: Tab reaches the description
        self._notes()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._notes()

    def _notes(self) -> None:
        if not self.query("#save-stale"):
            return
        desc = self.query_one("#save-description", Input).value
        stale = self.stale(desc)
        fixed = self.fix(desc) if stale else None
        note = self.query_one("#save-stale", Static)
        hint = f" ctrl+r makes it: {fixed}" if fixed else ""
        note.update(Content(f"⚠ {stale}{hint}" if stale else ""))
        note.display = bool(stale)
        name = self.query_one("#save-path", Input).value.strip()
        slot = self.slot(name)
        self.query_one("#save-slot", Static).update(Content(slot))
        self.query_one("#save-slot", Static).display = bool(slot)
        shadow = self.query_one("#save-shadow", Static)
        shadow.update(Content(f"⚠ {name} is a shipped preset's name: yours would hide it (you will be asked)"))
        shadow.display = self.shipped(name) is not None

    def on_input_submitted(self, event: Input.Submitted) -> None:
        path = self.query_one("#save-path", Input).value.strip()
        self.dismiss((path, self.query_one("#save-description", Input).value.strip()) if path else None)

    def action_fix_description(self) -> None:
        box = self.query_one("#save-description", Input)
        fixed = self.fix(box.value)
        if fixed is not None:
            box.value = fixed

    def action_cancel(self) -> None:
        self.dismiss(None)


class OpenScreen(ModalScreen[Path | None]):
    """Pick a preset; the diff against the current configuration is shown before loading."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel", id="open.cancel"),
        Binding("q", "app.quit_app", "quit", id="open.quit"),
    ]
    DEFAULT_CSS = """
    OpenScreen { align: center middle; }
    OpenScreen > Vertical { width: 120; max-width: 100%; height: 32; max-height: 100%; border: thick $primary;
                            background: $surface; padding: 0 1; }
    OpenScreen OptionList { height: 12; max-height: 45%; }
    OpenScreen #preview { height: 1fr; }
    """

    def __init__(self, current: P.Preset, here: tuple[str, int] | None = None):
        super().__init__()
        self.current = current
        self.here = here  # (target, port) this session follows: other presets are marked
        self.entries = P.listing()

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                "open a preset: Enter loads one for this server (not launched until you press r); "
                "one marked ≠ runs on another target or port"
            )
            yield OptionList(
                *[
                    Option(f"{self._mark(path)} {origin:<8} {name:<28} {desc[:70]}", id=str(i))
                    for i, (origin, path, name, desc) in enumerate(self.entries)
                ],
                id="presets",
            )
            yield Static("", id="preview")

    def _mark(self, path: Path) -> str:
        if self.here is None:
            return " "
        try:
            p = P.load(path)
        except P.PresetError:
            return "!"
        return " " if (p.target.label(), p.server.port) == self.here else "≠"

    def _entry(self, option: Option) -> tuple[str, Path, str, str]:
        assert option.id is not None  # every option is made with its entry's index as its id
        return self.entries[int(option.id)]

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        origin, path, name, desc = self._entry(event.option)
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
        self.dismiss(self._entry(event.option)[1])

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuitScreen(ModalScreen[str | None]):
    """Quit while a server of ours runs: leave it running or stop it. The default (Enter) is to
    leave a real server running and to stop the demo's simulator (``default_stop``)."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel", id="quit.cancel"),
        Binding("enter", "default", "default", show=False, id="quit.default"),
        Binding("y", "leave", "leave running", id="quit.leave"),
        Binding("s", "stop", "stop server", id="quit.stop"),
    ]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 64; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
                            background: $surface; padding: 0 1; }
    QuitScreen Label { width: 100%; }
    QuitScreen Horizontal { height: auto; }
    QuitScreen Button { margin: 1 1 0 0; }
    """

    def __init__(self, preset: str = "", starting: bool = False, default_stop: bool = False):
        super().__init__()
        self.preset = preset
        self.starting = starting
        self.default_stop = default_stop or starting  # a start is never left half-done

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.starting:
                yield Label(Content(f"Quit tuitune. {self.preset} is still starting: quitting stops it."))
            else:
                yield Label(Content(f"Quit tuitune. The server of {self.preset} is running: leave it running?"))
            with Horizontal():
                if not self.starting:
                    yield Button(
                        Content("Leave it running [y]" + (" ⏎" if not self.default_stop else "")),
                        id="leave",
                        variant="default" if self.default_stop else "primary",
                    )
                yield Button(
                    Content("Stop the server [s]" + (" ⏎" if self.default_stop else "")), id="stop", variant="error"
                )
            yield Label("Esc: back to tuitune", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#stop" if self.default_stop else "#leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id)

    def action_default(self) -> None:
        self.dismiss("stop" if self.default_stop else "leave")

    def action_leave(self) -> None:
        if not self.starting:
            self.dismiss("leave")

    def action_stop(self) -> None:
        self.dismiss("stop")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question for an action that cannot be undone (Esc or n: no)."""

    BINDINGS = [Binding("escape,n", "no", "no", id="confirm.no")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 64; max-width: 100%; height: auto; max-height: 100%; border: thick $error;
                               background: $surface; padding: 0 1; }
    ConfirmScreen Label { width: 100%; }
    ConfirmScreen Horizontal { height: auto; }
    ConfirmScreen Button { margin: 1 1 0 0; }
    """

    def __init__(self, question: str, yes_label: str, yes_key: str, no_label: str = "Cancel [Esc]"):
        super().__init__()
        self.question = question
        self.yes_label = yes_label
        self.yes_key = yes_key
        self.no_label = no_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Content(self.question))
            with Horizontal():
                yield Button(Content(self.no_label), id="no", variant="primary")
                yield Button(Content(self.yes_label), id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_key(self, event) -> None:
        if event.key == self.yes_key:
            event.stop()
            self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_no(self) -> None:
        self.dismiss(False)
