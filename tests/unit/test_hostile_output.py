"""What muse-launch prints of what others wrote (issue 18, items 6, 7 and 10): a role's log never moves the
terminal (escape sequences, carriage returns shown escaped; `--raw` keeps them); user input never an exit
70."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_run import muse

from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.rundir.state import RunDir, write_state
from muse_launch.supervise.planned_record import planned_record

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


HOSTILE = b"title \x1b]0;owned\x07 red \x1b[31mX\x1b[0m cr\rOVER nul\x00 bell\x07 c1\xc2\x9b2J\ttab\n"


@pytest.mark.faults(
    "18.10 logs shows a role's escape sequences and carriage returns escaped (colour codes dropped); "
    "--raw keeps them"
)
def test_logs_escapes_what_would_move_the_terminal():
    deployment_with_log(HOSTILE)
    shown = muse("logs", "demo")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (
        "server | title \\x1b]0;owned\\x07 red X cr\\rOVER nul\\x00 "  # colour codes dropped: noise escaped
        "bell\\x07 c1\\x9b2J\ttab\n"
    )
    raw = muse("logs", "demo", "--raw")
    assert raw.stdout == "server | " + HOSTILE.decode(), raw.stdout


FOUR_HUNDRED_DIGITS = "9" * 400


@pytest.mark.faults("18.7 exit 70 on user input: sizes, MUSE_LAUNCH_HOME, export -o, TZ, state types")
@pytest.mark.parametrize(
    "size", [f"'{FOUR_HUNDRED_DIGITS}'", f"{FOUR_HUNDRED_DIGITS}MiB", f"'{FOUR_HUNDRED_DIGITS}.5 GB'"]
)
def test_a_log_size_of_400_digits_is_a_file_error(tmp_path: Path, size: str):
    path = tmp_path / "big.yaml"
    path.write_text(
        f"version: 1\nname: big\nhardware: cpu\nlogs: {{max_size: {size}}}\n"
        "roles:\n  s: {kind: command, command: [sleep, '9'], port: 18001}\n"
    )
    run = muse("validate", path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{path}:4: logs.max_size:" in run.stderr and "less than or equal to" in run.stderr


@pytest.mark.faults("18.7 exit 70 on user input: sizes, MUSE_LAUNCH_HOME, export -o, TZ, state types")
@pytest.mark.parametrize("kind", ["a regular file", "a dangling link"])
@pytest.mark.parametrize("command", [["ls"], ["status"], ["down"], ["up", "FILE", "-d"]])
def test_a_state_home_that_is_no_directory_is_a_usage_error(tmp_path: Path, kind: str, command: list[str]):
    topology = tmp_path / "t.yaml"
    topology.write_text(
        "version: 1\nname: t\nhardware: cpu\nroles:\n"
        "  s: {kind: command, command: [sleep, '9'], port: 18001}\n"
    )
    command = [str(topology) if c == "FILE" else c for c in command]
    home = tmp_path / "home"
    if kind == "a regular file":
        home.write_text("")
    else:
        home.symlink_to(tmp_path / "nowhere")
    run = muse(*command, env={**os.environ, "MUSE_LAUNCH_HOME": str(home)})
    assert run.returncode == 2, run.stdout + run.stderr
    what = "not a directory" if kind == "a regular file" else "a link to nothing"
    assert run.stderr.splitlines() == [
        f"error: MUSE_LAUNCH_HOME={home} is {what}",
        "  fix: point MUSE_LAUNCH_HOME at a directory (or at a path that does not exist yet)",
    ], run.stderr


@pytest.mark.faults("18.7 exit 70 on user input: sizes, MUSE_LAUNCH_HOME, export -o, TZ, state types")
def test_export_into_an_existing_file_is_refused(tmp_path: Path):
    target = tmp_path / "manifests.yaml"
    target.write_text("mine\n")
    run = muse("export", "topologies/epd-b300.yaml", "-o", target)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"error: {target}: is a file, not a directory" in run.stderr
    assert "fix: give -o a new or an empty directory" in run.stderr
    assert target.read_text() == "mine\n"


@pytest.mark.faults("18.7 exit 70 on user input: sizes, MUSE_LAUNCH_HOME, export -o, TZ, state types")
@pytest.mark.parametrize(
    "field, value", [("ready_at", 12), ("started_at", "noon"), ("url", 8000), ("url", "gopher://x")]
)
@pytest.mark.parametrize("command", ["status", "logs", "smoke"])
def test_a_state_whose_times_or_urls_have_the_wrong_type_is_damaged(home: Path, field, value, command):
    run_dir = deployment_with_log(b"")
    state = json.loads(run_dir.state_file.read_text())
    state["roles"][0].update({"state": "ready", field: value})
    run_dir.state_file.write_text(json.dumps(state))
    run = muse(command, "demo")
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"{run_dir.state_file} is damaged (roles.0.{field}:" in run.stderr, run.stderr
    assert "fix: `muse-launch down demo`" in run.stderr


PLAN_SECRET = "probe-secret-Tq72"


@pytest.mark.faults(
    "18.6 secrets: a probe path or host from ${env:...} in plan text/json/shell/docker, "
    "validate --json, export"
)
@pytest.mark.parametrize("fmt", ["text", "json", "shell", "docker"])
def test_a_secret_probe_path_or_host_is_never_rendered(tmp_path: Path, fmt: str):
    path = tmp_path / "s.yaml"
    path.write_text(
        "version: 1\nname: s\nhardware: cpu\nroles:\n  s:\n    kind: command\n"
        "    command: [sleep, '9']\n    host: '${env:HOST_SECRET}'\n    port: 18031\n"
        "    ready: {http: '/health/${env:PROBE_SECRET}'}\n"
    )
    env = {**os.environ, "PROBE_SECRET": PLAN_SECRET, "HOST_SECRET": "host-secret-Zr4.example"}
    for argv in (["plan", path, "--format", fmt], ["validate", "--json", path]):
        run = muse(*argv, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        out = run.stdout + run.stderr
        assert PLAN_SECRET not in out and "host-secret-Zr4" not in out, out
    if fmt != "docker":  # docker lines carry no probe
        assert "/health/***" in muse("plan", path, "--format", fmt, env=env).stdout


@pytest.mark.faults(
    "18.6 secrets: a probe path or host from ${env:...} in plan text/json/shell/docker, "
    "validate --json, export"
)
def test_export_refuses_a_secret_probe_path_writing_nothing(tmp_path: Path):
    import yaml

    data = yaml.safe_load(Path("topologies/epd-b300.yaml").read_text())
    data["roles"]["encoder"]["ready"] = {"http": "/health/${env:PROBE_SECRET}"}
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    run = muse("export", path, "-o", tmp_path / "out", env={**os.environ, "PROBE_SECRET": PLAN_SECRET})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "roles.encoder.ready: the probe path takes ${env:PROBE_SECRET}" in run.stderr
    assert "fix: write the path in the file" in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_command_line_is_shown_without_secret_looking_flags_values():
    from muse_launch.proc.masks import command_line, no_arguments

    argv = [
        "python",
        "s.py",
        "--api-key",
        "K1",
        "--port",
        "1",
        "--token=K2",
        "--max-total-tokens",
        "4096",
        "--tokenizer-path",
        "/m",
        "--hf-token",
        "K3",
        "--disable-auth",
        "--x",
        "1",
        "--control-plane-api-keys",
        "a:b:admin:K4",
    ]
    shown = command_line(argv)
    assert shown == (
        "python s.py --api-key *** --port 1 --token=*** --max-total-tokens 4096 "
        "--tokenizer-path /m --hf-token *** --disable-auth --x 1 --control-plane-api-keys ***"
    )
    assert command_line(argv, no_arguments) == ""  # with the digests lost: the program's name, by the caller


@pytest.mark.parametrize("checkout", ["/r", "/tmp/pytest-of-root/a-much-longer-checkout-path/" + "d" * 90])
def test_a_described_command_line_keeps_its_masked_flags_wherever_the_repository_is(checkout):
    """`down`'s "had to SIGKILL" lines: the flags after the program's path show the same under any checkout
    path, and no cut falls inside a word (`--api-k` before a secret's ***)."""
    from muse_launch.proc.masks import command_line
    from muse_launch.proc.process import fit_command

    argv = [f"{checkout}/.venv/bin/python", f"{checkout}/tests/stand_ins/server.py", "--api-key", "s3cr3t"]
    argv += ["--port", "8000", "--ignore-sigterm", "--token=s3cr3t", *[f"--flag-{n}" for n in range(20)]]
    shown = fit_command(command_line(argv))
    assert "stand_ins/server.py --api-key *** --port 8000" in shown, shown
    assert len(shown) <= 100 and shown.endswith(" ...") and "s3cr3t" not in shown
    assert all(word in command_line(argv) or word.startswith("...") for word in shown.split()), shown
