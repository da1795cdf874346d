"""The `k8s_cluster` fixture: one real control plane (scripts/k8s_local.sh) for the whole session's `k8s`
tests,
started on first use and stopped at the end, leaving no process and no directory behind.

It runs in the test's network namespace (scripts/test.sh's `unshare -n`); outside one, k8s_local.sh refuses
and
the tests that need it fail with its message. The prepared binaries come from `scripts/k8s_local.sh prepare`.
MUSE_K8S_TEST_DIR names a cluster already started by `scripts/k8s_local.sh start DIR` in this namespace
instead: the tests use it and leave it running (a developer's loop; CI starts its own).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s_local.sh"
START_TIMEOUT = 900  # a loaded 2-core machine has taken 110 s to start it; the kit waits 180 s per step


@dataclass(frozen=True)
class Cluster:
    dir: Path
    kubeconfig: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), **extra}

    def pids(self) -> list[int]:
        """The pids the cluster's pid files name, alive or not."""
        out = []
        for f in (self.dir / "run").glob("*.pid"):
            text = f.read_text().split()
            if text and text[0].isdigit():
                out.append(int(text[0]))
        return out


def start(directory: Path) -> Cluster:
    done = subprocess.run(
        ["bash", str(SCRIPT), "start", str(directory)], capture_output=True, text=True, timeout=START_TIMEOUT
    )
    if done.returncode != 0:
        pytest.fail(
            f"scripts/k8s_local.sh start failed ({done.returncode}):\n{done.stderr[-4000:]}", pytrace=False
        )
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("export KUBECONFIG="), done.stdout
    return Cluster(directory, Path(line.partition("=")[2]))


def stop(cluster: Cluster) -> None:
    pids = cluster.pids()
    done = subprocess.run(
        ["bash", str(SCRIPT), "stop", str(cluster.dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert not cluster.dir.exists(), f"{cluster.dir} left behind"
    # a process killed may take a moment to leave /proc on a loaded machine: its end is waited for, bounded
    deadline = time.monotonic() + 30
    while (alive := [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) not in ("Z", "gone")]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not alive, f"processes of the cluster still alive: {alive} ({[_state(p) for p in alive]})"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory):
    given = os.environ.get("MUSE_K8S_TEST_DIR")
    if given:
        yield Cluster(Path(given), Path(given) / "kubeconfig")
        return
    cluster = start(tmp_path_factory.mktemp("k8s") / "cluster")
    try:
        yield cluster
    finally:
        stop(cluster)
