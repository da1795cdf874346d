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

import hashlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..engines import ROUTER_ENGINES, WORKER, vllm
from ..engines.argv import last_value
from ..host.versions import Installed, installed, resolve_program
from ..plan.spec import LaunchSpec, Plan
from ..topology.load import REDACTED, LoadedTopology
from .findings import Finding, Severity, error, one_per_cause, warning
from .locate import locate, locate_tokens, norm
from .router_options import HELP_TIMEOUT, RouterOptions, read_router_help
from .versions import version_findings

RUNNER = Path(__file__).with_name("parser_runner.py")
ROUTERS = ROUTER_ENGINES
RUNNER_TIMEOUT = 120.0  # a cold import of vLLM on a loaded 2-core machine takes ~15 s
# Recipe text the released parsers refuse: kept as the recipe has it, reported as a warning that
# names the recipe. (engine, flag, a substring of the refused value or of the engine's message,
# the recipe it comes from.)
RECIPE_REFUSALS = (
    (
        "vllm",
        vllm.SPECULATIVE_CONFIG,
        "attention_backend",
        "the vLLM recipe's AMD DSpark mode (features.spec_decoding.modes.dspark.hardware_overrides.amd)",
    ),
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
        specs = [s for s in self.plan.specs if s.engine in WORKER or s.engine in ROUTERS]
        programs = [(s.engine, resolve_program(s.launcher, s.env)) for s in specs]
        found = installed(
            programs
        )  # ~0.1 s, one query per interpreter: the releases key the remembered passes
        by_name = {spec.name: f for spec, f in zip(specs, found, strict=True)}
        self.versions = by_name
        for spec, (engine, program) in zip(specs, programs, strict=True):
            worker = WORKER.get(engine)
            if worker is None:
                continue
            entry = worker.parser_entry(program.module, program.rest)
            if program.python is None or entry is None:
                why = program.why or f"{' '.join(spec.launcher)} is not an entry point whose parser is known"
                self.skipped.setdefault((engine, why), []).append(spec.name)
                continue
            batch = self.batches.get((program.python, engine))
            if batch is None:
                batch = self.batches[(program.python, engine)] = _Batch(program.python, engine)
            extra = program.rest[1:] if entry.endswith(" serve") else program.rest
            args = worker.parser_args(entry, (*extra, *spec.args))
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
                thread = threading.Thread(
                    target=read_router_help, args=(by_name[spec.name], box), daemon=True
                )
                thread.start()
                self.routers.append((spec, by_name[spec.name], thread, box))
        self.findings += version_findings(specs, by_name, partial(locate, self.loaded.topology))

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
                checked.setdefault(f"{found.dist or spec.engine} {found.version or ''}".strip(), []).append(
                    ok
                )
        for name, oks in checked.items():
            self.notes.append(
                f"engine check: {name} (its --help) accepts {_count(sum(oks), 'command')} of {len(oks)}"
            )
        for (engine, why), names in self.skipped.items():
            self.notes.append(f"engine check: skipped {', '.join(names)} ({engine}): {why}")
        return EngineCheckResult(
            tuple(one_per_cause(self.findings)), tuple(self.notes), time.monotonic() - self.started
        )

    def _collect(self, batch: _Batch) -> None:
        names = ", ".join(batch.specs)
        reply = batch.reply
        if not batch.jobs:
            have = next(iter(batch.installed.values()))
            self.notes.append(
                f"engine check: {batch.engine} {have.version} ({batch.python}) accepts "
                f"{_count(len(batch.specs), 'command')} of {len(batch.specs)} (as it did before)"
            )
            return
        if reply is None:
            self.notes.append(
                f"engine check: skipped {names} ({batch.engine}): the parser process in "
                f"{batch.python} failed: {batch.failure}"
            )
            return
        info = reply.get("engines", {}).get(batch.engine, {})
        if info.get("error"):
            self.notes.append(
                f"engine check: skipped {names}: {batch.engine} cannot be imported by "
                f"{batch.python} ({_short(info['error'])})"
            )
            return
        version = info.get("version") or "?"
        accepted = sum(r["ok"] for r in reply["results"]) + len(batch.remembered)
        self.notes.append(
            f"engine check: {batch.engine} {version} ({batch.python}) accepts "
            f"{_count(accepted, 'command')} of {len(batch.specs)}"
        )
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
            at = locate_tokens(self.loaded.topology, spec, res["unrecognized"])
            bad = res["unrecognized"][0]
            since = _since(engine, bad)
            fix = (
                f"did you mean {res['suggest']}?"
                if res.get("suggest")
                else f"{bad} is in {engine} {since} and later: upgrade {engine}, or remove it"
                if since
                else f"remove {bad}, or check `{engine} --help` of {engine} {version}"
            )
        else:
            at = locate(self.loaded.topology, spec, flags, res.get("value"))
            fix = (
                f"did you mean {res['suggest']}?"
                if res.get("suggest")
                else "use one of the choices listed"
                if "invalid choice" in message
                else "correct the argument on this line"
            )
        text = f"{engine} {version} refuses the command: {message}"
        refusal = _recipe_refusal(engine, flags, message, spec.args)
        if refusal:
            return warning(
                at,
                f"{text} (this is the recipe's own text, from {refusal})",
                f"kept as the recipe gives it, for the engine build the recipe names; with "
                f"{engine} {version} this role will not start",
                spec.role,
            )
        return error(at, text, fix, spec.role)

    # ---- routers ----------------------------------------------------------------------------

    def _check_router(self, spec: LaunchSpec, found: Installed, box: dict) -> bool | None:
        """True: its command passes; False: refused (findings added); None: not checked (a note says why)."""
        options: RouterOptions | None = box.get("options")
        if options is None:
            self.skipped.setdefault((spec.engine, box.get("why") or found.why or "no --help"), []).append(
                spec.name
            )
            return None
        name = f"{found.dist or spec.engine} {found.version or ''}".strip()
        problems = options.problems(spec.args)
        for problem, flag, value, suggest in problems:
            at = locate(self.loaded.topology, spec, [flag], value)
            fix = f"did you mean {suggest}?" if suggest else "use an option its --help lists"
            self.findings.append(error(at, f"{name} refuses the command: {problem}", fix, spec.role))
        return not problems


def start(plan: Plan, loaded: LoadedTopology) -> EngineCheck:
    return EngineCheck(plan, loaded)


def check(plan: Plan, loaded: LoadedTopology) -> EngineCheckResult:
    return start(plan, loaded).result()


# ---- parser processes --------------------------------------------------------------------------


def _spawn(argv: list[str]) -> tuple[subprocess.Popen | None, str | None]:
    """The parser process, or why it could not be started."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
            start_new_session=True,
        ), None
    except OSError as exc:
        return None, f"it could not be started ({exc.strerror}: {argv[0]})"


# ---- passes remembered: the same command, the same interpreter, the same install ----------------


def pass_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse-launch" / "engine-check"


def _pass_key(python: str, have: Installed, job: dict) -> str | None:
    """A command that passed is remembered per interpreter, engine release and install (its dist-info's
    time) and exact argv; --config reads a file, so a command with it is always parsed anew."""
    if (
        os.environ.get("MUSE_LAUNCH_ENGINE_CHECK_CACHE", "1") == "0"
        or have.version is None
        or have.stamp is None
        or any(a == "--config" or a.startswith("--config=") for a in job["args"])
    ):
        return None
    text = json.dumps(
        [
            os.path.realpath(python),
            have.dist,
            have.version,
            have.stamp,
            job["entry"],
            job["args"],
            RUNNER.stat().st_mtime_ns,
        ]
    )
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


# ---- small helpers ----------------------------------------------------------------------------


def _flags_in(message: str, args: Iterable[str]) -> list[str]:
    """The options a free-form message names that the command has (`--enable-auto-tool-choice requires
    ...`)."""
    given = {norm(a).split("=", 1)[0] for a in args if a.startswith("--")}
    return [f for f in dict.fromkeys(re.findall(r"--[A-Za-z][\w-]*", message)) if norm(f) in given]


def _since(engine: str, flag: str) -> str | None:
    worker = WORKER.get(engine)
    return worker.FLAG_SINCE.get(flag.split("=", 1)[0]) if worker else None


def _recipe_refusal(engine: str, flags: list[str], message: str, args: Iterable[str]) -> str | None:
    for refused_engine, flag, marker, recipe in RECIPE_REFUSALS:
        if (
            engine == refused_engine
            and flag in flags
            and (marker in message or marker in (last_value(args, flag) or ""))
        ):
            return recipe
    return None


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
    return " ".join(lines)


def _short(text: str, limit: int = 300) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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
    for batch in pending.batches.values() if pending else ():
        if batch.process is not None and batch.process.poll() is None:
            batch.process.kill()


def report(result: EngineCheckResult, loaded: LoadedTopology, echo) -> bool:
    """Print the check's notes and findings (via echo); True when one of them is an error."""
    explained = False
    for note in result.notes:
        shown = loaded.redact(note)
        if shown != note and REDACTED in shown and not explained:
            shown += f" ({REDACTED}: a value from ${{env:...}} in the file, never printed)"
            explained = True
        echo(shown)
    for finding in result.findings:
        echo(finding.format(loaded))
    return any(f.severity is Severity.ERROR for f in result.findings)
