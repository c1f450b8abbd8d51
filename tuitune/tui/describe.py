"""Whether a preset's description still matches its settings: the save dialog's warning (a changed
setting whose old value the description mentions) and its ctrl+r (the mentions put right)."""

from __future__ import annotations

import re

from tuitune import preset as P

# a number as a word: not a digit inside a name ("EAGLE-3", "H200", "Kimi-K2.5"), nor the start of "3.5"
NUMBER = re.compile(r"(?<![\w.])(?<!\w-)\d+(?:\.\d+)?(?!\w|\.\d)")


def mentions(description: str, value) -> bool:
    """Whether ``description`` mentions ``value``: a number as a number (2 matches "2 steps" and
    "2.0", not "EAGLE-3"), anything else as a whole word."""
    if value is None or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return bool(re.search(rf"(?<![\w.-]){re.escape(str(value))}(?![\w-])", description))
    return any(float(m) == number for m in NUMBER.findall(description))


def key_words(key: str) -> list[str]:
    """The words a description names a setting by, plural "s" off: "draft", "token" for
    speculative.num_draft_tokens."""
    return [w.rstrip("s") for w in re.split(r"[._-]", key.rsplit(".", 1)[-1].lower()) if len(w) >= 3 and w != "num"]


def mentions_as(description: str, value, key: str) -> bool:
    """``value`` written next to a word of ``key`` ("3 draft tokens" for speculative.num_draft_tokens)."""
    words = key_words(key)
    tokens = re.findall(r"[\w.]+", description.lower())
    for i, tok in enumerate(tokens):
        if mentions(tok, value):
            near = tokens[max(0, i - 2) : i] + tokens[i + 1 : i + 3]
            if any(t.startswith(w) for t in near for w in words):
                return True
    return False


def _spans(description: str, value) -> list[tuple[int, int]]:
    """Where ``description`` mentions ``value`` (as ``mentions`` reads it)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        pattern = re.compile(rf"(?<![\w.-]){re.escape(str(value))}(?![\w-])")
        return [m.span() for m in pattern.finditer(description)]
    return [m.span() for m in NUMBER.finditer(description) if float(m.group()) == number]


def rewrite_description(loaded: P.Preset | None, draft: P.Preset, description: str) -> str | None:
    """The description with each changed value it mentions put right (the save dialog's ctrl+r):
    the mention beside a word of the key ("4 steps" for num_steps), else the only mention; None when
    there is nothing to fix, or a mention cannot be placed surely (twice, none beside the key) or put
    right (the setting was unset, or is on/off)."""
    if not description or loaded is None:
        return None
    out, changed = description, False
    derived = P.derived_keys(draft)
    for key, old, new in P.diff(loaded, draft):
        if not (mentions_as(out, old, key) if key in derived else mentions(out, old)):
            continue
        if new is None or isinstance(new, bool):
            return None
        words = key_words(key)
        spans = _spans(out, old)
        near = [(a, b) for a, b in spans if any(w in out[max(0, a - 16) : b + 16].lower() for w in words)]
        pick = near if len(near) == 1 else spans if len(spans) == 1 and key not in derived else []
        if not pick:
            return None
        a, b = pick[0]
        out, changed = out[:a] + str(new) + out[b:], True
    return out if changed else None


def stale_description(loaded: P.Preset | None, draft: P.Preset, description: str | None = None) -> str:
    """Why the description may no longer match: a changed setting whose old value it mentions (a
    value derived from another setting only where it is named: "3 draft tokens", not the 3 of a
    "3 steps" that is already right)."""
    desc = draft.description or "" if description is None else description
    if not desc or loaded is None:
        return ""
    derived = P.derived_keys(draft)
    for key, old, new in P.diff(loaded, draft):
        if mentions_as(desc, old, key) if key in derived else mentions(desc, old):
            return f"the description mentions {old}, but {key} is now {'(unset)' if new is None else new}: update it?"
    return ""
