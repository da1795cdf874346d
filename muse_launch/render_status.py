"""`status` drawn once for every backend: a DeploymentView (backend_types.py), as the backend saw it, as a
table or as JSON (docs/status-json.md). Backends say what they see; none of them draws."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from muse_launch.backend_types import DeploymentView, RoleView
from muse_launch.errors import UsageError
from muse_launch.rundir.decisions import describe
from muse_launch.rundir.lifecycle import RoleState

STATE_STYLES = {
    RoleState.PENDING: "dim",
    RoleState.STARTING: "yellow",
    RoleState.READY: "green",
    RoleState.UNHEALTHY: "bold yellow",
    RoleState.FAILED: "bold red",
    RoleState.RESTARTING: "magenta",
    RoleState.STOPPING: "yellow",
    RoleState.STOPPED: "dim",
}


def style_of(state: str) -> str:
    """A role's state as `status`, `up` and `top` colour it; a state no RoleState names (a pod's): none."""
    return STATE_STYLES[RoleState(state)] if state in RoleState._value2member_map_ else ""


def since(iso: str | None) -> str:
    """A moment as the local time and how long ago: `14:02:11 (3m05s)`."""
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


def health_of(role: RoleView) -> str | None:
    """`status --json`'s health: "ok", "failing", or null where there is nothing to ask."""
    return None if role.health is None else "ok" if role.health == "ok" else "failing"


def status_json(view: DeploymentView, decisions: Sequence[Mapping[str, Any]] = ()) -> dict:
    out = {**view.json, "roles": [{**r.json, "health": health_of(r)} for r in view.roles]}
    if decisions:
        out["autoscale_decisions"] = list(decisions)  # the last lines of decisions.jsonl
    return out


def render(
    view: DeploymentView, as_json: bool, watch: bool = False, decisions: Sequence[Mapping[str, Any]] = ()
) -> str | Table:
    """`--json`: one document (one line a refresh under --watch); else the table. `decisions`: the
    autoscaler's last ones (rundir/decisions.py), whichever backend runs it."""
    if as_json:
        return json.dumps(status_json(view, decisions), indent=None if watch else 2)
    return status_table(view, decisions)


def status_table(view: DeploymentView, decisions: Sequence[Mapping[str, Any]] = ()) -> Table:
    title = f"{view.name}: {view.state} ({view.about})"
    if view.change:
        what, began = view.change
        title += f"\nchanging: {what} (since {since(began)})"
    notes = [*view.notes, *(f"autoscale: {describe(d)}" for d in decisions[-3:])]
    table = Table(title=title, title_justify="left", caption="\n".join(notes) or None, caption_justify="left")
    columns = ("role", "kind", "state", view.where, "gpus", *(("gpu memory",) * view.gpu_memory))
    for column in (*columns, "url", "ready since", "restarts", "gen", "health now"):
        table.add_column(column)
    for role in view.roles:
        seen = role.health or role.reason
        table.add_row(
            role.name,
            role.kind,
            Text(role.state, style=style_of(role.state)),
            role.where,
            role.gpus,
            *((role.gpu_memory or "-",) * view.gpu_memory),
            role.url,
            since(role.ready_at),
            role.restarts,
            role.generation,
            Text(seen or "-", style="green" if seen == "ok" else "red" if seen else "dim"),
        )
    return table
