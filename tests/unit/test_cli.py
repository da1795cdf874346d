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

from muse_launch.errors import INTERNAL, explain

EPD = "topologies/epd-b300.yaml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["validate"], 2, "Missing argument 'file'"),
        (["plan", EPD, "--format", "bogus"], 2, "'bogus' is not one of"),
        (["frobnicate"], 2, "No such command 'frobnicate'"),
        (["validate", "does/not/exist.yaml"], 2, "error: does/not/exist.yaml: no such file"),
        (["validate", "topologies"], 2, "topologies: cannot read the topology file: Is a directory"),
        (["up", "topologies"], 2, "topologies: cannot read the topology file: Is a directory"),
        (["down", "no-such-deployment"], 2, "no deployment named 'no-such-deployment'"),
        (["down", "/etc"], 2, "'/etc' is neither a deployment name nor a topology file"),
        (["status", "no-such-deployment"], 2, "no deployment named 'no-such-deployment'"),
        (["logs", "no-such-deployment", "prefill"], 2, "no deployment named 'no-such-deployment'"),
        (["up", "topologies/h200-bf16-2node.yaml"], 2, "spans 2 nodes"),
        (["init", "--hardware", "tpu"], 2, "error: unknown hardware 'tpu'"),
        (["scale", "no-such", "decode", "-1"], 2, "scale decode -1: REPLICAS must be a whole number from 1"),
        # a flag of another backend's `up` is refused before anything is read, naming where it belongs
        (
            ["up", EPD, "--partition", "gpu"],
            2,
            "--partition: not on this host\n  fix: leave it out, or `up --on slurm`",
        ),
        (["up", EPD, "--on", "slurm", "--keep"], 2, "--keep: not with --on slurm (one job runs every role)"),
        (
            ["up", EPD, "--on", "k8s", "--only", "decode", "-n", "x"],
            2,
            "--only: not with --on k8s\n  fix: leave it out",
        ),
        (
            ["up", EPD, "--on", "slurm", "--to", "rbg", "--image", "i"],
            2,
            "--to, --image: not with --on slurm",
        ),
        (["status"], 1, "error: no deployment is running\n  fix: `muse-launch up FILE -d` starts one"),
        (["logs"], 1, "error: no deployment is running"),
        (["smoke"], 1, "error: no deployment is running"),
        (["validate", "tests/data/bad/shared-gpus-over-budget.yaml"], 1, "; fix: give decode GPUs 4-7"),
        (["plan", "tests/data/bad/shared-gpus-over-budget.yaml"], 1, "; fix: give decode GPUs 4-7"),
    ],
)
def test_user_errors_exit_1_or_2_with_a_message(argv: list[str], code: int, says: str) -> None:
    run = muse(*argv)
    assert run.returncode == code, run.stdout + run.stderr
    assert says in run.stderr, run.stderr
    assert "Traceback" not in run.stdout + run.stderr


def test_down_of_nothing_is_not_an_error() -> None:
    run = muse("down")
    assert (run.returncode, run.stdout, run.stderr) == (0, "no deployment is running; nothing to stop\n", "")


def test_a_deployment_that_lost_its_state(home: Path) -> None:
    (home / "demo").mkdir(parents=True)
    status = muse("status", "demo")
    assert status.returncode == 1, status.stderr
    assert status.stderr.splitlines() == [
        f"error: deployment 'demo' has no state any more ({home}/demo/state.json is gone)",
        "  fix: `muse-launch down demo` stops whatever of it still runs",
    ]
    (home / "demo" / "state.json").write_text("{not json")
    damaged = muse("logs", "demo")
    assert damaged.returncode == 1 and f"{home}/demo/state.json is damaged (JSONDecodeError" in damaged.stderr


def test_an_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("version: 1\n")

    real_open = os.open

    def refuse(name: object, *args: object, **kwargs: object) -> int:
        if str(name) == str(path):
            raise PermissionError(13, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)  # root reads any file: a chmod cannot show this
    run = muse("validate", path)
    assert run.returncode == 2 and run.stderr == f"{path}: cannot read the topology file: Permission denied\n"


def test_the_host_refusing_a_write_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("")
    run = muse("init", "--hardware", "b300", "--mode", "agg", "-o", target / "out.yaml")
    assert run.returncode == 1
    assert run.stderr == f"error: {target}/out.yaml: Not a directory\n"


def test_anything_unexpected_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch) -> None:
    import muse_launch.core

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("roles")

    monkeypatch.setattr(muse_launch.core, "check_file", broken)
    run = muse("validate", EPD, internal_ok=True)
    assert run.returncode == INTERNAL
    assert (
        run.stderr == "internal error: KeyError: 'roles' (run with MUSE_LAUNCH_DEBUG=1 for the traceback)\n"
    )
    monkeypatch.setenv("MUSE_LAUNCH_DEBUG", "1")
    debug = muse("validate", EPD, internal_ok=True)
    assert debug.returncode == INTERNAL
    assert debug.stderr.startswith("Traceback (most recent call last):") and "in broken" in debug.stderr
    assert debug.stderr.endswith(
        "internal error: KeyError: 'roles' (run with MUSE_LAUNCH_DEBUG=1 for the traceback)\n"
    )


def test_a_missing_package_is_named_by_the_command_that_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)  # `import httpx` now fails as if it were not installed
    run = muse("status", "demo")
    assert run.returncode == 1
    assert run.stderr == "error: muse-launch status needs httpx: pip install 'httpx>=0.27'\n"
    assert muse("--help").returncode == 0  # the other commands are all still there
    assert muse("down").returncode == 0


@pytest.mark.parametrize(
    "exc, code, first",
    [
        (
            ModuleNotFoundError("No module named 'yaml'", name="yaml"),
            1,
            "error: muse-launch validate needs yaml: pip install 'pyyaml>=6'",
        ),
        (
            ModuleNotFoundError("No module named 'muse_launch.gone'", name="muse_launch.gone"),
            70,
            "internal error: ",
        ),
        (
            PermissionError(13, "Permission denied", "/state/demo/state.json"),
            1,
            "error: /state/demo/state.json: Permission denied",
        ),
        (
            OSError(28, "No space left on device", "/state/demo/.state.tmp"),
            1,
            "error: /state/demo/.state.tmp: No space left on device",
        ),
        (OSError(5, "Input/output error"), 70, "internal error: OSError: [Errno 5] Input/output error"),
        (KeyboardInterrupt(), 130, None),
        (BrokenPipeError(32, "Broken pipe"), 1, None),
        (ValueError("first line\nsecond line"), 70, "internal error: ValueError: first line (run with"),
    ],
)
def test_the_error_table(exc: BaseException, code: int, first: str | None) -> None:
    got, lines = explain(exc, "validate")
    assert got == code
    assert (lines[0] if lines else None) == first or lines[0].startswith(first)


# ---- the real console script -------------------------------------------------------------------------

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


# ---- a damaged or missing state.json (issue 9, item 6): reported for that deployment only --------------


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
