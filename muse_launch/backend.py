"""The one seam between the commands and where a deployment runs (beside commands/, above the backends): this
host, a SLURM job, or a
Kubernetes cluster. The commands (muse_launch/commands/) talk to a Backend only; a capability written
above it (status, logs, smoke, scale, rolling restart, bench) is written once for every backend.

A backend implements the Backend protocol below (structurally: it need not import this module):

- `name`: how state.json's `backend` field names it; the backend that brings a deployment up writes it.
- `bring_up(loaded, request, console, claim)`: start the checked plan; returns the exit code (0 ready, or
  stopped cleanly in the foreground; 1 a role failed; 128+N on signal N). `claim(run_dir)` runs once the
  name is held: the other backends refuse it while their deployment of it runs, else forget it.
- `release(run_dir)`: what `claim` asks of this backend before another one takes the name.
- `stop(run_dir, grace)`: stop it in reverse dependency order; a DownReport says what is left (nothing,
  when `clean`). It must work from what the run directory holds when state.json is damaged.
- `observe(record)`: the record corrected by what this backend sees now (a role that died unseen shows
  failed); `status(run_dir, client, as_json, watch)`: the status table or JSON, health and wiring included.
- `listener_owners(record, run_dir)`: for each role, the process whose listener must answer its port (this
  host sees its roles' processes); None where the roles run elsewhere (SLURM's nodes, Kubernetes' pods).
- `print_logs(run_dir, roles, lines, follow, printer)`: each role's last lines, and with `follow` the new
  ones until the deployment stops (Ctrl-C: KeyboardInterrupt); the printer hides secrets and escapes.
- `add_instance(run_dir, role, say, why, allow_downtime)`: one more instance of a worker role, placed by
  the file's rules, ready, wired and registered with its routers before it returns its name.
  `scale_role(run_dir, role, replicas, say, why, drain_timeout, allow_downtime)`: the role to that many
  instances as one change, all or nothing: each new one placed on GPUs and ports nobody holds before any
  starts (no room: refused, nothing started), a change that cannot complete undone and said so.
  `remove_instance(run_dir, instance, say, why, drain_timeout, allow_downtime)`: out of its routers, drained
  (its own in-flight count 0, at most `drain_timeout` seconds), stopped; returns what it measured.
  `restart_instance(run_dir, instance, say, why, allow_downtime, drain_timeout, relaunch)`: replaced by a
  fresh process (its generation + 1) with no failed request where capacity allows (another instance
  serves, or a surge instance does meanwhile); else refused unless `allow_downtime`. Of the same spec, or
  with `relaunch` of the one the adopted file gives it now.
  `adopt(run_dir, source, sets, say, environ, sha256)`: `up FILE` of the running deployment: later changes
  (placement, relaunch) are planned from this file, these --set values and the `${env:...}` values of
  `environ` (those `up` read now, not those its supervisor was started with); refused where the file's
  bytes are no longer those of `sha256` (the file `up` printed the difference of); nothing running is
  touched.
  A backend says what `up FILE` of a running deployment may ask of it: `relaunches = True` where
  `adopt` and `restart_instance(relaunch=True)` start the edited file's launches, `adds_roles = True`
  where `add_instance` also places a role the adopted file brings in.
  Each is one change, serialized with the others; `say` gets its progress lines, `why` names the larger
  change it is part of (`scale decode 1 -> 3`); `allow_downtime` accepts failed requests where a change
  cannot avoid them (a router that takes workers on its command line only is restarted with its new
  set). A backend that cannot make one raises errors.NotSupported naming what to do instead.

A deployment's backend is the one its record names; where state.json cannot be read, the one whose own
files are in the run directory (`owns`), else the local host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # each command imports what it runs: `--help` and `down` of nothing load none of these
    import httpx
    from rich.console import Console
    from rich.table import Table

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.local.down import DownReport
    from muse_launch.local.status import OwnerOf
    from muse_launch.rundir.logs import RolePrinter
    from muse_launch.rundir.state import DeploymentRecord, RunDir


Say = Callable[[str], None]


class Backend(Protocol):
    name: str

    def owns(self, run_dir: RunDir) -> bool: ...

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int: ...

    def release(self, run_dir: RunDir) -> None: ...

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport: ...

    def observe(self, record: DeploymentRecord) -> DeploymentRecord: ...

    def status(self, run_dir: RunDir, client: httpx.Client, as_json: bool, watch: bool) -> str | Table: ...

    def listener_owners(self, record: DeploymentRecord, run_dir: RunDir) -> OwnerOf: ...

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None: ...

    def add_instance(
        self,
        run_dir: RunDir,
        role: str,
        say: Say = print,
        why: str = "",
        allow_downtime: bool = False,
        by_file: bool = False,
    ) -> str: ...

    def scale_role(
        self,
        run_dir: RunDir,
        role: str,
        replicas: int,
        say: Say = print,
        why: str = "",
        drain_timeout: float | None = None,
        allow_downtime: bool = False,
    ) -> dict: ...

    def remove_instance(
        self,
        run_dir: RunDir,
        instance: str,
        say: Say = print,
        why: str = "",
        drain_timeout: float | None = None,
        allow_downtime: bool = False,
        by_file: bool = False,
    ) -> dict: ...

    def restart_instance(
        self,
        run_dir: RunDir,
        instance: str,
        say: Say = print,
        why: str = "",
        allow_downtime: bool = False,
        drain_timeout: float | None = None,
        relaunch: bool = False,
    ) -> dict: ...

    def adopt(
        self,
        run_dir: RunDir,
        source: str,
        sets: tuple[str, ...],
        say: Say = print,
        environ: Mapping[str, str] | None = None,
        sha256: str | None = None,
    ) -> dict: ...


def backends() -> dict[str, Backend]:
    from muse_launch.k8s.seam import K8sBackend
    from muse_launch.local.backend import LocalBackend
    from muse_launch.slurm.backend import SlurmBackend

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
