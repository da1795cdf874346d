"""What a new user meets first: a missing file, a bad --set, an unset variable, GPUs the node lacks."""

from __future__ import annotations

import os

import pytest
from cli_run import REPO, muse

pytestmark = pytest.mark.integration  # starts processes


def test_a_failed_submission_leaves_no_deployment_behind(tmp_path) -> None:
    """`up --on slurm` without sbatch used to leave a record: `status` showed "pending" roles, and
    "known:" lists named it."""
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "no-bin")}
    run = muse("up", "topologies/helion-gb300.yaml", "--on", "slurm", "--rehearse", "-d", env=env)
    assert run.returncode == 1 and "error: sbatch not found" in run.stderr, run.stderr
    assert muse("ls", "--json", env=env).stdout.strip() == "[]"
    assert "known: none" in muse("status", "helion-gb300", env=env).stderr
    assert not (tmp_path / "home" / "helion-gb300").exists()


def test_faults_sh_installs_what_it_needs_first(tmp_path) -> None:
    """`bash scripts/faults.sh` failed with "No module named pytest" unless the test install had run."""
    import shutil
    import subprocess

    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "faults.sh", tmp_path / "scripts")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    calls = tmp_path / "calls"
    # A stand-in python: the import check fails until pip has run, and every call is noted.
    python.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$1" in\n'
        f"  -c) [ -e {tmp_path}/installed ] ;;\n"
        f'  -m) [ "$2" = pip ] && touch {tmp_path}/installed; exit 0 ;;\nesac\n'
    )
    python.chmod(0o755)
    run = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "faults.sh"), "-x"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    lines = calls.read_text().splitlines()
    assert lines[1] == "-m pip install -q -e .[routers,test]", lines
    assert lines[-1].startswith("-m pytest -m faults"), lines
    assert "installing the project and its test extra" in run.stderr
    calls.unlink()
    assert subprocess.run(["bash", str(tmp_path / "scripts" / "faults.sh")], timeout=60).returncode == 0
    assert "pip" not in calls.read_text()  # installed: not again


def test_the_local_slurm_clusters_start_fails_loudly_through_eval(tmp_path) -> None:
    """`eval "$(slurm_local.sh start)"` used to swallow a failure and leave SLURM_CONF empty."""
    import subprocess

    start = f"bash {REPO}/scripts/slurm_local.sh start /proc/muse-launch-no-such-dir"
    script = f'set -e; eval "$({start})"; echo REACHED'
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "REACHED" not in run.stdout
    assert "slurm_local: start failed (exit " in run.stderr, run.stderr
