"""The seed's own engine for real: SGLang 0.5.23 on the CPU, as encoder + prefill + decode and as prefill +
decode behind the real sglang-router, brought up through the real CLI from examples/epd-sglang-cpu.yaml and
examples/pd-sglang-cpu.yaml (no --rehearse).

Needs the venv scripts/install_sglang_cpu.sh makes (scripts/test.sh runs it first): without it these tests
FAIL, never skip. The venv is found as the install script puts it: $MUSE_LAUNCH_SGLANG_PYTHON, else
${MUSE_LAUNCH_SGLANG_VENV:-$HOME/.cache/muse-launch/sglang-cpu-venv}/bin/python. The tiny Qwen2.5-VL is
made once per session by scripts/make_tiny_vl_model.py.

Bring-ups are few (minutes each on 2 cores): one single server for the reference answers, one EPD and one
PD deployment, each shared by the checks of its module-scoped fixture.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harness import port_open
from test_vllm_cpu import Run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.sglang_cpu, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
EPD_FILE = REPO / "examples" / "epd-sglang-cpu.yaml"
PD_FILE = REPO / "examples" / "pd-sglang-cpu.yaml"
UP_TIMEOUT = 900.0  # the examples' ready timeouts are 600 s; E+P+D took 60-67 s idle, 214 s on a busy machine
SINGLE_PORT = 18650
TEXT_PROMPT = "The router starts the prefill worker and the decode worker. What happens next?"


def sglang_python() -> Path:
    explicit = os.environ.get("MUSE_LAUNCH_SGLANG_PYTHON")
    if explicit:
        return Path(explicit)
    default = Path.home() / ".cache/muse-launch/sglang-cpu-venv"
    venv = os.environ.get("MUSE_LAUNCH_SGLANG_VENV") or str(default)
    return Path(venv) / "bin" / "python"


@pytest.fixture(scope="session")
def sglang_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The venv's python and a fresh tiny Qwen2.5-VL; fails (never skips) when the venv is missing."""
    python = sglang_python()
    if not os.access(python, os.X_OK):
        pytest.fail(
            f"the SGLang-on-CPU venv is missing: no python at {python}; "
            "run `bash scripts/install_sglang_cpu.sh` (scripts/test.sh runs it before pytest)",
            pytrace=False,
        )
    model = tmp_path_factory.mktemp("sglang-cpu") / "tiny-qwen-vl"
    made = subprocess.run(
        [str(python), str(REPO / "scripts" / "make_tiny_vl_model.py"), str(model)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if made.returncode != 0 or not (model / "config.json").is_file():
        why = f"make_tiny_vl_model.py failed ({made.returncode}):\n{made.stderr[-2000:]}"
        pytest.fail(why, pytrace=False)
    return python, model


def image_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str, with_image: bool) -> str:
    content: list[dict[str, Any]] = [{"type": "text", "text": TEXT_PROMPT}]
    if with_image:
        content.insert(0, {"type": "image_url", "image_url": {"url": image_url()}})
    body = {
        "model": "tiny",
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def single_answers(sglang_setup, tmp_path_factory) -> dict[str, str]:
    """Greedy answers of one plain SGLang server with the examples' own CPU flags and environment (read from
    the example file, not written again here), for text and for an image; stopped before the deployments."""
    python, model = sglang_setup
    example = yaml.safe_load(EPD_FILE.read_text())
    env = {**os.environ, **{k: str(v) for k, v in example["env"].items()}}
    mem_fraction = str(example["roles"]["prefill"]["mem_fraction"])
    argv = [
        str(python), "-m", "sglang.launch_server", "--model-path", str(model), *map(str, example["args"]),
        "--mem-fraction-static", mem_fraction, "--host", "127.0.0.1", "--port", str(SINGLE_PORT),
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("single") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{SINGLE_PORT}"

    def healthy() -> bool:
        assert proc.poll() is None, f"the single server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, UP_TIMEOUT, "the single SGLang server's /health")
        return {"text": chat(url, False), "image": chat(url, True)}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(120)


def make_run(file: Path, setup: tuple[Path, Path], home: Path) -> Run:
    python, model = setup
    env = {
        **os.environ,
        "MUSE_LAUNCH_HOME": str(home),
        "MUSE_LAUNCH_SGLANG_PYTHON": str(python),
        "MUSE_LAUNCH_SGLANG_MODEL": str(model),
    }
    run = Run(file, home, env)
    plan = run.cli("plan", file, "--format", "json")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    run.name = json.loads(plan.stdout)["name"]
    return run


def bring_up(file: Path, setup, tmp_path_factory, single_answers) -> tuple[Run, dict[str, Any]]:
    assert single_answers  # the reference server is down before the deployment starts
    run = make_run(file, setup, tmp_path_factory.mktemp(file.stem))
    validate = run.cli("validate", file, "--strict")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    started = time.monotonic()
    up = run.cli("up", file, "-d", timeout=UP_TIMEOUT)
    print(f"\n[sglang_cpu] {file.name}: up -d {time.monotonic() - started:.1f} s", flush=True)
    if up.returncode != 0:
        run.cleanup()
        pytest.fail(f"up -d failed ({up.returncode}):\n{up.stdout}\n{up.stderr}", pytrace=False)
    status = run.status()
    run.record(status)
    return run, status


@pytest.fixture(scope="module")
def epd(sglang_setup, tmp_path_factory, single_answers):
    run, status = bring_up(EPD_FILE, sglang_setup, tmp_path_factory, single_answers)
    yield run, status
    run.cleanup()


@pytest.fixture(scope="module")
def pd(sglang_setup, tmp_path_factory, single_answers, epd):
    # After the EPD checks' module fixture: its down is checked by its own test before this starts.
    run, status = bring_up(PD_FILE, sglang_setup, tmp_path_factory, single_answers)
    yield run, status
    run.cleanup()


def role_url(status: dict[str, Any], name: str) -> str:
    return next(r["url"] for r in status["roles"] if r["name"] == name)


def assert_wired(status: dict[str, Any], encoders: bool) -> None:
    """Ready means wired: every role ready, the router lists its prefill and decode healthy, and each
    language worker lists its encoder."""
    assert status["state"] == "ready", status
    assert {r["state"] for r in status["roles"]} == {"ready"}, status
    workers = httpx.get(role_url(status, "router") + "/workers", timeout=30).json()["workers"]
    listed = {(w["url"], w["worker_type"]) for w in workers if w.get("is_healthy", True)}
    assert (role_url(status, "prefill"), "prefill") in listed and (
        role_url(status, "decode"),
        "decode",
    ) in listed, workers
    if encoders:
        plan = yaml.safe_load(EPD_FILE.read_text())["roles"]
        for role in ("prefill", "decode"):
            port = plan[role]["encoder_bootstrap_port"]
            urls = httpx.get(f"http://127.0.0.1:{port}/list_encoder_urls", timeout=30).json()["encoder_urls"]
            assert role_url(status, "encoder") in urls, (role, urls)


def assert_down(run: Run, status: dict[str, Any]) -> None:
    ports = [p for r in status["roles"] for p in r["ports"].values()]
    down = run.cli("down", run.name, timeout=300)
    assert down.returncode == 0, f"down failed ({down.returncode}):\n{down.stdout}\n{down.stderr}"
    assert not run.survivors(), f"alive after down: {run.survivors()}\n{down.stdout}"
    assert not [p for p in ports if port_open(p)], "ports still open after down"
    after = run.cli("status", run.name, "--json")
    assert after.returncode == 0 and json.loads(after.stdout)["state"] == "stopped", after.stdout


def assert_top_reads_metrics(run: Run, status: dict[str, Any]) -> None:
    """`top` on SGLang's own /metrics (--enable-metrics in the examples' args) after traffic."""
    chat(router_ready(status), False)

    def snapshot() -> dict[str, Any] | None:
        top = run.cli("top", run.name, "--once", "--json", "--interval", "1", timeout=120)
        assert top.returncode == 0, top.stdout + top.stderr
        snap = json.loads(top.stdout)
        roles = {r["name"]: r for r in snap["roles"]}
        return snap if (roles["decode"].get("generation_tokens_total") or 0) > 0 else None

    snap = wait_for(snapshot, 120, "top to read the decode's generated tokens")
    for role in snap["roles"]:
        if role["name"] in ("prefill", "decode"):
            assert role["metrics_unavailable"] is None, role
            assert role["running"] is not None and role["queued"] is not None, role


# ---------------------------------------------------------------------------------------------


def test_epd_up_is_wired_and_smoke_passes(epd):
    run, status = epd
    assert_wired(status, encoders=True)
    smoke = run.cli("smoke", run.name, "--timeout", "300", timeout=600)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr


def router_ready(status: dict[str, Any]) -> str:
    """The router's URL once it lists every worker healthy (health checks may lag on a busy machine)."""
    router = role_url(status, "router")

    def healthy() -> bool:
        workers = httpx.get(router + "/workers", timeout=30).json()["workers"]
        return len(workers) >= 2 and all(w.get("is_healthy", True) for w in workers)

    wait_for(healthy, 120, "the router to list every worker healthy")
    return router


def test_epd_greedy_answers_equal_a_single_servers(epd, single_answers):
    run, status = epd
    router = router_ready(status)
    assert chat(router, True) == single_answers["image"]
    assert chat(router, False) == single_answers["text"]


def test_epd_top_reads_sglangs_metrics(epd):
    assert_top_reads_metrics(*epd)


def test_epd_down_leaves_nothing(epd):
    assert_down(*epd)


def test_pd_up_is_wired_and_answers_as_a_single_server(pd, single_answers):
    run, status = pd
    assert_wired(status, encoders=False)
    smoke = run.cli("smoke", run.name, "--timeout", "300", timeout=600)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert chat(router_ready(status), False) == single_answers["text"]


def test_pd_down_leaves_nothing(pd):
    assert_down(*pd)
