"""The acceptance guard (tuitune.measure.guard), pure: fed made-up windows and decode lines, what it
raises and clears, against what baseline. The simulator and the real SGLang drive it end to end in
tests/experiments/test_watch.py and tests/real/test_real_sglang.py."""

from __future__ import annotations

import re

from tuitune.base.events import DecodeStats, Marker, ProfileWindow, VllmSpec
from tuitune.measure.guard import PREFIX, AcceptanceGuard, Baseline, Figures


def window(accept_hist: str, cycles: int = 100, steps: int = 3, drafter: str | None = None) -> ProfileWindow:
    counts = {int(k): int(n) for k, n in (p.split(":") for p in accept_hist.split(","))}
    total = sum(counts.values())
    accept = sum(k * n for k, n in counts.items()) / total
    return ProfileWindow(
        draft_ms=1.0,
        verify_ms=2.0,
        extend_ms=0.5,
        accept_len=accept,
        cycle_ms=3.5,
        cycles=cycles,
        v=2,
        steps=steps,
        topk=1,
        draft_tokens=steps + 1,
        drafter=drafter,
        accept_hist=accept_hist,
    )


GOOD = "1:30,2:30,3:20,4:20"  # accept length 2.30; position 1 accepted 70 %, 2: 40 %, 3: 20 %
WORSE = "1:60,2:25,3:10,4:5"  # 1.60: 30 % below
CLOSE = "1:33,2:29,3:19,4:19"  # 2.24: 3 % below (noise)
NO_THIRD = "1:30,2:30,3:38,4:2"  # 2.12 (8 % below), position 3 at 2 % against 20 %


def texts(markers: list[Marker]) -> list[str]:
    return [m.text.removeprefix(PREFIX) for m in markers]


def test_it_learns_from_the_launchs_first_cycles_then_raises_once_and_clears_with_hysteresis():
    g = AcceptanceGuard()
    t = 0.0
    for _ in range(5):  # 500 cycles: the baseline
        assert g.feed([window(GOOD)], t) == []
        t += 1
    assert g.learned is not None and abs(g.learned.figures["probe"].accept - 2.3) < 1e-9
    assert "first 500 cycles" in g.learned.where and g.status.startswith("ok: accept length 2.30")
    for _ in range(3):  # noise: nothing
        assert g.feed([window(CLOSE)], t) == []
        t += 1
    out = []
    for _ in range(8):  # two windows running below: raised (one alone could be chance)
        out += texts(g.feed([window(WORSE)], t))
        t += 1
    drops = [x for x in out if x.startswith("accept length ")]
    assert len(drops) == 1 and "below the baseline's 2.30" in drops[0], out  # raised once, not at every window
    assert g.raised == 2 and g.status.startswith("ALARM: accept length")  # and position 3
    # back to 8 % below: inside the threshold, not yet within half of it: the alarm stays
    out = []
    for _ in range(8):
        out += texts(g.feed([window(NO_THIRD)], t))
        t += 1
    assert not [x for x in out if "accept length" in x] and "accept_drop" in g.active
    for _ in range(4):
        out += texts(g.feed([window(GOOD)], t))
        t += 1
    assert "cleared: every draft position accepts at least half as often as at the baseline again" in out
    assert any(
        re.match(r"cleared: accept length 2\.\d\d is back within 5 % of the baseline's 2\.30$", x) for x in out
    ), out
    assert "accept_drop" not in g.active and g.raised >= 1


def test_a_draft_position_that_collapses_is_named():
    g = AcceptanceGuard(drop=0.5)  # the accept length alone would not alarm
    for i in range(5):
        g.feed([window(GOOD)], i)
    out = []
    for i in range(5, 15):
        out += texts(g.feed([window(NO_THIRD)], i))
    # raised when the window before the last 400 cycles (one of the baseline's, three new) is under half too
    assert out == [
        "draft position 3 is accepted 2 % of the time, against 20 % at the baseline "
        "(the first 500 cycles this guard saw of the launch)"
    ], out


def test_speculation_going_off_is_said_both_ways():
    # the schedule turns it off: the windows say 0 steps
    g = AcceptanceGuard()
    for i in range(6):
        g.feed([window(GOOD)], i)
    out = []
    for i in range(6, 16):
        out += texts(g.feed([window("1:100", steps=0)], i))
    assert any("0 steps" in x for x in out), out
    out = texts(g.feed([window(GOOD)], 20))
    assert out == ["cleared: speculative cycles are back"], out
    # decoding goes on and no speculative cycle comes
    g = AcceptanceGuard(off_after_s=30)
    g.feed([window(GOOD)], 0.0)
    assert g.feed([DecodeStats(gen_throughput=50.0)], 20.0) == []
    out = texts(g.feed([DecodeStats(gen_throughput=50.0)], 31.0))
    assert out == ["decoding went on for 31 s without a speculative cycle: speculation looks off"], out
    assert texts(g.feed([window(GOOD)], 32.0)) == ["cleared: speculative cycles are back"]


def test_acceptance_falling_with_context_is_found_where_the_engine_logs_context():
    g = AcceptanceGuard()
    t = 0.0
    out = []
    for i in range(30):
        long_ = i % 2 == 1
        # SGLang's decode line: tokens in the running requests' context, and its own accept length
        d = DecodeStats(gen_throughput=50.0, running_req=2, token=4000 if long_ else 400)
        out += texts(g.feed([d, window(WORSE if long_ else GOOD, cycles=60)], t))
        t += 1
    ctx = [x for x in out if x.startswith("accept length falls with context")]
    assert ctx == ["accept length falls with context: 2.30 at about 200 tokens, 1.60 at about 2,000"], out


def test_the_engines_own_figures_stand_in_without_the_probe():
    # SGLang's decode line, no probe: its accept len
    g = AcceptanceGuard()
    out = []
    for i in range(8):
        out += texts(g.feed([DecodeStats(gen_throughput=50.0, accept_len=2.5)], i))
    assert g.source == "engine" and g.learned is not None and "log lines" in g.learned.where
    for i in range(8, 20):
        out += texts(g.feed([DecodeStats(gen_throughput=50.0, accept_len=1.9)], i))
    assert (
        len(out) == 1 and "accept length 1.90 over the last 6 log lines is 24 % below the baseline's 2.50" in out[0]
    ), out
    # vLLM's SpecDecoding line: its mean acceptance length and per-position rates
    g = AcceptanceGuard(drop=0.9)
    for i in range(8):
        g.feed([VllmSpec(mean_accept_len=2.2, per_position=(0.7, 0.4, 0.1))], i)
    out = []
    for i in range(8, 20):
        out += texts(g.feed([VllmSpec(mean_accept_len=2.0, per_position=(0.7, 0.1, 0.1))], i))
    assert out and out[0].startswith("draft position 2 is accepted 10 % of the time, against 40 %"), out
    # once the probe's windows come, they are what the guard reads
    g.feed([window(GOOD)], 20)
    assert g.source == "probe"


def test_a_capture_baseline_is_used_when_comparable_and_set_aside_with_a_note_when_not():
    base = Baseline.from_events([window(GOOD)] * 5, "capture good.jsonl")
    assert base is not None
    g = AcceptanceGuard(baseline=base)
    out = []
    for i in range(8):
        out += texts(g.feed([window(WORSE)], i))
    assert out and "(capture good.jsonl)" in out[0], out  # no learning needed: the capture is the baseline
    # the capture ran 3 steps, this server 5: not comparable; the launch's own first cycles instead
    g = AcceptanceGuard(baseline=base)
    out = []
    for i in range(9):
        out += texts(g.feed([window(WORSE, steps=5)], i))
    assert out == [] and g.notes and "not comparable" in g.notes[0] and "steps 3" in g.notes[0], g.notes
    assert g.current_baseline() is not None and g.current_baseline()[0] is g.learned


def test_quiet_reading_learns_but_never_alarms_and_reset_forgets_the_launch():
    g = AcceptanceGuard()
    for i in range(5):
        g.feed([window(GOOD)], i, quiet=True)
    assert g.feed([window(WORSE)] * 8, 6, quiet=True) == [] and not g.active
    assert texts(g.feed([window(WORSE)], 7))[0].startswith("accept length 1.60")  # the first live batch
    g.reset()
    assert g.learned is None and not g.active and g.status == "waiting for acceptance figures"


def test_figures_of_mixed_configurations_name_none():
    from tuitune.measure.guard import _Reading

    f = Figures.of(
        [_Reading(0, "probe", 2.0, 10, config=(3, 1, 4, None)), _Reading(0, "probe", 2.0, 10, config=(2, 1, 3, None))]
    )
    assert f is not None and f.config is None
