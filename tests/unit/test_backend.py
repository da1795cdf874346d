"""The backend seam: state.json names the backend that owns a deployment, read back as untrusted; where it
cannot be read, the backend whose files are in the run directory; run-time changes a backend cannot make
yet are a clear NotSupported; one entry-URL rule."""

from __future__ import annotations

import json

import pytest

from muse_launch.backends import backend_named, backend_of, backends, claim_for
from muse_launch.change import AddInstance, RemoveInstance, RestartInstance, ScaleRole
from muse_launch.errors import UsageError
from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.rundir.state import RunDir, StateDamaged, read_state, write_state
from muse_launch.slurm.files import SlurmFiles
from muse_launch.supervise.planned_record import planned_record

PLAN = Plan(
    "demo",
    (
        LaunchSpec(
            name="worker",
            role="worker",
            kind="worker",
            engine="sglang",
            launcher=("sglang", "serve"),
            args=(),
            ports={"http": 30001},
        ),
        LaunchSpec(
            name="router",
            role="router",
            kind="router",
            engine="sglang-router",
            launcher=("sglang-router",),
            args=(),
            ports={"http": 8000},
            probe=Probe(ProbeKind.HTTP, ("/readiness",)),
            depends_on=("worker",),
        ),
    ),
    (("worker",), ("router",)),
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    return tmp_path


def test_the_record_names_its_backend_and_it_is_the_one_that_answers(home):
    run_dir = RunDir.of("demo")
    write_state(run_dir, planned_record(PLAN, "demo.yaml", str))
    assert read_state(run_dir).backend == "local" and backend_of(run_dir).name == "local"
    write_state(run_dir, planned_record(PLAN, "demo.yaml", str, backend="slurm"))
    assert json.loads(run_dir.state_file.read_text())["backend"] == "slurm"
    assert backend_of(run_dir).name == "slurm"


def test_a_backend_name_read_back_is_checked(home):
    run_dir = RunDir.of("demo")
    write_state(run_dir, planned_record(PLAN, "demo.yaml", str))
    state = json.loads(run_dir.state_file.read_text())
    run_dir.state_file.write_text(json.dumps({**state, "backend": "../../etc"}))
    with pytest.raises(StateDamaged, match="backend"):
        read_state(run_dir)


def test_without_a_readable_record_the_backend_is_the_one_whose_files_are_there(home):
    run_dir = RunDir.of("demo")
    run_dir.path.mkdir(parents=True)
    run_dir.state_file.write_text("{ torn")
    assert backend_of(run_dir).name == "local"
    SlurmFiles(run_dir).dir.mkdir()
    SlurmFiles(run_dir).job.write_text("{}")
    assert backend_of(run_dir).name == "slurm"
    # a state.json without its backend is damaged: the files there name the backend
    state = planned_record(PLAN, "demo.yaml", str).to_json()
    del state["backend"]
    run_dir.state_file.write_text(json.dumps(state))
    with pytest.raises(StateDamaged, match="no 'backend'"):
        read_state(run_dir)
    assert backend_of(run_dir).name == "slurm"


def test_up_on_names_a_remote_backend_only():
    assert backend_named("slurm").name == "slurm" and backend_named("k8s").name == "k8s"
    for name in ("local", "kubernetes"):
        with pytest.raises(UsageError, match=f"--on {name}: unknown; one of: slurm, k8s"):
            backend_named(name)


def test_run_time_changes_on_kubernetes_need_it_up_there_and_say_so(home):
    from muse_launch.errors import RuntimeFailure

    backend, run_dir = backends()["k8s"], RunDir.of("demo")
    for change in (
        AddInstance("decode"),
        RemoveInstance("decode-1"),
        RestartInstance("decode-0"),
        ScaleRole("d", 3),
    ):
        with pytest.raises(RuntimeFailure, match="'demo' is not up on Kubernetes") as caught:
            backend.change(run_dir, change)
        assert "--on k8s" in caught.value.fix


@pytest.mark.parametrize(
    "name, says", [("local", "no supervisor answers"), ("slurm", "no supervisor runs on its SLURM job")]
)
def test_run_time_changes_need_the_supervisor_and_say_so_without_one(home, name, says):
    from muse_launch.errors import RuntimeFailure

    backend, run_dir = backends()[name], RunDir.of("demo")
    run_dir.path.mkdir(parents=True)
    for change in (AddInstance("decode"), RemoveInstance("decode-1"), RestartInstance("decode-0")):
        with pytest.raises(RuntimeFailure, match=says) as caught:
            backend.change(run_dir, change)
        assert "down demo" in caught.value.fix


def test_claiming_a_name_asks_every_other_backend_to_release_it(home, monkeypatch):
    released = []
    monkeypatch.setattr(
        "muse_launch.slurm.slurm_backend.SlurmBackend.release", lambda self, run_dir: released.append(1)
    )
    claim_for("local")(RunDir.of("demo"))
    assert released == [1]


def test_one_entry_rule_the_routers_else_the_last_role_with_a_url():
    record = planned_record(PLAN, "demo.yaml", str)
    assert [r.name for r in record.entry_roles()] == ["router"]
    alone = planned_record(Plan("demo", PLAN.specs[:1], (("worker",),)), "demo.yaml", str)
    assert [r.name for r in alone.entry_roles()] == ["worker"]
