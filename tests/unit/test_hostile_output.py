"""What muse-launch prints of what others wrote (issue 18, items 6, 7 and 10): a role's log never moves the
terminal (escape sequences, carriage returns shown escaped; `--raw` keeps them); user input never an exit
70."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import muse
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.run.state import RunDir, planned_record, write_state

PLAN = Plan("demo", (LaunchSpec(name="server", role="server", kind="command", engine="", launcher=("server",),
                                args=(), ports={"http": 30001}),), (("server",),))


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


HOSTILE = b"title \x1b]0;owned\x07 red \x1b[31mX\x1b[0m cr\rOVER nul\x00 bell\x07 c1\xc2\x9b2J\ttab\n"


@pytest.mark.faults("18.10 logs shows a role's escape sequences and carriage returns escaped; --raw keeps them")
def test_logs_escapes_what_would_move_the_terminal():
    deployment_with_log(HOSTILE)
    shown = muse("logs", "demo")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == ("server | title \\x1b]0;owned\\x07 red \\x1b[31mX\\x1b[0m cr\\rOVER nul\\x00 bell\\x07 "
                            "c1\\x9b2J\ttab\n")
    raw = muse("logs", "demo", "--raw")
    assert raw.stdout == "server | " + HOSTILE.decode(), raw.stdout
