"""Shared fixtures: free ports, the simulator as a real subprocess, a real OpenSSH sshd."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# `make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`. Tests that share one
# downloaded or built wheel or environment (a module- or session-scoped fixture) are sent to the same
# worker: it is then fetched once, and never built twice at once in the tree (`pip wheel` in ./build,
# tests/vllm_cli.py in .cache/).
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def wait_for(cond, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def until(pilot, cond, timeout: float = 20.0, what: str = "condition"):
    """A Pilot test's wait: the app runs (pauses of 50 ms) until cond() holds, on the clock."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_or_dump(proc: subprocess.Popen, timeout: float, what: str = "tuitune") -> int:
    """``proc.wait(timeout)``; past it, the process is asked where it waits (SIGUSR1: tuitune prints
    its threads and asyncio tasks on stderr), then killed, and the failure shows that answer."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    _dump_and_kill(proc, what, timeout)


def run_dumped(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=...)``, but a process that
    outlives the timeout says where it waits before it is killed (``wait_or_dump``)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = None
    if out is None:
        _dump_and_kill(proc, " ".join(str(a) for a in args[2:5]), timeout)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def tuitune_cmd(*args: str, env: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `python -m tuitune ARGS` from the checkout, with ``env``
    over this environment (for a test that drives the process itself; run it with ``cwd=ROOT``)."""
    return [sys.executable, "-m", "tuitune", *args], {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}


def tuitune_cli(*args: str, env: dict | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m tuitune ARGS` (``tuitune_cmd``); one that outlives ``timeout`` says where it
    waited (``run_dumped``)."""
    argv, full = tuitune_cmd(*args, env=env)
    return run_dumped(argv, timeout, env=full, cwd=ROOT, **kw)


def _dump_and_kill(proc: subprocess.Popen, what: str, timeout: float):
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    proc.kill()
    _, err = proc.communicate(timeout=10)
    err = err.decode("utf-8", "replace") if isinstance(err, bytes) else (err or "")
    raise AssertionError(f"{what} still running after {timeout:.0f} s; where it waited:\n{err[-12000:]}")


class Sim:
    """``python -m tuitune.sim`` as a subprocess, its log in a file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None):
        self.port = free_port()
        self.log = tmp / f"sim-{self.port}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        full_env.update(env or {})
        self.args = ["--port", str(self.port), *args]
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuitune.sim", *self.args],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_bytes().decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 20.0) -> None:
        wait_for(
            lambda: http_status(self.url + "/health") == 200 or self.proc.poll() is not None,
            timeout,
            what="sim /health 200",
        )
        assert self.proc.poll() is None, f"sim exited: {self.text()[-2000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(5)


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


def pip_download(dest: Path, requirement: str) -> Path:
    """One release's wheel from the package registry into ``dest`` (no dependencies, for Python
    3.11). The test skips only when the registry's index does not answer (tests/registry.py); any
    other pip failure (no such release, a bad wheel, a full disk) raises and fails the test."""
    import registry

    try:
        registry.pip(
            Path(sys.executable),
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "-d",
            str(dest),
            requirement,
            timeout=600,
        )
    except registry.Unreachable as e:
        pytest.skip(f"the package registry is not reachable here: {e}")
    name = requirement.split("=")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {requirement} succeeded but left no wheel in {dest}")
    return wheels[0]


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


SPEC2 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/d",
    "--speculative-num-steps",
    "2",
    "--speculative-eagle-topk",
    "1",
]
SEED_ARGS = [
    "--tp-size",
    "8",
    "--mem-fraction-static",
    "0.88",
    "--num-continuous-decode-steps",
    "4",
    "--disable-custom-all-reduce",
]
TUNED_NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


# ---- a real OpenSSH sshd on loopback (TESTING.md recipe) ------------------------------------------


class SshServer:
    def __init__(self, root: Path):
        import asyncssh

        self.root = root
        self.port = free_port()
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_path = root / "host_key"
        self.host_key_path.write_bytes(host_key.export_private_key())
        os.chmod(self.host_key_path, 0o600)
        self.host_public = host_key.export_public_key().decode().strip()
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = root / "id_ed25519"
        self.client_key_path.write_bytes(client_key.export_private_key())
        os.chmod(self.client_key_path, 0o600)
        (root / "authorized_keys").write_bytes(client_key.export_public_key())
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_public}\n")
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key_path}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "AllowTcpForwarding yes",
                    "Subsystem sftp internal-sftp",
                    "MaxStartups 100:30:200",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.err", "ab"),
        )
        wait_for(self._accepts, 10, what="sshd to accept TCP")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def kill_connections(self) -> None:
        """Kill the per-connection sshd children (the link drops; the listener stays)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        for pid in out.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def target(self) -> dict:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "identity_file": str(self.client_key_path),
            "known_hosts": str(self.known_hosts),
        }


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not Path("/usr/sbin/sshd").exists() or shutil.which("ssh") is None:
        pytest.skip("OpenSSH server not installed (.ci/run installs it)")
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


def collect_says(app) -> list[str]:
    """Every message the app says from now on (``app.say`` still shows them), in order."""
    said: list[str] = []
    real_say = app.say

    def say(msg, *a, **kw):
        said.append(msg)
        return real_say(msg, *a, **kw)

    app.say = say
    return said


def sim_argv(port: int, steps: int = 2) -> list[str]:
    """The simulator's command line as a person types it: EAGLE-3 with ``steps`` steps (no draft
    token count: SGLang derives it), fast (a 0.3 s load, ten times the modelled speed)."""
    return [
        *(sys.executable, "-m", "tuitune.sim", "--model-path", "/m/llama", "--port", str(port), "--tp-size", "2"),
        *("--sim-speedup", "10", "--sim-load-seconds", "0.3", "--decode-log-interval", "10"),
        *("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"),
        *("--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1"),
    ]


class HandServer:
    """A server started as a person starts one (`cd DIR; VAR=… nohup python -m … > LOG 2>&1 &`): a
    plain child of the test, no tuitune state; ``log`` None: its output into a pipe (a supervisor's).
    Ready when ``port`` answers /health. ``group``: it leads a process group of its own (a shell's
    background job; an engine's workers go with it when it stops)."""

    def __init__(
        self, argv: list[str], port: int, env: dict, log: Path | None, cwd=None, timeout: float = 30, group=False
    ):
        self.port, self.log, self.group = port, log, group
        out = log.open("ab") if log else subprocess.PIPE
        try:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=group
            )
        finally:
            if log:
                out.close()
        url = f"http://127.0.0.1:{port}/health"
        wait_for(lambda: http_status(url) == 200 or self.proc.poll() is not None, timeout, what=f"`{argv[2]}` by hand")
        assert self.proc.poll() is None, log.read_text()[-2000:] if log else "exited"

    def stop(self) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        elif self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def make_preset(
    tmp: Path,
    name: str = "t",
    target=None,
    args: dict | None = None,
    env: dict | None = None,
    spec_steps: int | None = 2,
    port: int | None = None,
    profile: bool = True,
    **bench,
):
    """A simulator preset that starts in a fraction of a second, its log under ``tmp``."""
    from tuitune import preset as P

    data = {
        "name": name,
        "target": target or "local",
        "server": {
            "python": sys.executable,
            "module": "tuitune.sim",
            "log": str(tmp / f"{name}.log"),
            "port": port or free_port(),
            "args": {
                "sim-load-seconds": 0.3,
                "sim-speedup": 10,
                "decode-log-interval": 10,
                "tp-size": 2,
                **(args or {}),
            },
        },
        "env": env or {},
        "profile": profile,
        "bench": {"requests": 3, "warmup": 0, "max_tokens": 60, **bench},
    }
    if spec_steps:
        data["speculative"] = {
            "algorithm": "EAGLE3",
            "draft_model_path": "/d",
            "num_steps": spec_steps,
            "eagle_topk": 1,
        }
    return P.from_dict(data)


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of this process group is left."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


def sim_pids(base: str) -> list[int]:
    """Simulator processes whose output goes to a file under ``base``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            fd1 = os.readlink(proc / "fd" / "1")
        except OSError:
            continue
        if b"tuitune.sim" in cmd and fd1.startswith(base):
            out.append(int(proc.name))
    return out


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
