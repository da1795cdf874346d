"""Where `scale` puts a new instance in a running SLURM job (slurm/change_placement.py): the next replica
on its role's
node with its role's GPU count and stepped ports, refused naming the node and what it lacks where the
allocation has no room; CPUs shared by GPU share so free GPUs keep theirs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from muse_launch.core import load_plan
from muse_launch.errors import RuntimeFailure
from muse_launch.plan.spec import Plan
from muse_launch.proc.process import Marker
from muse_launch.rundir.state import RunDir
from muse_launch.slurm.change_placement import slurm_placement
from muse_launch.slurm.files import SlurmFiles
from muse_launch.slurm.placement import AllocatedNode, allocated_plan, placement
from muse_launch.slurm.processes import SlurmProcesses, cpu_shares

REPO = Path(__file__).resolve().parents[2]
ALLOCATION = [AllocatedNode("gpu-a", "127.0.0.1"), AllocatedNode("gpu-b", "127.0.0.2")]


def placed(tmp_path, gpus_per_node: int):
    loaded = load_plan(REPO / "examples" / "slurm-scale.yaml")
    topology = loaded.loaded.topology
    plan = allocated_plan(loaded.plan, topology, ALLOCATION, rehearse=False, python="py")
    where = placement(loaded.plan, topology, ALLOCATION)
    files = SlurmFiles(RunDir(tmp_path / "demo"))
    processes = SlurmProcesses("1", files.run_dir, Marker("demo", "x"), dict(where), {})
    running = list(plan.specs)
    place = slurm_placement(topology, ALLOCATION, False, processes, files, gpus_per_node, lambda: running)
    return place, processes, running, files


def test_the_next_decode_goes_to_its_node_with_its_gpu_count_and_the_next_port(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "16")
    place, processes, running, files = placed(tmp_path, gpus_per_node=4)
    plan = place.replan({"prefill": 1, "decode": 2, "router": 1})
    new = plan.spec("decode-1")
    assert new.host == "127.0.0.2" and len(new.gpus) == 1 and new.ports["http"] == 30003
    said: list[str] = []
    place.preflight(Plan(plan.name, (new,), (("decode-1",),)), said.append)
    assert said == ["decode-1: placed on gpu-b (1 GPU)"]
    assert processes.placement["decode-1"].name == "gpu-b" and processes.cpus["decode-1"] == 4
    assert files.read_json(files.placement)["roles"]["decode-1"]["node"] == "gpu-b"  # for `status`


def test_no_free_gpu_on_the_node_is_refused_naming_it_and_the_fix(tmp_path):
    place, processes, running, _ = placed(tmp_path, gpus_per_node=1)
    new = place.replan({"prefill": 1, "decode": 2, "router": 1}).spec("decode-1")
    with pytest.raises(RuntimeFailure) as caught:
        place.preflight(Plan("x", (new,), (("decode-1",),)), print)
    assert "node gpu-b has 0 of its 1 allocated GPUs free (held: decode 1); decode-1 needs 1" in str(
        caught.value
    )
    assert "--sbatch=--gres=gpu:2" in caught.value.fix and "--sbatch=--nodes=N" in caught.value.fix
    assert "decode-1" not in processes.placement  # nothing placed


def test_a_port_another_instance_holds_on_the_node_is_refused(tmp_path):
    place, processes, running, _ = placed(tmp_path, gpus_per_node=8)
    new = place.replan({"prefill": 1, "decode": 2, "router": 1}).spec("decode-1")
    running.append(replace(new, name="x"))  # another instance of it, already on the new one's ports
    processes.placement["x"] = ALLOCATION[1]
    with pytest.raises(RuntimeFailure, match="its http port 30003 on node gpu-b is taken \\(x\\)"):
        place.preflight(Plan("x", (new,), (("decode-1",),)), print)


def test_cpus_go_by_gpu_share_of_the_node_so_free_gpus_keep_theirs():
    loaded = load_plan(REPO / "examples" / "slurm-scale.yaml")
    where = placement(loaded.plan, loaded.loaded.topology, ALLOCATION)
    shares = cpu_shares(where, list(loaded.plan.specs), 16, gpus_per_node=4)
    assert shares == {"prefill": 4, "decode": 4, "router": 0}
    assert cpu_shares(where, list(loaded.plan.specs), 16) == {"prefill": 16, "decode": 16, "router": 0}


def test_instances_placed_by_the_same_change_count_before_they_start(tmp_path):
    """`scale decode 1 -> 3` on a node with room for one more: the second is refused before either starts."""
    place, processes, running, _ = placed(tmp_path, gpus_per_node=2)
    plan = place.replan({"prefill": 1, "decode": 3, "router": 1})
    first, second = plan.spec("decode-1"), plan.spec("decode-2")
    place.preflight(Plan("x", (first,), (("decode-1",),)), print)
    with pytest.raises(RuntimeFailure, match="node gpu-b has 0 of its 2 allocated GPUs free"):
        place.preflight(Plan("x", (second,), (("decode-2",),)), print, (first,))
    assert "decode-2" not in processes.placement
