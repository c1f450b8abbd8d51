"""Typed experiment results built from a few of their parts, for the tests of what formats them."""

from __future__ import annotations


def ab_result(launches: list[dict], verdict: dict, a: str = "a", b: str = "b", stopped: str = "") -> object:
    """An ``AbResult`` of these launch rows and this verdict: the names given, no notes, looks or
    design, the power a prior's (what ``format_ab`` does not print) and none measured after."""
    import msgspec

    from tuitune.experiments.ab import power_note
    from tuitune.experiments.results import AbPower, AbPowers, AbResult

    rounds = max(1, len(launches) // 2)
    return AbResult(
        a=a,
        b=b,
        aa=a == b,
        rounds=rounds,
        first_look=rounds,
        max_rounds=rounds,
        launches=launches,
        notes=[],
        power=AbPowers(msgspec.convert(power_note(rounds, 0.02, "a prior"), AbPower), None),
        design=None,
        looks=[],
        stopped=stopped,
        verdict=verdict,
    )


def tune_summary(**fields) -> object:
    """A ``TuneSummary`` with these fields, the rest neutral (a start and a choice of speculation off,
    nothing measured, failed or kept): for the tests of what tune prints."""
    from tuitune.experiments.results import TuneSummary

    off = {"steps": 0, "topk": 1, "draft_tokens": 1}
    base = {
        "kind": "result",
        "start": off,
        "chosen": off,
        "chosen_label": "off",
        "concurrency": 1,
        "relaunches": 0,
        "held_live": 0,
        "stop_reason": "budget",
        "nccl": None,
        "nccl_prediction": None,
        "measured": {},
        "failed": {},
        "chosen_why": "",
    }
    return TuneSummary(**{**base, **fields})
