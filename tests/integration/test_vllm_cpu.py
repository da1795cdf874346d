"""The real engine: vLLM on the CPU, driven through the real CLI (examples/pd-vllm-cpu.yaml and
examples/agg-vllm-cpu.yaml), with its real start-up time, process tree and shutdown.

Needs the vLLM-on-CPU venv that scripts/install_vllm_cpu.sh makes (scripts/test.sh runs it
first). Without it these tests FAIL: CI must never pass by skipping the one test that runs a
real engine. The venv is found as the install script puts it: $MUSE_LAUNCH_VLLM_PYTHON, else
${MUSE_LAUNCH_VLLM_VENV:-$HOME/.cache/muse-launch/vllm-cpu-venv}/bin/python. The tiny model is
made here, in a temporary directory, by scripts/make_tiny_model.py.

Timings and process counts go to the terminal (also under pytest's capture, so CI's log has
them), to each test's report (`record_property`), and into one summary line per test.

A note on counting: vLLM's EngineCore and Worker, and both routers, set their process title by
overwriting their argv and environment, so /proc/PID/environ of those is empty and the
launcher's marker variables are not visible on them; they are found as descendants of the
role processes (and by name), recorded while up, and each recorded process is checked dead
after `down`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from harness import port_open

pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PD_FILE = REPO / "examples" / "pd-vllm-cpu.yaml"
AGG_FILE = REPO / "examples" / "agg-vllm-cpu.yaml"
UP_TIMEOUT = 720.0  # the examples' ready timeouts are 600 s; a loaded 2-core machine takes ~70-90 s
SERVED_MODEL = "tiny"

# >= 300 tokens with the tiny model's tokenizer (335 with the chat template): two full 128-token
# blocks for the ExampleConnector to hand over. A prompt under 128 tokens maps to the folder of the
# empty token list, which makes the decode log "External Cache Hit!" with nothing to load; only
# "Inject KV cache of N tokens" proves a hand-off.
LONG_PROMPT = " ".join(
    [
        "The launcher starts a router, a prefill worker and a decode worker on one machine.",
        "The prefill worker reads the whole prompt once and writes its key and value cache to a shared "
        "directory.",
        "The decode worker finds that cache by the hash of the prompt tokens, loads it into its paged "
        "memory,",
        "and produces the answer one token at a time without computing the prompt again.",
        "Health checks poll every server until it answers, and only then is the router started and told "
        "about it.",
        "When a process exits while the deployment is up, the supervisor restarts it on the same port,",
        "and when the operator runs down, every process of the deployment is stopped, children included,",
        "even those that were re-parented after their parent was killed, and the ports are closed before it "
        "returns.",
    ]
)
INJECTED = re.compile(r"Inject KV cache of (\d+) tokens")


# ---------------------------------------------------------------------------------------------
# The vLLM venv and the tiny model


def vllm_python() -> Path:
    """Where scripts/install_vllm_cpu.sh puts the venv's python (or $MUSE_LAUNCH_VLLM_PYTHON)."""
    explicit = os.environ.get("MUSE_LAUNCH_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    venv = os.environ.get("MUSE_LAUNCH_VLLM_VENV") or str(Path.home() / ".cache/muse-launch/vllm-cpu-venv")
    return Path(venv) / "bin" / "python"


def missing_vllm(python: Path) -> str | None:
    """Why `python` cannot serve vLLM on the CPU, or None."""
    how = (
        "install it with `bash scripts/install_vllm_cpu.sh` (scripts/test.sh runs it before pytest), "
        "or point MUSE_LAUNCH_VLLM_PYTHON at a python that has vllm-cpu"
    )
    if not os.access(python, os.X_OK):
        return f"the vLLM-on-CPU venv is missing: no python at {python}; {how}"
    check = subprocess.run(
        [
            str(python),
            "-c",
            (
                "import importlib.util as u, sys; "
                "m = [n for n in ('vllm', 'torch', 'transformers', 'tokenizers') if u.find_spec(n) is None]; "
                "print(' '.join(m)); sys.exit(1 if m else 0)"
            ),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check.returncode != 0:
        return f"{python} lacks {check.stdout.strip() or check.stderr.strip()[-300:]}; {how}"
    return None


@dataclass(frozen=True)
class VllmSetup:
    python: Path | None = None
    model: Path | None = None
    error: str | None = None
    seconds: float = 0.0


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory: pytest.TempPathFactory) -> VllmSetup:
    """The venv's python and a fresh tiny model; an error is kept for each test to fail with."""
    started = time.monotonic()
    python = vllm_python()
    problem = missing_vllm(python)
    if problem:
        return VllmSetup(error=problem)
    model = tmp_path_factory.mktemp("vllm-cpu") / "tiny-llama"
    made = subprocess.run(
        [str(python), str(REPO / "scripts" / "make_tiny_model.py"), str(model)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if made.returncode != 0 or not (model / "config.json").is_file():
        return VllmSetup(
            error=f"scripts/make_tiny_model.py failed ({made.returncode}):\n{made.stderr[-2000:]}"
        )
    return VllmSetup(python, model, seconds=time.monotonic() - started)


def require(setup: VllmSetup) -> VllmSetup:
    if setup.error:
        pytest.fail(setup.error, pytrace=False)
    return setup


# ---------------------------------------------------------------------------------------------
# Reporting: straight to the terminal (pytest's capture would hide it under -ra), and to the report


@dataclass
class Report:
    test: str
    capsys: pytest.CaptureFixture
    record_property: Callable[[str, Any], None]
    figures: dict[str, Any] = field(default_factory=dict)

    def __call__(self, key: str, value: Any, text: str | None = None) -> None:
        self.figures[key] = value
        self.record_property(key, value)
        self.say(f"{key}: {text if text is not None else value}")

    def say(self, line: str) -> None:
        with self.capsys.disabled():
            sys.stderr.write(f"\n[vllm-cpu {self.test}] {line}")
            sys.stderr.flush()

    def summary(self, keys: list[str]) -> None:
        line = " | ".join(f"{k}={self.figures[k]}" for k in keys if k in self.figures)
        self.record_property("summary", line)
        self.say(f"SUMMARY {line}\n")


@pytest.fixture
def report(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture, record_property) -> Report:
    return Report(request.node.name.removeprefix("test_"), capsys, record_property)


# ---------------------------------------------------------------------------------------------
# The CLI and the processes of a deployment


def cli_argv() -> list[str]:
    script = Path(sys.executable).with_name("muse-launch")
    return [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "muse_launch"]


def parse_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def kind_of(proc: psutil.Process) -> str:
    name = proc.name()
    if name in ("VLLM::EngineCore", "VLLM::Worker", "vllm::router", "sglang::router"):
        return name
    cmdline = " ".join(proc.cmdline())
    if "multiprocessing.resource_tracker" in cmdline:
        return "resource_tracker"
    if "vllm.entrypoints.openai.api_server" in cmdline:
        return "api_server"
    return name or "?"


def machine_vllm_processes() -> int:
    """vLLM processes on the whole machine, anyone's: EngineCore, Worker, resource trackers of its python."""
    count = 0
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and kind_of(proc) in (
                "VLLM::EngineCore",
                "VLLM::Worker",
                "resource_tracker",
            ):
                count += 1
        except psutil.Error:
            continue
    return count


@dataclass
class Run:
    """One deployment of an example under its own MUSE_LAUNCH_HOME, through the real CLI."""

    file: Path
    home: Path
    env: dict[str, str]
    name: str = ""
    sets: tuple[str, ...] = ()
    seen: dict[int, tuple[float, str]] = field(default_factory=dict)  # pid -> (create_time, kind)

    @property
    def run_dir(self) -> Path:
        return self.home / self.name

    def cli(self, *args: Any, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*cli_argv(), *map(str, args)],
            check=False,
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def status(self) -> dict[str, Any]:
        result = self.cli("status", self.name, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        return json.loads(result.stdout)

    def marked(self) -> list[psutil.Process]:
        """Processes whose environment carries this deployment's marker (API servers, resource trackers)."""
        found = []
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                if (
                    env.get("MUSE_LAUNCH_DEPLOYMENT") == self.name
                    and env.get("MUSE_LAUNCH_RUN_DIR") == str(self.run_dir)
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def processes(self, status: dict[str, Any] | None = None) -> dict[int, psutil.Process]:
        """Every live process of the deployment: the role leaders, the marked, and all their descendants."""
        roots = {p.pid: p for p in self.marked()}
        for role in (status or {}).get("roles", []):
            if role.get("pid"):
                try:
                    roots[role["pid"]] = psutil.Process(role["pid"])
                except psutil.Error:
                    pass
        found = dict(roots)
        for proc in roots.values():
            try:
                found.update((c.pid, c) for c in proc.children(recursive=True))
            except psutil.Error:
                continue
        live = {}
        for pid, proc in found.items():
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    live[pid] = proc
            except psutil.Error:
                continue
        return live

    def record(self, status: dict[str, Any]) -> dict[str, int]:
        """Remember every process of the deployment (to check each is gone later); counts by kind."""
        counts: dict[str, int] = {}
        for pid, proc in self.processes(status).items():
            try:
                kind = kind_of(proc)
                self.seen[pid] = (proc.create_time(), kind)
            except psutil.Error:
                continue
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def survivors(self) -> list[str]:
        out = []
        for pid, (created, kind) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"pid {pid} ({kind})")
            except psutil.Error:
                continue
        return out + [f"pid {p.pid} (marked)" for p in self.marked() if p.pid not in self.seen]

    def cleanup(self) -> None:
        """After a failure: `down`, then SIGKILL whatever is still known to be ours."""
        if not (self.run_dir / "state.json").exists():
            return
        try:
            self.cli("down", self.name, "--grace", "5", timeout=120)
        except subprocess.TimeoutExpired:
            pass
        try:
            state = json.loads((self.run_dir / "state.json").read_text())
            if state.get("supervisor_pid"):
                os.kill(state["supervisor_pid"], signal.SIGKILL)
        except (OSError, ValueError):
            pass
        for pid, (created, _) in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 0.01:
                    proc.kill()
            except psutil.Error:
                continue
        for proc in self.marked():
            try:
                proc.kill()
            except psutil.Error:
                continue


@pytest.fixture
def runs(tmp_path: Path):
    made: list[Run] = []

    def make(file: Path, setup: VllmSetup, *sets: str) -> Run:
        home = tmp_path / f"home-{len(made)}"
        home.mkdir()
        env = {
            **os.environ,
            "MUSE_LAUNCH_HOME": str(home),
            "MUSE_LAUNCH_VLLM_PYTHON": str(setup.python),
            "MUSE_LAUNCH_TINY_MODEL": str(setup.model),
            # torch.compile's cache, kept out of ~/.cache/vllm: every run measures a cold start, as CI's.
            "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        }
        run = Run(file, home, env, sets=sets)
        plan = run.cli("plan", file, *(a for s in sets for a in ("--set", s)), "--format", "json")
        assert plan.returncode == 0, plan.stdout + plan.stderr
        run.name = json.loads(plan.stdout)["name"]
        made.append(run)
        return run

    yield make
    for run in made:
        run.cleanup()


def up_detached(run: Run, report: Report) -> dict[str, Any]:
    """`up -d`, then status --json: every role ready; reports each role's time to ready."""
    validate = run.cli("validate", run.file, "--strict")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    started = time.time()
    up = run.cli("up", run.file, "-d", *(a for s in run.sets for a in ("--set", s)), timeout=UP_TIMEOUT)
    up_seconds = time.time() - started
    assert up.returncode == 0, f"up -d failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
    report("up_seconds", round(up_seconds, 1), f"{up_seconds:.1f} s (`up -d` until it returned, all ready)")

    status = run.status()
    assert status["state"] == "ready", status
    assert [r["state"] for r in status["roles"]] == ["ready"] * len(status["roles"]), status
    assert status["supervisor_pid"], status
    # The launcher is `${env:MUSE_LAUNCH_VLLM_PYTHON}`: the state keeps it redacted, so the version `up` read
    # through the real one is what status shows.
    assert re.fullmatch(r"0\.\d+\.\d+.*", status["versions"].get("vllm") or ""), status["versions"]
    state = json.loads((run.run_dir / "state.json").read_text())
    started_at = {r["name"]: r.get("started_at") for r in state["roles"]}
    for role in status["roles"]:
        ready = parse_time(role["ready_at"])
        since_start = ready - parse_time(started_at[role["name"]]) if started_at.get(role["name"]) else None
        since_up = ready - started
        report(
            f"ready_{role['name']}_s",
            round(since_start if since_start is not None else since_up, 1),
            f"{since_start:.1f} s from its process start, {since_up:.1f} s from `up`"
            if since_start is not None
            else f"{since_up:.1f} s from `up`",
        )
    return status


def smoke(run: Run, report: Report) -> None:
    started = time.monotonic()
    result = run.cli("smoke", run.name, "--timeout", "120", timeout=300)
    seconds = time.monotonic() - started
    assert result.returncode == 0, f"smoke failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    match = re.search(r"ok\s+chat\s+(?:ttft (\d+) ms, )?total (\d+) ms", result.stdout)
    assert match, result.stdout
    report("smoke_ttft_ms", int(match[1]) if match[1] else None)
    report(
        "smoke_total_ms",
        int(match[2]),
        f"{match[2]} ms (chat through the router; `muse-launch smoke` took {seconds:.2f} s in all)",
    )


def down_and_check(run: Run, status: dict[str, Any], report: Report) -> None:
    """`down` exit 0, then nothing of the deployment alive and its ports closed."""
    ports = [p for r in status["roles"] for p in r["ports"].values()]
    started = time.monotonic()
    down = run.cli("down", run.name, timeout=300)
    seconds = time.monotonic() - started
    assert down.returncode == 0, f"down failed ({down.returncode}):\n{down.stdout}\n{down.stderr}"
    report("down_s", round(seconds, 2), f"{seconds:.2f} s ({down.stdout.strip().splitlines()[-1]})")
    survivors = run.survivors()
    open_ports = [p for p in ports if port_open(p)]
    report("processes_after_down", len(survivors))
    report("machine_vllm_processes_after", machine_vllm_processes())
    assert not survivors, f"alive after down: {survivors}\n{down.stdout}"
    assert not open_ports, f"ports still open after down: {open_ports}"
    after = run.cli("status", run.name, "--json")
    assert after.returncode == 0 and json.loads(after.stdout)["state"] == "stopped", (
        after.stdout + after.stderr
    )


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    timeout = max(
        timeout, 60.0
    )  # a loaded 2-core machine is slow; a condition that comes true returns at once
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            assert value, f"timed out after {timeout:g} s waiting for {what}"
            return value
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------


def test_pd_vllm_cpu(vllm_setup: VllmSetup, runs, report: Report, tmp_path: Path):
    """Prefill + decode (ExampleConnector) behind vllm-router: up -d, the KV hand-off of a long
    prompt, smoke, the supervisor SIGKILLed, down: nothing left."""
    setup = require(vllm_setup)
    report(
        "setup_s",
        round(setup.seconds, 1),
        f"{setup.seconds:.1f} s (venv check + tiny model) python {setup.python}, model {setup.model}",
    )
    # A storage directory of this run's own: vLLM never cleans it, and a folder left by an earlier
    # run would make the decode's cache hit prove nothing.
    kv_dir = tmp_path / "kv"
    config = "kv_transfer_config.kv_connector_extra_config.shared_storage_path"
    run = runs(PD_FILE, setup, f"roles.prefill.{config}={kv_dir}", f"roles.decode.{config}={kv_dir}")

    report("processes_before_up", len(run.processes()))
    report("machine_vllm_processes_before", machine_vllm_processes())
    status = up_detached(run, report)
    counts = run.record(status)
    report("processes_while_up", sum(counts.values()), f"{sum(counts.values())} {counts}")
    report("machine_vllm_processes_while_up", machine_vllm_processes())
    assert counts.get("api_server") == 2 and counts.get("VLLM::EngineCore") == 2, counts
    assert counts.get("VLLM::Worker") == 2 and counts.get("vllm::router") == 1, counts
    assert 1 <= counts.get("resource_tracker", 0) <= 2, counts

    # The long prompt through the router: the prefill stores its KV, the decode injects it.
    router = next(r for r in status["roles"] if r["kind"] == "router")
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 16}
    started = time.monotonic()
    answer = httpx.post(f"{router['url']}/v1/chat/completions", json=body, timeout=120)
    seconds = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] >= 300 and usage["completion_tokens"] > 0, usage
    report(
        "long_prompt_ms",
        round(seconds * 1000),
        f"{seconds * 1000:.0f} ms for {usage['prompt_tokens']} "
        f"prompt + {usage['completion_tokens']} completion tokens",
    )

    def injected() -> int:
        logs = run.cli("logs", run.name, "decode", "-n", "500")
        assert logs.returncode == 0, logs.stdout + logs.stderr
        counts = [int(n) for n in INJECTED.findall(logs.stdout)]
        return max(counts) if "External Cache Hit" in logs.stdout and counts else 0

    tokens = wait_for(
        injected, 20, "'External Cache Hit' and 'Inject KV cache of N tokens' in the decode log"
    )
    assert tokens >= 128, tokens
    stored = [f for f in kv_dir.glob("*/*.safetensors") if f.stat().st_size > 1000]
    assert stored, f"no KV files in {kv_dir}: {list(kv_dir.rglob('*'))}"
    report(
        "kv_tokens_injected", tokens, f"{tokens} tokens (decode log), {len(stored)} layer files in {kv_dir}"
    )

    smoke(run, report)

    # The supervisor SIGKILLed: the roles live on, unsupervised, and `down` still reaches everything.
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: run.status()["supervisor_pid"] is None, 20, "status to see the supervisor gone")
    orphaned = run.status()
    assert [r["state"] for r in orphaned["roles"]] == ["ready"] * 3, orphaned
    counts = run.record(orphaned)
    report("processes_after_supervisor_sigkill", sum(counts.values()), f"{sum(counts.values())} {counts}")
    assert counts.get("VLLM::EngineCore") == 2 and counts.get("VLLM::Worker") == 2, counts

    down_and_check(run, status, report)
    report.summary(
        [
            "ready_prefill_s",
            "ready_decode_s",
            "ready_router_s",
            "up_seconds",
            "long_prompt_ms",
            "kv_tokens_injected",
            "smoke_ttft_ms",
            "smoke_total_ms",
            "processes_before_up",
            "processes_while_up",
            "processes_after_supervisor_sigkill",
            "processes_after_down",
            "down_s",
        ]
    )


def test_agg_vllm_cpu(vllm_setup: VllmSetup, runs, report: Report):
    """One vLLM server behind sglang-router: up -d, smoke, down: nothing left."""
    setup = require(vllm_setup)
    run = runs(AGG_FILE, setup)

    report("processes_before_up", len(run.processes()))
    report("machine_vllm_processes_before", machine_vllm_processes())
    status = up_detached(run, report)
    counts = run.record(status)
    report("processes_while_up", sum(counts.values()), f"{sum(counts.values())} {counts}")
    assert counts.get("api_server") == 1 and counts.get("VLLM::EngineCore") == 1, counts
    assert counts.get("VLLM::Worker") == 1 and counts.get("sglang::router") == 1, counts

    smoke(run, report)
    down_and_check(run, status, report)
    report.summary(
        [
            "ready_worker_s",
            "ready_router_s",
            "up_seconds",
            "smoke_ttft_ms",
            "smoke_total_ms",
            "processes_before_up",
            "processes_while_up",
            "processes_after_down",
            "down_s",
        ]
    )
