"""What the cost model is fitted from and predicts for: a speculative configuration (``Config``,
``OFF``), what one server launch showed (``Launch``), and the error when nothing fits (``FitError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuitune.base.errors import TuituneError
from tuitune.base.events import DecodeStats, ProfileWindow


class FitError(TuituneError, ValueError):
    """Nothing usable to fit (one sentence)."""


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """A speculative configuration; steps 0 = speculation off."""

    steps: int = 0
    topk: int = 1
    draft_tokens: int = 1

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    @property
    def label(self) -> str:
        if not self.speculative:
            return "off"
        return f"steps {self.steps} topk {self.topk} tokens {self.draft_tokens}"

    @property
    def short(self) -> str:
        return "off" if not self.speculative else f"{self.steps}/{self.topk}/{self.draft_tokens}"

    @classmethod
    def chain(cls, steps: int) -> Config:
        return cls(steps, 1, steps + 1) if steps > 0 else OFF

    def to_dict(self) -> dict:
        return {"steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens}


OFF = Config()


def config_of_window(w: ProfileWindow) -> Config | None:
    if w.steps is None:
        return None
    if w.steps == 0:
        return OFF
    topk = w.topk or 1
    return Config(w.steps, topk, w.draft_tokens or (w.steps + 1 if topk == 1 else 0))


@dataclass
class Launch:
    """What one server launch showed: its configuration, profile windows, decode lines, and the
    goodput a benchmark measured at each concurrency (tok/s of all requests together)."""

    config: Config
    windows: list[ProfileWindow] = field(default_factory=list)
    decodes: list[DecodeStats] = field(default_factory=list)
    goodput: dict[int, float] = field(default_factory=dict)
    label: str = ""
    failure: str | None = None  # why the server did not come up (nothing measured then)
    live: bool = False  # measured under a hold in a launch prepared to switch (no relaunch: docs/switch.md)
    engine: str = "sglang"  # whose server it was (costs of two engines are not one model)
