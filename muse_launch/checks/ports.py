"""Ports: two servers binding one port on one host (counting only ports a server really binds),
encoder bootstrap ports per language worker, and the KV bootstrap port the router tells decode."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from ..engines import ENGINES, WORKER, router, sglang_router, smg, worker_facts
from ..engines.argv import as_int, has_flag, last_value
from ..plan.spec import LaunchSpec
from .findings import CheckContext, Finding, error, placement_check, plan_check
from .reading import bound_ports, free_port, machine, origin, roles

PORT_KEYS = {
    "http": "port",
    "bootstrap": "bootstrap_port",
    "encoder_bootstrap": "encoder_bootstrap_port",
    "metrics": "metrics_port",
    "side_channel": "side_channel_port",
    "dist_init": "dist_init_port",
}
PORT_NAMES = {
    "http": "HTTP",
    "bootstrap": "KV bootstrap",
    "encoder_bootstrap": "encoder bootstrap",
    "metrics": "metrics",
    "side_channel": "side-channel",
    "dist_init": "dist-init",
}


@placement_check
def duplicate_ports(ctx: CheckContext) -> Iterator[Finding]:
    """Two servers on one host binding one port, counting only ports a server really binds."""
    bound = {spec.name: bound_ports(spec) for spec in ctx.plan.specs}
    used: dict[str, set[int]] = defaultdict(set)
    for spec in ctx.plan.specs:
        used[machine(spec)].update(bound[spec.name].values())
    seen: dict[tuple[str, int], tuple[LaunchSpec, str]] = {}
    for spec in ctx.plan.specs:
        for kind, port in bound[spec.name].items():
            key = (machine(spec), port)
            if key not in seen:
                seen[key] = (spec, kind)
                continue
            other, other_kind = seen[key]
            if kind == other_kind == "encoder_bootstrap":
                continue  # encoder_bootstrap_ports says it the cookbook's way
            port_key = _port_key(kind)
            flag = ENGINES[spec.engine].PORT_FLAGS.get(kind, ())
            replicas = ctx.topology.roles[spec.role].replicas
            example = "" if replicas > 1 else f" {free_port(used[key[0]], port)}"
            yield error(
                origin(ctx, spec, flag, port_key),
                f"{spec.name} binds {_port_name(kind)} port {port}, already the "
                f"{_port_name(other_kind)} port of {other.name} on {key[0]}",
                f"give {spec.role} {port_key}{example}"
                + (" (ports step by one per replica)" if replicas > 1 else ""),
                spec.name,
                other.name,
            )


@placement_check
def encoder_bootstrap_ports(ctx: CheckContext) -> Iterator[Finding]:
    """Every --language-only worker binds its own encoder bootstrap server: one port each per host."""
    used: dict[str, set[int]] = defaultdict(set)
    for spec in ctx.plan.specs:
        used[machine(spec)].update(bound_ports(spec).values())
    seen: dict[tuple[str, int], LaunchSpec] = {}
    for spec in ctx.plan.specs:
        facts = worker_facts(spec.engine)
        port = bound_ports(spec).get("encoder_bootstrap") if facts and facts.encoder_bootstrap_port else None
        if port is None:
            continue
        engine = WORKER[spec.engine]
        key = (machine(spec), port)
        if key not in seen:
            seen[key] = spec
            continue
        other = seen[key]
        free = free_port(used[key[0]], port)
        used[key[0]].add(free)
        yield error(
            origin(ctx, spec, engine.KEY_FLAGS["encoder_bootstrap_port"][0], "encoder_bootstrap_port"),
            f"{spec.name} and {other.name} both bind encoder bootstrap port {port} on {key[0]}; each "
            f"{facts.language_only_flag} worker needs its own",
            f"give {spec.role} encoder_bootstrap_port {free}",
            spec.name,
            other.name,
        )


def _port_key(kind: str) -> str:
    """The YAML key of a plan port kind; vLLM numbers extra side channels side_channel_1, _2, ..."""
    return PORT_KEYS.get(kind.rstrip("_0123456789"), "port")


def _port_name(kind: str) -> str:
    return PORT_NAMES.get(kind.rstrip("_0123456789"), kind.replace("_", " "))


def by_url(ctx: CheckContext) -> dict[str, LaunchSpec]:
    return {s.url: s for s in ctx.plan.specs if s.url}


@plan_check
def router_bootstrap_port(ctx: CheckContext) -> Iterator[Finding]:
    """The port the router tells decode to fetch KV from is the one the prefill really binds."""
    urls = by_url(ctx)
    for front in roles(ctx, (sglang_router.ENGINE.NAME, smg.ENGINE.NAME)):
        for url, told in router.prefills(front.args):
            prefill = urls.get(url)
            facts = worker_facts(prefill.engine) if prefill else None
            if prefill is None or facts is None or facts.bootstrap_port is None:
                continue
            bootstrap_flag = WORKER[prefill.engine].KEY_FLAGS["bootstrap_port"][0]
            binds = as_int(last_value(prefill.args, bootstrap_flag)) or facts.bootstrap_port
            if as_int(told) == binds:
                continue
            router_given = has_flag(ctx.topology.roles[front.role].args, router.PREFILL)
            at = (
                origin(ctx, front, router.PREFILL)
                if router_given
                else origin(ctx, prefill, bootstrap_flag, "bootstrap_port")
            )
            fix = (
                f"write {router.PREFILL} {url} {binds} in {front.role}'s args"
                if router_given
                else f"set {prefill.role}.bootstrap_port: {binds} and drop {bootstrap_flag} from its "
                f"args, so the router is told the same port"
            )
            yield error(
                at,
                f"{front.name} tells decode workers to fetch KV from {prefill.name} at bootstrap port "
                f"{told or 'none'}, but {prefill.name} binds {binds}",
                fix,
                front.name,
                prefill.name,
            )
