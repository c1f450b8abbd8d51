"""SGLang's speculative-decoding rules (server_args.py; FACTS.md §2), applied before a launch.

SGLang silently rewrites some combinations at start-up (topk 1 forces draft tokens = steps + 1)
and refuses others; tuitune applies the same rules up front so that the command it shows is the
configuration the server will really run.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "SUFFIX")
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE")
# drafting without a draft model: n-gram lookup in the request's own tokens (prompt lookup), and
# vLLM's suffix decoding (suffix trees over the prompt and earlier outputs)
MODEL_FREE = ("NGRAM", "SUFFIX")
# SGLang's NGRAM defaults (arg_groups/speculative_hook.py _handle_ngram, fields/spec.py, 0.5.23):
# 12 draft tokens; the tree's breadth (its "topk") is --speculative-ngram-max-bfs-breadth, 10
NGRAM_DRAFT_TOKENS = 12
NGRAM_MAX_BFS_BREADTH = 10
NGRAM_MIN_BFS_BREADTH = 1


@dataclass(frozen=True, slots=True)
class Resolved:
    algorithm: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    derived: tuple[str, ...] = ()  # names of values tuitune (or SGLang) filled in
    adjusted: tuple[str, ...] = ()  # sentences: what SGLang would silently change


def resolve(
    algorithm: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    draft_model_path: str | None = None,
    ngram_max_bfs_breadth: int | None = None,
    ngram_min_bfs_breadth: int | None = None,
) -> Resolved:
    """Apply the rules; raise ValueError with a sentence for a combination SGLang refuses."""
    if algorithm is None:
        return Resolved(None, None, None, None)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if algorithm == "NGRAM":
        return resolve_ngram(num_steps, eagle_topk, num_draft_tokens, ngram_max_bfs_breadth, ngram_min_bfs_breadth)
    if algorithm == "SUFFIX":
        raise ValueError("algorithm SUFFIX is vLLM's suffix decoding (server.engine: vllm); SGLang has no such drafter")
    if algorithm in NEEDS_DRAFT_MODEL and not draft_model_path:
        raise ValueError(f"draft_model_path is required for {algorithm}")
    if num_steps is None:
        if eagle_topk is not None or num_draft_tokens is not None:
            raise ValueError(
                "num_steps, eagle_topk and num_draft_tokens are all-or-none: set "
                "num_steps too, or leave all three for SGLang to choose"
            )
        return Resolved(algorithm, None, None, None)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1 (got {num_steps})")
    derived: list[str] = []
    adjusted: list[str] = []
    if eagle_topk is None:
        if num_draft_tokens is not None:
            raise ValueError("num_steps, eagle_topk and num_draft_tokens are all-or-none: eagle_topk is missing")
        eagle_topk = 1
        derived.append("eagle_topk")
    if eagle_topk < 1:
        raise ValueError(f"eagle_topk must be >= 1 (got {eagle_topk})")
    if eagle_topk == 1:
        if num_draft_tokens is None:
            derived.append("num_draft_tokens")
        elif num_draft_tokens != num_steps + 1:
            adjusted.append(
                f"num_draft_tokens {num_draft_tokens} would be adjusted by SGLang to "
                f"num_steps + 1 = {num_steps + 1} because eagle_topk is 1"
            )
        num_draft_tokens = num_steps + 1
    elif num_draft_tokens is None:
        raise ValueError("num_draft_tokens must be set when eagle_topk > 1")
    limit = num_steps * eagle_topk + 1
    if num_draft_tokens > limit:
        raise ValueError(f"num_draft_tokens {num_draft_tokens} is more than num_steps * eagle_topk + 1 = {limit}")
    if num_draft_tokens < 2:
        raise ValueError(f"num_draft_tokens must be >= 2 (got {num_draft_tokens})")
    return Resolved(algorithm, num_steps, eagle_topk, num_draft_tokens, tuple(derived), tuple(adjusted))


def resolve_ngram(
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    max_breadth: int | None,
    min_breadth: int | None,
) -> Resolved:
    """SGLang's NGRAM: a tree of ``num_draft_tokens`` tokens (the last verified one and the
    drafts looked up in a trie of the request's own tokens) at most ``max_breadth`` wide. SGLang
    overwrites ``speculative_eagle_topk`` with the breadth and derives ``speculative_num_steps``
    from both, so neither is a setting here. In tuitune's terms the configuration is (steps,
    topk, draft tokens) = (draft tokens − 1, breadth, draft tokens): a chain when the breadth is 1."""
    if eagle_topk is not None:
        raise ValueError(
            "eagle_topk: SGLang's NGRAM sets it from ngram_max_bfs_breadth (the tree's breadth); set that instead"
        )
    if num_steps is not None:
        raise ValueError(
            "num_steps: SGLang's NGRAM derives it from num_draft_tokens and the breadth; set num_draft_tokens"
        )
    derived: list[str] = []
    if num_draft_tokens is None:
        num_draft_tokens = NGRAM_DRAFT_TOKENS
        derived.append("num_draft_tokens")
    if max_breadth is None:
        max_breadth = NGRAM_MAX_BFS_BREADTH
        derived.append("ngram_max_bfs_breadth")
    low = NGRAM_MIN_BFS_BREADTH if min_breadth is None else min_breadth
    if low > max_breadth:
        raise ValueError(f"ngram_min_bfs_breadth {low} is more than ngram_max_bfs_breadth {max_breadth}")
    return Resolved("NGRAM", num_draft_tokens - 1, max_breadth, num_draft_tokens, tuple(derived))
