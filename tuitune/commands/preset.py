"""`tuitune preset list|show|validate|diff|lint|schema|discover`."""

from __future__ import annotations

import argparse
import sys

from tuitune.commands.common import CliError, add_discover_args, discovered_preset, load_preset, print_json


def preset_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("list", help="shipped presets and yours (~/.config/tuitune/presets), where each runs")
    s.add_argument(
        "--json", action="store_true", help="origin, name, path, description (or error), where it runs, if it can here"
    )
    s.set_defaults(run=cmd_preset_list)
    s = sub.add_parser("show", help="the resolved preset (derived values marked), or its command")
    s.add_argument("preset")
    s.add_argument("--command", action="store_true", help="print the launch command only")
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--yaml",
        action="store_true",
        help="the preset as a file to save and edit (`preset validate` reads it back); secrets masked unless --reveal",
    )
    s.add_argument("--reveal", action="store_true", help="show secret values (tokens, keys, passwords) in clear")
    s.set_defaults(run=cmd_preset_show)
    s = sub.add_parser("validate", help="check presets (all of them without an argument); exit 2 if any is invalid")
    s.add_argument("presets", nargs="*", help="names or files (default: every preset `preset list` shows)")
    s.add_argument("--json", action="store_true", help="one result per preset: ok, hash, warnings or error")
    s.set_defaults(run=cmd_preset_validate)
    s = sub.add_parser("diff", help="changed keys between two presets; exit 0 the same, 1 they differ (as diff)")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_preset_diff)
    s = sub.add_parser("lint", help="cross-setting advice")
    s.add_argument("preset")
    s.set_defaults(run=cmd_preset_lint)
    s = sub.add_parser("schema", help="the preset schema as JSON Schema")
    s.set_defaults(run=cmd_preset_schema)
    s = sub.add_parser(
        "discover",
        help="the preset of a server started by hand, read off its process (its flags, environment and log)",
    )
    add_discover_args(s, required=True)
    s.add_argument("--name", help="the preset's name (default: ENGINE-PORT)")
    s.add_argument("--save", action="store_true", help="write it to your presets (~/.config/tuitune/presets/NAME.yaml)")
    s.add_argument("--reveal", action="store_true", help="show secret values (tokens, keys, passwords) in clear")
    s.set_defaults(run=cmd_preset_discover)


def cmd_preset_list(ns) -> int:
    from tuitune import preset as P
    from tuitune.machine.ssh import SshTarget, reachable

    rows = P.where_they_run(P.entries(), lambda t: reachable(SshTarget(t.host, t.port, t.user)))
    if ns.json:
        print_json([P.entry_json(e) for e in rows])
        return 0
    if not rows:
        print(f"no presets in {P.user_dir()} or {P.shipped_dir()}")
        return 0
    print(P.format_listing(rows))
    print(f"\nuser presets: {P.user_dir()}")
    return 0


def _fmt(v) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def cmd_preset_show(ns) -> int:
    from tuitune import preset as P
    from tuitune.base import redact

    p = load_preset(ns.preset)
    shown = (lambda text: text) if ns.reveal else redact.Redactor(p)
    if ns.command:
        print(shown(P.launch_script(p)))
        return 0
    if ns.yaml:
        sys.stdout.write(shown(P.dumps(p)))
        return 0
    flat = P.flatten(p) if ns.reveal else redact.flat(P.flatten(p))
    if ns.json:
        print_json(
            {
                "name": p.name,
                "hash": p.hash(),
                "resolved": flat,
                "derived": sorted(P.derived_keys(p)),
                "command": shown(P.launch_script(p)),
            }
        )
        return 0
    derived = P.derived_keys(p)
    print(f"# {p.name}  (hash {p.hash()})")
    if p.description:
        print(f"# {p.description}")
    width = max(len(k) for k in flat)
    for k, v in flat.items():
        mark = "   (derived)" if k in derived else ""
        print(f"{k:<{width}}  {_fmt(v)}{mark}")
    for w in P.warnings(p):
        print(f"warning: {w}")
    for n in P.notes(p):
        print(f"note: {n}")
    return 0


def cmd_preset_validate(ns) -> int:
    from tuitune import preset as P

    listed = [] if ns.presets else P.listing()  # every preset is read once, not once a use
    names = ns.presets or [str(path) for _, path, _, _ in listed]
    if not names:
        print(f"no presets in {P.user_dir()} or {P.shipped_dir()}")
        return 0
    shown = {str(path): f"{origin} {path.stem}" for origin, path, _, _ in listed}
    notes: dict[str, list[str]] = {}  # a deliberate choice is said once, with who makes it
    if ns.json:
        out: list[dict] = []
        failed = False
        for name in names:
            try:
                path = P.find(name)
                p = P.load(path)
                out.append(
                    {
                        "preset": name,
                        "ok": True,
                        "name": p.name,
                        "hash": p.hash(),
                        "warnings": P.warnings(p) + P.file_warnings(path, p),
                        "notes": P.notes(p),
                    }
                )
            except P.PresetError as e:
                failed = True
                out.append({"preset": name, "ok": False, "error": str(e)})
        print_json(out)
        return 2 if failed else 0
    bad = warned = 0
    for name in names:
        label = shown.get(name, name)
        try:
            path = P.find(name)
            p = P.load(path)
        except P.PresetError as e:
            print(f"tuitune: {e}", file=sys.stderr)
            bad += 1
            continue
        ws = P.warnings(p) + P.file_warnings(path, p)
        warned += bool(ws)
        for n in P.notes(p):
            notes.setdefault(n, []).append(p.name)
        what = f"hash {p.hash()}" if name in shown and path.stem == p.name else f"{p.name}, hash {p.hash()}"
        print(f"{label}: ok ({what})" + (f", {len(ws)} warning(s)" if ws else ""))
        for w in ws:
            print(f"  warning: {w}")
    for n, who in notes.items():
        print(f"note: {n}: {', '.join(who)}")
    if len(names) > 1:
        print(f"{len(names)} presets: {len(names) - bad} valid ({warned} with warnings), {bad} invalid")
    return 2 if bad else 0


def cmd_preset_diff(ns) -> int:
    from tuitune import preset as P
    from tuitune.base import redact

    a, b = load_preset(ns.a), load_preset(ns.b)
    changes = P.diff(a, b)
    if ns.json:
        print_json(
            [
                {"key": k, "a": ra, "b": rb, **({"differ": va != vb} if note else {})}
                for k, va, vb in changes
                for ra, rb, note in [redact.pair(k, va, vb)]
            ]
        )
        return 1 if changes else 0
    if not changes:
        print(f"{a.name} and {b.name} launch the same server")
        return 0
    width = max(len(k) for k, _, _ in changes)
    print(f"{'key':<{width}}  {a.name} -> {b.name}")
    for k, va, vb in changes:
        va, vb, note = redact.pair(k, va, vb)
        print(f"{k:<{width}}  {_fmt(va)} -> {_fmt(vb)}{note}")
    return 1  # as diff(1): 0 the same, 1 they differ, 2 trouble


def cmd_preset_lint(ns) -> int:
    from tuitune import preset as P

    p = load_preset(ns.preset)
    advice = P.lint(p) + P.file_warnings(P.find(ns.preset), p)
    if not advice:
        print(f"{p.name}: no advice")
    for a in advice:
        print(f"- {a}")
    return 0


def cmd_preset_discover(ns) -> int:
    """Print (or ``--save``) the preset of the server ``--port`` / ``--pid`` names."""
    from tuitune import preset as P
    from tuitune.base import redact

    if ns.name is not None and not P.NAME_RE.fullmatch(ns.name):
        raise CliError(f"--name {ns.name!r} is not a preset name (letters, digits, . _ -)", 2)
    p = discovered_preset(ns, name=ns.name)
    if not ns.save:
        sys.stdout.write(P.dumps(p) if ns.reveal else redact.Redactor(p)(P.dumps(p)))
        return 0
    path = P.user_dir() / f"{p.name}.yaml"
    if path.exists():
        raise CliError(f"{path} exists already; give the new preset another --name", 2)
    P.save(p, path)
    print(f"wrote {path}: `tuitune adopt {p.name}` makes the server tuitune's, `tuitune status {p.name}` shows it")
    return 0


def cmd_preset_schema(ns) -> int:
    from tuitune import preset as P

    print_json(P.json_schema())
    return 0


PARSERS = {"preset": preset_args}
