"""The command side of the run-time changes a supervisor makes (supervise/change_executor.py), written once
for
every backend whose supervisor takes them: this host (its control socket) and a SLURM batch host (request
files relayed to that socket). A backend gives `_request(run_dir, op, args, say)`, its way to the
supervisor; the Backend's `change` and `held` are these.

A change made of several requests (a rolling restart, `up FILE`'s adopt and steps) runs them under one
lease (`held`): no other change is served between two of them, and a file adopted under it stands only if
the lease ends committed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from muse_launch.backend import Backend
from muse_launch.backend_types import Capability, Held, Say
from muse_launch.change import Change, ScaleRole, to_wire
from muse_launch.errors import RuntimeFailure, UserError
from muse_launch.rundir.state import RunDir


class SupervisedChanges(Backend):
    """A backend whose supervisor makes the changes (this host, a SLURM batch host)."""

    capabilities = frozenset({Capability.CHANGES, Capability.LEASES, Capability.RELAUNCH})
    lease: str | None = None  # while `held`: every request carries it

    def _request(self, run_dir: RunDir, op: str, args: dict[str, Any], say: Say) -> dict[str, Any]:
        raise NotImplementedError

    def _ask(self, run_dir: RunDir, op: str, args: dict[str, Any], say: Say) -> dict[str, Any]:
        return self._request(run_dir, op, {**args, "lease": self.lease} if self.lease else args, say)

    @contextmanager
    def held(self, run_dir: RunDir, what: str, say: Say = print) -> Iterator[Held]:
        """The supervisor's changes held for this one (`what` is what a refused client and `status` are
        told) until the block ends; refused at once where another change runs."""
        token = self._request(run_dir, "hold", {"what": what}, say).get("lease")
        if not isinstance(token, str):
            raise RuntimeFailure("the supervisor gave no lease for the change")
        held = Held()
        self.lease = token
        try:
            yield held
        finally:
            self.lease = None
            try:
                self._request(run_dir, "release", {"lease": token, "commit": held.commit}, say)
            except UserError:
                pass  # the supervisor ends it by itself, uncommitted, once none of its requests came a while

    def change(self, run_dir: RunDir, change: Change, say: Say = print) -> dict[str, Any]:
        """One change, as a request to the supervisor; a scale is one request, never held (it is one
        change whole); the others go under the lease `held` gives, if any."""
        op, args = to_wire(change)
        if isinstance(change, ScaleRole):
            return self._request(run_dir, op, args, say)
        return self._ask(run_dir, op, args, say)
