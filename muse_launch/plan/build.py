"""build_plan: a pure function from a Topology to a Plan (no environment, ports, clock or files)."""

from __future__ import annotations

from dataclasses import replace

from ..engines import ENGINES, WORKER_ENGINES, router, worker_facts
from ..engines.base import Context, Instance, Upstream
from ..topology.grammar import instance_names
from ..topology.hardware import PROFILES
from ..topology.model import Role, Topology
from .graph import waves
from .spec import LaunchSpec, LogPolicy, Plan, Probe, ProbeKind, RestartPolicy, RestartPolicyKind, StopPolicy

DEFAULT_DIST_INIT_PORT = 20000  # muse-launch's rendezvous port for multi-node roles (SGLang and vLLM alike)


class PlanError(ValueError):
    """The topology cannot be planned; checks report these with file and line first."""


def role_dependencies(topology: Topology) -> dict[str, list[str]]:
    return {
        name: [d for refs in role.references.values() for d in refs] for name, role in topology.roles.items()
    }


def default_launcher(engine: str) -> tuple[str, ...]:
    return ENGINES[engine].DEFAULT_LAUNCHER


def build_plan(topology: Topology) -> Plan:
    profile = PROFILES[topology.hardware]
    instances = {name: expand(topology, name, role) for name, role in topology.roles.items()}
    specs: dict[str, LaunchSpec] = {}
    for name, role in topology.roles.items():
        engine = topology.role_engine(role)
        launcher = tuple(
            role.launcher
            or (topology.launcher if role.kind != "router" and engine in WORKER_ENGINES else None)
            or default_launcher(engine)
        )
        ctx = Context(topology, profile, launcher)
        upstream = {
            ref: [u for d in refs for u in _upstreams(instances[d])] for ref, refs in role.references.items()
        }
        depends_on = tuple(i.name for ref in role.references.values() for d in ref for i in instances[d])
        for inst in instances[name]:
            inst = _wire(inst, upstream)
            if inst.name in specs:  # the loader refuses such a file; never let one process replace another
                raise PlanError(
                    f"roles.{name}: the instance name {inst.name!r} is also {specs[inst.name].role}'s; "
                    f"rename one of the roles"
                )
            rendered = ENGINES[engine].render(inst, ctx)
            env = {**topology.env, **role.env, **rendered.env}
            if inst.gpus and profile.visible_devices_var:
                env[profile.visible_devices_var] = ",".join(map(str, inst.gpus))
                env = {**profile.device_order_env, **env}  # the file's own CUDA_DEVICE_ORDER wins
            specs[inst.name] = LaunchSpec(
                name=inst.name,
                role=name,
                kind=role.kind,
                engine=engine,
                launcher=launcher,
                args=rendered.args,
                env=env,
                gpus=inst.gpus,
                host=inst.host,
                bind=inst.bind,
                node=inst.node,
                ports=rendered.ports,
                probe=_probe(role, rendered.probe),
                depends_on=depends_on,
                stop=StopPolicy(role.stop.signal, role.stop.grace, role.stop.drain),
                restart=RestartPolicy(
                    RestartPolicyKind(role.restart.policy),
                    role.restart.max,
                    role.restart.reset_after,
                    role.restart.unresponsive_after,
                    role.restart.hung_after,
                    role.restart.stalled_after,
                ),
                logs=LogPolicy((role.logs or topology.logs).max_size, (role.logs or topology.logs).keep),
                ready_after=role.rehearse.ready_after
                if role.rehearse.ready_after is not None
                else topology.rehearse.ready_after,
                sim_rates={**topology.rehearse.rates(), **role.rehearse.rates()},
            )
    order = waves({n: s.depends_on for n, s in specs.items()})
    return Plan(topology.name, tuple(specs[n] for wave in order for n in wave), order)


def expand(topology: Topology, name: str, role: Role) -> list[Instance]:
    """A role's instances: `replicas` split its GPUs and step its ports; `nodes` make node ranks."""
    engine = topology.role_engine(role)
    host = role.host or topology.host
    bind = role.bind or topology.bind or host
    gpus = tuple(role.gpus or ())
    facts = worker_facts(engine)
    encoder_bootstrap = facts.encoder_bootstrap_port if facts and role.encoders else None
    base = dict(
        role_name=name,
        role=role,
        kind=role.kind,
        engine=engine,
        model=role.model or topology.model if role.kind not in ("router", "command") else None,
    )
    names = instance_names(name, role.replicas, role.nodes)
    if role.nodes:
        addresses = [topology.nodes[n].address if n in topology.nodes else n for n in role.nodes]
        return [
            Instance(
                name=names[rank],
                host=addresses[rank],
                bind=role.bind or topology.bind or addresses[rank],
                gpus=gpus,
                port=_port(role.port, 0),
                node=node,
                node_rank=rank,
                nnodes=len(role.nodes),
                dist_init_host=addresses[0],
                dist_init_port=role.dist_init_port or DEFAULT_DIST_INIT_PORT,
                bootstrap_port=_port(role.bootstrap_port, 0, _default_bootstrap(role, engine)),
                encoder_bootstrap_port=_port(role.encoder_bootstrap_port, 0, encoder_bootstrap),
                side_channel_port=_port(role.side_channel_port, 0),
                **base,
            )
            for rank, node in enumerate(role.nodes)
        ]
    if role.replicas > 1 and len(gpus) % role.replicas:
        raise PlanError(
            f"roles.{name}.gpus: {len(gpus)} GPUs do not split evenly into {role.replicas} replicas"
        )
    share = len(gpus) // role.replicas
    out = []
    for i in range(role.replicas):
        port = _port(role.port, i)
        out.append(
            Instance(
                name=names[i],
                host=host,
                bind=bind,
                gpus=gpus[i * share : (i + 1) * share],
                port=port,
                bootstrap_port=_port(role.bootstrap_port, i, _default_bootstrap(role, engine, i)),
                encoder_bootstrap_port=_port(
                    role.encoder_bootstrap_port, i, encoder_bootstrap + i if encoder_bootstrap else None
                ),
                side_channel_port=_port(role.side_channel_port, i),
                metrics_port=_port(
                    role.metrics_port, i, router.default_metrics_port(port) if role.kind == "router" else None
                ),
                replica=i if role.replicas > 1 else None,
                replicas=role.replicas,
                **base,
            )
        )
    return out


def _default_bootstrap(role: Role, engine: str, replica: int = 0) -> int | None:
    """A prefill binds its engine's KV bootstrap port, if it has one; replicas step from the default like
    explicit
    ports."""
    facts = worker_facts(engine)
    return (
        facts.bootstrap_port + replica if role.kind == "prefill" and facts and facts.bootstrap_port else None
    )


def _port(spec: int | list[int] | None, index: int, default: int | None = None) -> int | None:
    if spec is None:
        return default
    if isinstance(spec, list):
        if index >= len(spec):
            raise PlanError(f"port list {spec} has no entry for replica {index}")
        return spec[index]
    return spec + index


def _upstreams(instances: list[Instance]) -> list[Upstream]:
    return [Upstream(i.name, i.url, i.engine, i.bootstrap_port) for i in instances if i.serves_http]


def _wire(inst: Instance, upstream: dict[str, list[Upstream]]) -> Instance:
    return replace(
        inst,
        encoders=tuple(upstream["encoders"]),
        prefill=tuple(upstream["prefill"]),
        decode=tuple(upstream["decode"]),
        workers=tuple(upstream["workers"]),
    )


def _probe(role: Role, default: Probe) -> Probe:
    ready = role.ready
    if ready is None:
        return default
    timeout = ready.timeout or default.timeout
    if ready.http:
        return Probe(ProbeKind.HTTP, (ready.http,), ready.status, timeout=timeout, interval=ready.interval)
    if ready.tcp:
        return Probe(ProbeKind.TCP, timeout=timeout, interval=ready.interval)
    return Probe(ProbeKind.LOG, pattern=ready.log, timeout=timeout, interval=ready.interval)
