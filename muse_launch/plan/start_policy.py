"""When each role may start: `start: waves` waits for every role a role is wired to; `start: overlap`
(the default where the installed versions allow it) starts together the roles whose engines
tolerate a late peer (the engines' facts: late_encoders_since): an SGLang >= 0.5.17 language worker does not
contact its encoders while it starts: it lists them, probes them every 10 s, evicts one after 3
failures and takes it back when healthy, unless it stayed evicted for
SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL (600 s), which is set here from the encoders' ready timeouts so
that a slow encoder is never dropped for good.

The router still starts once its workers are ready, although sglang-router and smg would register
late workers: they retry a worker that is not up 1, 2, 3, 4, 5, 5 s apart, so a router started
early saw its workers 1.0-1.5 s after they were ready, against 0.5-0.6 s for a router started then
(scripts/bench_start_policy.py: PD overlapping the router took 1.16-1.18x the waves' time, and
--worker-startup-check-interval 1 did not change it). Either way `up` is ready only once the wiring
shows (supervise/wiring.py). Other edges (vLLM, `after:`) keep their order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from muse_launch.engines import WORKERS, worker_facts
from muse_launch.plan.releases import version_key
from muse_launch.plan.spec import LaunchSpec, Plan

OVERLAP, WAVES = "overlap", "waves"
TTL_MARGIN = 60.0  # seconds beyond the slowest encoder's ready timeout


@dataclass(frozen=True)
class StartPolicy:
    policy: str  # overlap | waves
    start_after: dict[str, tuple[str, ...]]  # role -> the roles it waits for before it starts
    plan: Plan  # the plan to run: with the encoder eviction TTL where overlap relies on it
    note: str | None  # one line for the user: the policy and, for waves, why


def _tolerates_late(spec: LaunchSpec, peer: LaunchSpec) -> bool:
    """Whether `spec` starts sooner, all told, by not waiting for `peer` (given new enough versions)."""
    facts = worker_facts(spec.engine)
    return (
        bool(facts and facts.late_encoders_since and spec.ports.get("encoder_bootstrap"))
        and peer.kind == "encoder"
        and peer.engine == spec.engine
    )


def choose(plan: Plan, requested: str | None, versions: dict[str, str | None]) -> StartPolicy:
    specs = {s.name: s for s in plan.specs}
    everything = {s.name: s.depends_on for s in plan.specs}
    relaxable = {
        (s.name, d) for s in plan.specs for d in s.depends_on if d in specs and _tolerates_late(s, specs[d])
    }
    if requested == WAVES or not relaxable:
        return StartPolicy(
            WAVES, everything, plan, "start: waves (as the file asks)" if requested == WAVES else None
        )
    engines = sorted({specs[a].engine for a, _ in relaxable})
    why_not = [
        f"{e} {versions.get(e) or 'version unknown'}" for e in engines if not _new_enough(e, versions.get(e))
    ]
    if why_not and requested != OVERLAP:
        return StartPolicy(
            WAVES,
            everything,
            plan,
            f"start: waves, since overlap needs {_minimum(engines)}; here: {', '.join(why_not)}",
        )
    older = [e for e in engines if versions.get(e) and not _new_enough(e, versions.get(e))]
    kept = {(a, d) for a, d in relaxable if specs[a].engine in older}
    relaxed = relaxable - kept
    start_after = {s.name: tuple(d for d in s.depends_on if (s.name, d) not in relaxed) for s in plan.specs}
    note = "start: overlap (roles whose engines tolerate a late peer start together; ready once wired)"
    if why_not:
        note += f"; as the file asks, though: {', '.join(why_not)}" + (" (those keep waves)" if kept else "")
    return StartPolicy(OVERLAP, start_after, _with_eviction_ttl(plan, relaxed), note)


def _minimum(engines: list[str]) -> str:
    return ", ".join(f"{WORKERS[e].title} >= {WORKERS[e].late_encoders_since}" for e in engines)


def _new_enough(engine: str, version: str | None) -> bool:
    if version is None:
        return False
    since = facts.late_encoders_since if (facts := worker_facts(engine)) else None
    return version_key(version) >= version_key(since) if since else True


def _with_eviction_ttl(plan: Plan, relaxed: set[tuple[str, str]]) -> Plan:
    """A language worker started before its encoders keeps each evicted one long enough for it to come up."""
    specs = {s.name: s for s in plan.specs}
    changed = []
    for spec in plan.specs:
        encoders = [specs[d] for a, d in relaxed if a == spec.name and specs[d].kind == "encoder"]
        facts = worker_facts(spec.engine)
        ttl_var, ttl_default = (facts and facts.encoder_evicted_ttl_env) or (None, 0.0)
        if encoders and ttl_var and ttl_var not in spec.env:
            ttl = max(ttl_default, math.ceil(max(e.probe.timeout for e in encoders) + TTL_MARGIN))
            spec = replace(spec, env={**spec.env, ttl_var: f"{ttl:g}"})
        changed.append(spec)
    return replace(plan, specs=tuple(changed))
