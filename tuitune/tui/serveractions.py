"""The server's lifecycle as the app drives it: connecting at start, relaunching with the draft
(in a worker, its progress on the relaunch screen, Esc cancels it) or, where the launch is prepared
to switch and only its step count changed, holding it live; stopping the server, NCCL's
confirmation, and quitting (asked first while a server of this session runs)."""

from __future__ import annotations

import asyncio
import time

from textual import work
from textual.worker import WorkerState

from tuitune import preset as P
from tuitune.base import redact
from tuitune.machine.errors import ControlError
from tuitune.machine.switch import SwitchError
from tuitune.machine.transport import TransportError
from tuitune.tui.appbase import AppBase
from tuitune.tui.screens import ConfirmScreen, QuitScreen, RelaunchScreen


class ServerActions(AppBase):
    """Connect, relaunch, stop and quit: the app's actions on the session's server."""

    # ---- session lifecycle ----------------------------------------------------------------
    @work(exclusive=True, group="session", exit_on_error=False)
    async def start_session(self) -> None:
        try:
            status = await self.session.connect()
        except (ControlError, TransportError) as e:
            self.say(str(e), "error")
            return
        if not self.live:
            return
        if len(labels := self.session.node_labels()) > 1:
            self.show_node(0, labels)
        running = bool(status and status.running)
        if self.autostart == "launch" or (not running and self.autostart == "launch-if-stopped"):
            self.action_relaunch()
        elif not running:
            self.say(f"{self.session.preset.name}: server not running — press r to launch it", "warning")
        elif not status.ours:
            self.say(f"{self.session.preset.name}: {status.note} (pid {status.record.pid})", "warning")
        elif status.drift:
            self.say(
                f"running server differs from the preset in {len(status.drift)} setting(s): "
                + "; ".join(str(d) for d in status.drift[:3]),
                "warning",
            )
        if self.load_on_start:
            await self.session.set_load(True)

    def action_relaunch(self) -> None:
        if why := self.session_refusal():
            self.say(why, "error")
            return
        if self.draft_errors:
            self.say("fix the configuration first: " + next(iter(self.draft_errors.values())), "error")
            return
        if self.relaunch_worker is not None and self.relaunch_worker.state == WorkerState.RUNNING:
            self.say("a relaunch is already in progress", "warning")
            return
        # what arrived before this relaunch (the running server's lines, the launch it came from, not
        # yet drawn on a busy machine) goes to the log pane now, not to the new launch's view
        self.refresh_views()
        draft = self.draft
        assert draft is not None  # relaunch is live only, and a live session has a preset
        live, why = self.live_change(draft)
        if live is not None:  # kept as the relaunch worker: a second r waits for it
            self.relaunch_worker = self.run_switch(draft, None if live == "release" else live)
            return
        if why:
            self.say(why, "warning")
        self.relaunch_screen = RelaunchScreen(
            draft.name, redact.Redactor(draft)(P.launch_command(draft)), self.cancel_relaunch
        )
        self.push_screen(self.relaunch_screen)
        self.relaunch_worker = self.run_relaunch(draft)

    @work(group="relaunch", exit_on_error=False)
    async def run_relaunch(self, preset: P.Preset) -> None:
        screen = self.relaunch_screen
        assert screen is not None  # action_relaunch pushes it before it starts this worker
        try:
            await self.session.relaunch(preset)
        except ControlError as e:
            screen.done(False, str(e), e.log_tail)
            self.say(str(e), "error")
            return
        except TransportError as e:
            screen.done(False, str(e))
            self.say(str(e), "error")
            return
        except asyncio.CancelledError:
            self.say("relaunch cancelled; the half-started server was stopped", "warning")
            if not screen.finished:
                screen.done(False, "cancelled")
            raise
        self.refresh_views()  # the new server's lines not drawn yet (a busy machine) go to its view first
        screen.done(True)
        self.opened_not_launched = False
        if self.draft == preset:  # else the user edited while it started: keep the newer edits
            self.config.load(preset)
            self.draft = preset
        self._dirty_runs = True
        self.say(f"{preset.name} ready")

    def live_change(self, draft: P.Preset) -> tuple[int | str | None, str | None]:
        """(the step count to hold, "release", or None: a relaunch; why a relaunch is needed where the
        launch is prepared to switch). Live when the draft differs from what the launch was launched
        with in its step count alone, and the launch is prepared for that count (docs/switch.md)."""
        s = self.session
        rec, base = s.record, s.launched_preset
        if rec is None or not rec.switch or base is None or s.state.state != "ready":
            return None, None
        changed = [k for k, _a, _b in P.diff(base, draft, include_bench=False)]
        e = draft.engine
        if not changed:
            return ("release" if s.held is not None else None), None
        own = e.static_config(draft) if draft.is_speculative else None
        k = own[0] if own is not None else None
        if changed == [e.step_key] and k in rec.switch:
            return k, None
        if changed == [e.step_key] and k is None:
            return None, f"relaunching: the draft's schedule sets no single {e.step_name} to hold"
        if changed == [e.step_key]:
            return (
                None,
                f"relaunching: {e.step_name} {k} is not one the running launch is prepared to hold ({rec.switch})",
            )
        what = ", ".join(changed[:3]) + ("…" if len(changed) > 3 else "")
        return None, (
            f"relaunching: the running launch switches only {e.step_name} among {rec.switch} live, and this "
            f"change is {what}"
        )

    @work(group="relaunch", exit_on_error=False)
    async def run_switch(self, preset: P.Preset, steps: int | None) -> None:
        """A step count applied to the running launch in seconds, through the engine's switch (no relaunch)."""
        word = preset.engine.step_name
        t0 = time.monotonic()
        try:
            ack = await self.session.hold(steps, preset=preset)
        except (SwitchError, ControlError, TransportError) as e:
            self.say(str(e), "error")
            return
        took = time.monotonic() - t0
        if ack.held is None:
            self.say(
                f"released in {took:.1f} s: the engine's own {preset.engine.own_choice} chooses {word} again (no relaunch)"
            )
        else:
            self.say(
                f"{word} {ack.held} held live in {took:.1f} s (no relaunch); r with the launch's own value releases it"
            )
        self._dirty_runs = True

    def cancel_relaunch(self) -> None:
        if self.relaunch_worker is not None:
            self.relaunch_worker.cancel()

    def action_nccl_report(self) -> None:
        rows, note = self.session.nccl_report() if self.live else ([], None)
        if not rows:
            self.say("no NCCL variables in this preset to confirm")
            return
        self.say(
            "; ".join(f"{k}: {state}" for k, state, _ in rows) + (f" ({note})" if note else ""),
            "warning" if note else "information",
        )

    def session_refusal(self) -> str | None:
        """Why the live session may not relaunch or stop its server (a server started by hand)."""
        refusal = getattr(self.session, "refusal", None)
        return refusal() if self.live and refusal is not None else None

    def action_confirm_stop_server(self) -> None:
        if why := self.session_refusal():
            self.say(why, "error")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.run_worker(self.action_stop_server(), group="stop", exit_on_error=False)

        self.push_screen(
            ConfirmScreen(
                f"Stop the server of {self.session.preset.name} (pid {self.session.state.pid or '?'})?",
                "Stop it [s]",
                "s",
            ),
            done,
        )

    async def action_stop_server(self) -> None:
        try:
            self.say(await self.session.stop_server())
        except (ControlError, TransportError) as e:
            self.say(str(e), "error")

    async def action_quit(self) -> None:
        self.action_quit_app()  # the palette's "Quit" too goes through the dialog

    def action_quit_app(self) -> None:
        if isinstance(self.screen, QuitScreen):
            return
        st = self.session.state.state if self.live else None
        if st not in ("ready", "starting"):  # nothing of ours runs: nothing to ask
            self.run_worker(self._close_session(False), group="quit", exit_on_error=False)
            return

        def done(choice: str | None) -> None:
            if choice in ("leave", "stop"):
                self.run_worker(self._close_session(choice == "stop"), group="quit", exit_on_error=False)

        self.push_screen(
            QuitScreen(self.session.preset.name, starting=st == "starting", default_stop=self.stop_on_quit), done
        )

    async def _close_session(self, stop_server: bool) -> None:
        self.cancel_relaunch()  # a start in progress is stopped, never left half-started
        try:
            await self.session.close(stop_server=stop_server)
        except (ControlError, TransportError) as e:
            self.messages.append(str(e))
        except Exception as e:  # noqa: BLE001 - whatever the clean-up hit, quitting still quits
            self.messages.append(f"closing the session failed: {type(e).__name__}: {e}")
        finally:
            self.exit()
