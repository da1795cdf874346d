"""The CLI's entry points for deployments on Kubernetes, so that run/commands.py only dispatches."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from muse_launch.errors import UsageError
from muse_launch.run.state import RunDir

from . import record as records

if TYPE_CHECKING:
    from rich.table import Table

    from muse_launch.run.state import DeploymentRecord

TARGET = "k8s"


def is_k8s(run_dir: RunDir) -> bool:
    """Up on Kubernetes (its record says so, and `down` has not taken it down since)."""
    if not records.exists(run_dir):
        return False
    rec = records.read(run_dir)
    return rec is not None and rec.down_at is None


def refuse_if_on_k8s(name: str) -> None:
    from muse_launch.errors import RuntimeFailure

    run_dir = RunDir.of(name)
    if is_k8s(run_dir):
        rec = records.read(run_dir)
        raise RuntimeFailure(
            f"deployment {name!r} is up on Kubernetes ({rec.server}, namespace {rec.namespace})",
            fix=f"`muse-launch down {name}` first",
        )


def up_on_k8s(
    file: Path,
    say: Callable[[str], None],
    redact: Callable[[str], str],
    images: list[str],
    one_host_only: dict[str, object],
    **options,
) -> int:
    from .backend import K8sOptions, KubernetesBackend

    if given := [flag for flag, value in one_host_only.items() if value]:
        raise UsageError(f"{', '.join(given)}: not with --on {TARGET}")
    chosen = {}
    for value in images:
        role, sep, name = value.partition("=")
        chosen[role if sep else ""] = name if sep else value
    return KubernetesBackend(say).up(file, K8sOptions(images=chosen, **options), redact)


def down_on_k8s(run_dir: RunDir, grace: float | None, say: Callable[[str], None]):
    from .backend import KubernetesBackend

    return KubernetesBackend(say).down(run_dir, grace)


def k8s_status(run_dir: RunDir, as_json: bool, watch: bool) -> str | Table | None:
    """None for a deployment that is not on Kubernetes."""
    if not is_k8s(run_dir):
        return None
    from rich.table import Table

    from .backend import KubernetesBackend

    rec, view = KubernetesBackend(lambda _: None).status(run_dir)
    if as_json:
        data = {
            "name": run_dir.name,
            "on": "k8s",
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
    table = Table(
        "role",
        "state",
        "pod",
        "node",
        "address",
        "restarts",
        "reason",
        title=f"{run_dir.name} on Kubernetes: {rec.server} (context {rec.context}, namespace "
        f"{rec.namespace}, {rec.flavour}){'' if view.ready else ' - not ready'}",
    )
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


def k8s_logs(
    run_dir: RunDir, roles: list[str], lines: int, line: Callable[[str, str], None], follow: bool = False
) -> bool:
    """False for a deployment that is not on Kubernetes."""
    if not is_k8s(run_dir):
        return False
    if follow:
        raise UsageError(
            "logs --follow: not yet for a deployment on Kubernetes",
            fix="`muse-launch logs NAME` prints the last lines; `kubectl logs -f POD` follows one pod",
        )
    from .backend import KubernetesBackend

    rec = records.read(run_dir)
    known = [r["name"] for r in rec.roles] if rec else []
    unknown = [r for r in roles if r not in known]
    if unknown:
        raise UsageError(f"{run_dir.name} has no role {', '.join(unknown)}; roles: {', '.join(known)}")
    for role, text in KubernetesBackend(lambda _: None).logs(run_dir, roles, lines):
        for one in text:
            line(role, one)
    return True


def k8s_smoke_record(run_dir: RunDir, record: DeploymentRecord) -> DeploymentRecord | None:
    """The record with the cluster's view: each role's state, and its URL at its pod (the router's: at its
    Service's endpoint). None for a deployment that is not on Kubernetes."""
    if not is_k8s(run_dir):
        return None
    from muse_launch.run.lifecycle import RoleState

    from .backend import KubernetesBackend

    backend = KubernetesBackend(lambda _: None)
    rec, view = backend.status(run_dir)
    urls = backend.role_urls(run_dir)
    entry = backend.entry_url(run_dir) if rec.entry else None
    states = {r.name: r.state for r in view.roles}
    roles = []
    for role in record.roles:
        url = entry if role.kind == "router" and entry else urls.get(role.name, role.url)
        state = RoleState.READY if states.get(role.name) == "ready" else RoleState.STARTING
        roles.append(replace(role, url=url, state=state, process=None))
    return replace(record, roles=tuple(roles), supervisor=None)
