"""The backends muse-launch knows (each a Backend: muse_launch/backend.py), and which one owns a
deployment: the one its record names; where state.json cannot be read, the one whose own files are in the
run directory (`owns`), else the local host."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from muse_launch.backend import Backend
    from muse_launch.rundir.state import RunDir


def backends() -> dict[str, Backend]:
    from muse_launch.k8s.k8s_backend import K8sBackend
    from muse_launch.local.local_backend import LocalBackend
    from muse_launch.slurm.slurm_backend import SlurmBackend

    return {b.name: b for b in (LocalBackend(), SlurmBackend(), K8sBackend())}


def backend_named(name: str) -> Backend:
    """`up --on NAME` (no --on: this host)."""
    from muse_launch.errors import UsageError

    known = backends()
    if name not in known or name == "local":
        remote = [n for n in known if n != "local"]
        raise UsageError(f"--on {name}: unknown; one of: {', '.join(remote)}")
    return known[name]


def backend_of(run_dir: RunDir) -> Backend:
    """The backend that owns the deployment in `run_dir`."""
    from muse_launch.rundir.state import LOCAL, StateDamaged, read_state

    known = backends()
    try:
        record = read_state(run_dir)
    except StateDamaged:
        record = None
    if record is not None and record.backend:
        return known[record.backend]
    return next((b for b in known.values() if b.name != LOCAL and b.owns(run_dir)), known[LOCAL])


def claim_for(taker: str) -> Callable[[RunDir], None]:
    """What `taker` runs once it holds a name: every other backend releases it (or refuses)."""
    others = [b for b in backends().values() if b.name != taker]

    def claim(run_dir: RunDir) -> None:
        for backend in others:
            backend.release(run_dir)

    return claim
