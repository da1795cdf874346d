"""Generated hostile topologies: shell metacharacters, quotes, newlines, control characters and path
pieces in every string field and name of a topology. Each file is either refused (exit 1 or 2, never a
traceback or exit 70) or rendered in every format (text, json, shell, docker, sbatch, export lws and
rbg); each shell rendering passes `bash -n` and is then run for real, every program stubbed out, in a
scratch directory: the payload (a program `pwned` that touches a canary file, reached only by breaking
out of a quote or a comment) never runs, and nothing is written outside the test's directory.

MUSE_LAUNCH_FUZZ_EXAMPLES sets how many files are generated (default 150).
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_run import REPO, muse
from harness import free_ports
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.integration]
SCENARIO = "18. generated hostile files: no payload runs from any rendering, nothing written outside"

EXAMPLES = int(os.environ.get("MUSE_LAUNCH_FUZZ_EXAMPLES", "150"))
PAYLOADS = [
    "$(pwned)",
    "`pwned`",
    ";pwned;",
    "\npwned\n",
    "\rpwned\r\n",
    "|pwned",
    "&&pwned",
    "'$(pwned)'",
    '"$(pwned)"',
    "${IFS}pwned",
    "\n#\npwned",
    "\u2028pwned",
    "\x1b]0;pwned\x07",
    "$'\\npwned'",
]
PIECES = [
    "'",
    '"',
    "\\",
    "$",
    "`",
    "$HOME",
    "*",
    "?",
    "~",
    "!",
    "#",
    "{",
    "}",
    "(",
    ")",
    "<",
    ">",
    "&",
    "|",
    ";",
    " ",
    "\t",
    "\n",
    "\r",
    "\x00",
    "\x7f",
    "../",
    "..",
    "/",
    ".",
    "-",
    "--x",
    "@",
    ":",
    "=",
    ",",
    "%",
    "a",
    "Z",
    "0",
    "_",
    "yes",
    "on",
    "0755",
    "null",
    "~",
    "127.0.0.1",
    "n0",
    "router",
    "\u00e9",
]
HOSTILE = st.lists(st.sampled_from(PIECES + PAYLOADS), min_size=1, max_size=6).map("".join)

BASE: dict[str, Any] = {
    "version": 1,
    "name": "fuzz",
    "description": "d",
    "hardware": "xeon",
    "host": "10.0.0.1",
    "model": "org/model",
    "env": {"TOP": "v"},
    "args": ["--top-x", "x"],
    "nodes": {"n0": {"address": "10.0.0.1"}, "n1": {"address": "10.0.0.2"}},
    "roles": {
        "prefill": {
            "kind": "prefill",
            "port": 30001,
            "nodes": ["n0"],
            "env": {"P": "v"},
            "args": ["--p-x", "x"],
            "transfer_backend": "mooncake",
            "launcher": ["sglang", "serve"],
        },
        "decode": {
            "kind": "decode",
            "port": 30002,
            "nodes": ["n1"],
            "env": {"D": "v"},
            "kv_cache_dtype": "auto",
        },
        "router": {
            "kind": "router",
            "port": 8000,
            "prefill": ["prefill"],
            "decode": ["decode"],
            "ready": {"http": "/health"},
        },
        "tool": {
            "kind": "command",
            "command": ["tool", "--flag", "x"],
            "port": 30100,
            "ready": {"log": "ready"},
            "env": {"T": "v"},
            "after": ["router"],
            "stop": {"signal": "SIGTERM"},
            "gpus": "0",
        },
    },
}
# Every string of BASE, and the names: the value there is replaced by a generated string.
FIELDS = [
    ("name",),
    ("description",),
    ("host",),
    ("model",),
    ("env", "TOP"),
    ("args", 1),
    ("nodes", "n0", "address"),
    ("nodes", "n1", "address"),
    ("roles", "prefill", "env", "P"),
    ("roles", "prefill", "args", 0),
    ("roles", "prefill", "args", 1),
    ("roles", "prefill", "transfer_backend"),
    ("roles", "prefill", "model"),
    ("roles", "prefill", "launcher", 0),
    ("roles", "prefill", "launcher", 1),
    ("roles", "decode", "host"),
    ("roles", "decode", "kv_cache_dtype"),
    ("roles", "decode", "bind"),
    ("roles", "router", "ready", "http"),
    ("roles", "router", "host"),
    ("roles", "tool", "command", 0),
    ("roles", "tool", "command", 2),
    ("roles", "tool", "ready", "log"),
    ("roles", "tool", "stop", "signal"),
    ("roles", "tool", "env", "T"),
    ("roles", "tool", "gpus"),
    ("roles", "tool", "after", 0),
    ("roles", "prefill", "nodes", 0),
]
# Where any text is fine (the runtime passes it on as it is): most generated files get that far.
FREE_TEXT = [
    ("description",),
    ("env", "TOP"),
    ("args", 1),
    ("roles", "prefill", "env", "P"),
    ("roles", "prefill", "args", 1),
    ("roles", "tool", "command", 2),
    ("roles", "tool", "env", "T"),
    ("roles", "prefill", "launcher", 0),
]
RENAMES = ["role", "node", "env key", "role env key"]


def hostile_topology(values: dict[tuple, str], renames: dict[str, str]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in values.items():
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = ("/" + value) if path[-1] == "http" else value
    roles = data["roles"]
    if "role" in renames:  # the role `tool`, under a generated name
        roles[renames["role"]] = roles.pop("tool")
    if "node" in renames:  # node n1, declared and used under a generated name
        data["nodes"][renames["node"]] = data["nodes"].pop("n1")
        roles["decode"]["nodes"] = [renames["node"]]
    if "env key" in renames:
        data["env"][renames["env key"]] = "v"
    if "role env key" in renames:
        roles["prefill"]["env"][renames["role env key"]] = "$(pwned)"
    return data


class Box:
    """The test's directory: the topology files, MUSE_LAUNCH_HOME, the scripts' working directory, the
    stubs; and the canary the payload would touch."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir()
        self.home, self.work, self.stubs, self.out = (root / d for d in ("home", "work", "stubs", "out"))
        for d in (self.home, self.work, self.stubs, self.out):
            d.mkdir()
        self.canary = root / "canary"
        self.calls = root / "calls"
        self._stub("pwned", f"/usr/bin/touch {self.canary}\n")
        # The batch script's own supervisor: it says it finished (else the script waits for `down`).
        self._stub(
            "python",
            'while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && /bin/mkdir -p "$2/slurm" && '
            ': > "$2/slurm/done"; shift; done\n',
        )
        # Every other program: a no-op that notes its name (BASH_ENV runs this in the script's shell).
        self.shim = root / "shim.sh"
        self.shim.write_text(
            f'command_not_found_handle() {{ printf "%q\\n" "$1" >> {self.calls}; return 0; }}\n'
        )
        self.env = {
            "PATH": os.environ["PATH"],
            "MUSE_LAUNCH_HOME": str(self.home),
            "HOME": str(self.work),
            "MUSE_LAUNCH_CGROUPS": "0",
            "HF_HUB_OFFLINE": "1",
        }
        self.count = 0

    def _stub(self, name: str, body: str) -> None:
        path = self.stubs / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)

    def run_script(self, text: str, what: str) -> None:
        script = self.root / "script.sh"
        script.write_text(text)
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, f"{what}: bash -n: {syntax.stderr}\n{text}"
        env = {"PATH": str(self.stubs), "BASH_ENV": str(self.shim), "HOME": str(self.work)}
        subprocess.run(["/bin/bash", str(script)], cwd=self.work, env=env, capture_output=True, timeout=30)
        assert not self.canary.exists(), f"{what}: the payload ran\n{text}"


def cli(box: Box, *args: Any):
    result = muse(*args, env=box.env, cwd=box.work)  # exit 70 fails here, with its traceback
    out = result.stdout + result.stderr
    assert result.returncode in (0, 1, 2), out
    assert "Traceback" not in out and "internal error" not in out, out
    return result


def render_everything(box: Box, data: dict[str, Any]) -> str:
    box.count += 1
    path = box.root / f"t{box.count % 8}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    first = cli(box, "plan", path, "--format", "json")
    if first.returncode != 0:
        return "refused"
    for fmt in ("text", "shell", "docker", "sbatch"):
        result = cli(box, "plan", path, "--format", fmt)
        if result.returncode == 0 and fmt != "text":
            box.run_script(result.stdout, f"plan --format {fmt}")
    flavour = ("lws", "rbg")[box.count % 2]  # one each time (pure-Python YAML costs ~0.3 s an export)
    out = box.out / f"{flavour}{box.count % 8}"
    result = cli(box, "export", path, "--to", flavour, "-o", out, "--image", "img")
    for manifest in out.glob("*.yaml") if result.returncode == 0 else ():
        list(yaml.safe_load_all(manifest.read_text()))  # each file is still YAML
    return "rendered"


def tree(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True, text=True
    ).stdout


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    box = Box(tmp_path / "box")
    import muse_launch.checks.versions as versions
    import muse_launch.slurm.up as slurm_up

    monkeypatch.setattr(slurm_up, "default_python", lambda: str(box.stubs / "python"))  # the batch supervisor
    # What `plan` says is installed here comes from the host, not the file: a hostile one (no ~0.3 s probe).
    monkeypatch.setattr(versions, "installed_here", lambda *a: "installed here: sglang 1\n$(pwned)\n`pwned`")
    return box


@pytest.mark.faults(SCENARIO)
def test_generated_hostile_files_never_run_a_payload(box: Box, tmp_path: Path, record_property) -> None:
    before_repo, outcomes = git_status(), {"refused": 0, "rendered": 0}
    started = time.monotonic()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        values=st.dictionaries(st.sampled_from(FIELDS + FREE_TEXT * 3), HOSTILE, min_size=1, max_size=2),
        renames=st.one_of(st.just({}), st.dictionaries(st.sampled_from(RENAMES), HOSTILE, max_size=1)),
    )
    def check(values: dict[tuple, str], renames: dict[str, str]) -> None:
        outcomes[render_everything(box, hostile_topology(values, renames))] += 1

    check()
    elapsed = time.monotonic() - started
    record_property("fuzz", f"{sum(outcomes.values())} files ({outcomes}) in {elapsed:.1f} s")
    print(
        f"\n{sum(outcomes.values())} generated files: {outcomes['rendered']} rendered in every format, "
        f"{outcomes['refused']} refused; {elapsed:.1f} s"
    )
    assert not box.canary.exists()
    assert {p.name for p in tmp_path.iterdir()} == {"box"}, "written beside the test's directory"
    inside = tuple(str(d) for d in (box.home, box.work, box.out, box.stubs))
    outside = {Path(p).name for p in tree(box.root) if not p.startswith(inside)}
    expected = {
        "calls",
        "shim.sh",
        "script.sh",
        "home",
        "work",
        "stubs",
        "out",
        *(f"t{i}.yaml" for i in range(8)),
    }
    assert outside <= expected, outside
    assert git_status() == before_repo, "written into the repository"
    assert outcomes["rendered"] >= EXAMPLES // 10, outcomes  # enough files pass to exercise the renderers


@pytest.mark.faults(SCENARIO)
def test_the_unmutated_file_renders_and_runs(box: Box) -> None:
    """The generator's base file passes and renders everything: the fuzz's scripts really run."""
    assert render_everything(box, copy.deepcopy(BASE)) == "rendered"
    calls = box.calls.read_text().split()
    assert calls.count("tool") == 2 and calls.count("docker") == 3, (
        calls
    )  # shell and docker (tool on the host)
    assert (box.home / "fuzz" / "slurm" / "done").exists()  # the batch script ran its (stub) supervisor


@pytest.mark.faults("18.2 names that climb out of the run directory or the cgroup tree")
def test_up_never_writes_outside_for_a_node_named_as_a_path(deployment, tmp_path: Path) -> None:
    """A node named `../../../../x` (logs/ -> run dir -> home -> tmp_path): `up --rehearse` refuses the
    file before anything starts; no log, simulated-engine directory or cgroup appears outside."""
    before = tree(tmp_path)
    path = deployment.write(
        {"w": {"kind": "worker", "nodes": ["../../../../x"], "port": free_ports(1)[0]}},
        nodes={"../../../../x": {"address": "127.0.0.1"}},
    )
    result = deployment.cli("up", path, "--rehearse", "-d", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "node name '../../../../x'" in result.stderr and "fix: rename the node" in result.stderr
    assert tree(tmp_path) - before == {str(path)}, tree(tmp_path) - before
    assert not deployment.alive()
