"""`status`: the recorded state, corrected by what is alive now, plus each role's health now."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import httpx
from rich.table import Table
from rich.text import Text

from muse_launch.errors import UsageError
from muse_launch.host.gpus import GpuReader, gib
from muse_launch.local.gpus import role_gpu_memory
from muse_launch.local.progress import STATE_STYLES
from muse_launch.proc.identity import is_suspended
from muse_launch.proc.listeners import HostView, ListenerOwner
from muse_launch.proc.process import Marker
from muse_launch.rundir.decisions import describe
from muse_launch.rundir.lifecycle import SUSPENDED_REASON, RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord, RunDir
from muse_launch.supervise.probe import ReadinessCheck


def observed(record: DeploymentRecord) -> DeploymentRecord:
    """With its supervisor gone, a role whose process died was seen by no one: show it failed. A ready role
    stopped by SIGSTOP is shown unhealthy at once (the supervisor notices it within a tick)."""
    record = replace(
        record,
        roles=tuple(
            replace(r, state=RoleState.UNHEALTHY, reason=SUSPENDED_REASON)
            if r.state is RoleState.READY and r.process and r.process.find() and is_suspended(r.process.pid)
            else r
            for r in record.roles
        ),
    )
    if record.supervisor and record.supervisor.find():
        return record
    roles = tuple(
        replace(r, state=RoleState.FAILED, process=None, reason="died while no supervisor was watching")
        if r.live and (r.process is None or r.process.find() is None)
        else r
        for r in record.roles
    )
    # a change in progress is the supervisor's: with it gone (killed mid-change), none is in progress
    return replace(record, supervisor=None, roles=roles, change=None)


OwnerOf = Callable[[RoleRecord], ListenerOwner | None]  # whose listener a role's probe must find, if seen


def local_owners(record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
    """On this host a role's processes can be looked at: the listener that answers must be the role's own."""
    marker = Marker(record.name, str(run_dir.path))
    view = HostView()  # one look at the host's sockets and processes for all the roles: linear in them
    return lambda role: (
        ListenerOwner(role.process.pid, role.name, marker.env(role.name), role.cgroup, view=view)
        if role.process
        else None
    )


def health_now(
    record: DeploymentRecord, run_dir: RunDir, client: httpx.Client, owner_of: OwnerOf = lambda role: None
) -> dict[str, str | None]:
    """ "ok", or what the role's probe sees now; None for a role without a live process."""
    out: dict[str, str | None] = {}
    for role in record.roles:
        if role.process is None or not role.live:
            out[role.name] = None
            continue
        if role.process.find() and is_suspended(role.process.pid):  # its probe would only time out
            out[role.name] = "stopped (SIGSTOP)"
            continue
        check = ReadinessCheck(
            role.probe,
            role.probe_host,
            role.ports.get("http"),
            run_dir.log(role.name),
            client,
            owner_of(role),
        )
        out[role.name] = "ok" if check.check(alive_for=float("inf")) else check.last_seen
    return out


GpuMemory = Mapping[str, Mapping[int, int]]  # role -> GPU index -> bytes its processes hold


def gpu_memory_now(record: DeploymentRecord, read: GpuReader) -> GpuMemory | None:
    """None where the host's GPUs cannot be read, or the deployment plans none."""
    if not any(r.gpus for r in record.roles):
        return None
    view = read()
    return role_gpu_memory(record, view) if view.available else None


def status_json(
    record: DeploymentRecord,
    health: dict[str, str | None],
    versions: dict[str, str | None] | None = None,
    gpu_memory: GpuMemory | None = None,
    decisions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """docs/status-json.md's shape, each role with "health": "ok", "failing" or null, and its "gpu_memory"
    ({"total_bytes", "by_gpu": {index: bytes}}, null where the host's GPUs cannot be read); "versions": the
    installed release of each engine and router (null: not found here)."""
    out = record.status_dict()
    if decisions:
        out["autoscale_decisions"] = decisions  # the last lines of decisions.jsonl
    if versions is not None:
        out["versions"] = versions
    for role in out["roles"]:
        seen = health[role["name"]]
        role["health"] = None if seen is None else "ok" if seen == "ok" else "failing"
        held = gpu_memory.get(role["name"], {}) if gpu_memory is not None else None
        role["gpu_memory"] = (
            None
            if held is None
            else {"total_bytes": sum(held.values()), "by_gpu": {str(g): b for g, b in sorted(held.items())}}
        )
    return out


def since(iso: str | None) -> str:
    if iso is None:
        return "-"
    try:
        moment = datetime.fromisoformat(iso).astimezone()
    except (ValueError, OverflowError):  # the local zone's offset is a day or more: TZ=UTC+27
        raise UsageError(
            f"the local time zone (TZ={os.environ.get('TZ', '')!r}) is a day or more from UTC; "
            "times cannot be shown in it",
            fix="set TZ to a real zone: TZ=UTC, TZ=Europe/Berlin",
        ) from None
    age = int((datetime.now(moment.tzinfo) - moment).total_seconds())
    return (
        f"{moment:%H:%M:%S} ({age // 3600}h{age // 60 % 60:02d}m)"
        if age >= 3600
        else f"{moment:%H:%M:%S} ({age // 60}m{age % 60:02d}s)"
    )


def status_table(
    record: DeploymentRecord,
    health: dict[str, str | None],
    versions: dict[str, str | None] | None = None,
    gpu_memory: GpuMemory | None = None,
    decisions: list[dict[str, Any]] | None = None,
) -> Table:
    supervisor = f"supervisor pid {record.supervisor.pid}" if record.supervisor else "no supervisor running"
    wiring = "; ".join(f"{r.name}: {r.wiring_text}" for r in record.roles if r.wiring)
    installed = ", ".join(f"{e} {v or 'unknown'}" for e, v in versions.items()) if versions else ""
    caption = (
        "\n".join(
            c
            for c in (
                f"wiring: {wiring}" if wiring else "",
                f"installed: {installed}" if installed else "",
                *(f"autoscale: {describe(d)}" for d in (decisions or [])[-3:]),
            )
            if c
        )
        or None
    )
    table = Table(
        title=f"{record.name}: {record.shown_state} ({supervisor}; {record.source})"
        + (f"\nchanging: {record.change.what} (since {since(record.change.since)})" if record.change else ""),
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    columns = (
        "role",
        "kind",
        "state",
        "pid",
        "gpus",
        *(("gpu memory",) if gpu_memory is not None else ()),
        "url",
        "ready since",
        "restarts",
        "gen",
        "health now",
    )
    for column in columns:
        table.add_column(column)
    for role in record.roles:
        seen = health[role.name] or (role.reason if role.state is RoleState.FAILED else None)
        held = gpu_memory.get(role.name) if gpu_memory is not None else None
        memory = (f"{gib(sum(held.values()))} GiB" if held else "-",) if gpu_memory is not None else ()
        table.add_row(
            role.name,
            role.kind,
            Text(role.state.value, style=STATE_STYLES[role.state]),
            str(role.process.pid) if role.process else "-",
            ",".join(map(str, role.gpus)) or "-",
            *memory,
            role.url or "-",
            since(role.ready_at),
            role.restarts_text,
            str(role.generation),
            Text(seen or "-", style="green" if seen == "ok" else "red" if seen else "dim"),
        )
    return table
