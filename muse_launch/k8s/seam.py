"""Kubernetes as a backend (muse_launch/backend.py): `up --on k8s` exports the topology and applies it to a
cluster (k8s/backend.py); `down`, `status`, `logs` and `smoke` read the cluster through the record `up`
left in the run directory (k8s/record.py). Nothing here imports the kubernetes client: a deployment on
this host or on SLURM never loads it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from collections.abc import Callable as _Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from muse_launch.errors import NotSupported, RuntimeFailure, UsageError
from muse_launch.rundir.state import K8S, DeploymentRecord, RunDir

from . import record as records

if TYPE_CHECKING:
    import httpx
    from rich.console import Console
    from rich.table import Table

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.local.down import DownReport
    from muse_launch.local.status import OwnerOf
    from muse_launch.rundir.logs import RolePrinter


def _say(text: str) -> None:
    print(text, flush=True)


Say = _Callable[[str], None]


class K8sBackend:
    name = K8S

    def owns(self, run_dir: RunDir) -> bool:
        """Up on Kubernetes: its record says so, and `down` has not taken it down since."""
        if not records.exists(run_dir):
            return False
        rec = records.read(run_dir)
        return rec is not None and rec.down_at is None

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        from .backend import K8sOptions, KubernetesBackend

        one_host_only = {"--only": request.only, "--keep": request.keep}
        if given := [flag for flag, value in one_host_only.items() if value]:
            raise UsageError(f"{', '.join(given)}: not with --on {self.name}")
        chosen: dict[str, str] = {}
        for value in request.images:
            role, sep, image = value.partition("=")
            chosen[role if sep else ""] = image if sep else value
        claim(RunDir.of(loaded.plan.name))  # a SLURM job of this name must be over first
        options = K8sOptions(
            flavour=request.flavour,
            context=request.context,
            namespace=request.namespace,
            images=chosen,
            sets=request.sets,
            rehearse=request.rehearse,
            detach=request.detach,
        )

        def say(text: str) -> None:
            console.print(text, highlight=False, markup=False, soft_wrap=True)

        return KubernetesBackend(say).up(loaded.source, options, loaded.redact)

    def release(self, run_dir: RunDir) -> None:
        """Another backend takes the name only once the Kubernetes deployment of it is down."""
        if self.owns(run_dir):
            rec = records.read(run_dir)
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is up on Kubernetes ({rec.server}, namespace {rec.namespace})",
                fix=f"`muse-launch down {run_dir.name}` first",
            )

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        from .backend import KubernetesBackend

        return KubernetesBackend(_say).down(run_dir, grace)

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        """The record with the cluster's view: each role's state, and its URL at its pod (the router's: at
        its Service's endpoint). As recorded when the cluster does not answer (`ls` lists it still)."""
        from muse_launch.rundir.lifecycle import RoleState

        from .backend import KubernetesBackend

        run_dir = RunDir.of(record.name)
        backend = KubernetesBackend(_say)
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
            roles.append(replace(role, url=url, state=state, process=None))
        return replace(record, roles=tuple(roles), supervisor=None)

    def status(self, run_dir: RunDir, client: httpx.Client, as_json: bool, watch: bool) -> str | Table:
        from rich.table import Table

        from .backend import KubernetesBackend
        from .rollout import Rollout

        if self.owns(run_dir):  # a router pod made again gets every worker back
            Rollout(run_dir, lambda text: None).reconcile()
        rec, view = KubernetesBackend(_say).status(run_dir)
        if as_json:
            data = {
                "name": run_dir.name,
                "on": self.name,
                "context": rec.context,
                "server": rec.server,
                "namespace": rec.namespace,
                "flavour": rec.flavour,
                "ready": view.ready,
                "workloads": view.workloads,
                "roles": [
                    {
                        "name": r.name,
                        "state": r.state,
                        "pod": r.pod.name if r.pod else r.pod_name,
                        "node": r.pod.node if r.pod else None,
                        "ip": r.pod.ip if r.pod else None,
                        "restarts": r.pod.restarts if r.pod else 0,
                        "reason": r.pod.reason if r.pod else None,
                    }
                    for r in view.roles
                ],
            }
            return json.dumps(data, indent=None if watch else 2)
        title = (
            f"{run_dir.name} on Kubernetes: {rec.server} (context {rec.context}, namespace "
            f"{rec.namespace}, {rec.flavour}){'' if view.ready else ' - not ready'}"
        )
        table = Table("role", "state", "pod", "node", "address", "restarts", "reason", title=title)
        for r in view.roles:
            pod = r.pod
            table.add_row(
                r.name,
                r.state,
                pod.name if pod else (r.pod_name or "-"),
                (pod.node if pod else None) or "-",
                (pod.ip if pod else None) or "-",
                str(pod.restarts if pod else 0),
                (pod.reason if pod and r.state != "ready" else None) or "",
            )
        return table

    def listener_owners(self, record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
        return lambda role: None  # the roles run in pods: no pid here to look at

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        """The last lines of each role's pod, read through the API server (pods/log); with `follow`, the
        new ones as they come until the deployment is taken down."""
        from .backend import KubernetesBackend

        if follow:

            def line(role: str, text: str) -> None:
                printer.line(role, text)
                printer.flush()

            KubernetesBackend(_say).follow_logs(run_dir, roles, lines, line)
            return
        for role, text in KubernetesBackend(_say).logs(run_dir, roles, lines):
            for one in text:
                printer.line(role, one)
        printer.flush()

    def add_instance(
        self,
        run_dir: RunDir,
        role: str,
        say: Say = print,
        why: str = "",
        allow_downtime: bool = False,
        by_file: bool = False,
    ) -> str:
        from .rollout import Rollout

        return Rollout(run_dir, say).add(role)

    def scale_role(
        self,
        run_dir: RunDir,
        role: str,
        replicas: int,
        say: Say = print,
        why: str = "",
        drain_timeout: float | None = None,
        allow_downtime: bool = False,
    ) -> dict:
        from .rollout import Rollout

        return Rollout(run_dir, say, drain_timeout).scale(role, replicas)

    def remove_instance(
        self,
        run_dir: RunDir,
        instance: str,
        say: Say = print,
        why: str = "",
        drain_timeout: float | None = None,
        allow_downtime: bool = False,
        by_file: bool = False,
    ) -> dict:
        from .rollout import Rollout

        return Rollout(run_dir, say, drain_timeout).remove(instance)

    def restart_instance(
        self,
        run_dir: RunDir,
        instance: str,
        say: Say = print,
        why: str = "",
        allow_downtime: bool = False,
        drain_timeout: float | None = None,
        relaunch: bool = False,
    ) -> dict:
        from .rollout import Rollout

        return Rollout(run_dir, say, drain_timeout).restart(instance)

    def adopt(
        self,
        run_dir: RunDir,
        source: str,
        sets: tuple[str, ...],
        say: Say = print,
        environ: Mapping[str, str] | None = None,
        sha256: str | None = None,
    ) -> dict:
        name = run_dir.name
        raise NotSupported(
            f"changing {name} by an edited file while it runs on Kubernetes is not supported yet",
            fix=f"`muse-launch down {name}`, then `up --on k8s` the file again",
        )
