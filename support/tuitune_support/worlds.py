"""Worlds whose physics tuitune's model does not share (benchmarks/advisor_worlds.py runs them;
tests/decide/test_costmodel.py and tests/decide/test_advise.py check the model and the advisor against them): random
tables, waves and rational curves of a forward pass's time, acceptance drawn per world, a source that
measures them as a real engine would, and the real engines' recorded worlds."""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import random
from dataclasses import dataclass, field

from tuitune.decide.advise import extrapolation, rank, space
from tuitune.decide.costmodel import fit
from tuitune.decide.launch import OFF, Config, Launch
from tuitune.experiments.recorded import RecordedLaunches
from tuitune.experiments.tuneloop import levels_for, tune_loop
from tuitune.measure.parse import parse_line
from tuitune_support.paths import ROOT

CONCURRENCY = (1, 8, 32)
WINDOW = 40  # cycles a profile window
WINDOWS_PER_LEVEL = 4
DEPTH = 12  # acceptance positions a world defines
REAL_CURVE = ROOT / "benchmarks" / "data" / "h200_llama8b_forward.json"
# FACTS §6 (/work/shared/FACTS.md): one H200, CUDA graphs, random bf16 weights with Llama-3.1-8B
# shapes, attention over the KV cache left out; ms of one target forward over n tokens
FACTS_H200_TARGET = (
    (1, 4.24), (4, 4.38), (16, 4.45), (32, 4.51), (64, 4.62), (96, 4.97), (128, 6.12), (256, 7.03),
    (384, 11.11), (512, 12.31), (768, 19.95), (1024, 23.23),
)  # fmt: skip
# the same run: one EAGLE-3-shaped draft step (one decoder layer + 32k head)
FACTS_H200_DRAFT = ((1, 0.19), (96, 0.19), (128, 0.26), (512, 0.56), (1024, 1.06))
# Gauss-Hermite nodes and weights for a standard normal (prompt difficulty averaged in the truth)
GH = ((0.0, 0.5333), (1.3556, 0.2221), (-1.3556, 0.2221), (2.857, 0.0113), (-2.857, 0.0113))


def real_target_points() -> tuple[tuple[tuple[float, float], ...], str]:
    """The real H200 forward curve: the measured JSON when it is there (``tokens`` and ``ms``, as
    ``benchmarks/forward_curve.py`` writes it), else FACTS §6's twelve points."""
    if REAL_CURVE.is_file():
        data = json.loads(REAL_CURVE.read_text())
        pts = tuple(sorted(zip((float(n) for n in data["tokens"]), (float(m) for m in data["ms"]), strict=True)))
        return pts, f"{REAL_CURVE.relative_to(ROOT)} ({data.get('gpu', 'a GPU')}, {len(pts)} points)"
    return FACTS_H200_TARGET, "FACTS §6 (12 points)"


# ---- the worlds' physics (nothing here is tuitune's) --------------------------------------------


@dataclass(frozen=True)
class Table:
    """A measured curve, linear between its points, flat below the first; past the last, on the
    least-squares slope of its top quarter (never falling: a measured curve's last two points may)."""

    pts: tuple[tuple[float, float], ...]
    scale: float = 1.0
    stretch: float = 1.0  # > 1: the knee at more tokens (a bigger GPU for the model)

    def __call__(self, n: float) -> float:
        x = max(1.0, n) / self.stretch
        xs = [p[0] for p in self.pts]
        if x <= xs[0]:
            return self.pts[0][1] * self.scale
        i = bisect.bisect_left(xs, x)
        if i >= len(xs):
            top = self.pts[-max(2, len(self.pts) // 4) :]
            mx = sum(p[0] for p in top) / len(top)
            my = sum(p[1] for p in top) / len(top)
            sxx = sum((p[0] - mx) ** 2 for p in top)
            slope = max(0.0, sum((p[0] - mx) * (p[1] - my) for p in top) / sxx)
            return (self.pts[-1][1] + slope * (x - xs[-1])) * self.scale
        (x0, y0), (x1, y1) = self.pts[i - 1], self.pts[i]
        return (y0 + (y1 - y0) * (x - x0) / (x1 - x0)) * self.scale


@dataclass(frozen=True)
class Waves:
    """GEMM wave quantisation: rows in tiles of ``tile`` tokens, ``per_wave`` row tiles fill the
    GPU once; time is the larger of reading the weights and the waves' compute."""

    mem_ms: float
    tile: int
    per_wave: float  # row tiles per wave (SMs / column tiles)
    wave_ms: float
    per_token_ms: float  # epilogue, sampling: a little per token

    def __call__(self, n: float) -> float:
        tiles = math.ceil(max(1.0, n) / self.tile)
        waves = math.ceil(tiles / self.per_wave)
        return max(self.mem_ms, waves * self.wave_ms) + self.per_token_ms * n


@dataclass(frozen=True)
class Rational:
    """A smooth knee of another family: mem × (1 + (n/n0)² / (1 + n/n0))."""

    mem_ms: float
    n0: float

    def __call__(self, n: float) -> float:
        r = max(1.0, n) / self.n0
        return self.mem_ms * (1.0 + r * r / (1.0 + r))


@dataclass
class World:
    name: str
    features: list[str]
    target: object  # callable n -> ms
    draft: object
    comm_ms: float  # every target forward (TP all-reduces)
    draft_comm_ms: float
    kv_ms_per_req: float  # attention over one request's KV cache, a forward
    verify_extra_ms: float  # sampling and accepting after a verify
    tree_penalty: float  # a tree's verify / draft step costs this much more than a chain's
    tree_select_ms: float  # top-k selection and tree building, a draft step
    host_ms: float
    host_ms_per_req: float
    overhead_ms: float  # a fixed per-cycle (and per-step) cost outside the forwards
    spec_overhead_ms: float  # speculation's own per-cycle bookkeeping
    extend_tokens: bool  # the extend runs over the verified tokens (else one a request)
    accept: list[float]  # conditional acceptance per position
    rank_q: float  # P(rank r | not rank 1) ∝ q^(r-2): geometric sibling ranks ...
    rank_miss: float  # ... except this share of it, which no candidate of the drafter's holds
    difficulty_sd: float  # logit shift of a window's prompts
    launch_sigma: float
    bench_sigma: float
    prompt_tokens: int
    output_tokens: int
    _tau: dict = field(default_factory=dict)

    # -- acceptance --
    def rates(self, shift: float = 0.0) -> list[float]:
        out = []
        for a in self.accept:
            x = math.log(a / (1 - a)) + shift
            out.append(1.0 / (1.0 + math.exp(-x)))
        return out

    def rank_p(self, a: float, r: int) -> float:
        return a if r == 1 else (1 - a) * (1 - self.rank_miss) * (1 - self.rank_q) * self.rank_q ** (r - 2)

    def tree(self, c: Config, rates: list[float]) -> list[tuple[tuple[int, ...], float]]:
        """SGLang's draft tree: topk candidates at depth 1, then the topk² children of the top-k
        nodes at each depth; the draft_tokens − 1 most probable nodes of that pool."""
        pool: list[tuple[tuple[int, ...], float]] = []
        frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
        for d in range(c.steps):
            a = rates[min(d, len(rates) - 1)]
            kids = [(path + (r,), p * self.rank_p(a, r)) for path, p in frontier for r in range(1, c.topk + 1)]
            pool += kids
            frontier = sorted(kids, key=lambda x: -x[1])[: c.topk]
        pool.sort(key=lambda x: -x[1])
        chosen = pool[: max(0, c.draft_tokens - 1)]
        keep = {p for p, _ in chosen}
        return [(p, q) for p, q in chosen if all(p[:i] in keep for i in range(1, len(p)))]

    def tau(self, c: Config) -> float:
        """Expected tokens a request gets from one cycle, averaged over prompt difficulty."""
        if not c.speculative:
            return 1.0
        if c not in self._tau:
            tot = 0.0
            for z, w in GH:
                tot += w * (1.0 + sum(q for _, q in self.tree(c, self.rates(z * self.difficulty_sd))))
            self._tau[c] = tot / sum(w for _, w in GH)
        return self._tau[c]

    def draw(self, c: Config, nodes: set, rates: list[float], rng: random.Random) -> int:
        n, path = 1, ()
        for d in range(c.steps):
            a = rates[min(d, len(rates) - 1)]
            u = rng.random()
            if u < a:
                r = 1
            else:
                v = (u - a) / (1 - a)
                if v >= 1 - self.rank_miss:
                    break  # the target's token is none of the drafter's candidates
                v /= 1 - self.rank_miss  # geometric over ranks >= 2
                r = 2 + int(math.log(max(1e-12, 1 - v)) / math.log(self.rank_q))
            path = path + (r,)
            if path not in nodes:
                break
            n += 1
        return n

    # -- costs (ms) --
    def phases(self, c: Config, bs: int) -> tuple[float, float, float, float]:
        """draft, verify, extend, other of one cycle at batch size bs (c speculative)."""
        tree = c.topk > 1
        pen = 1.0 + (self.tree_penalty if tree else 0.0)
        verify = self.target(bs * c.draft_tokens) * pen + self.comm_ms + self.kv_ms_per_req * bs + self.verify_extra_ms
        step1 = self.draft(bs) + self.draft_comm_ms
        stepk = self.draft(bs * c.topk) * pen + self.draft_comm_ms + (self.tree_select_ms if tree else 0.0)
        draft = step1 + (c.steps - 1) * stepk
        ext = self.draft(bs * (c.draft_tokens if self.extend_tokens else 1)) + self.draft_comm_ms
        other = self.host_ms + self.host_ms_per_req * bs + self.overhead_ms + self.spec_overhead_ms
        return draft, verify, ext, other

    def step_ms(self, bs: int) -> float:
        """A decode step without speculation."""
        return (
            self.target(bs)
            + self.comm_ms
            + self.kv_ms_per_req * bs
            + self.host_ms
            + self.host_ms_per_req * bs
            + self.overhead_ms
        )

    def cycle_ms(self, c: Config, bs: int) -> float:
        return sum(self.phases(c, bs)) if c.speculative else self.step_ms(bs)

    def stall_ms(self, c: Config) -> float:
        """A new request's prefill stops the batch this long."""
        t = self.target(self.prompt_tokens) + self.comm_ms
        return t + (self.draft(self.prompt_tokens) + self.draft_comm_ms if c.speculative else 0.0)

    def goodput(self, c: Config, conc: int) -> float:
        """Expected benchmark goodput (tok/s of all streams): conc streams of output_tokens each,
        every request's prefill stalling the batch once."""
        bs = max(1, conc)
        cycles = self.output_tokens / self.tau(c)
        return bs * self.output_tokens / (cycles * self.cycle_ms(c, bs) + bs * self.stall_ms(c)) * 1000.0


def draw_curve(rng: random.Random, real: tuple, draft: bool) -> tuple[object, str]:
    kind = rng.choice(("real", "real", "waves", "rational"))
    if kind == "real":
        pts = FACTS_H200_DRAFT if draft else real
        return Table(pts, scale=math.exp(rng.uniform(math.log(0.5), math.log(4.0))), stretch=rng.uniform(0.5, 2.0)), (
            "real H200 curve"
        )
    if kind == "waves":
        mem = rng.uniform(0.15, 0.6) if draft else rng.uniform(3.0, 15.0)
        tile = rng.choice((64, 128, 128, 256))
        per_wave = rng.uniform(0.5, 3.0)
        knee = math.exp(rng.uniform(math.log(48), math.log(600)))  # tokens where compute takes over
        waves_at_knee = max(1, math.ceil(math.ceil(knee / tile) / per_wave))
        return Waves(mem, tile, per_wave, mem / waves_at_knee * rng.uniform(0.9, 1.2), mem * 2e-5), (
            f"tile steps of {tile}"
        )
    mem = rng.uniform(0.15, 0.6) if draft else rng.uniform(3.0, 15.0)
    return Rational(mem, math.exp(rng.uniform(math.log(40), math.log(500)))), "smooth rational knee"


def draw_acceptance(rng: random.Random) -> tuple[list[float], str]:
    kind = rng.choice(("decay", "plateau", "plateau", "rising", "cliff"))
    a1 = rng.uniform(0.4, 0.9)
    if kind == "decay":
        r = rng.uniform(0.75, 0.97)
        acc = [a1 * r**d for d in range(DEPTH)]
    elif kind == "plateau":
        p = rng.uniform(0.3, 0.85)
        lam = rng.uniform(0.5, 2.5)
        acc = [p + (a1 - p) * math.exp(-d / lam) for d in range(DEPTH)]
    elif kind == "rising":
        top = min(0.95, a1 + rng.uniform(0.05, 0.3))
        lam = rng.uniform(0.7, 3.0)
        acc = [a1 + (top - a1) * (1 - math.exp(-d / lam)) for d in range(DEPTH)]
    else:
        depth = rng.choice((2, 3, 4, 5))
        low = rng.uniform(0.05, 0.35)
        acc = [a1 * (0.98**d) if d < depth else low for d in range(DEPTH)]
    acc = [min(0.96, max(0.03, a * math.exp(rng.gauss(0, 0.04)))) for a in acc]
    return acc, f"acceptance {kind}"


def random_world(rng: random.Random, i: int, real: tuple) -> World:
    target, tf = draw_curve(rng, real, False)
    draft, _ = draw_curve(rng, real, True)
    floor = target(1)
    feats = [tf]
    tp = rng.choice((1, 1, 2, 4, 8))
    pcie = tp > 1 and rng.random() < 0.4
    comm = 0.0 if tp == 1 else floor * rng.uniform(0.02, 0.12) * math.log2(tp) * (4.0 if pcie else 1.0)
    if pcie:
        feats.append("PCIe all-reduce")
    tree_pen = rng.choice((0.0, rng.uniform(0.05, 0.3), rng.uniform(0.1, 0.3)))
    if tree_pen > 0:
        feats.append(f"trees +{tree_pen:.0%}")
    overhead = 0.0
    if rng.random() < 0.35:
        overhead = floor * rng.uniform(0.15, 0.8)
        feats.append("large fixed per-cycle overhead")
    acc, af = draw_acceptance(rng)
    feats.append(af)
    return World(
        name=f"world-{i}",
        features=feats,
        target=target,
        draft=draft,
        comm_ms=comm,
        draft_comm_ms=comm * rng.uniform(0.1, 0.4),
        kv_ms_per_req=floor * rng.uniform(0.0, 0.006),
        verify_extra_ms=floor * rng.choice((0.0, rng.uniform(0.02, 0.4))),
        tree_penalty=tree_pen,
        tree_select_ms=floor * rng.uniform(0.0, 0.02),
        host_ms=rng.uniform(0.05, 0.5),
        host_ms_per_req=rng.choice((0.0, rng.uniform(0.002, 0.02))),
        overhead_ms=overhead,
        spec_overhead_ms=floor * rng.uniform(0.0, 0.08),
        extend_tokens=rng.random() < 0.5,
        accept=acc,
        rank_q=rng.uniform(0.35, 0.7),
        rank_miss=rng.uniform(0.1, 0.45),
        difficulty_sd=rng.uniform(0.1, 0.5),
        launch_sigma=rng.uniform(0.005, 0.03),
        bench_sigma=rng.uniform(0.005, 0.015),
        prompt_tokens=rng.choice((32, 128, 512)),
        output_tokens=rng.choice((128, 256, 512)),
    )


# ---- launches, as a server would show them ------------------------------------------------------


class WorldSource:
    """A launch of a configuration in a world: profile windows, decode lines, benchmark goodput."""

    def __init__(self, world: World, rng: random.Random, jitter: float = 0.02):
        self.w, self.rng, self.jitter = world, rng, jitter
        self.launches = 0

    def _j(self, sd: float) -> float:
        return math.exp(self.rng.gauss(0.0, sd))

    async def measure(self, c: Config, levels: list[int]) -> Launch:
        self.launches += 1
        w = self.w
        f = self._j(w.launch_sigma)  # this launch's speed
        ln = Launch(c)
        for bs in levels:
            if c.speculative:
                for _ in range(WINDOWS_PER_LEVEL):
                    ln.windows.append(self._window(c, bs, f))
            else:
                step = w.step_ms(bs) * f
                stalls = WINDOW * bs / w.output_tokens * w.stall_ms(c) * f  # prefills inside the interval
                for _ in range(WINDOWS_PER_LEVEL):
                    wall = WINDOW * step * self._j(self.jitter / 3) + stalls
                    line = (
                        f"[2026-11-30 09:00:00 TP0] Decode batch, #running-req: {bs}, #token: {bs * 300}, "
                        f"token usage: 0.01, cuda graph: True, gen throughput (token/s): "
                        f"{WINDOW * bs / wall * 1000:.2f}, #queue-req: 0"
                    )
                    ln.decodes.append(parse_line(line))
            ln.goodput[bs] = w.goodput(c, bs) / f * self._j(w.bench_sigma)
        return ln

    def _window(self, c: Config, bs: int, f: float):
        w = self.w
        d, v, e, o = w.phases(c, bs)
        rates = w.rates(self.rng.gauss(0.0, w.difficulty_sd))
        nodes = {p for p, _ in w.tree(c, rates)}
        hist: dict[int, int] = {}
        for _ in range(WINDOW * bs):
            k = w.draw(c, nodes, rates, self.rng)
            hist[k] = hist.get(k, 0) + 1
        dj, vj, ej, oj = (x * f * self._j(self.jitter / math.sqrt(WINDOW)) for x in (d, v, e, o))
        acc = sum(k * n for k, n in hist.items()) / (WINDOW * bs)
        line = (
            f"[2026-11-30 09:00:00 TP0] EAGLE3_PROFILE v=2 cycles={WINDOW} bs={bs} steps={c.steps} "
            f"topk={c.topk} draft_tokens={c.draft_tokens} verify_tokens={bs * c.draft_tokens} "
            f"draft_ms={dj:.4f} verify_ms={vj:.4f} extend_ms={ej:.4f} other_ms={oj:.4f} "
            f"cycle_ms={dj + vj + ej + oj:.4f} accept_len={acc:.4f} "
            f"accept_hist={','.join(f'{k}:{n}' for k, n in sorted(hist.items()))} sync=event"
        )
        return parse_line(line)


# ---- scoring ------------------------------------------------------------------------------------


def coverage(launches: list[Launch], conc: int, configs: list[Config], true: dict) -> tuple[float, float]:
    """Share of configurations whose truth is inside the model's 95 % interval; the median
    half-width of those intervals relative to the prediction."""
    model = fit(launches)
    inside, widths = 0, []
    for c in configs:
        g = model.predict(c, conc).goodput
        inside += g.lo <= true[c] <= g.hi
        widths.append((g.hi - g.lo) / 2 / g.mean if g.mean > 0 else math.inf)
    widths.sort()
    return inside / len(configs), widths[len(widths) // 2]


async def case(w: World, conc: int, budget: int, rng: random.Random, configs: list[Config]) -> dict:
    true = {c: w.goodput(c, conc) for c in configs}
    opt = max(true, key=true.get)
    src = WorldSource(w, rng)
    start = Config.chain(3)
    res = await tune_loop(src, start, budget, conc, configs=configs)
    cov, width = coverage(res.launches, conc, configs, true)
    cov1, width1 = coverage(res.launches[:1], conc, configs, true)
    return {
        "world": w.name,
        "features": w.features,
        "concurrency": conc,
        "chosen": res.chosen.label,
        "optimum": opt.label,
        "ratio": true[res.chosen] / true[opt],
        "start_ratio": true[start] / true[opt],
        "off_ratio": true[Config()] / true[opt],
        "relaunches": res.relaunches,
        "coverage": cov,
        "width": width,
        "coverage1": cov1,
        "width1": width1,
        "stop": res.stop_reason,
        "launched": [ln.config.short for ln in res.launches],
    }


def run(worlds: int, seed: int, budget: int, verbose: bool = False, concurrency=CONCURRENCY) -> list[dict]:
    rng = random.Random(seed)
    real, _ = real_target_points()
    configs = space()
    rows = []
    for i in range(worlds):
        w = random_world(rng, i, real)
        for conc in concurrency:
            # each case's launch noise from its own stream: the worlds drawn do not depend on how
            # many launches earlier cases made, so two versions of the advisor meet the same worlds
            noise = random.Random(f"{seed}/{i}/{conc}")
            r = asyncio.run(case(w, conc, budget, noise, configs))
            rows.append(r)
            if verbose:
                print(
                    f"{w.name:<9} c={conc:<3} {r['ratio']:.3f} chosen {r['chosen']:<27} optimum {r['optimum']:<27} "
                    f"cover {r['coverage']:.2f}/{r['coverage1']:.2f} launched {' '.join(r['launched'])}  "
                    f"[{'; '.join(w.features)}]",
                    flush=True,
                )
    return rows


def report(rows: list[dict], worlds: int, budget: int, seconds: float, source: str) -> str:
    n = len(rows)
    within = sum(1 for r in rows if r["ratio"] >= 0.98)
    worst = min(rows, key=lambda r: r["ratio"])
    rel = [r["relaunches"] for r in rows]
    out = [
        f"{worlds} out-of-family worlds x concurrency {', '.join(map(str, CONCURRENCY))} = {n} cases, budget "
        f"{budget} relaunches, {len(space())} configurations; real curve: {source} ({seconds:.0f} s)",
        f"(a) within 2 % of the best: {within}/{n} = {within / n:.1%}; mean ratio {sum(r['ratio'] for r in rows) / n:.4f}, "
        f"worst {worst['ratio']:.3f} ({worst['world']} c={worst['concurrency']}: chose {worst['chosen']}, "
        f"best {worst['optimum']})   (the start within 2 %: "
        f"{sum(1 for r in rows if r['start_ratio'] >= 0.98) / n:.1%}, off: {sum(1 for r in rows if r['off_ratio'] >= 0.98) / n:.1%})",
        f"(b) relaunches: mean {sum(rel) / n:.2f}, max {max(rel)}",
        f"(c) interval coverage (truth inside the 95 % interval, all {len(space())} configurations): after tune "
        f"{sum(r['coverage'] for r in rows) / n:.1%} (median half-width {sorted(r['width'] for r in rows)[n // 2]:.1%}), "
        f"from the first launch alone {sum(r['coverage1'] for r in rows) / n:.1%} "
        f"(median half-width {sorted(r['width1'] for r in rows)[n // 2]:.1%}); "
        f"worst case {min(r['coverage'] for r in rows):.1%}",
    ]
    for conc in CONCURRENCY:
        sub = [r for r in rows if r["concurrency"] == conc]
        if sub:
            out.append(
                f"    concurrency {conc:>2}: within 2 % {sum(1 for r in sub if r['ratio'] >= 0.98)}/{len(sub)}, "
                f"worst {min(r['ratio'] for r in sub):.3f}, coverage {sum(r['coverage'] for r in sub) / len(sub):.1%}"
            )
    feats = sorted({f.split(" +")[0] if f.startswith("trees") else f for r in rows for f in r["features"]})
    for f in feats:
        sub = [r for r in rows if any(x == f or x.startswith(f) for x in r["features"])]
        out.append(
            f"    {f:<32} {len(sub):>3} cases: within 2 % {sum(1 for r in sub if r['ratio'] >= 0.98) / len(sub):.0%}, "
            f"worst {min(r['ratio'] for r in sub):.3f}, coverage {sum(r['coverage'] for r in sub) / len(sub):.0%}"
        )
    return "\n".join(out)


# ---- the real engines' worlds (recorded launches, measured grids) -------------------------------

REAL_WORLDS = ROOT / "tests" / "data" / "real-worlds.json"
WITHIN = 0.98


def real_worlds() -> list[dict]:
    return json.loads(REAL_WORLDS.read_text())


async def real_case(w: dict, budget: int) -> dict:
    """tune replayed over one real world's recorded launches, advise from its start launch, and the
    intervals of both against the grid's truth."""
    conc = w["concurrency"]
    src = RecordedLaunches(ROOT / w["launches"], conc, levels_for(conc))
    configs = space(topks=(1,))  # vLLM drafts chains: off and K = 1..8, as tune searches it there

    def label(c: Config) -> str:
        return f"{w['method'].lower()} K={c.steps}" if c.speculative else "off"

    grid = json.loads((ROOT / w["grid"]).read_text())["grid"]
    truth = {c: grid["truth"][label(c)][str(conc)] for c in configs}
    opt = max(truth, key=truth.__getitem__)
    start = Config.chain(3)
    res = await tune_loop(src, start, budget, conc, configs=configs)
    first = res.launches[0]  # the start's launch, as tune measured it first
    model1 = fit([first])
    ranking = rank(model1, conc, configs)
    advised = ranking[0].config
    said = extrapolation(model1, conc, ranking, {start: first.goodput[conc]} if conc in first.goodput else {})
    off = next((ln for ln in res.launches if ln.config == OFF), None) or src.launch(OFF)
    level = off.goodput[conc] / truth[OFF]  # the launches' level over the grid's
    leveled = {c: v * level for c, v in truth.items()}
    cov, width = coverage(res.launches, conc, configs, leveled)
    cov1, width1 = coverage([first], conc, configs, leveled)
    return {
        "world": w["id"],
        "features": [w["method"].lower()],
        "concurrency": conc,
        "chosen": label(res.chosen),
        "optimum": label(opt),
        "ratio": truth[res.chosen] / truth[opt],
        "advised": label(advised),
        "advise_ratio": truth[advised] / truth[opt],
        "advise_flagged": said is not None,  # advise said its order rests on extrapolation
        "advise_settle": said.settle if said is not None else [],
        "start_ratio": truth[start] / truth[opt],
        "off_ratio": truth[OFF] / truth[opt],
        "relaunches": res.relaunches,
        "coverage": cov,
        "width": width,
        "coverage1": cov1,
        "width1": width1,
        "level": level,
        "stop": res.stop_reason,
        "launched": [label(c) for c in src.asked],
    }


def real_report(rows: list[dict], budget: int) -> str:
    n = len(rows)
    within = sum(1 for r in rows if r["ratio"] >= WITHIN)
    advised = sum(1 for r in rows if r["advise_ratio"] >= WITHIN)
    worst = min(rows, key=lambda r: r["ratio"])
    rel = [r["relaunches"] for r in rows]
    out = [
        f"{n} real-engine worlds ({REAL_WORLDS.relative_to(ROOT)}), budget {budget} relaunches, from K=3; "
        f"truth: each world's measured grid",
        f"(a) tune within 2 % of the best: {within}/{n} = {within / n:.0%}; worst {worst['ratio']:.3f} "
        f"({worst['world']}: chose {worst['chosen']}, best {worst['optimum']}); advise from the start launch "
        f"alone within 2 %: {advised}/{n}, and of those not, marked extrapolated: "
        f"{sum(1 for r in rows if r['advise_ratio'] < WITHIN and r['advise_flagged'])}/{n - advised}   "
        f"(the start within 2 %: {sum(1 for r in rows if r['start_ratio'] >= WITHIN)}/{n}, "
        f"off: {sum(1 for r in rows if r['off_ratio'] >= WITHIN)}/{n})",
        f"(b) relaunches: mean {sum(rel) / n:.2f}, max {max(rel)}",
        f"(c) interval coverage (the grid's truth on the launches' level, all configurations): after tune "
        f"{sum(r['coverage'] for r in rows) / n:.0%} (median half-width {sorted(r['width'] for r in rows)[n // 2]:.1%}), "
        f"from the start launch alone {sum(r['coverage1'] for r in rows) / n:.0%} "
        f"(median half-width {sorted(r['width1'] for r in rows)[n // 2]:.1%})",
    ]
    for r in rows:
        out.append(
            f"    {r['world']:<30} tune {r['ratio']:.3f} ({r['chosen']}, {r['relaunches']} relaunches: "
            f"{' -> '.join(r['launched'])}), advise {r['advise_ratio']:.3f} ({r['advised']}"
            f"{'; extrapolated, settle with: ' + ' and '.join(r['advise_settle']) if r['advise_flagged'] else ''}), best {r['optimum']} "
            f"(K=3 {r['start_ratio']:.3f}, off {r['off_ratio']:.3f}); coverage {r['coverage']:.0%}/{r['coverage1']:.0%}, "
            f"launches/grid level {r['level']:.2f}"
        )
    return "\n".join(out)
