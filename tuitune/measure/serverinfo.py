"""What the benchmark asks a server of itself, outside its requests: which API it speaks, the model
it serves, its own figures (/server_info: throughput, accept length, its concurrency limit, the
simulator's counters), and whether the arms of a comparison ran with one concurrency limit."""

from __future__ import annotations

import math

from tuitune.base.errors import TuituneError
from tuitune.measure.metrics import quantile

# the endpoint each API streams from (both POST only)
API_PATHS = {"native": "/generate", "openai": "/v1/completions"}


class BenchError(TuituneError, ValueError):
    """A benchmark that cannot start as asked; the message is one sentence."""

    code = 2


async def detect_api(session, url: str, timeout: float = 5.0) -> str | None:
    """Which API the server at ``url`` speaks, asked without generating anything: a GET on a
    POST-only route answers 405 where the route exists and 404 where it does not (FastAPI, as
    SGLang and vLLM serve, and aiohttp alike). SGLang serves both and is benchmarked through its
    native API (its per-request speculative counts); vLLM has no ``/generate``. None when the
    server cannot be reached (the requests then say why); BenchError when neither route is there."""
    import aiohttp

    seen: dict[str, int] = {}
    for api, path in API_PATHS.items():
        try:
            async with session.get(url.rstrip("/") + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                seen[api] = resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None
    for api in API_PATHS:
        if seen[api] in (200, 405, 422):  # 422: a framework that validates a GET's missing body
            return api
    raise BenchError(
        f"{url} serves neither /generate (HTTP {seen['native']}) nor /v1/completions (HTTP {seen['openai']}): "
        "pass --api native for SGLang's native API or --api openai for an OpenAI-compatible server"
    )


async def fetch_server_info(session, url: str, timeout: float = 5.0) -> dict:
    """last_gen_throughput, avg_spec_accept_length, step_time_dict, version; {} if unavailable."""
    import aiohttp

    from tuitune import engines

    for path in engines.INFO_PATHS:  # SGLang's /server_info (older: /get_server_info), vLLM's /version
        try:
            async with session.get(url.rstrip("/") + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    continue
                info = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            continue
        if not isinstance(info, dict):
            continue
        return _server_info(info)
    return {}


def limit_confound(limits: dict[str, list], concurrency: int) -> tuple[bool, str] | None:
    """Arms that ran with different concurrency limits (label -> the ``max_running_requests`` each of
    its runs' servers reported, None where unknown): None when they ran with one limit (or none is
    known); else (confounded, one sentence). Confounded when the benchmark's ``concurrency`` is above
    the lowest limit: that arm could not run every stream at once, so a difference is partly the
    limit's (SGLang resets it to 48 whenever speculation is on, GPU or CPU)."""
    known = {arm: sorted({v for v in vals if isinstance(v, int)}) for arm, vals in limits.items()}
    seen = {v for vs in known.values() for v in vs}
    if len(seen) < 2:
        return None
    named = ", ".join(f"{arm} {'/'.join(map(str, vs)) or '?'}" for arm, vs in known.items())
    low = min(seen)
    if concurrency > low:
        return True, (
            f"the arms ran with different max_running_requests ({named}) and concurrency {concurrency} is above "
            f"{low}: the arm held to {low} could not run every stream at once; pin server.args."
            f"max-running-requests to one value in both"
        )
    return (
        False,
        f"the arms ran with different max_running_requests ({named}), not reached at concurrency {concurrency}",
    )


def _server_info(info: dict) -> dict:
    """What a server's own figures say, each kept only when it is of the type and range it must be
    (a hostile or broken server's wrong types and non-finite numbers are left out, never shown)."""
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    out: dict = {k: float(state[k]) for k in ("last_gen_throughput", "avg_spec_accept_length") if _figure(state.get(k))}
    steps_by = state.get("step_time_dict")
    if isinstance(steps_by, dict):
        steps = [x for v in steps_by.values() if isinstance(v, list) for x in v if _figure(x)]
        if steps:
            out["step_time_ms_median"] = quantile(sorted(steps), 0.5) * 1000
    if isinstance(info.get("version"), str) and info["version"]:
        out["version"] = info["version"][:200]
    # the requests the scheduler runs at once: SGLang resets it to 48 when speculating (GPU or CPU), a
    # confound for any comparison with speculation off at higher concurrency (experiments check it)
    limit = state.get("effective_max_running_requests_per_dp", info.get("max_running_requests"))
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < 10**9:
        out["max_running_requests"] = limit
    sim = info.get("sim")
    if isinstance(sim, dict) and all(_figure(sim.get(k, 1)) or sim.get(k) == 0 for k in ("cycles", "cycles_late")):
        out["sim"] = sim
    return out


def _figure(v: object) -> bool:
    """A finite, positive number (not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


async def served_model(session, url: str, timeout: float = 5.0) -> str | None:
    """The first model id of /v1/models (vLLM refuses requests for any other name); None if unknown."""
    import aiohttp

    try:
        async with session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else {}
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
    return first.get("id") if isinstance(first.get("id"), str) else None


BUSY = ("model_busy_s", "wall_busy_s")  # the simulator's modelled and wall-clock busy time (/server_info)


def sim_shares(before: dict, after: dict) -> tuple[float | None, float | None]:
    """What a simulator's counters (``sim`` of /server_info) before and after a run's measured requests
    say (a real server has none): (the share of its cycles that started late, the share of its busy
    wall time it spent behind its clock), each None where the counters do not give it."""
    late = lag = None
    if all(k in d for d in (before, after) for k in ("cycles", "cycles_late")) and after["cycles"] > before["cycles"]:
        late = (after["cycles_late"] - before["cycles_late"]) / (after["cycles"] - before["cycles"])
    if all(_figure(d.get(k)) or d.get(k) == 0 for d in (before, after) for k in BUSY):
        model_s, wall_s = (after[k] - before[k] for k in BUSY)
        if wall_s > 0 and model_s >= 0:
            lag = max(0.0, 1.0 - model_s / wall_s)
    return late, lag
