"""Presets: shipped files, round trips, errors, rendering, diff, lint, schema, lookup."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tuitune import preset as P
from tuitune_support.paths import ROOT

SHIPPED = sorted((ROOT / "presets").glob("*.yaml"))
MIN = "name: x\nserver:\n  log: /tmp/x.log\n"


def test_every_shipped_preset_validates_and_renders():
    assert len(SHIPPED) >= 9
    for path in SHIPPED:
        p = P.load(path)
        cmd = P.launch_command(p)
        assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0, path
        assert cmd.splitlines()[1].startswith("setsid nohup env ") and cmd.endswith("echo $!")


def test_seed_command_lines_reproduced_exactly():
    # the seed's C4 command (shared/seeds/000): same variables, same flags and values
    p = P.load(ROOT / "presets/c4-eagle3-2step-nccl.yaml")
    line = P.launch_command(p).splitlines()[1]
    words = shlex.split(line.replace('"$HOME"', "~"))
    env = dict(w.split("=", 1) for w in words[3:] if "=" in w and not w.startswith("-"))
    env.pop("PYTHONPATH")  # the probe (issue 8) rides along; everything else is the seed's
    assert env == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
        "EAGLE3_PROFILE": "1",
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
    }
    argv = words[words.index("sglang.launch_server") + 1 : words.index("2>&1") - 1 if "2>&1" in words else None]
    seed = (
        "--model-path /shared/kimi-k2.5-int4 --trust-remote-code --tp-size 8 --mem-fraction-static 0.88 "
        "--host 0.0.0.0 --port 8000 --num-continuous-decode-steps 4 --disable-custom-all-reduce "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path /data/eagle3/output_100k_sglang/4 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 3 --speculative-num-steps 2"
    ).split()

    def pairs(a):
        out, i = set(), 0
        while i < len(a):
            if i + 1 < len(a) and not a[i + 1].startswith("--"):
                out.add((a[i], a[i + 1]))
                i += 2
            else:
                out.add((a[i], None))
                i += 1
        return out

    rendered = [w for w in argv if not w.startswith(">")]
    assert pairs(rendered) == pairs(seed)
    assert "~/ml-env/bin/python3" in words and ">/data/eagle3/synth_100k/logs/sglang_eagle3_nccl_2step.log" in line
    base = P.load(ROOT / "presets/c2-baseline-nccl.yaml")
    assert "EAGLE3_PROFILE" not in P.launch_command(base) and "speculative" not in P.launch_command(base)
    assert "NCCL_" not in P.launch_command(P.load(ROOT / "presets/c1-baseline-untuned.yaml"))


def test_round_trip_minimal_and_stable(tmp_path):
    for path in SHIPPED:
        p = P.load(path)
        out = P.save(p, tmp_path / path.name)
        again = P.load(out)
        assert again == p and P.dumps(again) == P.dumps(p)
    p = P.loads(MIN)
    assert P.dumps(p) == "name: x\ntarget: local\nserver:\n  log: /tmp/x.log\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            MIN + "env:\n  NCCL_PROTO: LLL\n",
            "f.yaml: env.NCCL_PROTO: 'LLL' is not one of LL, LL128, Simple (optionally ^-prefixed or per collective)",
        ),
        (MIN + "env:\n  NCCL_NTHREADS: 100\n", "f.yaml: env.NCCL_NTHREADS: 100 is not a multiple of 32 in [64, 512]"),
        (MIN + "env:\n  NCCL_P2P_LEVEL: sys\n", "f.yaml: env.NCCL_P2P_LEVEL: 'sys' is not one of LOC, NVL"),
        (MIN + "bogus: 1\n", "f.yaml: bogus: unknown key"),
        ("name: x\n", "f.yaml: server: required key is missing"),
        (MIN + "server2: {}\n", "f.yaml: server2: unknown key"),
        (MIN + "  port: 99999\n", "f.yaml: server.port: 99999: Input should be less than or equal to 65535"),
        (
            MIN
            + "speculative:\n  algorithm: EAGLE3\n  draft_model_path: /d\n  num_steps: 2\n  eagle_topk: 2\n  num_draft_tokens: 9\n",
            "f.yaml: speculative: num_draft_tokens 9 is more than num_steps * eagle_topk + 1 = 5",
        ),
        (
            MIN + "speculative:\n  algorithm: EAGLE3\n  draft_model_path: /d\n  eagle_topk: 2\n",
            "f.yaml: speculative: num_steps, eagle_topk and num_draft_tokens are all-or-none",
        ),
        (
            MIN + "speculative:\n  algorithm: EAGLE3\n  num_steps: 2\n",
            "f.yaml: speculative: draft_model_path is required for EAGLE3",
        ),
        (MIN + "  args:\n    --tp-size: 8\n", "write it without the leading dashes"),
        (MIN + "  args:\n    port: 1\n", "flag 'port' is set by server.port"),
        (MIN + 'env:\n  A: "x\\ny"\n', "holds a newline or NUL byte"),
        ("name: x\nserver: [\n", "f.yaml: YAML syntax error at line 3, column 1"),
        ("- a\n- b\n", "f.yaml: a preset is a YAML mapping"),
    ],
)
def test_errors_are_one_clear_sentence(text, expected):
    with pytest.raises(P.PresetError) as e:
        P.loads(text, "f.yaml")
    assert str(e.value).startswith(expected) or expected in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_topk1_derives_draft_tokens_and_marks_it():
    p = P.loads(MIN + "speculative:\n  algorithm: EAGLE3\n  draft_model_path: /d\n  num_steps: 3\n  eagle_topk: 1\n")
    assert "--speculative-num-draft-tokens" in P.launch_command(p) and P.flatten(p)["speculative.num_draft_tokens"] == 4
    assert "speculative.num_draft_tokens" in P.derived_keys(p)
    adj = P.loads(
        MIN
        + "speculative:\n  algorithm: EAGLE3\n  draft_model_path: /d\n  num_steps: 3\n  eagle_topk: 1\n  num_draft_tokens: 7\n"
    )
    assert any("adjusted by SGLang" in w for w in P.warnings(adj))
    assert P.flatten(adj)["speculative.num_draft_tokens"] == 4


def test_quoting_and_home(tmp_path):
    p = P.loads(
        "name: q\nserver:\n  python: ~/env/bin/python3\n  workdir: /tmp/a b\n  log: ~/logs/x y.log\n"
        '  args:\n    model-path: "/m/it\'s $HOME; rm -rf /"\nenv:\n  FOO: "a b\'c"\n'
    )
    cmd = P.launch_command(p)
    assert (
        "cd -- '/tmp/a b' || exit 1" in cmd and '"$HOME"/env/bin/python3' in cmd and "\"$HOME\"/'logs/x y.log'" in cmd
    )
    out = subprocess.run(
        ["bash", "-c", f"set -- {P.server_argv(p).split(' ', 1)[1]}; printf '%s\\n' \"$@\""],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert "FOO=a b'c" in out and "/m/it's $HOME; rm -rf /" in out


def test_diff_lint_with_changes():
    a = P.load(ROOT / "presets/c2-baseline-nccl.yaml")
    b = P.with_changes(a, {"env.NCCL_PROTO": "Simple", "server.args.tp-size": 4, "env.NCCL_ALGO": None})
    keys = {k: (va, vb) for k, va, vb in P.diff(a, b)}
    assert keys == {"env.NCCL_PROTO": ("LL", "Simple"), "server.args.tp-size": (8, 4), "env.NCCL_ALGO": ("Ring", None)}
    with pytest.raises(P.PresetError):
        P.with_changes(a, {"env.NCCL_PROTO": "bogus"})
    nv = P.loads(
        MIN
        + "  args:\n    tp-size: 8\nenv:\n  NCCL_PROTO: LL\n  NCCL_ALGO: NVLSTree\n  NCCL_DEBUG: INFO\nprofile: true\n"
    )
    advice = " ".join(P.lint(nv))
    for needle in ("custom all-reduce is on", "NVLSTree", "probe is on", "NCCL_DEBUG"):
        assert needle in advice
    assert not any("custom all-reduce" in x for x in P.lint(a))


def test_schema_and_find(tmp_path, monkeypatch):
    schema = P.json_schema()
    assert schema["properties"]["env"] and "Speculative" in json.dumps(schema)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "tuitune" / "presets").mkdir(parents=True)
    (tmp_path / "tuitune" / "presets" / "mine.yaml").write_text(MIN.replace("x", "mine", 1))
    assert P.find("mine").parent == tmp_path / "tuitune" / "presets"
    assert P.find("demo") == ROOT / "presets" / "demo.yaml"
    assert any(r[2] == "mine" and r[0] == "user" for r in P.listing())
    with pytest.raises(P.PresetError, match="no such preset"):
        P.find("nonexistent-preset")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tuitune", *args], capture_output=True, text=True, cwd=ROOT)


def test_preset_commands(tmp_path):
    r = run_cli("preset", "show", "c4-eagle3-2step-nccl", "--command")
    assert r.returncode == 0 and r.stdout.startswith('cd -- "$HOME" || exit 1\nsetsid nohup env -- NCCL_PROTO=LL')
    r = run_cli("preset", "show", "demo")
    assert "speculative.num_draft_tokens" in r.stdout and "(derived)" in r.stdout
    r = run_cli("preset", "diff", "c2-baseline-nccl", "c1-baseline-untuned")
    assert "env.NCCL_PROTO" in r.stdout and "LL -> (unset)" in r.stdout
    r = run_cli("preset", "validate", *map(str, SHIPPED))
    assert r.returncode == 0 and r.stdout.count(": ok") == len(SHIPPED)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MIN + "env:\n  NCCL_PROTO: LLL\n")
    r = run_cli("preset", "validate", str(bad))
    assert r.returncode == 2 and "env.NCCL_PROTO: 'LLL' is not one of" in r.stderr and "Traceback" not in r.stderr
    assert run_cli("preset", "list").stdout.count("shipped") >= 9
    assert json.loads(run_cli("preset", "schema").stdout)["title"] == "tuitune preset"
    assert "custom all-reduce" not in run_cli("preset", "lint", "c4-eagle3-2step-nccl").stdout
    r = run_cli("preset", "bogus")
    assert r.returncode == 2
    for cmd in (
        ["bench", "--url", "http://127.0.0.1:1", "--requests", "0"],
        ["ab", "demo", "demo", "--warmup", "-1"],
        ["sweep", "demo", "--grid", "speculative.num_steps=1", "--max-tokens", "1"],
    ):
        r = run_cli(*cmd)
        assert r.returncode == 2 and "must be at least" in r.stderr, (cmd, r.stderr)
