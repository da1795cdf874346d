"""Changes of a deployment on Kubernetes while it serves (`scale`, `restart --rolling`), no request failed.

A role's instances are the replicas of the object the controllers own: the LeaderWorkerSet of the role's last
instance in the file (`spec.replicas`), or its role in the RoleBasedGroup (`spec.roles[i].replicas`). An
instance added by `scale` is the next replica of that object: the controller makes its pod (`<lws>-1`,
`<rbg>-<role>-1`, ...), with its DNS name under the role's headless Service.

The router learns of a pod from muse-launch, through its worker API (`POST /workers`), as on one host and on
SLURM, not by its own Kubernetes service discovery: only then does a pod leave the router before it is drained
and deleted (service discovery drops a pod when its deletion is already under way, racing the SIGTERM), the
router needs no ServiceAccount that may list pods, and every router muse-launch runs (sglang-router, smg)
takes it the same way. So a pod counts once the router lists it as healthy; a pod leaves in this order: taken
out of the router, drained on its own in-flight count (its /metrics), then deleted (its object's replicas
lowered, or the pod deleted for the controller to make it again).
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from muse_launch.errors import NotSupported, RuntimeFailure, UsageError
from muse_launch.rundir.state import RunDir
from muse_launch.topology.defaults import DRAIN

from . import deployment_record as records
from .client import Cluster
from .cluster_ops import POLL, connect_record, service_url
from .deployment_record import K8sRecord

Say = Callable[[str], None]
READY_TIMEOUT = 300.0  # a new pod: scheduled, started, its probes passed, listed healthy by the router
GONE_TIMEOUT = 120.0  # past a pod's grace period
DRAIN_QUIET = 0.5  # an in-flight count of 0 read twice this far apart: idle
REVISION_LABEL = "controller-revision-hash"  # a RoleBasedGroup pod's RoleInstance revision


@dataclass(frozen=True)
class Instance:
    name: str  # as status and the record name it: decode, decode-1, ...
    pod: str
    url: str  # as the router lists it: the pod's DNS name and the role's port
    kind: str
    bootstrap_port: int | None
    engine: str
    port: int
    grace: float


class Rollout:
    """One change of a deployment on Kubernetes, saying each step."""

    def __init__(self, run_dir: RunDir, say: Say = print, drain_timeout: float | None = None):
        self.run_dir = run_dir
        self.say = say
        self.drain_timeout = DRAIN if drain_timeout is None else drain_timeout
        rec = records.read(run_dir)
        if rec is None or rec.down_at is not None:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is not up on Kubernetes",
                fix=f"`muse-launch up FILE --on k8s` it first ({run_dir.name})",
            )
        self.rec: K8sRecord = rec
        self.http = httpx.Client()

    # ---- what a role is made of ----
    def _state(self) -> Any:
        from muse_launch.rundir.state import read_state

        state = read_state(self.run_dir)
        if state is None:
            raise RuntimeFailure(f"{self.run_dir.name}: its state.json is missing")
        return state

    def instances(self, role: str) -> list[Instance]:
        """The role's instances in replica order, as the record and state.json hold them."""
        from muse_launch.supervise.change_executor import index_of

        state = {r.name: r for r in self._state().roles}
        name = self.run_dir.name
        spanning = sorted(
            e["name"]
            for e in self.rec.roles
            if "@" in e["name"] and index_of(e["name"].split("@", 1)[0], role) is not None
        )
        if spanning:
            raise NotSupported(
                f"{role} spans nodes ({', '.join(spanning)}): on Kubernetes each of its instances is one "
                "LeaderWorkerSet group, a leader pod and its worker pods started and stopped together, which "
                "`scale` and `restart --rolling` do not change pod by pod",
                fix=f"edit roles.{role} in the file (replicas, or its launch), then "
                f"`muse-launch down {name}` and `up --on k8s` the file again",
            )
        found = []
        for entry in self.rec.roles:
            index = index_of(entry["name"], role)
            if index is None:
                continue
            planned = state.get(entry["name"])
            if planned is not None:
                self._refuse_kind(role, planned.kind)
            if planned is None or not entry.get("pod") or not planned.url:
                raise NotSupported(f"{entry['name']}: not an instance muse-launch can change on Kubernetes")
            found.append(
                (
                    index,
                    Instance(
                        entry["name"],
                        entry["pod"],
                        planned.url.rstrip("/"),
                        planned.kind,
                        planned.ports.get("bootstrap"),
                        planned.engine,
                        int(entry.get("port") or planned.ports.get("http") or 0),
                        planned.grace,
                    ),
                )
            )
        if not found:
            names = sorted({r["name"] for r in self.rec.roles})
            raise UsageError(f"{self.run_dir.name} has no role {role!r}; its instances: {', '.join(names)}")
        out = [i for _, i in sorted(found, key=lambda f: f[0])]
        return out

    def _refuse_kind(self, role: str, kind: str) -> None:
        if kind in ("prefill", "decode", "worker"):
            return
        why = (
            "it is listed on its language workers' command lines, so a new or replaced one would need each "
            "of them relaunched"
            if kind == "encoder"
            else "it is the deployment's entry, not behind a router that could serve while it is replaced"
        )
        raise NotSupported(
            f"{role} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}: on Kubernetes `scale` and "
            f"`restart --rolling` change the router's workers (prefill, decode, worker); {why}",
            fix=f"edit roles.{role} in the file, then `muse-launch down {self.run_dir.name}` and "
            "`up --on k8s` it again",
        )

    def _workload(self, last: Instance) -> tuple[str, str, str, int | None]:
        """(apiVersion, kind, name, index of the role in a RoleBasedGroup) that owns the last instance."""
        component = next(r["component"] for r in self.rec.roles if r["name"] == last.name)
        for obj in self.rec.objects:
            if obj["kind"] == "LeaderWorkerSet" and obj["name"] == f"{self.rec.instance}-{component}":
                return obj["apiVersion"], obj["kind"], obj["name"], None
            if obj["kind"] == "RoleBasedGroup":
                return obj["apiVersion"], obj["kind"], obj["name"], -1
        raise NotSupported(f"{last.name}: no LeaderWorkerSet or RoleBasedGroup of it was applied")

    def _replicas(self, cluster: Cluster, last: Instance) -> tuple[int, Callable[[int], None]]:
        """The owner's replicas now, and how to set them."""
        api, kind, name, _ = self._workload(last)
        res = cluster.resource(api, kind)
        live = res.get(name=name, namespace=self.rec.namespace, _request_timeout=30).to_dict()
        if kind == "LeaderWorkerSet":

            def set_lws(n: int) -> None:
                res.patch(
                    name=name,
                    namespace=self.rec.namespace,
                    body={"spec": {"replicas": n}},
                    content_type="application/merge-patch+json",
                    _request_timeout=30,
                )

            return int(live["spec"].get("replicas", 1)), set_lws
        component = next(r["component"] for r in self.rec.roles if r["name"] == last.name)
        roles = live["spec"]["roles"]
        index = next((i for i, r in enumerate(roles) if r["name"] == component), None)
        if index is None:
            raise RuntimeFailure(f"RoleBasedGroup/{name} has no role {component}")

        def set_rbg(n: int) -> None:
            res.patch(
                name=name,
                namespace=self.rec.namespace,
                body=[
                    {"op": "test", "path": f"/spec/roles/{index}/name", "value": component},
                    {"op": "replace", "path": f"/spec/roles/{index}/replicas", "value": n},
                ],
                content_type="application/json-patch+json",
                _request_timeout=30,
            )

        return int(roles[index].get("replicas", 1)), set_rbg

    @staticmethod
    def _replica(last: Instance, role: str, index: int, extra: int) -> Instance:
        """Replica `extra` of the last instance's object, named as instance `index` of the role."""
        base = last.pod.rsplit("-", 1)[0]
        pod = f"{base}-{extra}"
        parts = urlsplit(last.url)
        host = parts.hostname or ""
        if not host.startswith(last.pod + "."):
            raise NotSupported(f"{last.name}: its address {last.url} is not its pod's DNS name")
        netloc = pod + host[len(last.pod) :] + (f":{parts.port}" if parts.port else "")
        url = urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
        return replace(last, name=f"{role}-{index}", pod=pod, url=url)

    # ---- the router ----
    def _router(self, cluster: Cluster) -> Any:
        from muse_launch.engines import ROUTER
        from muse_launch.supervise.wiring import WiringCheck

        router = next((r for r in self._state().roles if r.kind == "router"), None)
        if router is None or not self.rec.entry:
            raise NotSupported(f"{self.run_dir.name} has no router on Kubernetes to take its workers")
        entry = self.rec.entry
        base = service_url(cluster, self.rec.namespace, entry["service"], int(entry["port"]))
        path = ROUTER[router.engine].FACTS.workers_path
        return WiringCheck(router.name, base + path, (), self._router_headers(cluster, router))

    def _router_headers(self, cluster: Cluster, router: Any) -> dict[str, str]:
        """The router's API key where the file gives it one (`${env:NAME}`): from this environment, as `up`
        read it, else from the Secret its pod reads it from. Never said: a missing one names the variable."""
        from kubernetes.client.exceptions import ApiException

        from muse_launch.smoke import front_headers
        from muse_launch.topology.load import ENV_REF

        if router.api_key is None:
            return {}
        environ = dict(os.environ)
        secret = f"{self.run_dir.name}-secrets"
        for name in ENV_REF.findall(router.api_key):
            if name in environ:
                continue
            try:
                found = cluster.core().read_namespaced_secret(secret, self.rec.namespace, _request_timeout=30)
                value = (found.data or {}).get(name)
            except ApiException:
                value = None
            if value is not None:
                environ[name] = base64.b64decode(value).decode()
        headers, problem = front_headers(router, environ)
        if problem:
            raise RuntimeFailure(
                f"{router.name} takes workers only with its API key: {problem}",
                fix=f"export the variable as for `up`, or give Secret {secret} in namespace "
                f"{self.rec.namespace} its key",
            )
        return headers

    def _register(self, cluster: Cluster, inst: Instance, started: float) -> None:
        from muse_launch.supervise.wiring import Wire, WiringCheck
        from muse_launch.supervise.workers import register

        check = self._router(cluster)
        wire = Wire(inst.name, inst.kind, inst.url, inst.bootstrap_port)
        register(self.http, check, wire)
        one = WiringCheck(check.role, check.list_url, (wire,), check.headers)
        deadline = time.monotonic() + READY_TIMEOUT
        while (seen := one.check(self.http)).missing:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"{inst.name}: the router does not list it as healthy ({seen.seen})")
            time.sleep(POLL)
        self.say(f"router: registered {inst.name} ({inst.kind}) at {inst.url}, listed healthy")
        if inst.name in self.rec.leaving:
            self._leaving([n for n in self.rec.leaving if n != inst.name])

    def _leaving(self, names: list[str]) -> None:
        rec = records.read(self.run_dir) or self.rec
        rec.leaving = names
        records.write(self.run_dir, rec)
        self.rec = rec

    def reconcile(self) -> list[str]:
        """Make the router list every instance the record holds (less those leaving): a router pod made again
        knows only its command-line workers. What it did, one line each; nothing where the router's pod is
        not ready yet."""
        from muse_launch.engines import ROUTER
        from muse_launch.supervise.wiring import Wire, WiringCheck
        from muse_launch.supervise.workers import reconcile

        cluster = connect_record(self.rec)
        try:
            try:
                check = self._router(cluster)
            except (NotSupported, RuntimeFailure):
                return []
            router = next(r for r in self._state().roles if r.kind == "router")
            if not ROUTER[router.engine].FACTS.adds_workers:  # vllm-router: its workers are its command line
                return []
            routed = {r["name"] for r in self.rec.roles} - set(self.rec.leaving)
            wires = tuple(
                Wire(r.name, r.kind, r.url.rstrip("/"), r.ports.get("bootstrap"))
                for r in self._state().roles
                if r.name in routed and r.kind in ("prefill", "decode", "worker") and r.url
            )
            if not wires:
                return []
            done = reconcile(self.http, WiringCheck(check.role, check.list_url, wires, check.headers))
            for line in done:
                self.say(f"router: {line}")
            return done
        finally:
            cluster.close()
            self.http.close()

    def _take_out(self, cluster: Cluster, inst: Instance) -> None:
        from muse_launch.supervise.workers import deregister

        self._leaving([*self.rec.leaving, inst.name])
        if deregister(self.http, self._router(cluster), inst.url):
            self.say(f"router: removed {inst.name} ({inst.url})")

    def _drain(self, cluster: Cluster, inst: Instance) -> float:
        """Wait until the pod itself counts no request in flight; the seconds waited."""
        from muse_launch.supervise.workers import in_flight

        began = time.monotonic()
        ip = self._pod(cluster, inst.pod)
        if ip is None or ip.status.pod_ip is None:
            return 0.0
        url = f"http://{ip.status.pod_ip}:{inst.port}"
        idle_since: float | None = None
        last: int | None = None
        while time.monotonic() - began < self.drain_timeout:
            count = in_flight(self.http, inst.engine, url)
            if count is None and last is None and time.monotonic() - began > 5:
                self.say(f"{inst.name}: it does not say what it has in flight; waited 5s")
                break
            last = count if count is not None else last
            if count == 0:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= DRAIN_QUIET:
                    break
            else:
                idle_since = None
            time.sleep(0.1)
        else:
            self.say(f"{inst.name}: still {last} in flight after {self.drain_timeout:g}s; deleting it")
        waited = time.monotonic() - began
        self.say(f"{inst.name}: drained in {waited:.1f}s")
        return waited

    # ---- pods ----
    def _pod(self, cluster: Cluster, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return cluster.core().read_namespaced_pod(name, self.rec.namespace, _request_timeout=30)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _await_ready(
        self, cluster: Cluster, inst: Instance, not_uid: str | None = None, not_revision: str | None = None
    ) -> None:
        """Until the instance's pod is ready: another pod than `not_uid`, of another revision than
        `not_revision` (a pod made again from the old template is not waited for, nor registered)."""
        from .view import pod_view

        deadline = time.monotonic() + READY_TIMEOUT
        shown = ""
        while True:
            pod = self._pod(cluster, inst.pod)
            if (
                pod is not None
                and pod.metadata.uid != not_uid
                and pod.metadata.deletion_timestamp is None
                and (not_revision is None or (pod.metadata.labels or {}).get(REVISION_LABEL) != not_revision)
            ):
                view = pod_view(pod)
                line = f"{inst.name}: {'ready' if view.ready else view.phase.lower()} pod {inst.pod}" + (
                    f" on {view.node} ({view.ip})" if view.node and view.ip else ""
                )
                if line != shown:
                    self.say(f"  {line}")
                    shown = line
                if view.ready:
                    return
                if view.crash_looping or view.unschedulable:
                    raise RuntimeFailure(f"{inst.name}: pod {inst.pod} does not start: {view.reason}")
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"{inst.name}: pod {inst.pod} not ready after {READY_TIMEOUT:g}s")
            time.sleep(POLL)

    def _await_gone(self, cluster: Cluster, pod: str, uid: str | None = None, grace: float = 30.0) -> None:
        deadline = time.monotonic() + grace + GONE_TIMEOUT
        while (p := self._pod(cluster, pod)) is not None and (uid is None or p.metadata.uid == uid):
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"pod {pod} is still there {grace + GONE_TIMEOUT:g}s after its deletion")
            time.sleep(POLL)

    # ---- the record ----
    def _recorded(self, added: list[Instance], removed: list[str], like: str = "") -> None:
        """The new instances in the Kubernetes record and state.json, the removed ones out of both."""
        from muse_launch.rundir.lifecycle import RoleState
        from muse_launch.rundir.state import read_state, write_state

        rec = records.read(self.run_dir) or self.rec
        state = read_state(self.run_dir)
        roles = [r for r in rec.roles if r["name"] not in removed]
        rows = [r for r in state.roles if r.name not in removed] if state is not None else []
        for inst in added:
            template = next(r for r in rec.roles if r["name"] == like)
            roles.append({**template, "name": inst.name, "pod": inst.pod})
            if state is not None:
                row = next(r for r in state.roles if r.name == like)
                rows.append(replace(row, name=inst.name, url=inst.url, state=RoleState.READY, generation=0))
        rec.roles = roles
        rec.leaving = [n for n in rec.leaving if n not in removed]
        records.write(self.run_dir, rec)
        self.rec = rec
        if state is not None:
            waves = []
            for wave in state.stop_waves:  # a new instance stops with the one it was made like
                names = [n for n in wave if n not in removed]
                names += [i.name for i in added if like in wave]
                waves.append(tuple(names))
            write_state(self.run_dir, replace(state, roles=tuple(rows), stop_waves=tuple(waves)))

    def _generation(self, name: str) -> int:
        from muse_launch.rundir.state import read_state, write_state

        state = read_state(self.run_dir)
        if state is None:
            return 0
        rows, generation = [], 0
        for r in state.roles:
            if r.name == name:
                generation = r.generation + 1
                r = replace(r, generation=generation)
            rows.append(r)
        write_state(self.run_dir, replace(state, roles=tuple(rows)))
        return generation

    # ---- the changes ----
    def scale(self, role: str, replicas: int) -> dict:
        cluster = connect_record(self.rec)
        try:
            return self._scale(cluster, role, replicas)
        finally:
            cluster.close()
            self.http.close()

    def _scale(self, cluster: Cluster, role: str, replicas: int) -> dict:
        now = self.instances(role)
        last = now[-1]
        owned, set_replicas = self._replicas(cluster, last)
        first = len(now) - owned  # the file's own instances before the last one's object
        if replicas < first + 1:
            raise NotSupported(
                f"{role}: the file gives it {first + 1} instances, each its own object; on Kubernetes "
                f"`scale` goes down to {first + 1}",
                fix=f"lower roles.{role}.replicas in the file, then `down` and `up --on k8s` it",
            )
        if replicas > len(now):
            added = [self._replica(last, role, index, index - first) for index in range(len(now), replicas)]
            started = time.monotonic()
            set_replicas(replicas - first)
            self.say(f"{role}: replicas {owned} -> {replicas - first} ({', '.join(i.pod for i in added)})")
            try:
                for inst in added:
                    self._await_ready(cluster, inst)
                    self._register(cluster, inst, started)
            except BaseException:
                self.say(f"{role}: back to {owned} replicas")
                for inst in added:
                    self._take_out(cluster, inst)
                set_replicas(owned)
                raise
            self._recorded(added, [], last.name)
            return {"instances": [i.name for i in now + added]}
        leaving = now[replicas:]
        for inst in reversed(leaving):
            self._take_out(cluster, inst)
            self._drain(cluster, inst)
        set_replicas(replicas - first)
        self.say(f"{role}: replicas {owned} -> {replicas - first}")
        for inst in leaving:
            self._await_gone(cluster, inst.pod, grace=inst.grace)
        self._recorded([], [i.name for i in leaving])
        return {"instances": [i.name for i in now[:replicas]]}

    def add(self, role: str) -> str:
        """One more instance of the role: its name."""
        now = self.instances(role)
        return self.scale(role, len(now) + 1)["instances"][-1]

    def remove(self, instance: str) -> dict:
        """The role's last instance only: the controllers remove a set's highest replica."""
        role = self._role_of(instance)
        now = self.instances(role)
        if now[-1].name != instance:
            raise NotSupported(
                f"{instance}: on Kubernetes a role loses its last instance ({now[-1].name}) first, as its "
                "controller removes the highest replica",
                fix=f"`muse-launch scale {self.run_dir.name} {role} {len(now) - 1}`",
            )
        return self.scale(role, len(now) - 1)

    def restart(self, instance: str) -> dict:
        """Replace one instance's pod with a fresh one: out of the router, drained, deleted, made again by its
        controller, ready, back in the router. The only instance of its role gets a surge replica first, so
        that one instance serves throughout."""
        cluster = connect_record(self.rec)
        try:
            role = self._role_of(instance)
            now = self.instances(role)
            inst = next(i for i in now if i.name == instance)
            surge = None
            if len(now) == 1:
                self.say(f"{instance}: the only {role}: a surge replica serves while it restarts")
                self._scale(cluster, role, 2)
                surge = next(i for i in self.instances(role) if i.name != instance)
            try:
                self._replace(cluster, inst)
            finally:
                if surge is not None:
                    self._scale(cluster, role, 1)
            return {"generation": self._generation(instance)}
        finally:
            cluster.close()
            self.http.close()

    def _role_of(self, instance: str) -> str:
        m = re.fullmatch(r"(.+)-(\d{1,4})", instance)
        names = {r["name"] for r in self.rec.roles}
        if instance not in names:
            raise UsageError(f"{self.run_dir.name} has no instance {instance!r}")
        if m and (m[1] in names or f"{m[1]}-0" in names):
            return m[1]
        return instance

    def _replace(self, cluster: Cluster, inst: Instance, relaunch: bool = False) -> None:
        """`relaunch`: made again by the adopted file's template (its object's partition lowered to it)."""
        from kubernetes.client import V1DeleteOptions, V1Preconditions
        from kubernetes.client.exceptions import ApiException

        old = self._pod(cluster, inst.pod)
        uid = old.metadata.uid if old is not None else None
        # A RoleBasedGroup's pod belongs to a RoleInstance that keeps its own copy of the template: a pod
        # deleted is made again at once from the old one, ready, and only then is its RoleInstance replaced by
        # the new template. The relaunched pod is the one whose revision is no longer the old pod's.
        stale = None
        if relaunch and old is not None and self._workload(inst)[1] == "RoleBasedGroup":
            stale = (old.metadata.labels or {}).get(REVISION_LABEL)
        started = time.monotonic()
        self._take_out(cluster, inst)
        self._drain(cluster, inst)
        if relaunch:
            self._partition(cluster, inst, int(inst.pod.rsplit("-", 1)[1]))
        try:  # its controller may have deleted it already: never the pod made again in its place
            body = V1DeleteOptions(preconditions=V1Preconditions(uid=uid)) if uid else None
            cluster.core().delete_namespaced_pod(inst.pod, self.rec.namespace, body=body, _request_timeout=30)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        self.say(f"{inst.name}: deleted pod {inst.pod}; its controller makes it again")
        self._await_gone(cluster, inst.pod, uid, inst.grace)
        self._await_ready(cluster, inst, not_uid=uid, not_revision=stale)
        self._register(cluster, inst, started)

    # ---- an edited file ----
    def adopt(self, file: str, sets: tuple[str, ...] = ()) -> dict:
        """`up FILE` of an edited file: the objects take the file's templates with each one's partition at its
        replicas now, so that no controller replaces a pod on its own; each instance the file changes is then
        relaunched in turn (`relaunch`). Replicas stay as they run (a `scale` is kept)."""
        from muse_launch.errors import UsageError as Usage

        from .apply import apply, describe

        done = self._export(file, sets)
        if done.export.plan.name != self.run_dir.name:
            raise Usage(f"{file} names another deployment than {self.run_dir.name}")
        self._refuse_other_launches(done.export.plan)
        cluster = connect_record(self.rec)
        try:
            for f in done.files:
                for obj in f.objects:
                    if obj["kind"] == "Kustomization":
                        continue
                    apply(cluster, self._held(cluster, obj), namespace=self.rec.namespace)
                    self.say(f"  applied {describe(obj)}")
        finally:
            cluster.close()
            self.http.close()
        rec = records.read(self.run_dir) or self.rec
        rec.adopted = {"file": file, "sets": list(sets)}
        records.write(self.run_dir, rec)
        self.rec = rec
        self.say(f"{self.run_dir.name}: later changes planned from {file}")
        return {"file": file}

    def _refuse_other_launches(self, plan: Any) -> None:
        """Before anything is applied: only the router's workers are relaunched pod by pod; a new launch of
        a router or an encoder (whose controller would replace it at once) is refused, nothing changed."""
        from muse_launch.plan.diff import launch_digest

        state = self._state()
        if not state.masks.salt:
            return
        running = {r.name: r for r in state.roles}
        other = [
            s.name
            for s in plan.specs
            if s.kind not in ("prefill", "decode", "worker")
            and s.name in running
            and running[s.name].launch_sha256 not in (None, launch_digest(state.masks.salt, s))
        ]
        if other:
            name = self.run_dir.name
            raise NotSupported(
                f"{name}: a new launch of {', '.join(other)} is not made while it runs on Kubernetes (only "
                "the router's workers are relaunched pod by pod, each out of the router first); nothing "
                "was changed",
                fix=f"`muse-launch down {name}`, then `up --on k8s` the file again; or edit only the "
                "prefill, decode and worker roles",
            )

    def _export(self, file: str, sets: tuple[str, ...]) -> Any:
        from muse_launch.export.api import build

        python = "python3" if self.rec.rehearse else None
        done = build(file, self.rec.flavour, self.rec.namespace, self.rec.images, sets, python)
        if done.problems:
            raise RuntimeFailure(
                f"{file}: the exported manifests fail validation:\n" + "\n".join(map(str, done.problems))
            )
        return done

    def _held(self, cluster: Cluster, obj: dict) -> dict:
        """The object with the replicas it runs and its rollout held at them (partition = replicas)."""
        import copy

        from kubernetes.client.exceptions import ApiException

        if obj["kind"] not in ("LeaderWorkerSet", "RoleBasedGroup"):
            return obj
        res = cluster.resource(obj["apiVersion"], obj["kind"])
        try:
            live = res.get(name=obj["metadata"]["name"], namespace=self.rec.namespace, _request_timeout=30)
        except ApiException as exc:
            if exc.status == 404:
                return obj
            raise
        live = live.to_dict()
        doc = copy.deepcopy(obj)
        held = {"partition": 0, "maxSurge": 0, "maxUnavailable": 1}
        if obj["kind"] == "LeaderWorkerSet":
            n = int(live["spec"].get("replicas", 1))
            doc["spec"]["replicas"] = n
            doc["spec"]["rolloutStrategy"] = {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {**held, "partition": n},
            }
            return doc
        running = {r["name"]: r for r in live["spec"].get("roles", [])}
        for role in doc["spec"]["roles"]:
            n = int(running.get(role["name"], role).get("replicas", 1))
            role["replicas"] = n
            strategy = role.setdefault("rolloutStrategy", {})
            strategy["type"] = "RollingUpdate"
            strategy["rollingUpdate"] = {**strategy.get("rollingUpdate", {}), **held, "partition": n}
        return doc

    def _partition(self, cluster: Cluster, inst: Instance, index: int) -> None:
        """Let the controller make the instance's pod (and any higher replica) by the object's template."""
        api, kind, name, _ = self._workload(inst)
        res = cluster.resource(api, kind)
        if kind == "LeaderWorkerSet":
            body: Any = {"spec": {"rolloutStrategy": {"rollingUpdateConfiguration": {"partition": index}}}}
            kind_of = "application/merge-patch+json"
        else:
            component = next(r["component"] for r in self.rec.roles if r["name"] == inst.name)
            live = res.get(name=name, namespace=self.rec.namespace, _request_timeout=30).to_dict()
            i = next(i for i, r in enumerate(live["spec"]["roles"]) if r["name"] == component)
            body = [
                {"op": "test", "path": f"/spec/roles/{i}/name", "value": component},
                {
                    "op": "add",
                    "path": f"/spec/roles/{i}/rolloutStrategy/rollingUpdate/partition",
                    "value": index,
                },
            ]
            kind_of = "application/json-patch+json"
        ns = self.rec.namespace
        res.patch(name=name, namespace=ns, body=body, content_type=kind_of, _request_timeout=30)

    def relaunch(self, instance: str) -> dict:
        """One instance made again with the launch the adopted file gives it, in muse-launch's order: out of
        the router, drained, its pod replaced by the new template, ready, back in the router. The only
        instance of its role gets a surge replica (already of the new template) first."""
        if not self.rec.adopted:
            return self.restart(instance)
        cluster = connect_record(self.rec)
        try:
            role = self._role_of(instance)
            now = self.instances(role)
            inst = next(i for i in now if i.name == instance)
            surge = len(now) == 1
            if surge:
                self.say(f"{instance}: the only {role}: a surge replica of the new launch serves meanwhile")
                self._scale(cluster, role, 2)
            try:
                self._replace(cluster, inst, relaunch=True)
            finally:
                if surge:
                    self._scale(cluster, role, 1)
            self._relaunched(instance)
            return {"generation": self._generation(instance)}
        finally:
            cluster.close()
            self.http.close()

    def _relaunched(self, instance: str) -> None:
        """state.json holds the launch the adopted file gives the instance now (the next `up` compares it)."""
        from muse_launch.plan.diff import launch_digest
        from muse_launch.rundir.state import K8S, read_state, write_state
        from muse_launch.supervise.planned_record import planned_record

        state = read_state(self.run_dir)
        if state is None:
            return
        file, sets = self.rec.adopted["file"], tuple(self.rec.adopted.get("sets", ()))
        export = self._export(file, sets).export
        made = planned_record(export.plan, file, export.loaded.redact, backend=K8S)
        fresh = {r.name: r for r in made.roles}
        rows = []
        for r in state.roles:
            new = fresh.get(r.name)
            if r.name == instance and new is not None:
                spec = next(s for s in export.plan.specs if s.name == instance)
                digest = launch_digest(state.masks.salt, spec) if state.masks.salt else new.launch_sha256
                r = replace(r, argv=new.argv, env=new.env, launch_sha256=digest)
            rows.append(r)
        write_state(self.run_dir, replace(state, roles=tuple(rows), source=file))
