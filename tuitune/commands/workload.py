"""`tuitune workload show|from-log`: the prompts a benchmark sends, described, or recorded from the
server's own request log (so that bench, ab, sweep, tune and advise measure the traffic it serves)."""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics

from tuitune.commands.common import CliError, guarded, load_preset, open_lines, run_async, with_control


def workload_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("show", help="a prompt file as a workload: its name, hash, prompts and output lengths")
    s.add_argument("file", help="a prompt file (one a line, JSONL, or ShareGPT JSON)")
    s.set_defaults(run=cmd_show)
    s = sub.add_parser(
        "from-log",
        help="the requests a server logged (prompts after their chat template, output lengths) as a JSONL prompt file",
    )
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("preset", nargs="?", help="read this preset's server log (on its target, over SSH if remote)")
    g.add_argument("--log", help="read this log file instead (- for standard input); needs --engine")
    s.add_argument("--engine", choices=_engine_names(), help="whose log --log is (a preset says its own)")
    s.add_argument("--out", required=True, help="the JSONL file to write (replaced atomically)")
    s.add_argument("--last", type=int, metavar="N", help="keep only the last N requests (the recent traffic)")
    s.set_defaults(run=cmd_from_log)


def _engine_names() -> tuple[str, ...]:
    from tuitune.engines import NAMES

    return NAMES


def cmd_show(ns) -> int:
    from tuitune.measure.workload import load

    w = load(ns.file)
    lengths = [it.max_tokens for it in w.items if it.max_tokens is not None]
    chars = [len(it.prompt) for it in w.items]
    print(f"workload: {w.label}")
    print(f"  prompts: {len(w.items)}, {min(chars)}-{max(chars)} characters (median {statistics.median(chars):.0f})")
    if lengths:
        print(
            f"  output lengths from the data: {len(lengths)} of {len(w.items)}, {min(lengths)}-{max(lengths)} tokens "
            f"(median {statistics.median(lengths):.0f})"
            + ("" if len(lengths) == len(w.items) else "; the others get the run's --max-tokens")
        )
    else:
        print("  output lengths: none in the data (each request gets the run's --max-tokens)")
    return 0


def _masker(preset=None):
    """What looks like a credential in a prompt, masked (the preset's own secret values too); the
    prompt kept whole otherwise (no clipping: a clipped prompt would be another prompt)."""
    from functools import partial

    from tuitune.base.redact import secret_values, text

    return partial(text, values=secret_values(preset) if preset is not None else [])


def cmd_from_log(ns) -> int:
    from tuitune.engines import get
    from tuitune.measure.workload import from_log, write_jsonl

    if ns.last is not None and ns.last < 1:
        raise CliError(f"--last {ns.last}: keep at least one request", 2)
    if ns.log is not None:
        if not ns.engine:
            raise CliError("--log needs --engine (sglang or vllm): whose request lines to read", 2)
        engine = get(ns.engine)
        got = from_log(open_lines(ns.log), engine, _masker(), keep=ns.last)
        where = ns.log
    else:
        p = load_preset(ns.preset)
        if ns.engine and ns.engine != p.server.engine:
            raise CliError(f"--engine {ns.engine}: {p.name} runs {p.server.engine}", 2)
        engine = p.engine
        got = _from_target(p, engine, ns.last)
        where = f"{p.name}'s log ({p.server.log})"
    items = list(got.items)
    if not items:
        why = f"; {got.cut} had their prompt cut short by the log" if got.cut else ""
        raise CliError(
            f"{where} names no request whose prompt can be replayed{why}: {engine.request_logging or ''}".rstrip(": "),
            1,
        )
    w = write_jsonl(items, ns.out)
    print(f"wrote {ns.out}: workload {w.label}, from {where}")
    notes = []
    if got.total > len(items):
        notes.append(f"the last {len(items)} of {got.total} requests")
    if got.cut:
        notes.append(f"{got.cut} left out: the log cut their prompt short ({engine.request_logging})")
    if got.unlengthed:
        notes.append(f"{got.unlengthed} without an output length in the log (they get the run's --max-tokens)")
    if got.masked:
        notes.append(f"{got.masked} with what looks like a credential masked")
    for n in notes:
        print(f"  {n}")
    return 0


def _from_target(p, engine, keep: int | None):
    """The preset's server log, read through its target (streamed: a log may be gigabytes)."""
    from tuitune.measure.workload import FromLog
    from tuitune.preset import shell_path

    t, _ = with_control(p)
    mask = _masker(p)

    async def go():
        log = shell_path(p.server.log)
        r = await t.run(f"test -r {log} && echo readable", timeout=30)
        if "readable" not in r.stdout:
            raise CliError(f"{t.label}: cannot read {p.server.log} (no such file, or not readable)", 1)
        got = FromLog(engine, mask, keep)
        # a stream runs until we close it: the file's end is a line of our own after it
        end = f"tuitune-log-end-{secrets.token_hex(8)}"
        pending = b""
        async with contextlib.aclosing(t.stream(f"cat -- {log} && printf '\\n%s\\n' {end}")) as chunks:
            async for data in chunks:
                *whole, pending = (pending + data).split(b"\n")
                for raw in whole:
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    if line == end:
                        return got
                    got.feed(line)
        raise CliError(f"{t.label}: {p.server.log} could not be read to its end", 1)

    return run_async(guarded(go, t))


PARSERS = {"workload": workload_args}
