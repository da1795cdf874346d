"""Helpers for the rehearsal tests: the topologies' fixed ports, checked free before and closed after,
and the check that nothing of a deployment outlives `down`.

The files in topologies/ use fixed ports (30001, 8000, 8998, 29000, ...), so these tests bring them
up one after another and refuse to start (failing, with the holder's name) while a port is busy.
"""

from __future__ import annotations

import json
import socket

import pytest
from harness import Deployment

from muse_launch.addresses import connect_host
from muse_launch.plan.spec import Plan
from muse_launch.proc.ports import can_bind, port_holder
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.logs import last_lines

READY_AFTER = "rehearse={ready_after: 0.3}"  # a top-level `rehearse:` for every file (none has one)


def planned_addresses(plan: Plan) -> list[tuple[str, int, str]]:
    """(address, port, "role kind") of every port the plan binds, on the address its role binds."""
    return [
        (spec.bind, port, f"{spec.name} {kind}") for spec in plan.specs for kind, port in spec.ports.items()
    ]


def require_free(plan: Plan) -> None:
    busy = [
        f"{host}:{port} ({what}) is held by {port_holder(port, host)}"
        for host, port, what in planned_addresses(plan)
        if not can_bind(host, port)
    ]
    if busy:
        pytest.fail(
            f"{plan.name} uses fixed ports and some are busy, so it cannot be rehearsed now "
            f"(stop whatever holds them, or wait for another run to finish):\n  " + "\n  ".join(busy),
            pytrace=False,
        )


def listening(plan: Plan) -> list[str]:
    out = []
    for host, port, what in planned_addresses(plan):
        try:
            socket.create_connection((connect_host(host), port), timeout=0.5).close()
            out.append(f"{host}:{port} ({what})")
        except OSError:
            pass
    return out


def recorded_processes(d: Deployment) -> dict[ProcessRef, str]:
    """Every process the state file names: roles and supervisor. sglang-router sets its process title,
    which wipes /proc/PID/environ, so its marker cannot be seen: the recorded process can."""
    state = json.loads((d.run_dir / "state.json").read_text())
    found = {ProcessRef.from_json(r["pid"], r): r["name"] for r in state["roles"] if r.get("pid")}
    if state.get("supervisor_pid"):
        found[ProcessRef.from_json(state["supervisor_pid"], state, "supervisor_")] = "supervisor"
    return found


def still_alive(processes: dict[ProcessRef, str]) -> list[str]:
    """Those still running (the same process: pid and start time)."""
    return [f"{what} (pid {ref.pid})" for ref, what in processes.items() if ref.find()]


def assert_nothing_left(d: Deployment, plan: Plan, processes: dict[ProcessRef, str]) -> None:
    leftovers = [f"pid {p.pid} ({' '.join(p.cmdline())[:80]})" for p in d.alive()] + still_alive(processes)
    assert not leftovers, f"{plan.name}: alive after down: {leftovers}"
    assert not listening(plan), f"{plan.name}: still listening after down: {listening(plan)}"


def tails(d: Deployment, n: int = 12) -> str:
    """The last lines of every log of the deployment, for a failure message."""
    logs = sorted((d.run_dir / "logs").glob("*.log")) + [d.run_dir / "supervisor.log"]
    return "\n".join(f"--- {p.name}\n" + "\n".join(last_lines(p, n)) for p in logs if p.exists())


def tear_down(d: Deployment, processes: dict[ProcessRef, str]) -> None:
    """After a failed test: `down`, then SIGKILL whatever is left, so the next topology finds its ports
    free."""
    if (d.run_dir / "state.json").exists():
        d.cli("down", d.name, "--grace", "1")
    d.kill_leftovers()
    for ref in processes:
        if proc := ref.find():
            proc.kill()


def sim_roles(plan: Plan) -> list[str]:
    return [s.name for s in plan.specs if "muse_launch.sim" in s.launcher]
