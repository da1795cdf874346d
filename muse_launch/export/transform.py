"""The plan that `export` renders: the topology with every address replaced by the DNS name its
pod will have, checked again and planned again; then each role's instances folded into pod
templates (leader and worker), with LWS's / RBG's variables where the ranks' commands differ.

Nothing here knows an engine flag: the group size and node rank are found by comparing the
plan's own argv across ranks (and against a plan with one node more), and every template is
proven by expanding it back, as Kubernetes will, into each rank's exact argv and env.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import Severity, run_checks
from ..errors import CheckFailed, TopologyError, UserError
from ..plan.build import PlanError, build_plan
from ..plan.build import expand as role_instances
from ..plan.rehearse import simulated
from ..plan.spec import LaunchSpec, Plan
from ..topology.hardware import PROFILES
from ..topology.load import ENV_REF, LoadedTopology, load_topology, read_regular_file
from ..topology.model import NodeConfig, Role, Topology
from .expand import expand
from .names import LWS, Flavour, Names, dns_label

SECRET_MARK = "@@muse-secret:{}@@"
SECRET_MARK_RE = re.compile(r"@@muse-secret:([A-Za-z_][A-Za-z0-9_]*)@@")


class ExportError(UserError):
    """The topology cannot be exported as asked (exit 1): the message says why and what to change."""


@dataclass(frozen=True)
class PodCommand:
    """One pod template's container command and env, with $(VAR) references; ports and probe from its spec."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # without the secrets: those come first, from the Secret
    secrets: tuple[str, ...]  # environment names read from the deployment's Secret
    spec: LaunchSpec  # the plan's instance this template was taken from


@dataclass(frozen=True)
class Group:
    role: str
    specs: tuple[LaunchSpec, ...]  # the plan's instances of this role, by node rank
    leader: PodCommand
    worker: PodCommand | None  # None: a group of one pod
    depends_on: tuple[str, ...]  # roles

    @property
    def size(self) -> int:
        return len(self.specs)

    @property
    def kind(self) -> str:
        return self.specs[0].kind

    @property
    def engine(self) -> str:
        return self.specs[0].engine


@dataclass(frozen=True)
class ExportPlan:
    names: Names
    loaded: LoadedTopology  # the original file (secrets as marks)
    topology: Topology  # the transformed topology
    plan: Plan  # its plan: what the manifests render
    groups: tuple[Group, ...]  # in start order
    secrets: tuple[str, ...]  # environment names the file reads through ${env:...}
    warnings: tuple[str, ...] = field(default=())

    def origin(self, role: str) -> str:
        """The file's role a group comes from (a replica's role is its instance name)."""
        return role if role in self.loaded.topology.roles else role.rpartition("-")[0]


def load_for_export(path: str | Path, sets: Iterable[str] = ()) -> tuple[LoadedTopology, tuple[str, ...]]:
    """Load the file with each ${env:NAME} left as a mark: manifests reference secrets, never hold them."""
    sets = list(sets)
    try:  # the loader's limits: no FIFO, no device, no 50 MB file
        text = read_regular_file(Path(path)).decode(errors="replace")
    except TopologyError:
        text = ""  # load_topology says why
    names = sorted(set(ENV_REF.findall(text)) | {n for s in sets for n in ENV_REF.findall(s)})
    loaded = load_topology(path, sets, environ={n: SECRET_MARK.format(n) for n in names})
    return loaded, tuple(names)


def export_plan(
    path: str | Path, flavour: Flavour, namespace: str, sets: Iterable[str] = (), rehearse: str | None = None
) -> ExportPlan:
    """`rehearse`: a python that runs muse_launch, to run the simulated engine in place of each GPU engine
    (`up --on k8s --rehearse` on nodes that run pods as local processes)."""
    loaded, secrets = load_for_export(path, sets)
    _check(loaded, "")
    topology = split_replicas(loaded.topology)
    names = Names(flavour, dns_label(topology.name), namespace)
    _refuse_unsupported(loaded, topology, names)
    moved = k8s_topology(topology, names)
    again = LoadedTopology(moved, loaded.source, loaded.lines, loaded.secrets)
    findings, plan = _check(again, "with each address replaced by its Kubernetes DNS name: ")
    assert plan is not None
    if rehearse:
        plan = simulated(plan, rehearse)
    groups = tuple(_groups(moved, plan, names))
    warnings = tuple(f.format(again) for f in findings if f.severity is Severity.WARNING)
    return ExportPlan(names, loaded, moved, plan, groups, secrets, warnings)


def _check(loaded: LoadedTopology, context: str):
    findings, plan = run_checks(loaded)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if errors or plan is None:
        raise CheckFailed("\n".join(context + f.format(loaded) for f in errors))
    return findings, plan


def split_replicas(topology: Topology) -> Topology:
    """A role with `replicas: N` becomes N roles named as its instances (decode-0, decode-1, ...), each
    with the ports and GPUs of its instance, and every reference to it names them all: one group each."""
    if all(role.replicas == 1 for role in topology.roles.values()):
        return topology
    split: dict[str, list[str]] = {}
    roles: dict[str, Role] = {}
    for name, role in topology.roles.items():
        if role.replicas == 1:
            roles[name] = role
            continue
        split[name] = []
        for inst in role_instances(topology, name, role):
            if inst.name in topology.roles:
                raise ExportError(
                    f"roles.{name}: its replica {inst.name} becomes a role of its own, but "
                    f"roles.{inst.name} exists; rename one"
                )
            roles[inst.name] = role.model_copy(
                update={
                    "replicas": 1,
                    "port": inst.port,
                    "gpus": list(inst.gpus) or None,
                    "bootstrap_port": inst.bootstrap_port,
                    "encoder_bootstrap_port": inst.encoder_bootstrap_port,
                    "side_channel_port": inst.side_channel_port,
                    "metrics_port": inst.metrics_port,
                }
            )
            split[name].append(inst.name)
    for name, role in roles.items():
        update = {
            key: [n for ref in refs for n in split.get(ref, [ref])]
            for key, refs in role.references.items()
            if any(ref in split for ref in refs)
        }
        if update:
            roles[name] = role.model_copy(update=update)
    return topology.model_copy(update={"roles": roles})


def _refuse_unsupported(loaded: LoadedTopology, topology: Topology, names: Names) -> None:
    problems = []
    labels = {}
    for name in topology.roles:
        label = dns_label(name)
        if label in labels:
            problems.append(
                f"{_where(loaded, name)}: roles.{name}: its Kubernetes name {label!r} is also "
                f"roles.{labels[label]}'s; rename one"
            )
        labels[label] = name
        role = topology.roles[name]
        ready = getattr(role, "ready", None)
        for path in _probe_paths(ready):
            if (found := SECRET_MARK_RE.search(path)) is not None:
                problems.append(
                    f"{_where(loaded, name)}: roles.{name}.ready: the probe path takes "
                    f"${{env:{found.group(1)}}}, and a Kubernetes httpGet path cannot read a "
                    "Secret (it would stand in the manifest in clear); fix: write the path in "
                    "the file"
                )
        for obj in (names.workload(name), names.group_service(name), names.pod(name, 99, True)):
            if len(obj) > 63 or not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", obj):
                problems.append(
                    f"{_where(loaded, name)}: roles.{name}: {obj!r} is not a valid Kubernetes "
                    f"name (a DNS label: lowercase letters, digits and '-', at most 63); shorten the "
                    f"topology's name or the role's"
                )
                break
    if problems:
        raise ExportError("\n".join(dict.fromkeys(problems)))


def _probe_paths(ready) -> list[str]:
    paths = getattr(ready, "http", None) if ready is not None else None
    return [paths] if isinstance(paths, str) else [p for p in paths or () if isinstance(p, str)]


def _where(loaded: LoadedTopology, role: str) -> str:
    """The file and line of a role, or of the role a replica was split from."""
    return loaded.where(("roles", role if role in loaded.topology.roles else role.rpartition("-")[0]))


def k8s_topology(topology: Topology, names: Names) -> Topology:
    """Every server listens on all of its pod's addresses and advertises its pod's DNS name; each
    multi-node role gets nodes of its own (its group's pods); a pod's GPUs are 0..n-1."""
    nodes: dict[str, NodeConfig] = {}
    roles = {}
    for name, role in topology.roles.items():
        update: dict[str, object] = {"bind": "0.0.0.0"}
        if role.gpus:
            update["gpus"] = list(range(len(role.gpus)))
        if role.nodes:
            own = []
            for rank, node in enumerate(role.nodes):
                key = node if node not in nodes else f"{node}-{dns_label(name)}"
                nodes[key] = NodeConfig(address=names.address(name, rank, group=len(role.nodes) > 1))
                own.append(key)
            update["nodes"] = own
            update["host"] = None
        elif role.kind == "router" and names.flavour is LWS:
            update["host"] = names.entry_address(name)
        else:
            update["host"] = names.address(name)
        roles[name] = role.model_copy(update=update)
    return topology.model_copy(update={"nodes": nodes, "roles": roles, "bind": "0.0.0.0"})


def _groups(topology: Topology, plan: Plan, names: Names):
    by_role: dict[str, list[LaunchSpec]] = {}
    for spec in plan.specs:
        by_role.setdefault(spec.role, []).append(spec)
    role_of = {s.name: s.role for s in plan.specs}
    grown = None
    for role, specs in by_role.items():
        depends = tuple(dict.fromkeys(role_of[d] for d in specs[0].depends_on))
        if len(specs) == 1:
            yield Group(role, tuple(specs), _pod(specs[0], {}), None, depends)
            continue
        if grown is None:
            try:
                grown = build_plan(_one_more_node(topology, names))
            except PlanError:  # no plan with a node more: the group size stays a number
                grown = Plan(plan.name, (), ())
        yield _leader_worker(role, specs, [s for s in grown.specs if s.role == role], names, depends)


def _one_more_node(topology: Topology, names: Names) -> Topology:
    """The same topology with one node more in every multi-node role: the flags whose value follows
    the node count are the group size."""
    nodes = dict(topology.nodes)
    roles = {}
    for name, role in topology.roles.items():
        if len(role.nodes) > 1:
            extra = f"{role.nodes[-1]}+1"
            nodes[extra] = NodeConfig(address=names.address(name, len(role.nodes), group=True))
            role = role.model_copy(update={"nodes": [*role.nodes, extra]})
        roles[name] = role
    return topology.model_copy(update={"nodes": nodes, "roles": roles})


def _flag_values(argv: tuple[str, ...]) -> dict[str, list[int]]:
    """Positions of each `--flag value` value in argv."""
    out: dict[str, list[int]] = {}
    for i in range(1, len(argv)):
        if argv[i - 1].startswith("--") and not argv[i].startswith("--"):
            out.setdefault(argv[i - 1], []).append(i)
    return out


def _value(argv: tuple[str, ...], flag: str) -> str | None:
    positions = _flag_values(argv).get(flag)
    return argv[positions[-1]] if positions else None


def _leader_worker(
    role: str, specs: list[LaunchSpec], grown: list[LaunchSpec], names: Names, depends: tuple[str, ...]
) -> Group:
    flavour = names.flavour
    size = len(specs)
    flags = set().union(*(_flag_values(s.argv) for s in specs))
    rank_flags = {f for f in flags if all(_value(s.argv, f) == str(r) for r, s in enumerate(specs))}
    size_flags = {
        f
        for f in flags
        if grown
        and all(_value(s.argv, f) == str(size) for s in specs)
        and _value(grown[0].argv, f) == str(size + 1)
    }
    leader_address = names.address(role, 0, group=True)

    def template(spec: LaunchSpec, rank: int) -> PodCommand:
        swaps = {leader_address: f"$({flavour.leader_var})"}
        if rank > 0:
            swaps[names.address(role, rank, group=True)] = names.address_template(role, flavour.index_var)
        positions = _flag_values(spec.argv)
        values = {i: f"$({flavour.index_var})" for f in rank_flags for i in positions.get(f, ())}
        values.update({i: f"$({flavour.size_var})" for f in size_flags for i in positions.get(f, ())})
        return _pod(spec, swaps, values)

    leader, worker = template(specs[0], 0), template(specs[1], 1)
    for rank, spec in enumerate(specs):
        pod = leader if rank == 0 else worker
        injected = {
            flavour.leader_var: leader_address,
            flavour.size_var: str(size),
            flavour.index_var: str(rank),
        }
        argv, env = replay(pod, injected)
        want = _visible_env(spec)
        if (
            argv != list(spec.argv)
            or {k: v for k, v in env.items() if k in want or k not in pod.secrets} != want
        ):
            diff = [
                f"{spec.argv[i - 1]} {b} where the template gives {a}"
                for i, (a, b) in enumerate(zip(argv, spec.argv, strict=False))
                if a != b
            ][:3] or ["their flags differ"]
            raise ExportError(
                f"roles.{role}: {flavour.name.upper()} gives every worker of a group one template, but "
                f"{spec.name}'s command is not {specs[1].name}'s with only the node rank, group size and "
                f"addresses changed ({'; '.join(diff)}); export it with 2 nodes per role, or split the role"
            )
    return Group(role, tuple(specs), leader, worker, depends)


def _visible_env(spec: LaunchSpec) -> dict[str, str]:
    """The env a pod gets: the device plugin, not the plan, picks a pod's GPUs."""
    var = None
    for profile in PROFILES.values():
        if profile.visible_devices_var and profile.visible_devices_var in spec.env and spec.gpus:
            var = profile.visible_devices_var
    return {k: v for k, v in spec.env.items() if k != var}


def escape(text: str) -> str:
    """Kubernetes expands $(VAR) in command and env: a literal `$(` from the file is written `$$(`."""
    return text.replace("$(", "$$(")


def _pod(spec: LaunchSpec, swaps: Mapping[str, str], values: Mapping[int, str] | None = None) -> PodCommand:
    argv = spec.argv

    def render(text: str) -> str:
        text = escape(text)
        for old, new in swaps.items():
            text = text.replace(old, new)
        return SECRET_MARK_RE.sub(lambda m: f"$({m.group(1)})", text)

    visible = _visible_env(spec)
    secrets = sorted({m for text in (*argv, *visible.values()) for m in SECRET_MARK_RE.findall(text)})
    out = [values[i] if values and i in values else render(a) for i, a in enumerate(argv)]
    pairs = tuple(
        (k, render(v)) for k, v in visible.items() if not (k in secrets and v == SECRET_MARK.format(k))
    )
    return PodCommand(tuple(out), pairs, tuple(secrets), spec)


def replay(
    pod: PodCommand,
    injected: Mapping[str, str],
    secrets: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and env Kubernetes gives the container: the injected variables, then the secrets
    (each as its mark unless given, so that the result compares with the plan), then the pod's env."""
    defined: dict[str, str] = dict(injected)
    env: dict[str, str] = {}
    for name in pod.secrets:
        env[name] = defined[name] = (secrets or {}).get(name, SECRET_MARK.format(name))
    for key, value in pod.env:
        env[key] = defined[key] = expand(value, defined)
    return [expand(a, defined) for a in pod.argv], env
