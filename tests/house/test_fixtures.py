"""The fixtures that fetch real releases (SGLang's and vLLM's wheels, vLLM's command line) skip a
test only when the package registry's index does not answer; any other pip failure fails the test.
Each case is made here with pip itself against local indexes: one that refuses connections, one
that answers but holds no such release, and one that answers beside a find-links location that
refuses connections (pip's words then name a connection error: reading them alone skipped)."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

import pytest

from tuitune_support import registry, vllm_cli
from tuitune_support.ports import free_port
from tuitune_support.registry import pip_download

real_vllm = registry.real_vllm  # the builder whose pip runner the registry wraps


@pytest.fixture
def only_this_index(monkeypatch):
    """pip with no configuration file, no find-links and one index: the URL given, no retries."""

    def use(url: str, retries: int = 0, find_links: str | None = None) -> None:
        monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # (pip: os.devnull loads no config files)
        monkeypatch.setenv("PIP_INDEX_URL", url)
        monkeypatch.setenv("PIP_RETRIES", str(retries))
        monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "5")
        for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
            monkeypatch.delenv(name, raising=False)
        if find_links:
            monkeypatch.setenv("PIP_FIND_LINKS", find_links)

    return use


@pytest.fixture
def empty_index(tmp_path):
    """A real HTTP simple index that answers and lists no file of any project."""
    root = tmp_path / "index"
    (root / "simple" / "sglang").mkdir(parents=True)
    (root / "simple" / "vllm").mkdir(parents=True)
    for d in ("simple", "simple/sglang", "simple/vllm"):
        (root / d / "index.html").write_text("<!DOCTYPE html><html><body></body></html>\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):  # noqa: D401 - keep pytest's output clean
            return

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/simple"
    srv.shutdown()
    srv.server_close()


def fails_without_skipping(call, match: str) -> None:
    """``call`` raises RuntimeError matching ``match``; a skip instead is a failure of this test
    (pytest.raises would let the skip through, and a broken fixture would read as skipped)."""
    try:
        with pytest.raises(RuntimeError, match=match):
            call()
    except pytest.skip.Exception as e:
        pytest.fail(f"skipped where it must fail: {e}")


@pytest.mark.parametrize("retries", [0, 1])  # 0: pip prints no connection error at all
def test_an_unreachable_registry_skips(tmp_path, only_this_index, retries):
    dead = f"http://127.0.0.1:{free_port()}/simple"  # nothing listens there
    only_this_index(dead, retries)
    with pytest.raises(pytest.skip.Exception, match=f"the package registry is not reachable here: {dead} does not"):
        pip_download(tmp_path, "sglang==0.5.23")


def test_any_other_pip_failure_fails(tmp_path, only_this_index, empty_index):
    only_this_index(empty_index)  # reachable, but the release is not there: a failure, not a skip
    fails_without_skipping(
        lambda: pip_download(tmp_path, "sglang==0.5.23"), "No matching distribution found for sglang==0.5.23"
    )


def test_a_connection_error_elsewhere_is_no_reason_to_skip(tmp_path, only_this_index, empty_index):
    only_this_index(empty_index, retries=1, find_links=f"http://127.0.0.1:{free_port()}/wheels/")
    with pytest.raises(real_vllm.Unreachable):  # pip's words alone say "unreachable"
        real_vllm._pip(Path(sys.executable), "download", "--no-deps", "-d", str(tmp_path), "sglang==0.5.23")
    fails_without_skipping(lambda: pip_download(tmp_path, "sglang==0.5.23"), f"yet its index {empty_index} answers")
    assert registry.unreachable(empty_index) is None and registry.index_url() == empty_index


def test_vllms_command_line_build_tells_the_two_apart(tmp_path, only_this_index, empty_index, monkeypatch):
    """tuitune_support.vllm_cli's pip (the test of vLLM's parser skips on Unreachable only)."""
    monkeypatch.setattr(vllm_cli, "PYTHON", Path(sys.executable))
    assert vllm_cli.Unreachable is real_vllm.Unreachable
    only_this_index(f"http://127.0.0.1:{free_port()}/simple")
    with pytest.raises(vllm_cli.Unreachable):
        vllm_cli._pip("download", "--no-deps", "-d", str(tmp_path), f"vllm=={vllm_cli.RELEASE}")
    only_this_index(empty_index)
    with pytest.raises(RuntimeError, match=f"No matching distribution found for vllm=={vllm_cli.RELEASE}"):
        vllm_cli._pip("download", "--no-deps", "-d", str(tmp_path), f"vllm=={vllm_cli.RELEASE}")
