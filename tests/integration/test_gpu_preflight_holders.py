"""The GPU preflight of `up`, the GPU release `down` waits for, each role's GPU memory in `status`:
their logic over a fake GPU view, with real processes where a holder must be told ours or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from muse_launch.host.gpus import Gpu, GpuHolder, GpuView
from muse_launch.local.gpu_runtime import (
    Owners,
    deployment_holders,
    gpu_needs,
    gpu_problems,
    role_gpu_memory,
)
from muse_launch.plan.build import build_plan
from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.proc.process import Marker, ProcessRef
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord
from muse_launch.topology.hardware import PROFILES
from muse_launch.topology.load import load_topology

pytestmark = pytest.mark.integration  # starts processes

ROOT = Path(__file__).resolve().parents[2]


EPD = ROOT / "topologies" / "epd-b300.yaml"


GIB = 1 << 30


H200 = int(139.8 * GIB)


def h200s(
    n: int, holders: dict[int, list[GpuHolder]] | None = None, name: str = "NVIDIA H200", total: int = H200
) -> GpuView:
    holders = holders or {}
    return GpuView(
        "fake",
        tuple(
            Gpu(
                i,
                name,
                total,
                int(0.6 * GIB) + sum(h.used_bytes or 0 for h in holders.get(i, ())),
                tuple(holders.get(i, ())),
            )
            for i in range(n)
        ),
    )


def b300s(n: int = 8, holders: dict[int, list[GpuHolder]] | None = None) -> GpuView:
    return h200s(n, holders, name="NVIDIA B300 SXM6 AC", total=268 * GIB)


def epd(sets: tuple[str, ...] = ()):
    loaded = load_topology(EPD, sets, environ={})
    return build_plan(loaded.topology), loaded.topology


def problems_of(view: GpuView, sets: tuple[str, ...] = (), owners: Owners | None = None):
    plan, topology = epd(sets)
    return gpu_problems(gpu_needs(plan, topology), PROFILES[topology.hardware], view, owners or Owners([]))


def sleeper(**env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, **env})


def record_with(
    proc: subprocess.Popen | None, name: str = "gpu-test", gpus: tuple[int, ...] = (0, 1)
) -> DeploymentRecord:
    ref = ProcessRef.of(proc.pid) if proc else None
    role = RoleRecord(
        "prefill",
        "prefill",
        RoleState.READY,
        gpus,
        None,
        {},
        Probe(ProbeKind.PROCESS),
        "127.0.0.1",
        "SIGTERM",
        1.0,
        ref,
    )
    return DeploymentRecord(name, "gpu-test.yaml", (("prefill",),), (role,))


def test_a_holder_of_ours_is_named_with_its_deployment_and_role():
    marked = sleeper(**Marker("other", "/tmp/other").env("decode"))
    try:
        view = b300s(holders={4: [GpuHolder(marked.pid, 250 * GIB)]})
        [problem], _ = problems_of(view)
        assert f"held by pid {marked.pid} (role decode of other, {sys.executable} -c" in problem.text
        assert problem.fix.startswith("run `muse-launch down other`, or lower roles.decode.mem_fraction to ")
    finally:
        marked.kill()
        marked.wait()


def test_a_roles_gpu_memory_is_found_through_its_leader_when_the_marker_is_gone():
    leader = sleeper()  # no marker: like an engine that rewrote its title; found as the role's leader
    try:
        record = record_with(leader)
        view = h200s(
            2,
            {
                0: [GpuHolder(leader.pid, 60 * GIB)],
                1: [GpuHolder(leader.pid, 50 * GIB), GpuHolder(1, 3 * GIB)],
            },
        )
        assert role_gpu_memory(record, view) == {"prefill": {0: 60 * GIB, 1: 50 * GIB}}
        assert deployment_holders(record, view) == {leader.pid: "prefill"}
    finally:
        leader.kill()
        leader.wait()
