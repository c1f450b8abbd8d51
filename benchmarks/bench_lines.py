"""Per-line costs on one core: the parser by kind of line, and secret masking.

The lines are those of ``bench_parse.py``'s busy SGLang log (second stamps, 200 lines a second,
built from a seed): for each kind (profile, decode, prefill, http, other) ``--lines`` lines of that
kind alone, then the whole mix, go through ``tuitune.measure.parse.parse_line`` one at a time and
through ``parse_lines`` (many at once: the batch readers), and the stats and probe lines through
their exact (field by field) readers, which decide the lines the fast paths refuse; the probe's
batch split in two: its rewrite into JSON and msgspec's decode. Then the mix through
``tuitune.base.redact.Redactor()``, what every line tuitune prints or writes pays. CPU time
(``time.process_time``), the best of ``--repeat`` runs, in microseconds a line; the process is
pinned to one core, and the load average is printed (the machine may be shared).

    python benchmarks/bench_lines.py [--lines 200000] [--repeat 5] [--cpu C]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from tuitune.base.redact import Redactor
from tuitune.engines import sglang_log
from tuitune.measure import parse
from tuitune.measure.parse import CHUNK, parse_line, parse_lines
from tuitune_support.loglines import MAKERS, WEIGHTS, build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


EXACT = {  # the exact readers, as the parser calls them when a fast path refuses a line
    "profile": ("EAGLE3_PROFILE", lambda line, at: parse._profile(line, at, fast=False)),
    "decode": (sglang_log.DECODE, lambda line, at: sglang_log._decode(line, at, fast=False)),
    "prefill": (sglang_log.PREFILL, lambda line, at: sglang_log._prefill(line, at, fast=False)),
}


def best_us(lines: list[str], run, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        run(lines)
        best = min(best, time.process_time() - c0)
    return best / len(lines) * 1e6


def one_at_a_time(lines: list[str]) -> None:
    for line in lines:
        parse_line(line)


def many_at_once(lines: list[str]) -> None:
    for _ in parse_lines(lines):
        pass


def masked(lines: list[str]) -> None:
    red = Redactor()
    for line in lines:
        red(line)


def exact(kind: str):
    marker, reader = EXACT[kind]

    def run(lines: list[str]) -> None:
        for line in lines:
            reader(line, line.find(marker))

    return run


def rewrite(rests: list[list[str]]) -> list[bytes]:
    """The probe's batch, first half: the lines' pairs into one JSON text (as _profile_many does)."""
    return [
        b"".join(
            (b'[{"', "\n".join(r).encode().replace(b"=", b'":"').replace(b" ", b'","').replace(b"\n", b'"},{"'), b'"}]')
        )
        for r in rests
    ]


def decode(texts: list[bytes]) -> None:
    for text in texts:
        parse._decode_profiles(text)


def read(d: str, name: str, n: int, mix: dict) -> list[str]:
    path = os.path.join(d, name + ".log")
    build(path, n, mix=mix)
    with open(path) as f:
        return f.read().splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=None, help="the core to run on (default: the last one allowed)")
    ns = ap.parse_args()
    cpu = ns.cpu if ns.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    print(
        f"{ns.lines:,} lines a run, CPU time, best of {ns.repeat}, core {cpu}, "
        f"load average {os.getloadavg()[0]:.1f}; µs a line (lines a second)"
    )
    print(f"{'':16}{'parse_line':>22}{'parse_lines':>22}")
    with tempfile.TemporaryDirectory() as d:
        for name, mix in [(kind, {kind: 1}) for kind in MAKERS] + [("the mix", WEIGHTS)]:
            lines = read(d, name.replace(" ", "_"), ns.lines, mix)
            one = best_us(lines, one_at_a_time, ns.repeat)
            many = best_us(lines, many_at_once, ns.repeat)
            print(f"{name:16}{one:8.2f} ({1e6 / one:>10,.0f}){many:8.2f} ({1e6 / many:>10,.0f})", flush=True)
            if name in EXACT:
                us = best_us(lines, exact(name), ns.repeat)
                print(f"{'':16}the exact reader: {us:.2f} µs a line")
            if name == "profile":  # the batch's two halves, in parse_lines' chunks
                rests = [
                    [line.partition(parse.PROFILE_MARKER)[2] for line in lines[i : i + CHUNK]]
                    for i in range(0, len(lines), CHUNK)
                ]
                texts = rewrite(rests)
                r = best_us(rests, rewrite, ns.repeat) * len(rests) / len(lines)
                c = best_us(texts, decode, ns.repeat) * len(texts) / len(lines)
                print(f"{'':16}of parse_lines': the rewrite into JSON {r:.2f} µs, msgspec's decode {c:.2f} µs a line")
        us = best_us(lines, masked, ns.repeat)  # the mix
        print(f"Redactor(), the mix: {us:.2f} µs a line ({1e6 / us:,.0f} lines a second)")


if __name__ == "__main__":
    main()
