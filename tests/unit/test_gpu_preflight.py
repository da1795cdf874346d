"""The GPU preflight of `up`, the GPU release `down` waits for, each role's GPU memory in `status`:
their logic over a fake GPU view, with real processes where a holder must be told ours or not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from muse_launch.errors import RuntimeFailure
from muse_launch.host.gpus import Gpu, GpuHolder, GpuView
from muse_launch.local.gpu_runtime import (
    GpuNeed,
    Owners,
    await_gpu_release,
    gpu_needs,
    gpu_problems,
    one_host,
    preflight_for,
)
from muse_launch.plan.build import build_plan
from muse_launch.plan.spec import Plan, Probe, ProbeKind
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord
from muse_launch.topology.hardware import PROFILES
from muse_launch.topology.load import load_topology

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


def test_each_gpu_process_needs_its_mem_fraction_or_the_models_share():
    plan, topology = epd()
    needs = {n.name: n for n in gpu_needs(plan, topology)}
    assert sorted(needs) == ["decode", "encoder", "prefill"]  # the router plans no GPU
    assert needs["prefill"].fraction == 0.8 and needs["prefill"].gpus == (0, 1, 2, 3)
    assert needs["encoder"].fraction is None and needs["encoder"].share_bytes is None  # loads no experts
    plan, topology = epd(("roles.decode.mem_fraction=null",))
    decode = next(n for n in gpu_needs(plan, topology) if n.name == "decode")
    assert (
        decode.fraction is None and decode.share_bytes == 640 * 10**9 // 4
    )  # the NVFP4 checkpoint over 4 GPUs
    assert "640 GB over 4 GPUs" in decode.why(b300s().gpu(4))


def test_the_planned_gpus_fit_a_host_that_has_them_free():
    assert problems_of(b300s()) == ([], [])


def test_a_missing_gpu_names_the_hosts_count():
    [problem], _ = problems_of(b300s(4))
    assert problem.text == (
        "GPU 4-7 are planned (decode on 4-7), but this host has 4 GPUs (0-3: 4 x NVIDIA B300 SXM6 AC)"
    )
    assert problem.fix == "run the file on a host with 8 GPUs, or give roles.decode.gpus GPUs of this host"


def test_a_b300_file_on_an_h200_host_names_both_and_the_fix():
    problems, _ = problems_of(h200s(8))
    [model] = [p for p in problems if p.text.startswith("hardware:")]
    assert model.text == (
        "hardware: b300: the file is written for NVIDIA B300 (8 x 288 GB), but GPU 0-7 of this "
        "host are 8 x NVIDIA H200"
    )
    assert model.fix.startswith(
        "write the file for this host (`hardware: h200`, or `muse-launch init --hardware h200"
    )


def test_a_gpu_held_by_another_process_is_named_with_its_memory_and_the_fix():
    problems, _ = problems_of(b300s(holders={0: [GpuHolder(564, int(100.6 * GIB), "python3 serve.py")]}))
    [problem] = problems
    assert problem.text.startswith(
        "GPU 0: 100.6 of 268.0 GiB held by pid 564 (python3 serve.py); 166.8 GiB is "
        "free, and prefill needs 214.4 GiB (mem_fraction 0.8)"
    )
    assert (
        problem.fix == "stop pid 564 (python3 serve.py), or lower roles.prefill.mem_fraction to 0.62 or less"
    )
    assert str(problem).endswith("\n    fix: " + problem.fix)


def test_the_issues_h200_case_reads_as_the_issue_says():
    view = h200s(1, {0: [GpuHolder(564, int(100.6 * GIB), "python3 serve.py")]})
    need = GpuNeed("worker", "worker", (0,), 60 * GIB / H200)
    [problem], _ = gpu_problems([need], PROFILES["h200"], view, Owners([]))
    assert problem.text.startswith(
        "GPU 0: 100.6 of 139.8 GiB held by pid 564 (python3 serve.py); 38.6 GiB is free"
    )


def test_a_role_without_a_budget_on_a_held_gpu_cannot_be_told_to_fit():
    # The encoder shares GPU 1 with prefill and sets no mem_fraction (the cookbook's layout).
    problems, _ = problems_of(b300s(holders={1: [GpuHolder(9, 2 * GIB, "python3 other.py")]}))
    [problem] = problems
    assert problem.text == (
        "GPU 1: 2.0 of 268.0 GiB held by pid 9 (python3 other.py), and encoder sets no "
        "mem_fraction, so whether it fits cannot be told"
    )
    assert "set roles.encoder.mem_fraction" in problem.fix and "--skip-gpu-check" in problem.fix


def test_a_holder_that_leaves_room_is_a_note(monkeypatch):
    monkeypatch.setattr(
        "muse_launch.local.gpu_runtime.command_of", lambda pid: None
    )  # pid 9 is no process visible here
    problems, notes = problems_of(b300s(holders={5: [GpuHolder(9, 2 * GIB, None)]}))
    assert problems == []
    assert notes == [
        "GPU 5: 2.0 of 268.0 GiB held by pid 9 (not visible from here); 265.4 GiB free is enough for decode"
    ]


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


def test_down_waits_until_the_deployments_gpu_memory_is_released():
    record = record_with(None)
    reads = iter([h200s(2, {0: [GpuHolder(4242, 60 * GIB)]})] * 3)  # a killed pid the driver still lists

    def read() -> GpuView:
        return next(reads, h200s(2))

    release = await_gpu_release(record, read, {4242: "prefill"}, seconds=5)
    assert release.line == "GPUs 0-1 free" and release.held == ()


def test_down_names_a_holder_that_stays_and_leaves_foreign_ones_alone():
    record = record_with(None)
    view = h200s(2, {0: [GpuHolder(4242, 60 * GIB)], 1: [GpuHolder(564, 9 * GIB, "python3 serve.py")]})
    release = await_gpu_release(record, lambda: view, {4242: "prefill"}, seconds=0.2)
    assert release.held == (
        "GPU 0: 60.0 of 139.8 GiB held by pid 4242 (not visible from here) (was role prefill)",
    )
    release = await_gpu_release(record, lambda: view, {}, seconds=0.2)
    assert release.held == ()
    assert release.line.startswith(
        "GPUs 0-1: nothing of gpu-test holds memory; also held, not by gpu-test: "
        "GPU 0: 60.0 of 139.8 GiB held by pid 4242"
    )
    assert await_gpu_release(record, lambda: GpuView("none", unavailable="no NVML"), {}).line is None


def preflight(view: GpuView | None, skipped: str | None = None, sets: tuple[str, ...] = ()):
    plan, topology = epd(sets)
    reads = []

    def read() -> GpuView:
        reads.append(1)
        return view

    return plan, preflight_for(plan, topology, read, skipped), reads


def test_preflight_says_one_line_when_it_passes_or_cannot_look():
    said: list[str] = []
    plan, check, reads = preflight(b300s())
    check.require(plan, lambda: [], said.append)
    assert said == [
        "GPUs 0-7: 8 x NVIDIA B300 SXM6 AC, with the memory their roles need (fake, read in 0 ms)"
    ]
    plan, check, reads = preflight(None, skipped="--skip-gpu-check")
    check.require(plan, lambda: [], said.append)
    assert said[-1] == "GPU check skipped: --skip-gpu-check" and reads == []
    plan, check, reads = preflight(GpuView("none", unavailable="NVML: NVML Shared Library Not Found"))
    check.require(plan, lambda: [], said.append)
    assert said[-1] == "GPU check skipped: no GPU library answers here (NVML: NVML Shared Library Not Found)"


def test_preflight_fails_before_anything_starts_with_every_problem():
    plan, check, _ = preflight(h200s(1))
    with pytest.raises(RuntimeFailure) as failure:
        check.require(plan, lambda: [], print)
    text = str(failure.value)
    assert text.startswith(
        "epd-b300: the host's GPUs cannot run it; nothing was started:\n  GPU 1-7 are planned"
    )
    assert text.count("\n    fix: ") == 2  # the missing GPUs, the model


def test_preflight_checks_only_what_only_starts_and_nothing_on_a_plan_without_gpus():
    plan, check, reads = preflight(b300s(4))
    router = Plan(plan.name, (plan.spec("router"),), (("router",),))
    check.require(router, lambda: [], print)
    assert reads == []


def test_gpu_roles_number_gpus_in_pci_order_unless_the_file_says_otherwise():
    plan, _ = epd(("roles.decode.env={CUDA_DEVICE_ORDER: FASTEST_FIRST}",))
    assert plan.spec("prefill").env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert plan.spec("decode").env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert "CUDA_DEVICE_ORDER" not in plan.spec("router").env  # no GPU


def test_status_json_carries_each_roles_gpu_memory_or_null():
    from muse_launch.local.status import gpu_memory_now, local_view
    from muse_launch.render_status import status_json

    record = record_with(None)
    held = {"prefill": {0: 60 * GIB, 1: 50 * GIB}}
    out = status_json(local_view(record, {"prefill": None}, gpu_memory=held))
    assert out["roles"][0]["gpu_memory"] == {
        "total_bytes": 110 * GIB,
        "by_gpu": {"0": 60 * GIB, "1": 50 * GIB},
    }
    unreadable = gpu_memory_now(record, lambda: GpuView("none", unavailable="no NVML"))
    assert unreadable is None
    shown = status_json(local_view(record, {"prefill": None}, gpu_memory=unreadable))
    assert shown["roles"][0]["gpu_memory"] is None and shown["roles"][0]["health"] is None


def test_a_multi_node_plan_is_judged_one_host_at_a_time():
    loaded = load_topology(ROOT / "topologies" / "h200-bf16-2node.yaml", environ={})
    needs = gpu_needs(build_plan(loaded.topology), loaded.topology)
    assert [n.name for n in needs] == ["server@node0", "server@node1"]
    [node0] = one_host(needs)
    assert node0.name == "server@node0" and node0.share_bytes == 1959 * 10**9 // 16
    assert gpu_problems([node0], PROFILES["h200"], h200s(8), Owners([])) == ([], [])
