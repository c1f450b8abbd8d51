"""The documentation: the site builds strictly, every command, flag and preset key is on it, and the
README stays a front door."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import cli
from tuitune import preset as P
from tuitune_support.paths import ROOT

DOCS = ROOT / "docs"
README_MAX_LINES = 200


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner, not a warning of ours
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )


def docs_text() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))


# ---- the site ------------------------------------------------------------------------------------


def test_the_site_builds_strictly(tmp_path):
    r = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    pages = {p.stem for p in DOCS.glob("*.md")}
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")} | {"index"}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"


def _copy_site(tmp: Path) -> Path:
    """mkdocs.yml and docs/ in ``tmp``; screenshots/ linked, as docs/screenshots links ../screenshots."""
    shutil.copy(ROOT / "mkdocs.yml", tmp / "mkdocs.yml")
    shutil.copytree(DOCS, tmp / "docs", symlinks=True)
    (tmp / "screenshots").symlink_to(ROOT / "screenshots")
    return tmp / "mkdocs.yml"


@pytest.mark.parametrize(
    "breakage, said",
    [
        ("link", "not found"),
        ("anchor", "does not contain an anchor"),
        ("off-nav", 'not included in the "nav"'),
        ("image", "not found"),
    ],
)
def test_the_strict_build_fails_on_a_broken_link_anchor_image_or_a_page_off_the_nav(tmp_path, breakage, said):
    config = _copy_site(tmp_path)
    page = tmp_path / "docs" / "presets.md"
    if breakage == "link":
        page.write_text(page.read_text() + "\nSee [nothing](no-such-page.md).\n")
    elif breakage == "anchor":
        page.write_text(page.read_text() + "\nSee [nothing](commands.md#no-such-section).\n")
    elif breakage == "image":
        page.write_text(page.read_text() + "\n![nothing](screenshots/no-such-screenshot.svg)\n")
    else:
        (tmp_path / "docs" / "orphan.md").write_text("# A page nobody listed\n")
    r = mkdocs_build(config, tmp_path / "site")
    assert r.returncode != 0
    assert said in r.stdout + r.stderr


# ---- commands and flags --------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]


def cli_commands() -> dict[str, list[str]]:
    """Every command of the CLI's parser (``preset show``, ``probe check`` …) and its flags."""
    out: dict[str, list[str]] = {}
    for name in cli.COMMANDS:
        parser = cli.build_command_parser(name)
        out[name] = _flags(parser)
        for sub, sp in _subcommands(parser).items():
            out[f"{name} {sub}"] = _flags(sp)
    return out


def test_the_parser_has_commands_to_check():
    cmds = cli_commands()
    assert {"bench", "preset", "preset show", "probe check", "tune"} <= set(cmds)
    assert "--concurrency" in cmds["bench"] and "--reveal" in cmds["preset show"]


def test_every_command_is_on_a_docs_page_and_in_the_readme():
    text = docs_text()
    readme = (ROOT / "README.md").read_text()
    missing = [c for c in cli_commands() if f"tuitune {c}" not in text]
    assert not missing, f"commands on no docs page: {missing}"
    top = [c for c in cli.COMMANDS if f"`tuitune {c}" not in readme]
    assert not top, f"commands missing from the README's table: {top}"
    assert "tuitune --record" in readme and "tuitune --record" in text


def _sections(md: str) -> dict[str, str]:
    """Heading text -> that section's text, subsections included (fenced blocks are not headings)."""
    heads: list[tuple[int, int, str]] = []  # (line, level, title)
    lines = md.split("\n")
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#+) (.*)", line)):
            heads.append((i, len(m.group(1)), m.group(2).strip()))
    out = {}
    for k, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out[title] = "\n".join(lines[i + 1 : end])
    return out


def _mentions(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_flag_is_in_its_commands_section_of_the_commands_page():
    sections = _sections((DOCS / "commands.md").read_text())
    missing = []
    for cmd, flags in cli_commands().items():
        top = cmd.split()[0]
        section = sections.get(f"`tuitune {top}`")
        if section is None:
            missing.append(f"no section `tuitune {top}`")
            continue
        missing += [f"tuitune {cmd} {f}" for f in flags if not _mentions(section, f)]
    main = sections.get("`tuitune [PRESET]`", "") + sections.get("`tuitune --record`", "")
    missing += [f"tuitune {f}" for f in _flags(cli.build_main_parser()) if not _mentions(main, f)]
    assert not missing, f"not on docs/commands.md in their command's section: {missing}"


# ---- preset keys ---------------------------------------------------------------------------------


def preset_keys() -> list[str]:
    """Every key of the preset's JSON Schema, dotted (a list's items as ``*``: ``target.nodes.*.host``)."""
    schema = P.json_schema()
    defs = schema.get("$defs", {})

    def walk(node: dict, prefix: str) -> list[str]:
        if "$ref" in node:
            return walk(defs[node["$ref"].rsplit("/", 1)[-1]], prefix)
        out = []
        for alt in node.get("anyOf", []):
            out += walk(alt, prefix)
        if "items" in node:
            out += walk(node["items"], f"{prefix}.*")
        for key, sub in node.get("properties", {}).items():
            dotted = f"{prefix}.{key}" if prefix else key
            out += [dotted, *walk(sub, dotted)]
        return out

    return list(dict.fromkeys(walk(schema, "")))


def test_every_preset_key_is_on_the_presets_page():
    keys = preset_keys()
    assert {"server.engine", "speculative.num_speculative_tokens", "target.nodes.*.server.port"} <= set(keys)
    page = (DOCS / "presets.md").read_text()
    missing = [k for k in keys if f"`{k}`" not in page]
    assert not missing, f"preset keys missing from docs/presets.md (add them to its key tables): {missing}"


# ---- the README -----------------------------------------------------------------------------------


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it within {README_MAX_LINES} (move the rest to docs/)"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):  # its links point at files that exist
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


# ---- the architecture page -----------------------------------------------------------------------


def test_the_architecture_page_names_every_folder_and_module():
    """The old README's "Layout" drifted (10 modules missing): the page must name every package
    folder and every module in it, so a new one is documented where the layers are."""
    page = (DOCS / "architecture.md").read_text()
    pkg = ROOT / "tuitune"
    missing, seen = [], 0
    for init in sorted(pkg.rglob("__init__.py")):
        folder = init.parent
        rel = folder.relative_to(ROOT).as_posix()
        if folder != pkg and f"`{rel}/`" not in page:
            missing.append(f"{rel}/")
        for module in sorted(folder.glob("*.py")):
            if module.name in ("__init__.py", "__main__.py"):
                continue
            seen += 1
            if not re.search(rf"`{module.stem}`|{re.escape(module.name)}", page):
                missing.append(module.relative_to(ROOT).as_posix())
    assert seen > 40  # the walk found the package's modules
    assert not missing, f"not on docs/architecture.md: {missing}"


# ---- your own server: the page's commands, run against a real sshd on loopback --------------------


def _page_commands(page: Path, heading: str) -> list[str]:
    """The lines of the first ``sh`` block under ``heading``."""
    section = _sections(page.read_text())[heading]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"no sh block under {heading}"
    return [x.strip() for x in block.group(1).splitlines() if x.strip()]


def test_preset_show_yaml_round_trips_through_validate(tmp_path):
    from tuitune_support.procs import tuitune_cli

    r = tuitune_cli("preset", "show", "c4-eagle3-2step-nccl", "--yaml")
    assert r.returncode == 0, r.stderr
    path = tmp_path / "my-box.yaml"
    path.write_text(r.stdout)
    assert P.load(path).hash() == P.load(P.find("c4-eagle3-2step-nccl")).hash()  # the same preset
    r = tuitune_cli("preset", "validate", str(path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_your_server_pages_first_five_commands_run_against_sshd(sshd, tmp_path):
    """docs/your-server.md's first five commands, as printed, against a real sshd on loopback with the
    simulator started by hand (no tuitune state) as the server: validate, trust (--yes: no one to
    confirm), status (running, not tuitune's: exit 5), bench through the SSH forward, and the TUI's
    view as a headless recording of the same stream."""
    import shlex

    from tuitune_support.ports import free_port, http_status
    from tuitune_support.presets import make_preset
    from tuitune_support.procs import tuitune_cli, wait_for

    commands = _page_commands(DOCS / "your-server.md", "The first five commands")
    assert len(commands) == 5 and all(c.startswith("tuitune ") for c in commands), commands
    sim = make_preset(tmp_path, "my-box", port=free_port())
    data = P.to_dict(sim)
    data["target"] = {**sshd.target(), "known_hosts": str(tmp_path / "known_hosts")}
    data["server"]["python"] = sys.executable
    path = tmp_path / "my-box.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update({"EAGLE3_PROFILE": "1", "PYTHONPATH": str(ROOT)})
    with open(sim.server.log, "wb") as log:  # started by hand: `nohup python3 -m … > log &`
        proc = subprocess.Popen([sys.executable, "-m", "tuitune.sim", *sim.flags()], stdout=log, stderr=log, env=env)
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{sim.server.port}/health") == 200, 30, what="the sim")
        home = {"HOME": str(tmp_path)}
        for line in commands:
            args = [str(path) if a == "my-box.yaml" else a for a in shlex.split(line)[1:]]
            if args[0] == "trust":
                args.append("--yes")
            elif args[0] == str(path):  # the TUI: its stream, recorded headless
                args = ["--record", str(tmp_path / "tui.jsonl"), str(path), "--duration", "2"]
            r = tuitune_cli(*args, env=home, timeout=120)
            if args[0] == "status":
                assert r.returncode == 5, (line, r.stdout, r.stderr)
                assert "running, not started by tuitune: attach read-only, or `tuitune adopt" in r.stdout
            else:
                assert r.returncode == 0, (line, r.stdout, r.stderr)
        assert proc.poll() is None  # watched, never relaunched or stopped
    finally:
        proc.kill()
        proc.wait(10)


def test_your_server_pages_commands_without_a_preset_run_against_sshd(sshd, tmp_path):
    """docs/your-server.md's commands for a server with no preset, as printed, against a real sshd on
    loopback (`gpu-box`: an alias of ~/.ssh/config; its host key unknown at first, so the first
    command's sentence names `tuitune trust gpu-box`) with the simulator started by hand on the port:
    the TUI's view as a headless recording, a recording, the preset read off the process through the
    link (its log where the process writes, its flags and NCCL variable), and saved under a name."""
    import shlex

    import yaml

    from tuitune_support.ports import free_port
    from tuitune_support.procs import HandServer, tuitune_cli
    from tuitune_support.simproc import sim_argv

    commands = _page_commands(DOCS / "your-server.md", "Without writing a preset first")
    assert len(commands) == 4 and all(c.startswith("tuitune ") and "--port 30000" in c for c in commands), commands
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text(
        f"Host gpu-box\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User root\n"
        f"    IdentityFile {sshd.client_key_path}\n"
    )
    port, log = free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update({"EAGLE3_PROFILE": "1", "NCCL_PROTO": "LL", "PYTHONPATH": str(ROOT)})
    hand = HandServer(sim_argv(port), port, env, log, cwd=tmp_path)  # `nohup python3 -m … > log &`
    home = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    try:
        r = tuitune_cli("preset", "discover", "--host", "gpu-box", "--port", str(port), env=home)
        said = r.stderr.strip()  # one sentence (no library's deprecation warnings before it)
        assert r.returncode == 1 and "`tuitune trust gpu-box`" in said and "\n" not in said, said
        assert tuitune_cli("trust", "gpu-box", "--yes", env=home).returncode == 0
        for line in commands:
            words = {"30000": str(port), "run.jsonl": str(tmp_path / "run.jsonl")}
            args = [words.get(a, a) for a in shlex.split(line.split("#")[0])[1:]]
            if args[0] == "--host":  # the TUI: its stream, recorded headless
                args = ["--record", str(tmp_path / "tui.jsonl"), *args, "--duration", "2"]
            if "--duration" in args:
                args[args.index("--duration") + 1] = "2"
            r = tuitune_cli(*args, env=home, timeout=120)
            assert r.returncode == 0, (line, r.stdout, r.stderr)
            if args[:2] == ["preset", "discover"] and "--save" not in args:
                data = yaml.safe_load(r.stdout)
                assert data["target"] == {"host": "gpu-box"} and data["server"]["log"] == str(log), data
                assert data["env"] == {"NCCL_PROTO": "LL", "PYTHONPATH": str(ROOT)}, data  # not HOME, PATH, …
                assert data["speculative"]["num_steps"] == 2, data
        saved = P.load(tmp_path / "cfg" / "tuitune" / "presets" / "my-box.yaml")
        assert saved.server.port == port and saved.target.host == "gpu-box"
        assert hand.proc.poll() is None  # watched, never relaunched or stopped
    finally:
        hand.stop()
