"""Role and deployment states, with the transitions a supervisor may make (after supervisor's states.py)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

LOCAL, SLURM, K8S = "local", "slurm", "k8s"
BACKEND_NAMES = (LOCAL, SLURM, K8S)  # the backends muse_launch/backends.py knows, as state.json names them


class RoleState(str, Enum):
    PENDING = "pending"
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"  # ready, then stopped (SIGSTOP): alive but serving nothing until SIGCONT
    FAILED = "failed"
    RESTARTING = "restarting"
    STOPPING = "stopping"  # its stop signal sent; SIGKILL at the end of its grace
    STOPPED = "stopped"


ALLOWED = {
    RoleState.PENDING: {RoleState.STARTING, RoleState.FAILED, RoleState.STOPPED},  # failed: could not exec
    RoleState.STARTING: {RoleState.READY, RoleState.FAILED, RoleState.STOPPING, RoleState.STOPPED},
    RoleState.READY: {
        RoleState.UNHEALTHY,
        RoleState.RESTARTING,
        RoleState.FAILED,
        RoleState.STOPPING,
        RoleState.STOPPED,
    },
    RoleState.UNHEALTHY: {
        RoleState.READY,
        RoleState.RESTARTING,
        RoleState.FAILED,
        RoleState.STOPPING,
        RoleState.STOPPED,
    },
    RoleState.RESTARTING: {RoleState.READY, RoleState.FAILED, RoleState.STOPPING, RoleState.STOPPED},
    RoleState.STOPPING: {RoleState.STOPPED},
    RoleState.FAILED: {RoleState.STOPPED},  # a failed role's leftovers are stopped without leaving FAILED
    RoleState.STOPPED: set(),
}

# States in which the role has (or is about to have) a process of its own.
LIVE_STATES = frozenset(
    {RoleState.STARTING, RoleState.READY, RoleState.UNHEALTHY, RoleState.RESTARTING, RoleState.STOPPING}
)


SUSPENDED_REASON = "stopped (SIGSTOP): serves nothing until SIGCONT"


class InvalidTransition(RuntimeError):
    pass


def transition(current: RoleState, target: RoleState) -> RoleState:
    if target not in ALLOWED[current]:
        raise InvalidTransition(f"a role cannot go from {current.value} to {target.value}")
    return target


class DeploymentState(str, Enum):
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"  # ready, then stopped (SIGSTOP): alive but serving nothing until SIGCONT
    DEGRADED = "degraded"
    STOPPING = "stopping"
    STOPPED = "stopped"


def deployment_state(roles: Iterable[RoleState], wired: bool = True) -> DeploymentState:
    """`wired`: every router lists all its workers, every language worker all its encoders
    (supervise/wiring.py)."""
    states = list(roles)
    if not any(s in LIVE_STATES for s in states):
        return DeploymentState.STOPPED
    if any(s is RoleState.STOPPING for s in states):
        return DeploymentState.STOPPING
    if all(s is RoleState.READY for s in states):
        return DeploymentState.READY if wired else DeploymentState.STARTING
    if any(
        s in (RoleState.FAILED, RoleState.UNHEALTHY, RoleState.RESTARTING, RoleState.STOPPED) for s in states
    ):
        return DeploymentState.DEGRADED
    return DeploymentState.STARTING
