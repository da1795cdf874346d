"""Each engine's facts live in its module under muse_launch/engines/, written once; the planning core's
layers import downwards only (topology <- plan <- checks); a rehearsal is a re-checked transformation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "layer,forbidden",
    [
        *(
            (
                f"muse_launch.topology.{m}",
                (
                    "muse_launch.plan",
                    "muse_launch.checks",
                    "muse_launch.rundir",
                    "muse_launch.supervise",
                    "muse_launch.local",
                ),
            )
            for m in ("model", "load", "hardware", "defaults")
        ),
        (
            "muse_launch.plan.build",
            ("muse_launch.checks", "muse_launch.rundir", "muse_launch.supervise", "muse_launch.local"),
        ),
        # the simulated engine imports these facts: no schema, no pydantic (the topology's plain defaults are
        # fine)
        (
            "muse_launch.engines",
            ("muse_launch.checks", "muse_launch.topology.model", "muse_launch.topology.load", "pydantic"),
        ),
    ],
)
def test_layers_import_downwards_only(layer: str, forbidden: tuple[str, ...]):
    code = (
        f"import sys, importlib; importlib.import_module({layer!r}); "
        f"print(sorted(m for m in sys.modules if m.startswith({forbidden!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
