"""The draft preset from the app: the config panel's edits, the advisor's suggestion applied to it,
and the preset files: save (under a name that may hide a shipped preset, asked first), open
(a diff first; a preset for another server is refused) and revert."""

from __future__ import annotations

from pathlib import Path

from tuitune import preset as P
from tuitune.tui.advisor import apply_to_config
from tuitune.tui.appbase import AppBase
from tuitune.tui.config import ConfigPanel
from tuitune.tui.describe import rewrite_description, stale_description
from tuitune.tui.screens import ConfirmScreen, OpenScreen, SaveScreen


class PresetActions(AppBase):
    """Edit the draft, apply advice to it, save, open and revert presets."""

    # ---- config edits ---------------------------------------------------------------------
    def on_config_panel_edited(self, message: ConfigPanel.Edited) -> None:
        panel = self.config
        self.draft_errors = dict(message.errors)
        if not message.errors:
            assert panel.base is not None  # the panel reports edits only once it holds a preset
            try:
                self.draft = P.with_changes(panel.base, message.changes)
            except P.PresetError as e:
                self.draft_errors["preset"] = str(e)
        self.update_diff()

    def action_apply_advice(self) -> None:
        """The advisor's ``▶`` into the config panel; a gain inside the running configuration's
        interval, or a measurement (``▷``: the running one is predicted best), is asked about first."""
        sug = self.advisor.suggestion()
        best = sug.config
        if best is None:
            if self.advisor.rows:
                self.say("the running configuration is predicted best: nothing to apply", "warning")
            else:
                self.say("no advice yet: the advisor needs profile windows of the running server", "warning")
            return
        label = self.advisor.engine.config_label(best)

        def apply(yes: bool | None = True) -> None:
            if yes:
                apply_to_config(self.config, best)
                self.say(f"config panel set to {label}: press r to relaunch with it")

        if sug.kind == "gain":
            apply()
            return
        question = (
            f"{label} is predicted {sug.gain:+.1%}, inside the running configuration's 95 % interval: "
            "not a sure gain. Put it into the config panel anyway (then r, b to measure it)?"
            if sug.kind == "within"
            else f"The running configuration is predicted best ({label}: {sug.gain:+.1%}). "
            f"{label} is the measurement worth making next: put it into the config panel to measure it?"
        )
        self.say(question.split(". ")[0], "warning")
        self.push_screen(ConfirmScreen(question, "Apply [y]", "y"), apply)

    def action_save(self) -> None:
        if self.draft_errors:
            self.say("fix the configuration first: " + next(iter(self.draft_errors.values())), "error")
            return
        draft = self.draft
        if draft is None:
            self._no_preset("save")
            return
        default = (
            str(self.preset_path) if self.preset_path and self.preset_path.parent != P.shipped_dir() else draft.name
        )
        self._ask_save(default, draft.description or "")

    def _ask_save(self, target: str, description: str) -> None:
        """The save dialog; a name that would hide a shipped preset is asked about first (No goes
        back to the dialog as typed)."""
        draft = self.draft  # the dialog is modal: the draft stays this one while it is open
        assert draft is not None

        def done(answer: tuple[str, str] | None) -> None:
            if not answer:
                return
            target, description = answer
            path = Path(target).expanduser()
            if path.suffix not in (".yaml", ".yml"):
                path = P.user_dir() / f"{target}.yaml"
            shipped = P.shadowed(path.stem) if path.parent == P.user_dir() and not path.exists() else None
            if shipped is None:
                self._save(path, description)
                return

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self._save(path, description)
                else:
                    self._ask_save(target, description)

            self.push_screen(
                ConfirmScreen(
                    f"{path.stem} is a shipped preset's name. Yours, saved as {path}, would hide it: "
                    f"`tuitune {path.stem}` and every command given the name {path.stem} find yours first. "
                    "Save it anyway?",
                    "Save anyway [y]",
                    "y",
                    no_label="Another name [Esc]",
                ),
                confirmed,
            )

        def hides(name: str) -> Path | None:
            path = Path(name).expanduser()
            if path.suffix in (".yaml", ".yml"):
                return None if path.parent != P.user_dir() or path.exists() else P.shadowed(path.stem)
            return None if (P.user_dir() / f"{name}.yaml").exists() else P.shadowed(name)

        self.push_screen(
            SaveScreen(
                target,
                description,
                lambda d: stale_description(self.loaded, draft, d),
                hides,
                fix=lambda d: rewrite_description(self.loaded, draft, d),
                slot=self._slot_note,
            ),
            done,
        )

    def _renamed(self, name: str) -> P.Preset:
        """The draft saved under ``name``: a log path that names the old preset names the new one (two
        presets writing one log would read each other's lines); the port stays (one server slot)."""
        draft = self.draft
        assert draft is not None
        old = draft.name
        changes: dict = {"name": name}
        log = str(draft.server.log)
        if name != old and old and old in Path(log).name:
            changes["server.log"] = str(Path(log).with_name(Path(log).name.replace(old, name, 1)))
        return P.with_changes(draft, changes)

    def _slot_note(self, target: str) -> str:
        """What the save dialog says of the server a preset saved under ``target`` would use."""
        draft = self.draft
        assert draft is not None
        name = Path(target).expanduser().stem if target.strip() else draft.name
        p = self._renamed(name)
        same = "" if name == draft.name else f" (the port is {draft.name}'s: one of them runs at a time)"
        return f"port {p.server.port}, log {p.server.log}{same}"

    def _save(self, path: Path, description: str) -> None:
        try:
            saved = P.save(P.with_changes(self._renamed(path.stem), {"description": description or None}), path)
        except (OSError, P.PresetError) as e:
            self.say(f"{path}: cannot save ({e})", "error")
            return
        self.loaded = P.load(saved)
        self.draft = self.loaded
        self.preset_path = saved
        self.config.load(self.draft)
        hidden = P.shadowed(saved.stem) if saved.parent == P.user_dir() else None
        self.say(f"saved {saved}" + (f" (it hides the shipped {saved.stem})" if hidden else ""))

    def _no_preset(self, what: str) -> None:
        """Saving, opening and reverting need a preset; a replay of a capture may have none."""
        self.say(f"nothing to {what}: the capture this replay plays holds no preset", "warning")

    def action_open(self) -> None:
        loaded, draft = self.loaded, self.draft
        if loaded is None or draft is None:
            self._no_preset("open a preset against")
            return
        here = (loaded.target.label(), loaded.server.port)  # the dialog is modal: loaded stays this one

        def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                p = P.load(path)
            except P.PresetError as e:
                self.say(str(e), "error")
                return
            if (p.target.label(), p.server.port) != here:
                # a session follows one server (its port's state file, log and forward): loading a
                # preset for another one here would leave that server untracked
                self.say(
                    f"{p.name} runs on {p.target.label()} port {p.server.port}; this session follows "
                    f"{here[0]} port {here[1]}. Quit and run `tuitune {path}` to work on it, or "
                    f"change its port to {here[1]} to try it here",
                    "error",
                )
                return
            self.loaded = self.draft = p
            self.opened_not_launched = True
            self.preset_path = path
            self.config.load(p)
            self.update_diff()
            self.say(f"loaded {p.name}: press r to launch it")

        self.push_screen(OpenScreen(draft, here), done)

    def action_revert(self) -> None:
        if self.loaded is None:
            self._no_preset("revert to")
            return
        self.draft = self.loaded
        self.draft_errors = {}
        self.config.load(self.loaded)
        self.update_diff()
