"""`tune`'s log, OUT/tune.jsonl: its rows checked as they are read (a damaged one is skipped with a
warning naming its line), written one at a time, and its launches rebuilt for ``--resume``."""

from __future__ import annotations

from pathlib import Path

from tuitune.base.jsonl import append_row, is_count, is_figure, read_rows
from tuitune.decide.launch import Config, Launch
from tuitune.experiments.tuneloop import Step


def load_log(out: Path) -> list[dict]:
    """The usable rows of the tune log; a damaged one is skipped with a warning naming its line
    (its launch, if it was one, runs again on --resume)."""
    return read_rows(out / "tune.jsonl", check=row_problem)


def row_problem(r: dict) -> str | None:  # noqa: C901
    """Why a tune log row cannot be used (None when it can): what --resume reads of it checked."""
    kind = r.get("kind")
    if kind == "launch":
        c = r.get("config")
        if not isinstance(c, dict) or not c or set(c) - {"steps", "topk", "draft_tokens"}:
            return "its config is not a configuration"
        if not (
            is_count(c.get("steps", 0), 0, 64)
            and is_count(c.get("topk", 1), 1, 64)
            and is_count(c.get("draft_tokens", 1), 1, 4096)
        ):
            return f"its config {c} is out of range"
        if not is_count(r.get("round", 0)):
            return "its round is not a count"
        g = r.get("goodput") or {}
        if not isinstance(g, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and 0 < int(k) <= 65536 and is_figure(v)
            for k, v in g.items()
        ):
            return "its goodput is not a finite figure per concurrency"
        for key in ("capture", "reason", "env"):
            if key in r and not isinstance(r[key], str):
                return f"its {key} is not text"
        if r.get("failure") is not None and not isinstance(r["failure"], str):
            return "its failure is not text"
        if r.get("predicted") is not None and not isinstance(r["predicted"], dict):
            return "its prediction is not an object"
        lag = r.get("sim_behind")
        if lag is not None and not (
            isinstance(lag, dict)
            and all(isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in lag.items())
        ):
            return "its simulator lag is not text per concurrency"
    elif kind == "nccl":
        ch = r.get("changes")
        if not isinstance(ch, dict) or not all(
            isinstance(k, str) and "." in k and (v is None or isinstance(v, str | int | float)) for k, v in ch.items()
        ):
            return "its NCCL changes are not preset keys"
        if r.get("prediction") is not None and not isinstance(r["prediction"], dict):
            return "its prediction is not an object"
    elif kind == "nccl_decision" and not isinstance(r.get("env"), str):
        return "its env is not text"
    elif kind == "workload" and not (isinstance(r.get("hash"), str) and isinstance(r.get("name"), str)):
        return "its workload has no name and hash"
    return None


def log_row(out: Path, row: dict) -> None:
    append_row(out / "tune.jsonl", row)


def replay_prior(rows: list[dict]) -> list[tuple[Step, Launch]]:
    """Launches of an earlier run, rebuilt from the log and their captures (for --resume)."""
    from tuitune.base.events import DecodeStats, ProfileWindow
    from tuitune.measure.capture import CaptureError, read_capture

    prior = []
    for r in rows:
        if r.get("kind") != "launch":
            continue
        c = Config(**r["config"])
        ln = Launch(
            c,
            goodput={int(k): v for k, v in (r.get("goodput") or {}).items()},
            label=r.get("capture", ""),
            failure=r.get("failure"),
        )
        try:
            cap = read_capture(r["capture"])
        except (CaptureError, KeyError):
            continue  # its capture is gone: that launch runs again
        ln.windows = [x.event for x in cap.records if isinstance(x.event, ProfileWindow)]
        ln.decodes = [x.event for x in cap.records if isinstance(x.event, DecodeStats)]
        st = Step(r["round"], c, r.get("reason", ""), r.get("predicted"), dict(ln.goodput), ln.failure)
        prior.append((st, ln))
    return prior
