"""A deployment on Kubernetes: `up` exports the topology, server-side applies it and waits for the objects'
own readiness; `status`, `logs`, `smoke` and `down` read the cluster through the record `up` left.

The Backend the commands talk to (muse_launch/backend.py) is k8s/k8s_backend.py's K8sBackend, which calls
this."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.rundir.state import RunDir

from . import deployment_record as records
from .client import Cluster, connect
from .deployment_record import K8sRecord
from .view import ClusterView, log_tail, observe

FLAVOURS = ("lws", "rbg")
POLL = 0.5
UNSCHEDULABLE_SECONDS = 10.0  # the scheduler's refusal has stood this long: it will not place the pod
DOWN_TIMEOUT = 120.0  # past each pod's grace period
START_MARGIN = 300.0


@dataclass(frozen=True)
class K8sOptions:
    flavour: str = "lws"
    context: str | None = None
    namespace: str = "default"
    images: Mapping[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    rehearse: bool = False
    detach: bool = False
    python: str = "python3"  # what a rehearsed pod runs the simulated engine with (on the node)


class ClusterOps:
    name = "k8s"

    def __init__(self, say: Callable[[str], None]):
        self.say = say

    # ---- up ----
    def up(self, file: Path, options: K8sOptions, redact: Callable[[str], str]) -> int:
        from muse_launch.export.api import build
        from muse_launch.rundir.state import K8S, write_state
        from muse_launch.supervise.planned_record import planned_record

        if options.flavour not in FLAVOURS:
            raise UsageError(f"--to {options.flavour}: one of {', '.join(FLAVOURS)}")
        done = build(
            file,
            options.flavour,
            options.namespace,
            options.images,
            options.sets,
            options.python if options.rehearse else None,
        )
        if done.problems:
            raise RuntimeFailure(
                "the exported manifests fail validation:\n" + "\n".join(map(str, done.problems))
            )
        export = done.export
        run_dir = RunDir.of(export.plan.name)
        cluster = connect(options.context)
        try:
            self._refuse_if_running(cluster, run_dir)
            self._require_secret(cluster, export)
            rec = self._record(cluster, export, done.files, options, file)
            started = time.monotonic()
            # a router's key as written (`${env:NAME}`): a registration sends it, never written out itself
            sources = export.loaded.secret_sources
            write_state(run_dir, planned_record(export.plan, str(file), redact, backend=K8S, sources=sources))
            records.write(run_dir, rec)
            self._apply(cluster, rec, done.files)
            # as long as the slowest role's probe may take, and a margin for scheduling and image pulls
            limit = max((s.probe.timeout for s in export.plan.specs), default=0.0) + START_MARGIN
            outcome = self._await(cluster, rec, export.plan.name, started, limit)
        finally:
            cluster.close()
        return self._after(run_dir, rec, export, outcome, started, options)

    def _after(
        self, run_dir: RunDir, rec: K8sRecord, export: Any, outcome: str, started: float, options: K8sOptions
    ) -> int:
        name = export.plan.name
        if outcome != "ready":
            self.say(f"{name}: deleting what was applied")
            self.down(run_dir)
            return 130 if outcome == "interrupted" else 1
        self._write_ready(run_dir)
        self.say(
            f"{name}: ready in {time.monotonic() - started:.2f}s on {rec.server} (context {rec.context}, "
            f"namespace {rec.namespace}, {rec.flavour})"
        )
        self.say(f"smoke it with `muse-launch smoke {name}`, stop it with `muse-launch down {name}`")
        if options.detach:
            return 0
        return self._follow(run_dir, name)

    def _refuse_if_running(self, cluster: Cluster, run_dir: RunDir) -> None:
        from muse_launch.rundir.state import is_locked

        if is_locked(run_dir):
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is running on this host; "
                f"`muse-launch down {run_dir.name}` first"
            )
        old = records.read(run_dir)
        if old is not None and old.down_at is None:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is up on {old.server} (namespace {old.namespace}); "
                f"`muse-launch down {run_dir.name}` first"
            )

    def _require_secret(self, cluster: Cluster, export: Any) -> None:
        """The pods read their secrets from a Secret that must exist first; it is never written here."""
        from kubernetes.client.exceptions import ApiException

        if not export.secrets:
            return
        names = export.names
        try:
            secret = cluster.core().read_namespaced_secret(names.secret, names.namespace, _request_timeout=30)
            missing = [k for k in export.secrets if k not in (secret.data or {})]
        except ApiException as exc:
            if exc.status != 404:
                raise
            missing = list(export.secrets)
        if missing:
            literal = " ".join(f"--from-literal={n}=..." for n in export.secrets)
            raise RuntimeFailure(
                f"Secret {names.secret} in namespace {names.namespace} lacks "
                f"{', '.join(missing)}: the pods read them from it; nothing was applied",
                fix=f"kubectl -n {names.namespace} create secret generic {names.secret} {literal}",
            )

    def _record(
        self, cluster: Cluster, export: Any, files: Any, options: K8sOptions, file: Path
    ) -> K8sRecord:
        from muse_launch.export.manifests import SINGLE_POD_KINDS
        from muse_launch.export.names import LWS, dns_label

        names = export.names
        objects = [
            {"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"]}
            for f in files
            for o in f.objects
            if o["kind"] != "Kustomization"
        ]
        roles, entry = [], {}
        for group in export.groups:
            deployment = names.flavour is LWS and group.kind in SINGLE_POD_KINDS and group.size == 1
            for rank, spec in enumerate(group.specs):
                pod = None if deployment else names.pod(group.role, rank, group.size > 1)
                roles.append(
                    {
                        "name": spec.name,
                        "component": dns_label(group.role),
                        "pod": pod,
                        "kind": spec.kind,
                        "port": spec.ports.get("http"),
                    }
                )
            if group.kind == "router" and not entry and group.specs[0].ports.get("http"):
                entry = {"service": names.entry_service(group.role), "port": group.specs[0].ports["http"]}
        return K8sRecord(
            cluster.kubeconfig,
            cluster.context,
            cluster.server,
            names.namespace,
            names.flavour.name,
            names.instance,
            objects,
            roles,
            entry,
            options.rehearse,
            images=dict(options.images),
            adopted={"file": str(file), "sets": list(options.sets)},
        )

    def _apply(self, cluster: Cluster, rec: K8sRecord, files: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        from .apply import apply, describe, refusal

        self._ensure_namespace(cluster, rec.namespace)
        rec.applied_at = time.time()
        for f in files:
            for obj in f.objects:
                if obj["kind"] == "Kustomization":
                    continue
                try:
                    apply(cluster, obj, namespace=rec.namespace)
                except ApiException as exc:
                    problems = refusal(exc, f.path, describe(obj), obj)
                    raise RuntimeFailure(
                        "the API server refused an object:\n" + "\n".join(map(str, problems)),
                        fix=f"`muse-launch down {rec.instance}` deletes what was applied",
                    ) from None
                self.say(f"  applied {describe(obj)}")

    def _ensure_namespace(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            cluster.core().read_namespace(namespace, _request_timeout=30)
        except ApiException as exc:
            if exc.status != 404:
                raise
            raise RuntimeFailure(
                f"namespace {namespace} does not exist on {cluster.server}",
                fix=f"kubectl create namespace {namespace}",
            ) from None

    # ---- waiting ----
    def _await(self, cluster: Cluster, rec: K8sRecord, name: str, started: float, limit: float) -> str:
        """'ready', 'failed' or 'interrupted', saying each role's change as it happens."""
        shown: dict[str, str] = {}
        unschedulable_since: dict[str, float] = {}
        try:
            while True:
                view = observe(cluster, rec)
                for role in view.roles:
                    line = self._progress(role)
                    if shown.get(role.name) != line:
                        shown[role.name] = line
                        self.say(f"  [{time.monotonic() - started:6.1f}s] {line}")
                if view.ready:
                    return "ready"
                failed = self._failure(cluster, rec, view, unschedulable_since)
                if not failed and time.monotonic() - started > limit:
                    waiting = ", ".join(self._progress(r) for r in view.roles if r.state != "ready")
                    failed = [f"error: {name}: not ready after {limit:.0f}s: {waiting or 'the workloads'}"]
                if failed:
                    for line in failed:
                        self.say(line)
                    return "failed"
                time.sleep(POLL)
        except KeyboardInterrupt:
            return "interrupted"

    @staticmethod
    def _progress(role: Any) -> str:
        pod = role.pod
        if pod is None:
            return f"{role.name}: pending (no pod yet)"
        where = f" on {pod.node} ({pod.ip})" if pod.node and pod.ip else f" on {pod.node}" if pod.node else ""
        why = f": {pod.reason}" if pod.reason and role.state != "ready" else ""
        return f"{role.name}: {role.state}{where} pod {pod.name}{why}"

    def _failure(
        self, cluster: Cluster, rec: K8sRecord, view: ClusterView, since: dict[str, float]
    ) -> list[str]:
        for role in view.roles:
            pod = role.pod
            if pod is None:
                continue
            if pod.unschedulable:
                first = since.setdefault(pod.name, time.monotonic())
                if time.monotonic() - first >= UNSCHEDULABLE_SECONDS:
                    return [
                        f"error: pod {pod.name} ({role.name}) stays Pending: the scheduler says {pod.reason}",
                        "  fix: give the cluster nodes that fit it, or lower the role's GPUs in the topology",
                    ]
            else:
                since.pop(pod.name, None)
            if pod.crash_looping:
                tail = log_tail(cluster, rec.namespace, pod.name)
                return [
                    f"error: pod {pod.name} ({role.name}) crash-loops ({pod.restarts} restarts: "
                    f"{pod.reason}); "
                    f"its last lines:",
                    *(f"  {line}" for line in tail),
                ]
        return []

    def _write_ready(self, run_dir: RunDir) -> None:
        from muse_launch.rundir.lifecycle import RoleState
        from muse_launch.rundir.state import read_state, write_state

        state = read_state(run_dir)
        if state is not None:
            write_state(
                run_dir, replace(state, roles=tuple(replace(r, state=RoleState.READY) for r in state.roles))
            )

    def _follow(self, run_dir: RunDir, name: str) -> int:
        self.say(f"{name}: up; Ctrl-C deletes it (`up -d` leaves it running)")
        try:
            while True:
                time.sleep(1.0)
        except KeyboardInterrupt:
            self.say(f"{name}: interrupted; deleting it")
            report = self.down(run_dir)
            return 0 if report.clean else 1

    # ---- down ----
    def down(self, run_dir: RunDir, grace: float | None = None) -> Any:
        """Delete every object `up` applied, then wait until no pod of the deployment is left."""
        from kubernetes.client.exceptions import ApiException

        from muse_launch.backend_types import DownReport

        rec = self._read(run_dir)
        started = time.monotonic()
        cluster = connect_record(rec)
        notes: list[str] = []
        try:
            body: dict[str, Any] = {"propagationPolicy": "Background"}
            if grace is not None:
                body["gracePeriodSeconds"] = int(grace)
            deleted = []
            for obj in reversed(rec.objects):
                try:
                    res = cluster.resource(obj["apiVersion"], obj["kind"])
                    res.delete(name=obj["name"], namespace=rec.namespace, body=body, _request_timeout=30)
                    deleted.append(f"{obj['kind']}/{obj['name']}")
                except ApiException as exc:
                    if exc.status != 404:
                        notes.append(
                            f"could not delete {obj['kind']}/{obj['name']}: HTTP {exc.status} {exc.reason}"
                        )
            left = self._await_gone(cluster, rec, grace)
        finally:
            cluster.close()
        self._write_stopped(run_dir, rec)
        roles = tuple(r["name"] for r in rec.roles)
        return DownReport(
            run_dir.name,
            time.monotonic() - started,
            roles if deleted else (),
            (),
            tuple(left),
            (),
            tuple(notes),
            gpus=None,
        )

    def _await_gone(self, cluster: Cluster, rec: K8sRecord, grace: float | None) -> list[str]:
        longest = max([float(grace)] if grace is not None else [30.0])
        deadline = time.monotonic() + longest + DOWN_TIMEOUT
        while True:
            pods = observe(cluster, rec).pods_left
            if not pods or time.monotonic() > deadline:
                return [f"pod {p} (namespace {rec.namespace})" for p in pods]
            time.sleep(POLL)

    def _write_stopped(self, run_dir: RunDir, rec: K8sRecord) -> None:
        from muse_launch.rundir.lifecycle import RoleState
        from muse_launch.rundir.state import LOCAL, read_state, write_state

        rec.down_at = time.time()
        records.write(run_dir, rec)
        state = read_state(run_dir)
        if state is not None:  # nothing of it is left on the cluster: what remains is this run directory
            roles = tuple(replace(r, state=RoleState.STOPPED, process=None) for r in state.roles)
            write_state(run_dir, replace(state, roles=roles, backend=LOCAL))

    # ---- status, logs, entry ----
    def _read(self, run_dir: RunDir) -> K8sRecord:
        rec = records.read(run_dir)
        if rec is None:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} has no Kubernetes record ({records.path(run_dir)})"
            )
        return rec

    def status(self, run_dir: RunDir) -> tuple[K8sRecord, ClusterView]:
        rec = self._read(run_dir)
        cluster = connect_record(rec)
        try:
            return rec, observe(cluster, rec)
        finally:
            cluster.close()

    def logs(self, run_dir: RunDir, roles: list[str], lines: int) -> list[tuple[str, list[str]]]:
        """Each chosen role's last lines, read through the API server (pods/log)."""
        rec = self._read(run_dir)
        cluster = connect_record(rec)
        try:
            view = observe(cluster, rec)
            out = []
            for role in view.roles:
                if roles and role.name not in roles:
                    continue
                if role.pod is None:
                    out.append((role.name, ["(no pod yet)"]))
                    continue
                out.append(
                    (role.name, log_tail(cluster, rec.namespace, role.pod.name, lines) if lines else [])
                )
            return out
        finally:
            cluster.close()

    def follow_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, line: Callable[[str, str], None]
    ) -> None:
        """Each chosen role's last `lines`, then its new lines as the pod writes them (pods/log?follow),
        until the deployment is taken down; a container that restarts is followed into its next one.
        Lines come to `line(role, text)` on the calling thread, in the order they arrive; Ctrl-C raises
        KeyboardInterrupt there. One stream per pod, each in a thread of its own."""
        import queue
        import threading

        rec = self._read(run_dir)
        cluster = connect_record(rec)
        lines_in: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=10_000)
        done = threading.Event()
        try:
            view = observe(cluster, rec)
            streams: dict[str, threading.Thread] = {}

            def more(view: ClusterView, tail: int) -> None:
                """A stream for each chosen role's pod not followed yet (one `scale` added, say)."""
                for role in view.roles:
                    pod = role.pod.name if role.pod else role.pod_name
                    if (roles and role.name not in roles and _role(role.name) not in roles) or not pod:
                        continue
                    if pod not in streams:
                        streams[pod] = threading.Thread(
                            target=_stream_pod,
                            args=(cluster, rec.namespace, role.name, pod, tail, lines_in, done),
                            name=f"logs-{role.name}",
                            daemon=True,
                        )
                        streams[pod].start()

            more(view, lines)
            looked = time.monotonic()
            while True:
                try:
                    item = lines_in.get(timeout=1.0)
                except queue.Empty:
                    current = records.read(run_dir)
                    if (
                        current is None
                        or current.down_at is not None
                        or not any(t.is_alive() for t in streams.values())
                    ):
                        return
                    item = None
                if item is not None:
                    line(*item)
                if time.monotonic() - looked > FOLLOW_LOOK:
                    rec = records.read(run_dir) or rec
                    more(observe(cluster, rec), -1)
                    looked = time.monotonic()
        finally:
            done.set()
            cluster.close()

    def entry_url(self, run_dir: RunDir) -> str:
        """The router's Service, reached directly at an endpoint the cluster lists for it (a pod address:
        this machine must reach the pod network, as on the local cluster's nodes)."""
        rec = self._read(run_dir)
        if not rec.entry:
            raise UsageError(f"{run_dir.name} has no router Service to send a request to")
        cluster = connect_record(rec)
        try:
            return service_url(cluster, rec.namespace, rec.entry["service"], int(rec.entry["port"]))
        finally:
            cluster.close()

    def role_urls(self, run_dir: RunDir) -> dict[str, str]:
        """Each ready role's pod address with its HTTP port."""
        rec, view = self.status(run_dir)
        ports = {r["name"]: r.get("port") for r in rec.roles}
        return {
            r.name: f"http://{r.pod.ip}:{ports[r.name]}"
            for r in view.roles
            if r.pod and r.pod.ip and ports.get(r.name)
        }


# Credentials this process acts with instead of those `up` recorded (`autoscale --kubeconfig`: a
# ServiceAccount's token, bound to the least the autoscaler needs).
ACTING_AS: dict[str, str] = {}


def connect_record(rec: K8sRecord) -> Cluster:
    if kubeconfig := ACTING_AS.get("kubeconfig"):
        return connect(None, kubeconfig)
    return connect(rec.context or None, rec.kubeconfig or None)


def service_url(cluster: Cluster, namespace: str, service: str, port: int) -> str:
    from kubernetes import client

    slices = (
        client.DiscoveryV1Api(cluster.api)
        .list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}", _request_timeout=30
        )
        .items
    )
    for s in slices:
        # the Service's port named http (its targetPort here), else the one the plan gives the router
        target = next(
            (p.port for p in s.ports or [] if p.name == "http"),
            next((p.port for p in s.ports or [] if p.port == port), port),
        )
        for endpoint in s.endpoints or []:
            if endpoint.conditions is None or endpoint.conditions.ready:
                return f"http://{endpoint.addresses[0]}:{target}"
    raise RuntimeFailure(
        f"Service {service} (namespace {namespace}) has no ready endpoint",
        fix="check its pods with `muse-launch status`",
    )


FOLLOW_RETRY = 1.0  # after a stream ends (its container restarted, the connection dropped)
FOLLOW_LOOK = 2.0  # how often `logs -f` looks for a pod it does not follow yet


def _role(instance: str) -> str:
    """The role of an instance `scale` added (decode-2: decode)."""
    base, _, index = instance.rpartition("-")
    return base if base and index.isdigit() else instance


def _stream_pod(
    cluster: Cluster,
    namespace: str,
    role: str,
    pod: str | None,
    tail: int,
    out: Any,
    done: Any,
) -> None:
    """One pod's log into `out` as (role, line) until `done`: its last `tail` lines first, then each new
    one; where the stream ends while the pod is there (a restart), again from the moment it ended."""
    from kubernetes.client.exceptions import ApiException

    from muse_launch.rundir.logfiles import LineSplitter

    since: int | None = None
    uid: str | None = None
    while not done.is_set():
        ended = time.monotonic()
        try:
            now = cluster.core().read_namespaced_pod(pod, namespace, _request_timeout=30).metadata.uid
            if uid is not None and now != uid:  # the pod made again under its name: all of its log
                since, tail = None, -1
            uid = now
            options: dict[str, Any] = {"follow": True, "_preload_content": False}
            if since:
                options["since_seconds"] = since
            elif tail >= 0:
                options["tail_lines"] = tail
            answer = cluster.core().read_namespaced_pod_log(pod, namespace, **options)
        except ApiException as exc:
            if exc.status == 404:  # deleted: a restart makes it again under its name; `down` ends this
                if done.wait(FOLLOW_RETRY):
                    return
                continue
            out.put(
                (role, f"(its log cannot be read through the API server: HTTP {exc.status} {exc.reason})")
            )
            done.wait(FOLLOW_RETRY * 5)
            since = max(1, int(time.monotonic() - ended) + 1)
            continue
        except Exception:  # noqa: BLE001  the connection dropped: read again
            done.wait(FOLLOW_RETRY)
            since = max(1, int(time.monotonic() - ended) + 1)
            continue
        splitter = LineSplitter()
        try:
            for chunk in answer.stream(4096, decode_content=True):
                if done.is_set():
                    return
                for raw in splitter.feed(chunk):
                    out.put((role, raw.decode(errors="replace")))
        except Exception:  # noqa: BLE001  the stream broke: read again from when it did
            pass
        finally:
            answer.release_conn()
        ended = time.monotonic()
        if done.wait(FOLLOW_RETRY):
            return
        since = max(1, int(time.monotonic() - ended) + 1)
