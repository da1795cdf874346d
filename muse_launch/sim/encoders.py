"""SGLang EPD wiring, as SGLang 0.5.23 does it (``disaggregation/encoder/receiver.py``).

A ``--language-only`` worker brings up its encoder bootstrap server (``--encoder-bootstrap-port``)
before it loads, contacts no encoder while it starts, and reports healthy without any.  Its
encoder list starts as ``--encoder-urls``; in the background it probes every listed (and every
evicted) encoder's ``/health`` each interval: 3 failures in a row evict an encoder, a healthy
probe re-adds it, and one evicted longer than the TTL is dropped for good.  The bootstrap server
answers ``GET /list_encoder_urls`` -> ``{"encoder_urls": [...]}`` (the live list), ``POST
/register_encoder_url`` and ``DELETE /unregister_encoder_url`` with ``{"url": URL}`` (plain
``OK``; 400 ``{"error": "Missing or empty 'url' field"}``), and ``GET /health`` -> ``OK``.

Per request, media items are split over the listed encoders; each encoder checks the model and
encoder transfer backend and delivers the embeddings back to the language worker's bootstrap
port (a sim-only ``POST /sim/embeddings``, where the real engine uses ZMQ).  No encoder listed:
the request is processed locally with a warning.  A listed encoder that cannot be reached fails
the request with 502; an encoder's own error status passes through.

An encoder with ``--encoder-register-urls`` POSTs ``/register_encoder_url`` to each of them once
loaded (30 tries), never waiting on it to report healthy, and unregisters when it stops.

Intervals: ``SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL`` (10 s; 0 disables),
``..._HEALTH_CHECK_TIMEOUT`` (2 s) and ``..._EVICTED_TTL`` (600 s; 0 never drops), read as the
real engine reads them; ``MUSE_SIM_ENCODER_PROBE_INTERVAL`` (sim only, for tests) wins over the
interval.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from ..engines import sglang as sgl
from . import textgen as tg
from .api import GenError
from .wiring import PEER_ERRORS, err_text, hostport, read_json

if TYPE_CHECKING:
    from .server import SimEngine

FAIL_THRESHOLD = sgl.ENCODER_FAIL_THRESHOLD
REGISTER_TRIES = 30  # an encoder's tries to register with each --encoder-register-urls entry
SIM_PROBE_INTERVAL_ENV = "MUSE_SIM_ENCODER_PROBE_INTERVAL"
PROBE_ENV = {
    "interval": sgl.ENCODER_HEALTH_CHECK_INTERVAL_ENV,
    "timeout": sgl.ENCODER_HEALTH_CHECK_TIMEOUT_ENV,
    "evicted_ttl": sgl.ENCODER_EVICTED_TTL_ENV,
}


def probe_settings(environ: Mapping[str, str] = os.environ) -> dict[str, float]:
    out = {key: float(environ.get(var) or default) for key, (var, default) in PROBE_ENV.items()}
    if environ.get(SIM_PROBE_INTERVAL_ENV):
        out["interval"] = float(environ[SIM_PROBE_INTERVAL_ENV])
    return out


class EncoderWiring:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.cfg = cfg = engine.cfg
        self.probe = probe_settings()
        # language worker: the live list, evicted URLs (-> when), failed probes in a row
        self.urls: list[str] = list(cfg.encoder_urls)
        self.evicted: dict[str, float] = {}
        self.fail_counts: dict[str, int] = {}
        self.deliveries: dict[str, dict] = {}  # embeddings encoders delivered, by token
        # encoder: the language workers it registered with
        self.registered_with: list[str] = []

    def background(self) -> list:
        """The coroutines this role runs from the start."""
        c, jobs = self.cfg, []
        if c.binds_encoder_bootstrap:
            e, p = self.engine, self.probe
            if not c.encoder_urls:
                e.log(
                    "--language-only is set without --encoder-urls. Encoders are expected "
                    "to register dynamically via the EncoderBootstrapServer."
                )
            e.log(
                f"EncoderBootstrapServer on port {c.encoder_bootstrap_port}: health_check "
                f"every {p['interval']:g}s, timeout {p['timeout']:g}s, evict after "
                f"{FAIL_THRESHOLD} failures, drop after {p['evicted_ttl']:g}s; encoders: "
                + (", ".join(self.urls) or "none yet")
            )
            if p["interval"] > 0:
                jobs.append(self._health_check_loop())
        if c.encoder_register_urls:
            jobs.append(self._register_encoder_urls())
        return jobs

    def state(self) -> dict:
        return {"encoder_urls": list(self.urls), "evicted": sorted(self.evicted)}

    # ------------------------------------------------------------ the bootstrap server
    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._h_ok)
        app.router.add_post("/register_encoder_url", self._h_register)
        app.router.add_delete("/unregister_encoder_url", self._h_unregister)
        app.router.add_get(sgl.ENCODER_LIST_PATH, self._h_list)
        app.router.add_post("/sim/embeddings", self._h_embeddings)
        return app

    async def _h_ok(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _h_register(self, request: web.Request) -> web.Response:
        url = (await read_json(request)).get("url")
        if not url or not isinstance(url, str):
            return web.json_response({"error": "Missing or empty 'url' field"}, status=400)
        self.fail_counts.pop(url, None)
        self.evicted.pop(url, None)
        if url not in self.urls:
            self.urls.append(url)
            self.engine.log(f"Registered encoder URL: {url}")
        return web.Response(text="OK")

    async def _h_unregister(self, request: web.Request) -> web.Response:
        url = (await read_json(request)).get("url")
        if not url or not isinstance(url, str):
            return web.json_response({"error": "Missing or empty 'url' field"}, status=400)
        removed = url in self.urls or url in self.evicted
        if url in self.urls:
            self.urls.remove(url)
        self.evicted.pop(url, None)
        self.fail_counts.pop(url, None)
        if removed:
            self.engine.log(f"Unregistered encoder URL: {url}")
        return web.Response(text="OK")

    async def _h_list(self, request: web.Request) -> web.Response:
        return web.json_response({"encoder_urls": list(self.urls)})

    async def _h_embeddings(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        self.deliveries[str(body.get("token"))] = body
        return web.json_response({"status": "ok", "role": self.cfg.role})

    # ------------------------------------------------------------ health checks
    async def _probe_one(self, url: str) -> str | None:
        """None when the encoder's /health is 200, else what went wrong."""
        try:
            async with self.engine.session.get(
                f"{url.rstrip('/')}/health", timeout=aiohttp.ClientTimeout(total=self.probe["timeout"])
            ) as r:
                return None if r.status == 200 else f"/health answered {r.status}"
        except PEER_ERRORS as exc:
            return f"unreachable ({type(exc).__name__}: {exc})"
        except Exception as exc:  # SGLang counts any probe error as a failure (a bad URL, ...)
            return f"{type(exc).__name__}: {exc}"

    async def _health_check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe["interval"])
            try:
                await self.check_once()
            except Exception as exc:  # as SGLang: log it, keep checking
                self.engine.log(f"Health check loop error: {type(exc).__name__}: {exc}")

    async def check_once(self) -> None:
        """One round of SGLang's health check over the listed and the evicted encoders."""
        e, now = self.engine, time.time()
        ttl = self.probe["evicted_ttl"]
        expired = [u for u, t in self.evicted.items() if ttl > 0 and now - t >= ttl]
        for url in expired:
            self.evicted.pop(url, None)
            self.fail_counts.pop(url, None)
        if expired:
            e.log(
                f"Health check permanently dropped {len(expired)} encoder(s) after "
                f"{ttl:g}s unhealthy: {expired}"
            )
        candidates = list(dict.fromkeys(self.urls + list(self.evicted)))
        if not candidates:
            return
        results = await asyncio.gather(*(self._probe_one(u) for u in candidates))
        evicted, revived = [], []
        for url, problem in zip(candidates, results, strict=True):
            if problem is None:
                self.fail_counts.pop(url, None)
                if url in self.evicted:
                    self.evicted.pop(url)
                    if url not in self.urls:
                        self.urls.append(url)
                    revived.append(url)
                continue
            if url in self.evicted:
                continue
            count = self.fail_counts[url] = self.fail_counts.get(url, 0) + 1
            e.log(f"encoder {url} health probe failed ({count}/{FAIL_THRESHOLD}): {problem}")
            if count >= FAIL_THRESHOLD:
                if url in self.urls:
                    self.urls.remove(url)
                self.evicted[url] = now
                self.fail_counts.pop(url, None)
                evicted.append(url)
        if revived:
            e.log(f"Health check revived {len(revived)} encoder(s): {revived}")
        if evicted:
            e.log(
                f"Health check evicted {len(evicted)} encoder(s) after {FAIL_THRESHOLD} "
                f"consecutive failures (will re-add when healthy): {evicted}"
            )

    # ------------------------------------------------------------ per request
    async def encode_media(self, n_items: int, rid: str) -> int:
        """Embed a request's media items on the listed encoders; the embedding tokens."""
        e, c = self.engine, self.cfg
        urls = list(self.urls)
        if not urls:
            e.log(
                f"WARNING: No encoder URLs available for request {rid}; processing without "
                f"encoder disaggregation."
            )
            return n_items * tg.TOKENS_PER_MEDIA_ITEM
        shares = [len(range(i, n_items, len(urls))) for i in range(len(urls))]
        parts = [(url, n) for url, n in zip(urls, shares, strict=True) if n]
        results = await asyncio.gather(
            *(self._encode_on(url, n, rid, i, len(parts)) for i, (url, n) in enumerate(parts))
        )
        e.log(
            f"encoders {', '.join(u for u, _ in parts)} embedded {n_items} media item(s) "
            f"for {rid} (delivered to encoder bootstrap port {c.encoder_bootstrap_port})"
        )
        return sum(results)

    async def _encode_on(self, url: str, n_items: int, rid: str, part: int, parts: int) -> int:
        c, e = self.cfg, self.engine
        token = uuid.uuid4().hex
        body = {
            "num_items": n_items,
            "req_id": rid,
            "part_idx": part,
            "num_parts": parts,
            "prefill_host": c.advertised_host,
            "embedding_port": c.encoder_bootstrap_port,
            "token": token,
            "model": c.model,
            "encoder_transfer_backend": c.resolved_encoder_transfer_backend,
        }
        try:
            async with e.session.post(
                f"{url.rstrip('/')}/encode", json=body, timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                text = await r.text()
                status = r.status
        except PEER_ERRORS as exc:
            e.log(f"ERROR: Encoder {url} failed for request {rid}: {exc}")
            raise GenError(
                502, f"Encoder {url} failed for request {rid}: {exc}", err_type="BadGateway"
            ) from None
        if status != 200:
            e.log(f"ERROR: Encoder {url} returned error {status}: {err_text(text)}")
            raise GenError(status, f"Encoder {url} returned error {status}: {err_text(text)}")
        delivered = self.deliveries.pop(token, None)
        if delivered is None:
            raise GenError(
                502,
                f"Encoder {url} answered but delivered no embeddings to this "
                f"worker's encoder bootstrap port {c.encoder_bootstrap_port}",
            )
        return int(delivered.get("embedding_tokens", 0))

    # ------------------------------------------------------------ encoder side
    def add_encoder_routes(self, app: web.Application) -> None:
        app.router.add_post("/encode", self._h_encode)

    async def _h_encode(self, request: web.Request) -> web.Response:
        c, e = self.cfg, self.engine
        if not e.is_ready():
            return web.json_response({"message": "encoder is still starting"}, status=503)
        body = await read_json(request)
        host, port = body.get("prefill_host"), body.get("embedding_port")
        if body.get("model") != c.model:
            e.log(f"refused {host}:{port}: it serves {body.get('model')!r}, this encoder {c.model!r}")
            return web.json_response(
                {
                    "message": f"model mismatch: encoder serves {c.model!r}, "
                    f"language worker {body.get('model')!r}"
                },
                status=500,
            )
        mine = c.resolved_encoder_transfer_backend
        if body.get("encoder_transfer_backend") not in (None, mine):
            return web.json_response(
                {
                    "message": f"encoder transfer backend mismatch: encoder "
                    f"uses {mine}, language worker "
                    f"{body.get('encoder_transfer_backend')}"
                },
                status=500,
            )
        n = int(body.get("num_items", 1))
        delivery = {
            "token": body.get("token"),
            "req_id": body.get("req_id"),
            "num_items": n,
            "embedding_tokens": n * tg.TOKENS_PER_MEDIA_ITEM,
            "encoder": f"http://{hostport(c.advertised_host, c.port)}",
        }
        try:
            async with e.session.post(
                f"http://{hostport(host, port)}/sim/embeddings",
                json=delivery,
                timeout=aiohttp.ClientTimeout(total=3),
            ) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"status {r.status}")
        except PEER_ERRORS as exc:
            e.log(f"cannot deliver embeddings to {host}:{port}: {exc}")
            return web.json_response(
                {
                    "message": f"encoder cannot reach the language worker's "
                    f"encoder bootstrap server at {host}:{port}: {exc}"
                },
                status=502,
            )
        e.requests_served += 1
        e.log(f"embedded {n} media item(s) for {body.get('req_id')}, delivered to {host}:{port}")
        return web.json_response(
            {
                "req_id": body.get("req_id"),
                "part_idx": body.get("part_idx"),
                "num_items": n,
                "embedding_size": delivery["embedding_tokens"],
            }
        )

    async def _register_encoder_urls(self) -> None:
        """--encoder-register-urls: once loaded, register with each language worker."""
        c, e = self.cfg, self.engine
        me = f"http://{hostport(c.advertised_host, c.port)}"
        while time.monotonic() - e.t0 < e.ready_after:
            await asyncio.sleep(0.05)
        pending = {u.rstrip("/"): 0 for u in c.encoder_register_urls}
        while pending:
            for url in list(pending):
                pending[url] += 1
                n = pending[url]
                try:
                    async with e.session.post(
                        f"{url}/register_encoder_url",
                        json={"url": me},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as r:
                        text = await r.text()
                        if r.status == 200:
                            del pending[url]
                            self.registered_with.append(url)
                            e.log(f"Registered encoder URL '{me}' with bootstrap at {url}")
                            continue
                        problem = f"answered {r.status}: {err_text(text)}"
                except PEER_ERRORS as exc:
                    problem = f"unreachable ({type(exc).__name__}: {exc})"
                if n >= REGISTER_TRIES:
                    del pending[url]
                    e.log(
                        f"Giving up on bootstrap {url} after {n} attempts ({problem}). Encoder "
                        f"discovery via this bootstrap will be incomplete."
                    )
                elif e.retries.should_log(("lang", url), problem, n):
                    e.log(f"bootstrap {url} {problem}; retrying (attempt {n})")
            if pending:  # quick at first, then SGLang's 5 s
                await asyncio.sleep(min(0.1 * 2 ** (min(pending.values()) - 1), 5.0))

    async def unregister(self) -> None:
        """On stop: an encoder leaves the lists it registered in (the real one does at exit)."""
        c, e = self.cfg, self.engine
        if not self.registered_with or e.session is None:
            return
        me = f"http://{hostport(c.advertised_host, c.port)}"

        async def one(url: str) -> None:
            try:
                async with e.session.delete(
                    f"{url}/unregister_encoder_url",
                    json={"url": me},
                    timeout=aiohttp.ClientTimeout(total=0.5),
                ) as r:
                    await r.read()
            except PEER_ERRORS:
                pass

        await asyncio.gather(*(one(u) for u in self.registered_with))
