"""On the batch host, inside the allocation: re-plan the checked topology with the allocated
nodes' addresses, check it again, then run the same Supervisor as on one host (waves, probes,
fail-fast, restart) with each role instance a job step on its node.

    python -m muse_launch.slurm.batch --run-dir DIR [--rehearse] [--fail-fast] [--set K=V ...] TOPOLOGY

Talks to `up`, `status` and `down` through the run directory: state.json (as on one host),
slurm/placement.json, slurm/heartbeat, slurm/down-request (`down` asks), slurm/changes/ (`scale` and
`restart`, slurm/request_files.py) and slurm/done (the supervisor finished: it stopped what it started).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import httpx

from muse_launch.addresses import is_wildcard
from muse_launch.checks import Severity, recheck_placement
from muse_launch.core import LoadedPlan, load_plan
from muse_launch.errors import UserError
from muse_launch.plan.compose import compose
from muse_launch.proc.process import Marker
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import SLURM, DeploymentRecord, RunDir, now_iso
from muse_launch.signals import reset_inherited
from muse_launch.supervise.autoscaler import Setup
from muse_launch.supervise.change_executor import Placement
from muse_launch.supervise.host import SupervisorHost
from muse_launch.supervise.planned_record import planned_record
from muse_launch.supervise.supervisor import Outcome, Supervisor

from . import cluster
from .change_placement import allocated_gpus, slurm_placement
from .files import HEARTBEAT_SECONDS, SlurmFiles
from .placement import AllocatedNode, on_nodes, placement, shape
from .processes import SlurmProcesses, cpu_shares, shared_gpus
from .request_files import FileDesk

REQUEST_POLL = 0.2


def allocation_nodes() -> list[AllocatedNode]:
    return [
        AllocatedNode(n, cluster.node_address(n)) for n in cluster.hostnames(os.environ["SLURM_JOB_NODELIST"])
    ]


def reached_at(record: DeploymentRecord, plan) -> DeploymentRecord:
    """A role listening on every interface is probed at its node's address, not at loopback."""
    hosts = {s.name: s.host for s in plan.specs}
    return replace(
        record,
        roles=tuple(
            replace(r, probe_host=hosts[r.name] if is_wildcard(plan.spec(r.name).bind) else r.probe_host)
            for r in record.roles
        ),
    )


def _watch(
    files: SlurmFiles, sup: Supervisor, stopping: threading.Event, asked: dict, desk: FileDesk | None = None
) -> None:
    """Heartbeat for `status`/`down`, `down`'s request to stop (its --grace goes in `asked`: the
    record is the supervisor loop's to change), and the requests of `scale` and `restart` (`desk`)."""
    last_beat = 0.0
    while not stopping.is_set():
        if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
            files.write_text(files.heartbeat, f"{time.time():.3f}\n")
            last_beat = time.monotonic()
        request = files.read_json(files.down_request)
        if request is not None and not sup.stop_requested:
            grace = request.get("grace")
            asked["grace"] = grace
            print(
                f"muse-launch: `down` asked to stop (grace {grace if grace is not None else 'per role'})",
                flush=True,
            )
            sup.request_stop()
        if desk is not None and desk.open:
            desk.poll()
        time.sleep(REQUEST_POLL)


def run(args: argparse.Namespace, stopped: dict) -> int:
    """Returns the exit code; `stopped` gets what stopping the roles had to SIGKILL, for `down`."""
    run_dir = RunDir(Path(args.run_dir))
    files = SlurmFiles(run_dir)
    job_id = os.environ["SLURM_JOB_ID"]
    placed = _placed(args, files, job_id)
    if placed is None:
        return 1
    plan, checked, where, allocation = placed
    loaded = checked.loaded
    gpus_per_node = allocated_gpus(shape(checked.plan, loaded.topology).gpus_per_node)
    source = files.source.read_text().strip() if files.source.exists() else str(loaded.source)
    record = reached_at(planned_record(plan, source, loaded.redact, backend=SLURM), plan)
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE", "1"))
    processes = SlurmProcesses(
        job_id,
        run_dir,
        Marker(plan.name, str(run_dir.path)),
        where,
        cpu_shares(where, list(plan.specs), cpus, gpus_per_node),
        shared_gpus(where, list(plan.specs)),
    )
    stopping = threading.Event()
    say = lambda line: print(f"muse-launch: {line}", flush=True)  # noqa: E731
    # As on one host (supervise/host.py); each role's log is written by its srun client on this host. `down`
    # asks through a file here, not by SIGUSR1.
    with (
        httpx.Client() as client,
        SupervisorHost(
            plan, record, run_dir, processes, client, say, takeover=False, redact=loaded.redact
        ) as host,
    ):
        sup = host.sup
        asked: dict = {}
        current = lambda: sup.call(lambda: [r.spec for r in sup.runs.values()])  # noqa: E731
        place = _placement(checked, args.rehearse, allocation, processes, files, gpus_per_node, current)
        desk = FileDesk(files)
        watcher = threading.Thread(target=_watch, args=(files, sup, stopping, asked, desk), daemon=True)
        watcher.start()
        try:
            served = lambda: _served(desk, gpus_per_node)  # noqa: E731
            _supervise(host, args.fail_fast, asked, stopped, place, served, Setup.of(loaded.topology))
        finally:
            stopping.set()
            files.heartbeat.unlink(missing_ok=True)
    print(f"muse-launch: {plan.name} stopped", flush=True)
    failed = any(r.state is RoleState.FAILED for r in sup.record.roles)
    return 1 if failed else 0


def _placement(
    file: LoadedPlan,
    rehearse: bool,
    allocation: list[AllocatedNode],
    processes: SlurmProcesses,
    files: SlurmFiles,
    gpus_per_node: int,
    current: Callable[[], list],
) -> Placement:
    """Where new instances go by this file: the first, or one `up FILE` of the job brings later (its copy
    in the run directory, read with the environment this supervisor was started with)."""

    def reload(path: str, sets: tuple[str, ...], environ: Mapping[str, str]) -> Placement:
        edited = load_plan(path, list(sets), environ=environ)
        return _placement(edited, rehearse, allocation, processes, files, gpus_per_node, current)

    return slurm_placement(
        file.loaded.topology,
        allocation,
        rehearse,
        processes,
        files,
        gpus_per_node,
        current,
        reload,
        file.redact,
        file.loaded.sha256,
    )


def _placed(args: argparse.Namespace, files: SlurmFiles, job_id: str):
    """The checked plan moved onto the allocated nodes, and where each role runs; None (said why) where the
    moved plan fails its checks. The placement is written for `status` and `down`."""
    allocation = allocation_nodes()
    checked = load_plan(args.topology, args.set)  # the same checks as at submission
    topology = checked.loaded.topology
    plan = compose(topology, rehearse=args.rehearse, where=on_nodes(allocation)).plan
    findings = recheck_placement(topology, plan)
    for f in findings:
        print(f"muse-launch: on the allocation: {f.format(checked.loaded)}", flush=True)
    if any(f.severity is Severity.ERROR for f in findings):
        print(
            "muse-launch: the plan moved onto the allocated nodes does not pass its checks; nothing started",
            flush=True,
        )
        return None
    where = placement(checked.plan, topology, allocation)
    files.write_json(
        files.placement,
        {
            "job_id": job_id,
            "batch_host": allocation[0].name,
            "started_at": time.time(),
            "nodes": [{"name": n.name, "address": n.address} for n in allocation],
            "roles": {name: {"node": node.name, "address": node.address} for name, node in where.items()},
        },
    )
    return plan, checked, where, allocation


@contextmanager
def _served(desk: FileDesk, gpus_per_node: int) -> Iterator[None]:
    """Once ready: `scale` and `restart` reach this supervisor through request files that the watcher hands
    to its control socket on this host (slurm/request_files.py, supervise/control_socket.py)."""
    print(
        f"muse-launch: `scale` and `restart` are served; a new instance gets its step where its node has "
        f"free GPUs (of {gpus_per_node} a node) and free ports",
        flush=True,
    )
    desk.open = True
    try:
        yield
    finally:
        desk.open = False


def _supervise(
    host: SupervisorHost,
    fail_fast: bool,
    asked: dict,
    stopped: dict,
    place: Placement,
    served: Callable[[], AbstractContextManager[None]],
    autoscale: Setup | None,
) -> None:
    """Start, supervise until a stop is asked (or a role fails), stop in reverse waves, sign off."""
    sup = host.sup

    def ready(_seconds: float) -> None:
        urls = ", ".join(r.url for r in sup.record.entry_roles() if r.url)
        print(f"muse-launch: {sup.plan.name} ready at {now_iso(time.time())}: {urls}", flush=True)

    outcome = host.run(fail_fast, ready, place, served, autoscale)
    if outcome is Outcome.FAILED:
        failed = sup.record.role(sup.failed_role) if sup.failed_role else None
        print(
            f"muse-launch: role {failed.name if failed else '?'} failed: "
            f"{failed.reason if failed else ''}; stopping everything",
            flush=True,
        )
    if asked.get("grace") is not None:  # `down --grace S`
        grace = float(asked["grace"])
        sup.record = replace(sup.record, roles=tuple(replace(r, grace=grace) for r in sup.record.roles))
    report = sup.wind_down()
    stopped["killed"], stopped["survivors"] = list(report.killed), list(report.survivors)
    for line in report.killed:
        print(f"muse-launch: had to SIGKILL {line}", flush=True)
    for line in report.survivors:
        print(f"muse-launch: still there after SIGKILL: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="muse_launch.slurm.batch")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--fail-fast", action="store_true")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("topology")
    args = parser.parse_args(argv)
    reset_inherited()  # the roles it starts get the stop signals at their defaults (muse_launch/signals.py)
    files = SlurmFiles(RunDir(Path(args.run_dir)))
    code = 1
    stopped: dict = {}
    try:
        code = run(args, stopped)
    except UserError as exc:  # the file no longer loads or passes its checks
        print(f"muse-launch: {exc}", flush=True)
    except BaseException:
        traceback.print_exc()
    finally:
        files.write_json(files.done, {"exit": code, "at": time.time(), **stopped})
    return code


if __name__ == "__main__":
    sys.exit(main())
