"""The engine check: every rendered command parsed by the engine's own parser before anything starts.

Each SGLang and vLLM role's arguments go to that engine's real argument parser, run by the Python
the role will run (the launcher's interpreter, or the engine's program on PATH followed through its
shebang): one process per interpreter and engine (parser_runner.py) parses all its roles. Routers
(sglang-router, smg, vllm-router) are checked against the option list their own `--help` prints,
cached per installed program. A rejected command is an error naming the role, the engine's own
message and the line of the file that gave the argument; a flag the installed release lacks is
reported with the release that has it.

start() launches the parser processes at once and returns; result() collects them, so `up` runs
its other preflight work while the engines import (the slow part, ~2 s each on a quiet machine).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..engines import ENGINES, ROUTER_ENGINES, WORKER_ENGINES, router
from ..engines.argv import has_flag, last_value
from ..host.versions import Installed, installed, older, resolve_program
from ..plan.spec import LaunchSpec, Plan
from ..topology.load import LoadedTopology, Path_
from ..topology.model import Topology
from .findings import Finding, Severity, error, warning

RUNNER = Path(__file__).with_name("parser_runner.py")
ENGINE_MODULES = {name: ENGINES[name] for name in WORKER_ENGINES}
ROUTERS = ROUTER_ENGINES
RUNNER_TIMEOUT = 120.0  # a cold import of vLLM on a loaded 2-core machine takes ~15 s
HELP_TIMEOUT = 30.0
# Flags the renderers write from keys other than KEY_FLAGS' (the key a finding points at).
_sg, _vl, _rt = ENGINES["sglang"], ENGINES["vllm"], router
RENDERED_FROM = {
    _sg.ENCODER_ONLY: ("kind",), _sg.DISAGGREGATION_MODE: ("kind",), _sg.LANGUAGE_ONLY: ("encoders",),
    _vl.KV_TRANSFER_CONFIG: ("kv_transfer_config", "transfer_backend"),
    _sg.NNODES: ("nodes",), _sg.NODE_RANK: ("nodes",), _sg.DIST_INIT_ADDR: ("nodes", "dist_init_port"),
    _vl.MASTER_ADDR: ("nodes",), _vl.MASTER_PORT: ("dist_init_port", "nodes"),
    _vl.DP_SIZE_LOCAL: ("dp", "nodes"), _vl.DP_ADDRESS: ("nodes",), _vl.DP_RPC_PORT: ("dist_init_port", "nodes"),
    _vl.DP_START_RANK: ("nodes",), _vl.ENABLE_EXPERT_PARALLEL: ("ep",), _vl.HEADLESS: ("nodes",),
    _rt.METRICS_HOST: ("bind",),
}
# Recipe text the released parsers refuse: kept as the recipe has it, reported as a warning that
# names the recipe. (engine, flag, a substring of the refused value or of the engine's message,
# the recipe it comes from.)
RECIPE_REFUSALS = (
    ("vllm", _vl.SPECULATIVE_CONFIG, "attention_backend",
     "the vLLM recipe's AMD DSpark mode (features.spec_decoding.modes.dspark.hardware_overrides.amd)"),
)


@dataclass(frozen=True)
class EngineCheckResult:
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()  # one line each: what was skipped and why, what was checked
    seconds: float = 0.0


@dataclass
class _Batch:
    """One parser process: an interpreter and an engine, and the specs it parses."""

    python: str
    engine: str
    jobs: list[dict] = field(default_factory=list)
    specs: dict[str, LaunchSpec] = field(default_factory=dict)
    installed: dict[str, Installed] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    reply: dict | None = None
    failure: str | None = None
    thread: threading.Thread | None = None
    remembered: list[str] = field(default_factory=list)  # names whose command passed before, unchanged since


class EngineCheck:
    """A started engine check; result() waits for it."""

    def __init__(self, plan: Plan, loaded: LoadedTopology):
        self.started = time.monotonic()
        self.plan, self.loaded = plan, loaded
        self.notes: list[str] = []
        self.findings: list[Finding] = []
        self.batches: dict[tuple[str, str], _Batch] = {}
        self.routers: list[tuple[LaunchSpec, Installed, threading.Thread, dict]] = []
        self.skipped: dict[tuple[str, str], list[str]] = {}
        self._start()

    # ---- start ------------------------------------------------------------------------------

    def _start(self) -> None:
        specs = [s for s in self.plan.specs if s.engine in ENGINE_MODULES or s.engine in ROUTERS]
        programs = [(s.engine, resolve_program(s.launcher, s.env)) for s in specs]
        found = installed(programs)  # ~0.1 s, one query per interpreter: the releases key the remembered passes
        by_name = {spec.name: f for spec, f in zip(specs, found)}
        self.versions = by_name
        for spec, (engine, program) in zip(specs, programs):
            if engine not in ENGINE_MODULES:
                continue
            entry = ENGINE_MODULES[engine].parser_entry(program.module, program.rest)
            if program.python is None or entry is None:
                why = program.why or f"{' '.join(spec.launcher)} is not an entry point whose parser is known"
                self.skipped.setdefault((engine, why), []).append(spec.name)
                continue
            batch = self.batches.get((program.python, engine))
            if batch is None:
                batch = self.batches[(program.python, engine)] = _Batch(program.python, engine)
            extra = program.rest[1:] if entry.endswith(" serve") else program.rest
            module = ENGINE_MODULES[engine]
            args = [*extra, *spec.args]
            args = module.parser_args(entry, tuple(args)) if hasattr(module, "parser_args") else args
            job = {"id": spec.name, "engine": engine, "entry": entry, "args": args}
            batch.specs[spec.name] = spec
            batch.installed[spec.name] = by_name[spec.name]
            job["key"] = _pass_key(program.python, by_name[spec.name], job)
            if job["key"] and _remembered(job["key"]):
                batch.remembered.append(spec.name)
            else:
                batch.jobs.append(job)
        for batch in self.batches.values():  # a parser process only where a command is not remembered
            if batch.jobs:
                batch.process, batch.failure = _spawn([batch.python, str(RUNNER), batch.engine])
                batch.thread = threading.Thread(target=_exchange, args=(batch,), daemon=True)
                batch.thread.start()
        for spec in specs:
            if spec.engine in ROUTERS:
                box: dict = {}
                thread = threading.Thread(target=_router_help, args=(by_name[spec.name], box), daemon=True)
                thread.start()
                self.routers.append((spec, by_name[spec.name], thread, box))
        self.findings += version_findings(specs, by_name, self._locate)

    # ---- collect ----------------------------------------------------------------------------

    def result(self) -> EngineCheckResult:
        for batch in self.batches.values():
            if batch.thread is not None:
                batch.thread.join(RUNNER_TIMEOUT + 5)
            self._collect(batch)
        checked: dict[str, list[bool]] = {}
        for spec, found, thread, box in self.routers:
            thread.join(HELP_TIMEOUT + 5)
            ok = self._check_router(spec, found, box)
            if ok is not None:
                checked.setdefault(f"{found.dist or spec.engine} {found.version or ''}".strip(), []).append(ok)
        for name, oks in checked.items():
            self.notes.append(f"engine check: {name} (its --help) accepts {_count(sum(oks), 'command')} of {len(oks)}")
        for (engine, why), names in self.skipped.items():
            self.notes.append(f"engine check: skipped {', '.join(names)} ({engine}): {why}")
        return EngineCheckResult(tuple(_dedupe(self.findings)), tuple(self.notes), time.monotonic() - self.started)

    def _collect(self, batch: _Batch) -> None:
        names = ", ".join(batch.specs)
        reply = batch.reply
        if not batch.jobs:
            have = next(iter(batch.installed.values()))
            self.notes.append(f"engine check: {batch.engine} {have.version} ({batch.python}) accepts "
                              f"{_count(len(batch.specs), 'command')} of {len(batch.specs)} (as it did before)")
            return
        if reply is None:
            self.notes.append(f"engine check: skipped {names} ({batch.engine}): the parser process in "
                              f"{batch.python} failed: {batch.failure}")
            return
        info = reply.get("engines", {}).get(batch.engine, {})
        if info.get("error"):
            self.notes.append(f"engine check: skipped {names}: {batch.engine} cannot be imported by "
                              f"{batch.python} ({_short(info['error'])})")
            return
        version = info.get("version") or "?"
        accepted = sum(r["ok"] for r in reply["results"]) + len(batch.remembered)
        self.notes.append(f"engine check: {batch.engine} {version} ({batch.python}) accepts "
                          f"{_count(accepted, 'command')} of {len(batch.specs)}")
        keys = {job["id"]: job["key"] for job in batch.jobs}
        for res in reply.get("results", ()):
            if not res["ok"]:
                self.findings.append(self._rejection(batch.specs[res["id"]], batch.engine, version, res))
            elif keys.get(res["id"]):
                _remember(keys[res["id"]])

    def _rejection(self, spec: LaunchSpec, engine: str, version: str, res: dict) -> Finding:
        message = _one_line(res["message"])
        flags = list(res.get("flags") or ()) or _flags_in(message, spec.args)
        if res.get("unrecognized"):
            at = self._locate_tokens(spec, res["unrecognized"])
            bad = res["unrecognized"][0]
            since = _since(engine, bad)
            fix = (f"did you mean {res['suggest']}?" if res.get("suggest")
                   else f"{bad} is in {engine} {since} and later: upgrade {engine}, or remove it" if since
                   else f"remove {bad}, or check `{engine} --help` of {engine} {version}")
        else:
            at = self._locate(spec, flags, res.get("value"))
            fix = (f"did you mean {res['suggest']}?" if res.get("suggest")
                   else "use one of the choices listed" if "invalid choice" in message
                   else "correct the argument on this line")
        text = f"{engine} {version} refuses the command: {message}"
        refusal = _recipe_refusal(engine, flags, message, spec.args)
        if refusal:
            return warning(at, f"{text} (this is the recipe's own text, from {refusal})",
                           f"kept as the recipe gives it, for the engine build the recipe names; with "
                           f"{engine} {version} this role will not start", spec.role)
        return error(at, text, fix, spec.role)

    # ---- routers ----------------------------------------------------------------------------

    def _check_router(self, spec: LaunchSpec, found: Installed, box: dict) -> bool | None:
        """True: its command passes; False: refused (findings added); None: not checked (a note says why)."""
        options: RouterOptions | None = box.get("options")
        if options is None:
            self.skipped.setdefault((spec.engine, box.get("why") or found.why or "no --help"), []).append(spec.name)
            return None
        name = f"{found.dist or spec.engine} {found.version or ''}".strip()
        problems = options.problems(spec.args)
        for problem, flag, value, suggest in problems:
            at = self._locate(spec, [flag], value)
            fix = f"did you mean {suggest}?" if suggest else "use an option its --help lists"
            self.findings.append(error(at, f"{name} refuses the command: {problem}", fix, spec.role))
        return not problems

    # ---- where an argument comes from ---------------------------------------------------------

    def _locate(self, spec: LaunchSpec, flags: Iterable[str], value: str | None) -> Path_:
        """The YAML path of the argument: the role's args, the top-level args, else the key that renders it."""
        topology: Topology = self.loaded.topology
        role = topology.roles[spec.role]
        flags = [f for f in flags if f]
        for source, prefix in ((role.args, ("roles", spec.role, "args")), (topology.args, ("args",))):
            at = _find_flag(source, flags, value)
            if at is not None:
                return prefix + (at,)
        for key in _keys_for(spec.engine, flags):
            if getattr(role, key, None) not in (None, [], {}, ()):
                return ("roles", spec.role, key)
            if key in type(topology).model_fields and getattr(topology, key, None) not in (None, [], {}):
                return (key,)
        if value is not None:  # a value rendered from a key: find the key by its value
            for key, given in role.model_dump(exclude_none=True).items():
                if str(given) == value:
                    return ("roles", spec.role, key)
        return ("roles", spec.role)

    def _locate_tokens(self, spec: LaunchSpec, tokens: list[str]) -> Path_:
        topology = self.loaded.topology
        role = topology.roles[spec.role]
        for token in tokens:
            for source, prefix in ((role.args, ("roles", spec.role, "args")), (topology.args, ("args",))):
                for i, arg in enumerate(source):
                    if _norm(arg) == _norm(token) or _norm(arg).split("=", 1)[0] == _norm(token).split("=", 1)[0] \
                            and token.startswith("-"):
                        return prefix + (i,)
        return self._locate(spec, [t for t in tokens if t.startswith("-")], None)


def start(plan: Plan, loaded: LoadedTopology) -> EngineCheck:
    return EngineCheck(plan, loaded)


def check(plan: Plan, loaded: LoadedTopology) -> EngineCheckResult:
    return start(plan, loaded).result()


# ---- parser processes --------------------------------------------------------------------------

def _spawn(argv: list[str]) -> tuple[subprocess.Popen | None, str | None]:
    """The parser process, or why it could not be started."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    try:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd="/", start_new_session=True), None
    except OSError as exc:
        return None, f"it could not be started ({exc.strerror}: {argv[0]})"


# ---- passes remembered: the same command, the same interpreter, the same install ----------------

def pass_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse-launch" / "engine-check"


def _pass_key(python: str, have: Installed, job: dict) -> str | None:
    """A command that passed is remembered per interpreter, engine release and install (its dist-info's
    time) and exact argv; --config reads a file, so a command with it is always parsed anew."""
    if os.environ.get("MUSE_LAUNCH_ENGINE_CHECK_CACHE", "1") == "0" or have.version is None or have.stamp is None \
            or any(a == "--config" or a.startswith("--config=") for a in job["args"]):
        return None
    text = json.dumps([os.path.realpath(python), have.dist, have.version, have.stamp, job["entry"], job["args"],
                       RUNNER.stat().st_mtime_ns])
    return hashlib.sha256(text.encode()).hexdigest()


def _remembered(key: str) -> bool:
    return (pass_cache_dir() / key[:2] / key).exists()


def _remember(key: str) -> None:
    try:
        path = pass_cache_dir() / key[:2] / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass  # nothing remembered: the next check parses again


def _exchange(batch: _Batch) -> None:
    if batch.process is None:
        return  # batch.failure says why
    try:
        jobs = [{k: v for k, v in job.items() if k != "key"} for job in batch.jobs]
        out, err = batch.process.communicate(json.dumps({"jobs": jobs}), timeout=RUNNER_TIMEOUT)
    except subprocess.TimeoutExpired:
        batch.process.kill()
        batch.process.communicate()
        batch.failure = f"no answer within {RUNNER_TIMEOUT:.0f} s"
        return
    try:
        batch.reply = json.loads(out)
    except ValueError:
        batch.failure = f"exit status {batch.process.returncode}: {_short(err or out)}"


# ---- routers: their own --help, cached ---------------------------------------------------------

USAGE_GROUP = re.compile(r"\[(-[-\w]+)((?:\s+[^\[\]]+?)?(?:\s+\[[^\[\]]*\])*)\]")
OPTION_LINE = re.compile(r"^\s{1,8}(-[-\w]+(?:[ =][^\s,]+)?(?:,\s+-[-\w]+(?:[ =][^\s,]+)?)*)(?:\s{2,}|$)", re.M)


@dataclass(frozen=True)
class RouterOptions:
    options: dict[str, tuple[str, ...] | None]  # flag -> its choices, () when it takes a free value, None: no value

    @classmethod
    def from_help(cls, text: str) -> RouterOptions:
        options: dict[str, tuple[str, ...] | None] = {}
        usage = text.split("\n\n", 1)[0]
        for flag, rest in USAGE_GROUP.findall(usage):
            rest = rest.strip()
            choices = re.match(r"^\{([^}]*)\}", rest)
            options[flag] = tuple(choices.group(1).split(",")) if choices else (() if rest else None)
        for line in OPTION_LINE.findall(text):  # aliases (-h, --help) and options the usage left out
            for part in line.split(", "):
                flag, _, metavar = part.partition(" ")
                flag = flag.split("=")[0]
                if flag not in options:
                    choices = re.match(r"^\{([^}]*)\}", metavar)
                    options[flag] = tuple(choices.group(1).split(",")) if choices else (() if metavar else None)
        return cls(options)

    def problems(self, args: Iterable[str]) -> list[tuple[str, str, str | None, str | None]]:
        """(message, flag, value, suggestion) for each option it lacks and each value off its choices."""
        out = []
        args = list(args)
        for i, arg in enumerate(args):
            if not arg.startswith("--"):
                continue
            flag, eq, inline = arg.partition("=")
            if flag not in self.options:
                near = difflib.get_close_matches(flag, list(self.options), n=1, cutoff=0.6)
                out.append((f"unrecognized arguments: {arg}", flag, None, near[0] if near else None))
                continue
            choices = self.options[flag]
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if choices and value is not None and value not in choices:
                out.append((f"argument {flag}: invalid choice: {value!r} (choose from "
                            f"{', '.join(repr(c) for c in choices)})", flag, value, None))
        return out


def help_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse-launch" / "router-help"


def _router_help(found: Installed, box: dict) -> None:
    program = found.program
    if program.executable is None:
        box["why"] = program.why
        return
    if found.dist is None:  # a wrapper or a stand-in: its own --help says nothing of the router's options
        box["why"] = found.why or f"{' '.join(program.launcher)} is not a router muse-launch knows"
        return
    try:
        stat = os.stat(program.executable)
    except OSError as exc:
        box["why"] = str(exc)
        return
    key = hashlib.sha256(json.dumps([program.launcher, os.path.realpath(program.executable), stat.st_mtime_ns,
                                     stat.st_size, found.dist, found.version]).encode()).hexdigest()[:24]
    cached = help_cache_dir() / f"{key}.txt"
    try:
        text = cached.read_text()
    except OSError:
        argv = [program.executable, *program.launcher[1:], "--help"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=HELP_TIMEOUT, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            box["why"] = f"`{' '.join(argv)}` failed: {exc}"
            return
        text = done.stdout
        if done.returncode != 0 or "usage:" not in text:
            box["why"] = f"`{' '.join(argv)}` printed no option list (exit status {done.returncode})"
            return
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(cached)
        except OSError:
            pass  # no cache: the next check asks again
    box["options"] = RouterOptions.from_help(text)


# ---- small helpers ----------------------------------------------------------------------------

def _norm(token: str) -> str:
    """vLLM reads --max_num_seqs as --max-num-seqs: compare option names that way."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name.replace("_", "-") + eq + value
    return token


def _find_flag(source: Iterable[str], flags: list[str], value: str | None) -> int | None:
    """Index of the flag in source: the occurrence with this value if one has it, else the first."""
    source = list(source)
    names = {_norm(f) for f in flags}
    first = None
    for i, arg in enumerate(source):
        name, eq, inline = _norm(arg).partition("=")
        if name in names:
            given = inline if eq else (source[i + 1] if i + 1 < len(source) else None)
            if value is None or given == value:
                return i
            first = i if first is None else first
    return first


def _keys_for(engine: str, flags: Iterable[str]) -> list[str]:
    """The topology keys that render these flags, per the engine module's KEY_FLAGS, SHADOWED and WIRING."""
    module = ENGINES.get(engine)
    keys: list[str] = []
    for flag in flags:
        for key, spellings in getattr(module, "KEY_FLAGS", {}).items():
            if flag in spellings:
                keys.append(key)
        for table in (getattr(module, "SHADOWED", {}), getattr(module, "WIRING", {})):
            if flag in table:
                keys.append(table[flag])
        keys += RENDERED_FROM.get(flag, ())
    return list(dict.fromkeys(keys))


def _flags_in(message: str, args: Iterable[str]) -> list[str]:
    """The options a free-form message names that the command has (`--enable-auto-tool-choice requires ...`)."""
    given = {_norm(a).split("=", 1)[0] for a in args if a.startswith("--")}
    return [f for f in dict.fromkeys(re.findall(r"--[A-Za-z][\w-]*", message)) if _norm(f) in given]


def _since(engine: str, flag: str) -> str | None:
    module = ENGINE_MODULES.get(engine)
    return getattr(module, "FLAG_SINCE", {}).get(flag.split("=", 1)[0]) if module else None


def _recipe_refusal(engine: str, flags: list[str], message: str, args: Iterable[str]) -> str | None:
    for refused_engine, flag, marker, recipe in RECIPE_REFUSALS:
        if engine == refused_engine and flag in flags and (marker in message or marker in (last_value(args, flag) or "")):
            return recipe
    return None


def _model(spec: LaunchSpec) -> str | None:
    return ENGINES[spec.engine].model(spec.args)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
    return " ".join(lines)


def _short(text: str, limit: int = 300) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per cause: replicas, node ranks and roles sharing a top-level key are named together."""
    from dataclasses import replace

    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.severity, f.path, f.message, f.fix)
        seen = merged.get(key)
        merged[key] = f if seen is None else replace(seen, roles=tuple(dict.fromkeys(seen.roles + f.roles)))
    return [replace(f, message=f"{', '.join(f.roles)}: {f.message}") if f.roles else f for f in merged.values()]


# ---- versions ----------------------------------------------------------------------------------

def version_findings(specs: Iterable[LaunchSpec], found: dict[str, Installed], locate) -> list[Finding]:
    """A flag the installed release lacks, naming the release that has it; a release older than the
    recipe's minimum for its model."""
    out = []
    for spec in specs:
        have = found.get(spec.name)
        module = ENGINE_MODULES.get(spec.engine)
        if module is None or have is None or have.version is None:
            continue
        for flag, since in getattr(module, "FLAG_SINCE", {}).items():
            if has_flag(spec.args, flag) and older(have.version, since):
                out.append(error(locate(spec, [flag], None),
                                 f"{flag} is new in {spec.engine} {since}; the installed {spec.engine} is "
                                 f"{have.version} ({have.program.python})",
                                 f"install {spec.engine} >= {since}, or remove {flag}", spec.role))
        minimum = getattr(module, "MIN_VERSION", None)
        model = _model(spec)
        if minimum and older(have.version, minimum) and model and any(
                m in model for m in getattr(module, "MIN_VERSION_MODELS", ())):
            out.append(error(locate(spec, module.KEY_FLAGS["model"], None),
                             f"{spec.engine} {have.version} is older than {minimum}, the recipe's minimum for "
                             f"{model}", f"install {spec.engine} >= {minimum}", spec.role))
    return out


def installed_here(plan: Plan, loaded: LoadedTopology, echo) -> str:
    """`plan`: the installed engines and routers in one line (returned), and, through echo, each flag
    the installed releases lack. No parser is run."""
    from ..host.versions import role_versions, version_key

    found = role_versions(plan)
    locator = EngineCheck.__new__(EngineCheck)
    locator.loaded = loaded
    for finding in _dedupe(version_findings(plan.specs, found, locator._locate)):
        echo(finding.format(loaded))
    parts: dict[str, str] = {}
    for have in sorted(found.values(), key=lambda f: version_key(f.version or "0")):
        if have.engine in parts:
            continue
        if have.version is None:
            parts[have.engine] = f"{have.engine} not installed here ({have.why})"
        elif have.runs:
            parts[have.engine] = (f"{have.engine}: {have.dist} {have.version} (the `{have.program.launcher[0]}` "
                                  f"program here is {have.dist}'s)")
        else:
            parts[have.engine] = f"{have.engine} {have.version}"
    order = list(dict.fromkeys(s.engine for s in plan.specs))  # in start order; the oldest install of each
    return "installed here: " + ", ".join(parts[e] for e in order if e in parts) if parts else ""


# ---- the commands' side ------------------------------------------------------------------------

def start_for_file(path: str | os.PathLike[str], sets: Iterable[str] = ()) -> EngineCheck | None:
    """`up`: start the parser processes before the other checks run, so that the engines import
    meanwhile. None when the file does not plan: the other checks say why."""
    from ..plan.build import build_plan
    from ..topology.load import load_topology

    try:
        loaded = load_topology(path, sets)
        plan = build_plan(loaded.topology)
    except Exception:
        return None
    return EngineCheck(plan, loaded)


def cancel(pending: EngineCheck | None) -> None:
    """The deployment will not start after all: stop the parser processes."""
    for batch in (pending.batches.values() if pending else ()):
        if batch.process is not None and batch.process.poll() is None:
            batch.process.kill()


def report(result: EngineCheckResult, loaded: LoadedTopology, echo) -> bool:
    """Print the check's notes and findings (via echo); True when one of them is an error."""
    for note in result.notes:
        echo(loaded.redact(note))
    for finding in result.findings:
        echo(finding.format(loaded))
    return any(f.severity is Severity.ERROR for f in result.findings)
