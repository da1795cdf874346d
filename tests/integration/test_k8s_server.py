"""`export --check DIR --server` against a real API server with the real LWS and RBG controllers (the
session's `k8s_cluster`): every topology's export, in both flavours, is accepted by a server-side dry run
with strict field validation (its pod templates as dry-run Pods too); hand-broken manifests are refused with
the file, the object and the field named; both flavours of one file applied into one namespace coexist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from muse_launch import cli
from muse_launch.export import ExportError, export

pytestmark = [pytest.mark.integration, pytest.mark.k8s]

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))


def run_cli(capsys, monkeypatch, cluster, *args: object) -> tuple[int, str, str]:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    capsys.readouterr()
    code = cli.run([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def exported(path: Path, flavour: str, out: Path, namespace: str = "default") -> Path:
    try:
        done = export(path, out, flavour, namespace)
    except ExportError:  # a router no image of the profile ships
        done = export(path, out, flavour, namespace, images={"router": "example.org/router:1"})
    assert not done.problems, [str(p) for p in done.problems]
    return out


@pytest.mark.parametrize("flavour", ["lws", "rbg"])
@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_every_topology_is_accepted_by_the_server(path, flavour, k8s_cluster, tmp_path, capsys, monkeypatch):
    out = exported(path, flavour, tmp_path / "m")
    code, stdout, stderr = run_cli(capsys, monkeypatch, k8s_cluster, "export", "--check", out, "--server")
    assert code == 0, stderr
    assert re.search(r": ok \(\d+ objects accepted by the API server at https://127\.0\.0\.1:6443", stdout), (
        stdout
    )


def _edit(path: Path, change) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    change(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _lws_container(docs):
    return docs[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]


BROKEN = {
    # an unknown field in the LWS itself: the typed patch refuses it (HTTP 500), path resolved from the answer
    "unknown-field": (
        "lws",
        "decode.yaml",
        lambda d: d[0]["spec"].update(bogus=2),
        "LeaderWorkerSet/epd-b300-decode: spec.bogus: field not declared in schema",
    ),
    # LWS's validating webhook (HTTP 403)
    "webhook": (
        "lws",
        "encoder.yaml",
        lambda d: d[0]["spec"]["leaderWorkerTemplate"].update(size=0),
        "LeaderWorkerSet/epd-b300-encoder: spec.leaderWorkerTemplate.size: Invalid value: 0",
    ),
    # the pod template, judged as a pod: a port out of range (HTTP 422, at the template's own path)
    "pod-port": (
        "lws",
        "prefill.yaml",
        lambda d: _lws_container(d)["ports"][0].update(containerPort=700000),
        "LeaderWorkerSet/epd-b300-prefill: spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]"
        ".ports[0].containerPort: Invalid value: 700000",
    ),
    # an unknown field inside an RBG pod template, which the CRD's schema lets through (strict decoding of the
    # pod)
    "rbg-template": (
        "rbg",
        "epd-b300-rbg.yaml",
        lambda d: d[0]["spec"]["roles"][0]["standalonePattern"]["template"]["spec"]["containers"][0].update(
            imagex="x"
        ),
        "RoleBasedGroup/epd-b300-rbg: spec.roles[0].standalonePattern.template.spec.containers[0]"
        ".imagex: field not declared in schema",
    ),
    # a CEL / OpenAPI rule of the RBG CRD (HTTP 422)
    "rbg-replicas": (
        "rbg",
        "epd-b300-rbg.yaml",
        lambda d: d[0]["spec"]["roles"][1].update(replicas=-1),
        "RoleBasedGroup/epd-b300-rbg: spec.roles[1].replicas: Invalid value: -1",
    ),
    # a Service's built-in validation
    "service-port": (
        "lws",
        "router.yaml",
        lambda d: d[1]["spec"]["ports"][0].update(port=0),
        "Service/epd-b300-router: spec.ports[0].port: Invalid value: 0",
    ),
    # a namespace that is not there
    "namespace": (
        "lws",
        "router.yaml",
        lambda d: d[1]["metadata"].update(namespace="nowhere"),
        'Service/epd-b300-router: metadata.namespace: namespaces "nowhere" not found',
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_hand_broken_manifests_are_refused_with_the_field(case, k8s_cluster, tmp_path, capsys, monkeypatch):
    flavour, file, change, expected = BROKEN[case]
    out = exported(ROOT / "topologies" / "epd-b300.yaml", flavour, tmp_path / "m")
    _edit(out / file, change)
    code, _, stderr = run_cli(capsys, monkeypatch, k8s_cluster, "export", "--check", out, "--server")
    assert code == 1, stderr
    assert f"{out / file}: {expected}" in stderr, stderr
    assert "FAILED (1 problem;" in stderr, stderr


def test_server_check_without_a_cluster_says_so(tmp_path, capsys, monkeypatch):
    out = exported(ROOT / "topologies" / "epd-b300.yaml", "lws", tmp_path / "m")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing"))
    code = cli.run(["export", "--check", str(out), "--server"])
    err = capsys.readouterr().err
    assert code == 2 and f"error: no kubeconfig at {tmp_path / 'nothing'}" in err, err


def test_both_flavours_of_one_file_apply_into_one_namespace(k8s_cluster, tmp_path):
    """Applied for real (no nodes: nothing is scheduled), the two exports leave each other's objects alone."""
    from muse_launch.export.validate import read_dir
    from muse_launch.k8s.apply import apply
    from muse_launch.k8s.client import connect

    ns = "both-flavours"
    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        cluster.core().create_namespace({"metadata": {"name": ns}})
        owners: dict[tuple[str, str], str] = {}
        for flavour in ("lws", "rbg"):
            out = exported(ROOT / "topologies" / "epd-b300.yaml", flavour, tmp_path / flavour, ns)
            for _, doc in read_dir(out)[0]:
                if doc["kind"] == "Kustomization":
                    continue
                answer = apply(cluster, doc)
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in owners, f"{key} applied by both {owners[key]} and {flavour}"
                owners[key] = flavour
                labels = answer.metadata.labels
                assert labels["app.kubernetes.io/instance"] == (
                    "epd-b300" if flavour == "lws" else "epd-b300-rbg"
                )
        services = {s.metadata.name for s in cluster.core().list_namespaced_service(ns).items}
        assert {"epd-b300-router", "epd-b300-rbg-router", "epd-b300-decode"} <= services
    finally:
        cluster.core().delete_namespace(ns)
        cluster.close()
