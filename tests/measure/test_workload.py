"""Issue 40 item 6: the operator's own workload. `bench`, `ab`, `sweep`, `tune` and the TUI's load send
the prompts of a file (plain text, JSONL, ShareGPT or chat JSON) with the output lengths it gives;
every run, capture and verdict names its workload (name and hash); comparisons across workloads are
refused (ab, tune --resume, sweep --resume) or flagged (the runs table, report, advise)."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.experiments.ab import RoundsError, run_ab, verdict
from tuitune.experiments.advisor import workload_warning
from tuitune.measure import workload as W
from tuitune.measure.capture import CaptureWriter
from tuitune.measure.report import format_report, summarize_capture
from tuitune.measure.runs import RunBook
from tuitune_support.presets import make_preset
from tuitune_support.procs import tuitune_cli

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Write a haiku."}, {"from": "gpt", "value": "…"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "Be short."}, {"from": "human", "value": "Hi?"}]},
]


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# ---- reading prompt files: pure ------------------------------------------------------------------


def test_the_formats_benchmarking_tools_take(tmp_path):
    text = W.load(write(tmp_path / "p.txt", "first prompt\n\n  second prompt\n"))
    assert [it.prompt for it in text.items] == ["first prompt", "  second prompt"] and text.name == "p.txt"
    rows = [
        {"prompt": "def f(x):", "max_tokens": 40},
        "a bare string",
        {"text": "summarise this", "output_len": 64},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "chat turn"}]},
        SHAREGPT[0],
    ]
    jl = W.load(write(tmp_path / "p.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n"))
    assert [(it.prompt, it.max_tokens) for it in jl.items] == [
        ("def f(x):", 40),
        ("a bare string", None),
        ("summarise this", 64),
        ("chat turn", None),
        ("Write a haiku.", None),
    ]
    share = W.load(write(tmp_path / "sharegpt.json", json.dumps(SHAREGPT)))
    assert [it.prompt for it in share.items] == ["Write a haiku.", "Hi?"]
    assert share.as_dict() == {"name": "sharegpt.json", "hash": share.hash, "prompts": 2, "lengths": 0}
    assert share.label == f"sharegpt.json ({share.hash}, 2 prompts)"


def test_a_workload_is_its_prompts_in_order(tmp_path):
    a = W.load(write(tmp_path / "a.txt", "x\ny\n"))
    assert W.load(write(tmp_path / "b.txt", "x\ny\n")).hash == a.hash  # the file's name is not its identity
    assert W.load(write(tmp_path / "c.txt", "y\nx\n")).hash != a.hash
    lengths = W.load(write(tmp_path / "d.jsonl", '{"prompt": "x", "max_tokens": 9}\n"y"\n'))
    assert lengths.hash != a.hash  # another output length is another workload
    builtin = W.builtin()
    shipped = json.loads((Path(W.__file__).parent.parent / "data" / "prompts.json").read_text())
    assert [it.prompt for it in builtin.items] == shipped and builtin.hash == W.builtin_hash()
    assert W.same(None, builtin.as_dict()) and W.differ(None, a.as_dict()) == (
        f"workload built-in ({builtin.hash}) vs a.txt ({a.hash})"
    )
    # a capture of the server's own traffic is no workload of tuitune's: not the built-in one
    assert W.differ(None, builtin.as_dict(), traffic=True) and W.differ(None, None, traffic=True) is None


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"prompt": "x"}\n{"prompt": \n', "b.jsonl:2: not a JSON value"),
        ('{"prompt": "x"}\n{"question": "y"}\n', "b.jsonl:2: an object with none of prompt, text, input"),
        ('{"prompt": "x"}\n{"prompt": "   "}\n', "b.jsonl:2: 'prompt': an empty prompt"),
        ('{"prompt": 7}\n', "the prompt is a int, not text"),
        ('{"prompt": "x", "max_tokens": 1}\n', "max_tokens 1 is not an output length"),
        ('{"prompt": "x", "max_tokens": true}\n', "max_tokens true is not an output length"),
        ('{"conversations": [{"from": "gpt", "value": "a"}]}\n', "its conversation has no human or user turn"),
        ('[{"prompt": "x"}, 3]', "b.jsonl: item 2: a int, not a prompt"),
        ("[1, 2", "starts as a JSON list but is not JSON"),
        ("\n\n", "no prompt in it"),
        (b"ok\n\xff\xfe\n", "b.jsonl:2: not UTF-8 text"),
    ],
)
def test_a_damaged_prompt_file_is_one_sentence_naming_the_line(tmp_path, content, words):
    with pytest.raises(W.WorkloadError) as e:
        W.load(write(tmp_path / "b.jsonl", content))
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_what_is_no_prompt_file(tmp_path):
    for path, words in ((tmp_path, "a directory"), (tmp_path / "none.txt", "cannot read it (No such file")):
        with pytest.raises(W.WorkloadError, match=re.escape(words)):
            W.load(path)
    with pytest.raises(P.PresetError, match="is not an absolute path"):
        make_preset(tmp_path, prompts="prompts.txt")


# ---- verdicts across workloads -------------------------------------------------------------------


def _run(book: RunBook, w: dict | None, values=(100.0, 101.0, 99.0, 100.5, 100.2)):
    summary = {"tok_s": {"median": 100.0, "ci95": [99.0, 101.0]}, "failed": 0, "concurrency": 1, "workload": w}
    return book.add("x", make_preset(Path("/tmp")), list(values), summary)


def test_the_runs_table_does_not_compare_runs_of_two_workloads(tmp_path):
    other = W.load(write(tmp_path / "code.txt", "def f():\n")).as_dict()
    book = RunBook()
    base = _run(book, None)  # a run from before workloads were named: the built-in one
    same = _run(book, W.builtin().as_dict())
    moved = _run(book, other)
    book.mark_baseline(base.id)
    assert book.delta(same)["verdict"] != "not comparable"
    d = book.delta(moved)
    assert d["verdict"] == "not comparable" and f"code.txt ({other['hash']})" in d["why"], d


def test_ab_refuses_arms_with_different_prompts_and_judges_none_across_workloads(tmp_path):
    prompts = write(tmp_path / "mine.txt", "hello\n")
    a = make_preset(tmp_path, "a")
    b = P.with_changes(make_preset(tmp_path, "b"), {"bench.prompts": str(prompts)})
    with pytest.raises(RoundsError, match="the arms benchmark different prompts.*pass --prompts FILE"):
        asyncio.run(run_ab(None, a, b, 3, {}))  # refused before the transport is touched
    # the command says it in one sentence, exit 2 (it used to end in RoundsError's traceback)
    pa, pb = P.save(a, tmp_path / "a.yaml"), P.save(b, tmp_path / "b.yaml")
    r = tuitune_cli("ab", str(pa), str(pb), "--rounds", "4", env={"HOME": str(tmp_path)})
    said = r.stderr.strip()
    assert r.returncode == 2 and said.startswith("tuitune: the arms benchmark different prompts"), r.stderr
    assert "Traceback" not in r.stderr and "\n" not in said, r.stderr
    w1, w2 = W.builtin().as_dict(), W.load(prompts).as_dict()
    launches = [
        {"arm": arm, "preset": arm, "median_tok_s": v, "goodput": math.nan, "failed": 0, "errors": [], "workload": w}
        for arm, v, w in (("A", 100, w1), ("B", 110, w1), ("A", 101, w1), ("B", 111, w2))
    ]
    v = verdict(launches)
    assert v["verdict"] == "not comparable" and "different workloads" in v["reason"], v


def test_tune_and_sweep_resume_refuse_another_workload(tmp_path):
    prompts = write(tmp_path / "mine.txt", "hello\n")
    preset = P.save(make_preset(tmp_path, "t"), tmp_path / "t.yaml")
    tune_out = tmp_path / "tune-out"
    tune_out.mkdir()
    logged = W.load(prompts).as_dict()
    (tune_out / "tune.jsonl").write_text(json.dumps({"kind": "workload", **logged}) + "\n")
    home = {"HOME": str(tmp_path)}
    r = tuitune_cli("tune", str(preset), "--budget", "1", "--out", str(tune_out), "--resume", env=home)
    said = r.stderr.strip()
    assert r.returncode == 2 and "were measured on another workload" in said and "\n" not in said, said
    assert f"mine.txt ({logged['hash']})" in said
    sweep_out = tmp_path / "sweep-out"
    sweep_out.mkdir()
    row = {"trial": "t1", "label": "x", "kind": "config", "status": "skipped", "workload": logged}
    (sweep_out / "results.jsonl").write_text(json.dumps(row) + "\n")
    grid = "speculative.num_steps=1,2"
    r = tuitune_cli("sweep", str(preset), "--grid", grid, "--out", str(sweep_out), "--resume", env=home)
    said = r.stderr.strip()
    assert r.returncode == 2 and "were measured on another workload" in said and "\n" not in said, said
    r = tuitune_cli("bench", str(preset), "--prompts", str(tmp_path / "none.jsonl"), env=home)
    said = r.stderr.strip()
    assert r.returncode == 2 and said.startswith("tuitune: --prompts:") and "\n" not in said, said


def test_report_and_advise_flag_captures_of_two_workloads(tmp_path):
    mine = W.load(write(tmp_path / "mine.txt", "hello\n")).as_dict()
    paths = []
    for name, w in (("a", None), ("b", mine), ("c", mine)):
        path = tmp_path / f"{name}.jsonl"
        CaptureWriter(path, {"preset": {"name": name}, "workload": w}).close()
        paths.append(str(path))
    text = format_report([summarize_capture(p) for p in paths])
    assert "workload: the server's own traffic (tuitune sent none)" in text
    assert f"workload: mine.txt ({mine['hash']}, 1 prompt)" in text
    assert "warning: the captures ran different workloads (workload mine.txt" in text and "vs the server's own" in text
    assert "different workloads" not in format_report([summarize_capture(p) for p in paths[1:]])
    said = workload_warning(paths)
    assert said and "advise from captures of one workload" in said and workload_warning(paths[1:]) is None


# ---- against the simulator as a real process ------------------------------------------------------


def test_bench_sends_the_operators_prompts_with_their_lengths(sim_factory, tmp_path):
    sim = sim_factory("--tp-size", "2", "--sim-load-seconds", "0.2", "--sim-speedup", "10")
    sim.wait_ready()
    rows = [{"prompt": "def f(x):", "max_tokens": 24}, SHAREGPT[0], {"text": "long", "output_len": 36}]
    path = write(tmp_path / "mine.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "b.json"
    args = ["--requests", "6", "--warmup", "0", "--max-tokens", "30", "--prompts", str(path), "--json", str(out)]
    r = tuitune_cli("bench", "--url", f"127.0.0.1:{sim.port}", *args)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    w = W.load(path)
    assert data["summary"]["workload"] == w.as_dict()
    assert [x["completion_tokens"] for x in data["results"]] == [24, 30, 36, 24, 30, 36]  # the data's lengths
    assert f"workload: mine.jsonl ({w.hash}, 3 prompts)" in r.stdout
    # the chat API: the prompt as the user's turn; the chunk that opens the turn carries no token
    r = tuitune_cli("bench", "--url", f"127.0.0.1:{sim.port}", *args[:-2], "--api", "chat", "--json", str(out))
    assert r.returncode == 0, r.stderr
    chat = json.loads(out.read_text())
    assert [x["completion_tokens"] for x in chat["results"]] == [24, 30, 36, 24, 30, 36]
    assert all(x["ok"] and x["ttft_s"] > 0 for x in chat["results"]), chat["results"]


def test_a_chat_streams_role_chunk_is_no_token():
    from tuitune.measure.request import _role_only

    opening = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert _role_only(opening)
    for event in (
        {"choices": [{"delta": {"content": ""}}]},  # a token whose text is held back: a token
        {"choices": [{"delta": {"role": "assistant", "content": "Hi"}}]},  # a role with text (some servers)
        {"choices": [{"delta": {"role": "assistant"}, "finish_reason": "length"}]},  # the end
        {"choices": ["not an object"]},
        {"choices": [{"delta": "text"}]},
    ):
        assert not _role_only(event), event


async def test_the_load_says_when_its_prompt_file_is_bad(tmp_path):
    from tuitune.machine.session import Session

    p = P.with_changes(make_preset(tmp_path, "l"), {"bench.prompts": str(tmp_path / "gone.jsonl")})
    session = Session(p, state_dir=str(tmp_path / "state"))
    said = []
    session.subscribe(lambda evs: said.extend(getattr(e, "text", "") for e in evs))
    await session.set_load(True)
    await session._load_task  # it ends at once: no prompts to send
    assert (
        not session.load.on and "bench.prompts:" in session.load.last_error and "gone.jsonl" in session.load.last_error
    )
    assert any(t.startswith("load off: bench.prompts:") for t in said), said
    await session.close()


# ---- a workload recorded from the server's own request log -------------------------------------------


def sglang_finished(text, completion_tokens=40, max_new_tokens=128, rid="r1") -> str:
    """A request's line as SGLang 0.5.18 logs it with --log-requests --log-requests-format json
    (srt/utils/request_logger.py, log_finished_request; the logger's own prefix first)."""
    body = {
        "timestamp": "2026-12-06T09:40:00.123456",
        "event": "request.finished",
        "rid": rid,
        "obj": {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, "rid": rid},
        "out": {"text": "…", "meta_info": {"id": rid, "prompt_tokens": 12, "completion_tokens": completion_tokens}},
    }
    return f"[2026-12-06 09:40:00] {json.dumps(body, ensure_ascii=False)}"


def test_sglangs_request_log_read_back_as_a_workload():
    from tuitune.engines import get

    long = "x" * 1024 + "..." + "y" * 1024  # level 2 logs a prompt over 2,048 characters as its two ends
    lines = [
        '[2026-12-06 09:39:59] INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK',
        sglang_finished("<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n", 96),
        sglang_finished("def fib(n):", completion_tokens=None, max_new_tokens=64),  # no length out: the asked one
        sglang_finished(long),
        sglang_finished(["a", "b"]),  # a batch: no one prompt
        '[2026-12-06 09:40:01] {"timestamp": "x", "event": "request.finished", "obj": ',  # cut mid-line
        sglang_finished("naïve — ünïcödé", 7),
    ]
    got = W.from_log(lines, get("sglang"))
    assert [(it.prompt, it.max_tokens) for it in got.items] == [
        ("<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n", 96),
        ("def fib(n):", 64),
        ("naïve — ünïcödé", 7),
    ]
    assert got.cut == 1 and got.unlengthed == 0


def test_a_recorded_workload_masks_credentials_and_keeps_the_rest(tmp_path):
    from tuitune.base.redact import text
    from tuitune.engines import get

    secret = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    long = "word " * 20_000  # 100,000 characters: over the 64 KiB a log line is clipped to for display
    got = W.from_log(
        [sglang_finished(f"my token is {secret}, summarise"), sglang_finished("plain"), sglang_finished(long)],
        get("sglang"),
        text,
    )
    assert got.items[2].prompt == long  # masked, never clipped
    assert got.masked == 1 and secret not in got.items[0].prompt and got.items[1].prompt == "plain"
    w = W.write_jsonl(got.items, tmp_path / "w.jsonl")
    assert secret not in (tmp_path / "w.jsonl").read_text() and len(w.items) == 3 and w.items[2].prompt == long


def test_workload_from_log_and_show(tmp_path):
    log = write(tmp_path / "server.log", "\n".join(sglang_finished(f"prompt {i}", 10 + i) for i in range(5)) + "\n")
    out = tmp_path / "traffic.jsonl"
    r = tuitune_cli("workload", "from-log", "--log", str(log), "--engine", "sglang", "--out", str(out), "--last", "3")
    assert r.returncode == 0, r.stderr
    w = W.load(out)
    assert [(it.prompt, it.max_tokens) for it in w.items] == [("prompt 2", 12), ("prompt 3", 13), ("prompt 4", 14)]
    assert f"workload {w.label}" in r.stdout and "the last 3 of 5 requests" in r.stdout
    r = tuitune_cli("workload", "show", str(out))
    assert r.returncode == 0 and f"workload: {w.label}" in r.stdout and "3 of 3, 12-14 tokens" in r.stdout, r.stdout
    # no request in the log: what to turn on, in one sentence; nothing written
    r = tuitune_cli("workload", "from-log", "--log", str(log), "--engine", "vllm", "--out", str(tmp_path / "no.jsonl"))
    assert r.returncode == 1 and "--enable-log-requests" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "no.jsonl").exists()
    r = tuitune_cli("workload", "from-log", "--log", str(log), "--out", str(out))
    assert r.returncode == 2 and "--log needs --engine" in r.stderr, r.stderr
    r = tuitune_cli(
        "workload", "from-log", "--log", str(tmp_path / "nope.log"), "--engine", "sglang", "--out", str(out)
    )
    assert r.returncode == 2 and "cannot open it" in r.stderr and W.load(out).items == w.items, r.stderr


def test_workload_from_the_log_of_a_preset_over_a_real_sshd(sshd, tmp_path):
    """The preset's log is read on its target, through SSH (streamed), as the server wrote it."""
    preset = make_preset(tmp_path, "remote", target=sshd.target())
    path = P.save(preset, tmp_path / "remote.yaml")
    write(Path(preset.server.log), "noise\n" + sglang_finished("over ssh", 33) + "\n" + sglang_finished("again", 5))
    out = tmp_path / "remote.jsonl"
    r = tuitune_cli("workload", "from-log", str(path), "--out", str(out), env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert [(it.prompt, it.max_tokens) for it in W.load(out).items] == [("over ssh", 33), ("again", 5)]
    Path(preset.server.log).unlink()
    r = tuitune_cli("workload", "from-log", str(path), "--out", str(out), env={"HOME": str(tmp_path)})
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr, r.stderr
