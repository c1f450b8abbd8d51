"""tuitune's probe entry point: on PYTHONPATH, Python imports this in every process it starts
(SGLang's TP workers included). With EAGLE3_PROFILE unset and no switch (TUITUNE_SWITCH_FILE and
TUITUNE_SWITCH_KEY) it does nothing but chain to the next
sitecustomize on the path, so an existing one keeps working."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

_profile = os.environ.get("EAGLE3_PROFILE", "") not in ("", "0")
_switch = bool(os.environ.get("TUITUNE_SWITCH_FILE")) and bool(os.environ.get("TUITUNE_SWITCH_KEY"))
if _profile or _switch:
    if _here not in sys.path:
        sys.path.insert(0, _here)
    try:
        import eagle3_probe

        if _profile:
            eagle3_probe.install()
        if _switch:  # a launch prepared for switching (docs/switch.md)
            eagle3_probe.install_switch()
    except Exception as _e:  # noqa: BLE001 - the server must start, profiled or not
        _what = "EAGLE3_PROFILE" if _profile else "EAGLE3_SWITCH"
        sys.stderr.write(f"{_what}: probe not installed ({type(_e).__name__}: {_e})\n")


def _chain() -> None:
    others = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or os.path.dirname(os.path.abspath(spec.origin or "")) == _here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain()
