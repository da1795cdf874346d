"""The supervisor: starts each role once everything it depends on is ready (so roles of one wave
start together), fails fast when a starting role exits, restarts a role that dies after ready,
and stops everything in reverse dependency order.

One loop that never blocks (after honcho's manager and supervisor's process.py): starting,
stopping and restart backoff are states with deadlines that the loop checks each round; probes
run on a small thread pool, each within its HTTP time budget, so a role that accepts a connection
and never answers delays no other role; signal handlers only set a flag and wake the loop.
Its seams are parameters: the processes (spawn, and a stop to poll), the HTTP client and the pool
the probes use, and the clock; `on_change` receives every new record; `ports_taken` says which of
a role's ports another process holds once the role has exited; `redact` hides ${env:...} values in
every reason it records (a program path, a command line); `tend` runs each round (the log caps).

A role's restart count starts again from 0 once it has been ready for its `restart.reset_after`: a
crash a week is not a crash loop, and must not use up the restarts the deployment gets for its life.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum

import httpx

from muse_launch.engines import ENGINES, ROUTER_ENGINES
from muse_launch.engines.metrics import ENGINE_METRICS, METRICS_PATH
from muse_launch.errors import RuntimeFailure
from muse_launch.plan.spec import LaunchSpec, Plan, RestartPolicyKind
from muse_launch.proc import cgroups
from muse_launch.proc.process import (
    RoleProcess,
    SpawnError,
    StopReport,
    StopTarget,
    describe_exit,
    stop_in_waves,
)
from muse_launch.rundir.lifecycle import SUSPENDED_REASON, RoleState, transition
from muse_launch.rundir.state import Change, DeploymentRecord, RoleRecord, RunDir, now_iso
from muse_launch.supervise.liveness import LIVENESS_INTERVAL, ROUTER_LIVENESS_PATH, Liveness, look
from muse_launch.supervise.probe import HTTP_TIMEOUT, NO_ANSWER_YET, ReadinessCheck
from muse_launch.supervise.seams import Clock, Processes, Stopping, SystemClock, Wakeup
from muse_launch.supervise.wiring import ROUTED_KINDS, Wire, WiringCheck, WiringResult, wiring_checks
from muse_launch.supervise.workers import adds_workers, deregister, reconcile, register

IDLE_TICK = 0.25  # how soon a death after ready is noticed; costs a few syscalls per role
STARTING_TICK = 0.1  # how soon a starting role's exit is noticed
STOPPING_TICK = 0.02  # how soon a stopped role's exit is noticed
# The first restart after a role was ready goes at once: its capacity is back within its own start time (a
# worker's, the refused window of a router); a second within `reset_after` waits 1 s, then 2, 4... 30.
RESTART_BACKOFF_FIRST = 1.0
RESTART_BACKOFF_MAX = 30.0
SERVING = (RoleState.READY, RoleState.UNHEALTHY)  # became ready; UNHEALTHY: stopped by SIGSTOP since

SYSTEM_CLOCK = SystemClock()  # stateless: one serves every supervisor


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
    probe: Future | None = None  # the probe in flight: at most one per role
    probe_sent_at: float = 0.0
    restart_at: float | None = None  # RESTARTING: when its backoff ends
    ready_since: float | None = None  # monotonic: when its current process became ready
    stopping: Stopping | None = None  # its processes being stopped (STOPPING, or leftovers of a dead one)
    wiring: WiringCheck | None = None  # the peers it must list before the deployment is ready
    wired: bool = True
    unlisted: tuple[Wire, ...] = ()  # the peers its list lacked at the last look
    retiring: bool = False  # being stopped for good by a change (`scale` down, a replacement)
    wiring_failed: str | None = None  # why its wiring is not complete after its probe's timeout
    wiring_since: float = 0.0  # monotonic: when its set last changed (a change's registration); its wiring
    # has its probe's timeout from then, or from its start, whichever is later
    reconciling: Future | None = None  # a router's worker set being made the desired one, in the pool
    next_reconcile_at: float = 0.0
    reconcile_due: bool = False  # back after a restart: it lists its command-line workers, not the set
    live: Liveness | None = None  # a ready engine worker's signs of life (supervise/liveness.py)
    looking: Future | None = None  # its look at /metrics in flight
    next_look_at: float = 0.0
    out: bool = False  # taken out of the routers that list it (dead or hung); put back once ready again


def _with_spec(plan: Plan, spec: LaunchSpec) -> Plan:
    """The plan with one more instance, in the wave after the last of its dependencies."""
    wave_of = {n: i for i, wave in enumerate(plan.waves) for n in wave}
    index = 1 + max((wave_of[d] for d in spec.depends_on if d in wave_of), default=-1)
    waves = [list(w) for w in plan.waves] + [[]]
    waves[index].append(spec.name)
    return Plan(plan.name, (*plan.specs, spec), tuple(tuple(w) for w in waves if w))


def probe_pool(plan: Plan) -> ThreadPoolExecutor:
    """One probe in flight per role; room for the stale ones a restart leaves behind."""
    return ThreadPoolExecutor(max_workers=2 * len(plan.specs) + 2, thread_name_prefix="probe")


@dataclass(frozen=True)
class _Watch:
    """A change's condition on the supervisor's roles, and the future it waits on (`Supervisor.when`)."""

    done: Callable[[], bool]
    failed: Callable[[], str | None]
    future: Future


@dataclass(frozen=True)
class _RoleStop:
    """A role's stop in the wave-stop: once it reports, the role is marked stopped."""

    run: RoleRun
    stopped: Callable[[RoleRun], None]

    def poll(self, now: float, kill_now: bool) -> StopReport | None:
        report = self.run.stopping.poll(now, kill_now)
        if report is not None:
            self.run.stopping = None
            self.stopped(self.run)
        return report


class Supervisor:
    def __init__(
        self,
        plan: Plan,
        record: DeploymentRecord,
        run_dir: RunDir,
        processes: Processes,
        client: httpx.Client,
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[DeploymentRecord], None] = lambda record: None,
        ports_taken: Callable[[LaunchSpec, DeploymentRecord], list[str]] = lambda spec, record: [],
        probes: Executor | None = None,
        start_after: dict[str, tuple[str, ...]] | None = None,
        redact: Callable[[str], str] = lambda text: text,
        tend: Callable[[], None] = lambda: None,
    ):
        """`start_after`: role -> the roles it waits for before it starts (default: its depends_on, wave by
        wave; `start: overlap` passes fewer). Stopping always goes by the plan's waves, reversed."""
        self.plan = plan
        self.record = record
        self.run_dir = run_dir
        self.processes = processes
        self.client = client
        self.clock = clock
        self.on_change = on_change
        self.ports_taken = ports_taken
        self.probes = probes or probe_pool(plan)
        self.redactions = [
            redact
        ]  # the first file's, then each adopted file's (supervise/change_executor.py)
        self.tend = tend
        self.runs = {s.name: RoleRun(s) for s in plan.specs}
        self.start_after = {
            s.name: tuple(d for d in (start_after or {}).get(s.name, s.depends_on) if d in self.runs)
            for s in plan.specs
        }
        for name, check in wiring_checks(plan, {r.name: r.probe_host for r in record.roles}).items():
            self.runs[name].wiring, self.runs[name].wired, self.runs[name].unlisted = (
                check,
                False,
                check.wires,
            )
        self.wakeup = Wakeup()  # cuts the loop's sleep short: a signal, a probe's answer
        self.stops = 0  # Ctrl-C / SIGTERM received: the first stops gracefully, a second kills
        self.released = False  # SIGUSR1 from `down`
        self.failed_role: str | None = None
        self.leftovers = StopReport()  # what clearing dead roles' leftover processes had to SIGKILL
        self.calls: queue.SimpleQueue = queue.SimpleQueue()  # changes' steps, run by the loop (`call`)
        self.asked: queue.SimpleQueue = queue.SimpleQueue()  # changes' conditions, new (`when`)
        self.watches: list[_Watch] = []  # changes' conditions the loop looks at each round (`when`)

    # Called from signal handlers: set a flag, wake the loop, nothing else.
    def request_stop(self) -> None:
        """Ctrl-C: the first stops gracefully, a second cuts every grace period short."""
        self.stops += 1
        self.wakeup.set()

    def release(self) -> None:
        """`down` takes over: stop supervising, leave the roles running for it to stop."""
        self.released = True
        self.wakeup.set()

    @property
    def stop_requested(self) -> bool:
        return self.stops > 0

    @property
    def kill_now(self) -> bool:
        return self.stops > 1

    def sign_off(self) -> None:
        """The supervisor is going away: from now on no one watches these roles."""
        self.record = replace(self.record, supervisor=None, change=None)  # its change goes with it
        self.on_change(self.record)

    def close(self) -> None:
        """Abandon probes in flight (each ends within its HTTP budget) and close the wake-up pipe."""
        self.probes.shutdown(wait=False, cancel_futures=True)
        self.wakeup.close()

    def state_of(self, name: str) -> RoleState:
        return self.record.role(name).state

    def _update(self, name: str, **changes) -> None:
        current = self.record.role(name)
        if "state" in changes and changes["state"] is not current.state:
            transition(current.state, changes["state"])
        if changes.get("reason"):
            changes["reason"] = self.redact(changes["reason"])
        self.record = self.record.with_role(replace(current, **changes))
        self.on_change(self.record)

    def start(self) -> Outcome:
        """Start roles as those they wait for become ready; return once all are ready and wired, or one
        failed."""
        while True:
            if interrupted := self._interruption():
                return interrupted
            for run in self.runs.values():
                deps_ready = all(self.state_of(d) is RoleState.READY for d in self.start_after[run.spec.name])
                if self.state_of(run.spec.name) is RoleState.PENDING and deps_ready:
                    if error := self._spawn(run, restart_note=None):
                        return self._fail(run, error)
                if self.state_of(run.spec.name) is RoleState.STARTING and (
                    reason := self._watch_starting(run)
                ):
                    return self._fail(run, reason)
                if self.state_of(run.spec.name) is RoleState.READY:
                    if (code := run.process.poll()) is not None:
                        return self._fail(
                            run, f"{describe_exit(code)} after it was ready, while others were starting"
                        )
                    if not run.wired and (reason := self._watch_wiring(run)):
                        return self._fail(run, reason)
            if all(self.state_of(n) is RoleState.READY and r.wired for n, r in self.runs.items()):
                return Outcome.READY
            self.tend()
            self.clock.wait(self.wakeup, self._wait(STARTING_TICK))

    def supervise(self, fail_fast: bool, on_tick: Callable[[], None] = lambda: None) -> Outcome:
        """After ready: bring dead roles back under their restart policy, until told to stop."""
        while True:
            if interrupted := self._interruption():
                return interrupted
            self._run_calls()
            for run in list(self.runs.values()):
                name = run.spec.name
                state = self.state_of(name)
                if run.retiring:
                    self._watch_retiring(run)
                    continue
                if run.stopping:
                    self._clear_leftovers(run)
                if state in SERVING and (code := run.process.poll()) is not None:
                    if fail_fast:
                        return self._fail(run, f"{describe_exit(code)} after it was ready")
                    self._role_down(run, describe_exit(code), failed=code != 0)
                elif state in SERVING and run.live is not None and self._watch_alive(run, state):
                    pass  # a hang seen, or its end: it left (or rejoined) its routers, or was stopped
                elif (
                    state in SERVING
                    and run.live is None
                    and run.process.suspended() != (state is RoleState.UNHEALTHY)
                ):
                    # SIGSTOP (or SIGCONT since): its probe would only time out; say why it serves nothing.
                    suspended = state is RoleState.READY
                    self._update(
                        name,
                        state=RoleState.UNHEALTHY if suspended else RoleState.READY,
                        reason=SUSPENDED_REASON if suspended else None,
                    )
                elif (
                    state is RoleState.READY
                    and run.ready_since is not None
                    and self.record.role(name).restarts
                    and self.clock.monotonic() - run.ready_since >= run.spec.restart.reset_after
                ):
                    self._update(name, restarts=0)  # healthy long enough: a later crash is no crash loop
                elif state is RoleState.RESTARTING and run.process is None:
                    if run.stopping is None and self.clock.monotonic() >= run.restart_at:
                        record = self.record.role(name)
                        self._update(name, restarts=record.restarts + 1)
                        note = (
                            f"restart {record.restarts + 1} of {run.spec.restart.max} after: {record.reason}"
                        )
                        if error := self._spawn(run, restart_note=note):
                            self._role_down(run, error, failed=True)
                elif state is RoleState.RESTARTING and (reason := self._watch_starting(run)):
                    self._role_down(run, reason, failed=True)
                elif state is RoleState.RESTARTING and self.state_of(name) is RoleState.READY and run.wiring:
                    run.wired, run.wiring_failed = False, None  # back after a restart: its wiring again
                    run.reconcile_due = True
                elif state is RoleState.STARTING and (reason := self._watch_starting(run)):
                    self._update(name, state=RoleState.FAILED, reason=reason)  # added by a change: it says
                elif state is RoleState.READY and not run.wired and run.wiring_failed is None:
                    self._tend_wiring(run)
                if run.out and self.state_of(name) is RoleState.READY:
                    self._put_back(run)
            self._settle_watches()
            on_tick()
            self.tend()
            self.clock.wait(self.wakeup, self._wait(IDLE_TICK))

    def run(
        self,
        fail_fast: bool,
        on_ready: Callable[[float], None],
        on_tick: Callable[[], None] = lambda: None,
    ) -> Outcome:
        """The one runner, on this host and on a SLURM batch host: start every wave; once all are ready and
        wired, `on_ready(seconds since the start)`, then supervise until a stop is asked or a role fails.
        What follows is the caller's: `wind_down()`, or leave the roles to `down` (RELEASED) or --keep."""
        started = self.clock.monotonic()
        outcome = self.start()
        if outcome is Outcome.READY:
            on_ready(self.clock.monotonic() - started)
            outcome = self.supervise(fail_fast, on_tick=on_tick)
        self._abandon_changes()
        return outcome

    def wind_down(self) -> StopReport:
        """Stop every role in reverse waves, then sign off; each role's emptied cgroup is removed (the
        supervision loop tried once, never waiting)."""
        report = self.stop()
        self.sign_off()
        for role in self.record.roles:
            cgroups.remove(role.cgroup)
        return report

    # ---- changes of the running deployment: each step runs in the loop, through `call` ----------------

    def redact(self, text: str) -> str:
        """`text` with every file's `${env:...}` values hidden (the first file's, and each adopted one's)."""
        for hide in self.redactions:
            text = hide(text)
        return text

    def call(self, step: Callable[[], object], timeout: float = 60.0) -> object:
        """Run `step` in the supervisor's loop, the one thread that changes its roles; returns its result.
        Called from a change's thread (supervise/change_executor.py)."""
        done: Future = Future()
        self.calls.put((step, done))
        self.wakeup.set()
        return done.result(timeout)

    def when(self, done: Callable[[], bool], failed: Callable[[], str | None] = lambda: None) -> Future:
        """A future the loop completes once `done()` holds (with None), or `failed()` says why it never
        will (with that reason); each is looked at once a round, in the loop, after its roles were watched.
        Called from a change's thread, which waits on it (and cancels it when it stops waiting)."""
        watch = _Watch(done, failed, Future())
        self.asked.put(watch)
        self.wakeup.set()
        return watch.future

    def _settle_watches(self) -> None:
        while True:
            try:
                self.watches.append(self.asked.get_nowait())
            except queue.Empty:
                break
        pending = []
        for watch in self.watches:
            if watch.future.cancelled():
                continue
            try:
                if watch.done():
                    watch.future.set_result(None)
                elif reason := watch.failed():
                    watch.future.set_result(reason)
                else:
                    pending.append(watch)
            except BaseException as exc:  # noqa: BLE001  handed to the change that waits
                watch.future.set_exception(exc)
        self.watches = pending

    def _abandon_changes(self) -> None:
        """Supervising ended: a change that waits on the loop is told so at once, not at its timeout."""
        self._settle_watches()
        gone = RuntimeFailure(f"{self.plan.name}: its supervisor stopped supervising while the change ran")
        for watch in self.watches:
            if not watch.future.done():
                watch.future.set_exception(gone)
        self.watches = []
        while True:
            try:
                _, done = self.calls.get_nowait()
            except queue.Empty:
                return
            if not done.done():
                done.set_exception(gone)

    def _run_calls(self) -> None:
        while True:
            try:
                step, done = self.calls.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(step())
            except BaseException as exc:  # noqa: BLE001  handed to the change that asked
                done.set_exception(exc)

    def set_change(self, what: str | None) -> None:
        change = Change(what, now_iso(self.clock.time())) if what else None
        self.record = replace(self.record, change=change)
        self.on_change(self.record)

    def admit(self, spec: LaunchSpec, record: RoleRecord, wiring: WiringCheck | None) -> str | None:
        """A new instance (more replicas, or one replacing another): started now, watched like the others;
        returns why it could not be started at all."""
        self.runs[spec.name] = run = RoleRun(spec)
        self.start_after[spec.name] = ()
        self.plan = _with_spec(self.plan, spec)
        roles = list(self.record.roles)
        siblings = [i for i, r in enumerate(roles) if self._role_of(r.name) == spec.role]
        roles.insert(siblings[-1] + 1 if siblings else len(roles), record)
        self.record = replace(self.record, roles=tuple(roles), stop_waves=self.plan.stop_waves())
        if wiring:
            run.wiring, run.wired, run.unlisted = wiring, False, wiring.wires
        if error := self._spawn(run, restart_note=None):
            self._update(spec.name, state=RoleState.FAILED, reason=error)
        return error

    def retire(self, name: str) -> None:
        """Stop an instance for good (its stop signal, SIGKILL after its grace); once it is gone it leaves
        the plan and the record."""
        run, record = self.runs[name], self.record.role(name)
        run.retiring, run.probe = True, None
        if record.process and run.stopping is None:
            run.stopping = self.processes.stop([record.stop_target()], self.clock.monotonic())
        if record.state in (RoleState.STARTING, *SERVING, RoleState.RESTARTING):
            self._update(name, state=RoleState.STOPPING)

    def rewire(self, name: str, wires: tuple[Wire, ...]) -> Future | None:
        """The peers a role must list from now on (a router's workers); returns the re-registration in
        flight, which the caller waits for before it removes a worker from the router itself."""
        run = self.runs[name]
        run.wiring = replace(run.wiring, wires=wires)
        run.wired, run.wiring_failed, run.unlisted = False, None, wires
        run.wiring_since = self.clock.monotonic()  # its timeout counts from now, not from its start
        self._update(name, wiring=run.wiring.counts(()))
        return run.reconciling

    def _role_of(self, name: str) -> str | None:
        return self.runs[name].spec.role if name in self.runs else None

    def _watch_retiring(self, run: RoleRun) -> None:
        name = run.spec.name
        if run.stopping is not None:
            report = run.stopping.poll(self.clock.monotonic(), self.kill_now)
            if report is None:
                return
            self.leftovers = StopReport(
                self.leftovers.killed + report.killed, self.leftovers.survivors + report.survivors
            )
            run.stopping = None
        if run.process:
            run.process.poll()  # reap it
        cgroups.remove(self.record.role(name).cgroup)
        del self.runs[name], self.start_after[name]
        self.plan = Plan(
            self.plan.name,
            tuple(s for s in self.plan.specs if s.name != name),
            tuple(w for w in (tuple(n for n in wave if n != name) for wave in self.plan.waves) if w),
        )
        self.record = replace(
            self.record,
            roles=tuple(r for r in self.record.roles if r.name != name),
            stop_waves=self.plan.stop_waves(),
        )
        self.on_change(self.record)

    def _tend_wiring(self, run: RoleRun) -> None:
        """A serving role whose list lacks peers: look again; a router that takes workers at run time is
        given the ones it lacks (a restarted router keeps only its command-line workers)."""
        now = self.clock.monotonic()
        if run.reconciling is not None and run.reconciling.done():
            run.reconciling = None
        if (
            (run.unlisted or run.reconcile_due)
            and run.reconciling is None
            and now >= run.next_reconcile_at
            and run.spec.engine in ENGINES
            and adds_workers(run.spec.engine)
            and all(self.state_of(w.peer) is RoleState.READY for w in run.wiring.wires if w.peer in self.runs)
        ):
            run.next_reconcile_at = now + max(run.spec.probe.interval, 0.5)
            run.reconcile_due = False
            run.reconciling = self.probes.submit(reconcile, self.client, run.wiring)
            run.reconciling.add_done_callback(lambda _: self.wakeup.set())
        if reason := self._watch_wiring(run):
            run.wiring_failed = reason
            self._update(run.spec.name, reason=reason)

    def stop(self) -> StopReport:
        """Stop every started role, last wave first; roles of one wave stop together, each through
        STOPPING (its stop signal sent, SIGKILL at the end of its grace or on a second Ctrl-C)."""

        def begin(wave: tuple[str, ...]) -> list[_RoleStop]:
            for name in wave:
                self._begin_stop(self.runs[name])
            return [_RoleStop(self.runs[n], self._stopped) for n in wave if self.runs[n].stopping]

        report = stop_in_waves(
            self.plan.stop_waves(),
            begin,
            lambda: self.clock.wait(self.wakeup, STOPPING_TICK),
            self.clock.monotonic,
            lambda: self.kill_now,
        )
        return StopReport(self.leftovers.killed + report.killed, self.leftovers.survivors + report.survivors)

    def _begin_stop(self, run: RoleRun) -> None:
        record = self.record.role(run.spec.name)
        run.probe = None
        if record.process and run.stopping is None:
            run.stopping = self.processes.stop([record.stop_target()], self.clock.monotonic())
        if run.stopping is None:
            self._stopped(run)
        elif record.state in (RoleState.STARTING, *SERVING, RoleState.RESTARTING):
            self._update(record.name, state=RoleState.STOPPING)

    def _stopped(self, run: RoleRun) -> None:
        if run.process:
            run.process.poll()  # reap it
            run.process = None
        state = RoleState.FAILED if self.state_of(run.spec.name) is RoleState.FAILED else RoleState.STOPPED
        self._update(run.spec.name, state=state, process=None, ready_at=None)

    def _interruption(self) -> Outcome | None:
        if self.released:
            return Outcome.RELEASED
        if self.stop_requested:
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
        run.probe = None
        run.ready_since = None
        owner = self.processes.listener_owner(spec, run.process)  # whose listener answers, where that is seen
        run.check = ReadinessCheck(
            spec.probe,
            self.record.role(spec.name).probe_host,
            spec.ports.get("http"),
            self.run_dir.log(spec.name),
            self.client,
            owner,
        )
        self._update(
            spec.name,
            state=RoleState.RESTARTING if restart_note else RoleState.STARTING,
            process=run.process.ref,
            cgroup=run.process.cgroup,
            started_at=now_iso(self.clock.time()),
            ready_at=None,
        )
        return None

    def _fail(self, run: RoleRun, reason: str) -> Outcome:
        self.failed_role = run.spec.name
        self._update(run.spec.name, state=RoleState.FAILED, reason=reason)
        return Outcome.FAILED

    def _watch_starting(self, run: RoleRun) -> str | None:
        """None while it may still become ready; else why it failed. Never waits for a probe."""
        if (code := run.process.poll()) is not None:
            # A port it needed taken meanwhile (by another role, say) is the likely reason: say who has it.
            return "; ".join(
                [f"{describe_exit(code)} before it was ready", *self.ports_taken(run.spec, self.record)]
            )
        now = self.clock.monotonic()
        if run.probe is None and now >= run.next_probe_at:
            run.next_probe_at = now + run.spec.probe.interval
            run.probe, run.probe_sent_at = self.probes.submit(run.check.check, now - run.started_at), now
            run.probe.add_done_callback(lambda _: self.wakeup.set())
        if run.probe is not None and run.probe.done():
            probe, run.probe = run.probe, None
            if self._answered(run, probe):
                run.next_probe_at = now  # its wiring, if it has any to show, is looked at right away
                run.ready_since = now
                if self._watched(run.spec):
                    run.live, run.looking, run.next_look_at = Liveness(now, now), None, now
                self._update(
                    run.spec.name, state=RoleState.READY, ready_at=now_iso(self.clock.time()), reason=None
                )
                return None
        if now - run.started_at > run.spec.probe.timeout:
            seen = run.check.last_seen  # what the last probe that came back saw, unless one is overdue
            if run.probe is not None and (now - run.probe_sent_at >= HTTP_TIMEOUT or seen == NO_ANSWER_YET):
                seen = f"no answer to the probe sent {now - run.probe_sent_at:.1f}s ago"
            return f"not ready after {run.spec.probe.timeout:g}s ({seen})"
        return None

    def _watch_wiring(self, run: RoleRun) -> str | None:
        """A ready role that must list its peers: look at its list every probe interval, in the pool, until
        it holds them all; None while it may still, else why not (at its probe's timeout)."""
        now = self.clock.monotonic()
        # Only a look taken once every peer serves counts: a language worker lists its encoders from the
        # start,
        # and may evict a slow one for a while (it takes it back within one of its probe intervals).
        peers_ready = all(
            self.state_of(w.peer) is RoleState.READY for w in run.wiring.wires if w.peer in self.runs
        )
        if not peers_ready:
            run.next_probe_at = max(
                run.next_probe_at, now + run.spec.probe.interval
            )  # no need to wake before
            return None  # a peer that never gets ready fails on its own probe's timeout
        if run.probe is None and now >= run.next_probe_at:
            run.next_probe_at = now + run.spec.probe.interval
            run.probe, run.probe_sent_at = self.probes.submit(run.wiring.check, self.client), now
            run.probe.add_done_callback(lambda _: self.wakeup.set())
        if run.probe is not None and run.probe.done():
            probe, run.probe = run.probe, None
            result = (
                probe.result()
                if not probe.cancelled() and probe.exception() is None
                else WiringResult(run.wiring.wires, f"wiring check error: {probe.exception()!r}")
            )
            run.check.last_seen = result.seen
            run.unlisted = result.missing
            counts = run.wiring.counts(result.missing)
            if counts != self.record.role(run.spec.name).wiring:
                self._update(run.spec.name, wiring=counts)
            if not result.missing:
                run.wired = True
                return None
        if now - max(run.started_at, run.wiring_since) > run.spec.probe.timeout:
            return run.wiring.failure(run.unlisted, run.spec.probe.timeout)
        return None

    @staticmethod
    def _answered(run: RoleRun, probe: Future) -> bool:
        if probe.cancelled():
            return False
        if (error := probe.exception()) is not None:
            run.check.last_seen = f"probe error: {type(error).__name__}: {error}"
            return False
        return bool(probe.result())

    def _role_down(self, run: RoleRun, reason: str, failed: bool) -> None:
        """Its main process exited (or never became ready): clear what it left, then restart or give up."""
        record = self.record.role(run.spec.name)
        self._take_out(run)  # before the routers' health checks notice: no request is sent to it meanwhile
        run.live, run.looking = None, None
        if record.process:
            # Children it left (an engine's scheduler) still hold its GPUs and ports: kill them now; the
            # restart waits until they are gone.
            run.stopping = self.processes.stop(
                [StopTarget(record.name, record.process, "SIGKILL", 0.0)], self.clock.monotonic()
            )
        if run.process:
            run.process.poll()
        run.process = None
        run.probe = None
        policy = run.spec.restart
        if failed and policy.policy is RestartPolicyKind.ON_FAILURE and record.restarts < policy.max:
            backoff = (
                min(RESTART_BACKOFF_MAX, RESTART_BACKOFF_FIRST * 2 ** (record.restarts - 1))
                if record.restarts
                else 0.0
            )
            run.restart_at = self.clock.monotonic() + backoff
            self._update(record.name, state=RoleState.RESTARTING, reason=reason, process=None, ready_at=None)
        else:
            gave_up = f"; gave up after {record.restarts} restarts" if failed and record.restarts else ""
            state = RoleState.FAILED if failed else RoleState.STOPPED
            self._update(record.name, state=state, reason=reason + gave_up, process=None)
        if run.stopping:
            self._clear_leftovers(run)

    @staticmethod
    def _watched(spec: LaunchSpec) -> bool:
        """An engine worker a router sends requests to, or a router: its hang is watched for after ready."""
        if not spec.ports.get("http"):
            return False
        return spec.engine in ROUTER_ENGINES or (spec.kind in ROUTED_KINDS and spec.engine in ENGINE_METRICS)

    def _watch_alive(self, run: RoleRun, state: RoleState) -> bool:
        """A ready engine worker: look at it every LIVENESS_INTERVAL; silent (or stopped by SIGSTOP) past its
        `unresponsive_after`, or running requests without progress past `stalled_after`, it leaves its
        routers; still so at `hung_after` it is stopped and restarted. True where it changed something."""
        now, live, policy = self.clock.monotonic(), run.live, run.spec.restart
        if run.looking is not None and run.looking.done():
            looking, run.looking = run.looking, None
            if not looking.cancelled() and looking.exception() is None:
                live.saw(looking.result(), now)
        suspended = run.process.suspended()
        if run.looking is None and now >= run.next_look_at and not suspended:
            run.next_look_at = now + LIVENESS_INTERVAL
            host, port = self.record.role(run.spec.name).probe_host, run.spec.ports["http"]
            path = ROUTER_LIVENESS_PATH if run.spec.engine in ROUTER_ENGINES else METRICS_PATH
            run.looking = self.probes.submit(look, self.client, run.spec.engine, host, port, path)
            run.looking.add_done_callback(lambda _: self.wakeup.set())
        silent = live.silent_for(now)
        stalled = policy.stalled_after > 0 and live.stalled_for(now) >= policy.stalled_after
        if suspended:
            why = SUSPENDED_REASON
        elif silent >= policy.unresponsive_after:
            why = f"no answer to its liveness look for {silent:.1f}s"
        elif stalled:
            why = f"requests running and no token counted for {live.stalled_for(now):.0f}s"
        else:
            why = None
        if why is None:
            if state is RoleState.UNHEALTHY:
                self._update(run.spec.name, state=RoleState.READY, reason=None)  # _put_back follows
                return True
            return False
        if policy.hung_after > 0 and (stalled or silent >= policy.hung_after):
            self._role_down(run, f"hung ({why}): stopped after {policy.hung_after:g}s", failed=True)
            return True
        if state is RoleState.READY:
            left = self._take_out(run)
            self._update(
                run.spec.name,
                state=RoleState.UNHEALTHY,
                reason=why + (f"; taken out of {', '.join(left)}" if left else ""),
            )
            return True
        return False

    def _listing(self, name: str) -> list[tuple[RoleRun, Wire]]:
        """The running routers that take workers at run time and list `name`, with its wire."""
        return [
            (r, w)
            for r in self.runs.values()
            if r.wiring is not None
            and r.process is not None
            and r.spec.engine in ENGINES
            and adds_workers(r.spec.engine)
            and self.state_of(r.spec.name) in SERVING
            for w in r.wiring.wires
            if w.peer == name and w.kind in ROUTED_KINDS
        ]

    def _take_out(self, run: RoleRun) -> list[str]:
        """Remove a dead or hung worker from every router that lists it, at once (in the pool): the routers'
        own health checks take seconds, and send it requests meanwhile. Returns those routers."""
        if run.out:
            return []
        listing = self._listing(run.spec.name)
        run.out = bool(listing)
        for router_run, wire in listing:
            self.probes.submit(deregister, self.client, router_run.wiring, wire.url)
        return [r.spec.name for r, _ in listing]

    def _put_back(self, run: RoleRun) -> None:
        """Ready again (restarted, or its hang over): registered again with the routers it was taken out of
        (a router that cannot take workers at run time never lost it)."""
        run.out = False
        for router_run, wire in self._listing(run.spec.name):
            self.probes.submit(register, self.client, router_run.wiring, wire)

    def _clear_leftovers(self, run: RoleRun) -> None:
        if (report := run.stopping.poll(self.clock.monotonic(), True)) is not None:
            run.stopping = None
            self.leftovers = StopReport(
                self.leftovers.killed + report.killed, self.leftovers.survivors + report.survivors
            )

    def _wait(self, tick: float) -> float:
        """Sleep until the next probe is due, but no longer than `tick`; a probe's answer wakes it sooner."""
        now = self.clock.monotonic()
        due = [
            r.next_probe_at
            for r in self.runs.values()
            if (
                self.state_of(r.spec.name) in (RoleState.STARTING, RoleState.RESTARTING)
                or self.state_of(r.spec.name) is RoleState.READY
                and not r.wired
            )
            and r.process
            and r.probe is None
        ]
        due += [
            r.restart_at
            for r in self.runs.values()
            if self.state_of(r.spec.name) is RoleState.RESTARTING and r.process is None and r.restart_at
        ]
        if any(r.stopping for r in self.runs.values()):
            due.append(now + STOPPING_TICK)
        return max(0.005, min([tick, *(d - now for d in due)]))
