"""The simulator's truth for the advisor's accuracy (benchmarks/advisor_accuracy.py runs it; tests/decide/test_advise.py,
tests/decide/test_schedule.py and tests/tui/test_tui.py measure with it): random simulated machines, a
configuration's modelled goodput, a source that measures the model as tune would, and rank agreement."""

from __future__ import annotations

import math
import random

from tuitune.decide.costmodel import fit
from tuitune.decide.launch import Config, Launch
from tuitune.experiments.tuneloop import tune_loop
from tuitune.measure.parse import parse_line
from tuitune.sim import model as S

CONCURRENCY = (1, 8, 32)
WINDOW = 40
WINDOWS_PER_LEVEL = 4


def random_machine(rng: random.Random, i: int) -> S.Machine:
    tp = rng.choice((1, 1, 2, 4, 8, 8))
    topology = rng.choice(("pcie", "nvlink")) if tp > 1 else "nvlink"
    mem = rng.uniform(3.0, 12.0) * (1 + 0.6 * math.log2(tp)) if tp > 1 else rng.uniform(3.0, 10.0)
    knee_n = math.exp(rng.uniform(math.log(8), math.log(400)))  # tokens where compute takes over
    comm = 0.0 if tp == 1 else rng.uniform(0.3, 2.0) * (4.0 if topology == "pcie" else 1.0) * math.log2(tp)
    draft_mem = mem * rng.uniform(0.02, 0.10)
    a1 = rng.uniform(0.35, 0.9)  # weak to strong drafters
    r = rng.uniform(0.7, 0.95)
    acc = [min(0.97, max(0.02, a1 * r**d * math.exp(rng.gauss(0, 0.05)))) for d in range(8)]
    data = {
        "name": f"random-{i}",
        "tp_size": tp,
        "topology": topology,
        "target": {
            "mem_ms": round(mem, 3),
            "ms_per_token": round(mem / knee_n, 5),
            "knee_sharpness": round(rng.uniform(1.0, 6.0), 2),
            "comm_ms": round(comm, 3),
            "kv_ms_per_token": round(rng.uniform(0.0, 0.0003), 6),
            "verify_extra_ms": round(mem * rng.choice((0.0, 0.0, rng.uniform(0.05, 0.6))), 3),
        },
        "draft": {
            "mem_ms": round(draft_mem, 4),
            "ms_per_token": round(draft_mem / math.exp(rng.uniform(math.log(50), math.log(1000))), 6),
        },
        "extend_ms": round(draft_mem * rng.uniform(0.5, 2.0), 4),
        "sched_ms": round(rng.uniform(0.1, 0.6), 3),
        "acceptance": [round(a, 3) for a in acc],
        "launch_sigma": round(rng.uniform(0.005, 0.02), 4),
        "sibling_decay": round(rng.uniform(0.5, 0.9), 3),
    }
    return S.machine_from_dict(data, data["name"])


def sim_dict(c: Config) -> dict:
    if not c.speculative:
        return {"algorithm": None}
    return {"algorithm": "EAGLE3", "num_steps": c.steps, "eagle_topk": c.topk, "num_draft_tokens": c.draft_tokens}


def truth(m: S.Machine, c: Config, conc: int) -> float:
    return S.expected_goodput(m, sim_dict(c), conc)


class ModelSource:
    """Launches synthesised from the simulator's model (see the module doc)."""

    def __init__(self, machine: S.Machine, rng: random.Random, jitter: float = 0.02):
        self.m, self.rng, self.jitter = machine, rng, jitter
        self.launches = 0

    async def measure(self, c: Config, levels: list[int]) -> Launch:
        self.launches += 1
        launch_f = S.jitter(self.rng, self.m.launch_sigma)
        cfg = S.config_from_dict(self.m, sim_dict(c))
        cfg = S.sim_config(
            self.m,
            algorithm=cfg.algorithm,
            steps=cfg.steps,
            topk=cfg.topk,
            draft_tokens=cfg.draft_tokens,
            launch_factor=launch_f,
        )
        ln = Launch(c)
        for bs in levels:
            if c.speculative:
                for _ in range(WINDOWS_PER_LEVEL):
                    ln.windows.append(self._window(cfg, bs))
            else:
                cost = S.cycle_cost(cfg, bs)
                step = cost.cycle_ms * S.jitter(self.rng, self.jitter / 3)
                line = (
                    f"[2026-11-30 09:00:00 TP0] Decode batch, #running-req: {bs}, #token: {bs * 300}, "
                    f"token usage: 0.01, cuda graph: True, gen throughput (token/s): {bs / step * 1000:.2f}, "
                    f"#queue-req: 0"
                )
                ln.decodes.append(parse_line(line))
            g = S.goodput(cfg, bs) * S.jitter(self.rng, 0.01)
            ln.goodput[bs] = g
        return ln

    def _window(self, cfg: S.SimConfig, bs: int):
        cost = S.cycle_cost(cfg, bs)
        sums = {"d": 0.0, "v": 0.0, "e": 0.0}
        hist: dict[int, int] = {}
        for _ in range(WINDOW):
            j = S.jitter(self.rng, self.jitter)
            sums["d"] += cost.draft_ms * j
            sums["v"] += cost.verify_ms * S.jitter(self.rng, self.jitter)
            sums["e"] += cost.extend_ms * j
            for _ in range(bs):
                n = S.draw_accepted(cfg, lambda _d: self.rng.random())
                hist[n] = hist.get(n, 0) + 1
        d, v, e = (sums[k] / WINDOW for k in "dve")
        o = cost.other_ms
        tokens = sum(k * n for k, n in hist.items())
        acc = tokens / (WINDOW * bs)
        line = (
            f"[2026-11-30 09:00:00 TP0] EAGLE3_PROFILE v=2 cycles={WINDOW} bs={bs} steps={cfg.steps} "
            f"topk={cfg.topk} draft_tokens={cfg.draft_tokens} verify_tokens={bs * cfg.draft_tokens} "
            f"draft_ms={d:.4f} verify_ms={v:.4f} extend_ms={e:.4f} other_ms={o:.4f} "
            f"cycle_ms={d + v + e + o:.4f} accept_len={acc:.4f} "
            f"accept_hist={','.join(f'{k}:{n}' for k, n in sorted(hist.items()))} sync=sim"
        )
        return parse_line(line)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=False))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def rho_after(launches: list[Launch], m: S.Machine, conc: int, configs: list[Config], true: dict) -> float:
    model = fit(launches)
    pred = [model.predict(c, conc).goodput.mean for c in configs]
    return spearman(pred, [true[c] for c in configs])


async def case(m: S.Machine, conc: int, budget: int, rng: random.Random, configs: list[Config]) -> dict:
    true = {c: truth(m, c, conc) for c in configs}
    opt_c = max(true, key=true.get)
    src = ModelSource(m, rng)
    start = Config.chain(3)
    res = await tune_loop(src, start, budget, conc, configs=configs)
    ratio = true[res.chosen] / true[opt_c]
    r1 = rho_after(res.launches[:1], m, conc, configs, true)
    if len(res.launches) >= 3:
        r3 = rho_after(res.launches[:3], m, conc, configs, true)
    else:  # stopped early: the third launch is the one a user would make next (the advised one)
        extra = list(res.launches)
        while len(extra) < 3:
            model = fit(extra)
            seen = {ln.config for ln in extra}
            nxt = next(
                (
                    p.config
                    for p in sorted((model.predict(c, conc) for c in configs), key=lambda p: -p.goodput.hi)
                    if p.config not in seen
                ),
                None,
            )
            if nxt is None:
                break
            extra.append(
                await src.measure(nxt, sorted({max(1, conc // 4), conc, min(2 * conc if conc > 1 else 4, 256)}))
            )
        r3 = rho_after(extra[:3], m, conc, configs, true)
    return {
        "machine": m.name,
        "concurrency": conc,
        "chosen": res.chosen.label,
        "optimum": opt_c.label,
        "ratio": ratio,
        "relaunches": res.relaunches,
        "start_ratio": true[start] / true[opt_c],
        "rho1": r1,
        "rho3": r3,
        "stop": res.stop_reason,
    }
