"""Kubernetes objects from an ExportPlan: LeaderWorkerSets (or one RoleBasedGroup), Services,
the router's Deployment, and a kustomization.yaml listing them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..engines import WORKER_ENGINES
from ..engines.metrics import ENGINE_METRICS
from ..plan.spec import ProbeKind
from ..render_text import image_for
from ..topology.hardware import PROFILES, Vendor
from .names import LWS, Names, dns_label
from .transform import ExportError, ExportPlan, Group, PodCommand

LWS_API = "leaderworkerset.x-k8s.io/v1"
RBG_API = "workloads.x-k8s.io/v1alpha2"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # LWS labels each pod of a set with its name
GPU_RESOURCE = {Vendor.NVIDIA: "nvidia.com/gpu", Vendor.AMD: "amd.com/gpu"}
SHM_SIZE = "32Gi"  # as `plan --format docker` gives each container (--shm-size 32g)
STARTUP_PERIOD = 10  # seconds between start-up probes; the plan's timeout sets how many may fail
READY_PERIOD = 5
SINGLE_POD_KINDS = ("router", "command")  # nothing addresses them by pod: a Deployment (LWS flavour)
ROUTED_KINDS = ("prefill", "decode", "worker")
# The preStop hook: until the engine's own gauges of running and waiting requests read 0 twice (or the drain's
# time is over), read at the pod's address, else at loopback. Python: every SGLang and vLLM image has it.
DRAIN_HOOK = """import socket, sys, time, urllib.request
port, gauges, limit = sys.argv[1], sys.argv[2].split(","), time.monotonic() + float(sys.argv[3])
hosts, idle = [socket.gethostbyname(socket.gethostname()), "127.0.0.1"], 0
while time.monotonic() < limit and idle < 2:
    count = None
    for host in hosts:
        try:
            text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2).read().decode()
        except Exception:
            continue
        rows = [x.split() for x in text.splitlines() if not x.startswith("#")]
        count = sum(float(r[-1]) for r in rows if r and r[0].split("{")[0] in gauges)
        break
    idle = idle + 1 if count == 0 else 0
    time.sleep(0.5)
"""


# libyaml's emitter where PyYAML has it: the same bytes (tests/unit/test_export.py compares them), about 7x
# faster than the pure-Python one on a 512-instance file.
_BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(_BaseDumper):  # type: ignore[valid-type,misc]
    def ignore_aliases(self, data: Any) -> bool:  # a manifest spells every value out: no &anchors
        return True


class _PureDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(obj: Any, pure: bool = False) -> str:
    return yaml.dump(obj, Dumper=_PureDumper if pure else _Dumper, sort_keys=False, width=1 << 16)


@dataclass(frozen=True)
class Manifest:
    path: str  # file name inside the output directory
    objects: tuple[dict[str, Any], ...]
    header: str = ""

    def text(self) -> str:
        """Dumped once: export checks, validates and writes the same text."""
        if (done := self.__dict__.get("_text")) is None:
            done = self.__dict__["_text"] = self.header + "---\n".join(dump(o) for o in self.objects)
        return done


def port_name(key: str) -> str:
    """A plan port name as a Kubernetes port name (IANA service name: at most 15 characters)."""
    name = key.replace("_", "-")
    if len(name) > 15:
        name = "-".join(p[:4] if p.isalpha() else p for p in name.split("-"))
    return name[:15].strip("-")


def render(export: ExportPlan, images: Mapping[str, str]) -> list[Manifest]:
    """`images`: role name -> image, and "" -> an image for every role; else the hardware's."""
    topology = export.loaded.topology
    profile = PROFILES[topology.hardware]
    unknown = sorted(set(images) - {""} - set(topology.roles))
    if unknown:
        raise ExportError(
            f"--image {unknown[0]}=...: no role {unknown[0]!r}; roles: {', '.join(topology.roles)}"
        )
    missing = []
    image = {}
    for group in export.groups:
        image[group.role] = (
            images.get(export.origin(group.role)) or images.get("") or image_for(group.specs[0], profile)
        )
        if not image[group.role]:
            missing.append(f"roles.{group.role} ({group.engine})")
    if missing:
        raise ExportError(
            f"no image of the {profile.name} profile ships {', '.join(missing)}: give one with "
            f"--image ROLE=IMAGE (or --image IMAGE for every role)"
        )
    source = export.loaded.source.name
    header = (
        f"# {export.plan.name}: exported by `muse-launch export {source} --to {export.names.flavour.name}`."
        f"\n# Edit the topology and export again; check hand edits with `muse-launch export --check DIR`.\n"
    )
    if export.names.flavour is LWS:
        files = [_lws_files(export, g, image[g.role], header) for g in export.groups]
    else:
        files = [_rbg_file(export, image, header)]
    if topology.autoscale is not None:
        files.append(_autoscaler_rbac(export, files, header))
    files.append(_kustomization(export, [f.path for f in files]))
    return files


AUTOSCALER_RBAC = "autoscaler-rbac.yaml"


def _autoscaler_rbac(export: ExportPlan, files: list[Manifest], header: str) -> Manifest:
    """The least an autoscaler acting on this deployment needs (`muse-launch autoscale NAME` run as its
    ServiceAccount, docs/kubernetes.md): read the pods and the router's endpoints, read and scale the objects
    that own the routed workers (their replicas: `patch`, no `delete` or `create`), read the Secret with the
    router's key; nothing else, in this namespace only."""
    names = export.names
    name = f"{names.instance}-autoscaler"
    objects = [o for f in files for o in f.objects]

    def named(kind: str) -> list[str]:
        return sorted({o["metadata"]["name"] for o in objects if o["kind"] == kind})

    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
    ]
    owners = (
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io", "leaderworkersets", ["get", "patch"]),
        ("RoleBasedGroup", "workloads.x-k8s.io", "rolebasedgroups", ["get", "patch"]),
        ("Deployment", "apps", "deployments", ["get"]),
    )
    for kind, group, resource, verbs in owners:
        if found := named(kind):
            rule = {"apiGroups": [group], "resources": [resource], "resourceNames": found}
            rules.append({**rule, "verbs": verbs})
    if export.secrets:
        rules.append(
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [names.secret], "verbs": ["get"]}
        )
    meta = _meta(names, name)
    rbac = "rbac.authorization.k8s.io/v1"
    return Manifest(
        AUTOSCALER_RBAC,
        (
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": rules},
            {
                "apiVersion": rbac,
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": names.namespace}],
            },
        ),
        header,
    )


def _labels(names: Names, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "muse-launch",
        "app.kubernetes.io/instance": names.instance,
        "app.kubernetes.io/component": dns_label(role),
    }


def _meta(names: Names, name: str, role: str | None = None, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": names.namespace}
    meta["labels"] = (
        _labels(names, role)
        if role
        else {"app.kubernetes.io/name": "muse-launch", "app.kubernetes.io/instance": names.instance}
    )
    if annotations:
        meta["annotations"] = {f"muse-launch/{k.replace('_', '-')}": v for k, v in annotations.items()}
    return meta


def _annotations(export: ExportPlan, group: Group) -> dict[str, str]:
    wave = next(i + 1 for i, w in enumerate(export.plan.waves) if group.specs[0].name in w)
    out = {"wave": str(wave)}
    if group.depends_on:
        out["after"] = ",".join(group.depends_on)
    return out


def container(export: ExportPlan, group: Group, pod: PodCommand, image: str) -> dict[str, Any]:
    spec = pod.spec
    names = export.names
    profile = PROFILES[export.loaded.topology.hardware]
    out: dict[str, Any] = {"name": dns_label(group.role), "image": image, "command": list(pod.argv)}
    env: list[dict[str, Any]] = [
        {"name": n, "valueFrom": {"secretKeyRef": {"name": names.secret, "key": n}}} for n in pod.secrets
    ]
    env += [{"name": k, "value": v} for k, v in pod.env]
    if env:
        out["env"] = env
    ports = [{"name": port_name(k), "containerPort": p, "protocol": "TCP"} for k, p in spec.ports.items()]
    if ports:
        out["ports"] = ports
    if spec.gpus and profile.vendor in GPU_RESOURCE:
        out["resources"] = {"limits": {GPU_RESOURCE[profile.vendor]: str(len(spec.gpus))}}
    out.update(probes(pod))
    if (hook := drain_hook(group, pod)) is not None:
        out["lifecycle"] = {"preStop": {"exec": {"command": hook}}}
    if group.engine in WORKER_ENGINES:
        out["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return out


def drain_hook(group: Group, pod: PodCommand) -> list[str] | None:
    """A routed worker's preStop command: it waits for the requests the engine holds, so that a pod deleted
    by anyone (a node drain, a controller's rolling update, kubectl) is not killed with requests in flight."""
    metrics = ENGINE_METRICS.get(group.engine)
    port = pod.spec.ports.get("http")
    if metrics is None or port is None or group.kind not in ROUTED_KINDS:
        return None
    gauges = f"{metrics.running},{metrics.queued}"
    return ["python3", "-c", DRAIN_HOOK, str(port), gauges, f"{pod.spec.stop.drain:g}"]


def probes(pod: PodCommand) -> dict[str, Any]:
    """The plan's probe. Its paths must answer in order: the start-up probe polls the first, for as
    long as the plan's timeout allows; readiness, which Kubernetes polls only once start-up passed,
    the last."""
    probe, port = pod.spec.probe, pod.spec.ports.get("http")
    if port is None or probe.kind not in (ProbeKind.HTTP, ProbeKind.TCP):
        return {}

    def action(path: str) -> dict[str, Any]:
        if probe.kind is ProbeKind.HTTP:
            return {"httpGet": {"path": path, "port": port_name("http")}}
        return {"tcpSocket": {"port": port_name("http")}}

    first, last = (probe.paths[0], probe.paths[-1]) if probe.paths else ("", "")
    return {
        "startupProbe": {
            **action(first),
            "periodSeconds": STARTUP_PERIOD,
            "failureThreshold": max(1, math.ceil(probe.timeout / STARTUP_PERIOD)),
        },
        "readinessProbe": {**action(last), "periodSeconds": READY_PERIOD, "failureThreshold": 3},
    }


def pod_spec(export: ExportPlan, group: Group, pod: PodCommand, image: str) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": [container(export, group, pod, image)]}
    if group.engine in WORKER_ENGINES:
        out["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    # the preStop drain counts in the grace period: the engine's own stop grace comes after it
    drain = pod.spec.stop.drain if drain_hook(group, pod) is not None else 0
    out["terminationGracePeriodSeconds"] = math.ceil(pod.spec.stop.grace + drain)
    return out


def _template(export: ExportPlan, group: Group, pod: PodCommand, image: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": _labels(export.names, group.role)},
        "spec": pod_spec(export, group, pod, image),
    }


def _service_ports(pod: PodCommand) -> list[dict[str, Any]]:
    return [
        {"name": port_name(k), "port": p, "targetPort": p, "protocol": "TCP"}
        for k, p in pod.spec.ports.items()
    ]


def _lws_files(export: ExportPlan, group: Group, image: str, header: str) -> Manifest:
    names = export.names
    name = names.workload(group.role)
    notes = _annotations(export, group)
    if group.kind in SINGLE_POD_KINDS and group.size == 1:
        labels = _labels(names, group.role)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(names, name, group.role, **notes),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": _template(export, group, group.leader, image),
            },
        }
        objects = [deployment]
        if group.leader.spec.ports:
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": _meta(names, names.entry_service(group.role), group.role),
                    "spec": {"selector": labels, "ports": _service_ports(group.leader)},
                }
            )
        return Manifest(f"{dns_label(group.role)}.yaml", tuple(objects), header)
    template: dict[str, Any] = {"size": group.size, "restartPolicy": "RecreateGroupOnPodRestart"}
    if group.worker is None:
        template["workerTemplate"] = _template(export, group, group.leader, image)
    else:
        template["leaderTemplate"] = _template(export, group, group.leader, image)
        template["workerTemplate"] = _template(export, group, group.worker, image)
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": _meta(names, name, group.role, **notes),
        # LeaderCreated: an engine's leader is ready only once every rank has joined it.
        "spec": {"replicas": 1, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template},
    }
    # The headless Service LWS would create for the set, written out so that its DNS names (the
    # wiring) and ports are part of the manifests; LWS leaves an existing one alone.
    service_spec: dict[str, Any] = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {LWS_NAME_LABEL: name},
    }
    ports = _service_ports(group.leader)
    if ports:
        service_spec["ports"] = ports
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names, names.group_service(group.role), group.role),
        "spec": service_spec,
    }
    return Manifest(f"{dns_label(group.role)}.yaml", (lws, service), header)


def _rbg_file(export: ExportPlan, image: Mapping[str, str], header: str) -> Manifest:
    names = export.names
    roles = []
    entries = []
    for group in export.groups:
        role: dict[str, Any] = {"name": names.workload(group.role), "replicas": 1}
        if group.depends_on:
            role["dependencies"] = [names.workload(d) for d in group.depends_on]
        if group.worker is None:
            role["standalonePattern"] = {
                "template": _template(export, group, group.leader, image[group.role])
            }
        else:
            leader = container(export, group, group.leader, image[group.role])
            role["leaderWorkerPattern"] = {
                "size": group.size,
                "restartPolicy": "RecreateRoleInstanceOnPodRestart",
                "template": _template(export, group, group.worker, image[group.role]),
                # A strategic merge patch: the leader's container by name, with its own command, ports and
                # probes.
                "leaderTemplatePatch": {"spec": {"containers": [leader]}},
            }
        roles.append(role)
        if group.kind in SINGLE_POD_KINDS and group.leader.spec.ports:
            entries.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": _meta(names, names.entry_service(group.role), group.role),
                    "spec": {"selector": _labels(names, group.role), "ports": _service_ports(group.leader)},
                }
            )
    rbg = {
        "apiVersion": RBG_API,
        "kind": "RoleBasedGroup",
        "metadata": _meta(names, names.instance),
        "spec": {"roles": roles},
    }
    return Manifest(f"{names.instance}.yaml", (rbg, *entries), header)


def _kustomization(export: ExportPlan, files: list[str]) -> Manifest:
    names = export.names
    lines = [
        f"# {export.plan.name}: `kubectl apply -k .` (namespace {names.namespace}: the wiring's DNS names "
        f"name it; export again with --namespace to move it)."
    ]
    if export.secrets:
        literal = " ".join(f"--from-literal={n}=..." for n in export.secrets)
        lines.append("# First create the Secret it reads (never written here):")
        lines.append(f"#   kubectl -n {names.namespace} create secret generic {names.secret} {literal}")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": files,
    }
    return Manifest("kustomization.yaml", (kustomization,), "\n".join(lines) + "\n")
