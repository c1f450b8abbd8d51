"""The profiling probe: makes a stock SGLang server print EAGLE3_PROFILE lines.

The files of this folder (stdlib only) are uploaded to the target's state dir and put first on
PYTHONPATH of the server's command line; see eagle3_probe.py for how it works.
"""

from importlib import resources

REMOTE_DIR = "~/.cache/tuitune/probe"
FILES = ("sitecustomize.py", "eagle3_probe.py")


def files() -> dict[str, bytes]:
    return {name: resources.files(__name__).joinpath(name).read_bytes() for name in FILES}


def check(sglang_path: str | None = None, engine: str = "sglang") -> dict:
    from . import eagle3_probe

    return eagle3_probe.check(sglang_path, engine)
