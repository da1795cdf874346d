"""EPD wiring of the rehearsal engine as SGLang 0.5.23 does it, in-process: a language worker is
healthy without its encoders, probes them (3 failures evict, a healthy probe re-adds), lists them
on its encoder bootstrap port, and sends media to the listed ones (none: local; unreachable: 502)."""

import asyncio
import io

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sim_harness import free_port

from muse_launch.sim.config import parse_engine_args
from muse_launch.sim.encoders import FAIL_THRESHOLD, probe_settings
from muse_launch.sim.modeldir import make_model_dir
from muse_launch.sim.server import SimEngine

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
IMAGE_CHAT = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {"type": "text", "text": "What is in the picture?"},
            ],
        }
    ]
}


def engine(tmp_path, argv, **kw) -> SimEngine:
    cfg = parse_engine_args("sglang", ["--model-path", M, "--host", "127.0.0.1", *argv])
    eng = SimEngine(cfg, ready_after=0.0, state_dir=str(tmp_path), itl=0, out=io.StringIO(), **kw)
    eng.model_dir = make_model_dir(str(tmp_path), cfg)
    return eng


class Flaky:
    """An encoder stand-in whose /health answers what `healthy` says."""

    def __init__(self):
        self.healthy = True
        self.app = web.Application()
        self.app.router.add_get("/health", self.health)

    async def health(self, request):
        return web.Response(status=200 if self.healthy else 503)


def run(tmp_path, fn, encoders=(), encoder_model=M, language_args=()):
    """An encoder (real sim app) and a language worker (HTTP + encoder bootstrap server);
    `encoders` are the --encoder-urls, where "ENC" is the encoder and "DEAD" a closed port."""

    async def main():
        servers, sessions = [], []

        async def serve(app, port=None):
            s = TestServer(app, host="127.0.0.1", port=port)
            await s.start_server()
            servers.append(s)
            return str(s.make_url("")).rstrip("/")

        enc = engine(tmp_path / "enc", ["--encoder-only", "--model-path", encoder_model])
        enc.session = aiohttp.ClientSession()
        sessions.append(enc.session)
        flaky = Flaky()
        names = {
            "ENC": await serve(enc.http_app()),
            "FLAKY": await serve(flaky.app),
            "DEAD": f"http://127.0.0.1:{free_port()}",
        }
        boot = free_port()
        urls = [names.get(u, u) for u in encoders]
        lang = engine(
            tmp_path / "lang",
            [
                "--language-only",
                "--encoder-bootstrap-port",
                str(boot),
                *(["--encoder-urls", *urls] if urls else []),
                *language_args,
            ],
        )
        lang.session = aiohttp.ClientSession()
        sessions.append(lang.session)
        await serve(lang.encoders.bootstrap_app(), port=boot)
        client = TestClient(TestServer(lang.http_app()))
        await client.start_server()
        boot_url = f"http://127.0.0.1:{boot}"
        try:
            return await fn(client, lang, boot_url, names, flaky, enc)
        finally:
            await client.close()
            for s in servers:
                await s.close()
            for s in sessions:
                await s.close()

    return asyncio.run(main())


async def listed(lang_session, boot_url):
    async with lang_session.get(f"{boot_url}/list_encoder_urls") as r:
        assert r.status == 200
        return await r.json()


def test_healthy_without_encoders_and_the_list_starts_as_given(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        return (await c.get("/health")).status, await listed(lang.session, boot)

    status, body = run(tmp_path, fn, encoders=["DEAD", "ENC"])
    assert status == 200
    assert list(body) == ["encoder_urls"] and len(body["encoder_urls"]) == 2
    assert body["encoder_urls"][0].startswith("http://127.0.0.1:")


def test_three_failed_probes_evict_and_a_healthy_one_re_adds(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        flaky.healthy = False
        seen = []
        for _ in range(FAIL_THRESHOLD):
            seen.append((await listed(lang.session, boot))["encoder_urls"])
            await lang.encoders.check_once()
        seen.append((await listed(lang.session, boot))["encoder_urls"])
        await lang.encoders.check_once()  # still failing: stays out, no more counting
        seen.append((await listed(lang.session, boot))["encoder_urls"])
        flaky.healthy = True
        await lang.encoders.check_once()
        seen.append((await listed(lang.session, boot))["encoder_urls"])
        return seen, names["FLAKY"], (await c.get("/health")).status, lang.out.getvalue()

    seen, url, health, log = run(tmp_path, fn, encoders=["FLAKY"])
    assert seen == [[url]] * FAIL_THRESHOLD + [[], [], [url]]
    assert health == 200
    assert f"encoder {url} health probe failed (3/3): /health answered 503" in log
    assert (
        f"Health check evicted 1 encoder(s) after 3 consecutive failures (will re-add when "
        f"healthy): ['{url}']" in log
    )
    assert f"Health check revived 1 encoder(s): ['{url}']" in log


def test_an_evicted_encoder_is_dropped_after_the_ttl(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        lang.encoders.probe["evicted_ttl"] = 0.05
        for _ in range(FAIL_THRESHOLD):
            await lang.encoders.check_once()
        evicted = dict(lang.encoders.evicted)
        await asyncio.sleep(0.06)
        await lang.encoders.check_once()
        return evicted, dict(lang.encoders.evicted), lang.encoders.urls, lang.out.getvalue()

    evicted, after, urls, log = run(tmp_path, fn, encoders=["DEAD"])
    assert len(evicted) == 1 and after == {} and urls == []
    assert "Health check permanently dropped 1 encoder(s)" in log


def test_bootstrap_server_routes_as_sglang(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        s = lang.session
        out = []
        for method, path, body in (
            ("GET", "/health", None),
            ("POST", "/register_encoder_url", {"url": "http://e:1"}),
            ("POST", "/register_encoder_url", {"url": "http://e:1"}),
            ("GET", "/list_encoder_urls", None),
            ("POST", "/register_encoder_url", {}),
            ("DELETE", "/unregister_encoder_url", {"url": "http://e:1"}),
            ("GET", "/list_encoder_urls", None),
        ):
            async with s.request(method, f"{boot}{path}", json=body) as r:
                out.append((r.status, await r.text()))
        gone = (await c.get("/list_encoder_urls")).status  # not on the worker's HTTP port
        return out, gone

    out, gone = run(tmp_path, fn)
    assert out == [
        (200, "OK"),
        (200, "OK"),
        (200, "OK"),
        (200, '{"encoder_urls": ["http://e:1"]}'),
        (400, '{"error": "Missing or empty \'url\' field"}'),
        (200, "OK"),
        (200, '{"encoder_urls": []}'),
    ]
    assert gone == 404


def test_media_go_to_the_listed_encoder_and_come_back_to_the_bootstrap_port(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        r = await c.post("/v1/chat/completions", json=IMAGE_CHAT)
        return r.status, await r.json(), lang.out.getvalue(), enc.out.getvalue()

    status, body, log, enc_log = run(tmp_path, fn, encoders=["ENC"])
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] > 256
    assert "embedded 1 media item(s)" in log and "delivered to 127.0.0.1:" in enc_log


def test_no_encoder_listed_processes_media_locally_with_a_warning(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        r = await c.post("/v1/chat/completions", json=IMAGE_CHAT)
        return r.status, await r.json(), lang.out.getvalue()

    status, body, log = run(tmp_path, fn)
    assert status == 200 and body["usage"]["prompt_tokens"] > 256
    assert "WARNING: No encoder URLs available for request" in log
    assert "processing without encoder disaggregation" in log


def test_a_listed_encoder_that_is_unreachable_fails_502(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        r = await c.post("/v1/chat/completions", json=IMAGE_CHAT)
        text = await (
            await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "no media here"}]}
            )
        ).text()
        return r.status, await r.json(), names["DEAD"], text

    status, body, dead, text_only = run(tmp_path, fn, encoders=["DEAD"])
    assert status == 502 and body["code"] == 502
    assert f"Encoder {dead} failed for request" in body["message"]
    assert '"content"' in text_only  # text requests never touch an encoder


def test_an_encoder_serving_another_model_fails_the_request(tmp_path):
    async def fn(c, lang, boot, names, flaky, enc):
        health = (await c.get("/health")).status
        r = await c.post("/v1/chat/completions", json=IMAGE_CHAT)
        return health, r.status, await r.json()

    health, status, body = run(tmp_path, fn, encoders=["ENC"], encoder_model="other/model")
    assert health == 200 and status == 500
    assert "model mismatch" in body["message"] and "other/model" in body["message"]


def test_probe_interval_env():
    assert probe_settings({}) == {"interval": 10.0, "timeout": 2.0, "evicted_ttl": 600.0}
    assert (
        probe_settings(
            {
                "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL": "4",
                "SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL": "30",
            }
        )["interval"]
        == 4.0
    )
    assert (
        probe_settings(
            {"SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL": "4", "MUSE_SIM_ENCODER_PROBE_INTERVAL": "0.2"}
        )["interval"]
        == 0.2
    )
