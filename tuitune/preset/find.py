"""Where presets are found: a path, the user's directory, or the shipped ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tuitune.preset.io import load
from tuitune.preset.model import SIM_MODULE, Preset, PresetError, Target


def shipped_dir() -> Path:
    """An installed package holds the presets as tuitune/presets; a source checkout at the top level
    (tuitune/presets links there: the path shown is the real one, presets/)."""
    here = Path(__file__).resolve().parent.parent  # the tuitune package
    installed = here / "presets"
    return (installed if installed.is_dir() else here.parent / "presets").resolve()


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuitune" / "presets"


def find(name_or_path: str) -> Path:
    """A preset file from a path or a name in the user's or the shipped directory."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") and p.exists() or p.is_file():
        return p
    for d in (user_dir(), shipped_dir()):
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.is_file():
                return cand
    raise PresetError(
        f"{name_or_path}: no such preset file, and no preset of that name in "
        f"{user_dir()} or {shipped_dir()} (see `tuitune preset list`)"
    )


def resolve(name_or_path: str) -> Preset:
    return load(find(name_or_path))


def listing() -> list[tuple[str, Path, str, str]]:
    """(origin, path, name, description or error) of every preset in the user's and the shipped directory."""
    out = []
    for origin, d in (("user", user_dir()), ("shipped", shipped_dir())):
        if not d.is_dir():
            continue
        for path in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
            try:
                p = load(path)
                out.append((origin, path, p.name, p.description or ""))
            except PresetError as e:
                out.append((origin, path, "(invalid)", str(e)))
    return out


def json_schema() -> dict:
    schema = Preset.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tuitune preset"
    return schema


# ---- where each preset runs, and whether it can run from here now -----------------------------------


@dataclass
class Entry:
    """A row of `preset list`: the preset (None when its file is invalid), where it runs, and why it
    cannot run here now (None: it can, as far as a quick look tells)."""

    origin: str  # user | shipped
    path: Path
    name: str
    description: str  # or the error of an invalid file
    preset: Preset | None
    runs_on: str = ""
    not_here: str | None = None
    shadows: Path | None = None  # a user preset of a shipped preset's name: the one `find` picks


def runs_on(p: Preset) -> str:
    """simulator | local (ENGINE) | ssh USER@HOST, with the node count of a multi-node server."""
    sim = p.server.module == SIM_MODULE
    nodes = [p.target.node_target(i) for i in range(len(p.target.nodes))] if p.target.nodes else [p.target]
    remote = [t.label() for t in nodes if not t.is_local]
    what = "simulator" if sim else p.engine.label
    if not remote:
        return ("simulator" if sim else f"local ({what})") + (f", {len(nodes)} nodes" if len(nodes) > 1 else "")
    where = f"ssh {remote[0]}" if len(nodes) == 1 else f"ssh, {len(nodes)} nodes: {'+'.join(t.label() for t in nodes)}"
    return where + (" (simulator)" if sim else "")


_FIND_SPEC = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"


def _local_problem(p: Preset) -> str | None:
    """A local server needs its python and, for a real engine, its module there."""
    python = os.path.expanduser(p.python())
    exe = python if os.sep in python else shutil.which(python)
    if not exe or not os.access(exe, os.X_OK):
        return f"{p.python()} is not here"
    if p.server.module == SIM_MODULE and exe == sys.executable:
        return None
    top = p.server.module.split(".")[0]
    try:
        r = subprocess.run([exe, "-c", _FIND_SPEC, top], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{p.python()} does not run ({e})"
    return None if r.returncode == 0 else f"{top} is not installed for {p.python()}"


def where_they_run(entries: list[Entry], reach: Callable[[Target], str | None]) -> list[Entry]:
    """Fill ``runs_on`` and ``not_here``: local servers by their python and module, remote ones by
    ``reach`` (the target layer's quick connection check), each machine once, all at once."""
    checks: dict[tuple, Callable[[], str | None]] = {}
    wanted: dict[int, list[tuple]] = {}
    for i, e in enumerate(entries):
        if e.preset is None:
            continue
        e.runs_on = runs_on(e.preset)
        keys = []
        for n in e.preset.node_presets():
            t = n.target
            if t.is_local:
                key: tuple = ("local", n.python(), n.server.module)
                checks.setdefault(key, partial(_local_problem, n))
            else:
                key = ("ssh", t.host, t.port, t.user)
                checks.setdefault(key, partial(reach, t))
            keys.append(key)
        wanted[i] = keys
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = dict(zip(checks, pool.map(lambda f: f(), checks.values()), strict=True))
    for i, keys in wanted.items():
        entries[i].not_here = next((results[k] for k in keys if results[k]), None)
    return entries


def entries() -> list[Entry]:
    """Every preset in the user's and the shipped directory (as ``listing``), with the shipped
    presets that a user preset of the same name hides from `tuitune NAME`."""
    shipped = {}
    out = []
    for origin, path, name, desc in listing():
        try:
            p = load(path) if name != "(invalid)" else None
        except PresetError:
            p = None
        out.append(Entry(origin, path, name, desc, p))
        if origin == "shipped":
            shipped[path.stem] = path
    for e in out:
        if e.origin == "user" and e.path.stem in shipped:
            e.shadows = shipped[e.path.stem]
    return out


def shadowed(name: str) -> Path | None:
    """The shipped preset a user preset called ``name`` would hide (`find` looks in the user's
    directory first), or None."""
    for ext in (".yaml", ".yml"):
        cand = shipped_dir() / f"{name}{ext}"
        if cand.is_file():
            return cand
    return None


def entry_json(e: Entry) -> dict:
    """One entry of `preset list --json` (the old keys, then where it runs and whether it can here)."""
    out = {
        "origin": e.origin,
        "name": e.preset.name if e.preset else None,
        "path": str(e.path),
        "valid": e.preset is not None,
        ("description" if e.preset else "error"): e.description,
    }
    if e.preset is not None:
        out |= {"runs_on": e.runs_on, "runs_here": e.not_here is None, "why_not": e.not_here}
    if e.shadows:
        out["shadows"] = str(e.shadows)
    return out


def format_listing(rows: list[Entry]) -> str:
    """The `preset list` table: origin, name, where it runs, whether it can run here now, description;
    a user preset hiding a shipped one of its name says so."""
    name_w = max(len(e.name) for e in rows)
    where_w = max([len(e.runs_on) for e in rows] + [len("runs on")])
    here = ["yes" if e.preset and not e.not_here else "no" if e.preset else "-" for e in rows]
    lines = [f"{'origin':<8} {'name':<{name_w}}  {'runs on':<{where_w}}  here  description"]
    for e, ok in zip(rows, here, strict=True):
        desc = e.description
        if e.shadows:
            desc = f"(hides the shipped {e.path.stem}) {desc}"
        lines.append(f"{e.origin:<8} {e.name:<{name_w}}  {e.runs_on:<{where_w}}  {ok:<4}  {desc}".rstrip())
    why: dict[str, list[str]] = {}
    for e in rows:
        if e.preset and e.not_here:
            why.setdefault(e.not_here, []).append(e.name)
    if why:
        lines.append("")
        for reason, names in why.items():
            lines.append(f"not here: {reason} ({', '.join(names)})")
    return "\n".join(lines)
