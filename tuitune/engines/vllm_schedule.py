"""vLLM's dynamic schedule (``--speculative-config``'s ``num_speculative_tokens_per_batch_size``): its
rules, the K it gives a batch size, and the file ``advise --emit vllm-dsd`` writes (document, text,
parse, read, write). The engine (``engines/vllm.py``) reaches it through ``Engine``'s schedule methods."""

from __future__ import annotations

import json

from tuitune.engines.base import read_schedule_text

# ---- the dynamic schedule (SpeculativeConfig.num_speculative_tokens_per_batch_size) ------------------
# vLLM 0.32.0 (the CPU build's release; 0.33.0's is the same): ``config/speculative.py`` declares the
# field as ``list[tuple[int, int, int]] | None`` (line 491), and ``v1/spec_decode/dynamic/utils.py``
# checks and expands it when the scheduler starts (``validate_and_normalize_dynamic_sd_schedule``,
# lines 7-74; ``build_dynamic_sd_schedule_lookup``, lines 77-148; called from
# ``v1/core/sched/scheduler.py`` line 310). Its rules: a non-empty list of (start, end, K) with
# inclusive batch-size ranges; start and end > 0, start <= end, K >= 0 (0 = no drafts that step); sorted
# by start, the ranges must not overlap and the first must start at 1. A batch size in a gap gets the
# K of the range before it, one past the last range the last K, and every K is cut to
# ``num_speculative_tokens`` without a word. The batch size is the number of requests scheduled in
# the step (``len(num_scheduled_tokens)``, scheduler.py line 1487). tuitune refuses what vLLM would
# cut or reorder silently: ranges out of order, and a K above num_speculative_tokens.

DSD_SCHEDULE = "vllm-dsd"  # advise --emit's name for it
DSD_KEY = "num_speculative_tokens_per_batch_size"
DSD_LAST_END = 1024  # the last range's end as written (vLLM carries its K on past it anyway)


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_dsd(table, max_k: int | None = None) -> list[tuple[int, int, int]]:
    """vLLM's rules for a dynamic schedule, and tuitune's two stricter ones (ranges in order; no K
    above ``max_k``, the preset's num_speculative_tokens): the table as (start, end, K) tuples, or
    ValueError (one sentence)."""
    if not isinstance(table, (list, tuple)) or not table:
        raise ValueError(f"a dynamic schedule is a non-empty list of [start, end, K] ranges, got {table!r}")
    out: list[tuple[int, int, int]] = []
    for i, entry in enumerate(table):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(map(_whole, entry)):
            raise ValueError(f"range {i + 1} ({entry!r}) is not [start, end, K] with three integers")
        start, end, k = entry
        if start < 1 or end < start:
            raise ValueError(f"range {i + 1} [{start}, {end}, {k}]: batch sizes run from start >= 1 to end >= start")
        if k < 0:
            raise ValueError(f"range {i + 1} [{start}, {end}, {k}]: K must be >= 0 (0 drafts nothing at those sizes)")
        if max_k is not None and k > max_k:
            raise ValueError(
                f"range {i + 1} [{start}, {end}, {k}]: K {k} is above num_speculative_tokens {max_k} "
                f"(vLLM would cut it to {max_k} without a word); raise num_speculative_tokens or lower K"
            )
        if out and start <= out[-1][1]:
            raise ValueError(
                f"range {i + 1} [{start}, {end}, {k}] starts at or before the end of range {i} ({out[-1][1]}): "
                "the ranges must be in order and must not overlap"
            )
        out.append((start, end, k))
    if out[0][0] != 1:
        raise ValueError(f"the first range starts at {out[0][0]}: vLLM needs it to start at batch size 1")
    return out


def dsd_k(table, batch_size: int, max_k: int) -> int:
    """The K vLLM drafts at ``batch_size`` under this schedule (its carry-forward through gaps and
    past the last range, cut to ``max_k``)."""
    k = 0
    for start, _end, kk in check_dsd(table):
        if start > batch_size:
            break
        k = kk
    return min(k, max_k)


def dsd_gaps(table) -> list[tuple[int, int, int]]:
    """Batch sizes that no range names: (first, last, the K vLLM carries into them)."""
    rows = check_dsd(table)
    return [(a[1] + 1, b[0] - 1, a[2]) for a, b in zip(rows, rows[1:], strict=False) if b[0] > a[1] + 1]


def dsd_document(table) -> dict:
    """The file ``advise --emit vllm-dsd`` writes (and ``speculative.dynamic_schedule`` reads)."""
    return {DSD_KEY: [list(r) for r in check_dsd(table)]}


def dsd_text(table) -> str:
    """The file's text: JSON, one range a line (reads and diffs well)."""
    rows = ",\n".join(f"    {json.dumps(list(r))}" for r in check_dsd(table))
    return f"{{\n  {json.dumps(DSD_KEY)}: [\n{rows}\n  ]\n}}\n"


def parse_dsd(text: str, source: str = "the file") -> list[tuple[int, int, int]]:
    """A schedule file's text (JSON: ``{"num_speculative_tokens_per_batch_size": [[start, end, K],
    ...]}``) as its checked table; ValueError (one sentence) otherwise."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{source} is not JSON ({e})") from None
    if not isinstance(doc, dict) or set(doc) != {DSD_KEY}:
        raise ValueError(f'{source} must be a JSON object with the one key "{DSD_KEY}"')
    try:
        return check_dsd(doc[DSD_KEY])
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def read_dsd(path: str, source: str = "the file") -> list[tuple[int, int, int]]:
    """A schedule file on this machine, checked; ValueError (one sentence, naming it as ``source``)
    when it cannot be read or is not a schedule."""
    return parse_dsd(read_schedule_text(path, source), source)


def write_dsd(path: str, table) -> None:
    """Write the schedule file atomically: a temporary file beside ``path``, flushed, renamed over
    it (a reader sees the old file or the new one, never half of one); OSError when it cannot."""
    import os
    import tempfile

    text = dsd_text(table)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
