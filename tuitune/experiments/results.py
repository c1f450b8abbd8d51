"""What experiments return, typed (msgspec Structs on ``jsonl.Result``): read by attribute, not by
string key, and written as JSON by the one path every ``--json`` takes (``base.jsonl.dumps``, which
turns a ``Result`` into the dict it replaces: the same keys, in the same order, with the same values)."""

from __future__ import annotations

import msgspec

from tuitune.base.jsonl import Result


class RecordStats(Result):
    """`tuitune --record OUT`: what the capture holds when it is closed."""

    alarms: int  # the acceptance guard's alarms (0: none, or no guard)
    events: int
    bytes: int
    seconds: float  # counted from ready (and from the history read, --from-start)
    cycles: int
    windows: int


class CrossoverArm(Result):
    """One arm (speculation on or off) at one level."""

    goodput: float  # tok/s, the streams' goodput (NaN: no successful request)
    batch_size: float | None  # the mean batch the server ran (None: not logged)
    accept_len: float | None


class CrossoverLevel(Result, kw_only=True):  # mypy: the base's kw_only is not inherited
    """One level of `tuitune crossover`: both arms, the speedup with its interval, and the verdict."""

    concurrency: int
    on: CrossoverArm
    off: CrossoverArm
    limits: str | None = None  # the arms ran with different concurrency limits (a sentence)
    speedup: float  # NaN where not comparable
    ci95: list[float]
    verdict: str  # faster · slower · no significant difference · not comparable
    reason: str | None = None  # why not comparable
    note: str | None = None  # the server ran fewer requests at once than the level


class CrossoverResult(Result):
    """`tuitune crossover PRESET`: every level, and the first where speculation is slower."""

    preset: str
    twin: str
    levels: list[CrossoverLevel]
    crossover: int | None
    min_effect: float
    comparable: bool
    # `crossover --live` (docs/switch.md): both arms held in turn in one launch prepared to switch
    step_name: str | None = None  # the engine's word for the step count ("K", "steps")
    steps: list[int] | None = None  # [the preset's own, the one it was crossed against]
    notes: list[str] | None = None  # what an in-launch comparison is not (sentences)


class NcclBenchRow(Result, kw_only=True):
    """One NCCL setting of `tuitune nccl-bench`: skipped, failed (``error``), or timed (``results``)."""

    label: str
    changes: dict  # the grid's changes ({"env.NCCL_PROTO": "LL"}; None: unset)
    current: bool  # the preset's own setting
    skipped: str | None = None  # why it was not run
    seconds: float | None = None
    nccl_env: dict | None = None  # the NCCL variables NCCL echoed
    algos: dict | None = None  # {bytes: the algorithm NCCL chose}
    confirmed: dict | None = None  # {variable: "applied" | "missing"} (nccl backend)
    error: str | None = None
    results: list[dict] | None = None  # per size: bytes, median_us, p99_us, iters
    info: dict | None = None  # the worker's world size, backend, device, versions


class NcclBenchReport(Result, kw_only=True):
    """`tuitune nccl-bench PRESET`: every setting of the grid, ranked at the decode size."""

    preset: str
    world_size: int
    backend: str
    graph: bool
    sizes: list[int]
    decode_bytes: int
    rows: list[NcclBenchRow]
    ranking: list[str]  # the timed settings' labels, fastest first at ``decode_bytes``

    def row(self, label: str) -> NcclBenchRow:
        return next(r for r in self.rows if r.label == label)


class LiveArm(Result):
    """One arm of `sweep --live`: A (the reference), B1, B2 … or A' (A's A/A twin), and its step count."""

    arm: str
    steps: int


class LiveAA(Result):
    """The A/A check of `sweep --live`: A' (a second block of A's setting each round) against A."""

    verdict: str | None
    ratio_ci: list[float | None] | None  # NaN (null in JSON) where too few rounds gave no interval
    trusted: bool | None  # None: too few rounds to decide
    sentence: str


class LiveSweepResult(Result, kw_only=True):
    """`tuitune sweep --live`: every block of one launch prepared to switch, each arm's verdict against A
    (``ab``'s verdict dicts), the A/A check, and the best arm (docs/switch.md)."""

    preset: str
    hash: str
    engine: str
    step_name: str  # the engine's word for the step count ("K", "steps")
    rounds: int
    seed: int
    arms: list[LiveArm]
    blocks: list[dict]  # a row a block, as OUT/results.jsonl has them
    median_tok_s: dict[str, float | None]  # by arm
    accept_len: dict[str, float | None]
    cycle_ms: dict[str, float | None]
    verdicts: dict[str, dict]  # by arm (not A): ab's verdict, its step count beside it
    judged: bool  # enough rounds for a verdict
    aa: LiveAA | None  # None: --no-aa
    best: str  # the arm decidedly fastest (A where none is, or the A/A check failed)
    profiled: bool
    unchecked: int  # blocks whose step count no profile window confirmed

    def steps_of(self, arm: str) -> int:
        return next(a.steps for a in self.arms if a.arm == arm)


class AbPower(Result, kw_only=True):
    """What an A/B of its rounds can detect (``ab.power_note``), and the sentence that says so."""

    rounds: int
    max_rounds: int
    spread: float  # the launch-to-launch spread it is computed from (relative)
    spread_source: str
    detectable: float | None  # the smallest relative change detected 80 % of the time (None: none can be)
    mean_rounds: float | None = None  # a sequential A/B: the rounds it runs on average at that change
    sentence: str


class AbPowers(Result):
    """The power before the A/B (from the spread measured before, or the prior) and after (from its own)."""

    before: AbPower
    after: AbPower | None  # None: the A/B measured no spread (a failed arm, one round)


class AbLook(Result):
    """One look of a sequential A/B: the verdict after ``rounds`` rounds, and the test's figures."""

    rounds: int
    verdict: str | None
    ratio_ci: list[float | None] | None
    shift: float | None
    p_value: float | None
    u: float | None
    critical_u: float | None


class AbResult(Result, kw_only=True):
    """`tuitune ab A B`: every launch (a row each, as ``ab.bench_launch`` has them), the looks, the
    power before and after, and the verdict (``ab.verdict``'s dict, which tune, sweep and the live
    experiments share)."""

    a: str
    b: str
    aa: bool  # the same configuration in both arms: a difference is noise
    rounds: int  # rounds run (each arm once a round)
    first_look: int
    max_rounds: int
    launches: list[dict]
    notes: list[str]
    power: AbPowers
    design: dict | None  # None: too few rounds for a verdict, run as a measurement (--no-verdict)
    looks: list[AbLook]
    stopped: str
    verdict: dict


class SweepDelta(Result, kw_only=True):
    """A configuration of the sweep by relaunches against the baseline (``stats.compare``), or "not
    comparable" (another concurrency, or a server held to fewer requests at once than the streams)."""

    ratio: float  # NaN where not comparable
    ratio_ci: list[float]
    p_value: float
    verdict: str  # faster · slower · no significant difference · not comparable
    min_effect: float | None = None


class SweepRow(Result, kw_only=True):
    """One configuration (or the baseline) of `tuitune sweep`: its launches pooled, or why none was
    measured (skipped, every launch failed)."""

    label: str
    kind: str  # config · baseline
    changes: dict | None = None  # the grid's changes (preset keys)
    axes: dict | None = None  # the grid's axes and their values here
    launches: int | None = None  # launches measured (None: none)
    tok_s: float | None = None  # the launches' median decode tok/s (None: none measured)
    ci95: list[float] | None = None  # of the pooled requests' median
    accept_len: float | None = None
    cycle_ms: float | None = None
    skipped: str | None = None  # why it was not run
    failed: int = 0  # launches that failed
    concurrency: int | None = None
    goodput: float | None = None
    limits: str | None = None  # its server's max_running_requests differed from the baseline's (a sentence)
    delta_unit: str | None = None  # launch · request: what the comparison took as a sample
    delta: SweepDelta | None = None  # None: the baseline itself, or no baseline measured


class SweepResult(Result, kw_only=True):
    """`tuitune sweep PRESET --grid …` by relaunches: every configuration ranked by tok/s (those measured
    first), the best (a configuration significantly faster than the baseline, else the baseline)."""

    preset: str
    table: list[SweepRow]
    best: str | None  # a label, "baseline", or None (the baseline measured nothing)
    baseline_axes: dict  # the grid's axes as the baseline has them: its point in the plot
    best_note: str | None = None
    best_preset: str | None = None  # OUT/best.yaml, where the best is a configuration


class TuneSummary(Result, kw_only=True):
    """`tuitune tune`: what the search measured and chose and why, and what proved it (its row in
    OUT/tune.jsonl, ``kind`` "result"; `--json`)."""

    kind: str  # "result" (the log's rows are told apart by it)
    start: dict  # the starting configuration (steps, topk, draft_tokens)
    chosen: dict
    chosen_label: str  # in the engine's words, with the NCCL variables kept
    concurrency: int
    relaunches: int  # launches after the first (held measurements cost none)
    held_live: int  # measurements held in a launch prepared to switch
    stop_reason: str
    nccl: str | None  # the NCCL variables the search kept
    nccl_prediction: dict | None  # nccl-bench's winner and what it predicted, beside what was measured
    measured: dict[str, float]  # label -> goodput at the concurrency
    failed: dict[str, str]  # label -> why it did not start
    sim_behind: dict | None = None  # label -> concurrency -> how far the simulator fell behind its clock
    advice: dict | None = None  # the model's last advice
    chosen_why: str
    proof: str | None = None  # static · live: where the final A/B ran (None: no A/B)
    proof_why: str | None = None  # why `--proof live` fell back to launches
    ab: dict | None = None  # the final A/B (ab's result, or the blocks in one launch)
    verdict: dict = msgspec.field(default_factory=dict)  # set by the proof: ab's verdict, or why there is none
    best_preset: str | None = None  # OUT/best.yaml, written on "faster"
