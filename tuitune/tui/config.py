"""Config panel: speculative settings, key server flags, every NCCL variable of the catalogue.

The panel only collects values and shows inline errors; the rules live in the core
(``nccl.check``, ``Engine.resolve``, ``preset.with_changes``). The algorithms and server
flags offered are the loaded preset's engine's (``Engine.algorithms``, ``Engine.editable_flags``).
It posts ``Edited`` with the dotted-path changes against the preset it was loaded with.
"""

from __future__ import annotations

from types import SimpleNamespace

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Checkbox, Input, Label, Select, Static

from tuitune import engines
from tuitune.engines.base import Engine, Flag
from tuitune.preset import Preset, PresetError, nccl, with_changes

NONE = ("none (baseline)", "none")
# every engine's editable flags, one row each (a text box, or a checkbox for a bare flag); a
# preset shows its engine's rows only
FLAGS: tuple[Flag, ...] = tuple({f.name: f for e in engines.ENGINES.values() for f in e.editable_flags}.values())
BOXES = tuple(f for f in FLAGS if f.kind != "bool")
CHECKS = tuple(f for f in FLAGS if f.kind == "bool")


def algorithms(engine: Engine) -> list[tuple[str, str]]:
    return [NONE] + [(a, a) for a in engine.algorithms]


def _wid(name: str) -> str:
    return name.replace("_", "-").lower()


class GlyphCheckbox(Checkbox):
    """A checkbox whose state reads without colour too (NO_COLOR, monochrome terminals)."""

    # Textual declares BUTTON_INNER a plain class attribute but only ever reads it, at each render
    @property
    def BUTTON_INNER(self) -> str:  # type: ignore[override]  # noqa: N802 - Textual's name
        return "X" if self.value else " "


class ConfigPanel(VerticalScroll):
    DEFAULT_CSS = """
    ConfigPanel { border: round $primary; padding: 0 1; width: 50; }
    ConfigPanel .section { text-style: bold; color: $accent; margin-top: 1; }
    ConfigPanel .row { height: 1; margin-bottom: 0; }
    ConfigPanel .row Label { width: 22; }
    ConfigPanel Input { width: 1fr; height: 1; border: none; padding: 0 1; }
    /* one row high: a focus border would hide the value, so focus is a background */
    ConfigPanel Input:focus { border: none; background: $accent 35%; text-style: bold; }
    ConfigPanel Input.-invalid { border: none; }
    ConfigPanel Checkbox:focus { border: none; background: $accent 35%; }
    ConfigPanel Select { width: 1fr; height: 1; }
    ConfigPanel Select > SelectCurrent { border: none; height: 1; padding: 0 1; }
    ConfigPanel Select > SelectOverlay { max-height: 10; }
    ConfigPanel .nccl { height: auto; }
    ConfigPanel Checkbox { border: none; padding: 0; height: 1; }
    ConfigPanel Select:focus > SelectCurrent { border: none; background: $accent 35%; }
    ConfigPanel .nccl Checkbox { width: 22; }
    ConfigPanel .help { color: $text-muted; height: auto; }
    ConfigPanel .error { color: $error; height: auto; }
    ConfigPanel .error.-empty { display: none; }
    ConfigPanel .derived { color: $text-muted; height: auto; }
    ConfigPanel #diff { color: $warning; height: auto; }
    """

    class Edited(Message):
        def __init__(self, changes: dict, errors: dict[str, str]):
            super().__init__()
            self.changes = changes
            self.errors = errors

    def __init__(self, **kw):
        super().__init__(**kw)
        self.base: Preset | None = None
        self.errors: dict[str, str] = {}
        self.engine: Engine = engines.get("sglang")  # the loaded preset's

    def compose(self) -> ComposeResult:
        yield Static("", id="diff")
        yield Static("speculative", classes="section")
        with Horizontal(classes="row"):
            yield Label("algorithm")
            yield Select(algorithms(engines.get("sglang")), allow_blank=False, value="none", id="spec-algorithm")
        for key, label in (("num_steps", "steps"), ("eagle_topk", "topk"), ("num_draft_tokens", "draft tokens")):
            with Horizontal(classes="row"):
                yield Label(label, id=f"label-{_wid(key)}")
                # empty is valid (derived or unset): not an error colour after Tab
                yield Input(id=f"spec-{_wid(key)}", type="integer", valid_empty=True)
        yield Static("", id="spec-derived", classes="derived")
        yield Static("", id="spec-error", classes="error -empty")
        yield Static("server", classes="section")
        for flag in BOXES:
            with Horizontal(classes="row", id=f"row-{flag.name}"):
                yield Label(flag.label)
                yield Input(
                    id=f"flag-{flag.name}", type="integer" if flag.kind == "int" else "number", valid_empty=True
                )
        for flag in CHECKS:
            yield GlyphCheckbox(flag.label, id=f"flag-{flag.name}")
        yield Static("", id="flag-error", classes="error -empty")
        yield Static("NCCL (checked = set)", classes="section")
        for var in nccl.CATALOGUE.values():
            w = _wid(var.name)
            with Vertical(classes="nccl"):
                with Horizontal(classes="row"):
                    yield GlyphCheckbox(var.name.removeprefix("NCCL_"), id=f"set-{w}")
                    if var.kind in ("bool", "enum", "level"):
                        yield Select([(c, c) for c in var.choices], allow_blank=True, id=f"val-{w}")
                    else:
                        yield Input(placeholder=f"default: {var.default}", id=f"val-{w}")
                yield Static(
                    var.help + (f" (deprecated: {var.deprecated_by})" if var.deprecated_by else ""), classes="help"
                )
                yield Static("", id=f"err-{w}", classes="error -empty")

    def on_mount(self) -> None:
        self.border_title = "config"
        self._offer(self.engine)

    def _offer(self, engine: Engine) -> None:
        """Offer ``engine``'s algorithms and flags (its rows shown, the others' hidden)."""
        if engine is not self.engine:
            self.engine = engine
            self.query_one("#spec-algorithm", Select).set_options(algorithms(engine))
        mine = {f.name for f in engine.editable_flags}
        for flag in BOXES:
            self.query_one(f"#row-{flag.name}").display = flag.name in mine
        for flag in CHECKS:
            self.query_one(f"#flag-{flag.name}").display = flag.name in mine

    # ---- load ---------------------------------------------------------------------------
    def load(self, preset: Preset) -> None:
        """Show ``preset``; edits are reported relative to it."""
        self.base = preset
        with self.prevent(Input.Changed, Select.Changed, Checkbox.Changed):
            sp = preset.speculative if preset.is_speculative else None
            if preset.engine is not self.engine:
                self._offer(preset.engine)
            self.query_one("#spec-algorithm", Select).value = sp.algorithm if sp else "none"
            chain = self._chain
            for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
                # vLLM drafts a chain: the first row is its num_speculative_tokens, the others do not apply
                v = getattr(sp, "num_speculative_tokens" if chain and key == "num_steps" else key) if sp else None
                box = self.query_one(f"#spec-{_wid(key)}", Input)
                box.value = "" if v is None else str(v)
                box.disabled = chain and key != "num_steps"
            self.query_one("#label-num-steps", Label).update("spec tokens" if chain else "steps")
            args = preset.server.args
            for flag in BOXES:
                v = args.get(flag.name)
                self.query_one(f"#flag-{flag.name}", Input).value = "" if v is None else str(v)
            for flag in CHECKS:
                self.query_one(f"#flag-{flag.name}", Checkbox).value = bool(args.get(flag.name, False))
            for var in nccl.CATALOGUE.values():
                w = _wid(var.name)
                value = preset.env.get(var.name)
                self.query_one(f"#set-{w}", Checkbox).value = value is not None
                widget = self._value_widget(w)
                if isinstance(widget, Select):
                    if value in var.choices:
                        widget.value = value
                    else:
                        widget.clear()
                else:
                    widget.value = value or ""
                self._error(f"#err-{w}", "")
        self.errors = {}
        self._error("#spec-error", "")
        self._error("#flag-error", "")
        self._show_derived()

    def _value_widget(self, w: str) -> Select[str] | Input:
        """An NCCL variable's value: a Select of the catalogue's choices, or an Input where it has none."""
        widget = self.query_one(f"#val-{w}")
        assert isinstance(widget, (Select, Input))
        return widget

    # ---- collect ------------------------------------------------------------------------
    def _int(self, wid: str) -> int | None:
        text = self.query_one(wid, Input).value.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def collect(self) -> tuple[dict, dict[str, str]]:  # noqa: C901
        """(changes against the base preset, errors by field) from the widgets."""
        assert self.base is not None
        base = self.base
        changes: dict = {}
        errors: dict[str, str] = {}
        algo = self.query_one("#spec-algorithm", Select).value
        steps, topk, draft = (self._int(f"#spec-{_wid(k)}") for k in ("num_steps", "eagle_topk", "num_draft_tokens"))
        sp = base.speculative if base.is_speculative else None
        if algo == "none":
            if sp is not None:
                changes["speculative"] = None
        elif self._chain:
            want = {"algorithm": algo, "num_speculative_tokens": steps}
            edits = {f"speculative.{k}": v for k, v in want.items() if v != (getattr(sp, k) if sp else None)}
            try:
                with_changes(base, edits)  # the engine's own rules decide
                changes.update(edits)
            except PresetError as e:
                errors["speculative"] = str(e).split(": ", 1)[-1]
        else:
            draft_path = sp.draft_model_path if sp else None
            try:
                section = SimpleNamespace(
                    algorithm=algo,
                    num_steps=steps,
                    eagle_topk=topk,
                    num_draft_tokens=draft,
                    draft_model_path=draft_path,
                )
                self.engine.resolve(section)
                want = {"algorithm": algo, "num_steps": steps, "eagle_topk": topk, "num_draft_tokens": draft}
                have = {k: getattr(sp, k) if sp else None for k in want}
                for k, v in want.items():
                    if v != have[k]:
                        changes[f"speculative.{k}"] = v
            except ValueError as e:
                errors["speculative"] = str(e)
        for flag in self.engine.editable_flags:
            if flag.kind == "bool":
                on = self.query_one(f"#flag-{flag.name}", Checkbox).value
                if on != bool(base.server.args.get(flag.name, False)):
                    changes[f"server.args.{flag.name}"] = True if on else None
                continue
            text = self.query_one(f"#flag-{flag.name}", Input).value.strip()
            value = None
            if text:
                try:
                    value = int(text) if flag.kind == "int" else float(text)
                except ValueError:
                    errors[flag.name] = f"{flag.name}: {text!r} is not a number"
                    continue
            if value != base.server.args.get(flag.name):
                changes[f"server.args.{flag.name}"] = value
        for var in nccl.CATALOGUE.values():
            w = _wid(var.name)
            on = self.query_one(f"#set-{w}", Checkbox).value
            widget = self._value_widget(w)
            if isinstance(widget, Select):
                setting = "" if widget.is_blank() else str(widget.value)
            else:
                setting = widget.value.strip()
            if on:
                if not setting:
                    errors[var.name] = "choose a value, or uncheck to leave it unset"
                    continue
                errs, _ = nccl.check(var.name, setting)
                if errs:
                    errors[var.name] = errs[0]
                    continue
                if base.env.get(var.name) != setting:
                    changes[f"env.{var.name}"] = setting
            elif var.name in base.env:
                changes[f"env.{var.name}"] = None
        return changes, errors

    @property
    def _chain(self) -> bool:
        return self.base is not None and self.engine.topks == (1,)  # the engine drafts chains only

    def _show_derived(self) -> None:
        topk = self._int("#spec-eagle-topk")
        steps = self._int("#spec-num-steps")
        algo = self.query_one("#spec-algorithm", Select).value
        note = ""
        draft = self.query_one("#spec-num-draft-tokens", Input)
        if algo != "none" and self._chain and steps:
            note = f"verified a step: spec tokens + 1 = {steps + 1} (vLLM drafts a chain: no topk)"
        elif algo != "none" and topk == 1 and steps:
            note = f"draft tokens = steps + 1 = {steps + 1} (derived: topk is 1)"
        draft.placeholder = f"derived: {steps + 1}" if note and steps else ""  # a note is only made with steps
        self.query_one("#spec-derived", Static).update(note)

    def _error(self, wid: str, text: str) -> None:
        w = self.query_one(wid, Static)
        w.update(text)
        w.set_class(not text, "-empty")

    def _report(self) -> None:
        if self.base is None:
            return
        changes, errors = self.collect()
        self.errors = errors
        self._error("#spec-error", errors.get("speculative", ""))
        self._error("#flag-error", " ".join(v for k, v in errors.items() if k in {f.name for f in FLAGS}))
        for var in nccl.CATALOGUE.values():
            self._error(f"#err-{_wid(var.name)}", errors.get(var.name, ""))
        self._show_derived()
        self.post_message(self.Edited(changes, errors))

    def show_diff(self, lines: list[str]) -> None:
        self.query_one("#diff", Static).update(
            ("differs from the running server:\n" + "\n".join(lines)) if lines else ""
        )

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._report()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self._report()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        w = (event.checkbox.id or "").removeprefix("set-")
        if event.checkbox.value and event.checkbox.id and event.checkbox.id.startswith("set-"):
            widget = self._value_widget(w)
            var = next(v for v in nccl.CATALOGUE.values() if _wid(v.name) == w)
            if isinstance(widget, Select) and widget.is_blank() and var.choices:
                with self.prevent(Select.Changed):
                    widget.value = var.choices[-1] if var.kind == "level" else var.choices[0]
        self._report()
