"""The rehearsal engine as real processes, behind the REAL sglang-router and vllm-router."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sim_harness import (
    WEATHER_MSG,
    Proc,
    free_port,
    get_status,
    http,
    sim_argv,
    sse_events,
    venv_bin,
    wait_status,
)

from muse_launch.smoke import WEATHER_TOOL

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
READY_AFTER = 0.3
KV_TIMEOUT = 0.5
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class Procs:
    """Processes started by one fixture/test; all stopped (by PID) in `close`."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.items: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Proc:
        p = Proc(name, argv, self.dir / f"{name}.log", env=dict(env or {})).start()
        self.items.append(p)
        return p

    def sim(
        self,
        name: str,
        engine: str,
        args: list[str],
        env: dict | None = None,
        ready_after: float = READY_AFTER,
        kv_timeout: float = KV_TIMEOUT,
    ) -> Proc:
        return self.start(
            name,
            sim_argv(engine, args, ready_after=ready_after, state_dir=str(self.dir), kv_timeout=kv_timeout),
            env,
        )

    def sglang_router(self, name: str, prefill: str, bootstrap: int | str, decode: str, port: int) -> Proc:
        return self.start(
            name,
            [
                venv_bin("sglang-router"),
                "launch",
                "--pd-disaggregation",
                "--prefill",
                prefill,
                str(bootstrap),
                "--decode",
                decode,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-port",
                str(free_port()),
            ],
            OFFLINE,
        )

    def vllm_router(
        self, name: str, prefill: list[str], decode: str, port: int, extra: list[str] = ()
    ) -> Proc:
        return self.start(
            name,
            [
                venv_bin("vllm-router"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-port",
                str(free_port()),
                "--vllm-pd-disaggregation",
                "--prefill",
                *prefill,
                "--decode",
                decode,
                "--policy",
                "round_robin",
                *extra,
            ],
            OFFLINE,
        )

    def close(self) -> None:
        for p in reversed(self.items):
            p.stop()


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


def sglang_epd_args(
    port: int, mode: str, encoder_url: str, enc_boot: int, kv_boot: int, extra: list[str] = ()
) -> list[str]:
    """The cookbook's prefill/decode command lines (section 3.3), on our ports."""
    return [
        "--model-path",
        M,
        "--quantization",
        "modelopt_fp4",
        "--moe-runner-backend",
        "flashinfer_trtllm",
        "--tp-size",
        "4",
        "--ep-size",
        "4",
        "--mem-fraction-static",
        "0.8",
        "--language-only",
        "--encoder-urls",
        encoder_url,
        "--encoder-transfer-backend",
        "zmq_to_tokenizer",
        "--encoder-bootstrap-port",
        str(enc_boot),
        "--disaggregation-mode",
        mode,
        "--disaggregation-transfer-backend",
        "mooncake",
        "--disaggregation-bootstrap-port",
        str(kv_boot),
        "--reasoning-parser",
        "muse",
        "--tool-call-parser",
        "muse",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


@pytest.fixture(scope="module")
def epd(tmp_path_factory):
    """Encoder + prefill + decode sims (cookbook EPD argv) behind the real sglang-router."""
    ps = Procs(tmp_path_factory.mktemp("epd"))
    try:
        enc, pf, dec, router = free_port(), free_port(), free_port(), free_port()
        kv_boot, eb_pf, eb_dec = free_port(), free_port(), free_port()
        enc_url = f"http://127.0.0.1:{enc}"
        t0 = time.monotonic()
        encoder = ps.sim(
            "encoder",
            "sglang",
            [
                "--model-path",
                M,
                "--quantization",
                "modelopt_fp4",
                "--tp-size",
                "2",
                "--encoder-only",
                "--encoder-transfer-backend",
                "zmq_to_tokenizer",
                "--host",
                "127.0.0.1",
                "--port",
                str(enc),
            ],
        )
        prefill = ps.sim("prefill", "sglang", sglang_epd_args(pf, "prefill", enc_url, eb_pf, kv_boot))
        decode = ps.sim("decode", "sglang", sglang_epd_args(dec, "decode", enc_url, eb_dec, kv_boot))
        workers = [encoder, prefill, decode]
        ready: dict[str, float] = {}  # each sim's own start-to-ready time
        pending = [(encoder, enc), (prefill, pf), (decode, dec)]
        deadline = time.monotonic() + LOADED_FLOOR
        while pending and time.monotonic() < deadline:
            for p, port in list(pending):
                if get_status(f"http://127.0.0.1:{port}/health", 1.0) == 200:
                    ready[p.name] = time.monotonic() - p.started
                    pending.remove((p, port))
                assert p.alive(), p.log()
            time.sleep(0.02)
        assert not pending, [p.log() for p, _ in pending]
        r = ps.sglang_router("router", f"http://127.0.0.1:{pf}", kv_boot, f"http://127.0.0.1:{dec}", router)
        wait_status(f"http://127.0.0.1:{router}/readiness", 200, 60, workers + [r])
        yield SimpleNamespace(
            ps=ps,
            encoder=encoder,
            prefill=prefill,
            decode=decode,
            router=r,
            enc=enc,
            pf=pf,
            dec=dec,
            kv_boot=kv_boot,
            eb_pf=eb_pf,
            eb_dec=eb_dec,
            url=f"http://127.0.0.1:{router}",
            ready=ready,
            total_ready=time.monotonic() - t0,
        )
    finally:
        ps.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def chat(url: str, body: dict, timeout: float = 60) -> tuple[int, str]:
    return http("POST", f"{url}/v1/chat/completions", body, timeout=timeout)


# ------------------------------------------------------------------ SGLang EPD


def test_epd_router_ready_and_models(epd):
    status, body = http("GET", f"{epd.url}/readiness")
    assert status == 200 and json.loads(body)["healthy_workers"] == 2
    rss = {p.name: rss_mib(p.pid) for p in (epd.encoder, epd.prefill, epd.decode, epd.router)}
    print(
        f"\nEPD (--ready-after {READY_AFTER}): health 200 after "
        + ", ".join(f"{k} {v:.2f}s" for k, v in epd.ready.items())
        + f"; router /readiness 200 {epd.total_ready:.2f}s after the first start; RSS "
        + ", ".join(f"{k} {v:.1f} MiB" for k, v in rss.items())
    )
    assert all(v < 120 for k, v in rss.items() if k != "router")
    models = json.loads(http("GET", f"{epd.url}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == [M]
    # the router loaded the sims' local tokenizer: nothing downloaded
    log = epd.router.log()
    assert "Successfully registered tokenizer" in log
    assert "Failed to load tokenizer" not in log
    for p in (epd.encoder, epd.prefill, epd.decode):
        assert "Traceback" not in p.log()  # the router's gRPC probe is one log line
    for boot in (epd.eb_pf, epd.eb_dec):  # each language worker lists its encoder
        assert json.loads(http("GET", f"http://127.0.0.1:{boot}/list_encoder_urls")[1]) == {
            "encoder_urls": [f"http://127.0.0.1:{epd.enc}"]
        }


def test_epd_chat_reasoning(epd):
    status, body = chat(
        epd.url,
        {
            "model": M,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Briefly explain: what is SGLang?"},
            ],
            "max_tokens": 16384,
            "reasoning_effort": "xhigh",
        },
    )
    assert status == 200, body
    resp = json.loads(body)
    msg = resp["choices"][0]["message"]
    assert msg["reasoning_content"] and "what is SGLang?" in msg["content"]
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert resp["usage"]["completion_tokens"] > 0
    # the KV hand-off really happened over the bootstrap port
    # the logs are written by other processes: polled, not read once after a fixed sleep
    wait_for(lambda: "fetched by decode" in epd.prefill.log(), procs=[epd.prefill, epd.decode])
    wait_for(
        lambda: f"fetched from 127.0.0.1:{epd.kv_boot}" in epd.decode.log(), procs=[epd.prefill, epd.decode]
    )


def test_epd_chat_tool_call(epd):
    status, body = chat(
        epd.url,
        {
            "model": M,
            "messages": WEATHER_MSG,
            "tools": [WEATHER_TOOL],
            "tool_choice": "auto",
            "reasoning_effort": "xhigh",
            "max_tokens": 16384,
        },
    )
    assert status == 200, body
    ch = json.loads(body)["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    (tc,) = ch["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"location": "Beijing", "unit": "celsius"}
    assert ch["message"]["reasoning_content"]


def test_epd_chat_streaming(epd):
    status, body = chat(
        epd.url,
        {
            "model": M,
            "stream": True,
            "reasoning_effort": "low",
            "messages": WEATHER_MSG,
            "tools": [WEATHER_TOOL],
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200, body
    ev = sse_events(body)
    assert ev[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in ev[:-1] if e["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather"
    finish = [e["choices"][0]["finish_reason"] for e in ev[:-1] if e["choices"]]
    assert finish[-1] == "tool_calls"
    # plain streamed answer too
    status, body = chat(
        epd.url, {"model": M, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    )
    ev = sse_events(body)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev[:-1] if e["choices"])
    assert status == 200 and "hello" in text


def test_epd_generate_and_media_through_encoder(epd):
    status, body = http(
        "POST",
        f"{epd.url}/generate",
        {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8}},
    )
    assert status == 200, body
    assert json.loads(body)["meta_info"]["completion_tokens"] == 8
    status, body = chat(
        epd.url,
        {
            "model": M,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                        {"type": "text", "text": "What is in the picture?"},
                    ],
                }
            ],
        },
    )
    assert status == 200, body
    assert json.loads(body)["usage"]["prompt_tokens"] > 256
    assert "embedded 1 media item" in epd.prefill.log()


def test_wrong_bootstrap_port_fails_naming_address(epd, tmp_path):
    """The router told the wrong KV bootstrap port: the request fails as on GPUs."""
    wrong = free_port()
    ps = Procs(tmp_path)
    try:
        rp = free_port()
        r = ps.sglang_router(
            "bad-router", f"http://127.0.0.1:{epd.pf}", wrong, f"http://127.0.0.1:{epd.dec}", rp
        )
        wait_status(f"http://127.0.0.1:{rp}/readiness", 200, 60, [r])
        t = time.monotonic()
        status, body = chat(f"http://127.0.0.1:{rp}", {"model": M, "messages": WEATHER_MSG})
        took = time.monotonic() - t
        assert status >= 500, body
        assert f"127.0.0.1:{wrong}" in body and "bootstrap" in body.lower()
        status, body = chat(f"http://127.0.0.1:{rp}", {"model": M, "messages": WEATHER_MSG, "stream": True})
        assert status >= 500 and f"127.0.0.1:{wrong}" in body
        assert f"bootstrap 127.0.0.1:{wrong}" in epd.decode.log()
        assert took < 40  # 5 router attempts x --kv-timeout 0.5 s (+ backoff, + a loaded host)
    finally:
        ps.close()


PROBE = {"MUSE_SIM_ENCODER_PROBE_INTERVAL": "0.2"}


def listed(boot: int) -> list[str]:
    return json.loads(http("GET", f"http://127.0.0.1:{boot}/list_encoder_urls")[1])["encoder_urls"]


LOADED_FLOOR = (
    60.0  # the shortest deadline of a wait: a loaded 2-core machine is slow, a pass returns at once
)


def wait_for(predicate, timeout: float = 10.0, procs: list | None = None) -> None:
    deadline = time.monotonic() + max(timeout, LOADED_FLOOR)
    while not predicate():
        assert time.monotonic() < deadline, [p.log() for p in procs or []]
        for p in procs or []:
            assert p.alive(), p.log()
        time.sleep(0.05)


def test_wrong_encoder_url_ready_then_evicted(procs):
    """As SGLang 0.5.23: the language worker is healthy without its encoder, lists the URL it was
    given, and evicts it after 3 failed probes; the encoder bootstrap server is up first."""
    dead, pf, eb = free_port(), free_port(), free_port()
    dead_url = f"http://127.0.0.1:{dead}"
    p = procs.sim("prefill", "sglang", sglang_epd_args(pf, "prefill", dead_url, eb, free_port()), env=PROBE)
    wait_status(f"http://127.0.0.1:{eb}/health", 200, 30, [p])
    assert listed(eb) == [dead_url]  # listed before any probe: "listed" is not "reached"
    wait_status(f"http://127.0.0.1:{pf}/health", 200, 30, [p])
    wait_for(lambda: listed(eb) == [], 10, [p])
    log = p.log()
    assert f"encoder {dead_url} health probe failed (3/3): unreachable" in log
    assert (
        f"Health check evicted 1 encoder(s) after 3 consecutive failures (will re-add when "
        f"healthy): ['{dead_url}']" in log
    )
    info = json.loads(http("GET", f"http://127.0.0.1:{pf}/server_info")[1])
    assert info["sim"]["encoders"] == {"encoder_urls": [], "evicted": [dead_url]}
    assert info["sim"]["wiring_blockers"] == []


def test_late_encoder_is_re_added(procs):
    """The language worker starts first (overlap): its encoder, evicted while still loading,
    is re-added once it answers /health; media then go through it."""
    enc, pf, eb = free_port(), free_port(), free_port()
    enc_url = f"http://127.0.0.1:{enc}"
    p = procs.sim(
        "lang",
        "sglang",
        [
            "--model-path",
            M,
            "--language-only",
            "--encoder-urls",
            enc_url,
            "--encoder-bootstrap-port",
            str(eb),
            "--port",
            str(pf),
        ],
        env=PROBE,
    )
    wait_status(f"http://127.0.0.1:{pf}/health", 200, 30, [p])
    wait_for(lambda: listed(eb) == [], 10, [p])
    e = procs.sim("encoder", "sglang", ["--model-path", M, "--encoder-only", "--port", str(enc)])
    wait_for(lambda: listed(eb) == [enc_url], 15, [p, e])
    assert f"Health check revived 1 encoder(s): ['{enc_url}']" in p.log()
    status, body = chat(
        f"http://127.0.0.1:{pf}",
        {
            "model": M,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                        {"type": "text", "text": "What is in the picture?"},
                    ],
                }
            ],
        },
    )
    assert status == 200, body
    assert f"delivered to 127.0.0.1:{eb}" in e.log()


def test_encoder_model_mismatch_fails_media_requests(procs):
    enc, pf = free_port(), free_port()
    procs.sim("encoder", "sglang", ["--model-path", "other/model", "--encoder-only", "--port", str(enc)])
    p = procs.sim(
        "lang",
        "sglang",
        [
            "--model-path",
            M,
            "--language-only",
            "--encoder-urls",
            f"http://127.0.0.1:{enc}",
            "--port",
            str(pf),
            "--encoder-bootstrap-port",
            str(free_port()),
        ],
    )
    wait_status(f"http://127.0.0.1:{pf}/health", 200, 30, [p])
    wait_status(f"http://127.0.0.1:{enc}/health", 200, 30, [p])
    status, body = chat(
        f"http://127.0.0.1:{pf}",
        {
            "model": M,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
                }
            ],
        },
    )
    assert status == 500 and "model mismatch" in body, body


def test_encoder_registers_itself_dynamically(procs):
    """--language-only without --encoder-urls; the encoder uses --encoder-register-urls, and
    leaves the list when it stops."""
    pf, eb, enc = free_port(), free_port(), free_port()
    p = procs.sim(
        "lang",
        "sglang",
        ["--model-path", M, "--language-only", "--encoder-bootstrap-port", str(eb), "--port", str(pf)],
    )
    e = procs.sim(
        "encoder",
        "sglang",
        [
            "--model-path",
            M,
            "--encoder-only",
            "--port",
            str(enc),
            "--encoder-register-urls",
            f"http://127.0.0.1:{eb}",
        ],
    )
    wait_status(f"http://127.0.0.1:{pf}/health", 200, 30, [p, e])
    wait_status(f"http://127.0.0.1:{enc}/health", 200, 30, [p, e])
    wait_for(lambda: listed(eb) == [f"http://127.0.0.1:{enc}"], 10, [p, e])
    e.stop()
    assert listed(eb) == []
    assert f"Unregistered encoder URL: http://127.0.0.1:{enc}" in p.log()


# ------------------------------------------------------------------ process behaviour


def test_busy_ports_exit_1_naming_the_port(procs):
    hold = socket.socket()
    hold.bind(("127.0.0.1", 0))
    hold.listen()
    busy = hold.getsockname()[1]
    try:
        p = procs.sim("busy-http", "sglang", ["--model-path", M, "--port", str(busy)])
        assert p.popen.wait(30) == 1
        assert f"address already in use (HTTP port {busy})" in p.log()
        p = procs.sim(
            "busy-boot",
            "sglang",
            [
                "--model-path",
                M,
                "--port",
                str(free_port()),
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                str(busy),
            ],
        )
        assert p.popen.wait(30) == 1
        assert f"disaggregation bootstrap port {busy}" in p.log()
        p = procs.sim(
            "busy-eb",
            "sglang",
            [
                "--model-path",
                M,
                "--port",
                str(free_port()),
                "--language-only",
                "--encoder-bootstrap-port",
                str(busy),
            ],
        )
        assert p.popen.wait(30) == 1
        assert f"encoder bootstrap port {busy}" in p.log()
    finally:
        hold.close()


def test_decode_does_not_bind_bootstrap_port(procs):
    """The cookbook's decode carries the prefill's 8998: no conflict on one host."""
    boot = free_port()
    pf, dec = free_port(), free_port()
    a = procs.sim(
        "prefill",
        "sglang",
        [
            "--model-path",
            M,
            "--port",
            str(pf),
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(boot),
        ],
    )
    b = procs.sim(
        "decode",
        "sglang",
        [
            "--model-path",
            M,
            "--port",
            str(dec),
            "--disaggregation-mode",
            "decode",
            "--disaggregation-bootstrap-port",
            str(boot),
        ],
    )
    wait_status(f"http://127.0.0.1:{pf}/health", 200, 30, [a, b])
    wait_status(f"http://127.0.0.1:{dec}/health", 200, 30, [a, b])


def test_sigterm_fast_exit_and_footprint(procs):
    port = free_port()
    t0 = time.monotonic()
    p = procs.sim("worker", "sglang", ["--model-path", M, "--port", str(port)], ready_after=0.0)
    wait_status(f"http://127.0.0.1:{port}/health", 200, 30, [p])
    start_to_ready = time.monotonic() - t0
    rss_kb = rss_mib(p.pid) * 1024
    t = time.monotonic()
    p.popen.send_signal(signal.SIGTERM)
    rc = p.popen.wait(LOADED_FLOOR)
    took = time.monotonic() - t
    print(
        f"\nsim footprint: RSS {rss_kb / 1024:.1f} MiB, start-to-ready {start_to_ready:.2f}s "
        f"(--ready-after 0), SIGTERM exit {took * 1000:.0f} ms"
    )
    # How fast it starts and exits is printed above, not asserted: a loaded machine decides that.
    assert rc == 0
    assert rss_kb < 120 * 1024
    assert "received SIGTERM" in p.log()


def test_multinode_dist_init(procs):
    p0, p1, dist = free_port(), free_port(), free_port()
    base = ["--model-path", M, "--tp-size", "16", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}"]
    n0 = procs.sim("node0", "sglang", base + ["--node-rank", "0", "--port", str(p0)])
    wait_status(f"http://127.0.0.1:{p0}/server_info", 200, 30, [n0])
    # Its ready_after is over and what holds it is node 1 (the log's "not ready:" line, written then): not a
    # window of time, which a loaded machine stretches.
    wait_for(lambda: "not ready: waiting for 1 node(s) to join" in n0.log(), 30, [n0])
    assert get_status(f"http://127.0.0.1:{p0}/health") == 503
    n1 = procs.sim("node1", "sglang", base + ["--node-rank", "1", "--port", str(p1)])
    wait_status(f"http://127.0.0.1:{p0}/health", 200, 30, [n0, n1])
    assert "node 1 joined" in n0.log()


# ------------------------------------------------------------------ vLLM behind vllm-router


def vllm_pair(
    procs: Procs,
    kv_prefill: dict,
    kv_decode: dict,
    env_p: dict | None = None,
    env_d: dict | None = None,
    extra_router: list[str] = (),
    bootstrap: int | None = None,
):
    pf, dec, rp = free_port(), free_port(), free_port()
    common = [
        M,
        "--tensor-parallel-size",
        "8",
        "--enable-expert-parallel",
        "--reasoning-parser",
        "muse",
        "--tool-call-parser",
        "muse",
        "--enable-auto-tool-choice",
        "--host",
        "127.0.0.1",
    ]
    a = procs.sim(
        "vprefill",
        "vllm",
        common + ["--port", str(pf), "--kv-transfer-config", json.dumps(kv_prefill)],
        env_p,
    )
    b = procs.sim(
        "vdecode", "vllm", common + ["--port", str(dec), "--kv-transfer-config", json.dumps(kv_decode)], env_d
    )
    for port in (pf, dec):  # workers first, then the router (as `up` orders them)
        wait_status(f"http://127.0.0.1:{port}/health", 200, 30, [a, b])
    pre = [f"http://127.0.0.1:{pf}"] + ([str(bootstrap)] if bootstrap else [])
    r = procs.vllm_router("vrouter", pre, f"http://127.0.0.1:{dec}", rp, list(extra_router))
    wait_status(f"http://127.0.0.1:{rp}/readiness", 200, 60, [a, b, r])
    return SimpleNamespace(prefill=a, decode=b, router=r, url=f"http://127.0.0.1:{rp}")


def test_vllm_nixl_pair_behind_vllm_router(procs):
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    s = vllm_pair(
        procs,
        kv,
        kv,
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())},
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())},
    )
    status, body = chat(
        s.url, {"model": M, "messages": WEATHER_MSG, "tools": [WEATHER_TOOL], "reasoning_effort": "high"}
    )
    assert status == 200, body
    resp = json.loads(body)
    ch = resp["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    assert ch["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert ch["message"]["reasoning_content"]
    status, body = chat(
        s.url, {"model": M, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    )
    ev = sse_events(body)
    assert status == 200 and ev[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in ev[:-1] if e["choices"])
    wait_for(
        lambda: (
            s.prefill.log().count("KV held for the decode (NixlConnector") >= 2
            and s.decode.log().count("loaded remote KV") >= 2
            and "read by 127.0.0.1" in s.prefill.log()
        )
    )
    assert s.prefill.log().count("KV held for the decode (NixlConnector") == 2
    assert s.decode.log().count("loaded remote KV") == 2


def test_vllm_mooncake_pair_behind_vllm_router(procs):
    boot = free_port()
    s = vllm_pair(
        procs,
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
        {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"},
        {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(boot)},
        None,
        ["--kv-connector", "mooncake"],
        bootstrap=boot,
    )
    status, body = chat(s.url, {"model": M, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    wait_for(
        lambda: (
            "bootstrap /query" in s.prefill.log()
            and "mooncake: transfer xfer-" in s.prefill.log()
            and "loaded remote KV" in s.decode.log()
        )
    )


def test_vllm_example_connector_shared_storage(procs, tmp_path):
    shared = tmp_path / "kv-shared"
    shared.mkdir()
    kvp = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(shared)},
    }
    kvd = dict(kvp, kv_role="kv_consumer")
    s = vllm_pair(procs, kvp, kvd)
    status, body = chat(
        s.url,
        {
            "model": M,
            "messages": [{"role": "user", "content": "Tell me a long story about " + "dragons " * 40}],
        },
    )
    assert status == 200, body
    wait_for(lambda: "External Cache Hit" in s.decode.log())
    assert any(shared.iterdir())


def test_vllm_nixl_side_channel_collision_exits_1(procs):
    side = str(free_port())
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    a = procs.sim(
        "v1",
        "vllm",
        ["m", "--port", str(free_port()), "--kv-transfer-config", kv],
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": side},
    )
    wait_status(f"http://127.0.0.1:{a.argv[a.argv.index('--port') + 1]}/health", 200, 30, [a])
    b = procs.sim(
        "v2",
        "vllm",
        ["m", "--port", str(free_port()), "--kv-transfer-config", kv],
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": side},
    )
    assert b.popen.wait(30) == 1
    assert f"NIXL side channel port {side}" in b.log()


def test_vllm_decode_unreachable_side_channel_fails(procs):
    """A decode told to read KV from a dead side channel fails the request, naming it."""
    dec = free_port()
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"})
    d = procs.sim(
        "vdec",
        "vllm",
        [M, "--port", str(dec), "--kv-transfer-config", kv],
        {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())},
    )
    wait_status(f"http://127.0.0.1:{dec}/health", 200, 30, [d])
    dead = free_port()
    status, body = chat(
        f"http://127.0.0.1:{dec}",
        {
            "model": M,
            "messages": WEATHER_MSG,
            "kv_transfer_params": {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": "e",
                "remote_block_ids": [0],
                "remote_request_id": "r1",
                "remote_host": "127.0.0.1",
                "remote_port": dead,
            },
        },
    )
    assert status == 500 and f"127.0.0.1:{dead}" in body


def test_loopback_flag_overrides_bind_host(procs):
    port = free_port()
    p = procs.start(
        "lo",
        sim_argv(
            "vllm", ["m", "--host", "0.0.0.0", "--port", str(port)], ready_after=0.0, extra=["--loopback"]
        ),
    )
    wait_status(f"http://127.0.0.1:{port}/health", 200, 30, [p])
    assert f"listening: HTTP on 127.0.0.1:{port}" in p.log()
