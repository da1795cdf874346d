"""What muse-launch prints of what others wrote (issue 18, items 6, 7 and 10): a role's log never moves the
terminal (escape sequences, carriage returns shown escaped; `--raw` keeps them); user input never an exit
70."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.rundir.state import RunDir, write_state
from muse_launch.supervise.planned_record import planned_record

pytestmark = pytest.mark.integration  # starts processes

PLAN = Plan(
    "demo",
    (
        LaunchSpec(
            name="server",
            role="server",
            kind="command",
            engine="",
            launcher=("server",),
            args=(),
            ports={"http": 30001},
        ),
    ),
    (("server",),),
)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(home))
    return home


def deployment_with_log(text: bytes) -> RunDir:
    run_dir = RunDir.of("demo")
    write_state(run_dir, planned_record(PLAN, "demo.yaml", str))
    run_dir.logs.mkdir()
    run_dir.log("server").write_bytes(text)
    return run_dir


@pytest.mark.faults("18.7 exit 70 on user input: sizes, MUSE_LAUNCH_HOME, export -o, TZ, state types")
def test_a_time_zone_a_day_from_utc_is_a_usage_error(home: Path):
    import subprocess
    import sys

    run_dir = deployment_with_log(b"")
    state = json.loads(run_dir.state_file.read_text())
    state["roles"][0].update(state="ready", ready_at="2026-01-01T00:00:00.000+00:00")
    run_dir.state_file.write_text(json.dumps(state))
    run = subprocess.run(
        [sys.executable, "-m", "muse_launch", "status", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MUSE_LAUNCH_HOME": str(home), "TZ": "UTC+27"},
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "error: the local time zone (TZ='UTC+27') is a day or more from UTC" in run.stderr
    assert "fix: set TZ to a real zone" in run.stderr
