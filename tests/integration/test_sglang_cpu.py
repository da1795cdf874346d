"""The seed's own engine for real: SGLang 0.5.23 on the CPU, as encoder + prefill + decode and as prefill +
decode behind the real sglang-router, brought up through the real CLI from examples/epd-sglang-cpu.yaml and
examples/pd-sglang-cpu.yaml (no --rehearse).

Needs the venv scripts/install_sglang_cpu.sh makes (scripts/test.sh runs it first): without it these tests
FAIL, never skip. The venv is found as the install script puts it: $MUSE_LAUNCH_SGLANG_PYTHON, else
${MUSE_LAUNCH_SGLANG_VENV:-$HOME/.cache/muse-launch/sglang-cpu-venv}/bin/python. The tiny Qwen2.5-VL is
made once per session by scripts/make_tiny_vl_model.py.

Bring-ups are few (minutes each on 2 cores): one single server for the reference answers, one EPD and one
PD deployment, each shared by the checks of its module-scoped fixture. The PD deployment then takes, in this
order and each under a steady streaming load, a scale of decode 1 -> 2, a killed (SIGKILL) and a hung
(SIGSTOP) decode, a rolling restart of both decodes and a scale back to 1; then a short `bench`, and `down`.
The model has random weights: a streamed answer may decode to no text, so the load counts an HTTP error, a cut
stream, an error event or a missing finish as a failure, never an empty text.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harness import port_open
from router_watch import OutWatch, listed_urls  # noqa: E402
from steady_load import SteadyLoad
from test_vllm_cpu import Run, wait_for

from muse_launch.engines.metrics import SGLANG
from muse_launch.engines.router import REMOVAL_SETTLE_S

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


CLIENTS = 4  # streaming chats in a closed loop: two per decode once there are two
CHANGE_TIMEOUT = 900.0  # a new SGLang decode starts in 15-40 s idle, minutes on a loaded 2-core machine


def change(run: Run, *args: Any) -> str:
    result = run.cli(*args, timeout=CHANGE_TIMEOUT)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    run.record(run.status())  # its new processes too: down must leave none of them
    return result.stdout


def pd_load(status: dict[str, Any]) -> SteadyLoad:
    return SteadyLoad(router_ready(status), "tiny", concurrency=CLIENTS, max_tokens=8, need_content=False)


def roles_of(run: Run) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in run.status()["roles"]}


def generated(url: str) -> float:
    """Tokens the worker generated so far, by its own counter (--enable-metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    lines = text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(SGLANG.generation_tokens))


def test_pd_scale_decode_1_to_2_under_load_fails_no_request(pd):
    run, status = pd
    with pd_load(status) as load:
        load.wait_for(4, timeout=300)
        out = change(run, "scale", run.name, "decode", "2")
        assert "decode: 1 -> 2 instances" in out and "registered decode-1 (decode)" in out, out
        new_url = roles_of(run)["decode-1"]["url"]
        assert new_url in (listed_urls(role_url(status, "router")) or set())
        wait_for(lambda: generated(new_url) > 0, 300, "the new decode to serve")  # it takes traffic
        load.wait_for(4, timeout=300)
    assert load.failures == [] and load.ok >= 8, load.failures


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_pd_a_decode_killed_or_hung_under_load_fails_only_requests_it_held(pd, fault):
    """The checks of test_run_failover.py on the real engine: no request that began after the decode was out
    of the router fails, no more fail than were in flight, it serves again, and (test_pd_down_leaves_nothing)
    nothing is left after down."""
    run, status = pd
    router = role_url(status, "router")
    victim = roles_of(run)["decode-1"]
    assert victim["state"] == "ready", victim
    restarts = victim["restarts"]
    with pd_load(status) as load:
        load.wait_for(4, timeout=300)
        watch = OutWatch(router, victim["url"])
        faulted_at = time.monotonic()
        os.kill(victim["pid"], signal.Signals[fault])
        try:
            wait_for(lambda: watch.out_at is not None, 60, f"the {fault}ed decode to leave the router")
            # Restarted (a hung one: stopped first), ready, and back in the router.
            wait_for(lambda: roles_of(run)["decode-1"]["restarts"] > restarts, 300, "the decode's restart")
            back = "the decode back in the router"
            wait_for(lambda: victim["url"] in (listed_urls(router) or set()), 600, back)
            before = generated(victim["url"])
            load.wait_for(4, timeout=300)
            wait_for(lambda: generated(victim["url"]) > before, 300, "the restarted decode to serve")
        finally:
            watch.stop()
            if fault == "SIGSTOP":
                try:
                    os.kill(victim["pid"], signal.SIGCONT)
                except ProcessLookupError:
                    pass
    assert watch.out_at is not None
    late = [b - faulted_at for b in load.failed_began if b > watch.out_at + REMOVAL_SETTLE_S]
    out_after = watch.out_at - faulted_at
    assert late == [], (f"out of the router {out_after:.2f}s after the {fault}", late, load.failures)
    assert len(load.failures) <= CLIENTS, load.failures
    now = roles_of(run)["decode-1"]
    assert now["state"] == "ready" and now["pid"] != victim["pid"], now
    run.record(run.status())


def test_pd_rolling_restart_of_decode_under_load_fails_no_request(pd):
    run, status = pd
    before = {name: role["pid"] for name, role in roles_of(run).items()}
    with pd_load(status) as load:
        load.wait_for(4, timeout=300)
        out = change(run, "restart", run.name, "decode", "--rolling")
        assert "decode: 2 restarted" in out, out
        load.wait_for(4, timeout=300)
    assert load.failures == [] and load.ok >= 8, load.failures
    roles = roles_of(run)
    for name in ("decode", "decode-1"):
        assert roles[name]["state"] == "ready" and roles[name]["pid"] != before[name], roles[name]
    assert roles["prefill"]["pid"] == before["prefill"] and roles["router"]["pid"] == before["router"]
    workers = listed_urls(role_url(status, "router")) or set()
    assert {roles[n]["url"] for n in ("prefill", "decode", "decode-1")} <= workers, workers


def test_pd_scale_decode_2_to_1_under_load_fails_no_request(pd):
    run, status = pd
    gone = roles_of(run)["decode-1"]["url"]
    with pd_load(status) as load:
        load.wait_for(4, timeout=300)
        out = change(run, "scale", run.name, "decode", "1")
        assert "router: removed decode-1" in out and "decode-1: drained in" in out, out
        assert gone not in (listed_urls(role_url(status, "router")) or {gone})
        assert sorted(roles_of(run)) == ["decode", "prefill", "router"]
        load.wait_for(4, timeout=300)
    assert load.failures == [] and load.ok >= 8, load.failures


def test_pd_bench_is_valid_against_the_real_engine(pd, tmp_path):
    """A short `bench`: every request served, the output length asked for (ignore_eos), and the client's
    token count matching SGLang's own counters: a valid run, not a simulated one."""
    run, _ = pd
    out = tmp_path / "bench"
    point = ["--concurrency", "2", "--isl", "32", "--osl", "8", "--requests", "4", "--duration", "300"]
    result = run.cli("bench", run.name, *point, "--out", out, timeout=CHANGE_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["valid"] and not summary["simulated"], (summary.get("reasons"), result.stdout)
    assert "SIMULATED" not in result.stdout
    for p in summary["points"]:
        assert p["requests_ok"] == 4 and p["requests_failed"] == 0, p
    assert summary["versions"].get("sglang"), summary["versions"]


def test_pd_down_leaves_nothing(pd):
    assert_down(*pd)
