"""The supervisor's logic against scripted histories: a fake clock, fake processes, and an HTTP
transport that answers each role's probe from its script (after honcho's test_manager)."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import pytest

from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind, RestartPolicy, RestartPolicyKind
from muse_launch.proc.process import ProcessRef, StopReport, StopTarget
from muse_launch.rundir.lifecycle import DeploymentState, RoleState
from muse_launch.rundir.state import DeploymentRecord, RunDir
from muse_launch.supervise.planned_record import planned_record
from muse_launch.supervise.supervisor import Outcome, Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.alarms: list[tuple[float, Callable[[], None]]] = []  # (when, what): a signal arriving then

    def at(self, when: float, what: Callable[[], None]) -> None:
        self.alarms.append((when, what))

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    def wait(self, wakeup, seconds: float) -> None:
        self.now += seconds
        for alarm in [a for a in self.alarms if a[0] <= self.now]:
            self.alarms.remove(alarm)
            alarm[1]()


@dataclass(frozen=True)
class Script:
    """One spawn of a role: ready `ready_after` seconds after it, exiting with `code` at `exit_after`."""

    ready_after: float = 0.0
    exit_after: float = math.inf
    code: int = 1
    stop_after: float = 0.0  # from its stop signal to its exit (inf: only SIGKILL ends it)
    hangs: bool = False  # accepts the probe's connection and never answers
    dies_after_kill: float = 0.0  # from SIGKILL to gone (uninterruptible sleep in a driver call)


@dataclass
class FakeProcess:
    ref: ProcessRef
    clock: FakeClock
    started: float
    script: Script
    stopped: bool = False  # its stop is complete
    suspended_from: float | None = None  # SIGSTOP from then on
    cgroup = None

    def suspended(self) -> bool:
        return self.suspended_from is not None and self.clock.now >= self.suspended_from

    def poll(self) -> int | None:
        if self.stopped:
            return -15
        return self.script.code if self.clock.now >= self.started + self.script.exit_after else None

    def ready(self) -> bool:
        return self.poll() is None and self.clock.now >= self.started + self.script.ready_after


@dataclass
class FakeProcesses:
    clock: FakeClock
    scripts: dict[str, list[Script]]
    spawned: list[tuple[float, str]] = field(default_factory=list)
    stopped: list[tuple[float, str]] = field(default_factory=list)  # when each role's stop signal went
    current: dict[str, FakeProcess] = field(default_factory=dict)
    listed_from: dict[str, float] = field(
        default_factory=dict
    )  # a router lists this worker from then (default 0)

    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> FakeProcess:
        count = sum(1 for _, name in self.spawned if name == spec.name)
        scripts = self.scripts.get(spec.name, [Script()])
        self.spawned.append((self.clock.now, spec.name))
        process = FakeProcess(
            ProcessRef(1000 + len(self.spawned), 0.0),
            self.clock,
            self.clock.now,
            scripts[min(count, len(scripts) - 1)],
        )
        self.current[spec.name] = process
        return process

    def listener_owner(self, spec: LaunchSpec, process: FakeProcess) -> None:
        return None

    def stop(self, targets: list[StopTarget], now: float) -> FakeStop:
        self.stopped += [(now, t.role) for t in targets]
        return FakeStop([(t, self.current[t.role]) for t in targets], now)

    def transport(self, ports: dict[int, str]) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            process = self.current.get(ports[request.url.port])
            if process is None or process.poll() is not None:
                raise httpx.ConnectError("connection refused", request=request)
            if process.script.hangs:
                raise Hang()
            if request.url.path == "/workers":  # a router's worker list: every other ready role, once listed
                return httpx.Response(
                    200,
                    json={
                        "workers": [
                            {"url": f"http://127.0.0.1:{port}", "is_healthy": True}
                            for port, name in ports.items()
                            if name in self.current
                            and self.current[name].ready()
                            and self.clock.now >= self.listed_from.get(name, 0.0)
                        ]
                    },
                )
            return httpx.Response(200 if process.ready() else 503)

        return httpx.MockTransport(answer)


@dataclass
class FakeStop:
    """Each process exits `stop_after` its stop signal, or is killed at the end of its grace."""

    targets: list[tuple[StopTarget, FakeProcess]]
    sent_at: float
    killed: list[str] = field(default_factory=list)
    kill_at: float = 0.0

    def poll(self, now: float, kill_now: bool) -> StopReport | None:
        for target, process in self.targets:
            if process.stopped:
                continue
            exits_at = self.sent_at + process.script.stop_after
            if process.script.dies_after_kill and process.poll() is not None:
                exits_at = math.inf  # its main process is gone; the children it left only go with SIGKILL
            if (
                target.role not in self.killed
                and (now >= self.sent_at + target.grace or kill_now)
                and now < exits_at
            ):
                self.killed.append(target.role)
                self.kill_at = now
            if now >= exits_at or (
                target.role in self.killed and now >= self.kill_at + process.script.dies_after_kill
            ):
                process.stopped = True
        return StopReport(tuple(self.killed)) if all(p.stopped for _, p in self.targets) else None


class Hang(Exception):
    """Raised by the transport for a probe that never gets an answer."""


class InlineProbes(Executor):
    """Runs each probe at once on the caller's thread; a probe that hangs never completes."""

    def __init__(self) -> None:
        self.hanging: list[Future] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Hang:
            self.hanging.append(future)  # pending for ever: its role is never probed again meanwhile
        return future


def spec(
    name: str,
    port: int,
    *depends_on: str,
    timeout: float = 60.0,
    restart_max: int = 3,
    policy: RestartPolicyKind = RestartPolicyKind.ON_FAILURE,
) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        role=name,
        kind="command",
        engine="command",
        launcher=("serve",),
        args=(),
        ports={"http": port},
        probe=Probe(ProbeKind.HTTP, ("/health",), timeout=timeout, interval=0.1),
        depends_on=depends_on,
        restart=RestartPolicy(policy, restart_max),
    )


EPD = Plan(
    "epd",
    (
        spec("encoder", 1),
        spec("decode", 3, "encoder"),
        spec("prefill", 2, "encoder"),
        spec("router", 4, "prefill", "decode"),
    ),
    (("encoder",), ("decode", "prefill"), ("router",)),
)


@dataclass
class Harness:
    supervisor: Supervisor
    clock: FakeClock
    processes: FakeProcesses
    records: list[DeploymentRecord]

    def first(self, role: str, state: RoleState) -> int:
        """The index of the first record in which the role is in this state."""
        return next(i for i, record in enumerate(self.records) if record.role(role).state is state)

    def states(self, role: str) -> list[RoleState]:
        """The role's distinct states, in order."""
        out: list[RoleState] = []
        for record in self.records:
            if not out or out[-1] is not record.role(role).state:
                out.append(record.role(role).state)
        return out


def harness(tmp_path: Path, plan: Plan, scripts: dict[str, list[Script]]) -> Harness:
    clock = FakeClock()
    processes = FakeProcesses(clock, scripts)
    client = httpx.Client(transport=processes.transport({s.ports["http"]: s.name for s in plan.specs}))
    records: list[DeploymentRecord] = []
    supervisor = Supervisor(
        plan,
        planned_record(plan, "test.yaml", str),
        RunDir(tmp_path),
        processes,
        client,
        clock=clock,
        on_change=records.append,
        probes=InlineProbes(),
    )
    return Harness(supervisor, clock, processes, records)


def test_roles_start_as_soon_as_their_dependencies_are_ready(tmp_path):
    h = harness(
        tmp_path,
        EPD,
        {
            "encoder": [Script(1.0)],
            "prefill": [Script(2.0)],
            "decode": [Script(1.5)],
            "router": [Script(0.5)],
        },
    )
    assert h.supervisor.start() is Outcome.READY
    spawned = dict((name, at) for at, name in h.processes.spawned)
    assert spawned["encoder"] == 0.0
    assert (
        spawned["prefill"] == spawned["decode"] == pytest.approx(1.0, abs=0.11)
    )  # together, one probe after ready
    assert spawned["router"] == pytest.approx(3.0, abs=0.22)
    assert h.clock.now == pytest.approx(
        3.5, abs=0.35
    )  # the critical path, plus at most one interval per wave
    assert h.supervisor.record.state is DeploymentState.READY


def test_a_role_exiting_while_starting_fails_the_start_at_once(tmp_path):
    h = harness(tmp_path, EPD, {"encoder": [Script(1.0)], "prefill": [Script(60.0, exit_after=0.3, code=3)]})
    assert h.supervisor.start() is Outcome.FAILED
    assert h.supervisor.failed_role == "prefill"
    assert h.supervisor.record.role("prefill").reason == "exited with code 3 before it was ready"
    assert h.clock.now < 1.5  # not the 60 s timeout
    assert "router" not in [name for _, name in h.processes.spawned]


def test_a_role_that_never_answers_times_out(tmp_path):
    plan = Plan("one", (spec("slow", 1, timeout=2.0),), (("slow",),))
    h = harness(tmp_path, plan, {"slow": [Script(ready_after=math.inf)]})
    assert h.supervisor.start() is Outcome.FAILED
    assert h.supervisor.record.role("slow").reason == "not ready after 2s (GET /health answered 503)"
    assert h.clock.now == pytest.approx(2.0, abs=0.2)


def test_stop_goes_in_reverse_dependency_order_wave_by_wave(tmp_path):
    h = harness(
        tmp_path,
        EPD,
        {
            "router": [Script(stop_after=1.0)],
            "decode": [Script(stop_after=0.5)],
            "prefill": [Script(stop_after=2.0)],
        },
    )
    assert h.supervisor.start() is Outcome.READY
    began = h.clock.now
    h.supervisor.stop()
    stopped = {name: at - began for at, name in h.processes.stopped}
    assert list(stopped) == ["router", "decode", "prefill", "encoder"]
    assert stopped["router"] == 0.0
    assert (
        stopped["decode"] == stopped["prefill"] == pytest.approx(1.0, abs=0.03)
    )  # together, once router exited
    assert stopped["encoder"] == pytest.approx(3.0, abs=0.05)  # once the slower of the two exited
    assert h.states("prefill")[-3:] == [RoleState.READY, RoleState.STOPPING, RoleState.STOPPED]
    assert all(r.state is RoleState.STOPPED and r.process is None for r in h.supervisor.record.roles)
    assert h.supervisor.record.state is DeploymentState.STOPPED


def test_a_role_dying_after_ready_restarts_with_backoff_then_gives_up(tmp_path):
    plan = Plan("one", (spec("base", 1), spec("flaky", 2, "base", restart_max=2)), (("base",), ("flaky",)))
    h = harness(tmp_path, plan, {"flaky": [Script(0.2, exit_after=1.0)]})  # every spawn dies after 1 s
    assert h.supervisor.start() is Outcome.READY
    ticks = []
    assert (
        h.supervisor.supervise(
            fail_fast=False,
            on_tick=lambda: ticks.append(1) if len(ticks) < 200 else h.supervisor.request_stop(),
        )
        is Outcome.INTERRUPTED
    )
    flaky = h.supervisor.record.role("flaky")
    assert flaky.state is RoleState.FAILED
    assert flaky.restarts == 2 and flaky.reason == "exited with code 1; gave up after 2 restarts"
    assert h.states("flaky") == [
        RoleState.PENDING,
        RoleState.STARTING,
        RoleState.READY,
        RoleState.RESTARTING,
        RoleState.READY,
        RoleState.RESTARTING,
        RoleState.READY,
        RoleState.FAILED,
    ]
    restarts = [at for at, name in h.processes.spawned if name == "flaky"]
    assert restarts[1] - restarts[0] == pytest.approx(1.0, abs=0.3)  # died at 1 s, restarted at once
    assert restarts[2] - restarts[1] == pytest.approx(1.0 + 1.0, abs=0.3)  # then 1 s backoff
    assert h.supervisor.record.state is DeploymentState.DEGRADED
    assert DeploymentState.DEGRADED in {r.state for r in h.records}


def test_a_clean_exit_after_ready_is_not_restarted(tmp_path):
    plan = Plan("one", (spec("base", 1), spec("job", 2)), (("base", "job"),))
    h = harness(tmp_path, plan, {"job": [Script(0.0, exit_after=0.5, code=0)]})
    assert h.supervisor.start() is Outcome.READY
    ticks = []
    h.supervisor.supervise(
        False, on_tick=lambda: ticks.append(1) if len(ticks) < 20 else h.supervisor.request_stop()
    )
    assert h.supervisor.record.role("job").state is RoleState.STOPPED
    assert [name for _, name in h.processes.spawned].count("job") == 1


def test_fail_fast_reports_the_dead_role(tmp_path):
    plan = Plan("one", (spec("fragile", 1),), (("fragile",),))
    h = harness(tmp_path, plan, {"fragile": [Script(0.0, exit_after=1.0, code=-9)]})
    assert h.supervisor.start() is Outcome.READY
    assert h.supervisor.supervise(fail_fast=True) is Outcome.FAILED
    assert h.supervisor.record.role("fragile").reason == "killed by SIGKILL after it was ready"


def test_ctrl_c_stops_and_a_second_one_kills(tmp_path):
    h = harness(tmp_path, EPD, {"encoder": [Script(10.0)]})
    h.supervisor.request_stop()
    assert h.supervisor.start() is Outcome.INTERRUPTED
    assert not h.supervisor.kill_now
    h.supervisor.request_stop()
    assert h.supervisor.kill_now


def test_down_taking_over_releases_the_roles(tmp_path):
    h = harness(tmp_path, EPD, {})
    assert h.supervisor.start() is Outcome.READY
    h.supervisor.release()
    assert h.supervisor.supervise(fail_fast=False) is Outcome.RELEASED
    assert h.processes.stopped == []
    assert h.supervisor.record.state is DeploymentState.READY


def test_a_ready_role_dying_while_others_start_fails_the_start(tmp_path):
    h = harness(tmp_path, EPD, {"encoder": [Script(0.5, exit_after=1.5)], "prefill": [Script(5.0)]})
    assert h.supervisor.start() is Outcome.FAILED
    assert h.supervisor.failed_role == "encoder"
    reason = h.supervisor.record.role("encoder").reason
    assert reason == "exited with code 1 after it was ready, while others were starting"


def test_probes_that_never_answer_delay_no_other_role(tmp_path):
    """Five roles accept the probe's connection and never answer; another becomes ready and a third
    crashes meanwhile: both are seen when they happen, and each hung role has one probe in flight."""
    hung = [f"hung{i}" for i in range(5)]
    plan = Plan(
        "hung",
        tuple(spec(n, i + 10) for i, n in enumerate(hung)) + (spec("quick", 1), spec("crashing", 2)),
        (tuple(hung) + ("quick", "crashing"),),
    )
    h = harness(
        tmp_path,
        plan,
        {
            **{n: [Script(hangs=True)] for n in hung},
            "quick": [Script(1.0)],
            "crashing": [Script(60.0, exit_after=2.0, code=3)],
        },
    )
    assert h.supervisor.start() is Outcome.FAILED
    assert h.supervisor.failed_role == "crashing"
    assert h.supervisor.record.role("crashing").reason == "exited with code 3 before it was ready"
    assert h.clock.now == pytest.approx(2.0, abs=0.11)  # on the fake clock: the crash noticed within a tick
    assert h.states("quick")[-1] is RoleState.READY and h.states("crashing")[-1] is RoleState.FAILED
    assert h.first("quick", RoleState.READY) < h.first("crashing", RoleState.FAILED)
    assert all(h.supervisor.record.role(n).state is RoleState.STARTING for n in hung)
    assert len(h.supervisor.probes.hanging) == 5  # one probe in flight each, not one per interval


def test_a_hung_probe_times_out_its_own_role_only(tmp_path):
    plan = Plan("one", (spec("hung", 1, timeout=3.0), spec("other", 2)), (("hung", "other"),))
    h = harness(tmp_path, plan, {"hung": [Script(hangs=True)], "other": [Script(0.5)]})
    assert h.supervisor.start() is Outcome.FAILED
    assert h.states("other")[-1] is RoleState.READY
    assert h.supervisor.record.role("hung").reason.startswith(
        "not ready after 3s (no answer to the probe sent "
    )


def test_leftovers_that_take_long_to_die_delay_only_their_own_restart(tmp_path):
    """A dead role's children survive SIGKILL for 8 s (a driver call): its restart waits for them,
    while another role's crash meanwhile is handled at once."""
    plan = Plan("two", (spec("stuck", 1), spec("flaky", 2)), (("stuck", "flaky"),))
    h = harness(
        tmp_path,
        plan,
        {
            "stuck": [Script(0.1, exit_after=1.0, dies_after_kill=8.0), Script(0.1)],
            "flaky": [Script(0.1, exit_after=2.0), Script(0.1)],
        },
    )
    assert h.supervisor.start() is Outcome.READY
    ticks = []
    h.supervisor.supervise(
        False, on_tick=lambda: ticks.append(1) if h.clock.now < 15 else h.supervisor.request_stop()
    )
    spawns = {name: [at for at, n in h.processes.spawned if n == name] for name in ("stuck", "flaky")}
    assert spawns["flaky"][1] == pytest.approx(2.0, abs=0.3)  # died at 2 s, restarted at once: not held up
    assert spawns["stuck"][1] == pytest.approx(1.0 + 8.0, abs=0.3)  # not at 2 s: its leftovers were alive
    assert h.states("stuck")[-2:] == [RoleState.RESTARTING, RoleState.READY]
    assert h.supervisor.record.state is DeploymentState.READY


def test_a_second_ctrl_c_during_the_grace_kills_at_once(tmp_path):
    plan = Plan("one", (spec("stubborn", 1),), (("stubborn",),))
    h = harness(tmp_path, plan, {"stubborn": [Script(0.1, stop_after=math.inf)]})
    assert h.supervisor.start() is Outcome.READY
    h.supervisor.request_stop()
    began = h.clock.now
    h.clock.at(began + 1.0, h.supervisor.request_stop)
    report = h.supervisor.stop()
    assert report.killed == ("stubborn",)
    assert h.clock.now - began == pytest.approx(1.0, abs=0.05)  # not its 30 s grace
    assert h.states("stubborn")[-2:] == [RoleState.STOPPING, RoleState.STOPPED]


def test_a_role_ignoring_its_stop_signal_is_killed_at_the_end_of_its_grace(tmp_path):
    plan = Plan("one", (spec("stubborn", 1),), (("stubborn",),))
    h = harness(tmp_path, plan, {"stubborn": [Script(0.1, stop_after=math.inf)]})
    assert h.supervisor.start() is Outcome.READY
    began = h.clock.now
    assert h.supervisor.stop().killed == ("stubborn",)
    assert h.clock.now - began == pytest.approx(30.0, abs=0.05)


def worker(name: str, port: int, kind: str) -> LaunchSpec:
    return replace(spec(name, port), kind=kind, engine="sglang")


PD = Plan(
    "pd",
    (
        worker("prefill-0", 2, "prefill"),
        worker("prefill-1", 3, "prefill"),
        worker("decode", 5, "decode"),
        replace(
            spec("router", 4, "prefill-0", "prefill-1", "decode", timeout=20.0),
            kind="router",
            engine="sglang-router",
        ),
    ),
    (("prefill-0", "prefill-1", "decode"), ("router",)),
)


def test_ready_waits_until_the_router_lists_every_worker(tmp_path):
    h = harness(tmp_path, PD, {})
    h.processes.listed_from["prefill-1"] = 3.0  # registered late: the router's own probe is ready long before
    assert h.supervisor.start() is Outcome.READY
    assert h.clock.now >= 3.0
    wiring = [r.role("router").wiring for r in h.records]
    assert (("prefill", 1, 2), ("decode", 1, 1)) in wiring
    assert wiring[-1] == (("prefill", 2, 2), ("decode", 1, 1))
    assert DeploymentState.STARTING in {
        r.state for r in h.records if r.role("router").state is RoleState.READY
    }
    assert h.supervisor.record.state is DeploymentState.READY


def test_a_worker_the_router_never_lists_fails_up_naming_both_ends(tmp_path):
    h = harness(tmp_path, PD, {})
    h.processes.listed_from["prefill-1"] = math.inf
    assert h.supervisor.start() is Outcome.FAILED
    router = h.supervisor.record.role("router")
    assert router.reason == (
        "not wired after 20s: the router's worker list (GET http://127.0.0.1:4/workers) "
        "does not hold as healthy prefill prefill-1 at http://127.0.0.1:3"
    )
    assert router.wiring == (("prefill", 1, 2), ("decode", 1, 1))


@pytest.mark.faults("5. the supervisor notices a role stopped by SIGSTOP, and its SIGCONT")
def test_a_role_stopped_by_sigstop_is_unhealthy_until_it_continues(tmp_path):
    plan = Plan("one", (spec("base", 1), spec("frozen", 2)), (("base", "frozen"),))
    h = harness(tmp_path, plan, {})
    assert h.supervisor.start() is Outcome.READY
    frozen = h.processes.current["frozen"]
    frozen.suspended_from = h.clock.now + 1.0
    ticks = []

    def tick():
        ticks.append(h.clock.now)
        if h.clock.now > frozen.suspended_from + 1.0 and frozen.suspended_from < 100:
            frozen.suspended_from = 1000.0  # SIGCONT
        if len(ticks) > 40:
            h.supervisor.request_stop()

    h.supervisor.supervise(fail_fast=False, on_tick=tick)
    assert h.states("frozen")[-3:] == [RoleState.READY, RoleState.UNHEALTHY, RoleState.READY]
    unhealthy = h.records[h.first("frozen", RoleState.UNHEALTHY)]
    assert "SIGSTOP" in unhealthy.role("frozen").reason and unhealthy.state is DeploymentState.DEGRADED
    assert h.processes.spawned.count((0.0, "frozen")) == 1  # not restarted: it is alive


def test_an_instance_admitted_while_supervising_starts_serves_and_retires_out_of_the_record(tmp_path):
    """A change's steps (supervise/change_executor.py) run in the loop: admit starts an instance watched
    like the others; retire stops it by its stop signal and, once it is gone, takes it out of the plan,
    record and waves."""
    plan = Plan("one", (spec("base", 1),), (("base",),))
    clock = FakeClock()
    processes = FakeProcesses(clock, {"base-1": [Script(1.0, stop_after=0.5)]})
    client = httpx.Client(transport=processes.transport({1: "base", 2: "base-1"}))
    records: list[DeploymentRecord] = []
    sup = Supervisor(
        plan,
        planned_record(plan, "t.yaml", str),
        RunDir(tmp_path),
        processes,
        client,
        clock=clock,
        on_change=records.append,
        probes=InlineProbes(),
    )
    assert sup.start() is Outcome.READY
    new = replace(spec("base-1", 2), role="base")
    record = replace(planned_record(Plan("x", (new,), (("base-1",),)), "", str).roles[0], generation=2)
    seen: list[str] = []

    def tick() -> None:
        names = [r.name for r in sup.record.roles]
        if not seen:
            assert sup.admit(new, record, None) is None
            seen.append("admitted")
        elif "base-1" in names and sup.state_of("base-1") is RoleState.READY and "retired" not in seen:
            assert (
                sup.record.stop_waves == (("base", "base-1"),) and sup.record.role("base-1").generation == 2
            )
            sup.retire("base-1")
            seen.append("retired")
        elif "retired" in seen and "base-1" not in names:
            sup.request_stop()

    assert sup.supervise(False, on_tick=tick) is Outcome.INTERRUPTED
    states = [r.role("base-1").state for r in records if any(x.name == "base-1" for x in r.roles)]
    assert list(dict.fromkeys(states)) == [
        RoleState.STARTING,
        RoleState.READY,
        RoleState.STOPPING,
    ]
    assert [n for _, n in processes.stopped] == ["base-1"]
    assert [s.name for s in sup.plan.specs] == ["base"] and sup.record.stop_waves == (("base",),)
    assert "base-1" not in sup.runs


def test_a_wiring_changed_long_after_the_router_started_has_its_timeout_from_the_change(tmp_path):
    """A change registers a worker with a router that has run far longer than its readiness timeout (20 s
    here): the new wiring gets those 20 s from the registration, not from the router's start (main: `not
    wired after 20s` at the first look, every change failing once the router was 600 s old)."""
    h = harness(tmp_path, PD, {})
    assert h.supervisor.start() is Outcome.READY
    h.clock.now += 3600.0  # an hour later
    h.processes.listed_from["prefill-1"] = h.clock.now + 2.0  # the router lists it 2 s after its registration
    router = h.supervisor.runs["router"]
    h.supervisor.rewire("router", router.wiring.wires)  # what a change's registration does
    for _ in range(100):
        if router.wired or router.wiring_failed:
            break
        h.supervisor._tend_wiring(router)
        h.clock.now += 0.1
    assert router.wiring_failed is None and router.wired
    assert h.clock.now >= 3602.0
    h.processes.listed_from["prefill-1"] = math.inf  # never listed: still bounded, 20 s from this change
    changed = h.clock.now
    h.supervisor.rewire("router", router.wiring.wires)
    while not router.wiring_failed and h.clock.now - changed < 60:
        h.supervisor._tend_wiring(router)
        h.clock.now += 0.1
    assert router.wiring_failed.startswith("not wired after 20s") and 20 < h.clock.now - changed < 21
