"""`tuitune parse|bench|report|gpus`: measuring: log lines as events, a server benchmarked (at one
load level or several), captures summarised, the target's GPUs."""

from __future__ import annotations

import argparse
import json
import sys
from itertools import chain

from tuitune.commands.common import (
    CliError,
    any_arg,
    bench_flags,
    check_positive,
    guarded,
    load_preset,
    open_lines,
    overrides,
    print_json,
    print_warnings,
    run_async,
    watch_link,
    with_control,
    write_json,
)


def parse_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a log file, or - for standard input")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.set_defaults(run=cmd_parse)


def cmd_parse(ns) -> int:
    from tuitune.base.redact import Redactor
    from tuitune.measure.parse import parse_chunks, summarize

    masked = Redactor().event  # error messages and malformed lines quote the log: mask what looks secret
    chunks = parse_chunks(open_lines(ns.file))
    if ns.json:
        import msgspec

        encode_lines = msgspec.json.Encoder().encode_lines  # NaN becomes null; unset fields are left out
        write = sys.stdout.buffer.write
        for evs in chunks:  # each chunk's events written at once, one JSON object a line
            write(encode_lines(map(masked, evs)))
        return 0
    s = summarize(map(masked, chain.from_iterable(chunks)))
    if not s["counts"]:
        print("no events (no line matched a known format)")
        return 0
    print(f"{'kind':<12} {'count':>8}")
    for kind, n in sorted(s["counts"].items(), key=lambda kv: -kv[1]):
        print(f"{kind:<12} {n:>8}")
    if s["profile_means"]:
        m = s["profile_means"]
        print("\nprofile means: " + "  ".join(f"{k} {v:.3f}" for k, v in m.items()))
    if s["decode_gen_throughput_mean"] is not None:
        print(f"decode gen throughput mean: {s['decode_gen_throughput_mean']:.2f} tok/s")
    return 0


def bench_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("preset", nargs="?")
    g.add_argument("--url", help="benchmark this server URL instead of a preset's")
    bench_flags(p, levels=True)
    p.add_argument(
        "--json",
        metavar="OUT",
        help="write every request and the summary (per level) as JSON (- for "
        "standard output; the human summary then goes to standard error)",
    )
    any_arg(p)
    p.set_defaults(run=cmd_bench)


def _bench_url(url: str) -> str:
    """``host:port`` means http://host:port (what people paste from a server's log)."""
    from urllib.parse import urlsplit

    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--url {url!r}: expected http://HOST:PORT (or HOST:PORT)", 2)
    return url


class _BenchProgress:
    """Requests done / total and the median rate so far, on standard error: one line rewritten on
    a terminal, a line every few requests otherwise (logs stay short)."""

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self.rates: list[float] = []
        self.tty = sys.stderr.isatty()

    def __call__(self, _i, r) -> None:
        self.done += 1
        if r.ok and r.decode_tok_s is not None:
            self.rates.append(r.decode_tok_s)
        med = sorted(self.rates)[len(self.rates) // 2] if self.rates else None
        line = f"bench: {self.done}/{self.total} requests" + (f" · {med:.1f} tok/s median so far" if med else "")
        if self.tty:
            print(f"\r{line}\x1b[K", end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)
        elif self.done == self.total or self.done % max(1, self.total // 5) == 0:
            print(line, file=sys.stderr, flush=True)


def cmd_bench(ns) -> int:
    from tuitune.measure.benchformat import format_levels, format_summary, level_row
    from tuitune.measure.levels import UrlBencher, bench_levels

    levels = ns.concurrency or [None]
    ov = overrides(ns, level=levels[0])  # checks the other flags before anything starts
    ov.pop("concurrency", None)  # each level's own

    def report(runs):
        summaries = [r.summary() for r in runs]
        human = format_summary(summaries[0]) if len(runs) == 1 else format_levels(summaries)
        print(human, file=sys.stderr if ns.json == "-" else sys.stdout)
        if ns.json:
            write_json(
                ns.json,
                runs[0].to_dict()
                if len(runs) == 1
                else {"levels": [r.to_dict() for r in runs], "curve": [level_row(s) for s in summaries]},
            )
        return 0 if all(r.ok and not r.failed for r in runs) else 1

    def starting(where: str):
        def on_level(cfg) -> _BenchProgress:
            if len(levels) > 1:
                print(f"concurrency {cfg.concurrency}…", file=sys.stderr, flush=True)
            print(f"bench: {cfg.warmup} warm-up + {cfg.requests} requests {where}…", file=sys.stderr)
            return _BenchProgress(cfg.requests)

        return on_level

    if ns.url:
        from tuitune.measure.serverinfo import BenchError

        url = _bench_url(ns.url)
        try:
            runs = run_async(bench_levels(UrlBencher(url), levels, ov, on_level=starting(f"against {url}")))
        except BenchError as e:  # the server speaks neither API: which --api to pass
            raise CliError(str(e), 2) from None
        return report(runs)
    p = load_preset(ns.preset)
    from tuitune.machine.session import Session

    session = Session(p)
    watch_link(session.transport)

    async def go():
        st = await session.connect()  # follows the server's log: the batch sizes it reports
        print_warnings(session.control)
        if st.running and st.ours and not ns.any and (why := session.control.foreign(st.record)):
            raise CliError(why, 2)
        return await bench_levels(session, levels, ov, on_level=starting(f"on {session.label}"))

    return report(run_async(guarded(go, session.transport)))


def report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("captures", nargs="+")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-chart", action="store_true", help="leave out the terminal chart")
    p.set_defaults(run=cmd_report)


def cmd_report(ns) -> int:
    from tuitune.measure.report import chart, colour_wanted, format_report, summarize_capture

    reports = [summarize_capture(c) for c in ns.captures]
    if ns.json:
        for r in reports:  # (the human report says it in its lines)
            for said in (r["partial"], r["note"]):
                if said:
                    print(f"tuitune: warning: {said}", file=sys.stderr)
        print_json([{k: v for k, v in r.items() if not k.startswith("_")} for r in reports])
        return 0
    print(format_report(reports))
    if not ns.no_chart:
        import shutil

        cols = shutil.get_terminal_size((100, 24)).columns
        print()
        print(chart(reports, width=min(cols, 120), colour=colour_wanted()))
    return 0


def gpus_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("preset", nargs="?")
    g.add_argument(
        "--parse",
        metavar="FILE",
        help="saved nvidia-smi output (query CSV, the table, topo -m, nvlink -s, dmon), or - for standard input",
    )
    p.add_argument("--json", action="store_true", help="JSON (with --watch: one object per sample)")
    p.add_argument("--watch", action="store_true", help="keep refreshing from one nvidia-smi stream")
    p.add_argument("--fields", help="with --parse: the columns of a CSV saved without its header")
    p.set_defaults(run=cmd_gpus)


def cmd_gpus(ns) -> int:
    from tuitune.machine import gpus as G

    if ns.parse:
        if ns.watch:
            raise CliError("--watch does not apply with --parse", 2)
        text = "\n".join(open_lines(ns.parse))
        parsed = G.parse_file(text, ns.fields.split(",") if ns.fields else None, name=ns.parse)
        if ns.json:
            print_json(parsed)
        else:
            print(G.format_parsed(parsed))
        return 0
    if ns.fields:
        raise CliError("--fields only applies with --parse", 2)
    from tuitune.machine.telemetry import for_preset

    p = load_preset(ns.preset)
    t, _ = with_control(p)
    prefix = for_preset(p)

    async def go():
        if ns.watch:
            await G.watch(t, prefix, p.telemetry.period_ms, _frame_printer(ns.json), _trouble)
            return 0
        snap = await G.snapshot(t, prefix)
        if ns.json:
            print_json(snap)
        else:
            print(G.format_snapshot(snap))
        return 0

    return run_async(guarded(go, t))


def _frame_printer(as_json: bool):
    """`gpus --watch`'s output: one JSON object per sample, or the table redrawn (in place on a terminal)."""
    from tuitune.machine import gpus as G

    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    def show(frame: dict) -> None:
        if as_json:
            sys.stdout.write(json.dumps({"seq": frame["seq"], "gpus": frame["gpus"]}) + "\n")
        else:
            topo = G.format_topology(frame["topology"])
            table = G.format_gpus(frame["gpus"], frame["processes"], frame["flags"])
            sys.stdout.write(clear + table + (f"\n\n{topo}" if topo else "") + "\n")
        sys.stdout.flush()

    return show


def _trouble(sentence: str) -> None:
    print(f"tuitune: {sentence}", file=sys.stderr)


def watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "--against",
        metavar="CAPTURE",
        help="compare with a capture of a run known to be good (default: the launch's own first cycles)",
    )
    p.add_argument(
        "--drop",
        type=float,
        default=0.10,
        metavar="SHARE",
        help="alarm when the accept length falls this share below the baseline's (default 0.10)",
    )
    p.add_argument(
        "--window",
        type=int,
        metavar="CYCLES",
        help="profiled cycles in each window the guard compares (default 400; fewer on a quiet server, "
        "at the price of noise)",
    )
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    p.add_argument("--until-alarm", action="store_true", help="stop at the first alarm")
    p.add_argument(
        "--load", type=int, metavar="C", help="keep C request streams running (default: the server's own traffic)"
    )
    p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH (- for standard output)")
    p.set_defaults(run=cmd_watch)


def cmd_watch(ns) -> int:
    """Exit 0 no alarm, 1 an alarm was raised, 2 bad usage, 3 no server running (or it exited)."""
    from tuitune.experiments.watch import watch
    from tuitune.measure.capture import CaptureError
    from tuitune.measure.guard import Baseline

    if not 0 < ns.drop < 1:
        raise CliError(f"--drop is a share between 0 and 1, such as 0.1 (got {ns.drop})", 2)
    check_positive(ns, "duration", "load", "window")
    baseline = None
    if ns.against:
        try:
            baseline = Baseline.from_capture(ns.against)
        except (CaptureError, ValueError) as e:
            raise CliError(f"--against: {e}", 2) from None
    p = load_preset(ns.preset)
    res = run_async(
        watch(
            p,
            baseline=baseline,
            drop=ns.drop,
            duration=ns.duration,
            until_alarm=ns.until_alarm,
            load=ns.load,
            window=ns.window,
            say=lambda line: print(line, flush=True),
        )
    )
    if ns.json:
        write_json(ns.json, res)
    if res["exited"]:
        print(f"tuitune: the server exited while watched: {res['exited']}", file=sys.stderr)
    n = res["alarms_raised"]
    print(
        f"{n} alarm{'s' if n != 1 else ''} raised in {res['seconds']:.0f} s; {res['status']}",
        file=sys.stderr if ns.json == "-" else sys.stdout,
    )
    return 1 if n else 3 if res["exited"] else 0


PARSERS = {
    "parse": parse_args,
    "bench": bench_args,
    "report": report_args,
    "gpus": gpus_args,
    "watch": watch_args,
}
