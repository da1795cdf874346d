"""One host for a Supervisor, the same in the foreground `up`, the detached supervisor and the SLURM batch
host: the stop signals, the state saver (a full or read-only disk: one warning, writes retried), the log
caps and, from ready until supervising ends, the control socket that `scale` and `restart` reach.

What differs between them is theirs: how they show progress (`report`), what they say (`say`), what a
ready deployment does next (`on_ready`), and how a finished one is stopped (`wind_down`, or left to `down`).

    with SupervisorHost(plan, record, run_dir, processes, client, say) as host:
        outcome = host.run(fail_fast, on_ready, placement)
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import replace

import httpx

from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.logfiles import LogCaps
from muse_launch.rundir.state import DeploymentRecord, RunDir, StateSaver
from muse_launch.supervise.autoscaler import Setup, running
from muse_launch.supervise.change_executor import Changes, Placement
from muse_launch.supervise.control_socket import ControlServer
from muse_launch.supervise.seams import Processes
from muse_launch.supervise.supervisor import Outcome, Supervisor

Say = Callable[[str], None]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SupervisorHost:
    """A Supervisor of `plan` with `record` as its first state (this process its supervisor). Entering it
    installs the signal handlers, then writes the state: a `down` that reads the supervisor's pid there
    finds it ready for SIGUSR1. Leaving it abandons the probes in flight."""

    def __init__(
        self,
        plan: Plan,
        record: DeploymentRecord,
        run_dir: RunDir,
        processes: Processes,
        client: httpx.Client,
        say: Say,
        report: Callable[[DeploymentRecord], None] = lambda record: None,
        takeover: bool = True,
        ports_taken: Callable[[LaunchSpec, DeploymentRecord], list[str]] = lambda spec, record: [],
        start_after: dict[str, tuple[str, ...]] | None = None,
        redact: Callable[[str], str] = lambda text: text,
    ):
        """`report`: each new record, after it is saved (progress on a terminal); `takeover`: SIGUSR1 hands
        the roles to `down` (one host; a SLURM `down` asks through a file)."""
        self.run_dir = run_dir
        self.client = client
        self.say = say
        self.takeover = takeover
        self.saver = StateSaver(run_dir, say)
        self.received: dict[str, int] = {}  # the first stop signal

        def on_change(new: DeploymentRecord) -> None:
            self.saver.save(new)
            report(new)

        self.sup = Supervisor(
            plan,
            replace(record, supervisor=ProcessRef.of(os.getpid())),
            run_dir,
            processes,
            client,
            on_change=on_change,
            ports_taken=ports_taken,
            start_after=start_after,
            redact=redact,
            tend=LogCaps.of(plan.specs, run_dir.log).tend,
        )

    def __enter__(self) -> SupervisorHost:
        self._handle_signals()
        self.sup.on_change(self.sup.record)
        return self

    def __exit__(self, *exc) -> None:
        self.sup.close()

    def _handle_signals(self) -> None:
        """SIGINT, SIGTERM, SIGHUP (a terminal closed): stop, a second one kills. SIGUSR1: `down` takes over.

        The handlers only note the signal and wake the supervisor's loop (a flag and a byte down a pipe):
        they take no lock and do no I/O that could block, whatever the loop was doing when they ran."""
        sup, received = self.sup, self.received

        def interrupt(signum: int, frame) -> None:
            received.setdefault("signal", signum)
            sup.request_stop()

        for sig in STOP_SIGNALS:
            signal.signal(sig, interrupt)
        if self.takeover:
            signal.signal(signal.SIGUSR1, lambda *_: sup.release())

    def run(
        self,
        fail_fast: bool,
        on_ready: Callable[[float], None],
        placement: Placement | None,
        served: Callable[[], AbstractContextManager[None]] = nullcontext,
        autoscale: Setup | None = None,
    ) -> Outcome:
        """Start, and once ready serve changes (placed by `placement`) before `on_ready` says so: a `scale`
        right after finds the socket. `served`: what else stands while they are served (SLURM's request
        files); `autoscale`: the autoscaler's thread, from then on.
        Supervises until a stop is asked or a role fails; the caller stops what is left."""
        with ExitStack() as serving:

            def ready(seconds: float) -> None:
                try:
                    server = ControlServer(self.run_dir, Changes(self.sup, placement, self.client))
                except OSError as exc:  # supervising goes on; changes are refused for want of a socket
                    self.say(
                        f"warning: no control socket ({exc}): `scale` and `restart` cannot reach this "
                        "supervisor"
                    )
                else:
                    serving.callback(server.close)
                    serving.enter_context(served())
                    # it acts through the socket, as `scale` does: a decision is one change among the others
                    serving.enter_context(running(autoscale, self.run_dir, lambda: self.sup.record, self.say))
                on_ready(seconds)

            return self.sup.run(fail_fast, ready, on_tick=self.saver.retry)
