"""What a plain `pip install .` ships, and what `make demo` / `make test` install."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tuitune_support.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_is_listed():
    """pyproject lists its packages (presets/ is mapped into the package): a new subpackage must be too."""
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tuitune").rglob("__init__.py")}
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from the tree and installed (not editable) into a directory of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("pip is not available in this interpreter")
    assert r.returncode == 0, r.stderr
    # the project's own packaging makes setuptools say nothing (it once printed ~80 lines: a folder
    # of shipped files absent from `packages`)
    assert "setuptools" not in r.stdout + r.stderr and "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    wheel = next((tmp / "dist").glob("tuitune-*.whl"))
    target = tmp / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return wheel, target


def test_wheel_ships_the_presets(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("tuitune/presets/") for n in names if n.startswith("tuitune/presets/")}
    want = [*(ROOT / "presets").glob("*.yaml"), *(ROOT / "presets" / "machines").glob("*.yaml")]
    assert shipped == {str(p.relative_to(ROOT / "presets")) for p in want}


def test_the_wheel_leaves_the_support_package_out(installed):
    """support/ (tuitune_support: the tests' and benchmarks' builders and helpers) is a distribution
    of its own, installed by `make test`: tuitune's wheel ships none of it."""
    wheel, _ = installed
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith(("tuitune_support", "support/"))]


def test_installed_copy_finds_its_presets_outside_the_repo(installed, tmp_path):
    _, target = installed
    env = {**os.environ, "PYTHONPATH": str(target), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    r = subprocess.run(
        [sys.executable, "-c", "import tuitune, sys; print(tuitune.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.stdout.startswith(str(target)), r  # the installed copy, not the source tree
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tuitune.sim import model; print(model.load_machine('h100-llama8b').name, model.MACHINES_DIR)",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and r.stdout.startswith("h100-llama8b " + str(target)), r  # shipped machines too
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "preset", "list"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0 and re.search(r"^shipped\s+demo\s", r.stdout, re.M), r
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "preset", "show", "demo", "--command"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "tuitune.sim" in r.stdout, r


def test_an_editable_install_prints_nothing_from_setuptools(tmp_path):
    """What `make demo` runs (`pip install -e .`): the build backend's editable hook, in a copy of the
    tree (it writes its egg-info there). A mapped package folder (presets/ as tuitune.presets) made
    setuptools install an import hook and say so; tuitune/presets is a link to presets/ instead."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs >= 77 (pyproject's build-system)")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    tree = tmp_path / "tree"
    for f in files:
        src, dst = ROOT / f, tree / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.is_file():
            dst.write_bytes(src.read_bytes())
    (tmp_path / "out").mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta as b; b.build_editable(sys.argv[1])",
            "../out",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    said = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if "Warning" in ln or "!!" in ln)
    assert not said, r.stdout + r.stderr
    wheel = next((tmp_path / "out").glob("*.whl"))
    pth = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".pth")]
    assert pth and not any("finder" in n for n in zipfile.ZipFile(wheel).namelist()), pth  # a path entry


def test_version_bounds_match_what_the_code_uses():
    deps = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower(): d for d in PYPROJECT["project"]["dependencies"]}
    # keymap ids (App.set_keymap), the help panel and Content labels: Textual 8
    assert re.search(r"textual>=8\.\d+,<9", deps["textual"]), deps["textual"]
    from importlib.metadata import version

    import textual

    assert version("textual").split(".")[0] == "8", textual
    assert "torch" not in " ".join(
        PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["test"]
    )
    assert any(d.startswith("torch") for d in PYPROJECT["project"]["optional-dependencies"]["nccl"])


def test_make_demo_installs_tuitune_alone_and_make_test_what_tests_need():
    if subprocess.run(["make", "--version"], capture_output=True).returncode != 0:
        pytest.skip("make not installed")
    env = {**os.environ, "VENV": "/nonexistent-venv"}
    demo = subprocess.run(
        ["make", "-n", "-B", "demo", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True, text=True, env=env
    ).stdout
    assert "pip install -q -e ." in demo and "[test" not in demo and "torch" not in demo, demo
    test = subprocess.run(
        ["make", "-n", "-B", "test", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True, text=True, env=env
    ).stdout
    assert ".[test,nccl]" in test, test  # nccl = torch, from the package index like everything else
