"""NCCL catalogue, speculative rules, metrics store, statistics, the headless core, the CLI."""

from __future__ import annotations

import ast
import math
import random
import subprocess
import sys
import tracemalloc

import pytest

from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.engines import sglang
from tuitune.measure import stats
from tuitune.measure.metrics import MetricsStore, Series
from tuitune.preset import nccl
from tuitune_support.paths import ROOT


@pytest.mark.parametrize(
    "name, value, ok",
    [
        ("NCCL_PROTO", "LL", True),
        ("NCCL_PROTO", "ll128,simple", True),
        ("NCCL_PROTO", "^LL128", True),
        ("NCCL_PROTO", "^LL128;allreduce:LL", True),
        ("NCCL_PROTO", "LLL", False),
        ("NCCL_PROTO", "", False),
        ("NCCL_PROTO", "bogus:LL", False),
        ("NCCL_ALGO", "Ring", True),
        ("NCCL_ALGO", "allreduce:tree", True),
        ("NCCL_ALGO", "^NVLS,PAT", True),
        ("NCCL_ALGO", "Rings", False),
        ("NCCL_P2P_LEVEL", "SYS", True),
        ("NCCL_P2P_LEVEL", "3", True),
        ("NCCL_P2P_LEVEL", "sys", False),
        ("NCCL_NTHREADS", "512", True),
        ("NCCL_NTHREADS", "96", True),
        ("NCCL_NTHREADS", "100", False),
        ("NCCL_NTHREADS", "1024", False),
        ("NCCL_MAX_NCHANNELS", "16", True),
        ("NCCL_MAX_NCHANNELS", "0", False),
        ("NCCL_BUFFSIZE", "16777216", True),
        ("NCCL_BUFFSIZE", "16M", False),
        ("NCCL_NVLS_ENABLE", "2", True),
        ("NCCL_NVLS_ENABLE", "3", False),
        ("NCCL_DEBUG", "info", True),
        ("NCCL_DEBUG_SUBSYS", "INIT,ENV,TUNING", True),
        ("NCCL_DEBUG_SUBSYS", "INIT,FOO", False),
        ("NCCL_P2P_DISABLE", "1", True),
        ("NCCL_P2P_DISABLE", "yes", False),
    ],
)
def test_nccl_check(name, value, ok):
    errors, _ = nccl.check(name, value)
    assert (not errors) == ok, errors


def test_nccl_warnings():
    assert "power of two" in nccl.check("NCCL_BUFFSIZE", "3000000")[1][0]
    assert "NCCL_MAX_CTAS" in nccl.check("NCCL_MAX_NCHANNELS", "16")[1][0]
    assert "not in tuitune's NCCL catalogue" in nccl.check("NCCL_PROTOCOL", "LL")[1][0]
    assert "removed" in nccl.check("NCCL_LL_THRESHOLD", "0")[1][0]
    assert nccl.check("CUDA_VISIBLE_DEVICES", "0,1") == ([], [])
    assert all(v.help and v.default for v in nccl.CATALOGUE.values())


def test_speculative_rules():
    r = sglang.resolve("EAGLE3", 2, 1, None, "/d")
    assert r.num_draft_tokens == 3 and "num_draft_tokens" in r.derived
    assert sglang.resolve("EAGLE3", 5, 1, 3, "/d").num_draft_tokens == 6
    assert sglang.resolve("EAGLE3", 3, 4, 8, "/d").num_draft_tokens == 8
    with pytest.raises(ValueError, match="more than"):
        sglang.resolve("EAGLE3", 2, 2, 6, "/d")
    with pytest.raises(ValueError, match="all-or-none"):
        sglang.resolve("EAGLE3", None, 1, None, "/d")
    with pytest.raises(ValueError, match="must be set when eagle_topk > 1"):
        sglang.resolve("EAGLE3", 2, 2, None, "/d")
    assert sglang.resolve(None, None, None, None).algorithm is None


def test_series_bounds_and_summary():
    s = Series("x", capacity=5)
    for i in range(10):
        s.append(float(i), t=i)
    assert s.values() == [5, 6, 7, 8, 9] and s.summary().median == 7 and s.summary().n == 5
    s.append(math.nan)
    assert len(s) == 5
    t = Series("t", capacity=100, max_age_s=3)
    for i in range(10):
        t.append(float(i), t=float(i))
    assert t.values() == [6, 7, 8, 9]
    fixed = Series("f", lo=1.0)
    fixed.append(3.0)
    assert fixed.display_range() == (1.0, 3.0)


def test_store_memory_flat_over_a_million_events():
    store = MetricsStore(capacity=600)
    ev = ProfileWindow(draft_ms=0.4, verify_ms=19.0, extend_ms=0.2, accept_len=1.9, cycle_ms=19.8)
    dec = DecodeStats(gen_throughput=90.0, accept_len=1.9)
    for i in range(20_000):
        store.feed(ev, t=float(i))
        store.feed(dec, t=float(i))
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(1_000_000):
        store.feed(ev if i % 2 else dec, t=float(i))
    grown = tracemalloc.take_snapshot().compare_to(base, "filename")
    tracemalloc.stop()
    assert sum(st.size_diff for st in grown) < 200_000  # bytes: bounded, not proportional to events
    assert len(store["verify_ms"]) == 600 and store.profile_windows == 520_000


def test_mann_whitney_exact_and_bootstrap():
    u, p = stats.mann_whitney_u([1, 2, 3, 4], [5, 6, 7, 8])
    assert u == 0 and p == pytest.approx(2 / 70)
    _, p3 = stats.mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert p3 == pytest.approx(0.1)  # 3 launches per arm can never reach 0.05
    _, p_same = stats.mann_whitney_u([1, 2, 3, 4], [1.5, 2.5, 3.5, 4.5])
    assert p_same > 0.5
    lo, hi = stats.bootstrap_median_ci([10, 11, 12, 13, 14, 15, 16])
    assert 10 <= lo <= 13 <= hi <= 16
    rng = random.Random(1)
    a = [100 + rng.gauss(0, 1) for _ in range(8)]
    assert stats.compare(a, [x * 1.05 for x in a])["verdict"] == "faster"
    assert stats.compare(a, [x * 0.95 for x in a])["verdict"] == "slower"
    assert stats.compare(a, a)["verdict"] == "no significant difference"
    assert stats.compare(a, [x * 1.005 for x in a], min_effect=0.01)["verdict"] == "no significant difference"


CORE_MODULES = [p for p in (ROOT / "tuitune").rglob("*.py") if "tui" not in p.relative_to(ROOT / "tuitune").parts[:1]]


def test_core_never_imports_textual():
    for path in CORE_MODULES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "textual" or n.startswith("textual.") for n in names), path
    mods = sorted(
        {
            ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for p in CORE_MODULES
            if p.name != "__main__.py"
        }
    )
    code = f"import importlib, sys\nfor m in {mods!r}: importlib.import_module(m)\nassert 'textual' not in sys.modules, 'textual imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_cli_help_version_and_bad_usage():
    r = subprocess.run([sys.executable, "-m", "tuitune", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "preset" in r.stdout and "parse" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tuitune", "--version"], capture_output=True, text=True)
    assert r.stdout.strip().startswith("tuitune 0.")
    r = subprocess.run([sys.executable, "-m", "tuitune", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tuitune.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp','asyncssh','textual','pydantic','yaml')))",
        ],
        capture_output=True,
        text=True,
    )
    assert r.stdout.strip() == "[]"  # --help pulls in none of the heavy dependencies


# ---- asyncio: a cancelled clean-up never eats the caller's cancel --------------------------------


async def test_cancel_and_wait_drops_the_childs_cancel_and_keeps_the_callers():
    import asyncio

    from tuitune.base.aio import cancel_and_wait

    async def slow_to_stop():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # a clean-up that takes a while (killing a remote tail)
            raise

    async def broken():
        raise RuntimeError("ended badly")

    child, failed = asyncio.ensure_future(slow_to_stop()), asyncio.ensure_future(broken())
    await asyncio.sleep(0)
    assert failed.done()
    await cancel_and_wait(child, failed, None)  # both ends dropped, None skipped
    assert child.cancelled()
    # Ctrl-C reaches the caller while the child cleans up: it must come out, not be swallowed
    child = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    caller = asyncio.ensure_future(cancel_and_wait(child))
    await asyncio.sleep(0.1)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
    failed = asyncio.ensure_future(broken())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):  # what is not ignored comes out
        await cancel_and_wait(failed, ignore=())
    # clean-up in a `finally` after Ctrl-C: every child is waited for, then the cancel goes on
    first, second = asyncio.ensure_future(slow_to_stop()), asyncio.ensure_future(slow_to_stop())

    async def closing():
        try:
            await asyncio.sleep(10)
        finally:
            await cancel_and_wait(first, second)

    caller = asyncio.ensure_future(closing())
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert first.cancelled() and second.cancelled()
