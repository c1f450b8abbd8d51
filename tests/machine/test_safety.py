"""Secrets, file modes and hostile input (issue 13: items 2, 16, 17), with the real pieces: the
simulator as a process, the command line as a subprocess, real files, a real sshd."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.base import redact
from tuitune.experiments import grid as G
from tuitune.machine.control import ServerControl, Status
from tuitune.machine.errors import ControlError
from tuitune.machine.record import ServerRecord, compute_drift
from tuitune.machine.ssh import SshTarget
from tuitune.machine.transport import LocalTransport, SshTransport, TransportError
from tuitune_support.paths import ROOT
from tuitune_support.presets import make_preset
from tuitune_support.procs import tuitune_cli, wait_for

TOKEN = "hf_secret_4711"


cli = tuitune_cli


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- which names are secret, and text masking ----------------------------------------------------


def test_secret_names_and_masks():
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "PGPASS", "GCP_CREDENTIALS"):
        assert redact.secret_env(name), name
    for name in ("TOKENIZERS_PARALLELISM", "NCCL_PROTO", "MAX_TOKENS", "CUDA_VISIBLE_DEVICES"):
        assert not redact.secret_env(name), name
    for flag in ("api-key", "admin-api-key", "hf-token", "token", "ssl-keyfile-password", "client-secret"):
        assert redact.secret_flag(flag), flag
    for flag in ("max-total-tokens", "speculative-num-draft-tokens", "speculative-token-map", "tokenizer-path"):
        assert not redact.secret_flag(flag), flag
    assert redact.argv(["-m", "x", "--api-key", "sk-1", "--api-key=sk-2", "--port", "1"]) == [
        "-m",
        "x",
        "--api-key",
        "••••",
        "--api-key=••••",
        "--port",
        "1",
    ]
    cases = {
        "server_args=ServerArgs(api_key='sk-live-1', admin_api_key=None, tokenizer_path='/t')": "server_args=ServerArgs(api_key='••••', admin_api_key=None, tokenizer_path='/t')",
        "launch --hf-token hf_x --max-total-tokens 4096": "launch --hf-token •••• --max-total-tokens 4096",
        "env 'HF_TOKEN=hf_y' 'NCCL_PROTO=LL'": "env 'HF_TOKEN=••••' 'NCCL_PROTO=LL'",
        '{"api_key": "sk-z", "port": 1}': '{"api_key": "••••", "port": 1}',
        "Authorization: Bearer abc.def": "Authorization: Bearer ••••",
    }
    for line, want in cases.items():
        assert redact.text(line) == want
    # the lines a server prints most are left exactly as they are
    decode = (
        "[2026-03-16 11:32:10 TP0] Decode batch, #running-req: 8, #token: 5120, token usage: 0.03, "
        "gen throughput (token/s): 812.40, #queue-req: 0"
    )
    assert redact.text(decode) == decode
    assert redact.text("loaded with hunter22 as the password", ["hunter22"]) == "loaded with •••• as the password"


def test_parse_command_masks_secrets_in_error_text(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "ValueError: invalid ServerArgs(api_key='sk-live-9', port=1)\n"
        "EAGLE3_PROFILE draft_ms=x verify_ms=1 extend_ms=1 accept_len=1 HF_TOKEN=hf_leak\n"
    )
    r = cli("parse", str(log), "--json")
    assert r.returncode == 0 and "sk-live-9" not in r.stdout and "hf_leak" not in r.stdout
    kinds = [json.loads(x)["kind"] for x in r.stdout.splitlines()]
    assert kinds == ["error", "malformed"] and r.stdout.count("••••") == 2


def test_status_drift_and_capture_meta_mask_secrets():
    p = make_preset(Path("/tmp"), env={"HF_TOKEN": "running-value", "NCCL_PROTO": "LL"}, args={"api-key": "sk-live-1"})
    drift = compute_drift(
        P.with_changes(p, {"env.HF_TOKEN": "preset-value"}),
        ["python", "-m", "x", *p.flags()],
        {"HF_TOKEN": "running-value", "NCCL_PROTO": "LL", "EAGLE3_PROFILE": "1"},
    )
    assert [str(d) for d in drift] == ["env.HF_TOKEN: running ••••, preset •••• (values differ)"]
    rec = ServerRecord(1, 2, "t", "h", 0.0, "/l", argv=p.flags(), env=p.launch_env())
    text = json.dumps(Status(True, rec, drift=drift).to_dict())
    assert "running-value" not in text and "preset-value" not in text and "sk-live-1" not in text
    meta = redact.preset_dict(P.to_dict(p))
    assert meta["env"]["HF_TOKEN"] == "••••" and meta["server"]["args"]["api-key"] == "••••"
    assert meta["env"]["NCCL_PROTO"] == "LL"


# ---- everything printed or written by a live session, end to end ---------------------------------


def test_no_secret_in_status_drift_logs_record_or_preset_show(tmp_path):
    p = make_preset(tmp_path, "sec", env={"HF_TOKEN": TOKEN, "NCCL_PROTO": "LL"})
    yaml_a = P.save(p, tmp_path / "a.yaml")
    yaml_b = P.save(P.with_changes(p, {"env.HF_TOKEN": TOKEN + "x"}), tmp_path / "b.yaml")
    r = cli("launch", str(yaml_a))
    assert r.returncode == 0, r.stderr
    try:
        out = []
        for args in (
            ("status", str(yaml_b)),
            ("status", str(yaml_b), "--json"),
            ("logs", str(yaml_a), "-n", "200"),
            ("preset", "show", str(yaml_a)),
            ("preset", "show", str(yaml_a), "--json"),
            ("preset", "show", str(yaml_a), "--command"),
            ("preset", "diff", str(yaml_a), str(yaml_b)),
        ):
            r = cli(*args)
            # 4: running, drifted; 1: the presets differ (preset diff, as diff(1))
            assert r.returncode == (4 if args[0] == "status" else 1 if args[1:2] == ("diff",) else 0), (args, r.stderr)
            out.append(r.stdout + r.stderr)
        assert all(TOKEN not in o for o in out), [o for o in out if TOKEN in o][0]
        assert "env.HF_TOKEN: running ••••, preset •••• (values differ)" in out[0]
        assert json.loads(out[1])["drift"] == [{"key": "env.HF_TOKEN", "running": "••••", "preset": "••••"}]
        assert re.search(r"env\.HF_TOKEN +••••", out[3]) and " HF_TOKEN=•••• " in out[5]
        assert "•••• -> •••• (values differ)" in out[6]
        assert TOKEN in cli("preset", "show", str(yaml_a), "--reveal").stdout  # the owner asks for it

        # a capture: created 0644 by someone before, then recorded with --raw while the server logs
        # a line that carries the token (as a server printing its environment would)
        cap = tmp_path / "cap.jsonl"
        cap.write_text("old\n")
        os.chmod(cap, 0o644)
        rec = subprocess.Popen(
            [sys.executable, "-m", "tuitune", str(yaml_a), "--record", str(cap), "--raw", "--duration", "6"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        log = Path(p.server.log)

        # the idle server writes nothing more, so lines appended once the recorder's tail runs stay
        wait_for(
            lambda: subprocess.run(["pgrep", "-f", f"tail .*{log}"]).returncode == 0,
            30,
            what="the recorder to follow the log",
        )
        with open(log, "a") as f:
            f.write(f"environment: HF_TOKEN={TOKEN} NCCL_PROTO=LL\nValueError: token {TOKEN} rejected\n")
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        data = cap.read_text()
        assert mode(cap) == 0o600 and TOKEN not in data
        assert "environment: HF_TOKEN=•••• NCCL_PROTO=LL" in data and "token •••• rejected" in data
    finally:
        cli("stop", str(yaml_a))


def test_sweep_results_mask_secret_grid_values(tmp_path):
    p = make_preset(tmp_path, "sw", spec_steps=None, profile=False)
    base = P.save(p, tmp_path / "sw.yaml")
    out = tmp_path / "out"
    r = cli(
        "sweep",
        str(base),
        "--grid",
        "env.HF_TOKEN=tokA_1111,tokB_2222",
        "--baseline-every",
        "0",
        "--requests",
        "2",
        "--max-tokens",
        "20",
        "--out",
        str(out),
        "--no-plot",
        timeout=240,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    written = (out / "results.jsonl").read_text() + (out / "results.csv").read_text() + r.stdout + r.stderr
    assert "tokA_1111" not in written and "tokB_2222" not in written
    labels = {json.loads(x)["label"] for x in (out / "results.jsonl").read_text().splitlines()}
    assert {"HF_TOKEN=••••#1", "HF_TOKEN=••••#2"} <= labels  # two tokens, still two configurations
    # a best.yaml (written only when a configuration beats the baseline: two equal tokens may not) is a
    # preset to launch: it holds the real value, never the mask
    best = out / "best.yaml"
    if best.exists():
        assert P.load(best).env["HF_TOKEN"] in ("tokA_1111", "tokB_2222")


# ---- file modes ------------------------------------------------------------------------------------


def test_trust_creates_ssh_dir_0700_and_known_hosts_0600(sshd, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = cli("trust", "127.0.0.1", "--port", str(sshd.port), "--yes", env={"HOME": str(home)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert mode(home / ".ssh") == 0o700 and mode(home / ".ssh" / "known_hosts") == 0o600


# ---- presets: strict input ---------------------------------------------------------------------------

MIN = "name: x\nserver:\n  log: /tmp/x.log\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (MIN + "  port: 1\n  port: 2\n", "key 'port' appears twice (lines 4 and 5)"),
        (
            "name: x\nenv:\n  NCCL_PROTO: LL\n  NCCL_ALGO: Ring\n  NCCL_PROTO: Simple\nserver: {log: /x}\n",
            "key 'NCCL_PROTO' appears twice (lines 3 and 5)",
        ),
        (MIN + "  port: true\n", "server.port: True: Input should be a valid integer"),
        (MIN + "profile: 1\n", "profile: 1: Input should be a valid boolean"),
        (MIN + "  args: {tp-size: [1, 2]}\n", "server.args.tp-size: expected true/false, a number or text, not a list"),
        ("name: x\nserver: 5\n", "server: expected a mapping (a YAML section of keys), not an integer"),
        ("name: x\nserver:\n  log: '-n1 /etc/shadow'\n", "server.log: '-n1 /etc/shadow' is not an absolute path"),
        ("name: x\nserver:\n  log: x.log\n", "server.log: 'x.log' is not an absolute path"),
        (MIN + "  python: -c\n", "server.python: '-c' is not a command"),
        ("name: x\nserver: " + "[" * 500 + "]" * 500 + "\n", "nested too deeply"),
        ("name: x\nserver:\n" + "".join("  " * i + "- \n" for i in range(1, 600)), "nested too deeply"),
    ],
    ids=[
        "duplicate",
        "duplicate-env",
        "bool-port",
        "int-bool",
        "list-flag",
        "not-a-section",
        "log-option",
        "log-relative",
        "python-option",
        "deep-flow",
        "deep-block",
    ],
)  # short ids: the test id goes into the environment
def test_preset_input_is_refused_in_one_sentence(tmp_path, text, message):
    with pytest.raises(P.PresetError) as e:
        P.loads(text, "p.yaml")
    assert message in str(e.value) and str(e.value).startswith("p.yaml: ") and "\n" not in str(e.value)
    f = tmp_path / "p.yaml"
    f.write_text(text)
    r = cli("preset", "validate", str(f))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_grid_keys_are_checked_against_the_schema(tmp_path):
    with pytest.raises(G.GridError, match="server.port is a value, not a section"):
        G.parse(["server.port.x=1,2"])
    with pytest.raises(G.GridError, match="unknown key server.bogus"):
        G.parse(["server.bogus=1"])
    with pytest.raises(G.GridError, match="nested too deeply"):
        G.parse(["server.args.tp-size=" + "[" * 3000])
    assert G.parse(["server.args.tp-size=1,2", "env.NCCL_PROTO=LL,unset"])
    r = cli("sweep", "demo", "--grid", "server.port.x=1,2", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "server.port is a value, not a section" in r.stderr and "Traceback" not in r.stderr


# ---- one sentence instead of a traceback -------------------------------------------------------------


def test_report_skips_and_counts_damaged_records(tmp_path):
    good = {"kind": "profile", "draft_ms": 1, "verify_ms": 20, "extend_ms": 1, "accept_len": 2, "cycle_ms": 22}
    lines = [
        {"kind": "meta", "schema": 1, "preset": "not a mapping"},
        {**good, "t": None, "m": 1.0},
        {**good, "t": "x", "m": 1.0},
        {**good, "draft_ms": "abc", "t": 1.0, "m": 1.0},
        {"kind": "decode", "gen_throughput": [1], "t": 1.0, "m": 1.0},
        {**good, "t": 1.0, "m": 2.0},
    ]
    cap = tmp_path / "bad.jsonl"
    cap.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = cli("report", str(cap), "--no-chart")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "1 events" in r.stdout and "4 record(s) skipped" in r.stdout and "22.00" in r.stdout
    j = json.loads(cli("report", str(cap), "--json").stdout)
    assert j[0]["skipped"] == 4 and j[0]["events"] == 1


async def test_missing_or_broken_server_package_is_one_sentence(tmp_path, monkeypatch):
    """find_spec("sglang.launch_server") raises when sglang itself is missing; a package whose
    __init__ fails says why."""
    p = make_preset(tmp_path, args={}, env={})
    t = LocalTransport()
    missing = P.with_changes(p, {"server.module": "sglang.launch_server"})
    with pytest.raises(ControlError, match="module sglang.launch_server is not installed for"):
        await ServerControl(t, missing, state_dir=str(tmp_path / "st")).preflight(None)
    pkg = tmp_path / "lib" / "brokenpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('CUDA driver too old')\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'lib'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    broken = P.with_changes(p, {"server.module": "brokenpkg.server"})
    with pytest.raises(ControlError, match=r"brokenpkg.server cannot be imported .*RuntimeError: CUDA driver too old"):
        await ServerControl(t, broken, state_dir=str(tmp_path / "st")).preflight(None)


@pytest.mark.parametrize("which", ["pub", "missing", "garbage"])
async def test_bad_identity_file_is_one_sentence(sshd, tmp_path, which):
    path = {"pub": tmp_path / "id.pub", "missing": tmp_path / "nope", "garbage": tmp_path / "id"}[which]
    if which == "pub":
        path.write_bytes((sshd.root / "authorized_keys").read_bytes())  # the client's public key
    elif which == "garbage":
        path.write_text("not a key\n")
    t = SshTransport(SshTarget(**{**sshd.target(), "identity_file": str(path)}))
    with pytest.raises(TransportError) as e:
        await t.connect()
    msg = str(e.value)
    assert f"identity_file {path}" in msg and "\n" not in msg
    if which == "pub":
        assert "public key" in msg


async def test_tui_turns_worker_errors_into_notifications(sshd, tmp_path):
    """A .pub identity_file (an error the transport names) and an error nobody expected: the TUI
    stays up and shows each as a notification instead of exiting with WorkerFailed."""
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.settings import UserConfig

    pub = tmp_path / "id.pub"
    pub.write_bytes((sshd.root / "authorized_keys").read_bytes())
    p = make_preset(tmp_path, target={**sshd.target(), "identity_file": str(pub)})

    class Unlucky(Session):
        async def connect(self):
            raise RuntimeError("something nobody planned for")

    for session, needle in ((Session(p), "public key"), (Unlucky(p), "something nobody planned for")):
        app = TuituneApp(session, autostart="attach", user_config=UserConfig())
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(200):
                if any(needle in m for m in app.messages):
                    break
                await pilot.pause(0.05)
            assert any(needle in m for m in app.messages), app.messages
            assert app.is_running


# ---- parsing never stalls the event loop ---------------------------------------------------------


async def test_hostile_log_lines_never_stall_the_session(tmp_path):
    """A log full of long adversarial lines (one 80 k-character vLLM line used to stall --record for
    30 s): the session's loop keeps ticking, long lines arrive cut and marked, the rest parses."""
    import asyncio

    from tuitune.base.events import LogLine
    from tuitune.machine.session import Session
    from tuitune.measure.parse import TRUNCATED

    p = make_preset(tmp_path, "hostile")
    hostile = [
        "SpecDecoding metrics: " + "a" * 80_000,
        "SpecDecoding metrics: Per-position acceptance rate: " + "0.5, " * 40_000,
        "tail: " * 40_000,
        "EAGLE3_PROFILE " + "x=1 " * 60_000,
        "Decode batch, " + "a: " * 60_000,
        "--api-key " * 20_000,
        "HF_TOKEN=" * 20_000,
    ]
    Path(p.server.log).write_text(
        "\n".join(hostile * 4) + "\n[2026-01-01 00:00:00] The server is fired up and ready to roll!\n"
    )
    session = Session(p, state_dir=str(tmp_path / "state"))
    got: list = []
    session.subscribe(got.extend)
    gaps = []

    async def ticker():
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.ensure_future(ticker())
    try:
        await session.follow()
        for _ in range(600):
            if any(e.kind == "ready" for e in got):
                break
            await asyncio.sleep(0.05)
    finally:
        tick.cancel()
        await session.close()
    assert any(e.kind == "ready" for e in got), "the tail never got through the hostile lines"
    lines = [e.text for e in got if isinstance(e, LogLine)]
    assert len(lines) == len(hostile) * 4 + 1 and sum(x.endswith(TRUNCATED) for x in lines) == len(hostile) * 4
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.2f} s"  # ~0.05 s here; minutes before


def test_a_saved_preset_holding_a_secret_is_private(tmp_path):
    p = make_preset(tmp_path, env={"NCCL_PROTO": "LL"})
    assert mode(P.save(p, tmp_path / "plain.yaml")) == 0o666 & ~_umask()
    secret = P.with_changes(p, {"server.args.api-key": "sk1"})
    (tmp_path / "s.yaml").write_text("old")
    os.chmod(tmp_path / "s.yaml", 0o644)
    saved = P.save(secret, tmp_path / "s.yaml")
    assert mode(saved) == 0o600 and P.load(saved).server.args["api-key"] == "sk1"
    assert "warning" not in cli("preset", "validate", str(saved)).stdout
    os.chmod(saved, 0o644)  # made readable by hand: validate and lint say so
    for action in ("validate", "lint"):
        out = cli("preset", action, str(saved)).stdout
        assert "holds a secret and other users can read it (mode 644); chmod 600 it" in out, out


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
