"""The one seam between the commands and where a deployment runs (beside commands/, above the backends): this
host, a SLURM job, or a Kubernetes cluster. The commands (muse_launch/commands/) talk to a Backend only; a
capability written above it (status, logs, smoke, scale, rolling restart, `up FILE`, bench) is written once
for every backend. What it takes and returns is in backend_types.py; a change is a typed value (change.py).

A backend subclasses Backend and overrides what it does; the rest says NotSupported, naming what to do
instead. What it can do beyond up, down, status and logs it declares in `capabilities`, and the commands
ask for that, never probe for methods.

- `name`: how state.json's `backend` field names it; the backend that brings a deployment up writes it.
- `bring_up(loaded, request, console, claim)`: start the checked plan; returns the exit code (0 ready, or
  stopped cleanly in the foreground; 1 a role failed; 128+N on signal N). `claim(run_dir)` runs once the
  name is held: the other backends refuse it while their deployment of it runs, else forget it.
- `release(run_dir)`: what `claim` asks of this backend before another one takes the name.
- `stop(run_dir, grace)`: stop it in reverse dependency order; a DownReport says what is left (nothing,
  when `clean`). It must work from what the run directory holds when state.json is damaged.
- `observe(record)`: the record corrected by what this backend sees now (a role that died unseen shows
  failed); `status(run_dir, client)`: the deployment as it sees it now, each role's health included, as a
  DeploymentView that render_status.py draws (a table or JSON) for every backend alike.
- `listener_owners(record, run_dir)`: for each role, the process whose listener must answer its port (this
  host sees its roles' processes); `nobody` where the roles run elsewhere (SLURM's nodes, Kubernetes' pods).
- `print_logs(run_dir, roles, lines, follow, printer)`: each role's last lines, and with `follow` the new
  ones until the deployment stops (Ctrl-C: KeyboardInterrupt); the printer hides secrets and escapes.
- `change(run_dir, change, say)` (Capability.CHANGES): one change of the running deployment, made while it
  serves, one at a time: an AddInstance, RemoveInstance, RestartInstance, ScaleRole or Adopt (change.py
  says what each promises). `say` gets its progress lines. Returns what it measured (JSON-able).
- `held(run_dir, what, say)` (Capability.LEASES): a block under which several changes are one, refused
  to any other change meanwhile; a file adopted under it stands once the block ends committed.
- `plan_as_started(run_dir, loaded, rehearse)` (Capability.MOVES_PLAN): the file's plan as this backend
  runs it (moved onto a SLURM job's nodes), for `up FILE`'s difference.

A deployment's backend is the one its record names; where state.json cannot be read, the one whose own
files are in the run directory (`owns`), else the local host.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

from muse_launch.backend_types import Capability, DeploymentView, DownReport, Held, OwnerOf, Say, nobody
from muse_launch.errors import NotSupported

if TYPE_CHECKING:  # each command imports what it runs: `--help` and `down` of nothing load none of these
    import httpx
    from rich.console import Console

    from muse_launch.change import Change
    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.plan.spec import Plan
    from muse_launch.rundir.logs import RolePrinter
    from muse_launch.rundir.state import DeploymentRecord, RunDir


class Backend:
    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # the flags of `up` that only this backend takes (UpRequest.flags), and why the others do not apply
    flags: ClassVar[tuple[str, ...]] = ()
    not_here: ClassVar[str] = ""

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def owns(self, run_dir: RunDir) -> bool:
        return False

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        raise NotSupported(f"`up --on {self.name}` is not supported")

    def release(self, run_dir: RunDir) -> None:
        """Nothing to forget by default."""

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        raise NotSupported(f"`down` of a deployment on {self.name} is not supported")

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        return record

    def status(self, run_dir: RunDir, client: httpx.Client) -> DeploymentView:
        raise NotSupported(f"`status` of a deployment on {self.name} is not supported")

    def listener_owners(self, record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
        return nobody

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        raise NotSupported(f"`logs` of a deployment on {self.name} is not supported")

    def change(self, run_dir: RunDir, change: Change, say: Say = print) -> dict[str, Any]:
        from muse_launch.change import describe

        raise NotSupported(
            f"{describe(change)}: changing a deployment on {self.name} while it runs is not supported",
            fix=f"edit the file, then `muse-launch down {run_dir.name}` and `up` it again",
        )

    def held(self, run_dir: RunDir, what: str, say: Say = print) -> AbstractContextManager[Held]:
        """A block that holds nothing where the backend makes each change on its own."""

        return nullcontext(Held())

    def plan_as_started(self, run_dir: RunDir, loaded: LoadedPlan, rehearse: bool) -> Plan:
        return loaded.plan
