"""`up`: the loader has checked the file; here the port and GPU preflights, then a supervisor, in this
process (foreground) or in a detached one that outlives the terminal (`--detach`)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.files import open_fresh
from muse_launch.host.versions import engine_versions, recorded_versions
from muse_launch.local.down import refuse_leftovers
from muse_launch.local.gpu_runtime import GpuPreflight
from muse_launch.local.output import BackgroundWriter, LogWriter
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.plan.start_policy import choose
from muse_launch.printable import escaped
from muse_launch.proc.ports import busy_ports, taken_ports
from muse_launch.proc.process import Marker
from muse_launch.proc.programs import program_path
from muse_launch.render_progress import LiveProgress, PlainProgress, invoked_as, ready_hint
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.logfiles import forget_rotated
from muse_launch.rundir.logs import LogFollower, RolePrinter, last_lines
from muse_launch.rundir.role_addresses import explain_addresses
from muse_launch.rundir.state import (
    DeploymentLock,
    DeploymentRecord,
    RunDir,
    read_state,
    recorded_role,
    running_deployments,
    write_state,
)
from muse_launch.supervise.change_executor import Placement
from muse_launch.supervise.host import SupervisorHost
from muse_launch.supervise.planned_record import planned_record
from muse_launch.supervise.seams import LocalProcesses
from muse_launch.supervise.supervisor import Outcome, Supervisor

FAILURE_LOG_LINES = 20
StartAfter = dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class UpOptions:
    detach: bool = False
    fail_fast: bool = False
    keep: bool = False
    only: str | None = None
    start: str | None = None  # the file's `start:` (overlap | waves | None: overlap where the versions allow)
    redact: Callable[[str], str] = lambda text: text  # hides ${env:...} values (bring_up sets the file's)
    secret_sources: Mapping[str, str] = field(default_factory=dict)  # such a value -> as written, ${env:...}
    placement: Placement | None = None  # how `scale` places a new instance (None: `--only`, none placed)
    autoscale: Any = None  # the file's autoscale setup (supervise/autoscaler.py Setup), None without one


def saying(console: Console) -> Callable[[str], None]:
    """Print text as it is: no markup, no highlighting, no wrapping at 80 columns in a pipe."""
    return lambda text: console.print(text, highlight=False, markup=False, soft_wrap=True)


def select_only(plan: Plan, role: str) -> tuple[Plan, list[str]]:
    """The plan reduced to one role (all its replicas), and the dependencies it assumes are up."""
    specs = [s for s in plan.specs if role in (s.name, s.role)]
    if not specs:
        raise UsageError(f"--only {role}: no such role; roles: {', '.join(s.name for s in plan.specs)}")
    names = {s.name for s in specs}
    assumed = sorted({d for s in specs for d in s.depends_on} - names)
    waves = tuple(w for w in (tuple(n for n in wave if n in names) for wave in plan.waves) if w)
    return Plan(plan.name, tuple(specs), waves), [f"{d} ({plan.spec(d).url or 'no URL'})" for d in assumed]


def absent_dependencies(plan: Plan, role: str, client: httpx.Client) -> list[str]:
    """Each dependency of `--only ROLE` whose readiness probe does not answer now, with what it saw. A
    dependency without an endpoint to ask (a log or process probe) is taken as up."""
    from muse_launch.addresses import connect_host
    from muse_launch.supervise.probe import ReadinessCheck

    names = {s.name for s in plan.specs if role in (s.name, s.role)}
    absent = []
    for name in sorted({d for s in plan.specs if s.name in names for d in s.depends_on} - names):
        dep = plan.spec(name)
        if dep.probe.kind.value not in ("http", "tcp"):
            continue
        check = ReadinessCheck(
            dep.probe, connect_host(dep.bind), dep.ports.get("http"), Path(os.devnull), client
        )
        if not check.check(alive_for=0.0):
            absent.append(f"{name} ({dep.url or 'no URL'}): {check.last_seen}")
    return absent


def refuse_absent_dependencies(plan: Plan, role: str, source: Path) -> None:
    """`--only router` with its workers not up used to wait the router's whole timeout, then fail."""
    with httpx.Client(verify=False) as client:
        absent = absent_dependencies(plan, role, client)
    if absent:
        first = ", ".join(f"`--only {line.split(' ')[0]}`" for line in absent)
        raise RuntimeFailure(
            f"--only {role}: nothing was started; what it needs is not up:\n  " + "\n  ".join(absent),
            fix=f"start those first (the same `up` with {first}), or bring the whole "
            f"deployment up: `muse-launch up {source}`",
        )


def refuse_multi_node(plan: Plan) -> None:
    """This runtime starts processes on this host only: a plan over several nodes runs here as a rehearsal."""
    nodes: dict[str, list[str]] = {}
    for spec in plan.specs:
        if spec.node:
            nodes.setdefault(f"{spec.node} at {spec.host}", []).append(spec.name)
    if len(nodes) > 1:
        where = "; ".join(f"{node}: {', '.join(names)}" for node, names in nodes.items())
        raise UsageError(
            f"{plan.name} spans {len(nodes)} nodes ({where}). `up` starts processes on this host only",
            fix="run it across hosts with `up --on slurm`, export it with `export --to lws|rbg`, "
            "or rehearse it here with --rehearse (each node on its own loopback address)",
        )


def busy_fix(plan: Plan, busy) -> str:
    """The `--set` that moves the first busy port, in the file's key (http: `port`, others `NAME_port`;
    vLLM's extra side channels side_channel_1, _2... are `side_channel_port`), on the file's role."""
    from muse_launch.proc.ports import holding_deployments

    others = [name for name in holding_deployments(busy) if name != plan.name]
    if others:
        downs = " and ".join(f"`muse-launch down {name}`" for name in others)
        return (
            f"another deployment holds them: stop it first with {downs}, or move this one's roles with --set"
        )
    first = busy[0]
    role = plan.spec(first.role).role  # a replica (decode-0) or node rank (server@node1) is its role's
    key = "port" if first.name == "http" else f"{first.name.rstrip('_0123456789')}_port"
    more = f" (and likewise for the other {len(busy) - 1})" if len(busy) > 1 else ""
    return f"stop what holds it, or move the role: `--set roles.{role}.{key}=PORT`{more}"


def refuse_foreign_addresses(plan: Plan) -> None:
    """A role that binds another machine's address cannot start here: say so, not "in use by an unknown
    process"."""
    from muse_launch.proc.ports import foreign_addresses

    if foreign := foreign_addresses(plan):
        where = "; ".join(f"{address} ({', '.join(names)})" for address, names in foreign.items())
        raise RuntimeFailure(
            f"{plan.name}: nothing was started; not an address of this machine: {where}",
            fix="run `up` on the machine that has it, submit it to SLURM with "
            "`up --on slurm`, bind all addresses here (`bind: 0.0.0.0`), or rehearse it "
            "here with --rehearse",
        )


def missing_programs(plan: Plan) -> list[str]:
    """Each role whose program cannot be executed here, as `up` would run it (PATH, then this venv)."""
    missing = []
    for spec in plan.specs:
        env = {**os.environ, **spec.env}
        program = program_path(spec.argv[0], env)
        found = (
            shutil.which(program, path=env.get("PATH"))
            if os.sep not in program
            else (program if os.access(program, os.X_OK) and not os.path.isdir(program) else None)
        )
        if found is None:
            missing.append(
                f"{spec.name}: cannot run {spec.argv[0]!r} (not on PATH, nor beside {sys.executable})"
                if os.sep not in spec.argv[0]
                else f"{spec.name}: {spec.argv[0]} is not an executable file"
            )
    return missing


def refuse_missing_programs(plan: Plan, redact: Callable[[str], str] = lambda text: text) -> None:
    """Before anything starts: a router missing here would otherwise fail `up` after its workers' load.
    `redact` hides ${env:...} values (a launcher may be one)."""
    if missing := missing_programs(plan):
        raise RuntimeFailure(
            redact(f"{plan.name}: nothing was started; a program is missing:\n  " + "\n  ".join(missing)),
            fix="install it where `up` runs (vllm-router, smg: pip install -e '.[routers]'), "
            "set the role's `launcher:`, or rehearse the plan without engines: `up --rehearse`",
        )


def bring_up(
    plan: Plan,
    source: Path,
    redact: Callable[[str], str],
    options: UpOptions,
    console: Console,
    gpus: GpuPreflight | None = None,
    claim: Callable[[RunDir], None] = lambda run_dir: None,
) -> int:
    """Returns the exit code: 0 all ready (detached) or stopped cleanly, 1 a role failed, 128+N on signal N.
    `claim` runs under the name's lock before anything starts: it refuses the name while another backend's
    deployment of it runs, else makes that backend forget it."""
    options = replace(options, redact=redact)
    if options.only:
        full = plan
        plan, assumed = select_only(plan, options.only)
        refuse_absent_dependencies(full, options.only, source)
        saying(console)(f"--only {options.only}: assuming already up: {', '.join(assumed) or 'nothing'}")
    versions = engine_versions(plan)
    policy = choose(plan, options.start, versions)
    plan = policy.plan
    run_dir = RunDir.of(plan.name)
    lock = DeploymentLock(run_dir)  # "already running" comes before anything about how it would start
    try:
        claim(run_dir)
        refuse_leftovers(run_dir)
        refuse_foreign_addresses(plan)
        if busy := busy_ports(plan, redact, recorded_role):
            raise RuntimeFailure(
                "ports are busy:\n  " + "\n  ".join(map(str, busy)), fix=busy_fix(plan, busy)
            )
        refuse_missing_programs(plan, redact)
        if policy.note:  # how it will start, once nothing refuses it
            saying(console)(policy.note)
        if gpus:
            gpus.require(plan, running_deployments, saying(console))
        for spec in plan.specs:  # no stale last line from an earlier run in the progress view; a planted link
            os.close(open_fresh(run_dir.log(spec.name), root=run_dir.home))  # there is replaced, not followed
            forget_rotated(run_dir.log(spec.name))
        record = planned_record(
            plan, str(source), redact, recorded_versions(plan, versions), options.secret_sources
        )
        write_state(run_dir, record)  # nobody reads the last run's state as this one's
        if options.detach:
            return _detach(plan, record, run_dir, options, console, lock, policy.start_after)
        return _foreground(plan, record, run_dir, options, console, policy.start_after)
    finally:
        lock.release()


def _host(
    plan: Plan,
    record: DeploymentRecord,
    run_dir: RunDir,
    client: httpx.Client,
    report: Callable[[DeploymentRecord], None],
    start_after: StartAfter,
    options: UpOptions,
    say: Callable[[str], None],
) -> SupervisorHost:
    """The supervisor of this host's processes, hosted (supervise/host.py)."""
    processes = LocalProcesses(Marker(plan.name, str(run_dir.path)), run_dir, record.masks.token)
    return SupervisorHost(
        plan,
        record,
        run_dir,
        processes,
        client,
        say,
        report=report,
        ports_taken=_ports_taken,
        start_after=start_after,
        redact=options.redact,
    )


def _ports_taken(spec: LaunchSpec, record: DeploymentRecord) -> list[str]:
    return taken_ports(spec, {r.process.pid: r.name for r in record.roles if r.process}, recorded_role)


def _foreground(
    plan: Plan,
    record: DeploymentRecord,
    run_dir: RunDir,
    options: UpOptions,
    console: Console,
    start_after: StartAfter,
) -> int:
    # Everything this process prints goes through a thread of its own: a slow reader never stops supervision.
    out = BackgroundWriter(console.file)
    quiet = Console(
        file=out, force_terminal=console.is_terminal, width=console.width, color_system=console.color_system
    )
    progress = LiveProgress(console, run_dir, record) if console.is_terminal else PlainProgress(out)
    try:
        with httpx.Client(verify=False) as client:  # plain HTTP to the roles: no CA bundle to load (~30 ms)
            host = _host(
                plan,
                record,
                run_dir,
                client,
                lambda r: progress.update(r),
                start_after,
                options,
                saying(quiet),
            )
            live = ExitStack()  # the live view while roles start, closed once they are ready

            def ready(seconds: float) -> None:
                nonlocal progress
                live.close()
                _say_ready(quiet, host.sup.record, seconds, detached=False)
                progress = PlainProgress(out, host.sup.record)  # after ready: a line per change, between logs
                names = [s.name for s in plan.specs]
                printer = RolePrinter(console.file, names, colour=console.is_terminal, mask=options.redact)
                follower = LogFollower({name: run_dir.log(name) for name in names}, from_end=True)
                out.follow(lambda: follower.print_new(printer))

            with host:
                with live:
                    live.enter_context(progress)
                    outcome = host.run(
                        options.fail_fast, ready, options.placement, autoscale=options.autoscale
                    )
                return _finish(host.sup, outcome, options, host.received, quiet, run_dir)
    finally:
        out.close()


def _finish(
    sup: Supervisor,
    outcome: Outcome,
    options: UpOptions,
    received: dict[str, int],
    console: Console,
    run_dir: RunDir,
) -> int:
    """Stop what must be stopped, and say why; returns the exit code."""
    say = _redacting(saying(console), options.redact)
    if outcome is Outcome.RELEASED:
        say("`down` took over; the supervisor leaves the roles to it")
        return 0
    if outcome is Outcome.FAILED:
        _say_failure(say, sup.record, run_dir, sup.failed_role)
        if options.keep:
            sup.sign_off()
            say(
                f"--keep: the roles started are left running; `muse-launch down {sup.record.name}` stops them"
            )
            return 1
        say("stopping everything started")
    else:
        say(f"{signal.Signals(received['signal']).name}: stopping everything (again to kill at once)")
    report = sup.wind_down()
    for line in ["had to SIGKILL:", *report.killed] if report.killed else []:
        say(line)
    say(f"{sup.record.name}: stopped")
    return 1 if outcome is Outcome.FAILED else 128 + received["signal"]


def _redacting(say: Callable[[str], str], redact: Callable[[str], str]) -> Callable[[str], None]:
    """What a failure prints (a reason, the role's last log lines, what had to be killed) with ${env:...}
    values hidden."""
    return lambda text: say(redact(text))


def _say_failure(
    say: Callable[[str], None], record: DeploymentRecord, run_dir: RunDir, role: str | None
) -> None:
    failed = next(
        (r for r in record.roles if r.name == role or (role is None and r.state is RoleState.FAILED)), None
    )
    if failed is None:
        return
    say(f"error: role {failed.name} failed: {failed.reason}")
    try:
        lines = last_lines(run_dir.log(failed.name), FAILURE_LOG_LINES)
    except OSError as exc:  # files.PlantedLink: not read through
        lines = [str(exc)]
    say(
        f"last {len(lines)} lines of {run_dir.log(failed.name)}:"
        if lines
        else f"{run_dir.log(failed.name)} is empty"
    )
    for line in lines:
        say(f"  {failed.name} | {escaped(line)}")
    for line in explain_addresses("\n".join([failed.reason or "", *lines]), record, unknown_only=True):
        say(f"note: {line}")


def _say_ready(console: Console, record: DeploymentRecord, seconds: float, detached: bool) -> None:
    urls = ", ".join(r.url for r in record.entry_roles() if r.url)
    supervisor = f"; supervisor pid {record.supervisor.pid}" if detached and record.supervisor else ""
    say = saying(console)
    say(f"{record.name}: ready in {seconds:.2f}s{': ' + urls if urls else ''}{supervisor}")
    if detached:
        say(ready_hint(record.name))
    else:
        say("Ctrl-C stops it (a second Ctrl-C kills)")


def _detach(
    plan: Plan,
    record: DeploymentRecord,
    run_dir: RunDir,
    options: UpOptions,
    console: Console,
    lock: DeploymentLock,
    start_after: StartAfter,
) -> int:
    """Double fork: the supervisor leaves this session, so closing the terminal does not touch it.

    It reports through a pipe: its pid, then "ready" (or EOF, once it has cleaned up a failure).
    """
    read_end, write_end = os.pipe()
    console.file.flush()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        os.setsid()
        if os.fork():
            os._exit(0)
        code = 1
        try:
            code = _run_detached(plan, record, run_dir, options, write_end, start_after)
        finally:
            # Free the lock now: a process with threads (the probes') is a zombie to `down` before
            # the kernel closes its files, and `down` takes the lock as soon as it sees a zombie.
            lock.release()
            os._exit(code)  # never back into the command line's code in this process
    os.close(write_end)
    os.waitpid(child, 0)
    lock.release()  # the supervisor holds the lock now; `down` must be able to take it from it
    return _await_detached(run_dir, read_end, console, record, options.redact)


def _run_detached(
    plan: Plan,
    record: DeploymentRecord,
    run_dir: RunDir,
    options: UpOptions,
    pipe: int,
    start_after: StartAfter,
) -> int:
    log = open_fresh(run_dir.supervisor_log, root=run_dir.home)  # a planted link is replaced, not followed
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)  # nothing may keep the caller's terminal or pipe open
    out = LogWriter(1)  # a full disk loses a line of it, never the supervisor
    console = Console(file=out, force_terminal=False, width=200)
    try:
        with httpx.Client(verify=False) as client:  # before the first spawn: no CA bundle to load (~30 ms)
            host = _host(
                plan,
                record,
                run_dir,
                client,
                PlainProgress(out).update,
                start_after,
                options,
                saying(console),
            )
            with host:
                pipe = _tell(pipe, f"pid {os.getpid()}\n")

                def ready(seconds: float) -> None:
                    nonlocal pipe
                    # the control socket listens already: a `scale` right after `up -d` finds it
                    pipe = _tell(pipe, "ready\n")
                    if pipe >= 0:
                        os.close(pipe)
                        pipe = -1

                outcome = host.run(options.fail_fast, ready, options.placement, autoscale=options.autoscale)
                if outcome is Outcome.RELEASED and pipe >= 0:
                    pipe = _tell(pipe, "released\n")  # `up` says `down` stopped it, not that it went away
                return _finish(host.sup, outcome, options, host.received, console, run_dir)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        if pipe >= 0:
            os.close(pipe)


def _tell(pipe: int, message: str) -> int:
    """One message to the waiting `up`; -1 once it is gone (killed, its terminal closed): the supervisor
    carries on without it, never writing to it again (EPIPE, not a crash)."""
    if pipe < 0:
        return pipe
    try:
        os.write(pipe, message.encode())
        return pipe
    except OSError:
        os.close(pipe)
        return -1


def _say_left_running(
    say: Callable[[str], None], record: DeploymentRecord, supervisor_pid: list[int], signum: int
) -> None:
    """What an `up -d` interrupted while it waited leaves behind: the detached supervisor starts on."""
    pid = supervisor_pid[0] if supervisor_pid else record.supervisor.pid if record.supervisor else None
    starting = ", ".join(r.name for r in record.roles if r.state is not RoleState.READY) or "none"
    try:
        say(
            f"{signal.Signals(signum).name}: stopped waiting; deployment {record.name} is left running: its "
            f"supervisor{f' (pid {pid})' if pid else ''} goes on starting it (not ready yet: {starting})"
        )
        say(f"`{invoked_as()} status {record.name}` shows it, `{invoked_as()} down {record.name}` stops it")
    except OSError:  # the terminal is gone (SIGHUP): nobody to tell
        _lose_terminal()


def _lose_terminal() -> None:
    """stdout and stderr to /dev/null: a flush at exit must not fail on the terminal that closed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _await_detached(
    run_dir: RunDir, pipe: int, console: Console, record: DeploymentRecord, redact: Callable[[str], str]
) -> int:
    """Show the detached supervisor's progress from state.json until it says ready or goes away."""
    progress = LiveProgress(console, run_dir, record) if console.is_terminal else PlainProgress(console.file)
    started = time.monotonic()
    messages = b""
    supervisor_pid: list[int] = []
    interrupted: list[int] = []

    def leave(signum: int, frame) -> None:  # Ctrl-C, kill, a closed terminal: this `up` only stops waiting
        interrupted.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)
    try:
        with progress:
            while not interrupted:
                readable, _, _ = select.select([pipe], [], [], 0.1)
                progress.update(read_state(run_dir) or record)
                if not readable:
                    continue
                chunk = os.read(pipe, 4096)
                messages += chunk
                supervisor_pid[:] = [
                    int(line.split()[1]) for line in messages.split(b"\n") if line.startswith(b"pid ")
                ]
                if not chunk or b"ready\n" in messages or b"released\n" in messages:
                    break
    except OSError:  # the terminal went away (EIO) as its SIGHUP came: nobody to draw progress for
        if not interrupted:
            raise
        _lose_terminal()
    os.close(pipe)
    final = read_state(run_dir) or record
    say = _redacting(saying(console), redact)
    if b"ready\n" in messages:
        _say_ready(console, final, time.monotonic() - started, detached=True)
        return 0
    if interrupted:
        _say_left_running(say, final, supervisor_pid, interrupted[0])
        return 128 + interrupted[0]
    if b"released\n" in messages:
        say(
            f"{final.name}: `muse-launch down` took it over while it was starting, and stops what was started"
        )
        return 1
    if not any(r.state is RoleState.FAILED for r in final.roles):
        say(
            f"{final.name}: the supervisor went away before all roles were ready; see "
            f"{run_dir.supervisor_log}"
        )
        return 1
    _say_failure(say, final, run_dir, None)
    if any(r.process for r in final.roles):
        say(f"--keep: the roles started are left running; `muse-launch down {final.name}` stops them")
    else:
        say(f"{final.name}: everything started was stopped (supervisor log: {run_dir.supervisor_log})")
    return 1
