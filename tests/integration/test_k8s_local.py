"""scripts/k8s_local.sh fails loudly, before starting anything, where something it needs is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.k8s]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s_local.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_no_kit(tmp_path: Path):
    done = run("start", str(tmp_path / "c"), MUSE_K8S_KIT=str(tmp_path / "nowhere"))
    assert done.returncode == 1
    assert f"no k8s-local kit at {tmp_path / 'nowhere'}" in done.stderr and "MUSE_K8S_KIT" in done.stderr
    assert not (tmp_path / "c").exists()


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
