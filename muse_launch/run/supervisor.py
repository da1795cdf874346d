"""The supervisor: starts each role once everything it depends on is ready (so roles of one wave
start together), fails fast when a starting role exits, restarts a role that dies after ready,
and stops everything in reverse dependency order.

One loop, no threads (after honcho's manager). Its seams are parameters: the processes (spawn
and stop), the HTTP client the probes use, and the clock; `on_change` receives every new record;
`ports_taken` says which of a role's ports another process holds once the role has exited.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Protocol

import httpx

from muse_launch.plan.spec import LaunchSpec, Plan, RestartPolicyKind
from muse_launch.run.lifecycle import RoleState, transition
from muse_launch.run.probe import ReadinessCheck
from muse_launch.run.process import (
    Marker,
    RoleProcess,
    SpawnError,
    StopReport,
    StopTarget,
    describe_exit,
    spawn_role,
    stop_roles,
)
from muse_launch.run.state import DeploymentRecord, RunDir, now_iso

IDLE_TICK = 0.25  # how soon a death after ready is noticed; costs a few syscalls per role
STARTING_TICK = 0.1  # how soon a starting role's exit is noticed
RESTART_BACKOFF_FIRST = 1.0
RESTART_BACKOFF_MAX = 30.0


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def wait(self, wakeup: threading.Event, seconds: float) -> None:
        """Sleep for `seconds`, or less if `wakeup` is set (by a signal handler)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, wakeup: threading.Event, seconds: float) -> None:
        wakeup.wait(seconds)


class Processes(Protocol):
    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> RoleProcess: ...

    def stop(self, targets: list[StopTarget], kill_now: threading.Event) -> StopReport: ...


@dataclass(frozen=True)
class LocalProcesses:
    """Real processes: one session each, logs in the run directory, found again by their marker."""

    marker: Marker
    run_dir: RunDir

    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> RoleProcess:
        log = self.run_dir.log(spec.name)
        if restart_note:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as f:
                f.write(f"--- muse-launch: {restart_note} ---\n")
        return spawn_role(spec, self.marker, log, append=restart_note is not None)

    def stop(self, targets: list[StopTarget], kill_now: threading.Event) -> StopReport:
        return stop_roles(targets, self.marker, kill_now)


class Outcome(Enum):
    READY = "ready"  # every role answered its probe
    FAILED = "failed"  # a role failed (at start, or after ready under --fail-fast)
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: the caller stops everything
    RELEASED = "released"  # `down` took over: leave the roles to it


@dataclass
class RoleRun:
    """The supervisor's live handle on one role; what outlives it is in the RoleRecord."""

    spec: LaunchSpec
    process: RoleProcess | None = None
    check: ReadinessCheck | None = None
    started_at: float = 0.0
    next_probe_at: float = 0.0
    restart_at: float | None = None


class Supervisor:
    def __init__(
        self, plan: Plan, record: DeploymentRecord, run_dir: RunDir, processes: Processes, client: httpx.Client,
        clock: Clock = SystemClock(), on_change: Callable[[DeploymentRecord], None] = lambda record: None,
        ports_taken: Callable[[LaunchSpec, DeploymentRecord], list[str]] = lambda spec, record: [],
    ):
        self.plan = plan
        self.record = record
        self.run_dir = run_dir
        self.processes = processes
        self.client = client
        self.clock = clock
        self.on_change = on_change
        self.ports_taken = ports_taken
        self.runs = {s.name: RoleRun(s) for s in plan.specs}
        self.stop_requested = threading.Event()  # first Ctrl-C / SIGTERM
        self.kill_now = threading.Event()  # second Ctrl-C: no more grace
        self.released = threading.Event()  # SIGUSR1 from `down`
        self.wakeup = threading.Event()  # cuts the loop's sleep short when one of the above is set
        self.failed_role: str | None = None

    def request_stop(self) -> None:
        """Ctrl-C: the first stops gracefully, a second cuts every grace period short."""
        if self.stop_requested.is_set():
            self.kill_now.set()
        self.stop_requested.set()
        self.wakeup.set()

    def release(self) -> None:
        """`down` takes over: stop supervising, leave the roles running for it to stop."""
        self.released.set()
        self.wakeup.set()

    def sign_off(self) -> None:
        """The supervisor is going away: from now on no one watches these roles."""
        self.record = replace(self.record, supervisor=None)
        self.on_change(self.record)

    def state_of(self, name: str) -> RoleState:
        return self.record.role(name).state

    def _update(self, name: str, **changes) -> None:
        current = self.record.role(name)
        if "state" in changes and changes["state"] is not current.state:
            transition(current.state, changes["state"])
        self.record = self.record.with_role(replace(current, **changes))
        self.on_change(self.record)

    def start(self) -> Outcome:
        """Start roles as their dependencies become ready; return once all are ready or one failed."""
        while True:
            if interrupted := self._interruption():
                return interrupted
            for run in self.runs.values():
                deps_ready = all(self.state_of(d) is RoleState.READY for d in run.spec.depends_on if d in self.runs)
                if self.state_of(run.spec.name) is RoleState.PENDING and deps_ready:
                    if error := self._spawn(run, restart_note=None):
                        return self._fail(run, error)
                if self.state_of(run.spec.name) is RoleState.STARTING and (reason := self._watch_starting(run)):
                    return self._fail(run, reason)
                if self.state_of(run.spec.name) is RoleState.READY and (code := run.process.poll()) is not None:
                    return self._fail(run, f"{describe_exit(code)} after it was ready, while others were starting")
            if all(self.state_of(n) is RoleState.READY for n in self.runs):
                return Outcome.READY
            self.clock.wait(self.wakeup, self._wait(STARTING_TICK))

    def supervise(self, fail_fast: bool, on_tick: Callable[[], None] = lambda: None) -> Outcome:
        """After ready: bring dead roles back under their restart policy, until told to stop."""
        while True:
            if interrupted := self._interruption():
                return interrupted
            for run in self.runs.values():
                name = run.spec.name
                state = self.state_of(name)
                if state is RoleState.READY and (code := run.process.poll()) is not None:
                    if fail_fast:
                        return self._fail(run, f"{describe_exit(code)} after it was ready")
                    self._role_down(run, describe_exit(code), failed=code != 0)
                elif state is RoleState.RESTARTING and run.process is None:
                    if self.clock.monotonic() >= run.restart_at:
                        record = self.record.role(name)
                        self._update(name, restarts=record.restarts + 1)
                        note = f"restart {record.restarts + 1} of {run.spec.restart.max} after: {record.reason}"
                        if error := self._spawn(run, restart_note=note):
                            self._role_down(run, error, failed=True)
                elif state is RoleState.RESTARTING and (reason := self._watch_starting(run)):
                    self._role_down(run, reason, failed=True)
            on_tick()
            self.clock.wait(self.wakeup, self._wait(IDLE_TICK))

    def stop(self) -> StopReport:
        """Stop every started role, last wave first; roles of one wave stop together."""
        killed: list[str] = []
        survivors: list[str] = []
        for wave in self.plan.stop_waves():
            records = [self.record.role(n) for n in wave]
            report = self.processes.stop([r.stop_target() for r in records if r.process], self.kill_now)
            killed += report.killed
            survivors += report.survivors
            for record in records:
                if (run := self.runs[record.name]).process:
                    run.process.poll()  # reap it
                    run.process = None
                state = RoleState.FAILED if record.state is RoleState.FAILED else RoleState.STOPPED
                self._update(record.name, state=state, process=None, ready_at=None)
        return StopReport(tuple(killed), tuple(survivors))

    def _interruption(self) -> Outcome | None:
        if self.released.is_set():
            return Outcome.RELEASED
        if self.stop_requested.is_set():
            return Outcome.INTERRUPTED
        return None

    def _spawn(self, run: RoleRun, restart_note: str | None) -> str | None:
        """Start the role's process; returns why it could not be started at all."""
        spec = run.spec
        try:
            run.process = self.processes.spawn(spec, restart_note)
        except SpawnError as e:
            run.process = None
            return str(e)
        run.started_at = self.clock.monotonic()
        run.next_probe_at = run.started_at + spec.probe.interval
        run.check = ReadinessCheck(spec.probe, self.record.role(spec.name).probe_host, spec.ports.get("http"),
                                   self.run_dir.log(spec.name), self.client)
        self._update(spec.name, state=RoleState.RESTARTING if restart_note else RoleState.STARTING,
                     process=run.process.ref, started_at=now_iso(self.clock.time()), ready_at=None)
        return None

    def _fail(self, run: RoleRun, reason: str) -> Outcome:
        self.failed_role = run.spec.name
        self._update(run.spec.name, state=RoleState.FAILED, reason=reason)
        return Outcome.FAILED

    def _watch_starting(self, run: RoleRun) -> str | None:
        """None while it may still become ready; else why it failed."""
        if (code := run.process.poll()) is not None:
            # A port it needed taken meanwhile (by another role, say) is the likely reason: say who has it.
            return "; ".join([f"{describe_exit(code)} before it was ready", *self.ports_taken(run.spec, self.record)])
        now = self.clock.monotonic()
        if now >= run.next_probe_at:
            run.next_probe_at = now + run.spec.probe.interval
            if run.check.check(alive_for=now - run.started_at):
                self._update(run.spec.name, state=RoleState.READY, ready_at=now_iso(self.clock.time()), reason=None)
                return None
        if now - run.started_at > run.spec.probe.timeout:
            return f"not ready after {run.spec.probe.timeout:g}s ({run.check.last_seen})"
        return None

    def _role_down(self, run: RoleRun, reason: str, failed: bool) -> None:
        """Its main process exited (or never became ready): clear what it left, then restart or give up."""
        record = self.record.role(run.spec.name)
        if record.process:
            # Children it left (an engine's scheduler) still hold its GPUs and ports: kill them now.
            self.processes.stop([StopTarget(record.name, record.process, "SIGKILL", 0.0)], self.kill_now)
        if run.process:
            run.process.poll()
        run.process = None
        policy = run.spec.restart
        if failed and policy.policy is RestartPolicyKind.ON_FAILURE and record.restarts < policy.max:
            backoff = min(RESTART_BACKOFF_MAX, RESTART_BACKOFF_FIRST * 2 ** record.restarts)
            run.restart_at = self.clock.monotonic() + backoff
            self._update(record.name, state=RoleState.RESTARTING, reason=reason, process=None, ready_at=None)
        else:
            gave_up = f"; gave up after {record.restarts} restarts" if failed and record.restarts else ""
            state = RoleState.FAILED if failed else RoleState.STOPPED
            self._update(record.name, state=state, reason=reason + gave_up, process=None)

    def _wait(self, tick: float) -> float:
        """Sleep until the next probe is due, but no longer than `tick`."""
        now = self.clock.monotonic()
        due = [r.next_probe_at for r in self.runs.values()
               if self.state_of(r.spec.name) in (RoleState.STARTING, RoleState.RESTARTING) and r.process]
        return max(0.005, min([tick, *(d - now for d in due)]))

