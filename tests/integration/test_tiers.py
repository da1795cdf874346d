"""scripts/test.sh: a tier or suite it does not know is refused at once, before any install, naming the ones
it knows; and the scheduler's units of work (tests/conftest.py) keep a file, and the Kubernetes control
plane's files, on one worker."""

from __future__ import annotations

import subprocess

import pytest
from conftest import unit_of_work
from harness import REPO

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["nonsense"],
            "unknown tier or suite: nonsense (fast; slurm k8s vllm sglang parsers graph bench local;",
        ),
        (["slurm", "sulrm"], "unknown tier or suite: sulrm"),
        (["fast", "-x"], "`fast` takes no more arguments"),
    ],
)
def test_an_unknown_tier_is_refused_before_any_install(args, said, tmp_path):
    """A copy of test.sh beside a stand-in .venv/bin/python that notes every call: none is made."""
    import shutil

    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "test.sh", tmp_path / "scripts")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    python.chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "test.sh"), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr, done.stderr
    assert not (tmp_path / "calls").exists(), (tmp_path / "calls").read_text()


def test_a_file_is_one_unit_the_k8s_files_one_and_each_document_its_own() -> None:
    assert unit_of_work("tests/integration/test_slurm.py::test_a[x]") == "tests/integration/test_slurm.py"
    assert unit_of_work("tests/integration/test_k8s_up.py::test_a") == unit_of_work(
        "tests/integration/test_k8s_server.py::test_b"
    )
    assert unit_of_work("tests/integration/test_k8s_live_changes.py::test_c") == unit_of_work(
        "tests/integration/test_k8s_up.py::test_a"
    )
    one, other = (f"tests/integration/test_docs.py::test_every_command_runs_as_written[{d}]" for d in "ab")
    assert unit_of_work(one) != unit_of_work(other)
