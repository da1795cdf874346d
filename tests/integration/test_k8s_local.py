"""scripts/k8s_local.sh fails loudly, before starting anything, where something it needs is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.k8s]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s_local.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def test_no_kit(tmp_path: Path):
    done = run("start", str(tmp_path / "c"), MUSE_K8S_KIT=str(tmp_path / "nowhere"))
    assert done.returncode == 1
    assert f"no k8s-local kit at {tmp_path / 'nowhere'}" in done.stderr and "MUSE_K8S_KIT" in done.stderr
    # where the kit and the binaries come from: what a fresh clone without the kit beside it reads
    assert "../shared/k8s-local" in done.stderr and "MUSE_K8S_BIN" in done.stderr, done.stderr
    assert "kube-apiserver.gz" in done.stderr and "Kubernetes v1.36.2" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()


def test_the_k8s_tests_fail_without_the_kit_saying_where_it_comes_from(tmp_path: Path):
    """Not a skip: every test of the session's control plane fails with k8s_local.sh's message."""
    test = tmp_path / "test_needs_cluster.py"
    test.write_text(
        "from k8s_cluster import k8s_cluster  # noqa: F401\n\n"
        "def test_one(k8s_cluster):\n    pass\n\ndef test_two(k8s_cluster):\n    pass\n"
    )
    env = {**os.environ, "MUSE_K8S_KIT": str(tmp_path / "nowhere")}
    env.pop("MUSE_K8S_TEST_DIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-c",
            str(REPO / "pyproject.toml"),
            str(test),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 errors" in done.stdout and "skipped" not in done.stdout, done.stdout
    assert "no k8s-local kit at" in done.stdout and "../shared/k8s-local" in done.stdout, done.stdout


def test_binaries_missing(tmp_path: Path):
    (tmp_path / "bin").mkdir()
    done = run("start", str(tmp_path / "c"), MUSE_K8S_BIN=str(tmp_path / "bin"))
    assert done.returncode == 1
    assert f"missing {tmp_path / 'bin'}/kube-apiserver.gz" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()


def test_not_prepared(tmp_path: Path):
    done = run("start", str(tmp_path / "c"), MUSE_K8S_CACHE=str(tmp_path / "empty-cache"), ETCD="")
    assert done.returncode == 1
    assert "no etcd: run `scripts/k8s_local.sh prepare` first" in done.stderr, done.stderr


def test_status_and_stop_of_nothing(tmp_path: Path):
    status = run("status", str(tmp_path / "c"))
    assert status.returncode == 3 and "not running" in status.stderr
    stop = run("stop", str(tmp_path / "c"))
    assert stop.returncode == 0 and "nothing to stop" in stop.stderr


def test_a_directory_it_did_not_make_is_refused(tmp_path: Path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "mine.txt").write_text("keep")
    done = run("start", str(tmp_path / "c"))
    assert done.returncode == 1 and "is not empty and is not a k8s-local directory" in done.stderr
    assert (tmp_path / "c" / "mine.txt").read_text() == "keep"


def muse(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "MUSE_LAUNCH_HOME": str(tmp_path / "home"),
    }
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=SCRIPT.parents[1],
    )


def test_up_on_k8s_without_a_cluster_says_where_it_looked(tmp_path: Path):
    done = muse(tmp_path, "up", "topologies/epd-b300.yaml", "--on", "k8s", "--rehearse", "-d")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: no kubeconfig at {tmp_path / 'no-kubeconfig'}" in done.stderr
    assert "fix: set KUBECONFIG" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "epd-b300" / "k8s").exists()


def test_up_on_k8s_refuses_an_unknown_flavour_and_one_host_flags(tmp_path: Path):
    bad = muse(tmp_path, "up", "topologies/epd-b300.yaml", "--on", "k8s", "--rehearse", "--to", "helm")
    assert bad.returncode == 2 and "error: --to helm: one of lws, rbg" in bad.stderr, bad.stderr
    only = muse(tmp_path, "up", "topologies/epd-b300.yaml", "--on", "k8s", "--rehearse", "--only", "router")
    assert only.returncode == 2 and "--only: not with --on k8s" in only.stderr, only.stderr
