"""tune's launches read back from a folder instead of made: a ``Source`` for ``tune_loop`` over a
run recorded earlier (``tune.jsonl`` rows and their captures, as `tuitune tune` writes them and
``benchmarks/real_engine_launches.py`` records every configuration of a space).

What it is for: scoring the advisor on a real engine without the engine (the replay tests, the
real-engine worlds of ``benchmarks/advisor_worlds.py --real``). Each configuration tune asks for is
the one launch recorded for it, read back exactly as ``tune --resume`` reads its own; a
configuration that was not recorded, or a level it was not benchmarked at, is an error naming it,
never a made-up launch.
"""

from __future__ import annotations

from pathlib import Path

from tuitune.decide.launch import Config, Launch
from tuitune.experiments.tunelog import load_log, replay_prior
from tuitune.experiments.tuneloop import TuneError


class RecordedLaunches:
    """One recorded launch per configuration, served to ``tune_loop`` in the order it asks."""

    def __init__(self, folder: Path, concurrency: int, levels: list[int] | None = None):
        self.folder = Path(folder)
        self.concurrency = concurrency
        self.levels = levels  # the levels the launches were benchmarked at (None: not checked)
        self.rows: dict[Config, dict] = {}
        for r in load_log(self.folder):
            if r.get("kind") != "launch":
                continue
            c = Config(**r["config"])
            if c in self.rows:
                raise TuneError(f"{self.folder}: {c.label} was recorded twice; a replay needs one launch each", 2)
            self.rows[c] = {**r, "capture": str(self.folder / r.get("capture", ""))}
        if not self.rows:
            raise TuneError(f"{self.folder}: no recorded launch (tune.jsonl is missing or empty)", 2)
        self.asked: list[Config] = []

    @property
    def configs(self) -> set[Config]:
        return set(self.rows)

    def launch(self, config: Config) -> Launch:
        """The recorded launch of ``config``, its capture's windows and decode lines read back."""
        row = self.rows.get(config)
        if row is None:
            raise TuneError(f"{self.folder}: {config.label} was not recorded", 2)
        prior = replay_prior([row])
        if not prior:
            raise TuneError(f"{self.folder}: the capture of {config.label} ({row['capture']}) cannot be read", 2)
        ((_, launch),) = prior
        if config.speculative and not launch.failure and not launch.windows:
            raise TuneError(f"{self.folder}: the capture of {config.label} holds no profile window", 2)
        return launch

    async def measure(self, config: Config, levels: list[int]) -> Launch:
        if self.levels is not None and list(levels) != list(self.levels):
            raise TuneError(
                f"{self.folder}: tune asked for load levels {levels}; the launches were benchmarked at {self.levels}", 2
            )
        self.asked.append(config)
        return self.launch(config)
