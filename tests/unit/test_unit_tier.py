"""The guard of tests/unit/conftest.py: a unit test that starts a process fails, naming what it started."""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run(["true"], check=False),
        lambda: os.system("true"),
        lambda: os.posix_spawn("/bin/true", ["true"], {}),
    ],
    ids=["subprocess", "system", "posix_spawn"],
)
def test_a_unit_test_that_starts_a_process_fails(start) -> None:
    with pytest.raises(AssertionError, match="a unit test started a process .*move it to tests/integration"):
        start()
