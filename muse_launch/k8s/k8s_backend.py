"""Kubernetes as a backend (muse_launch/backend.py): `up --on k8s` exports the topology and applies it to a
cluster (k8s/cluster_ops.py); `down`, `status`, `logs` and `smoke` read the cluster through the record `up`
left in the run directory (k8s/deployment_record.py). Nothing here imports the kubernetes client: a
deployment on
this host or on SLURM never loads it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from muse_launch.backend import Backend
from muse_launch.backend_types import Capability, DeploymentView, DownReport, RoleView, Say
from muse_launch.change import AddInstance, Adopt, Change, RemoveInstance, RestartInstance, ScaleRole
from muse_launch.errors import NotSupported, RuntimeFailure
from muse_launch.rundir.state import K8S, DeploymentRecord, RunDir

from . import deployment_record as records

if TYPE_CHECKING:
    import httpx
    from rich.console import Console

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.plan.spec import Plan
    from muse_launch.rundir.logs import RolePrinter


def _say(text: str) -> None:
    print(text, flush=True)


class K8sBackend(Backend):
    name = K8S
    # an edited file is adopted (its objects' rollout held by a partition) and each changed pod relaunched in
    # muse-launch's order; a role the file adds is not placed while it runs
    capabilities = frozenset({Capability.CHANGES, Capability.RELAUNCH, Capability.MOVES_PLAN})
    flags = ("--to", "--context", "--namespace", "--image")

    def owns(self, run_dir: RunDir) -> bool:
        """Up on Kubernetes: its record says so, and `down` has not taken it down since."""
        if not records.exists(run_dir):
            return False
        rec = records.read(run_dir)
        return rec is not None and rec.down_at is None

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        from .cluster_ops import ClusterOps, K8sOptions

        flags = request.flags
        chosen: dict[str, str] = {}
        for value in flags.get("--image", ()):
            role, sep, image = value.partition("=")
            chosen[role if sep else ""] = image if sep else value
        claim(RunDir.of(loaded.plan.name))  # a SLURM job of this name must be over first
        options = K8sOptions(
            flavour=flags.get("--to", "lws"),
            context=flags.get("--context"),
            namespace=flags.get("--namespace", "default"),
            images=chosen,
            sets=request.sets,
            rehearse=request.rehearse,
            detach=request.detach,
        )

        def say(text: str) -> None:
            console.print(text, highlight=False, markup=False, soft_wrap=True)

        return ClusterOps(say).up(loaded.source, options, loaded.redact)

    def plan_as_started(self, run_dir: RunDir, loaded: LoadedPlan, rehearse: bool) -> Plan:
        """The file's plan as its export runs it in the pods (DNS names, a pod's wildcard bind, the node's
        python for a rehearsal), with the flavour, namespace and --set values `up` had."""
        from muse_launch.export.names import FLAVOURS
        from muse_launch.export.transform import export_plan

        rec = records.read(run_dir)
        if rec is None:
            raise RuntimeFailure(f"{run_dir.name}: its Kubernetes record is missing")
        sets = tuple(rec.adopted.get("sets", ()))
        python = "python3" if rehearse else None
        return export_plan(loaded.source, FLAVOURS[rec.flavour], rec.namespace, sets, python).plan

    def release(self, run_dir: RunDir) -> None:
        """Another backend takes the name only once the Kubernetes deployment of it is down."""
        if self.owns(run_dir):
            rec = records.read(run_dir)
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is up on Kubernetes ({rec.server}, namespace {rec.namespace})",
                fix=f"`muse-launch down {run_dir.name}` first",
            )

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        from .cluster_ops import ClusterOps

        return ClusterOps(_say).down(run_dir, grace)

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        """The record with the cluster's view: each role's state, and its URL at its pod (the router's: at
        its Service's endpoint). As recorded when the cluster does not answer (`ls` lists it still)."""
        from muse_launch.rundir.lifecycle import RoleState

        from .cluster_ops import ClusterOps

        run_dir = RunDir.of(record.name)
        backend = ClusterOps(_say)
        try:
            rec, view = backend.status(run_dir)
            urls = backend.role_urls(run_dir)
            entry = backend.entry_url(run_dir) if rec.entry else None
        except RuntimeFailure:
            raise
        except Exception as exc:  # the cluster is away: what `up` recorded, said once
            print(f"{record.name}: the cluster does not answer ({type(exc).__name__})", file=sys.stderr)
            return record
        states = {r.name: r.state for r in view.roles}
        roles = []
        for role in record.roles:
            url = entry if role.kind == "router" and entry else urls.get(role.name, role.url)
            state = RoleState.READY if states.get(role.name) == "ready" else RoleState.STARTING
            # a ready router lists its workers (its command line, or muse-launch registered them)
            wiring = tuple((k, w, w) for k, _, w in role.wiring) if state is RoleState.READY else role.wiring
            # its metrics (`top`, the autoscaler) are read at its pod's address
            host = urlsplit(url).hostname if url else None
            where = {"probe_host": host} if host else {}
            roles.append(replace(role, url=url, state=state, process=None, wiring=wiring, **where))
        return replace(record, roles=tuple(roles), supervisor=None)

    def status(self, run_dir: RunDir, client: httpx.Client) -> DeploymentView:
        import httpx

        from muse_launch.errors import UserError

        from .cluster_ops import ClusterOps
        from .rollout import Rollout

        if self.owns(run_dir):  # a router pod made again gets every worker back
            try:
                Rollout(run_dir, lambda text: None).reconcile()
            except (UserError, httpx.HTTPError):
                pass  # `status` shows what is there; the next change tries again
        rec, view = ClusterOps(_say).status(run_dir)
        roles = []
        for r in view.roles:
            pod = r.pod
            entry = {
                "name": r.name,
                "state": r.state,
                "pod": pod.name if pod else r.pod_name,
                "node": pod.node if pod else None,
                "ip": pod.ip if pod else None,
                "restarts": pod.restarts if pod else 0,
                "reason": pod.reason if pod else None,
            }
            where = f"{entry['pod'] or '-'}" + (f" on {pod.node}" if pod and pod.node else "")
            reason = (pod.reason if pod and r.state != "ready" else None) or None
            health = None if pod is None else "ok" if r.state == "ready" else None
            shown = RoleView(r.name, r.component, r.state, where, url=(pod.ip if pod else None) or "-")
            roles.append(
                replace(shown, restarts=str(entry["restarts"]), health=health, reason=reason, json=entry)
            )
        document = {
            "name": run_dir.name,
            "on": self.name,
            "context": rec.context,
            "server": rec.server,
            "namespace": rec.namespace,
            "flavour": rec.flavour,
            "ready": view.ready,
            "workloads": view.workloads,
        }
        return DeploymentView(
            run_dir.name,
            "ready" if view.ready else "not ready",
            f"on Kubernetes: {rec.server}, context {rec.context}, namespace {rec.namespace}, {rec.flavour}",
            "pod",
            tuple(roles),
            document,
        )

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        """The last lines of each role's pod, read through the API server (pods/log); with `follow`, the
        new ones as they come until the deployment is taken down."""
        from .cluster_ops import ClusterOps

        if follow:

            def line(role: str, text: str) -> None:
                printer.line(role, text)
                printer.flush()

            ClusterOps(_say).follow_logs(run_dir, roles, lines, line)
            return
        for role, text in ClusterOps(_say).logs(run_dir, roles, lines):
            for one in text:
                printer.line(role, one)
        printer.flush()

    def change(self, run_dir: RunDir, change: Change, say: Say = print) -> dict:
        """Through the objects the controllers own (k8s/rollout.py): a new pod counts once its router
        lists it healthy; a leaving one is taken out of its router, drained, then deleted."""
        from .rollout import Rollout

        match change:
            case AddInstance(role=role):
                return {"instance": Rollout(run_dir, say).add(role)}
            case ScaleRole(role=role, replicas=replicas, drain_timeout=drain):
                return Rollout(run_dir, say, drain).scale(role, replicas)
            case RemoveInstance(instance=instance, drain_timeout=drain):
                return Rollout(run_dir, say, drain).remove(instance)
            case RestartInstance(instance=instance, drain_timeout=drain, relaunch=True):
                return Rollout(run_dir, say, drain).relaunch(instance)
            case RestartInstance(instance=instance, drain_timeout=drain):
                return Rollout(run_dir, say, drain).restart(instance)
            case Adopt(file=file, sets=sets):
                return Rollout(run_dir, say).adopt(file, sets)
        name = run_dir.name
        raise NotSupported(
            f"changing {name} by an edited file while it runs on Kubernetes is not supported yet",
            fix=f"`muse-launch down {name}`, then `up --on k8s` the file again",
        )
