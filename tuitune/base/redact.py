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
``api_key='X'``, ``"api_key": "X"``, ``Bearer X``), by the shape of a credential wherever it
appears, under any name or none (a URL query's ``?token=X`` / ``&api_key=X`` / ``&sig=X``, a
URL's ``user:password@``, ``hf_…``, ``sk-…``, ``ghp_…``, ``github_pat_…``, ``AKIA…``, ``xox?-…``, a
JSON web token), and by the preset's own secret values wherever they appear. Every pattern has
bounded repetition, so the cost is linear in the text. Values shown under a name that is not
secret (``shown``, ``pair``, ``env``, ``argv``, ``flat``, ``preset_dict``) go through the same
text masking, so a token inside ``--model https://…?token=…`` is masked too.

What tuitune keeps on the target (the server's state file) holds no secret in clear: ``seal``
turns a secret value into a salted SHA-256 (``sealed_match`` tells whether a value is the one
sealed), so a comparison stays possible without the value.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
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
# API keys by their prefix: (prefix, the characters and length of what follows it, whose key). A
# key under any name or none is masked by its shape; a new kind of key is one row here.
KEY_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("hf_", r"[A-Za-z0-9]{20,256}(?![A-Za-z0-9])", "Hugging Face"),
    ("sk-", r"[A-Za-z0-9_-]{20,256}", "OpenAI, Anthropic (sk-proj-…, sk-ant-…)"),
    ("ghp_", r"[A-Za-z0-9]{30,255}", "GitHub"),
    ("gho_", r"[A-Za-z0-9]{30,255}", "GitHub"),
    ("ghu_", r"[A-Za-z0-9]{30,255}", "GitHub"),
    ("ghs_", r"[A-Za-z0-9]{30,255}", "GitHub"),
    ("ghr_", r"[A-Za-z0-9]{30,255}", "GitHub"),
    ("github_pat_", r"[A-Za-z0-9_]{30,255}", "GitHub"),
    ("glpat-", r"[A-Za-z0-9_-]{20,255}", "GitLab"),
    ("nvapi-", r"[A-Za-z0-9_-]{20,255}", "NVIDIA"),
    ("AIza", r"[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", "Google"),
    ("sk_live_", r"[0-9A-Za-z]{16,255}", "Stripe"),
    ("rk_live_", r"[0-9A-Za-z]{16,255}", "Stripe"),
    ("gsk_", r"[A-Za-z0-9]{20,255}", "Groq"),
    ("r8_", r"[A-Za-z0-9]{20,255}", "Replicate"),
    ("pplx-", r"[A-Za-z0-9]{20,255}", "Perplexity"),
    ("xoxa-", r"[A-Za-z0-9-]{10,250}", "Slack"),
    ("xoxb-", r"[A-Za-z0-9-]{10,250}", "Slack"),
    ("xoxp-", r"[A-Za-z0-9-]{10,250}", "Slack"),
    ("xoxr-", r"[A-Za-z0-9-]{10,250}", "Slack"),
    ("xoxs-", r"[A-Za-z0-9-]{10,250}", "Slack"),
)
_PREFIX_HINTS = tuple(sorted({prefix.lower() for prefix, _, _ in KEY_PREFIXES}))
_SHAPES = (
    "|".join(rf"(?<![A-Za-z0-9_-]){re.escape(prefix)}{rest}" for prefix, rest, _ in KEY_PREFIXES)
    + r"|(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])"  # AWS access key id
    r"|(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,2048}\.eyJ[A-Za-z0-9_-]{8,2048}\.[A-Za-z0-9_-]{0,2048}"  # a JWT
)
# URL query parameters that carry a credential whatever the rest of the name (besides _WORD's)
_QUERY_SECRET = {
    "sig", "signature", "auth", "authorization", "x-amz-signature", "x-amz-credential", "x-goog-signature",
    "x-goog-credential", "pwd", "pw", "psw", "session", "sessionid", "session_id", "jwt", "otp", "code", "client_secret",
}  # fmt: skip
_TEXT = re.compile(
    # ?name=VALUE / &name=VALUE in a URL (before NAME=VALUE: a query value ends at & or #)
    r"(?<=[?&])(?P<qname>[A-Za-z0-9_.-]{1,40})=(?P<qval>[^\s&#'\"<>]{1,1024})"
    # --flag VALUE / --flag=VALUE
    rf"|(?<![\w-])--(?P<flag>[A-Za-z0-9-]{{0,40}}{_WORD}[A-Za-z0-9-]{{0,40}})(?P<fsep>[ =])(?P<fval>{_VALUE})"
    # NAME=VALUE and name='value' (shell, Python reprs such as SGLang's ServerArgs)
    rf"|(?<![\w-])(?P<name>[A-Za-z0-9_]{{0,40}}{_WORD}[A-Za-z0-9_]{{0,40}})=(?P<nval>{_VALUE})"
    # "name": "value" (JSON; only quoted: "#token: 5120" in a Decode line is a count, not a secret)
    rf"|\"(?P<jname>[A-Za-z0-9_-]{{0,40}}{_WORD}[A-Za-z0-9_-]{{0,40}})\": ?(?P<jval>\"[^\"\n]{{0,512}}\")"
    # Authorization: Bearer VALUE
    r"|(?P<bearer>(?i:bearer) )(?P<bval>[^\s'\",]{1,512})"
    # Authorization: Basic VALUE / token VALUE
    r"|(?P<auth>(?i:authorization)[\"']?: ?[\"']?(?i:basic|token) )(?P<aval>[^\s'\",]{1,512})"
    # a URL's user:password@ in any scheme, the user empty (redis://:password@host) or not, the
    # password with slashes (an S3 secret key: s3://KEYID:abc/def+ghi@bucket)
    r"|(?P<userinfo>://[^/\s:@'\"]{0,128}:)(?P<uval>[^\s@'\"]{1,256})(?=@)"
    # credentials recognisable by their shape alone, under any name or none
    rf"|(?P<shape>{_SHAPES})"
)


def secret_env(name: str) -> bool:
    return _SECRET_ENV.search(_BENIGN.sub("", name.upper())) is not None


def secret_flag(name: str) -> bool:
    return _SECRET_FLAG.search(name.lower().lstrip("-").replace("_", "-")) is not None


def secret_query(name: str) -> bool:
    """A URL query parameter that carries a credential (``token``, ``api_key``, ``sig``…)."""
    return secret_env(name.replace("-", "_")) or name.lower() in _QUERY_SECRET


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


def scrub(value: Any) -> Any:
    """Any value as it may be shown whatever its name: strings through ``text`` (credential
    shapes and secret assignments inside them masked), lists and dicts walked."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list | tuple):
        return type(value)(scrub(v) for v in value)
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    return value


def shown(key: str, value: Any) -> Any:
    """A preset value as it may be shown: masked when the key names a secret, else with any
    credential inside it masked."""
    return mask(value) if secret_key(key) else scrub(value)


def pair(key: str, a: Any, b: Any) -> tuple[Any, Any, str]:
    """Two values of one key for a comparison: (a shown, b shown, note). When the masks alone
    cannot tell (a secret, or two values that differ only in a credential inside them), the note
    says whether the values differ."""
    if not secret_key(key):
        sa, sb = scrub(a), scrub(b)
        hidden = (sa != a or sb != b) and a is not None and b is not None
        return sa, sb, (" (values differ)" if a != b else " (same value)") if hidden and sa == sb else ""
    if a is None or b is None:
        return mask(a), mask(b), ""
    return MASK, MASK, " (values differ)" if a != b else " (same value)"


def flat(d: dict[str, Any]) -> dict[str, Any]:
    """A dotted-key mapping (``preset.flatten``) with secret values masked."""
    return {k: shown(k, v) for k, v in d.items()}


def env(e: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if secret_env(k) else scrub(v)) for k, v in e.items()}


def argv(args: list[str]) -> list[str]:
    """A command line with the values of secret flags masked (``--api-key X``, ``--api-key=X``),
    and any credential inside another argument (a URL with ``?token=…``, an ``hf_…``)."""
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
    return [scrub(a) for a in out]


def preset_dict(d: dict) -> dict:
    """A preset in dict form (``preset.to_dict``) with env and server.args secrets masked, and any
    credential inside another value."""
    d = json.loads(json.dumps(d, default=str))
    if isinstance(d.get("env"), dict):
        d["env"] = env(d["env"])
    server = d.get("server")
    if isinstance(server, dict) and isinstance(server.get("args"), dict):
        server["args"] = {k: (mask(v) if secret_flag(k) else v) for k, v in server["args"].items()}
    return scrub(d)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def _preset_strings(preset) -> Iterable[str]:
    """Every string of a preset that may reach the target: env and server values."""
    yield from _strings(dict(preset.env))
    yield from _strings(dict(preset.server.args))
    yield from (str(v) for v in (preset.server.log, preset.server.workdir) if v)


def has_secret(preset) -> bool:
    return (
        any(map(secret_env, preset.env))
        or any(map(secret_flag, preset.server.args))
        or any(found(s) for s in _preset_strings(preset))
    )


def secret_values(preset) -> list[str]:
    """The preset's secret values, longest first (so that one value inside another is masked whole):
    those under a secret name, and credentials found inside any other value (the token of a URL
    argument, which the server may print on its own). Values shorter than 4 characters are left
    to the patterns: masking every "1" would garble text."""
    vals = [v for k, v in preset.env.items() if secret_env(k)]
    vals += [str(v) for k, v in preset.server.args.items() if secret_flag(k) and isinstance(v, str)]
    for s in _preset_strings(preset):
        vals += found(s)
    return sorted({v for v in vals if len(v) >= 4}, key=len, reverse=True)


def seal(value: str) -> str:
    """A secret value as tuitune may keep it on the target: ``sha256:<salt>:<digest>``."""
    salt = secrets.token_hex(8)
    return f"sha256:{salt}:{hashlib.sha256((salt + value).encode()).hexdigest()}"


def sealed_match(sealed: str, value: str) -> bool:
    """Whether ``value`` is the value ``seal`` turned into ``sealed`` (a sealed value compares
    to the clear one it was made from; anything else compares as text)."""
    kind, _, rest = sealed.partition(":")
    salt, _, digest = rest.partition(":")
    if kind != "sha256" or not digest:
        return sealed == value
    return secrets.compare_digest(hashlib.sha256((salt + value).encode()).hexdigest(), digest)


def sealed_env(e: dict[str, str]) -> dict[str, str]:
    """Environment as kept on the target: a secret's value (by name or by shape) sealed."""
    return {k: seal(v) if secret_env(k) or found(v) else v for k, v in e.items()}


def sealed_argv(args: list[str]) -> list[str]:
    """A command line as kept on the target: secret flags' values and arguments that hold a
    credential sealed (the flag names stay, so the shape of the command line is still there)."""
    out = list(args)
    for i, a in enumerate(out):
        name, eq, value = a.partition("=")
        if a.startswith("--") and secret_flag(name):
            if eq:
                out[i] = f"{name}={seal(value)}"
            elif i + 1 < len(out) and not out[i + 1].startswith("--"):
                out[i + 1] = seal(out[i + 1])
        elif found(a) and not a.startswith("sha256:"):
            out[i] = seal(a)
    return out


def _quoted_mask(v: str) -> str:
    quote = v[0] if v[:1] in ("'", '"') else ""
    return f"{quote}{MASK}{quote}"


def _secret_in(m: re.Match) -> tuple[str, str | None]:
    """(head kept, the secret value) of one match of ``_TEXT``; value None when it holds none."""
    if m.group("qname") is not None:
        name, value, is_secret = m.group("qname"), m.group("qval"), secret_query
        head = f"{name}="
    elif m.group("flag") is not None:
        name, value, is_secret = m.group("flag"), m.group("fval"), secret_flag
        head = f"--{name}{m.group('fsep')}"
    elif m.group("name") is not None:
        name, value, is_secret = m.group("name"), m.group("nval"), secret_env
        head = f"{name}="
    elif m.group("jname") is not None:
        name, value, is_secret = m.group("jname"), m.group("jval"), secret_env
        head = m.group(0)[: -len(value)]
    elif m.group("bearer") is not None:
        return m.group("bearer"), m.group("bval")
    elif m.group("auth") is not None:
        return m.group("auth"), m.group("aval")
    elif m.group("userinfo") is not None:
        return m.group("userinfo"), m.group("uval")
    else:
        return "", m.group("shape")
    if not is_secret(name) or value.strip("'\"") in _NOT_A_VALUE:
        return m.group(0), None
    return head, value


def _sub(m: re.Match) -> str:
    head, value = _secret_in(m)
    return head if value is None else head + _quoted_mask(value)


def found(s: str) -> list[str]:
    """The secret values the patterns find in ``s`` (unquoted), in order: the operator's own
    patterns' first."""
    own = user_patterns()
    out = [m.group(m.lastindex or 0) for m in own.finditer(s)] if own is not None else []
    if not _hinted(s.lower()):
        return out
    for m in _TEXT.finditer(s):
        value = _secret_in(m)[1]
        if value is not None:
            out.append(value.strip("'\""))
    return out


def text(s: str, values: Iterable[str] = ()) -> str:
    """A line of text with secrets masked: known values anywhere, the operator's own patterns,
    secret-looking assignments, credential shapes."""
    for v in values:
        if v in s:
            s = s.replace(v, MASK)
    own = user_patterns()
    if own is not None:
        s = own.sub(_own_sub, s)
    if not _hinted(s.lower()):
        return s
    return _TEXT.sub(_sub, s)


# ---- the operator's own patterns -----------------------------------------------------------------

PATTERNS_FILE = "secret-patterns"  # in tuitune's configuration folder: ~/.config/tuitune/secret-patterns


def patterns_path():
    """Where the operator's own patterns are read from (``$XDG_CONFIG_HOME/tuitune/secret-patterns``,
    else ``~/.config/tuitune/secret-patterns``); ``TUITUNE_SECRET_PATTERNS`` names another file."""
    import os
    from pathlib import Path

    named = os.environ.get("TUITUNE_SECRET_PATTERNS")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuitune" / PATTERNS_FILE


_OWN: dict[str, Any] = {}


def user_patterns() -> re.Pattern | None:
    """The operator's own secret patterns as one regular expression (None without any): one Python
    regular expression a line of ``patterns_path()``, ``#`` comments and blank lines left out. What
    a pattern matches is masked (its last group, when it has groups: ``token-for-db=(\\S+)`` keeps
    the name). A pattern that does not compile is left out with a warning naming its line. Read once
    a process (``reload_user_patterns`` reads again)."""
    if "re" not in _OWN:
        _OWN["re"] = _read_patterns()
    return _OWN["re"]


def reload_user_patterns() -> None:
    _OWN.clear()


def _read_patterns() -> re.Pattern | None:
    import sys

    path = patterns_path()
    try:
        text_ = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = []
    for n, line in enumerate(text_.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            re.compile(line)
        except re.error as e:
            print(f"tuitune: warning: {path} line {n}: not a regular expression ({e}); left out", file=sys.stderr)
            continue
        parts.append(f"(?:{line})")
    return re.compile("|".join(parts)) if parts else None


def _own_sub(m: re.Match) -> str:
    if not m.lastindex:
        return MASK
    start, end = m.span(m.lastindex)
    return m.group(0)[: start - m.start()] + MASK + m.group(0)[end - m.start() :]


def _hinted(low: str) -> bool:
    """Whether a lower-cased line may hold a secret: the cheap test before the patterns, so that
    the lines a server prints most (which say "#token: 5120", "token usage", "draft_tokens=3",
    "(token/s)") cost a few string searches."""
    for h in _HINTS:
        if h in low:
            return True
    # credential shapes, gated by the character each needs (most stats lines have no "_" or "-")
    if ("_" in low or "-" in low or "aiza" in low) and any(h in low for h in _PREFIX_HINTS):
        return True
    if "akia" in low or "asia" in low or "eyj" in low:
        return True
    if "auth" in low or "=" in low and ("?" in low or "&" in low):
        return True  # Authorization: Basic …, a URL's query (?sig=…, &pwd=…)
    if "://" in low and "@" in low:
        return True  # https://user:password@host
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
