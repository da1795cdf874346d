"""The CLI's error table (SPEC section 5): 0 ok, 1 a check or a role failed, 2 bad usage or a bad file,
70 internal (one line; the traceback only with MUSE_LAUNCH_DEBUG=1); never a traceback for a user error.

Most cases run in-process (cli.run, the console script's own entry); the few at the end run the
real console script, for what only a process shows: the status the shell sees, a closed pipe,
a missing package, and what each command imports before it does anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import REPO, muse

pytestmark = pytest.mark.integration  # starts processes

EPD = "topologies/epd-b300.yaml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


SCRIPT = str(Path(sys.executable).with_name("muse-launch"))


def script(*args: str, env: dict[str, str] | None = None, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MUSE_LAUNCH_HOME": str(home), **(env or {})},
    )


@pytest.mark.parametrize(
    "argv, code",
    [
        (["frobnicate"], 2),
        (["status"], 1),
        (["down"], 0),
        (["validate", "tests/data/bad/shared-gpus-over-budget.yaml"], 1),
    ],
)
def test_the_shell_sees_the_exit_code(argv: list[str], code: int, home: Path) -> None:
    run = script(*argv, home=home)
    assert run.returncode == code, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr


def test_output_to_a_pipe_is_all_there_at_exit(home: Path) -> None:
    """main() leaves without the interpreter's teardown: only after flushing what it printed."""
    run = script("plan", EPD, "--format", "json", home=home)
    assert run.returncode == 0 and json.loads(run.stdout)["name"] == "epd-b300"
    assert script("validate", EPD, home=home).stdout == f"{EPD}: ok (4 roles, 0 errors, 0 warnings)\n"


def test_an_internal_error_in_a_real_process(home: Path) -> None:
    crash = (
        "import sys, muse_launch.core as core\n"
        "core.check_file = lambda *a, **k: {}['roles']\n"
        "from muse_launch.cli import main\nmain()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", crash, "validate", EPD],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "MUSE_LAUNCH_HOME": str(home)},
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (70, "")
    assert (
        run.stderr == "internal error: KeyError: 'roles' (run with MUSE_LAUNCH_DEBUG=1 for the traceback)\n"
    )


def test_a_closed_pipe_is_quiet(home: Path) -> None:
    """`muse-launch plan ... | head -1`: no 'Exception ignored', no traceback."""
    run = subprocess.run(
        f"'{SCRIPT}' plan {EPD} --format json | head -c 10; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MUSE_LAUNCH_HOME": str(home)},
    )
    assert run.stdout == '{\n  "name"'
    assert run.stderr == ""
    assert run.returncode in (0, 1)


# What each command loads before doing its work: start-up time is mostly imports (the figures are in
# scripts/bench_cli.py; a count of modules does not move with the machine's load).
HEAVY = {"pydantic", "httpx", "rich", "yaml", "aiohttp", "psutil", "tenacity", "jsonschema"}


@pytest.mark.parametrize(
    "argv, allowed",
    [
        (["--help"], set()),
        (["validate", "--help"], set()),
        (["down"], {"psutil", "pydantic"}),  # state.json's records are pydantic models (rundir/state.py)
        # nothing running: no backend is asked, no HTTP client loaded (pydantic: state.json's records)
        (["ls"], {"psutil", "pydantic", "rich"}),
        (["validate", EPD], {"pydantic", "yaml"}),
    ],
)
def test_each_command_imports_only_what_it_needs(argv: list[str], allowed: set[str], home: Path) -> None:
    probe = (
        "import json, sys\nfrom muse_launch.cli import run\ncode = run(sys.argv[1:])\n"
        "loaded = {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
        "print(json.dumps([code, sorted(loaded)]), file=sys.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MUSE_LAUNCH_HOME": str(home)},
    )
    code, modules = json.loads(run.stderr.splitlines()[-1])
    assert code == 0, run.stdout + run.stderr
    assert HEAVY & set(modules) == allowed


def test_shell_completion_is_on(home: Path) -> None:
    def complete(words: str) -> list[str]:
        run = script(
            env={
                "_MUSE_LAUNCH_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - 1),
            },
            home=home,
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.split()

    assert complete("muse-launch va") == ["validate"]
    (home / "demo").mkdir(parents=True)
    (home / "other").mkdir()
    assert complete("muse-launch status d") == ["demo"]
    assert "--install-completion" in script("--help", home=home).stdout


@pytest.mark.faults("6. a truncated state.json: ls/status report it for that deployment, down still stops it")
def test_a_damaged_state_is_reported_for_that_deployment_and_down_still_stops_it(home: Path) -> None:
    from muse_launch.proc.process import Marker
    from muse_launch.rundir.state import RunDir

    run_dir = RunDir(home / "broken")
    run_dir.path.mkdir(parents=True)
    run_dir.state_file.write_text('{"name": "broken", "roles": [')  # truncated by a full disk
    role = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        start_new_session=True,
        env={**os.environ, **Marker("broken", str(run_dir.path)).env("prefill")},
    )
    try:
        listed = muse("ls")
        assert listed.returncode == 0 and "state damaged" in listed.stdout, listed.stdout + listed.stderr
        assert f"error: {run_dir.state_file} is damaged (JSONDecodeError" in listed.stderr
        status = muse("status", "broken")
        assert status.returncode == 1 and "fix: `muse-launch down broken`" in status.stderr
        nameless = muse("down")
        assert nameless.returncode == 2 and "damaged: broken" in nameless.stderr
        down = muse("down", "broken")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "missing or damaged" in down.stdout and "broken: stopped prefill" in down.stdout
        assert role.wait(timeout=10) is not None  # stopped by its marker, though the state said nothing
    finally:
        role.kill()
        role.wait()
