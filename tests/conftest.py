"""The suite's hooks (the CPU gate, xdist groups, reruns' first failures) and its fixtures: the
simulator as a real subprocess, a real OpenSSH sshd, a release's wheel. The fixtures are thin: what
they start and the helpers the test modules import live in the support package (support/,
``tuitune_support``). It sits at the top of tests/, so it applies to every folder below: one per
package folder (tests/measure/ for tuitune/measure/, ...), tests/commands/, tests/real/ and tests/house/
(docs/testing.md, The layout); each folder's own conftest.py only says what the folder holds."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import warnings
from pathlib import Path

import pytest

from tuitune_support.procs import sim_pids
from tuitune_support.registry import pip_download
from tuitune_support.simproc import Sim
from tuitune_support.sshd import SshServer

# `make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`. Tests that share one
# downloaded or built wheel or environment (a module- or session-scoped fixture) are sent to the same
# worker: it is then fetched once, and never built twice at once in the tree (`pip wheel` in ./build,
# tuitune_support/vllm_cli.py in .cache/).
SHARED_FIXTURES = {
    "installed": "built-wheel",
    "src": "vllm-wheel",
    "sglang_release": "sglang-wheel",
    "vllm_python": "vllm-cli",
}


def pytest_addoption(parser):
    parser.addoption(
        "--quiet-tests",
        choices=("gated", "apart", "only"),
        default="gated",
        help="quiet tests (below) that share no engine: run at the CPU gate among the others (gated, the "
        "default, as `make test` runs them), leave them out (apart), or run only them (only: about 6 minutes "
        "in one process)",
    )


def _alone(item) -> bool:
    """A quiet test that needs no shared fixture's worker (a real engine's launch): it can run after the
    others, in a process of its own, instead of waiting at the gate for the test beside it."""
    return item.get_closest_marker("quiet") is not None and item.get_closest_marker("xdist_group") is None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("sim_clock") is not None and item.get_closest_marker("quiet") is None:
            item.add_marker(pytest.mark.quiet)  # alone: never beside a serving engine (nor any other test)
        if item.get_closest_marker("timeout") is None and item.get_closest_marker("quiet") is not None:
            item.add_marker(pytest.mark.timeout(480))  # the suite's 120 s, and the gate's wait
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    phase = config.getoption("--quiet-tests")
    if phase != "gated":
        keep = [item for item in items if _alone(item) == (phase == "only")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


# `--quiet-tests apart` / `only` split the suite in two passes: all but the quiet tests that share no
# engine on two workers, then those in one process with the gate off. Tried as `make test` (CI of
# 2026-12-07: 36:55 + 6:07 against 35:18 for one gated pass the day before) it was no faster: while a
# quiet test waits at the gate, the real engine's worker beside it has both cores, so the wait is not
# idle time; `make test` keeps one pass. The options stay for running the timing tests alone.
#
# `sim_clock` tests (a verdict or a ratio read off the simulator's clock) are `quiet`: each runs alone,
# never beside a serving engine (which keeps both cores busy: in CI, beside one, such tests read 1.47x
# where 1.5x was asked, and "no significant difference" in 6 rounds for a gain a quiet machine measures
# at 1.32x). They used to run on the real engine's worker instead; with two real engines, each on a
# worker of its own (xdist groups real-vllm and real-sglang), no worker is free of an engine.
#
# The CPU gate. Under xdist the two workers share two cores with the engines and simulators they start, so
# a test that compares two clocks (tuitune's bench against an independent client, a relaunch's measured gain
# against the model's) sees the other worker's load as noise, or as bias when that load lands on one side
# only. Such a test is marked `quiet`: it waits for the test running beside it to end and keeps the other
# worker from starting one until it is done (an exclusive flock; every other test holds it shared). A
# turnstile lock in front keeps the shared takers, which come back between every two tests, from starving
# the exclusive one. The setup of a module or session fixture (a real engine's launch: a minute of both
# cores) holds it shared too, so that no quiet test runs beside one (CI once measured 1.275 for a modelled
# 1.146 gain in a quiet test, an engine starting beside it).
_GATE_HELD = []  # this process's gate, while it holds one (a fixture set up inside a test takes none)


@contextlib.contextmanager
def _cpu(quiet: bool):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run or _GATE_HELD:  # one process: nothing runs beside a test
        yield
        return
    base = Path("/tmp") / f"tuitune-tests-{run}"
    with open(f"{base}.turnstile", "a+") as turnstile, open(f"{base}.cpu", "a+") as cpu:
        with _timeout_paused():
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(cpu, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        if not quiet:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        _GATE_HELD.append(quiet)
        try:
            yield
        finally:
            _GATE_HELD.pop()
            fcntl.flock(cpu, fcntl.LOCK_UN)
            if quiet:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


GATE_WAIT_S = 900  # the longest a test waits at the gate (the other worker's test, its own bound) before it fails


@contextlib.contextmanager
def _timeout_paused():
    """The wait at the gate does not count toward the test's pytest-timeout (its SIGALRM timer): a
    test waiting for a quiet one beside it once spent 103 of its 120 s there and timed out in its own
    call. The timer is set to GATE_WAIT_S while waiting, then back to what was left of it."""
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    if not left:  # no timer (one process without pytest-timeout's signal method, or a timer of its own)
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, GATE_WAIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, left)


@pytest.fixture(autouse=True)
def _cpu_gate(request):
    with _cpu(request.node.get_closest_marker("quiet") is not None):
        yield


def _sigint_ignored() -> bool:
    """Whether this process ignores SIGINT (what its children inherit), from the kernel's own mask."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))


@pytest.fixture(autouse=True)
def _sigint_kept(request):
    """A test that leaves the worker ignoring SIGINT is named (a warning) and SIGINT restored: every
    process the later tests start would inherit it (a sweep once ran on unseen after SIGINT)."""
    yield
    if _sigint_ignored():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.warn(f"{request.node.nodeid} left this worker ignoring SIGINT (restored)", stacklevel=1)


_RERUN_FAILURES: list[tuple[str, str]] = []  # (test, its first attempt's failure), in the controller


def pytest_runtest_logreport(report):
    """A test run again (``--reruns``) keeps its first failure: the summary shows only the last
    attempt, which once failed for another reason than the first (its folder left behind), hiding it."""
    if report.outcome == "rerun" and report.longrepr is not None:
        _RERUN_FAILURES.append((report.nodeid, report.longreprtext))


def pytest_terminal_summary(terminalreporter):
    for nodeid, text in _RERUN_FAILURES:
        lines = text.splitlines()
        shown = lines if len(lines) <= 80 else ["…", *lines[-80:]]
        terminalreporter.write_sep("-", f"first attempt of {nodeid} (run again)")
        terminalreporter.write_line("\n".join(shown))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function":
        yield
        return
    with _cpu(False):
        yield


@pytest.fixture
def sim_factory(tmp_path):
    sims: list[Sim] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Sim:
        s = Sim(tmp_path, list(args), env)
        sims.append(s)
        return s

    yield make
    for s in sims:
        s.stop()


@pytest.fixture(scope="session")
def sglang_release(tmp_path_factory) -> Path:
    """SGLang 0.5.23's package directory, from its wheel (downloaded once a session; only the
    speculative sources, the argument definitions (arg_groups) and the dist-info unpacked).
    Skips only when the registry is not reachable (pip_download)."""
    import zipfile

    tmp = tmp_path_factory.mktemp("sglang")
    wheel = pip_download(tmp, "sglang==0.5.23")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(
            tmp / "site",
            [n for n in z.namelist() if n.startswith(("sglang/srt/speculative/", "sglang/srt/arg_groups/", "sglang-"))],
        )
    return tmp / "site" / "sglang"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not Path("/usr/sbin/sshd").exists() or shutil.which("ssh") is None:
        pytest.skip("OpenSSH server not installed (.ci/run installs it)")
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def no_server_left_behind(tmp_path_factory):
    """A failing test must not leave a simulator running: at the end, kill every simulator whose log
    lies under this run's temporary directory (with its process group)."""
    yield
    for pid in sim_pids(str(tmp_path_factory.getbasetemp())):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
