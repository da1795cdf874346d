"""What `scale` and `restart --rolling` refuse on Kubernetes says why and what to do instead: an encoder, a
router, a role spanning nodes (k8s/rollout.py), read from a run directory as `up --on k8s` leaves it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from muse_launch.errors import NotSupported
from muse_launch.export import build
from muse_launch.k8s import deployment_record as records
from muse_launch.k8s.cluster_ops import ClusterOps, K8sOptions
from muse_launch.k8s.rollout import Rollout
from muse_launch.rundir.state import K8S, RunDir, write_state
from muse_launch.supervise.planned_record import planned_record

ROOT = Path(__file__).resolve().parents[2]


def deployed(file: str, flavour: str) -> RunDir:
    done = build(ROOT / file, flavour)
    export = done.export
    run_dir = RunDir.of(export.plan.name)
    run_dir.path.mkdir(parents=True, exist_ok=True)
    write_state(run_dir, planned_record(export.plan, file, export.loaded.redact, backend=K8S))
    cluster = SimpleNamespace(kubeconfig="/nowhere", context="c", server="https://127.0.0.1:6443")
    options = K8sOptions(flavour=flavour)
    records.write(run_dir, ClusterOps(print)._record(cluster, export, done.files, options, ROOT / file))
    return run_dir


@pytest.mark.parametrize("flavour", ["lws", "rbg"])
def test_an_encoder_and_a_router_are_refused_with_why_and_what_to_do(flavour, tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = deployed("topologies/epd-b300.yaml", flavour)
    with pytest.raises(NotSupported) as refused:
        Rollout(run_dir).instances("encoder")
    assert "language workers' command lines" in str(refused.value), refused.value
    assert "`muse-launch down epd-b300` and `up --on k8s`" in refused.value.fix
    with pytest.raises(NotSupported) as refused:
        Rollout(run_dir).instances("router")
    assert "is a router" in str(refused.value) and refused.value.fix, refused.value
    assert [i.name for i in Rollout(run_dir).instances("decode")] == ["decode"]


def test_a_role_spanning_nodes_is_refused_with_why_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = deployed("topologies/h200-bf16-2node.yaml", "lws")
    with pytest.raises(NotSupported) as refused:
        Rollout(run_dir).instances("server")
    assert "spans nodes (server@node0, server@node1)" in str(refused.value), refused.value
    assert "LeaderWorkerSet group" in str(refused.value) and "roles.server" in refused.value.fix


def test_an_edited_file_that_relaunches_an_encoder_is_refused_before_anything_is_applied(
    tmp_path, monkeypatch
):
    import yaml

    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = deployed("topologies/epd-b300.yaml", "lws")
    data = yaml.safe_load((ROOT / "topologies/epd-b300.yaml").read_text())
    encoder = next(n for n, r in data["roles"].items() if r["kind"] == "encoder")
    data["roles"][encoder]["mem_fraction"] = 0.1
    edited = tmp_path / "epd-b300.yaml"
    edited.write_text(yaml.safe_dump(data))
    with pytest.raises(NotSupported) as refused:  # no cluster is reached: it is refused first
        Rollout(run_dir).adopt(str(edited))
    assert f"a new launch of {encoder} is not made" in str(refused.value), refused.value
    assert "nothing was changed" in str(refused.value) and "down epd-b300" in refused.value.fix
    assert records.read(run_dir).adopted["file"].endswith("topologies/epd-b300.yaml")


def test_the_router_key_is_sent_from_the_environment_or_its_secret_and_never_said(tmp_path, monkeypatch):
    import base64

    from muse_launch.errors import RuntimeFailure
    from muse_launch.rundir.state import read_state

    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    monkeypatch.setenv("ROUTER_KEY", "from-env-secret")
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(
        "version: 1\nname: keyed\nhardware: cpu\nmodel: Qwen/Qwen3-0.6B\nengine: sglang\nhost: 127.0.0.1\n"
        "roles:\n  prefill: {kind: prefill, port: 31001, bootstrap_port: 31002}\n"
        "  decode: {kind: decode, port: 31003}\n"
        "  router: {kind: router, port: 8100, prefill: [prefill], decode: [decode], "
        'args: ["--api-key", "${env:ROUTER_KEY}"]}\n'
    )
    done = build(keyed, "lws", images={"": "example.org/muse:1"})
    export = done.export
    run_dir = RunDir.of("keyed")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    sources = export.loaded.secret_sources
    made = planned_record(export.plan, str(keyed), export.loaded.redact, backend=K8S, sources=sources)
    write_state(run_dir, made)
    cluster = SimpleNamespace(kubeconfig="/nowhere", context="c", server="https://127.0.0.1:6443")
    records.write(run_dir, ClusterOps(print)._record(cluster, export, done.files, K8sOptions(), keyed))
    router = next(r for r in read_state(run_dir).roles if r.kind == "router")
    assert router.api_key == "${env:ROUTER_KEY}"  # the reference, never the value
    assert "from-env-secret" not in run_dir.state_file.read_text()

    class Core:
        def __init__(self, data):
            self.data = data

        def read_namespaced_secret(self, name, namespace, **_):
            assert name == "keyed-secrets"
            return SimpleNamespace(data=self.data)

    def cluster_with(data):
        return SimpleNamespace(core=lambda: Core(data))

    rollout = Rollout(run_dir)
    assert "from-env-secret" in str(rollout._router_headers(cluster_with({}), router))
    monkeypatch.delenv("ROUTER_KEY")
    value = base64.b64encode(b"from-the-secret").decode()
    assert "from-the-secret" in str(rollout._router_headers(cluster_with({"ROUTER_KEY": value}), router))
    with pytest.raises(RuntimeFailure) as missing:
        rollout._router_headers(cluster_with({}), router)
    said = f"{missing.value} {missing.value.fix}"
    assert "ROUTER_KEY" in said and "from-the-secret" not in said and "from-env-secret" not in said


def test_a_relaunch_waits_past_a_pod_made_again_from_the_old_template(tmp_path, monkeypatch):
    """A RoleBasedGroup's RoleInstance makes a deleted pod again from its old template, ready, before the new
    template replaces it: that pod is neither waited for nor registered; the one of a new revision is."""
    import muse_launch.k8s.rollout as rollout_module
    from muse_launch.k8s.rollout import REVISION_LABEL

    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    monkeypatch.setattr(rollout_module, "POLL", 0)
    run_dir = deployed("topologies/epd-b300.yaml", "rbg")
    rollout = Rollout(run_dir)
    inst = rollout.instances("decode")[0]

    def pod(uid: str, revision: str) -> SimpleNamespace:
        ready = SimpleNamespace(type="Ready", status="True")
        return SimpleNamespace(
            metadata=SimpleNamespace(
                name=inst.pod, uid=uid, labels={REVISION_LABEL: revision}, deletion_timestamp=None
            ),
            spec=SimpleNamespace(node_name="node-0"),
            status=SimpleNamespace(
                conditions=[ready], container_statuses=[], pod_ip="10.0.0.1", phase="Running"
            ),
        )

    seen = iter([pod("old", "r1"), pod("made-again", "r1"), pod("made-again", "r1"), pod("new", "r2")])
    current: list[SimpleNamespace] = []

    def read(_cluster, _name):
        current.append(next(seen))
        return current[-1]

    monkeypatch.setattr(rollout, "_pod", read)
    rollout._await_ready(None, inst, not_uid="old", not_revision="r1")
    assert current[-1].metadata.uid == "new" and len(current) == 4
