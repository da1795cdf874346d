"""The command side of the run-time changes a supervisor makes (supervise/changes.py), written once for
every backend whose supervisor takes them: this host (its control socket) and a SLURM batch host (request
files relayed to that socket). A backend gives `_request(run_dir, op, args, say)`, its way to the
supervisor; the Backend protocol's add_instance, remove_instance and restart_instance are these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from muse_launch.rundir.state import RunDir

Say = Callable[[str], None]


class SupervisedChanges:
    def _request(self, run_dir: RunDir, op: str, args: dict[str, Any], say: Say) -> dict[str, Any]:
        raise NotImplementedError

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
        return str(self._request(run_dir, "add", args, say).get("instance", ""))

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
        return self._request(run_dir, "remove", args, say)

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
        return self._request(run_dir, "restart", args, say)
