"""The supervisor's first record of a plan: every role pending, with the wiring each must reach."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from muse_launch.addresses import connect_host
from muse_launch.engines.argv import last_value
from muse_launch.plan.spec import Plan
from muse_launch.proc.masks import Masks
from muse_launch.rundir.lifecycle import LOCAL, RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord
from muse_launch.supervise.wiring import wiring_checks


def planned_record(
    plan: Plan,
    source: str,
    redact: Callable[[str], str],
    versions: Mapping[str, str | None] | None = None,
    sources: Mapping[str, str] | None = None,
    backend: str = LOCAL,
) -> DeploymentRecord:
    """Every role pending, none of its peers listed yet; URLs redacted, since a host may come from a secret
    `${env:...}`. `sources`: each value that came from `${env:...}` -> as written (a router's key is kept
    so)."""
    from muse_launch.plan.diff import launch_digest

    wiring = {name: check.counts(check.wires) for name, check in wiring_checks(plan).items()}
    masks = Masks.of({v for s in plan.specs for v in (*s.argv, *s.env.values())}, redact)
    roles = tuple(
        RoleRecord(
            s.name,
            s.kind,
            RoleState.PENDING,
            s.gpus,
            redact(s.url) if s.url else None,
            dict(s.ports),
            s.probe,
            connect_host(s.bind),
            s.stop.signal,
            s.stop.grace,
            argv=tuple(redact(a) for a in s.argv),
            engine=s.engine,
            wiring=wiring.get(s.name, ()),
            reset_after=s.restart.reset_after,
            api_key=_api_key(s, redact, sources or {}),
            role=s.role,
            env={k: redact(v) for k, v in s.env.items()},
            launch_sha256=launch_digest(masks.salt, s),
        )
        for s in plan.specs
    )
    return DeploymentRecord(
        plan.name,
        source,
        plan.stop_waves(),
        roles,
        versions=dict(versions or {}),
        masks=masks,
        backend=backend,
    )


def _api_key(spec, redact: Callable[[str], str], sources: Mapping[str, str]) -> str | None:
    """A router's key as written: `${env:NAME}` where it came from the environment; a key written in the file
    as it is (it is no secret there); None where the reference is lost (shown redacted: `smoke` goes
    without)."""
    from muse_launch.engines import ROUTER_ENGINES, router

    key = last_value(spec.argv, router.API_KEY) if spec.engine in ROUTER_ENGINES else None
    if key is None:
        return None
    joined = f"{router.API_KEY}="  # `--api-key=${env:K}` as one argument
    written = sources.get(key) or sources.get(joined + key, "").removeprefix(joined)
    return written or (key if redact(key) == key else None)
