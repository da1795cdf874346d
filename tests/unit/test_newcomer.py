"""What a new user meets first: a missing file, a bad --set, an unset variable, GPUs the node lacks."""

from __future__ import annotations

import json
import os
import re

from cli_run import REPO, muse


def test_a_missing_file_is_an_error_with_a_fix_naming_the_nearest_file() -> None:
    run = muse("validate", "topologies/epd-b30.yaml")
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "error: topologies/epd-b30.yaml: no such file",
        "  fix: did you mean topologies/epd-b300.yaml?",
    ]
    # From the repository's root, a bare name is found in topologies/
    run = muse("up", "epd-b300.yaml", "--rehearse")
    assert run.returncode == 2 and "fix: did you mean topologies/epd-b300.yaml?" in run.stderr
    run = muse("validate", "nowhere/zzz.yaml")
    assert run.stderr.startswith(
        "error: nowhere/zzz.yaml: no such file\n  fix: give the path of a topology file"
    )
    as_json = json.loads(muse("validate", "topologies/epd-b30.yaml", "--json").stdout)
    assert as_json["ok"] is False and as_json["fix"] == "did you mean topologies/epd-b300.yaml?"


def test_a_bad_set_value_is_named_as_the_set_argument_not_the_file_line() -> None:
    run = muse("validate", "topologies/epd-b300.yaml", "--set", "roles.prefill.tp=abc")
    assert run.returncode == 2
    assert run.stderr.startswith(
        "topologies/epd-b300.yaml: --set roles.prefill.tp=abc: roles.prefill.tp: 'abc' is not valid here"
    ), run.stderr
    assert "epd-b300.yaml:24" not in run.stderr
    # A check's finding on a value --set gave names the argument too; one on the file's value keeps its line.
    run = muse(
        "validate",
        "topologies/epd-b300.yaml",
        "--set",
        "roles.decode.gpus=[4,5,6,7,8]",
        "--set",
        "roles.decode.tp=5",
    )
    assert (
        "topologies/epd-b300.yaml: --set roles.decode.gpus=[4,5,6,7,8]: error: roles.decode.gpus[4]: "
        "GPU 8 does not exist" in run.stderr
    ), run.stderr
    assert "topologies/epd-b300.yaml:42: error: roles.decode.ep: ep 4 does not divide tp 5" in run.stderr


def test_an_unset_variable_of_the_repositorys_examples_points_at_their_setup_script() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSE_LAUNCH_") or k == "MUSE_LAUNCH_HOME"}
    run = muse("validate", "examples/pd-vllm-cpu.yaml", env=env)
    assert run.returncode == 2
    setup = 'run `eval "$(bash scripts/vllm_cpu_setup.sh)"` first'
    assert f"${{env:MUSE_LAUNCH_TINY_MODEL}} is not set; {setup}" in run.stderr, run.stderr


def test_a_gpu_the_node_lacks_is_the_error_not_an_idle_gpu_or_a_bigger_tp() -> None:
    run = muse("validate", "topologies/epd-b300.yaml", "--set", "roles.decode.gpus=[4,5,6,7,8]")
    assert run.returncode == 1
    assert "GPU 8 does not exist" in run.stderr
    assert "stay idle" not in run.stderr and "stays idle" not in run.stderr and "tp to 5" not in run.stderr


def test_plan_names_the_start_policy_and_what_starts_together() -> None:
    """`plan --rehearse` used to say "3 waves", prefill "after: encoder", while `up` started them together."""
    run = muse("plan", "topologies/epd-b300.yaml", "--rehearse")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == (
        "deployment epd-b300: 4 processes in 2 waves; start: overlap "
        "(encoder, prefill, decode start together)"
    )
    assert "wave 1: encoder, prefill, decode" in lines and "wave 2: router" in lines
    assert run.stdout.count("wired to encoder, not waiting for it") == 2
    assert "    ready: /readiness (timeout 600s)    after: prefill, decode" in lines
    waves = muse("plan", "topologies/epd-b300.yaml", "--rehearse", "--set", "start=waves")
    head = waves.stdout.splitlines()[0]
    assert head.startswith("deployment epd-b300: 4 processes in 3 waves; start: waves")
    assert "after: encoder" in waves.stdout
    as_json = json.loads(muse("plan", "topologies/epd-b300.yaml", "--rehearse", "-f", "json").stdout)
    assert as_json["start"] == {
        "policy": "overlap",
        "after": {"encoder": [], "prefill": [], "decode": [], "router": ["prefill", "decode"]},
    }


def test_a_masked_value_in_the_engine_checks_notes_is_explained_once(tmp_path) -> None:
    from muse_launch.checks.engine import EngineCheckResult, report
    from muse_launch.topology.load import load_topology

    python = str(tmp_path / "venv" / "bin" / "python")
    env = {"MUSE_LAUNCH_TINY_MODEL": str(tmp_path), "MUSE_LAUNCH_VLLM_PYTHON": python}
    loaded = load_topology(REPO / "examples" / "agg-vllm-cpu.yaml", environ=env)
    said: list[str] = []
    note = f"engine check: vllm 0.32.0 ({python}) accepts 1 command of 1"
    result = EngineCheckResult(notes=(note, note), findings=())
    assert report(result, loaded, said.append) is False
    masked = "engine check: vllm 0.32.0 (***) accepts 1 command of 1"
    assert said == [f"{masked} (***: a value from ${{env:...}} in the file, never printed)", masked]


# Documents a reader of this repository does not have: the team's spec and notes, issue numbers.
DANGLING = re.compile(
    r"\bSPEC\b(?![A-Z_])|ENGINE-FACTS|DESIGN\.md|shared/reference|/work/shared"
    r"|\b[Ii]ssue \d+"
)


DOC_LINK = re.compile(r"\bdocs/[\w./-]+\.md\b")


def _repo_text_files():
    for path in [
        *REPO.glob("muse_launch/**/*.py"),
        *REPO.glob("scripts/*"),
        REPO / "pyproject.toml",
        *REPO.glob("topologies/*.yaml"),
        *REPO.glob("examples/*.yaml"),
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
    ]:
        if path.is_file():
            yield path, path.read_text(errors="replace")


def test_no_comment_or_help_text_points_at_a_document_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path, text in _repo_text_files()
        for n, line in enumerate(text.splitlines(), 1)
        if DANGLING.search(line)
    ]
    assert found == []


def test_every_docs_file_named_exists() -> None:
    missing = sorted(
        {
            f"{path.relative_to(REPO)}: {link}"
            for path, text in _repo_text_files()
            for link in DOC_LINK.findall(text)
            if not (REPO / link).is_file()
        }
    )
    assert missing == []


def test_the_readmes_first_screen_reaches_a_command_before_any_picture_source() -> None:
    """The README opened with 28 lines of mermaid source before the first command to type."""
    lines = (REPO / "README.md").read_text().splitlines()
    first_command = lines.index("```sh")
    assert first_command < 24, "the quick start's command is past the first screen"
    assert "```mermaid" not in lines[:first_command]
