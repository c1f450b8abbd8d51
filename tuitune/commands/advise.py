"""`tuitune advise`: the cost model's best configuration per concurrency, from a running server or
captures, and an engine schedule written on request (the flow: tuitune.experiments.advisor)."""

from __future__ import annotations

import argparse

from tuitune.commands.common import CliError, int_list, print_json, run_async


def advise_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="PRESET|CAPTURE",
        help="a preset (its running server's log is read) or captures (one launch each)",
    )
    p.add_argument(
        "--concurrency",
        help="concurrencies to advise for, comma-separated (default: the load the "
        "windows were measured at, or the preset's bench.concurrency)",
    )
    p.add_argument("--top", type=int, default=5, help="configurations shown per concurrency (default 5)")
    p.add_argument("--json", action="store_true", help="everything (model, all predictions) as JSON")
    p.add_argument(
        "--emit",
        nargs=2,
        metavar=("FORMAT", "FILE"),
        help="write an engine schedule: sglang-adaptive FILE.json (SGLang --speculative-adaptive-config) or "
        "vllm-dsd FILE.json (vLLM num_speculative_tokens_per_batch_size, for speculative.dynamic_schedule)",
    )
    p.add_argument("--buckets", help="batch-size keys of the emitted schedule (default 1,2,4,8,16,32,64)")
    p.set_defaults(run=cmd_advise)


def cmd_advise(ns) -> int:
    from tuitune.experiments.advisor import EMIT_FORMATS, advise_sources

    if ns.emit and ns.emit[0] not in EMIT_FORMATS:
        raise CliError(f"--emit {ns.emit[0]!r}: the formats are {' and '.join(EMIT_FORMATS)}", 2)
    if ns.top < 1:
        raise CliError(f"--top must be at least 1 (got {ns.top})", 2)
    buckets = int_list(ns.buckets, "--buckets") if ns.buckets else None
    wanted = int_list(ns.concurrency, "--concurrency") if ns.concurrency else None
    emit, fmt = (ns.emit[1], ns.emit[0]) if ns.emit else (None, EMIT_FORMATS[0])
    advised = run_async(advise_sources(ns.sources, wanted, emit, buckets, emit_format=fmt))
    if ns.json:
        print_json(advised.to_dict())
    else:
        print(advised.format(top=ns.top))
    return 0


PARSERS = {"advise": advise_args}
