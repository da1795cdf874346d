"""`export`: manifests from every topology validate in both flavours (or are refused with a reason),
match the golden ones, and `export --check` reports hand edits by file, object and field path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from muse_launch.export import check_dir

pytestmark = pytest.mark.integration  # starts processes

ROOT = Path(__file__).resolve().parents[2]


GOLDEN = ROOT / "tests" / "data" / "golden" / "k8s"


GOLDENS = [("epd-b300", "lws"), ("h200-bf16-2node", "lws"), ("pd-b300-low-latency", "rbg")]


UPDATE = os.environ.get("MUSE_LAUNCH_UPDATE_GOLDEN") == "1"  # regenerate the golden manifests


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("name,flavour", GOLDENS, ids=[f"{n}-{f}" for n, f in GOLDENS])
def test_golden_manifests(name: str, flavour: str, tmp_path: Path):
    out = tmp_path / "out"
    done = cli("export", f"topologies/{name}.yaml", "--to", flavour, "-o", out)
    assert done.returncode == 0, done.stderr
    golden = GOLDEN / f"{name}-{flavour}"
    if UPDATE:
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(out, golden)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in golden.iterdir())
    for path in golden.iterdir():
        assert (out / path.name).read_text() == path.read_text(), (
            f"{path} differs; if intended, regenerate with MUSE_LAUNCH_UPDATE_GOLDEN=1"
        )
    assert check_dir(golden) == []
    # The core objects pass kubernetes-validate's own command too (it has no schema for the CRDs: ours check
    # those).
    tool = Path(sys.executable).parent / "kubernetes-validate"
    done = subprocess.run(
        [tool, "--strict", "-k", "1.33.0", *sorted(golden.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "passed for resource service/" in done.stdout, done.stdout + done.stderr


def test_secrets_are_references_never_values(tmp_path: Path):
    env = {"HF_TOKEN": "hf-very-secret", "MODEL_ALIAS": "alias-secret"}
    out = tmp_path / "out"
    done = cli(
        "export", "tests/data/export/pd-secrets.yaml", "-o", out, "--image", "example.org/muse:1", env=env
    )
    assert done.returncode == 0, done.stderr
    text = "".join(p.read_text() for p in out.iterdir())
    assert "hf-very-secret" not in text and "alias-secret" not in text
    assert "secretKeyRef" in text and "muse-$(MODEL_ALIAS)" in text
    assert "create secret generic pd-secrets-secrets" in done.stdout
    # Exporting needs no secret at all: the manifests only name them.
    assert (
        cli(
            "export",
            "tests/data/export/pd-secrets.yaml",
            "-o",
            tmp_path / "again",
            "--image",
            "x/y:1",
            env={"HF_TOKEN": "", "MODEL_ALIAS": ""},
        ).returncode
        == 0
    )


def _edit(path: Path, change) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    change(docs)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def test_check_reports_hand_edits_by_file_object_and_path(tmp_path: Path):
    out = tmp_path / "m"
    assert cli("export", "topologies/h200-bf16-2node.yaml", "-o", out).returncode == 0
    ok = cli("export", "--check", out)
    assert ok.returncode == 0 and "ok" in ok.stdout

    def edits(docs):
        lws, service = docs
        lws["spec"]["leaderWorkerTemplate"]["size"] = "2"
        lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 8
        lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["ports"][1]["name"] = (
            "distributed-init-port"
        )
        service["spec"]["ports"][0]["port"] = "http"

    _edit(out / "server.yaml", edits)
    (out / "extra.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: Bad_Name}\n")
    bad = cli("export", "--check", out)
    assert bad.returncode == 1, bad.stderr
    lines = bad.stderr.splitlines()
    where = f"{out}/server.yaml: LeaderWorkerSet/h200-bf16-2node-server: spec.leaderWorkerTemplate."
    assert f"{where}size: '2' is not of type 'integer'" in lines, lines
    assert any(
        line.startswith(f"{where}workerTemplate.spec.containers[0]: ") and "'gpus' was unexpected" in line
        for line in lines
    ), lines
    assert (
        f"{out}/server.yaml: Service/h200-bf16-2node-server: spec.ports[0].port: 'http' is not of type "
        f"'integer'" in lines
    ), lines
    assert any(
        line.startswith(f"{out}/kustomization.yaml: Kustomization: resources: extra.yaml is not listed")
        for line in lines
    ), lines
    assert "Traceback" not in bad.stderr


def test_check_port_names_and_names_the_api_server_would_refuse(tmp_path: Path):
    out = tmp_path / "m"
    assert cli("export", "topologies/h200-bf16-2node.yaml", "-o", out).returncode == 0

    def edits(docs):
        docs[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["ports"][1][
            "name"
        ] = "distributed-init-port"
        docs[1]["metadata"]["name"] = "9server"

    _edit(out / "server.yaml", edits)
    (out / "router.yaml").write_text("""apiVersion: apps/v1
kind: Deployment
metadata: {name: router}
spec:
  selector: {matchLabels: {app: router}}
  template:
    metadata: {labels: {app: other}}
    spec: {containers: [{name: router, image: x}]}
""")
    _edit(out / "kustomization.yaml", lambda docs: docs[0]["resources"].append("router.yaml"))
    lines = cli("export", "--check", out).stderr.splitlines()
    assert any(
        line.endswith(
            "router.yaml: Deployment/router: spec.selector.matchLabels: does not match "
            "spec.template.metadata.labels"
        )
        for line in lines
    ), lines
    assert any(
        "leaderTemplate.spec.containers[0].ports[1].name: 'distributed-init-port' is not a port name" in line
        for line in lines
    ), lines
    assert any(
        "Service/9server: metadata.name: '9server' is not a DNS-1035 label" in line for line in lines
    ), lines


def test_check_bad_yaml_and_usage_exit_2(tmp_path: Path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "kustomization.yaml").write_text("resources: [a.yaml\n")
    bad = cli("export", "--check", out)
    assert bad.returncode == 2 and "not valid YAML" in bad.stderr and "Traceback" not in bad.stderr
    for argv in (
        ["export"],
        ["export", "--check", tmp_path / "none"],
        ["export", "topologies/epd-b300.yaml"],
        ["export", "topologies/epd-b300.yaml", "-o", tmp_path / "x", "--to", "helm"],
        ["export", "topologies/epd-b300.yaml", "-o", tmp_path / "x", "--namespace", "Not_A_Label"],
        ["export", tmp_path / "missing.yaml", "-o", tmp_path / "x"],
    ):
        done = cli(*argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.strip(), argv


@pytest.mark.parametrize(
    "name,code",
    [("dangling-reference", 1), ("dependency-cycle", 1), ("bad-gpus-string", 2), ("duplicate-key", 2)],
)
def test_a_topology_that_fails_its_checks_is_not_exported(name: str, code: int, tmp_path: Path):
    done = cli("export", f"tests/data/bad/{name}.yaml", "-o", tmp_path / "out")
    assert done.returncode == code, done.stderr
    assert f"tests/data/bad/{name}.yaml:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_drain_out_of_bounds_is_a_schema_error(tmp_path: Path):
    data = yaml.safe_load((ROOT / "topologies/epd-b300.yaml").read_text())
    next(iter(data["roles"].values()))["stop"] = {"drain": -1}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    done = cli("export", path, "-o", tmp_path / "out")
    assert done.returncode == 2 and "drain" in done.stderr and "Traceback" not in done.stderr, done.stderr
