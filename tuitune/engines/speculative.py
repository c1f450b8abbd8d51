"""SGLang's speculative-decoding rules (server_args.py; FACTS.md §2), applied before a launch.

SGLang silently rewrites some combinations at start-up (topk 1 forces draft tokens = steps + 1)
and refuses others; tuitune applies the same rules up front so that the command it shows is the
configuration the server will really run.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE")


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
) -> Resolved:
    """Apply the rules; raise ValueError with a sentence for a combination SGLang refuses."""
    if algorithm is None:
        return Resolved(None, None, None, None)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
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


def hidden_size(config: dict) -> int | None:
    """A model's hidden size from its config.json (a multimodal wrapper's text model's)."""
    text = config.get("text_config")
    v = (text if isinstance(text, dict) else config).get("hidden_size")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def draft_misfit(target_config: dict, draft_config: dict) -> str | None:
    """Why an EAGLE / EAGLE-3 draft cannot run on a target, from the two config.json files, or None.

    The draft's first layer reads the target's hidden states: it expects them of size
    ``target_hidden_size`` (its own ``hidden_size`` when absent; SGLang's and vLLM's llama_eagle3
    read it so), and the target produces its ``hidden_size``. A mismatch is not caught at load time
    (vLLM 0.32 reports ready, then its worker dies at the first decode)."""
    target = hidden_size(target_config)
    key = "target_hidden_size" if isinstance(draft_config.get("target_hidden_size"), int) else "hidden_size"
    expects = draft_config.get(key)
    if target is None or not isinstance(expects, int) or expects == target:
        return None
    return (
        f"the draft expects the target's hidden size to be {expects} (its config.json {key}), the target's is {target}"
    )
