"""The command side of the run-time changes a supervisor makes (supervise/changes.py), written once for
every backend whose supervisor takes them: this host (its control socket) and a SLURM batch host (request
files relayed to that socket). A backend gives `_request(run_dir, op, args, say)`, its way to the
supervisor; the Backend protocol's add_instance, remove_instance and restart_instance are these.

A change made of several requests (a rolling restart, `up FILE`'s adopt and steps) runs them under one
lease (`held`): no other change is served between two of them, and a file adopted under it stands only if
the lease ends committed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from muse_launch.errors import RuntimeFailure, UserError
from muse_launch.rundir.state import RunDir

Say = Callable[[str], None]


@dataclass
class Held:
    """A lease on the supervisor's changes; `commit` says whether what was done under it stands."""

    commit: bool = False


class SupervisedChanges:
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

    def add_instance(
        self,
        run_dir: RunDir,
        role: str,
        say: Say = print,
        why: str = "",
        allow_downtime: bool = False,
        by_file: bool = False,
    ) -> str:
        """One more instance of `role`, placed by the file's rules, ready, wired and registered with its
        routers; returns its name."""
        args = {"role": role, "why": why, "allow_downtime": allow_downtime, "by_file": by_file}
        return str(self._ask(run_dir, "add", args, say).get("instance", ""))

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
        """`role` to `replicas` instances as one change, all or nothing: new instances placed before any
        starts, the highest replicas taken out first; returns the role's instances after."""
        args: dict = {"role": role, "replicas": replicas, "why": why, "allow_downtime": allow_downtime}
        if drain_timeout is not None:
            args["drain_timeout"] = drain_timeout
        return self._request(run_dir, "scale", args, say)

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
        """Out of its routers, drained (at most `drain_timeout` s), stopped; returns what it measured."""
        args: dict = {"instance": instance, "why": why, "allow_downtime": allow_downtime, "by_file": by_file}
        if drain_timeout is not None:
            args["drain_timeout"] = drain_timeout
        return self._ask(run_dir, "remove", args, say)

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
        """Replaced by a fresh process (generation + 1), with no failed request where capacity allows; alone
        and with no room for a surge instance, refused unless `allow_downtime`. Of the same spec, or with
        `relaunch` of the spec the adopted file (`adopt`) gives it now."""
        args: dict = {
            "instance": instance,
            "why": why,
            "allow_downtime": allow_downtime,
            "relaunch": relaunch,
        }
        if drain_timeout is not None:
            args["drain_timeout"] = drain_timeout
        return self._ask(run_dir, "restart", args, say)


def changes_held(backend: object, run_dir: RunDir, what: str, say: Say = print):
    """`backend.held(...)` where its supervisor takes leases; else a block that holds nothing (Kubernetes
    makes each change on its own)."""
    held = getattr(backend, "held", None)
    return held(run_dir, what, say) if callable(held) else nullcontext(Held())
