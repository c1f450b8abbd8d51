"""What the cost model is fitted from: launches read from captures or from a running server's log.

A capture is one launch (its metadata names the preset, so the configuration is known); a preset
means "the server it runs now": its log is read over the transport (the last few MB: profile
windows and decode lines), exactly what a real server exposes. Goodput measured by `tuitune
tune` lives in its ``tune.jsonl`` beside the captures and is picked up with them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.base.jsonl import read_rows
from tuitune.decide.launch import OFF, Config, Launch, config_of_window
from tuitune.measure.parse import parse_line

LOG_BYTES = 4_000_000  # of the server's log read for advice (tens of thousands of windows)


class ObserveError(TuituneError):
    code = 2


def preset_config(p: P.Preset) -> Config | None:
    """The configuration a preset runs, as its engine spells it; None when the engine picks at start."""
    if not p.is_speculative:
        return OFF
    shape = p.engine.static_config(p)
    return Config(*shape) if shape is not None else None


def _config(p: P.Preset | None, windows: list[ProfileWindow]) -> Config:
    known = preset_config(p) if p is not None else None
    if known is not None:
        return known
    configs = [c for c in map(config_of_window, windows) if c is not None]
    return max(set(configs), key=configs.count) if configs else OFF


def _tune_goodput(path: Path) -> dict[int, float]:
    """Goodput `tuitune tune` measured for this capture (its tune.jsonl), if any."""
    from tuitune.experiments.tunelog import row_problem  # (tune builds on this module)

    log = path.parent.parent / "tune.jsonl"
    if not log.is_file():
        return {}
    for row in read_rows(log, check=row_problem, warn=None):  # a damaged row is tune's to name, not advise's
        if row.get("kind") == "launch" and Path(str(row.get("capture", ""))).name == path.name:
            return {int(k): float(v) for k, v in (row.get("goodput") or {}).items()}
    return {}


def launch_from_capture(path: str) -> Launch:
    from tuitune.measure.capture import CaptureError, capture_stats, partial, read_capture

    try:
        cap = read_capture(path)
    except CaptureError as e:
        raise ObserveError(str(e)) from None
    for said in (partial(path, capture_stats(cap)), cap.note):
        if said:  # the advice rests on what was read: said, never silent
            print(f"tuitune: warning: {said}", file=sys.stderr)
    try:
        p = P.from_dict(cap.meta.get("preset") or {}, path) if cap.meta.get("preset") else None
    except P.PresetError:
        p = None
    windows = [r.event for r in cap.records if isinstance(r.event, ProfileWindow)]
    decodes = [r.event for r in cap.records if isinstance(r.event, DecodeStats)]
    return Launch(
        _config(p, windows),
        windows,
        decodes,
        _tune_goodput(Path(path)),
        label=path,
        engine=p.server.engine if p is not None else "sglang",
    )


async def launch_from_server(p: P.Preset) -> Launch:
    from tuitune.machine.control import ServerControl
    from tuitune.machine.transport import for_preset

    t = for_preset(p)
    try:
        await t.connect()
        st = await ServerControl(t, p).status()
        if not st.running:
            raise ObserveError(f"{p.name}: no server running on {t.label} (launch it, or give captures)", 1)
        r = await t.run(f"tail -c {LOG_BYTES} {P.shell_path(p.server.log)}", timeout=60)
        if not r.ok:
            raise ObserveError(f"{t.label}: cannot read {p.server.log}: {r.stderr.strip()[:200]}", 1)
    finally:
        await t.close()
    events = [e for e in map(parse_line, r.stdout.splitlines()) if e is not None]
    windows = [e for e in events if isinstance(e, ProfileWindow)]
    if not windows:
        raise ObserveError(
            f"{p.server.log}: no EAGLE3_PROFILE windows yet (the preset needs profile: true and the "
            f"server some load, e.g. `tuitune bench {p.name}`)",
            1,
        )
    return Launch(
        _config(p, windows),
        windows,
        [e for e in events if isinstance(e, DecodeStats)],
        label=p.name,
        engine=p.server.engine,
    )


def _is_preset(src: str) -> bool:
    path = Path(src)
    return not path.is_file() or path.suffix in (".yaml", ".yml")


async def launches_from(sources: list[str]) -> tuple[list[Launch], Config, int]:
    """The launches behind ``sources``, the running (last) configuration, and the load seen."""
    launches: list[Launch] = []
    load = None
    for src in sources:
        if _is_preset(src):
            try:
                p = P.resolve(src)
            except P.PresetError as e:
                raise ObserveError(str(e)) from None
            launches.append(await launch_from_server(p))
            load = p.bench.concurrency
        else:
            launches.append(launch_from_capture(src))
    engines = sorted({ln.engine for ln in launches})
    if len(engines) > 1:
        raise ObserveError(
            f"the launches come from different engines ({' and '.join(engines)}): one cost "
            f"model cannot describe both; advise on one engine's launches at a time"
        )
    if not any(ln.windows for ln in launches):
        raise ObserveError(
            "no EAGLE3_PROFILE windows in "
            + ", ".join(sources)
            + " (record with profile: true while the server decodes)",
            1,
        )
    last = launches[-1]
    if load is None:
        bss = [w.bs for w in last.windows if w.bs] or [w.bs for ln in launches for w in ln.windows if w.bs]
        load = max(1, round(median(bss))) if bss else 1
    return launches, last.config, load
