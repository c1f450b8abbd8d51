"""The one error base (tuitune/base/errors.py): every user-facing error of tuitune is a TuituneError,
found by walking the package (a new error class without the base fails here), and the command
line's one mapping (cli.exit_status) gives every error the status it gave before the base, when
cli.py held a table of (module, class, status)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import tuitune
from tuitune.base.errors import TuituneError
from tuitune.cli import exit_status

# programs of their own (they import nothing of tuitune), and the entry point (it runs main())
NOT_WALKED = ("tuitune.sim", "tuitune.probe", "tuitune.machine.remote", "tuitune.__main__")

# exception classes that are not a TuituneError, and why
LEFT_ALONE = {
    # internal: never shown as they are
    "tuitune.preset.io._DuplicateKey": "a YAMLError inside the preset loader, restated as a PresetError",
    "tuitune.measure.request.BadStream": "a request's failure, kept in the run's errors, never raised to the CLI",
}


def walked_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(tuitune.__path__, "tuitune.") if not m.name.startswith(NOT_WALKED)]


def exception_classes() -> dict[str, type[BaseException]]:
    found = {}
    for name in walked_modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == name and issubclass(obj, BaseException):
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_user_facing_error_is_a_tuitune_error():
    found = exception_classes()
    assert set(LEFT_ALONE) <= set(found), "LEFT_ALONE names a class that is gone: drop it"
    without = sorted(n for n, cls in found.items() if not issubclass(cls, TuituneError) and n not in LEFT_ALONE)
    assert not without, f"derive these from tuitune.base.errors.TuituneError (or say in LEFT_ALONE why not): {without}"
    assert len(found) - len(LEFT_ALONE) >= 20  # the walk found the errors (not an empty package)


def test_left_alone_are_still_value_errors():
    # a class that was a ValueError stays one: `except ValueError` handlers still catch it
    found = exception_classes()
    for name in (
        "tuitune.preset.model.PresetError",
        "tuitune.decide.launch.FitError",
        "tuitune.experiments.grid.GridError",
        "tuitune.experiments.ab.RoundsError",
        "tuitune.measure.smi.SmiParseError",
        "tuitune.measure.request.BadStream",
        "tuitune.measure.serverinfo.BenchError",
        "tuitune.measure.promscrape.MetricsError",
    ):
        assert issubclass(found[name], ValueError), name


# cli.CORE_ERRORS before the base: (module, class, status); None: the error's own ``code``
CORE_ERRORS_BEFORE: tuple[tuple[str, str, int | None], ...] = (
    ("tuitune.preset.model", "PresetError", 2),
    ("tuitune.machine.errors", "ControlError", None),
    ("tuitune.machine.errors", "TransportError", 1),
    ("tuitune.machine.gpus", "GpusError", 1),
    ("tuitune.measure.smi", "SmiParseError", 2),
    ("tuitune.measure.capture", "CaptureError", None),
    ("tuitune.experiments.grid", "GridError", 2),
    ("tuitune.experiments.sweep", "SweepError", 2),
    ("tuitune.experiments.crossover", "CrossoverError", None),
    ("tuitune.experiments.ncclbench", "NcclBenchError", None),
    ("tuitune.experiments.tune", "TuneError", None),
    ("tuitune.experiments.observe", "ObserveError", None),
    ("tuitune.experiments.advisor", "AdvisorError", None),
    ("tuitune.experiments.record", "RecordError", 1),
    ("tuitune.experiments.watch", "WatchError", None),
    ("tuitune.measure.workload", "WorkloadError", 2),
)

# the ``code`` each of the None rows above had without one given (its constructor's default)
DEFAULT_CODE_BEFORE = {
    "ControlError": 1,
    "CaptureError": 2,
    "CrossoverError": 2,
    "NcclBenchError": 1,
    "TuneError": 1,
    "ObserveError": 2,
    "AdvisorError": 1,
    "WatchError": 3,
}


def _cls(module: str, name: str) -> type[BaseException]:
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("module", "name", "status"), CORE_ERRORS_BEFORE, ids=[r[1] for r in CORE_ERRORS_BEFORE])
def test_exit_status_as_before(module, name, status, capsys):
    cls = _cls(module, name)
    e = cls("it failed")
    want = status if status is not None else DEFAULT_CODE_BEFORE[name]
    assert exit_status(e) == want
    assert capsys.readouterr().err == "tuitune: it failed\n"
    if status is None:  # its own code, whichever was given
        for code in (1, 2, 3):
            assert exit_status(cls("it failed", code)) == code


def test_exit_status_of_the_rest(capsys):
    from tuitune.base.errors import CliError
    from tuitune.machine.errors import ControlError, LinkLost

    assert exit_status(CliError("bad usage", 2)) == 2
    assert exit_status(CliError("failed")) == 1
    assert exit_status(CliError("interrupted", 130)) == 130
    assert exit_status(LinkLost("the link dropped")) == 1  # a TransportError
    capsys.readouterr()
    assert exit_status(ControlError("it died", 1, ["last", "lines"])) == 1
    assert capsys.readouterr().err == "  | last\n  | lines\ntuitune: it died\n"
    # no sentence: a bug, whose traceback is wanted
    assert exit_status(ValueError("x")) is None
    assert exit_status(KeyError("x")) is None
    # RoundsError was never mapped: `tuitune ab` on arms of different prompts printed its traceback
    assert exit_status(_cls("tuitune.experiments.ab", "RoundsError")("different prompts")) == 2
    assert capsys.readouterr().err == "tuitune: different prompts\n"
    assert capsys.readouterr().err == ""


def test_caught_errors_carry_the_code_their_callers_gave():
    # not in the old table: each is caught below the CLI and restated (DiscoverError as a CliError with
    # its code, FitError as a TuneError/AdvisorError 1, BenchError as a CliError 2, MetricsError by the
    # metrics watcher), so main() never saw one; their codes are the ones those callers gave
    for module, name, code in (
        ("tuitune.machine.discover", "DiscoverError", 1),
        ("tuitune.decide.launch", "FitError", 1),
        ("tuitune.measure.serverinfo", "BenchError", 2),
        ("tuitune.measure.promscrape", "MetricsError", 1),
    ):
        assert _cls(module, name)("x").code == code, name
