"""Start-up progress: a live table on a terminal (role, state, elapsed, last log line), one plain
line per change otherwise. Both render DeploymentRecords, whether from the supervisor in this
process or from state.json written by a detached one."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from muse_launch.rundir.lifecycle import STATE_STYLES, RoleState  # noqa: F401  STATE_STYLES: its users import it here
from muse_launch.rundir.logs import last_lines
from muse_launch.rundir.state import DeploymentRecord, RoleRecord, RunDir

# The elapsed column already says when; the narrow log column is for what.
LOG_TIMESTAMP = re.compile(r"^(\x1b\[[0-9;]*m)*\[?\d{4}-\d\d-\d\d[ T][\d:.,]+Z?\]?(\x1b\[[0-9;]*m)*\s*")


def seconds_between(start: str | None, end: str | None = None) -> float | None:
    if start is None:
        return None
    finish = datetime.fromisoformat(end).timestamp() if end else time.time()
    return finish - datetime.fromisoformat(start).timestamp()


def elapsed(role: RoleRecord) -> str:
    seconds = seconds_between(role.started_at, role.ready_at)
    return "-" if seconds is None or role.state is RoleState.PENDING else f"{seconds:.1f}s"


class PlainProgress:
    """A line for each role state change."""

    def __init__(self, out: TextIO, shown: DeploymentRecord | None = None):
        self.out = out
        self.seen = {r.name: self._key(r) for r in shown.roles} if shown else {}

    @staticmethod
    def _key(role: RoleRecord) -> tuple:
        return role.state, role.restarts, role.wiring

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.out.flush()

    def update(self, record: DeploymentRecord) -> None:
        width = max(len(r.name) for r in record.roles)
        for role in record.roles:
            key = self._key(role)
            unseen = (RoleState.PENDING, 0, role.wiring)  # a role still pending is no news
            previous = self.seen.get(role.name, unseen)
            if previous == key:
                continue
            self.seen[role.name] = key
            if previous[0] is RoleState.READY is role.state and role.restarts < previous[1]:
                self.out.write(
                    f"{role.name:<{width}}  {role.state.value:<10}  restart count reset after "
                    f"{role.reset_after:g}s ready\n"
                )
                continue
            if role.state is RoleState.READY and not role.wired:  # "ready" beside 0/1 read as a failure
                self.out.write(
                    f"{role.name:<{width}}  {'wiring':<10}  answers after {elapsed(role)}"
                    + (f"  {role.url}" if role.url else "")
                    + f"  lists {role.wiring_text} so far; ready once it lists them all\n"
                )
                continue
            detail = {
                RoleState.STARTING: f"pid {role.process.pid}" if role.process else "",
                RoleState.READY: f"after {elapsed(role)}"
                + (f"  {role.url}" if role.url else "")
                + (f"  lists {role.wiring_text}" if role.wiring else ""),
                RoleState.RESTARTING: f"restart {role.restarts}: {role.reason}"
                if role.restarts
                else f"{role.reason}",
                RoleState.FAILED: role.reason or "",
                RoleState.UNHEALTHY: role.reason or "",
            }.get(role.state, "")
            self.out.write(f"{role.name:<{width}}  {role.state.value:<10}  {detail}".rstrip() + "\n")
        self.out.flush()


class LiveProgress:
    """A table redrawn in place, four times a second."""

    def __init__(self, console: Console, run_dir: RunDir, record: DeploymentRecord):
        self.run_dir = run_dir
        self.record = record
        self.live = Live(console=console, get_renderable=self._table, refresh_per_second=4)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def update(self, record: DeploymentRecord) -> None:
        self.record = record

    def _table(self) -> Table:
        table = Table(
            title=f"{self.record.name}: {self.record.state.value}", title_justify="left", expand=True
        )
        for column, options in (
            ("role", {}),
            ("state", {}),
            ("elapsed", {"justify": "right"}),
            ("pid", {}),
            ("last log line", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"}),
        ):
            table.add_column(column, **options)
        for role in self.record.roles:
            last = self._last(role)
            last_text = Text.from_ansi(LOG_TIMESTAMP.sub("", last, count=1))  # not markup; keeps its colours
            table.add_row(
                role.name,
                Text(role.state.value, style=STATE_STYLES[role.state]),
                elapsed(role),
                str(role.process.pid) if role.process else "-",
                last_text,
            )
        return table

    def _last(self, role: RoleRecord) -> str:
        if role.state is RoleState.FAILED and role.reason:
            return role.reason
        if role.state is RoleState.READY and not role.wired:
            return f"waiting until it lists them all: {role.wiring_text}"
        try:
            return "".join(last_lines(self.run_dir.log(role.name), 1))
        except OSError as exc:  # a link planted in place of its log: say so, never read through it
            return str(exc)
