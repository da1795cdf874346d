"""The CLI's error table (SPEC section 5): 0 ok, 1 a check or a role failed, 2 bad usage or a bad file,
70 internal (one line; the traceback only with MUSE_LAUNCH_DEBUG=1); never a traceback for a user error.

Most cases run in-process (cli.run, the console script's own entry); the few at the end run the
real console script, for what only a process shows: the status the shell sees, a closed pipe,
a missing package, and what each command imports before it does anything.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_run import muse

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
