"""Issue 42: every byte from outside treated as hostile. Preset values the target cannot carry, a
benchmark server that replies badly, damaged captures and logs, a resumed log cut at any byte,
secrets by their shape, cancels that reach their task, impossible figures in the engine's lines.
The real pieces run: a real aiohttp server on loopback, real files, the simulator as a process."""

from __future__ import annotations

import json

import pytest

from tuitune.measure.parse import parse_line

# ---- 8. the vLLM parsers refuse impossible values --------------------------------------------------------

SPEC = (
    "(APIServer pid=1) INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: {mal}, "
    "Accepted throughput: 41.20 tokens/s, Drafted throughput: 89.10 tokens/s, Accepted: {acc} tokens, "
    "Drafted: {dra} tokens, Per-position acceptance rate: {pos}, Avg Draft acceptance rate: {rate}%"
)
STATS = (
    "(APIServer pid=1) INFO 05-01 12:00:01 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
    "Avg generation throughput: {gen} tokens/s, Running: {run} reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%"
)
GOOD = {"mal": "2.31", "acc": "412", "dra": "891", "pos": "0.712, 0.455", "rate": "46.2"}


def spec(**kw) -> str:
    return SPEC.format(**{**GOOD, **kw})


def test_vllm_lines_with_impossible_values_are_malformed():
    assert parse_line(spec()).kind == "vllm_spec"
    bad = {
        "negative accepted": spec(acc="-5"),
        "negative drafted": spec(dra="-891", acc="0"),
        "accepted over drafted": spec(acc="900", dra="891"),
        "fullwidth digits": spec(acc="４１２"),
        "arabic-indic digits": spec(dra="٨٩١"),
        "negative length": spec(mal="-2.31"),
        "fullwidth length": spec(mal="２.31"),
        "rate over 100 %": spec(rate="146.2"),
        "negative rate": spec(rate="-46.2"),
        "per-position over 1": spec(pos="1.712, 0.455"),
        "per-position negative": spec(pos="-0.1, 0.455"),
    }
    for what, line in bad.items():
        ev = parse_line(line)
        assert ev.kind == "malformed" and ev.marker == "SpecDecoding metrics", what
        assert ev.ts == "05-01 12:00:00", what
    assert "more than Drafted" in parse_line(spec(acc="900", dra="891")).reason
    assert "negative" in parse_line(spec(acc="-5")).reason
    assert parse_line(STATS.format(gen="150.2", run="3")).kind == "decode"
    for gen, run in (("-150.2", "3"), ("150.2", "-3"), ("１５０", "3"), ("150.2", "３")):
        ev = parse_line(STATS.format(gen=gen, run=run))
        assert ev.kind == "malformed" and ev.marker == "Avg prompt throughput", (gen, run)
    # an interval without drafts: vLLM prints nan% for its rate; that is an unknown, not a damaged line
    assert parse_line(spec(acc="0", dra="0", rate="nan")).kind == "vllm_spec"


# ---- 4. a log cut at any byte resumes without losing a completed row -------------------------------------


def test_a_tune_log_cut_at_any_byte_keeps_every_completed_launch(tmp_path):
    """`tune --resume` (and `sweep`) after a row cut short wrote the next row onto the broken line, and
    lost it. Cut the log at every byte: the rows completed before the cut, and the row appended after
    it, all read back, and --resume rebuilds every completed launch."""
    from test_cli import spent_search

    from tuitune.experiments.tune import _append, _replay_prior, load_log

    _, _, out = spent_search(tmp_path)
    log = out / "tune.jsonl"
    whole = log.read_bytes()
    ends = [i + 1 for i, b in enumerate(whole) if b == ord("\n")]  # where each completed row ends
    extra = {
        "kind": "launch",
        "round": 9,
        "config": {"steps": 3, "topk": 1, "draft_tokens": 4},
        "goodput": {"1": 5.0},
        "capture": str(out / "captures" / "launch-00.jsonl.gz"),
    }
    for cut in range(len(whole) + 1):
        log.write_bytes(whole[:cut])
        _append(out, extra)
        rows = load_log(out)
        completed = sum(1 for e in ends if e <= cut) + (1 if cut + 1 in ends else 0)  # whole but for its newline
        assert [r["round"] for r in rows] == [*range(completed), 9], cut
        prior = _replay_prior(rows)
        assert len(prior) == completed + 1, cut  # every completed launch, and the new one, rebuilt


def test_sweep_results_cut_short_get_the_next_row_on_a_line_of_its_own(tmp_path):
    from tuitune.experiments.sweep import _append, load_results

    row = {"trial": "t1", "label": "a", "kind": "config", "status": "ok", "tok_s_median": 10.0, "values": [10.0]}
    _append(tmp_path, row)
    for name in ("results.jsonl", "results.csv"):
        path = tmp_path / name
        path.write_bytes(path.read_bytes()[:-7])  # killed mid-row
    _append(tmp_path, {**row, "trial": "t2"})
    assert [r["trial"] for r in load_results(tmp_path)] == ["t2"]
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[-1].startswith("t2,") or ",t2," in csv_lines[-1] or csv_lines[-1].split(",")[0] == "t2", csv_lines


# ---- 5. a damaged log row is skipped with a warning naming its line ----------------------------------------


DAMAGED_ROWS = [
    b"\xff\xfe not utf-8 at all\n",
    b'{"kind": "launch", "round": 5, "config": null, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 0, "draft_tokens": 0}, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": -1}, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": {"1": "fast"}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": {"1": Infinity}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": true, "topk": 1, "draft_tokens": 3}, "goodput": {}}\n',
    b'{"kind": "launch", "round": 5, "config": {"colour": "red"}, "goodput": {}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": [1, 2]}\n',
    b'{"kind": "nccl", "changes": null}\n',
    b"[1, 2, 3]\n",
    b'"just a string"\n',
    b"{" * 100000 + b"\n",
]


def test_tune_resume_on_a_damaged_log_skips_each_bad_row_naming_its_line(tmp_path):
    """`tune --resume` on a damaged log ended in a traceback: invalid UTF-8 (UnicodeDecodeError), a
    row with "config": null (TypeError), hostile configuration values (ZeroDivisionError in the fit).
    Each damaged row is now skipped with a warning that names its line, and the search goes on from
    the rows that are whole."""
    from test_cli import spent_search, tuitune

    _, path, out = spent_search(tmp_path)
    log = out / "tune.jsonl"
    good = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(good[0] + b"".join(DAMAGED_ROWS) + good[1])
    r = tuitune(
        "tune", str(path), "--budget", "0", "--concurrency", "1", "--out", str(out), "--resume", "--ab-rounds", "0",
        "--json", str(tmp_path / "r.json"), env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in range(2, 2 + len(DAMAGED_ROWS)):
        assert f"tune.jsonl line {n} skipped: " in r.stderr, (n, r.stderr[-3000:])
    assert "line 1 skipped" not in r.stderr and f"line {2 + len(DAMAGED_ROWS)} skipped" not in r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["chosen"]["steps"] == 0, res  # the whole rows still decide: off measured twice as fast
