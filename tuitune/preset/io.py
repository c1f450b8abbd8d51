"""Reading and writing preset files: strict YAML (duplicate keys are errors), one-sentence errors,
atomic saves that write only what differs from defaults, in a stable key order."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tuitune.preset.model import Preset, PresetError


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


_UNION_MEMBERS = ("bool", "int", "float", "str")  # pydantic names the member of ArgValue that failed


def _yaml_type(v: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "text",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds, also inside ``| None`` and lists (``target.nodes``)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for t in typing.get_args(annotation):
        if (m := _model_in(t)) is not None:
            return m
    return None


def near_key(loc: tuple | list) -> str | None:
    """The key of that section closest to the unknown last one of ``loc`` (``speculative.num_step``
    -> ``num_steps``), when one is close enough to be a typo; list indices are skipped."""
    import difflib

    node: type[BaseModel] | None = Preset
    for part in loc[:-1]:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            continue
        field = node.model_fields.get(part) if node is not None else None
        if field is None:
            return None
        node = _model_in(field.annotation)
    if node is None:
        return None
    close = difflib.get_close_matches(str(loc[-1]), list(node.model_fields), n=1, cutoff=0.75)
    return close[0] if close else None


def _format_error(source: str, err: ValidationError) -> str:
    e = err.errors()[0]
    parts = e["loc"]
    if len(parts) == 4 and parts[:2] == ("server", "args") and parts[3] in _UNION_MEMBERS:
        # a flag value that is none of bool | int | float | str: say so, not "should be a valid boolean"
        return (
            f"{source}: server.args.{parts[2]}: expected true/false, a number or text, not {_yaml_type(e.get('input'))}"
        )
    loc = _loc(parts)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] in ("model_type", "dict_type"):
        return f"{source}: {loc}: expected a mapping (a YAML section of keys), not {_yaml_type(e.get('input'))}"
    if e["type"] == "extra_forbidden":
        near = near_key(parts)
        hint = f"; did you mean {near}?" if near else ""
        return f"{source}: {loc}: unknown key{hint} (allowed keys are listed by `tuitune preset schema`)"
    if e["type"] == "missing":
        return f"{source}: {loc}: required key is missing"
    if loc == "env" and ": " in msg:
        key, msg = msg.split(": ", 1)
        loc = f"env.{key}"
    inp = e.get("input")
    shown = "" if isinstance(inp, (dict, list)) or "is not" in msg or "holds" in msg else f"{inp!r}: "
    return f"{source}: {loc + ': ' if loc else ''}{shown}{msg}"


def from_dict(data: Any, source: str = "<preset>") -> Preset:
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a preset is a YAML mapping (got {type(data).__name__})")
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        raise PresetError(_format_error(source, e)) from None
    except RecursionError:
        raise PresetError(f"{source}: nested too deeply to be a preset") from None


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} appears twice (lines {first} and {second}); keep one")


class _StrictLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the
    last one silently: a preset that sets a variable twice would run with the second value)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: construct_mapping says so below
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


def loads(text: str, source: str = "<preset>") -> Preset:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as e:
        raise PresetError(f"{source}: {e}") from None
    except RecursionError:
        raise PresetError(f"{source}: YAML nested too deeply to be a preset") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PresetError(f"{source}: YAML syntax error{where}: {problem}") from None
    return from_dict(data, source)


def load(path: str | Path) -> Preset:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetError(f"{path}: no such preset file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"{path}: cannot read it ({e.__class__.__name__}: {e})") from None
    return loads(text, str(path))


def to_dict(preset: Preset) -> dict:
    """Minimal form: defaults left out, ``target: local`` shorthand, field order kept."""
    d = preset.model_dump(exclude_defaults=True, exclude_none=True)
    if preset.target.is_local and set(d.get("target", {})) <= {"host"}:
        d["target"] = "local"
    engine = preset.engine
    for key, default in (("module", engine.default_module), ("port", engine.default_port)):
        if d["server"].get(key) == default:  # the engine's default (SGLang's are the fields' own)
            d["server"].pop(key)
    if d.get("bench", {}).get("api") == engine.default_bench_api():
        d["bench"].pop("api")
        if not d["bench"]:
            d.pop("bench")
    if "env" in d:  # numbers read back as numbers: 16777216, not '16777216'
        d["env"] = {k: int(v) if re.fullmatch(r"-?[1-9]\d*|0", v) else v for k, v in d["env"].items()}
    order = ["name", "description", "target", "server", "speculative", "env", "profile", "bench", "telemetry"]
    return {k: d[k] for k in order if k in d}


def dumps(preset: Preset) -> str:
    return yaml.safe_dump(to_dict(preset), sort_keys=False, allow_unicode=True, width=100)


def save(preset: Preset, path: str | Path) -> Path:
    """Write atomically; a preset that holds a secret (a token, a key) is mode 0600."""
    from tuitune.base.redact import has_secret

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    secret = has_secret(preset)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o666)
    if secret:
        os.fchmod(fd, 0o600)  # a .tmp left by an interrupted save may be older and wider
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(dumps(preset))
    os.replace(tmp, path)
    return path
