"""What the installed releases lack: a flag newer than the installed engine, a release older than the
recipe's minimum for its model; and the one line `plan` prints of what is installed here."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from ..engines import WORKER
from ..engines.argv import has_flag
from ..host.versions import Installed, older
from ..plan.spec import LaunchSpec, Plan
from ..topology.load import LoadedTopology
from .findings import Finding, error, one_per_cause
from .locate import locate


def version_findings(specs: Iterable[LaunchSpec], found: dict[str, Installed], locate) -> list[Finding]:
    """A flag the installed release lacks, naming the release that has it; a release older than the
    recipe's minimum for its model."""
    out = []
    for spec in specs:
        have = found.get(spec.name)
        engine = WORKER.get(spec.engine)
        if engine is None or have is None or have.version is None:
            continue
        for flag, since in engine.FLAG_SINCE.items():
            if has_flag(spec.args, flag) and older(have.version, since):
                out.append(
                    error(
                        locate(spec, [flag], None),
                        f"{flag} is new in {spec.engine} {since}; the installed {spec.engine} is "
                        f"{have.version} ({have.program.python})",
                        f"install {spec.engine} >= {since}, or remove {flag}",
                        spec.role,
                    )
                )
        minimum = engine.MIN_VERSION
        model = engine.model(spec.args)
        if (
            minimum
            and older(have.version, minimum)
            and model
            and any(m in model for m in engine.MIN_VERSION_MODELS)
        ):
            out.append(
                error(
                    locate(spec, engine.KEY_FLAGS["model"], None),
                    f"{spec.engine} {have.version} is older than {minimum}, the recipe's minimum for {model}",
                    f"install {spec.engine} >= {minimum}",
                    spec.role,
                )
            )
    return out


def installed_here(plan: Plan, loaded: LoadedTopology, echo) -> str:
    """`plan`: the installed engines and routers in one line (returned), and, through echo, each flag
    the installed releases lack. No parser is run."""
    from ..host.versions import role_versions, version_key

    found = role_versions(plan)
    for finding in one_per_cause(version_findings(plan.specs, found, partial(locate, loaded.topology))):
        echo(finding.format(loaded))
    parts: dict[str, str] = {}
    for have in sorted(found.values(), key=lambda f: version_key(f.version or "0")):
        if have.engine in parts:
            continue
        if have.version is None:
            parts[have.engine] = f"{have.engine} not installed here ({have.why})"
        elif have.runs:
            parts[have.engine] = (
                f"{have.engine}: {have.dist} {have.version} (the `{have.program.launcher[0]}` "
                f"program here is {have.dist}'s)"
            )
        else:
            parts[have.engine] = f"{have.engine} {have.version}"
    order = list(dict.fromkeys(s.engine for s in plan.specs))  # in start order; the oldest install of each
    return "installed here: " + ", ".join(parts[e] for e in order if e in parts) if parts else ""
