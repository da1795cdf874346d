"""Bad usage is exit 2 with a message, never a traceback (SPEC section 5)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, says", [
    (["validate"], "Missing argument 'file'"),
    (["plan", "topologies/epd-b300.yaml", "--format", "bogus"], "'bogus' is not one of"),
    (["frobnicate"], "No such command"),
    (["validate", "does/not/exist.yaml"], "cannot read the topology file"),
    (["down", "no-such-deployment"], "no deployment named 'no-such-deployment'"),
    (["up", "topologies/h200-bf16-2node.yaml"], "spans 2 nodes"),
])
def test_bad_usage_exits_2_with_a_message(argv, says, tmp_path):
    run = subprocess.run([sys.executable, "-m", "muse_launch", *argv], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "MUSE_LAUNCH_HOME": str(tmp_path)})
    assert run.returncode == 2, run.stdout + run.stderr
    assert says in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
