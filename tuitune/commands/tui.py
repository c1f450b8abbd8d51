"""The TUI and what shares its entry: `tuitune [PRESET]` (the TUI, or `--record OUT` headless),
`tuitune demo` (against the built-in simulator) and `tuitune replay CAPTURE`."""

from __future__ import annotations

import argparse
import sys

from tuitune.commands.common import (
    CliError,
    discovered_preset,
    load_preset,
    run_async,
    wants_discovery,
)


def _run_tui(session, **kw) -> int:
    from tuitune.tui.app import TuituneApp

    app = TuituneApp(session, **kw)
    app.run()
    return 0


# the real engines' CPU demos: (preset, what builds it, what it is)
REAL_DEMOS = {
    "vllm": ("vllm-cpu-demo", "make demo-vllm", "the vLLM CPU engine", "about 3.4 GB and a few minutes"),
    "sglang": ("sglang-cpu-demo", "make demo-sglang", "the SGLang CPU engine", "about 4 GB and 5-8 minutes"),
}


def demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        type=int,
        help="serve the simulator on this port instead of the preset's 30123 (two demos side by side; tests)",
    )
    p.add_argument(
        "--engine",
        choices=["sim", *REAL_DEMOS],
        default="sim",
        help="vllm / sglang: a real vLLM or SGLang on this machine's CPU (presets/vllm-cpu-demo.yaml, "
        "presets/sglang-cpu-demo.yaml; `make demo-vllm` / `make demo-sglang` build them)",
    )
    p.set_defaults(run=cmd_demo)


def cmd_demo(ns) -> int:
    from pathlib import Path

    from tuitune import preset as P
    from tuitune.machine.session import Session

    real = REAL_DEMOS.get(ns.engine)
    name = real[0] if real else "demo"
    path = P.shipped_dir() / f"{name}.yaml"
    preset = load_preset(str(path))
    if real and not Path(preset.python()).expanduser().exists():
        _, make, what, size = real
        raise CliError(
            f"{what} is not built here ({preset.python()} does not exist): run `{make}` in a clone of "
            f"tuitune (it builds it once, {size}, then opens this demo)",
            2,
        )
    if ns.port is not None:
        if not 1 <= ns.port <= 65535:
            raise CliError(f"--port must be between 1 and 65535 (got {ns.port})", 2)
        preset = P.with_changes(
            preset, {"server.port": ns.port, "server.log": f"~/.cache/tuitune/logs/{name}-{ns.port}.log"}
        )
    _demo_port_check(preset)
    # the demo owns the simulator it starts: quitting stops it unless asked otherwise
    return _run_tui(
        Session(preset), autostart="launch-if-stopped", load_on_start=True, preset_path=path, stop_on_quit=True
    )


def _demo_port_check(preset) -> None:
    """The demo's port held by a program the demo did not start: one sentence that names ``--port``
    (with a free port) before the TUI opens, not a refusal inside it. Its own server: attached."""
    import socket

    from tuitune.machine.control import ServerControl
    from tuitune.machine.transport import LocalTransport

    port = preset.server.port
    with socket.socket() as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return  # nothing listens
    control = ServerControl(LocalTransport(), preset)
    st = run_async(control.status())
    if st.running and control.foreign(st.record) is None:
        return
    raise CliError(
        f"port {port} is in use by a program the demo did not start; "
        f"run the demo on a free port: `tuitune demo --port {_free_port(port)}`",
        2,
    )


def _free_port(near: int) -> int:
    """A port that is free now: the first after ``near``, else one the system picks."""
    import socket

    for port in [*range(near + 1, min(near + 100, 65536)), 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    return near + 1


def _preset_of(ns):
    """(the preset, its file): the PRESET named, or one read off the server --port / --pid name."""
    from tuitune import preset as P

    if wants_discovery(ns):
        if ns.preset is not None:
            raise CliError("give a PRESET or the server's --port / --pid, not both", 2)
        return discovered_preset(ns), None
    path = P.find(ns.preset)
    return load_preset(str(path)), path


def cmd_tui(ns) -> int:
    from tuitune.machine.session import Session

    if ns.preset is None and not wants_discovery(ns):
        ns.show_help()
        return 0
    preset, path = _preset_of(ns)
    session = Session(preset)
    _guard_against(session, ns)
    return _run_tui(session, autostart="attach", preset_path=path)


def _guard_against(session, ns) -> None:
    """``--against CAPTURE``: the acceptance guard compares with that capture, not the launch's first cycles."""
    if not getattr(ns, "against", None):
        return
    from tuitune.measure.capture import CaptureError
    from tuitune.measure.guard import AcceptanceGuard, Baseline

    try:
        session.guard = AcceptanceGuard(baseline=Baseline.from_capture(ns.against))
    except (CaptureError, ValueError) as e:
        raise CliError(f"--against: {e}", 2) from None


def replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("capture")
    p.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1; 10 = ten times faster)")
    p.set_defaults(run=cmd_replay)


def cmd_replay(ns) -> int:
    from tuitune.measure.capture import Replay, capture_stats, partial, read_capture

    if ns.speed <= 0:
        raise CliError(f"--speed must be positive (got {ns.speed})", 2)
    cap = read_capture(ns.capture)
    for said in (partial(ns.capture, capture_stats(cap)), cap.note):
        if said:  # before the screen takes the terminal (the replay's state says "read in part" too)
            print(f"tuitune: warning: {said}", file=sys.stderr)
    return _run_tui(Replay(cap, ns.speed))


def cmd_main(ns) -> int:
    from tuitune.experiments.options import RecordOptions

    o = RecordOptions.from_cli_args(ns)
    if o.record:
        return cmd_record(ns, o)
    o.check()
    return cmd_tui(ns)


def cmd_record(ns, o) -> int:
    from tuitune.experiments.record import record

    if ns.preset is None and not wants_discovery(ns):
        raise CliError("--record needs a PRESET, or the server's --port / --pid", 2)
    o.check()
    p, _ = _preset_of(ns)
    from tuitune.machine.session import Session

    session = Session(p)
    _guard_against(session, ns)
    stats = run_async(record(p, o, session=session, progress=sys.stderr.isatty()))
    print(
        f"wrote {stats.events} events ({stats.windows} profile windows, {stats.cycles} cycles) to "
        f"{o.record}: {stats.bytes} bytes, {stats.seconds:.1f} s"
        + (f"; the acceptance guard raised {stats.alarms} alarm(s)" if stats.alarms else ""),
        file=sys.stderr,
    )
    return 0


PARSERS = {"demo": demo_args, "replay": replay_args}
