"""SLURM placement as a transformation of the checked plan, the batch script, and the step argv:
pure functions, no cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from muse_launch.checks import Severity, recheck_placement
from muse_launch.core import load_plan
from muse_launch.engines.argv import last_value
from muse_launch.rundir.state import RunDir
from muse_launch.slurm.files import SlurmFiles
from muse_launch.slurm.placement import AllocatedNode, allocated_plan, placement, shape
from muse_launch.slurm.processes import cpu_shares, shared_gpus, srun_argv
from muse_launch.slurm.script import render_script
from muse_launch.slurm.step import narrowed

REPO = Path(__file__).resolve().parents[2]
ALLOCATION = [
    AllocatedNode("gpu-a", "10.9.0.11"),
    AllocatedNode("gpu-b", "10.9.0.12"),
    AllocatedNode("gpu-c", "10.9.0.13"),
]


def checked(name: str):
    loaded = load_plan(REPO / "topologies" / f"{name}.yaml")
    return loaded.plan, loaded.loaded.topology


def test_sglang_two_node_ranks_meet_at_the_first_allocated_node():
    plan, topology = checked("h200-bf16-2node")
    moved = allocated_plan(plan, topology, ALLOCATION, rehearse=False, python="py")
    rank0, rank1 = moved.spec("server@node0"), moved.spec("server@node1")
    assert (rank0.host, rank1.host) == ("10.9.0.11", "10.9.0.12")
    assert rank0.bind == rank1.bind == "0.0.0.0"  # a real server listens on every interface of its node
    assert last_value(rank1.args, "--dist-init-addr") == "10.9.0.11:20000"
    assert last_value(rank1.args, "--node-rank") == "1" and last_value(rank1.args, "--nnodes") == "2"
    assert {n: a.name for n, a in placement(plan, topology, ALLOCATION).items()} == {
        "server@node0": "gpu-a",
        "server@node1": "gpu-b",
    }


def test_vllm_multi_node_master_address_moves():
    plan, topology = checked("vllm-multinode-tp-b200")
    moved = allocated_plan(plan, topology, ALLOCATION, rehearse=False, python="py")
    assert last_value(moved.spec("server@node1").args, "--master-addr") == "10.9.0.11"


def test_pd_on_two_nodes_router_beside_its_prefill_with_moved_urls():
    plan, topology = checked("helion-gb300")
    where = placement(plan, topology, ALLOCATION)
    assert where["prefill@tray0"].name == where["router"].name == "gpu-a"
    assert where["decode@tray1"].name == "gpu-b"
    router = allocated_plan(plan, topology, ALLOCATION, rehearse=False, python="py").spec("router")
    assert "http://10.9.0.11:30001" in router.args and "http://10.9.0.12:30002" in router.args


def test_rehearsal_on_the_allocation_binds_each_node_address_and_simulates():
    plan, topology = checked("helion-gb300")
    moved = allocated_plan(plan, topology, ALLOCATION, rehearse=True, python="/venv/python")
    decode = moved.spec("decode@tray1")
    assert decode.bind == decode.host == "10.9.0.12"
    assert decode.launcher[:3] == ("/venv/python", "-m", "muse_launch.sim")
    assert not any(a.startswith("127.") for s in moved.specs for a in s.args), (
        "a loopback address left behind"
    )


def test_a_file_without_nodes_is_one_node():
    plan, topology = checked("pd-b300-low-latency")
    s = shape(plan, topology)
    assert s.count == 1 and s.gpus_per_node == 8 and not s.shared
    moved = allocated_plan(plan, topology, ALLOCATION, rehearse=False, python="py")
    assert {spec.host for spec in moved.specs} == {"10.9.0.11"}


def test_roles_sharing_gpus_ask_for_the_node_and_narrow_in_the_step():
    plan, topology = checked("epd-b300")  # the encoder runs on its prefill's GPUs 0-1
    s = shape(plan, topology)
    assert (s.count, s.gpus_per_node, s.shared) == (1, 8, ("this host",))
    where = placement(plan, topology, ALLOCATION)
    assert shared_gpus(where, list(plan.specs))["encoder"] == 8
    assert "--gres=gpu:8" in srun_argv(plan.spec("encoder"), where["encoder"], 0, 8)
    assert narrowed({"CUDA_VISIBLE_DEVICES": "3,4,5,6,7,8,9,10"}, [0, 1])["CUDA_VISIBLE_DEVICES"] == "3,4"


def test_each_gpu_role_its_own_gpus_the_router_none():
    plan, topology = checked("helion-gb300")
    where = placement(plan, topology, ALLOCATION)
    cpus = cpu_shares(where, list(plan.specs), 64)
    prefill = srun_argv(plan.spec("prefill@tray0"), where["prefill@tray0"], cpus["prefill@tray0"])
    router = srun_argv(plan.spec("router"), where["router"], cpus["router"])
    assert {
        "--exact",
        "--gres=gpu:4",
        "--cpus-per-task=64",
        "--nodelist=gpu-a",
        "--job-name=prefill@tray0",
    } <= set(prefill)
    assert {"--overlap", "--gres=none", "--job-name=router"} <= set(router)


def test_an_allocation_too_small_is_refused():
    plan, topology = checked("helion-gb300")
    with pytest.raises(ValueError, match="needs 2 nodes"):
        placement(plan, topology, ALLOCATION[:1])


def test_the_script_asks_for_the_shape_and_runs_the_batch_supervisor(tmp_path: Path):
    plan, topology = checked("h200-bf16-2node")
    files = SlurmFiles(RunDir(tmp_path / "h200-bf16-2node"))
    script = render_script(topology, files, "/venv/python", rehearse=True, sets=["a=b c"])
    assert script.startswith("#!/bin/bash\n")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --exclusive",
        "#SBATCH --job-name=h200-bf16-2node",
        f"#SBATCH --output={files.batch_log}",
    ):
        assert line in script.splitlines()
    assert (
        f"/venv/python -m muse_launch.slurm.batch --run-dir {files.run_dir.path} --rehearse --set 'a=b c' "
        f"{files.topology}" in script
    )


@pytest.mark.parametrize("path", sorted((REPO / "topologies").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_topology_moves_onto_an_allocation_and_passes_its_checks_again(path: Path):
    loaded = load_plan(path)
    plan, topology = loaded.plan, loaded.loaded.topology
    count = shape(plan, topology).count
    assert count == max(
        1,
        len({s.node for s in plan.specs if s.node})
        + (
            1
            if any(
                s.node is None and s.host not in {n.address for n in topology.nodes.values()}
                for s in plan.specs
            )
            else 0
        ),
    )
    for rehearse in (False, True):
        moved = allocated_plan(plan, topology, ALLOCATION[:count], rehearse=rehearse, python="py")
        errors = [f for f in recheck_placement(topology, moved) if f.severity is Severity.ERROR]
        assert not errors, [f.format(loaded.loaded) for f in errors]
        assert {s.host for s in moved.specs} <= {a.address for a in ALLOCATION[:count]}


def test_the_batch_watcher_passes_downs_request_to_the_supervisor_and_keeps_beating(tmp_path: Path):
    """`down` writes slurm/down-request; the batch host's watcher asks the supervisor to stop once, with
    `down --grace`, and its heartbeat goes on (a watcher that dies leaves `down` thinking the supervisor
    is gone)."""
    import threading
    import time

    from harness import wait_for

    from muse_launch.slurm.batch import _watch
    from muse_launch.supervise.supervisor import Supervisor

    looks: list[Path] = []  # each of the watcher's looks at down's request

    class Watched(SlurmFiles):
        def read_json(self, path: Path):
            looks.append(path)
            return super().read_json(path)

    files = Watched(RunDir(tmp_path))
    files.dir.mkdir(parents=True)
    sup = Supervisor.__new__(Supervisor)  # only the stop request's state: no plan, no processes
    sup.stops, sup.wakeup = 0, threading.Event()
    stopping, asked = threading.Event(), {}
    watcher = threading.Thread(target=_watch, args=(files, sup, stopping, asked), daemon=True)
    watcher.start()
    try:
        files.write_json(files.down_request, {"grace": 7, "at": time.time()})
        wait_for(lambda: sup.stop_requested)
        seen = len(looks)
        wait_for(lambda: len(looks) >= seen + 3)  # three more looks at the request: asked once, still alive
        assert sup.stops == 1 and asked == {"grace": 7}
        assert watcher.is_alive() and files.supervisor_alive()
    finally:
        stopping.set()
        watcher.join(5)
