"""SGLang EPD wiring: a ``--language-only`` worker and its encoders.

The language worker binds ``--encoder-bootstrap-port``, POSTs ``/register_language_worker``
to every ``--encoder-urls`` entry, and the encoder connects back to that port; /health stays
503 until every encoder was reached and connected back.  ``--encoder-register-urls`` on an
encoder registers it with language workers instead.  Media parts of chat requests go to an
encoder (round robin).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from . import textgen as tg
from .api import GenError
from .wiring import PEER_ERRORS, backoff, err_text, hostport, read_json

if TYPE_CHECKING:
    from .server import SimEngine


class EncoderWiring:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.cfg = cfg = engine.cfg
        self.urls: list[str] = list(cfg.encoder_urls)  # what /list_encoder_urls shows
        self.pending: dict[str, str] = {u.rstrip("/"): uuid.uuid4().hex for u in cfg.encoder_urls}
        self.handshakes: set[str] = set()
        self.register_pending: set[str] = {u.rstrip("/") for u in cfg.encoder_register_urls}
        self.language_workers: dict[str, dict] = {}
        self._rr = 0

    def blockers(self) -> list[str]:
        b = []
        if self.pending:
            b.append("waiting for encoders " + ", ".join(sorted(self.pending)))
        if self.register_pending:
            b.append("not yet registered with " + ", ".join(sorted(self.register_pending)))
        return b

    def background(self) -> list:
        """The coroutines this role runs from the start."""
        c, jobs = self.cfg, []
        if c.language_only:
            if c.encoder_urls:
                jobs.append(self._register_with_encoders())
            else:
                self.engine.log("--language-only is set without --encoder-urls. Encoders are "
                                "expected to register dynamically via the "
                                "EncoderBootstrapServer.")
        if c.encoder_register_urls:
            jobs.append(self._register_encoder_urls())
        return jobs

    # ------------------------------------------------------------ language worker side
    async def _register_with_encoders(self) -> None:
        c, e = self.cfg, self.engine
        attempts: dict[str, int] = {}
        while self.pending:
            for url, token in list(self.pending.items()):
                attempts[url] = attempts.get(url, 0) + 1
                n = attempts[url]
                body = {"language_host": c.advertised_host,
                        "encoder_bootstrap_port": c.encoder_bootstrap_port,
                        "http_port": c.port, "role": c.role, "token": token,
                        "model": c.model,
                        "encoder_transfer_backend": c.resolved_encoder_transfer_backend}
                problem = None
                try:
                    async with e.session.post(f"{url}/register_language_worker", json=body,
                                              timeout=aiohttp.ClientTimeout(total=5)) as r:
                        text = await r.text()
                        if r.status == 200 and token in self.handshakes:
                            self.pending.pop(url, None)
                            e.log(f"encoder {url} reached; it connected back to the encoder "
                                  f"bootstrap port {c.encoder_bootstrap_port}")
                            continue
                        problem = f"answered {r.status}: {err_text(text)}"
                except PEER_ERRORS as exc:
                    problem = f"unreachable ({type(exc).__name__}: {exc})"
                if e.retries.should_log(("enc", url), problem, n):
                    e.log(f"encoder {url} {problem}; retrying (attempt {n})")
            if self.pending:
                await asyncio.sleep(backoff(min(attempts.values())))
        e.log("all encoders registered: " + ", ".join(u.rstrip("/") for u in c.encoder_urls))

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/encoder_handshake", self._h_handshake)
        self.add_registry_routes(app)
        return app

    async def _h_handshake(self, request: web.Request) -> web.Response:
        self.handshakes.add(request.query.get("token", ""))
        self.engine.log(f"encoder bootstrap: encoder {request.query.get('encoder', '?')} "
                        f"connected back")
        return web.json_response({"status": "ok", "role": self.cfg.role})

    def add_registry_routes(self, app: web.Application) -> None:
        app.router.add_post("/register_encoder_url", self._h_register)
        app.router.add_post("/unregister_encoder_url", self._h_unregister)
        app.router.add_get("/list_encoder_urls", self._h_list)

    async def _h_register(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        url = str(body.get("encoder_url") or body.get("url") or "").rstrip("/")
        if not url:
            return web.json_response({"error": "encoder_url missing"}, status=400)
        if body.get("model") and body["model"] != self.cfg.model:
            return web.json_response({"error": f"encoder serves {body['model']!r}, this "
                                      f"language worker {self.cfg.model!r}"}, status=409)
        if url not in self.urls:
            self.urls.append(url)
        self.engine.log(f"encoder registered dynamically: {url}")
        return web.json_response({"status": "ok", "encoder_urls": self.urls})

    async def _h_unregister(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        url = str(body.get("encoder_url") or body.get("url") or "").rstrip("/")
        if url in self.urls:
            self.urls.remove(url)
        return web.json_response({"status": "ok", "encoder_urls": self.urls})

    async def _h_list(self, request: web.Request) -> web.Response:
        return web.json_response({"encoder_urls": self.urls})

    async def encode_media(self, n_items: int, rid: str) -> int:
        """Send a request's media items to an encoder (round robin); its embedding tokens."""
        e = self.engine
        if not self.urls:
            raise GenError(500, "no encoder is registered with this language-only server; "
                           "cannot process multimodal input")
        url = self.urls[self._rr % len(self.urls)].rstrip("/")
        self._rr += 1
        try:
            async with e.session.post(f"{url}/encode", json={"num_items": n_items, "rid": rid},
                                      timeout=aiohttp.ClientTimeout(total=10)) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise GenError(500, f"encoder {url} answered {r.status}: {body}")
        except (*PEER_ERRORS, ValueError) as exc:
            raise GenError(500, f"encoder {url} failed to embed {n_items} media item(s): "
                           f"{exc}") from None
        e.log(f"encoder {url} embedded {n_items} media item(s) for {rid}")
        return int(body.get("embedding_tokens", 0))

    # ------------------------------------------------------------ encoder side
    async def _register_encoder_urls(self) -> None:
        """Encoder with --encoder-register-urls: announce itself to language workers."""
        c, e = self.cfg, self.engine
        me = f"http://{hostport(c.advertised_host, c.port)}"
        n = 0
        while self.register_pending:
            n += 1
            if time.monotonic() - e.t0 < e.ready_after:
                await asyncio.sleep(0.1)
                continue
            for url in list(self.register_pending):
                try:
                    async with e.session.post(f"{url}/register_encoder_url",
                                              json={"encoder_url": me, "model": c.model},
                                              timeout=aiohttp.ClientTimeout(total=5)) as r:
                        text = await r.text()
                        if r.status == 200:
                            self.register_pending.discard(url)
                            e.log(f"registered with language worker {url}")
                            continue
                        problem = f"answered {r.status}: {err_text(text)}"
                except PEER_ERRORS as exc:
                    problem = f"unreachable ({type(exc).__name__}: {exc})"
                if e.retries.should_log(("lang", url), problem, n):
                    e.log(f"language worker {url} {problem}; retrying (attempt {n})")
            if self.register_pending:
                await asyncio.sleep(backoff(n))

    def add_encoder_routes(self, app: web.Application) -> None:
        app.router.add_post("/register_language_worker", self._h_register_language_worker)
        app.router.add_post("/encode", self._h_encode)

    async def _h_register_language_worker(self, request: web.Request) -> web.Response:
        c, e = self.cfg, self.engine
        body = await read_json(request)
        host = body.get("language_host")
        port = body.get("encoder_bootstrap_port")
        who = f"{body.get('role', 'language worker')} {host}:{body.get('http_port')}"
        if not e.is_ready():
            return web.json_response({"error": "encoder is still starting"}, status=503)
        if body.get("model") != c.model:
            e.log(f"refused {who}: it serves {body.get('model')!r}, this encoder {c.model!r}")
            return web.json_response({"error": f"model mismatch: encoder serves "
                                      f"{c.model!r}, language worker "
                                      f"{body.get('model')!r}"}, status=409)
        mine = c.resolved_encoder_transfer_backend
        if body.get("encoder_transfer_backend") not in (None, mine):
            e.log(f"refused {who}: encoder transfer backend "
                  f"{body.get('encoder_transfer_backend')} != {mine}")
            return web.json_response({"error": f"encoder transfer backend mismatch: encoder "
                                      f"uses {mine}, language worker "
                                      f"{body.get('encoder_transfer_backend')}"}, status=409)
        url = (f"http://{hostport(host, port)}/encoder_handshake?token={body.get('token', '')}"
               f"&encoder=http://{hostport(c.advertised_host, c.port)}")
        try:
            async with e.session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"status {r.status}")
        except PEER_ERRORS as exc:
            e.log(f"cannot connect back to {who} encoder bootstrap {host}:{port}: {exc}")
            return web.json_response({"error": f"encoder cannot connect back to the language "
                                      f"worker's encoder bootstrap server at {host}:{port}: "
                                      f"{exc}"}, status=502)
        self.language_workers[f"{host}:{port}"] = body
        e.log(f"registered {who} (connected back to its encoder bootstrap {host}:{port})")
        return web.json_response({"status": "ok", "encoder_transfer_backend": mine})

    async def _h_encode(self, request: web.Request) -> web.Response:
        e = self.engine
        if not e.is_ready():
            return web.json_response({"error": "encoder is still starting"}, status=503)
        body = await read_json(request)
        n = int(body.get("num_items", 1))
        e.requests_served += 1
        return web.json_response({"num_items": n,
                                  "embedding_tokens": n * tg.TOKENS_PER_MEDIA_ITEM,
                                  "encoder": f"{self.cfg.advertised_host}:{self.cfg.port}"})
