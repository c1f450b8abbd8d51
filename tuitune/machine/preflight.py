"""The preflight: what refuses a relaunch that cannot work, before anything running is touched.

The server's python and module, the modules its options need, the model and draft paths, the
draft's fit, the schedule file, the flags (the engine's own ``--help``, cached on the target), the
probe, and the port (busy with a server tuitune did not start)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from importlib import resources

from tuitune import preset as P
from tuitune.engines.base import draft_misfit
from tuitune.machine.errors import ControlError, refuse_not_ours
from tuitune.machine.host import Host, script
from tuitune.machine.record import ServerRecord, hand_started

_SCRIPTS = resources.files("tuitune.machine.remote")
# exit 0: the module is there; 3: not installed; 5: its package fails to import (remote/find_module.py)
FIND_MODULE_PY = _SCRIPTS.joinpath("find_module.py").read_text()
HELP_KEY_PY = _SCRIPTS.joinpath("help_key.py").read_text()  # the key of a cached flag listing
HELP_CACHE_SH = script("help_cache.sh")  # the listing, from the cache or the engine

# a Hugging Face repo id as huggingface_hub validates one: ``name`` or ``org/name``, letters, digits,
# "-", "_", "." (no "--" or ".."; neither end "-" or "."), 96 characters at most
_HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9_](?:[\w.-]{0,94}[\w])?(?:/[A-Za-z0-9_](?:[\w.-]{0,94}[\w])?)?")


def _hub_shaped(v: str) -> bool:
    """A model reference the engine may fetch from the Hub (``name`` or ``org/name``, a valid id),
    not only read from disk: ``/…``, ``~/…``, ``./…`` and deeper paths are paths; anything that
    huggingface_hub would reject as an id is one too, once it is not a directory."""
    return _HUB_ID.fullmatch(v) is not None and v not in (".", "..")


def _not_a_model(v: str) -> str | None:
    """Why a model value cannot name a model at all (checked before asking the target), or None."""
    if not v.strip():
        return "is empty: give the model's directory on the target, or a Hugging Face id (org/name)"
    if v.startswith("-"):
        return "looks like a flag, not a model's directory or id"
    if v != v.strip():
        return "starts or ends with white space"
    return None


class Preflight:
    """The checks of one preset's server on its host; what they found worth saying goes to the
    host's ``warnings``, every wait is cut to the host's deadline."""

    def __init__(self, host: Host):
        self.host = host
        self._help_flags: set[str] | None = None
        self.help_cached: bool | None = None  # the flag listing came from the target's cache (None: not listed)
        self._python_ok: str | None = None  # the server.python the last check_python accepted

    async def server_flags(self) -> set[str]:
        """The flags the server's own ``--help`` lists, asked once per (python, engine release,
        environment): the listing is cached on the target (HELP_KEY_PY, HELP_CACHE_SH), so that a
        relaunch skips vLLM's 15-30 s ``serve --help=all``."""
        h, p = self.host, self.host.preset
        if self._help_flags is None:
            py = P.shell_path(p.python())
            helps = " ".join(shlex.quote(a) for a in p.help_args())
            envh = hashlib.sha256(json.dumps(sorted(p.env.items())).encode()).hexdigest()[:16]
            args = f"{py} {shlex.quote(HELP_KEY_PY)} {shlex.quote(p.server.module)} {envh} {helps}"
            r = await h.t.run(h.as_server(f"sh -c {shlex.quote(HELP_CACHE_SH)} sh {args}"), timeout=h.limit(180))
            self.help_cached = r.ok and "tuitune: flags cached" in r.stderr
            if not r.ok:
                raise ControlError(
                    f"{h.t.label}: `{p.python()} -m {p.server.module} "
                    f"{helps}` failed (exit {r.exit_status}): "
                    f"{(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']}"[:400]
                )
            self._help_flags = set(re.findall(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)", r.stdout))
        return self._help_flags

    async def install_probe(self) -> dict:
        """Upload the probe to the target and check, from SGLang's source, what it can patch."""
        from tuitune import probe

        h, p = self.host, self.host.preset
        for name, data in probe.files().items():
            await h.t.upload(data, f"{probe.REMOTE_DIR}/{name}")
        r = await h.t.run(
            h.as_server(
                f"{P.shell_path(p.python())} {P.shell_path(probe.REMOTE_DIR + '/eagle3_probe.py')} "
                "--check " + " ".join(p.engine.probe_check_args())
            ),
            timeout=h.limit(60),
        )
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"ok": False, "error": (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_status}"}

    async def check_python(self) -> None:
        """The preflight's first question, asked before anything that needs the server's python
        (the lock helper runs with it): does it run, and does it have the server's module?"""
        h, p = self.host, self.host.preset
        py = P.shell_path(p.python())
        r = await h.t.run(
            f"command -v -- {py} >/dev/null || [ -x {py} ] || exit 4; "
            + h.as_server(f"{py} -c {shlex.quote(FIND_MODULE_PY)} {shlex.quote(p.server.module)}"),
            timeout=h.limit(60),
        )
        if r.exit_status == 4:
            raise ControlError(f"{h.t.label}: server.python {p.python()} does not exist", 2)
        if r.exit_status == 6:
            raise ControlError(f"{h.t.label}: server.workdir {p.server.workdir} does not exist", 2)
        if r.exit_status == 3:
            raise ControlError(f"{h.t.label}: module {p.server.module} is not installed for {p.python()}", 2)
        if r.exit_status == 5:
            why = (r.stderr.strip().splitlines() or ["no message"])[-1][:200]
            raise ControlError(f"{h.t.label}: module {p.server.module} cannot be imported with {p.python()} ({why})", 2)
        if not r.ok:
            raise ControlError(f"{h.t.label}: cannot run {p.python()}: {r.stderr.strip()[:200]}", 2)
        self._python_ok = p.python()

    async def run(self, replacing: ServerRecord | None) -> None:
        """Refuse a relaunch that cannot work, before anything running is touched."""
        h, p = self.host, self.host.preset
        if why := P.carry_problem(p):  # (a preset is checked as it is read; one built in code may not be)
            raise ControlError(f"{p.name}: {why}", 2)
        if self._python_ok != p.python():
            await self.check_python()
        py = P.shell_path(p.python())
        await self.check_paths()
        for module, why in p.engine.required_modules(p) if p.server.module != P.SIM_MODULE else []:
            r = await h.t.run(
                h.as_server(f"{py} -c {shlex.quote(FIND_MODULE_PY)} {shlex.quote(module)}"), timeout=h.limit(60)
            )
            if r.exit_status != 0:
                raise ControlError(f"{h.t.label}: {why} needs the {module} module, not installed for {p.python()}", 2)
        await self._check_draft_fits()
        await self._check_schedule()
        known = await self.server_flags()
        unknown = [f for f in p.flag_names() if f not in known]
        if unknown:
            raise ControlError(
                f"flag {unknown[0]} is not accepted by {p.server.module} on {h.t.label} "
                f"(not in its --help); refusing to relaunch",
                2,
            )
        if p.uses_probe:
            report = await self.install_probe()
            if not report.get("ok"):
                why = report.get("error") or (
                    f"{p.engine.label} {report.get('version') or '?'} lacks "
                    f"{', '.join(report.get('missing') or ['a phase'])}"
                )
                h.warnings.append(
                    f"profile: the probe cannot time every phase here ({why}); "
                    "the server will log its own decode lines only"
                )
        if await h.port_busy():
            ours = replacing is not None and replacing.port == p.server.port and await h.alive(replacing.pid)
            if not ours:
                hand = await hand_started(h)
                raise ControlError(refuse_not_ours(p, h.t.label, hand.pid if hand else None), 2)

    def model_paths(self) -> list[tuple[str, str]]:
        """(preset key, value) of the model and draft the server loads: a directory on the target
        (relative to server.workdir, else the home directory, as the launch runs), or a Hugging Face
        id the engine fetches. None for the simulator, which loads no weights."""
        p = self.host.preset
        if p.server.module == P.SIM_MODULE:
            return []
        out = [(f"server.args.{k}", v) for k in ("model-path", "model") if isinstance(v := p.server.args.get(k), str)]
        draft = p.speculative.draft_model_path if p.speculative else None
        if draft is not None:
            out.append(("speculative.draft_model_path", draft))
        return out

    async def check_paths(self) -> None:
        """Refuse a model or draft the engine cannot load, before it spends its start-up on it: an
        empty value or one that reads as a flag; a path (``/…``, ``~/…``, ``./…``, more slashes
        than an id) that is not on the target, or is a plain file (a .gguf excepted); and a value
        shaped like a Hugging Face id (``name``, ``org/name``) that is no directory there, is not
        in the Hub cache, and cannot be fetched (the Hub does not answer from the target)."""
        h = self.host
        paths = self.model_paths()
        for key, v in paths:
            if why := _not_a_model(v):
                raise ControlError(f"{key} {v!r} {why}; refusing to launch", 2)
        if not paths:
            return
        specs = [("H:" if _hub_shaped(v) else "") + v for _, v in paths]
        home = f"cd -- {P.shell_path(h.preset.server.workdir or '~')} 2>/dev/null; "
        r = await h.t.run(home + h.as_server(h.remote("models", *specs)), timeout=h.limit(60))
        try:
            seen = json.loads(r.stdout.strip().splitlines()[-1])
            kinds, hub = seen["paths"], seen["hub"]
        except (ValueError, IndexError, KeyError, TypeError):
            h.warnings.append(f"the model paths were not checked ({(r.stderr or r.stdout).strip()[-200:]})")
            return
        where = h.preset.server.workdir or "the home directory"
        fetched = []  # what the engine would fetch from the Hub: said after what is wrong on disk
        for (key, v), got in zip(paths, kinds, strict=False):
            if got["kind"] == "file" and not v.endswith(".gguf"):
                raise ControlError(
                    f"{key} {v} is a file on {h.t.label}, not a directory: give the directory that "
                    f"holds the model's config.json; refusing to launch",
                    2,
                )
            if got["kind"] != "none" or got["cached"]:
                continue
            if not _hub_shaped(v):
                raise ControlError(
                    f"{key} {v} does not exist on {h.t.label}: give the local directory the "
                    f"server loads (a Hugging Face id is written org/name); refusing to launch",
                    2,
                )
            fetched.append((key, v))
        if fetched and hub != "ok":
            key, v = fetched[0]
            raise ControlError(
                f"{key} {v} is not a directory under {where} on {h.t.label}, and as a Hugging "
                f"Face id it is not in the Hub cache and cannot be fetched: the Hub is unreachable "
                f"from {h.t.label} ({hub}); give the model's directory; refusing to launch",
                2,
            )

    async def _check_draft_fits(self) -> None:
        """An EAGLE / EAGLE-3 draft whose hidden size is not the target's, both local directories
        on the target: refused with both sizes (unreadable configs, hub ids: not checked here)."""
        h, p = self.host, self.host.preset
        s = p.speculative
        model = p.engine.model_path(p)
        if s is None or s.algorithm not in ("EAGLE", "EAGLE3") or not s.draft_model_path or not model:
            return
        configs: list[dict] = []
        for d in (model, s.draft_model_path):
            r = await h.t.run(f"cat -- {P.shell_path(d.rstrip('/') + '/config.json')}", timeout=30)
            try:
                c = json.loads(r.stdout) if r.ok else None
            except ValueError:
                c = None
            if not isinstance(c, dict):
                return
            configs.append(c)
        why = draft_misfit(configs[0], configs[1])
        if why:
            raise ControlError(
                f"speculative.draft_model_path {s.draft_model_path} does not fit the model {model} on "
                f"{h.t.label}: {why}; refusing to relaunch",
                2,
            )

    async def _check_schedule(self) -> None:
        """A schedule file the server reads at start-up (SGLang's adaptive config): missing, unreadable
        or at odds with the preset, refused before launching (the engine would refuse it only after
        loading the model)."""
        h, p = self.host, self.host.preset
        path = p.engine.schedule_file(p)
        if not path:
            return
        where = f"cd -- {P.shell_path(p.server.workdir or '~')} 2>/dev/null; "
        r = await h.t.run(where + f"head -c 1048576 -- {P.shell_path(path)}", timeout=30)
        if not r.ok and p.server.module == P.SIM_MODULE:
            return  # the simulator plays without a file it cannot read; one it can read is checked
        if not r.ok:
            raise ControlError(
                f"speculative.adaptive_config {path} cannot be read on {h.t.label}: "
                f"{(r.stderr or '').strip()[:200] or 'no such file'}; refusing to launch",
                2,
            )
        why = p.engine.check_schedule(p, r.stdout)
        if why:
            raise ControlError(f"speculative.adaptive_config {path} on {h.t.label}: {why}; refusing to launch", 2)
