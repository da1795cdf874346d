"""What the cluster says of a deployment now: its pods by role (as the plan's roles), their readiness, and
why one is not ready (the scheduler's reason, a missing Secret, a container that crash-loops), plus the
workload objects' own conditions (LeaderWorkerSet Available, RoleBasedGroup Ready, Deployment Available)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .deployment_record import K8sRecord

INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
READY_CONDITION = {"LeaderWorkerSet": "Available", "RoleBasedGroup": "Ready", "Deployment": "Available"}
CRASH_LOOP_RESTARTS = 2  # a container restarted this often without becoming ready: it crash-loops


@dataclass
class PodView:
    name: str
    node: str | None
    ip: str | None
    phase: str
    ready: bool
    restarts: int
    reason: str | None  # why it is not ready, in the cluster's words
    crash_looping: bool = False
    unschedulable: bool = False


@dataclass
class RoleInCluster:
    name: str  # a role of the plan (a rank of a multi-node role is one)
    pod_name: str | None  # the pod it expects (None: a Deployment's, named by its ReplicaSet)
    component: str
    pod: PodView | None = None

    @property
    def state(self) -> str:
        if self.pod is None:
            return "pending"
        if self.pod.ready:
            return "ready"
        if self.pod.crash_looping:
            return "crash-looping"
        return "pending" if self.pod.phase == "Pending" else "starting"


@dataclass
class ClusterView:
    roles: list[RoleInCluster]
    workloads: dict[str, bool]  # Kind/name -> its own ready condition
    pods_left: list[str] = field(default_factory=list)  # every pod of the deployment (for down)

    @property
    def ready(self) -> bool:
        return all(r.state == "ready" for r in self.roles) and all(self.workloads.values())


def pod_view(pod: Any) -> PodView:
    status = pod.status
    statuses = status.container_statuses or []
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
    restarts = sum(c.restart_count or 0 for c in statuses)
    reason = None
    unschedulable = False
    for c in status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            reason = f"{c.reason}: {c.message}" if c.message else c.reason
            unschedulable = c.reason == "Unschedulable"
    waiting = next((c.state.waiting for c in statuses if c.state and c.state.waiting), None)
    if waiting is not None:
        reason = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    crash = (
        restarts >= CRASH_LOOP_RESTARTS
        and not ready
        or (waiting is not None and waiting.reason == "CrashLoopBackOff")
    )
    if crash and not reason:
        reason = f"restarted {restarts} times"
    if pod.metadata.deletion_timestamp is not None:
        reason = "terminating"
    return PodView(
        pod.metadata.name,
        pod.spec.node_name,
        status.pod_ip,
        status.phase or "Pending",
        ready,
        restarts,
        reason,
        crash,
        unschedulable,
    )


def observe(cluster: Any, record: K8sRecord) -> ClusterView:
    core = cluster.core()
    pods = core.list_namespaced_pod(
        record.namespace, label_selector=f"{INSTANCE}={record.instance}", _request_timeout=30
    ).items
    by_name = {p.metadata.name: p for p in pods}
    by_component: dict[str, list[Any]] = {}
    for p in sorted(pods, key=lambda p: p.metadata.name):
        by_component.setdefault((p.metadata.labels or {}).get(COMPONENT, ""), []).append(p)
    roles = []
    for role in record.roles:
        view = RoleInCluster(role["name"], role.get("pod"), role["component"])
        pod = (
            by_name.get(view.pod_name)
            if view.pod_name
            else next(
                (p for p in by_component.get(view.component, []) if p.metadata.deletion_timestamp is None),
                None,
            )
        )
        view.pod = pod_view(pod) if pod is not None else None
        roles.append(view)
    return ClusterView(roles, workload_conditions(cluster, record), sorted(by_name))


def workload_conditions(cluster: Any, record: K8sRecord) -> dict[str, bool]:
    from kubernetes.client.exceptions import ApiException

    out = {}
    for obj in record.objects:
        wanted = READY_CONDITION.get(obj["kind"])
        if wanted is None:
            continue
        try:
            live = cluster.resource(obj["apiVersion"], obj["kind"]).get(
                name=obj["name"], namespace=record.namespace, _request_timeout=30
            )
            conditions = (live.to_dict().get("status") or {}).get("conditions") or []
            out[f"{obj['kind']}/{obj['name']}"] = any(
                c.get("type") == wanted and c.get("status") == "True" for c in conditions
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            out[f"{obj['kind']}/{obj['name']}"] = False
    return out


def log_tail(cluster: Any, namespace: str, pod: str, lines: int = 20) -> list[str]:
    """The pod's last lines through the API server (pods/log), or why they cannot be read."""
    from kubernetes.client.exceptions import ApiException

    try:
        text = cluster.core().read_namespaced_pod_log(pod, namespace, tail_lines=lines, _request_timeout=30)
    except ApiException as exc:
        return [f"(its log cannot be read through the API server: HTTP {exc.status} {exc.reason})"]
    return (text or "").splitlines()[-lines:]
