"""Secrets: which names hold one, and their values masked in everything tuitune prints or writes.

A preset may carry credentials (``env.HF_TOKEN``, ``server.args.api-key``); tuitune needs them to
launch the server, never to show them. Every output path (status, drift, preset show/diff,
captures, sweep results, log lines, error tails) goes through this module, so there is one
definition of "secret". The preset file itself, the launch command sent to the target and
``preset show --reveal`` are the only places a value appears in clear.

Names: an environment variable is secret when its name contains TOKEN, KEY, SECRET, PASSWORD,
PASSWD, PASS or CREDENTIAL (upper-cased; harmless words such as TOKENIZERS, MAX_TOKENS, BYPASS
are taken out first); a server flag when it is ``token``/``key`` or ends in ``-token``/``-key``
(``api-key``, ``hf-token``), or contains ``secret``, ``password``, ``passwd`` or ``credential``
(``max-total-tokens`` and ``speculative-token-map`` are not secrets).

Text (log lines, error messages) is masked by pattern (``--api-key X``, ``HF_TOKEN=X``,
``api_key='X'``, ``"api_key": "X"``, ``Bearer X``) and by the preset's own secret values
wherever they appear. Every pattern has bounded repetition, so the cost is linear in the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from tuitune.base.events import Malformed, ServerError
from tuitune.base.lines import clip

MASK = "••••"
_BENIGN = re.compile(r"TOKENIZERS?|TOKENS|BYPASS|PASSTHROUGH|KEYBOARD|COMPASS")
_SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|CREDENTIAL")
_SECRET_FLAG = re.compile(r"(?:\A|-)(?:token|key)\Z|secret|password|passwd|credential")
_NOT_A_VALUE = {"", "None", "null", "none", MASK}
_HINTS = ("key", "secret", "pass", "credential", "bearer")
_VALUE = r"'[^'\n]{0,512}'|\"[^\"\n]{0,512}\"|[^\s'\",;)}\]]{1,512}"
# names that may be secret (the predicates above decide): only these may match, so that a
# harmless assignment never swallows the text after it ("server_args=ServerArgs(api_key=...")
_WORD = r"(?i:token|key|secret|pass|credential)"
_TEXT = re.compile(
    # --flag VALUE / --flag=VALUE
    rf"(?<![\w-])--(?P<flag>[A-Za-z0-9-]{{0,40}}{_WORD}[A-Za-z0-9-]{{0,40}})(?P<fsep>[ =])(?P<fval>{_VALUE})"
    # NAME=VALUE and name='value' (shell, Python reprs such as SGLang's ServerArgs)
    rf"|(?<![\w-])(?P<name>[A-Za-z0-9_]{{0,40}}{_WORD}[A-Za-z0-9_]{{0,40}})=(?P<nval>{_VALUE})"
    # "name": "value" (JSON; only quoted: "#token: 5120" in a Decode line is a count, not a secret)
    rf"|\"(?P<jname>[A-Za-z0-9_-]{{0,40}}{_WORD}[A-Za-z0-9_-]{{0,40}})\": ?(?P<jval>\"[^\"\n]{{0,512}}\")"
    # Authorization: Bearer VALUE
    r"|(?P<bearer>(?i:bearer) )(?P<bval>[^\s'\",]{1,512})"
)


def secret_env(name: str) -> bool:
    return _SECRET_ENV.search(_BENIGN.sub("", name.upper())) is not None


def secret_flag(name: str) -> bool:
    return _SECRET_FLAG.search(name.lower().lstrip("-").replace("_", "-")) is not None


def secret_key(key: str) -> bool:
    """A dotted preset key (``env.HF_TOKEN``, ``server.args.api-key``, ``flag --api-key``)."""
    if key.startswith("env."):
        return secret_env(key[4:])
    if key.startswith("server.args."):
        return secret_flag(key[12:])
    if key.startswith("flag "):
        return secret_flag(key[5:])
    return False


def mask(value: Any) -> Any:
    """The masked form of a value (None stays None: "unset" is not a secret)."""
    return None if value is None else MASK


def shown(key: str, value: Any) -> Any:
    """A preset value as it may be shown: masked when the key names a secret."""
    return mask(value) if secret_key(key) else value


def pair(key: str, a: Any, b: Any) -> tuple[Any, Any, str]:
    """Two values of one key for a comparison: (a shown, b shown, note). For a secret the note
    says whether the values differ, since the masks alone cannot."""
    if not secret_key(key):
        return a, b, ""
    if a is None or b is None:
        return mask(a), mask(b), ""
    return MASK, MASK, " (values differ)" if a != b else " (same value)"


def flat(d: dict[str, Any]) -> dict[str, Any]:
    """A dotted-key mapping (``preset.flatten``) with secret values masked."""
    return {k: shown(k, v) for k, v in d.items()}


def env(e: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if secret_env(k) else v) for k, v in e.items()}


def argv(args: list[str]) -> list[str]:
    """A command line with the values of secret flags masked (``--api-key X``, ``--api-key=X``)."""
    out = list(args)
    for i, a in enumerate(out):
        if not a.startswith("--"):
            continue
        name, eq, _ = a.partition("=")
        if not secret_flag(name):
            continue
        if eq:
            out[i] = f"{name}={MASK}"
        elif i + 1 < len(out) and not out[i + 1].startswith("--"):
            out[i + 1] = MASK
    return out


def preset_dict(d: dict) -> dict:
    """A preset in dict form (``preset.to_dict``) with env and server.args secrets masked."""
    d = json.loads(json.dumps(d, default=str))
    if isinstance(d.get("env"), dict):
        d["env"] = env(d["env"])
    server = d.get("server")
    if isinstance(server, dict) and isinstance(server.get("args"), dict):
        server["args"] = {k: (mask(v) if secret_flag(k) else v) for k, v in server["args"].items()}
    return d


def has_secret(preset) -> bool:
    return any(map(secret_env, preset.env)) or any(map(secret_flag, preset.server.args))


def secret_values(preset) -> list[str]:
    """The preset's secret values, longest first (so that one value inside another is masked whole).
    Values shorter than 4 characters are left to the patterns: masking every "1" would garble text."""
    vals = [v for k, v in preset.env.items() if secret_env(k)]
    vals += [str(v) for k, v in preset.server.args.items() if secret_flag(k) and isinstance(v, str)]
    return sorted({v for v in vals if len(v) >= 4}, key=len, reverse=True)


def _quoted_mask(v: str) -> str:
    quote = v[0] if v[:1] in ("'", '"') else ""
    return f"{quote}{MASK}{quote}"


def _sub(m: re.Match) -> str:
    if m.group("flag") is not None:
        name, value, is_secret = m.group("flag"), m.group("fval"), secret_flag
        head = f"--{name}{m.group('fsep')}"
    elif m.group("name") is not None:
        name, value, is_secret = m.group("name"), m.group("nval"), secret_env
        head = f"{name}="
    elif m.group("jname") is not None:
        name, value, is_secret = m.group("jname"), m.group("jval"), secret_env
        head = m.group(0)[: -len(value)]
    else:
        return m.group("bearer") + MASK
    if not is_secret(name) or value.strip("'\"") in _NOT_A_VALUE:
        return m.group(0)
    return head + _quoted_mask(value)


def text(s: str, values: Iterable[str] = ()) -> str:
    """A line of text with secrets masked: known values anywhere, secret-looking assignments."""
    for v in values:
        if v in s:
            s = s.replace(v, MASK)
    if not _hinted(s.lower()):
        return s
    return _TEXT.sub(_sub, s)


def _hinted(low: str) -> bool:
    """Whether a lower-cased line may hold a secret assignment: the cheap test before the
    patterns, so that the lines a server prints most (which say "#token: 5120", "token usage",
    "draft_tokens=3", "(token/s)") cost a few string searches."""
    for h in _HINTS:
        if h in low:
            return True
    at = low.find("token")
    while at >= 0:
        nxt = low[at + 5 : at + 6]
        if nxt in ("=", '"', "'", "_") or nxt == " " and low[at - 1 : at] == "-":
            return True  # HF_TOKEN=, "hf_token": , hf_token=', --hf-token X
        at = low.find("token", at + 5)
    return False


class Redactor:
    """A log line as it may be shown or written: clipped to ``lines.MAX_LINE`` characters (marked
    when cut, so that no line costs more than a bounded amount downstream), then ``text`` with one
    preset's secret values. What a session and a launch apply to every line they pass on."""

    def __init__(self, preset=None):
        self.values = secret_values(preset) if preset is not None else []

    def __call__(self, s: str) -> str:
        return text(clip(s), self.values)

    def event(self, ev):
        """A parsed event with the log text it carries masked (error messages, malformed lines)."""
        if isinstance(ev, ServerError):
            return msgspec.structs.replace(ev, message=self(ev.message))
        if isinstance(ev, Malformed):
            return msgspec.structs.replace(ev, line=self(ev.line))
        return ev
