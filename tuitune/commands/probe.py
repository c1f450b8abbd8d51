"""`tuitune probe check`: which phases the EAGLE3_PROFILE probe can patch in an SGLang or vLLM tree."""

from __future__ import annotations

import argparse

from tuitune.commands.common import CliError, print_json


def probe_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("check", help="read SGLang's source (ast, no import, no GPU) and report the patchable phases")
    s.add_argument("--sglang-path", help="the sglang package directory (default: the one this python finds)")
    s.add_argument("--vllm-path", help="check a vLLM tree instead: the vllm package directory")
    s.add_argument(
        "--engine",
        choices=["sglang", "vllm"],
        help="the engine installed for this python to check (default sglang, or vllm with --vllm-path)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_probe_check)
    i = sub.add_parser(
        "install", help="copy the probe to a preset's target (for a server started by hand) and check it there"
    )
    i.add_argument("preset")
    i.set_defaults(run=cmd_probe_install)


def cmd_probe_install(ns) -> int:
    from tuitune.commands.common import guarded, load_preset, run_async, with_control
    from tuitune.probe import REMOTE_DIR

    p = load_preset(ns.preset)
    t, control = with_control(p)

    async def go():
        report = await control.nodes[0].install_probe()
        print(f"probe copied to {REMOTE_DIR} on {t.label}")
        if not report.get("ok"):
            raise CliError(f"the probe cannot time every phase there: {report.get('error') or report}", 1)
        print("patchable phases: " + ", ".join(report.get("phases") or []))
        return 0

    return run_async(guarded(go, t, control))


def cmd_probe_check(ns) -> int:
    import os

    from tuitune import engines
    from tuitune.probe import check

    engine = ns.engine or ("vllm" if ns.vllm_path else "sglang")
    path = ns.vllm_path or ns.sglang_path
    label = engines.label(engine)
    if path and not os.path.isdir(path):
        raise CliError(f"{path}: not a directory (give the {engine} package directory)", 2)
    try:
        report = check(path, engine)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {label}'s source: {e}", 1) from None
    if ns.json:
        print_json(report)
        return 0 if report.get("ok") else 1
    if report.get("error"):
        raise CliError(report["error"], 1)
    print(f"{label} {report.get('version') or '(version unknown)'} at {report['sglang']}")
    if not report["modules"]:
        print(
            "  no EAGLE module found"
            + (
                " (neither v1 eagle_worker.py nor v2 eagle_worker_v2.py)"
                if engine == "sglang"
                else " (no V1 model runner or proposer)"
            )
        )
    for module, entries in report["modules"].items():
        print(f"  {module}")
        for name, entry in entries.items():
            print(f"    {'ok     ' if entry['found'] else 'MISSING'} {name} ({entry['phase']})")
    print(
        "patchable phases: "
        + (", ".join(report["phases"]) or "none")
        + ("" if report["ok"] else "  -> the server would run unprofiled")
    )
    return 0 if report["ok"] else 1


PARSERS = {"probe": probe_args}
