"""`export`: manifests from every topology validate in both flavours (or are refused with a reason),
match the golden ones, and `export --check` reports hand edits by file, object and field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from muse_launch.export import ExportError, build, export, manifests
from muse_launch.export.expand import expand
from muse_launch.export.names import LWS
from muse_launch.export.transform import export_plan

pytestmark = pytest.mark.export


ROOT = Path(__file__).resolve().parents[2]


TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("flavour", ["lws", "rbg"])
@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_every_topology_exports_and_validates(path: Path, flavour: str):
    try:
        done = build(path, flavour)
    except ExportError as exc:  # refused: with the reason and the way out
        assert "--image" in str(exc), exc
        done = build(path, flavour, images={"router": "example.org/router:1"})
    assert not done.problems, [str(p) for p in done.problems]
    kinds = [o["kind"] for f in done.files for o in f.objects]
    assert kinds.count("Kustomization") == 1
    assert (kinds.count("RoleBasedGroup") == 1) if flavour == "rbg" else ("LeaderWorkerSet" in kinds)
    # libyaml's dumper (fast) writes the bytes the pure-Python one writes, and each manifest is dumped once.
    assert manifests.SafeLoader is yaml.CSafeLoader and issubclass(manifests._Dumper, yaml.CSafeDumper)
    for f in done.files:
        assert f.text() == f.header + "---\n".join(manifests.dump(o, pure=True) for o in f.objects)
        assert f.text() is f.text()


def _objects(done, kind: str) -> list[dict]:
    return [o for f in done.files for o in f.objects if o["kind"] == kind]


def test_lws_multi_node_group_uses_lws_variables():
    done = build(ROOT / "topologies/h200-bf16-2node.yaml", "lws")
    (lws,) = _objects(done, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    for which in ("leaderTemplate", "workerTemplate"):
        command = " ".join(template[which]["spec"]["containers"][0]["command"])
        assert "--dist-init-addr $(LWS_LEADER_ADDRESS):20000" in command
        assert "--nnodes $(LWS_GROUP_SIZE) --node-rank $(LWS_WORKER_INDEX)" in command
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "readinessProbe" in leader and "startupProbe" in leader
    assert "CUDA_VISIBLE_DEVICES" not in str(leader)  # the device plugin picks a pod's GPUs
    (service,) = _objects(done, "Service")
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == lws["metadata"]["name"]


def test_wiring_goes_through_dns_names_and_router_probe_is_readiness():
    done = build(ROOT / "topologies/epd-b300.yaml", "lws", namespace="serving")
    (router,) = _objects(done, "Deployment")
    container = router["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[command.index("--prefill") + 1 : command.index("--prefill") + 3] == [
        "http://epd-b300-prefill-0.epd-b300-prefill.serving:30001",
        "8998",
    ]
    assert command[command.index("--decode") + 1] == "http://epd-b300-decode-0.epd-b300-decode.serving:30002"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert container["image"] == "lmsysorg/sglang:dev-muse-spark-open"
    prefill = next(
        o for o in _objects(done, "LeaderWorkerSet") if o["metadata"]["name"] == "epd-b300-prefill"
    )
    args = prefill["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["command"]
    assert (
        args[args.index("--encoder-urls") + 1] == "http://epd-b300-encoder-0.epd-b300-encoder.serving:30010"
    )
    assert all(
        o["metadata"]["namespace"] == "serving" for f in done.files for o in f.objects if "metadata" in o
    )


def test_rbg_roles_and_dependencies_mirror_the_waves():
    done = build(ROOT / "topologies/epd-b300.yaml", "rbg")
    (rbg,) = _objects(done, "RoleBasedGroup")
    roles = {r["name"]: r.get("dependencies", []) for r in rbg["spec"]["roles"]}
    assert roles == {
        "encoder": [],
        "prefill": ["encoder"],
        "decode": ["encoder"],
        "router": ["prefill", "decode"],
    }


def test_amd_gpus_are_amd_resources():
    done = build(ROOT / "topologies/mi355x-mxfp4.yaml", "lws")
    limits = [
        c.get("resources", {}).get("limits", {})
        for o in _objects(done, "LeaderWorkerSet")
        for c in o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    ]
    assert any("amd.com/gpu" in line for line in limits) and not any(
        "nvidia.com/gpu" in line for line in limits
    )


def test_literal_dollar_parens_are_escaped(tmp_path: Path):
    path = tmp_path / "t.yaml"
    path.write_text(
        (ROOT / "topologies/epd-b300.yaml")
        .read_text()
        .replace(
            "args: [--quantization, modelopt_fp4]",
            "args: [--quantization, modelopt_fp4, --chat-template, 'a$(b)']",
        )
    )
    done = build(path, "lws")
    command = _objects(done, "LeaderWorkerSet")[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "containers"
    ][0]["command"]
    assert "a$$(b)" in command and expand("a$$(b)", {"b": "x"}) == "a$(b)"


def test_kubelet_expansion():
    defined = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", defined) == "1-two"
    assert expand("$(C)", defined) == "$(C)"  # undefined: left as written
    assert expand("$$(A)", defined) == "$(A)"
    assert expand("a$b", defined) == "a$b" and expand("$(A", defined) == "$(A"


def test_three_nodes_share_one_worker_template(tmp_path: Path):
    path = tmp_path / "t.yaml"
    text = (ROOT / "topologies/h200-bf16-2node.yaml").read_text()
    text = text.replace(
        "  node1: {address: 10.0.0.2}", "  node1: {address: 10.0.0.2}\n  node2: {address: 10.0.0.3}"
    )
    path.write_text(
        text.replace("nodes: [node0, node1]", "nodes: [node0, node1, node2]")
        .replace("tp: 16", "tp: 24")
        .replace("ep: 16", "ep: 24")
    )
    plan = export_plan(path, LWS, "default")
    (group,) = plan.groups
    assert group.size == 3 and "$(LWS_WORKER_INDEX)" in group.worker.argv


def test_refuses_what_one_worker_template_cannot_say(tmp_path: Path):
    path = tmp_path / "t.yaml"
    text = (ROOT / "topologies/vllm-multinode-dep-b200.yaml").read_text()
    text = text.replace(
        "  node1: {address: 10.0.0.2}", "  node1: {address: 10.0.0.2}\n  node2: {address: 10.0.0.3}"
    )
    path.write_text(
        text.replace("nodes: [node0, node1]", "nodes: [node0, node1, node2]")
        .replace("dp: 16", "dp: 24")
        .replace("ep: 16", "ep: 24")
    )
    with pytest.raises(ExportError, match="one template"):
        export_plan(path, LWS, "default")


def test_replicas_become_one_group_each():
    path = ROOT / "tests/data/export/pd-replicas.yaml"
    done = build(path, "lws", images={"": "example.org/muse:1"})
    assert not done.problems, done.problems
    names = [o["metadata"]["name"] for o in _objects(done, "LeaderWorkerSet")]
    assert names == ["pd-replicas-prefill-0", "pd-replicas-prefill-1", "pd-replicas-decode"]
    (router,) = _objects(done, "Deployment")
    command = router["spec"]["template"]["spec"]["containers"][0]["command"]
    prefills = [command[i + 1 : i + 3] for i, a in enumerate(command) if a == "--prefill"]
    assert prefills == [
        ["http://pd-replicas-prefill-0-0.pd-replicas-prefill-0.default:31001", "8998"],
        ["http://pd-replicas-prefill-1-0.pd-replicas-prefill-1.default:31002", "8999"],
    ]
    images = [
        c["image"]
        for o in _objects(build(path, "lws", images={"prefill": "p:1", "": "x:1"}), "LeaderWorkerSet")
        for c in o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    ]
    assert images == ["p:1", "p:1", "x:1"]
    with pytest.raises(ExportError, match="no role 'prefil'"):
        build(path, "lws", images={"prefil": "p:1", "": "x:1"})
    rbg = build(path, "rbg", images={"": "example.org/muse:1"})
    (group,) = _objects(rbg, "RoleBasedGroup")
    assert [r.get("dependencies", []) for r in group["spec"]["roles"]][-1] == [
        "prefill-0",
        "prefill-1",
        "decode",
    ]


def test_export_refuses_to_write_invalid_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import muse_launch.export as export_module
    from muse_launch.export import manifests

    real = manifests.container

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        out["stdin"] = "yes"
        out["gpuCount"] = 1
        return out

    monkeypatch.setattr(manifests, "container", broken)
    done = export_module.export(ROOT / "topologies/epd-b300.yaml", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    messages = [str(p) for p in done.problems]
    assert any(
        m.startswith(
            "encoder.yaml: LeaderWorkerSet/epd-b300-encoder: "
            "spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]: "
        )
        and "gpuCount" in m
        for m in messages
    ), messages
    assert any(m.endswith("containers[0].stdin: 'yes' is not of type 'boolean'") for m in messages), messages


def test_export_into_a_directory_of_other_manifests_is_refused(tmp_path: Path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "mine.yaml").write_text("kind: Other\n")
    with pytest.raises(ExportError, match="mine.yaml"):
        export(ROOT / "topologies/epd-b300.yaml", out)


def _exported_objects(path: Path, flavour: str) -> list[dict]:
    try:
        done = build(path, flavour)
    except ExportError:
        done = build(path, flavour, images={"router": "example.org/router:1"})
    return [o for f in done.files for o in f.objects if o["kind"] != "Kustomization"]


def _pod_names(objects: list[dict]) -> set[str]:
    """The pods the controllers make of one group / instance each, as LWS and RBG name them."""
    out = set()
    for o in objects:
        name, spec = o["metadata"]["name"], o.get("spec", {})
        if o["kind"] == "LeaderWorkerSet":
            out |= {f"{name}-0"} | {f"{name}-0-{i}" for i in range(1, spec["leaderWorkerTemplate"]["size"])}
        elif o["kind"] == "RoleBasedGroup":
            for role in spec["roles"]:
                base = f"{name}-{role['name']}-0"
                size = (role.get("leaderWorkerPattern") or {}).get("size")
                out |= {f"{base}-{i}" for i in range(size)} if size else {base}
                out.add(f"s-{name}-{role['name']}")  # the headless Service RBG makes
        elif o["kind"] == "Deployment":
            out.add(name)
    return out


def _selectors(objects: list[dict]) -> list[dict[str, str]]:
    out = []
    for o in objects:
        spec = o.get("spec", {})
        if o["kind"] == "Service" and spec.get("selector"):
            out.append(spec["selector"])
        if o["kind"] == "Deployment":
            out.append(spec["selector"]["matchLabels"])
    return out


def _pod_labels(objects: list[dict]) -> list[dict[str, str]]:
    from muse_launch.export.validate import pod_templates

    out = []
    for o in objects:
        if o["kind"] in ("LeaderWorkerSet", "RoleBasedGroup"):
            labels = [t["metadata"]["labels"] for _, t in pod_templates(o) if "metadata" in t]
            extra = (
                {"leaderworkerset.sigs.k8s.io/name": o["metadata"]["name"]}
                if o["kind"] == "LeaderWorkerSet"
                else {}
            )
            out += [{**lab, **extra} for lab in labels]
        elif o["kind"] == "Deployment":
            out.append(o["spec"]["template"]["metadata"]["labels"])
    return out


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_lws_and_rbg_exports_of_one_file_do_not_collide(path: Path):
    """Both flavours in one namespace: no object or pod has the other's name, and no Service or Deployment
    of one selects a pod of the other."""
    lws, rbg = _exported_objects(path, "lws"), _exported_objects(path, "rbg")
    named = lambda objs: {(o["kind"], o["metadata"]["name"]) for o in objs}  # noqa: E731
    assert not named(lws) & named(rbg)
    assert not _pod_names(lws) & _pod_names(rbg)
    for mine, theirs in ((lws, rbg), (rbg, lws)):
        for selector in _selectors(mine):
            for labels in _pod_labels(theirs):
                assert any(labels.get(k) != v for k, v in selector.items()), (selector, labels)


def test_the_drain_and_grace_period_are_sized_from_the_file(tmp_path: Path):
    data = yaml.safe_load((ROOT / "topologies/epd-b300.yaml").read_text())
    role = next(r for r in data["roles"].values() if r.get("kind") == "decode")
    role["stop"] = {"grace": 20, "drain": 45.5}
    path = tmp_path / "drained.yaml"
    path.write_text(yaml.safe_dump(data))
    done = build(path, "rbg")
    (group,) = _objects(done, "RoleBasedGroup")
    for r in group["spec"]["roles"]:
        spec = (r.get("standalonePattern") or r["leaderWorkerPattern"])["template"]["spec"]
        hook = spec["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if r["name"] == "decode":
            assert hook[-1] == "45.5" and spec["terminationGracePeriodSeconds"] == 66, spec
        elif hook is not None:  # another routed worker: the default drain
            assert hook[-1] == "120"
