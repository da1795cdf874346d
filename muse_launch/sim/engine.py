"""The simulated engine server: binds what the real engine binds, wires itself to its peers
the way the real engine does, and answers the engine's HTTP API deterministically."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from typing import Any, Callable

import aiohttp
from aiohttp import web

from . import textgen as tg
from . import transfer as tr
from .config import SGLANG_VERSION, VLLM_VERSION, SimConfig

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class BindError(Exception):
    pass


# ------------------------------------------------------------------ local model directory

TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, t in enumerate(["<unk>", "<|begin_of_text|>", "<|end|>"])],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<|begin_of_text|>": 1, "<|end|>": 2, "rehearsal": 3,
                        "hello": 4}},
}


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def make_model_dir(root: str, cfg: SimConfig) -> str:
    """A tiny local model directory (config + a valid tokenizer) the workers report as
    their model_path/tokenizer_path, so a router never downloads anything."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", cfg.model).strip("-.") or "model"
    d = os.path.join(root, "sim-models", slug)
    os.makedirs(d, exist_ok=True)
    files = {
        "config.json": {"architectures": ["MuseSparkForConditionalGeneration"],
                        "model_type": "muse_spark", "max_position_embeddings":
                            cfg.context_length, "vocab_size": 5,
                        "_name_or_path": cfg.model, "muse_launch_sim": True},
        "tokenizer.json": TOKENIZER_JSON,
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": cfg.context_length,
                                  "unk_token": "<unk>", "bos_token": "<|begin_of_text|>",
                                  "eos_token": "<|end|>"},
        "generation_config.json": {"max_new_tokens": 128},
    }
    for name, obj in files.items():
        p = os.path.join(d, name)
        text = json.dumps(obj, indent=1)
        try:
            with open(p) as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        _write_atomic(p, text)
    return d


# ------------------------------------------------------------------ sockets

def bind_socket(host: str, port: int) -> socket.socket:
    host = host or "0.0.0.0"
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    family, stype, proto, _, addr = infos[0]
    s = socket.socket(family, stype, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(addr)
        s.listen(512)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def _hostport(host: str, port: Any) -> str:
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


# ------------------------------------------------------------------ the engine

class SimEngine:
    def __init__(self, cfg: SimConfig, *, ready_after: float = 2.0,
                 state_dir: str | None = None, kv_timeout: float = 3.0, itl: float = 0.002,
                 loopback: bool = False, out=None):
        self.cfg = cfg
        self.ready_after = ready_after
        self.kv_timeout = kv_timeout
        self.itl = itl
        self.loopback = loopback
        self.out = out or sys.stdout
        self.t0 = time.monotonic()
        self.started_wall = time.time()
        self.stopping = False
        self.ready_logged = False
        self.engine_id = (cfg.kv_transfer_config or {}).get("engine_id") or str(uuid.uuid4())
        self.slots = tr.SlotTable()
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task] = []
        self.runners: list[web.AppRunner] = []
        self.sockets: list[tuple[str, socket.socket]] = []
        self._tmp_state: str | None = None
        self.state_dir = state_dir  # None: a temp dir made at start, removed at stop
        self.model_dir: str | None = None
        # wiring state
        self.encoder_urls: list[str] = list(cfg.encoder_urls)
        self.encoders_pending: dict[str, str] = {u.rstrip("/"): uuid.uuid4().hex
                                                 for u in cfg.encoder_urls}
        self.encoder_handshakes: set[str] = set()
        self.register_pending: set[str] = {u.rstrip("/") for u in cfg.encoder_register_urls}
        self.language_workers: dict[str, dict] = {}
        self.dist_joined: set[int] = set()
        self.dist_pending = cfg.nnodes > 1 and cfg.dist_init is not None
        self._rr = 0
        self._last_problem: dict[tuple, str | None] = {}
        self.requests_served = 0
        self.requests_running = 0

    # ----------------------------------------------------------- logging / state
    def log(self, msg: str) -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        ms = int((time.time() % 1) * 1000)
        tag = f"{self.cfg.engine} {self.cfg.role}"
        if self.cfg.nnodes > 1:
            tag += f" node{self.cfg.node_rank}"
        try:
            self.out.write(f"{ts}.{ms:03d} [muse-sim {tag} :{self.cfg.port}] {msg}\n")
            self.out.flush()
        except (ValueError, OSError):
            pass

    def wiring_blockers(self) -> list[str]:
        b = []
        if self.encoders_pending:
            b.append("waiting for encoders " + ", ".join(sorted(self.encoders_pending)))
        if self.register_pending:
            b.append("not yet registered with " + ", ".join(sorted(self.register_pending)))
        if self.dist_pending:
            if self.cfg.node_rank == 0:
                b.append(f"waiting for {self.cfg.nnodes - 1 - len(self.dist_joined)} node(s) "
                         f"to join dist-init {self.cfg.dist_init_addr}")
            else:
                b.append(f"not yet joined dist-init {self.cfg.dist_init_addr}")
        return b

    def is_ready(self) -> bool:
        return (not self.stopping and time.monotonic() - self.t0 >= self.ready_after
                and not self.wiring_blockers())

    def kv_identity(self) -> dict[str, Any]:
        c = self.cfg
        ident = {"model": c.model, "kv_cache_dtype": c.kv_cache_dtype,
                 "page_size": c.page_size, "engine_id": self.engine_id, "tp_size": c.tp_size,
                 "engine": c.engine,
                 "url": f"http://{_hostport(c.advertised_host, c.port)}"}
        if c.engine == "sglang":
            ident["transfer_backend"] = c.transfer_backend
        else:
            ident["kv_connector"] = c.kv_connector
        return ident

    # ----------------------------------------------------------- binding
    def planned_binds(self) -> list[tuple[str, str, int, Callable[[], web.Application]]]:
        c = self.cfg
        binds = []
        if c.serves_http:
            binds.append(("HTTP", c.host, c.port, self.http_app))
        if c.binds_kv_bootstrap:
            binds.append(("disaggregation bootstrap", c.host, c.bootstrap_port,
                          lambda: tr.sglang_bootstrap_app(self)))
        if c.binds_encoder_bootstrap:
            binds.append(("encoder bootstrap", c.host, c.encoder_bootstrap_port,
                          self.encoder_bootstrap_app))
        if c.nixl_side_channel and (c.node_rank == 0 or c.dp_size_local):
            h, p = c.nixl_side_channel  # one listener per local DP rank: base + the DP rank
            for k, rank in enumerate(c.local_dp_ranks):
                purpose = "NIXL side channel" + (f" (DP rank {rank})" if c.dp_size > 1 else "")
                binds.append((purpose, h, p + k, lambda: tr.nixl_side_channel_app(self)))
        if c.mooncake_bootstrap and c.node_rank == 0:
            h, p = c.mooncake_bootstrap
            binds.append(("Mooncake bootstrap", h, p, lambda: tr.mooncake_bootstrap_app(self)))
        if c.dist_init and c.node_rank == 0:
            h, p = c.dist_init
            binds.append(("dist-init", h, p, self.dist_init_app))
        if self.loopback:
            binds = [(purpose, "127.0.0.1", port, f) for purpose, _, port, f in binds]
        return binds

    def bind_all(self) -> list[tuple[str, str, int, socket.socket, Callable]]:
        bound = []
        for purpose, host, port, factory in self.planned_binds():
            try:
                s = bind_socket(host, port)
            except OSError as e:
                for b in bound:
                    b[3].close()
                raise BindError(f"[Errno {e.errno}] error while attempting to bind on address "
                                f"({host!r}, {port}): {e.strerror.lower() if e.strerror else e}"
                                f" ({purpose} port {port})") from None
            bound.append((purpose, host, port, s, factory))
        return bound

    # ----------------------------------------------------------- lifecycle
    async def start(self) -> None:
        c = self.cfg
        self.log(f"start: engine={c.engine} role={c.role} model={c.model} "
                 f"served_model_name={c.served_model_name} tp={c.tp_size} ep={c.ep_size} "
                 f"ready_after={self.ready_after}s pid={os.getpid()}")
        if c.ignored:
            self.log(f"ignoring {len(c.ignored)} engine argument(s) the simulator does not model")
        if self.state_dir is None:
            self.state_dir = self._tmp_state = tempfile.mkdtemp(prefix="muse-sim-")
        self.model_dir = make_model_dir(self.state_dir, c)
        self._route_aiohttp_logs()
        bound = self.bind_all()
        for purpose, host, port, sock, factory in bound:
            runner = web.AppRunner(factory(), handle_signals=False, access_log=None,
                                   shutdown_timeout=0.2)
            await runner.setup()
            site = web.SockSite(runner, sock, shutdown_timeout=0.2)
            await site.start()
            self.runners.append(runner)
            self.log(f"listening: {purpose} on {_hostport(host, port)}")
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        if c.language_only:
            if c.encoder_urls:
                self.tasks.append(asyncio.create_task(self._register_with_encoders()))
            else:
                self.log("--language-only is set without --encoder-urls. Encoders are expected "
                         "to register dynamically via the EncoderBootstrapServer.")
        if c.encoder_register_urls:
            self.tasks.append(asyncio.create_task(self._register_encoder_urls()))
        if self.dist_pending and c.node_rank > 0:
            self.tasks.append(asyncio.create_task(self._join_dist_init()))
        self.tasks.append(asyncio.create_task(self._watch_ready()))

    def _route_aiohttp_logs(self) -> None:
        """aiohttp's own error logs become single lines in our log.  sglang-router probes
        every worker for gRPC (an HTTP/2 prior-knowledge preface) before using HTTP/1.1;
        that probe is logged in one line instead of a traceback."""
        engine = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                exc = record.exc_info[1] if record.exc_info else None
                text = str(exc or "")
                if any(m in text for m in ("PRI/Upgrade", "b'PRI'", "HTTP/2")):  # C / pure parser
                    engine.log("refused an HTTP/2 (gRPC) connection attempt; this server "
                               "speaks HTTP/1.1 (routers probe for gRPC first)")
                    return
                detail = f": {type(exc).__name__}: {text.splitlines()[0] if text else ''}" \
                    if exc else ""
                engine.log(f"aiohttp {record.levelname.lower()}: {record.getMessage()}{detail}")

        for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access"):
            lg = logging.getLogger(name)
            lg.handlers = [_Handler()]
            lg.propagate = False
            lg.setLevel(logging.WARNING)

    async def stop(self) -> None:
        self.stopping = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(r.cleanup() for r in self.runners), return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        if self._tmp_state:
            shutil.rmtree(self._tmp_state, ignore_errors=True)

    async def _watch_ready(self) -> None:
        last_blockers: list[str] = []
        while True:
            if self.is_ready():
                if not self.ready_logged:
                    self.ready_logged = True
                    self.log(f"ready: GET /health now returns 200 (start-to-ready "
                             f"{time.monotonic() - self.t0:.2f}s)")
                return
            b = self.wiring_blockers()
            if b and b != last_blockers and time.monotonic() - self.t0 >= self.ready_after:
                self.log("not ready: " + "; ".join(b))
                last_blockers = b
            await asyncio.sleep(0.05)

    # ----------------------------------------------------------- EPD wiring
    def _should_log(self, key: tuple, problem: str | None, attempt: int) -> bool:
        """Retry logs: every change of the problem, then every 10th attempt."""
        last = self._last_problem.get(key)
        self._last_problem[key] = problem
        return problem != last or attempt % 10 == 0

    async def _register_with_encoders(self) -> None:
        c = self.cfg
        attempts: dict[str, int] = {}
        while self.encoders_pending:
            for url, token in list(self.encoders_pending.items()):
                attempts[url] = attempts.get(url, 0) + 1
                n = attempts[url]
                body = {"language_host": c.advertised_host,
                        "encoder_bootstrap_port": c.encoder_bootstrap_port,
                        "http_port": c.port, "role": c.role, "token": token,
                        "model": c.model,
                        "encoder_transfer_backend": c.resolved_encoder_transfer_backend}
                problem = None
                try:
                    async with self.session.post(f"{url}/register_language_worker", json=body,
                                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                        text = await r.text()
                        if r.status == 200 and token in self.encoder_handshakes:
                            self.encoders_pending.pop(url, None)
                            self.log(f"encoder {url} reached; it connected back to the encoder "
                                     f"bootstrap port {c.encoder_bootstrap_port}")
                            continue
                        problem = f"answered {r.status}: {_err_text(text)}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    problem = f"unreachable ({type(e).__name__}: {e})"
                if self._should_log(("enc", url), problem, n):
                    self.log(f"encoder {url} {problem}; retrying (attempt {n})")
            if self.encoders_pending:
                await asyncio.sleep(_backoff(min(attempts.values())))
        self.log("all encoders registered: " + ", ".join(u.rstrip("/") for u in c.encoder_urls))

    async def _register_encoder_urls(self) -> None:
        """Encoder with --encoder-register-urls: announce itself to language workers."""
        c = self.cfg
        me = f"http://{_hostport(c.advertised_host, c.port)}"
        n = 0
        while self.register_pending:
            n += 1
            if time.monotonic() - self.t0 < self.ready_after:
                await asyncio.sleep(0.1)
                continue
            for url in list(self.register_pending):
                try:
                    async with self.session.post(f"{url}/register_encoder_url",
                                                 json={"encoder_url": me, "model": c.model},
                                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                        text = await r.text()
                        if r.status == 200:
                            self.register_pending.discard(url)
                            self.log(f"registered with language worker {url}")
                            continue
                        problem = f"answered {r.status}: {_err_text(text)}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    problem = f"unreachable ({type(e).__name__}: {e})"
                if self._should_log(("lang", url), problem, n):
                    self.log(f"language worker {url} {problem}; retrying (attempt {n})")
            if self.register_pending:
                await asyncio.sleep(_backoff(n))

    async def _join_dist_init(self) -> None:
        c = self.cfg
        host, port = c.dist_init
        url = f"http://{_hostport(host, port)}/join"
        n = 0
        while self.dist_pending:
            n += 1
            try:
                async with self.session.post(url, json={"node_rank": c.node_rank,
                                                        "nnodes": c.nnodes, "model": c.model},
                                             timeout=aiohttp.ClientTimeout(total=3)) as r:
                    text = await r.text()
                    if r.status == 200:
                        self.dist_pending = False
                        self.log(f"joined dist-init {c.dist_init_addr} as node {c.node_rank}")
                        return
                    problem = f"answered {r.status}: {_err_text(text)}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                problem = f"unreachable ({type(e).__name__}: {e})"
            if self._should_log(("dist",), problem, n):
                self.log(f"dist-init {c.dist_init_addr} {problem}; retrying (attempt {n})")
            await asyncio.sleep(_backoff(n))

    def dist_init_app(self) -> web.Application:
        app = web.Application()

        async def join(request: web.Request) -> web.Response:
            body = await _json(request)
            rank, nnodes = body.get("node_rank"), body.get("nnodes")
            if nnodes != self.cfg.nnodes or body.get("model") != self.cfg.model:
                return web.json_response({"error": f"node {rank} disagrees: nnodes={nnodes} "
                                          f"model={body.get('model')} (node 0 has nnodes="
                                          f"{self.cfg.nnodes} model={self.cfg.model})"},
                                         status=409)
            if not isinstance(rank, int) or not 0 < rank < self.cfg.nnodes:
                return web.json_response({"error": f"bad node_rank {rank}"}, status=409)
            self.dist_joined.add(rank)
            self.log(f"dist-init: node {rank} joined ({len(self.dist_joined)}/"
                     f"{self.cfg.nnodes - 1})")
            if len(self.dist_joined) >= self.cfg.nnodes - 1:
                self.dist_pending = False
            return web.json_response({"status": "ok"})

        app.router.add_post("/join", join)
        return app

    def encoder_bootstrap_app(self) -> web.Application:
        app = web.Application()

        async def handshake(request: web.Request) -> web.Response:
            token = request.query.get("token", "")
            self.encoder_handshakes.add(token)
            self.log(f"encoder bootstrap: encoder {request.query.get('encoder', '?')} "
                     f"connected back")
            return web.json_response({"status": "ok", "role": self.cfg.role})

        app.router.add_get("/encoder_handshake", handshake)
        self._add_encoder_registry_routes(app)
        return app

    def _add_encoder_registry_routes(self, app: web.Application) -> None:
        async def register(request: web.Request) -> web.Response:
            body = await _json(request)
            url = str(body.get("encoder_url") or body.get("url") or "").rstrip("/")
            if not url:
                return web.json_response({"error": "encoder_url missing"}, status=400)
            if body.get("model") and body["model"] != self.cfg.model:
                return web.json_response({"error": f"encoder serves {body['model']!r}, this "
                                          f"language worker {self.cfg.model!r}"}, status=409)
            if url not in self.encoder_urls:
                self.encoder_urls.append(url)
            self.log(f"encoder registered dynamically: {url}")
            return web.json_response({"status": "ok", "encoder_urls": self.encoder_urls})

        async def unregister(request: web.Request) -> web.Response:
            body = await _json(request)
            url = str(body.get("encoder_url") or body.get("url") or "").rstrip("/")
            if url in self.encoder_urls:
                self.encoder_urls.remove(url)
            return web.json_response({"status": "ok", "encoder_urls": self.encoder_urls})

        async def list_urls(request: web.Request) -> web.Response:
            return web.json_response({"encoder_urls": self.encoder_urls})

        app.router.add_post("/register_encoder_url", register)
        app.router.add_post("/unregister_encoder_url", unregister)
        app.router.add_get("/list_encoder_urls", list_urls)

    # ----------------------------------------------------------- HTTP app
    @web.middleware
    async def _request_log(self, request: web.Request, handler):
        t = time.monotonic()
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            if request.method != "GET":
                self.log(f"{request.method} {request.path} {e.status}")
            raise
        if request.method != "GET":
            self.log(f"{request.method} {request.path} {resp.status} "
                     f"({(time.monotonic() - t) * 1000:.0f} ms)")
        return resp

    def http_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024,
                              middlewares=[self._request_log])
        r = app.router
        c = self.cfg
        if c.engine == "sglang" and c.node_rank > 0:
            # SGLang node ranks > 0 serve only a dummy health endpoint
            for path in ("/health", "/health_generate"):
                r.add_get(path, self.h_health)
            return app
        for path in ("/health", "/health_generate", "/ping", "/ready"):
            r.add_get(path, self.h_health)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.h_server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.h_model_info)
        r.add_get("/v1/models", self.h_models)
        r.add_get("/version", self.h_version)
        r.add_get("/get_load", self.h_load)
        r.add_get("/metrics", self.h_metrics)
        r.add_post("/flush_cache", _flush_cache)
        r.add_post("/v1/chat/completions", self.h_chat)
        r.add_post("/v1/completions", self.h_completions)
        if c.engine == "sglang":
            r.add_post("/generate", self.h_generate)
        if c.encoder_only:
            r.add_post("/register_language_worker", self.h_register_language_worker)
            r.add_post("/encode", self.h_encode)
        if c.language_only:
            self._add_encoder_registry_routes(app)
        return app

    # ----------------------------------------------------------- info endpoints
    async def h_health(self, request: web.Request) -> web.Response:
        if self.is_ready():
            return web.Response(status=200, text="")
        return web.Response(status=503, text="")

    def server_info(self) -> dict[str, Any]:
        c = self.cfg
        if c.engine == "vllm":
            return {"vllm_config": {"model": self.model_dir, "served_model_name":
                                    c.served_model_names,
                                    "tensor_parallel_size": c.tp_size,
                                    "data_parallel_size": c.dp_size,
                                    "kv_transfer_config": c.kv_transfer_config,
                                    "max_model_len": c.context_length},
                    "model_path": self.model_dir, "tokenizer_path": self.model_dir,
                    "served_model_name": c.served_model_name, "version": VLLM_VERSION,
                    "sim": self._sim_info()}
        return {
            "model_path": self.model_dir, "tokenizer_path": self.model_dir,
            "served_model_name": c.served_model_name, "host": c.host, "port": c.port,
            "tp_size": c.tp_size, "ep_size": c.ep_size, "dp_size": c.dp_size,
            "pp_size": c.pp_size, "page_size": c.page_size, "kv_cache_dtype": c.kv_cache_dtype,
            "context_length": c.context_length, "is_embedding": c.is_embedding,
            "is_generation": not c.is_embedding,
            "skip_tokenizer_init": False, "reasoning_parser": c.reasoning_parser,
            "tool_call_parser": c.tool_call_parser,
            "disaggregation_mode": c.disaggregation_mode,
            "disaggregation_transfer_backend": c.transfer_backend,
            "disaggregation_bootstrap_port": c.bootstrap_port,
            "encoder_only": c.encoder_only, "language_only": c.language_only,
            "encoder_urls": self.encoder_urls,
            "encoder_bootstrap_port": c.encoder_bootstrap_port,
            "encoder_transfer_backend": c.encoder_transfer_backend,
            "nnodes": c.nnodes, "node_rank": c.node_rank, "dist_init_addr": c.dist_init_addr,
            "max_total_num_tokens": 1 << 20, "max_req_input_len": c.context_length - 1,
            "internal_states": [{"last_gen_throughput": 0.0, "load": self.requests_running}],
            "version": SGLANG_VERSION, "sim": self._sim_info(),
        }

    def _sim_info(self) -> dict[str, Any]:
        return {"simulated": True, "original_model_path": self.cfg.model,
                "role": self.cfg.role, "ready": self.is_ready(),
                "uptime_s": round(time.monotonic() - self.t0, 3),
                "wiring_blockers": self.wiring_blockers(), "engine_id": self.engine_id}

    async def h_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def h_model_info(self, request: web.Request) -> web.Response:
        c = self.cfg
        return web.json_response({
            "model_path": self.model_dir, "tokenizer_path": self.model_dir,
            "is_generation": not c.is_embedding, "preferred_sampling_params": None,
            "weight_version": "default", "has_image_understanding": True,
            "has_audio_understanding": True, "model_type": "muse_spark",
            "architectures": ["MuseSparkForConditionalGeneration"],
            "served_model_name": c.served_model_name})

    async def h_models(self, request: web.Request) -> web.Response:
        c = self.cfg
        owner = "vllm" if c.engine == "vllm" else "sglang"
        data = []
        for name in c.served_model_names:
            card = {"id": name, "object": "model", "created": int(self.started_wall),
                    "owned_by": owner, "root": name if c.engine == "sglang" else c.model,
                    "parent": None, "max_model_len": c.context_length}
            if c.engine == "vllm":
                card["permission"] = [{"id": f"modelperm-{uuid.uuid4().hex}",
                                       "object": "model_permission",
                                       "created": int(self.started_wall),
                                       "allow_create_engine": False, "allow_sampling": True,
                                       "allow_logprobs": True, "allow_search_indices": False,
                                       "allow_view": True, "allow_fine_tuning": False,
                                       "organization": "*", "group": None,
                                       "is_blocking": False}]
            data.append(card)
        return web.json_response({"object": "list", "data": data})

    async def h_version(self, request: web.Request) -> web.Response:
        v = VLLM_VERSION if self.cfg.engine == "vllm" else SGLANG_VERSION
        return web.json_response({"version": v})

    async def h_load(self, request: web.Request) -> web.Response:
        return web.json_response([{"dp_rank": 0, "num_reqs": self.requests_running,
                                   "num_waiting_reqs": 0, "num_tokens": 0}])

    async def h_metrics(self, request: web.Request) -> web.Response:
        c = self.cfg
        name = c.served_model_name
        if c.engine == "vllm":
            lines = [f'vllm:num_requests_running{{engine="0",model_name="{name}"}} '
                     f'{self.requests_running}',
                     f'vllm:num_requests_waiting{{engine="0",model_name="{name}"}} 0',
                     f'vllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} 0.0']
        else:
            lines = [f'sglang:num_running_reqs{{model_name="{name}"}} {self.requests_running}',
                     f'sglang:num_queue_reqs{{model_name="{name}"}} 0',
                     f'sglang:token_usage{{model_name="{name}"}} 0.0']
        lines.append(f"muse_sim_requests_total {self.requests_served}")
        return web.Response(text="\n".join(lines) + "\n",
                            content_type="text/plain")

    # ----------------------------------------------------------- encoder endpoints
    async def h_register_language_worker(self, request: web.Request) -> web.Response:
        body = await _json(request)
        host = body.get("language_host")
        port = body.get("encoder_bootstrap_port")
        who = f"{body.get('role', 'language worker')} {host}:{body.get('http_port')}"
        if not self.is_ready():
            return web.json_response({"error": "encoder is still starting"}, status=503)
        if body.get("model") != self.cfg.model:
            self.log(f"refused {who}: it serves {body.get('model')!r}, this encoder "
                     f"{self.cfg.model!r}")
            return web.json_response({"error": f"model mismatch: encoder serves "
                                      f"{self.cfg.model!r}, language worker "
                                      f"{body.get('model')!r}"}, status=409)
        mine = self.cfg.resolved_encoder_transfer_backend
        if body.get("encoder_transfer_backend") not in (None, mine):
            self.log(f"refused {who}: encoder transfer backend "
                     f"{body.get('encoder_transfer_backend')} != {mine}")
            return web.json_response({"error": f"encoder transfer backend mismatch: encoder "
                                      f"uses {mine}, language worker "
                                      f"{body.get('encoder_transfer_backend')}"}, status=409)
        url = (f"http://{_hostport(host, port)}/encoder_handshake?token={body.get('token', '')}"
               f"&encoder=http://{_hostport(self.cfg.advertised_host, self.cfg.port)}")
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"status {r.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            self.log(f"cannot connect back to {who} encoder bootstrap {host}:{port}: {e}")
            return web.json_response({"error": f"encoder cannot connect back to the language "
                                      f"worker's encoder bootstrap server at {host}:{port}: "
                                      f"{e}"}, status=502)
        self.language_workers[f"{host}:{port}"] = body
        self.log(f"registered {who} (connected back to its encoder bootstrap {host}:{port})")
        return web.json_response({"status": "ok", "encoder_transfer_backend": mine})

    async def h_encode(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return web.json_response({"error": "encoder is still starting"}, status=503)
        body = await _json(request)
        n = int(body.get("num_items", 1))
        self.requests_served += 1
        return web.json_response({"num_items": n,
                                  "embedding_tokens": n * tg.TOKENS_PER_MEDIA_ITEM,
                                  "encoder": f"{self.cfg.advertised_host}:{self.cfg.port}"})

    async def _encode_media(self, n_items: int, rid: str) -> int:
        """A language worker sends media items to an encoder (round robin)."""
        if not self.encoder_urls:
            raise GenError(500, "no encoder is registered with this language-only server; "
                           "cannot process multimodal input")
        url = self.encoder_urls[self._rr % len(self.encoder_urls)].rstrip("/")
        self._rr += 1
        try:
            async with self.session.post(f"{url}/encode", json={"num_items": n_items,
                                                                "rid": rid},
                                         timeout=aiohttp.ClientTimeout(total=10)) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise GenError(500, f"encoder {url} answered {r.status}: {body}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            raise GenError(500, f"encoder {url} failed to embed {n_items} media item(s): "
                           f"{e}") from None
        self.log(f"encoder {url} embedded {n_items} media item(s) for {rid}")
        return int(body.get("embedding_tokens", 0))

    # ----------------------------------------------------------- request plumbing
    def _error(self, status: int, message: str, param: str | None = None,
               err_type: str | None = None, native: bool = False) -> web.Response:
        err_type = err_type or {400: "BadRequestError", 404: "NotFoundError",
                                503: "ServiceUnavailableError"}.get(status,
                                                                    "InternalServerError")
        if native:
            body: dict[str, Any] = {"error": {"message": message, "type": err_type,
                                              "code": status}}
        elif self.cfg.engine == "vllm":
            body = {"error": {"message": message, "type": err_type, "param": param,
                              "code": status}}
        else:
            body = {"object": "error", "message": message, "type": err_type, "param": param,
                    "code": status}
        return web.json_response(body, status=status)

    def _precheck(self, native: bool = False) -> web.Response | None:
        c = self.cfg
        if c.encoder_only:
            return self._error(400, "This server runs with --encoder-only: it embeds media "
                               "for language workers and does not generate text",
                               native=native)
        if not self.is_ready():
            return self._error(503, "The server is not ready yet", native=native)
        return None

    async def _pd_stage(self, body: dict, prompt_tokens: int, rid: str,
                        token_ids: list[int]) -> dict[str, Any]:
        """Run this server's part of the disaggregated hand-off before answering.

        Returns extra response fields (vLLM kv_transfer_params) and the effective
        max_tokens override (prefill answers with one token)."""
        c = self.cfg
        extra: dict[str, Any] = {}
        if c.engine == "sglang" and c.disaggregation_mode in ("prefill", "decode"):
            room = body.get("bootstrap_room")
            host = body.get("bootstrap_host")
            port = body.get("bootstrap_port")
            if room is None or host is None:
                raise GenError(400, f"this server runs with --disaggregation-mode "
                               f"{c.disaggregation_mode}: requests need bootstrap_host, "
                               f"bootstrap_port and bootstrap_room (send them through the "
                               f"PD router)")
            if c.transfer_backend == "fake":
                self.log(f"kv: fake transfer backend, bootstrap_room {room} not transferred")
                return {"_max_tokens": 1} if c.disaggregation_mode == "prefill" else {}
            if c.disaggregation_mode == "prefill":
                key = str(room)
                try:
                    slot = self.slots.register(key, self.kv_identity() | {
                        "room": room, "prompt_tokens": prompt_tokens, "rid": rid})
                except tr.KVTransferError as e:
                    raise GenError(500, f"bootstrap_room {room}: {e}") from None
                self.log(f"bootstrap: bootstrap_room {room} registered ({prompt_tokens} "
                         f"prompt tokens), waiting for the decode")
                try:
                    await asyncio.wait_for(slot.fetched.wait(), self.kv_timeout)
                except asyncio.TimeoutError:
                    self.log(f"ERROR: bootstrap_room {room}: no decode fetched the KV cache "
                             f"within {self.kv_timeout:.1f}s; aborting the request")
                    raise GenError(500, f"KV transfer timed out for bootstrap_room {room}: "
                                   f"no decode connected to this prefill's bootstrap server "
                                   f"{c.advertised_host}:{c.bootstrap_port} within "
                                   f"{self.kv_timeout:.1f}s") from None
                finally:
                    self.slots.drop(key)
                return {"_max_tokens": 1}
            # decode
            if port is None:
                port = c.bootstrap_port
            try:
                info = await tr.sglang_fetch(self, str(host), int(port), room, prompt_tokens)
            except tr.KVTransferError as e:
                self.log(f"ERROR: {e}")
                raise GenError(500, str(e)) from None
            self.log(f"kv: bootstrap_room {room} fetched from {host}:{port} "
                     f"({info.get('prompt_tokens')} prompt tokens)")
            return extra
        if c.engine != "vllm":
            return extra
        kvp = body.get("kv_transfer_params")
        conn = c.kv_connector
        if isinstance(kvp, dict) and kvp and not conn:
            self.log("warning: request carries kv_transfer_params but no "
                     "--kv-transfer-config is set; they are ignored")
        if not conn:
            return {"kv_transfer_params": None}
        extra["kv_transfer_params"] = None
        kvp = kvp if isinstance(kvp, dict) else {}
        block = c.page_size or 16
        if conn in ("ExampleConnector", "SharedStorageConnector"):
            path = c.shared_storage_path
            if c.vllm_is_consumer:
                hit = tr.example_lookup(path, token_ids, block)
                if hit:
                    self.log(f"kv: External Cache Hit! {hit.get('stored_tokens')} tokens loaded "
                             f"from {path}")
                    probs = tr.compat_problems(self.kv_identity(), hit)
                    if probs:
                        raise GenError(500, "KV cache in shared storage is incompatible: "
                                       + "; ".join(probs))
                else:
                    self.log(f"kv: no external cache hit in {path} for a {len(token_ids)}-token"
                             f" prompt; computing the prefill locally")
            if c.vllm_is_producer and not (c.vllm_is_consumer and kvp.get("do_remote_prefill")):
                n = tr.example_store(path, token_ids, self.kv_identity() | {
                    "prompt_tokens": prompt_tokens}, block)
                self.log(f"kv: saved KV of {n} tokens to {path}")
            return extra
        if kvp.get("do_remote_decode") and c.vllm_is_producer:
            if conn in ("NixlConnector", "NixlPullConnector", "NixlPushConnector"):
                host, port = c.nixl_side_channel
                key = rid
                blocks = list(range(0, max(1, -(-prompt_tokens // block))))
                params = {"do_remote_prefill": True, "do_remote_decode": False,
                          "remote_block_ids": blocks, "remote_engine_id": self.engine_id,
                          "remote_request_id": key, "remote_host": host, "remote_port": port,
                          "tp_size": c.tp_size}
            elif conn == "MooncakeConnector":
                host, port = c.mooncake_bootstrap
                key = str(kvp.get("transfer_id") or rid)
                params = {"do_remote_prefill": True, "do_remote_decode": False,
                          "transfer_id": key, "remote_engine_id": self.engine_id,
                          "remote_bootstrap_addr":
                              f"http://{_hostport(c.advertised_host, port)}"}
            else:
                self.log(f"kv: {conn} hand-off is not modelled; no kv_transfer_params returned")
                return extra
            try:
                self.slots.register(key, self.kv_identity() | {
                    "prompt_tokens": prompt_tokens, "rid": rid})
            except tr.KVTransferError as e:
                raise GenError(500, str(e)) from None
            self.log(f"kv: prefill of {rid} done, KV held for the decode ({conn} "
                     f"{params.get('remote_host', '')}{params.get('remote_bootstrap_addr', '')}"
                     f"{':' + str(params['remote_port']) if 'remote_port' in params else ''})")
            extra["kv_transfer_params"] = params
            extra["_max_tokens"] = 1
            return extra
        if kvp.get("do_remote_prefill") and c.vllm_is_consumer:
            try:
                if conn in ("NixlConnector", "NixlPullConnector", "NixlPushConnector"):
                    info = await tr.nixl_fetch(self, kvp)
                elif conn == "MooncakeConnector":
                    info = await tr.mooncake_fetch(self, kvp)
                else:
                    self.log(f"kv: {conn} hand-off is not modelled; computing locally")
                    return extra
            except tr.KVTransferError as e:
                self.log(f"ERROR: {e}")
                raise GenError(500, str(e)) from None
            if info.get("prompt_tokens") not in (None, prompt_tokens):
                raise GenError(500, f"KV transfer mismatch: the prefill computed "
                               f"{info.get('prompt_tokens')} prompt tokens, this request has "
                               f"{prompt_tokens}")
            self.log(f"kv: loaded remote KV of {info.get('prompt_tokens')} prompt tokens "
                     f"({conn})")
        return extra

    def _check_vllm_model(self, body: dict) -> None:
        if self.cfg.engine != "vllm":
            return
        m = body.get("model")
        if m is not None and m not in self.cfg.served_model_names:
            raise GenError(404, f"The model `{m}` does not exist.", param="model",
                           err_type="NotFoundError")

    def _response_model(self, body: dict) -> str:
        m = body.get("model")
        return m if isinstance(m, str) and m else self.cfg.served_model_name

    async def _sse(self, request: web.Request, events, done: bool = True
                   ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        for ev in events:
            await resp.write(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode())
            if self.itl:
                await asyncio.sleep(self.itl)
        if done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # ----------------------------------------------------------- generation endpoints
    async def _admit(self, request: web.Request, native: bool = False) -> tuple[dict, web.Response | None]:
        """The request's JSON object, or the response refusing it (not ready, or not a JSON object)."""
        pre = self._precheck(native=native)
        if pre is not None:
            return {}, pre
        try:
            body = await request.json()
            if isinstance(body, dict):
                return body, None
        except ValueError:
            pass
        return {}, self._error(400, "request body must be a JSON object", native=native)

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self._admit(request)
        if pre is not None:
            return pre
        c = self.cfg
        rid = uuid.uuid4().hex
        self.requests_running += 1
        try:
            self._check_vllm_model(body)
            plan = tg.plan_chat(body, engine=c.engine, served_name=c.served_model_name,
                                reasoning_parser=c.reasoning_parser,
                                tool_call_parser=c.tool_call_parser,
                                enable_auto_tool_choice=c.enable_auto_tool_choice)
            ptoks = tg.chat_prompt_tokens(body["messages"], body.get("tools"))
            prompt_tokens = len(ptoks)
            media = tg.media_items(body["messages"])
            if media and c.language_only and c.disaggregation_mode != "decode":
                prompt_tokens += await self._encode_media(len(media), rid)
            elif media:
                prompt_tokens += len(media) * tg.TOKENS_PER_MEDIA_ITEM
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            self._check_length(prompt_tokens, max_tokens)
            extra = await self._pd_stage(body, prompt_tokens, rid,
                                         [tg.token_id(t) for t in ptoks])
            if "_max_tokens" in extra:
                max_tokens = extra.pop("_max_tokens")
            out = tg.realize(plan, max_tokens)
        except GenError as e:
            return self._error(e.status, e.message, e.param, e.err_type)
        except tg.RequestError as e:
            return self._error(e.status, e.message, e.param, e.err_type)
        finally:
            self.requests_running -= 1
        self.requests_served += 1
        model = self._response_model(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._sse(request, tg.chat_chunks(c.engine, model, out, prompt_tokens,
                                                           include_usage))
        return web.json_response(tg.chat_response(c.engine, model, out, prompt_tokens, extra))

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self._admit(request)
        if pre is not None:
            return pre
        c = self.cfg
        rid = uuid.uuid4().hex
        try:
            self._check_vllm_model(body)
            prompt = body.get("prompt")
            if prompt is None:
                raise GenError(400, "prompt is required", param="prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                ids = [int(x) for x in prompt]
            elif isinstance(prompt, list):
                ids = [tg.token_id(t) for p in prompt for t in tg.tokenize(str(p))]
            else:
                ids = tg.token_ids(str(prompt))
            prompt_tokens = len(ids)
            max_tokens = body.get("max_tokens", 16 if c.engine == "vllm" else None)
            self._check_length(prompt_tokens, max_tokens)
            extra = await self._pd_stage(body, prompt_tokens, rid, ids)
            if "_max_tokens" in extra:
                max_tokens = extra.pop("_max_tokens")
        except GenError as e:
            return self._error(e.status, e.message, e.param, e.err_type)
        ps, finish, n = tg.realize_text(tg.completion_text(prompt_tokens, c.served_model_name,
                                                           c.engine), max_tokens)
        self.requests_served += 1
        model = self._response_model(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._sse(request, tg.completion_chunks(c.engine, model, ps, finish,
                                                                 prompt_tokens, include_usage))
        return web.json_response(tg.completion_response(c.engine, model, "".join(ps), finish,
                                                        prompt_tokens, n, extra))

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self._admit(request, native=True)
        if pre is not None:
            return pre
        c = self.cfg
        started = time.time()
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is None and input_ids is None:
            return self._error(400, "Either text or input_ids should be provided.",
                               native=True)
        batch = isinstance(text, list) or (isinstance(input_ids, list) and input_ids
                                            and isinstance(input_ids[0], list))
        prompts = (text if isinstance(text, list) else [text]) if text is not None else (
            input_ids if batch else [input_ids])
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        max_new = sp.get("max_new_tokens", 128)
        if batch and body.get("stream"):
            return self._error(400, "streaming is not supported for batch requests in the "
                               "simulator", native=True)
        results = []
        for i, p in enumerate(prompts):
            ids = [int(x) for x in p] if isinstance(p, list) else tg.token_ids(str(p))
            rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
            if batch:
                rid = f"{rid}-{i}"
            try:
                self._check_length(len(ids), max_new)
                extra = await self._pd_stage(body, len(ids), rid, ids)
            except GenError as e:
                return self._error(e.status, e.message, e.param, e.err_type, native=True)
            mt = extra.get("_max_tokens", max_new)
            ps, finish, n = tg.realize_text(tg.completion_text(len(ids), c.served_model_name,
                                                               c.engine), mt)
            results.append((rid, ids, ps, finish, n))
        self.requests_served += 1
        if body.get("stream"):
            rid, ids, ps, finish, n = results[0]

            def events():
                acc: list[str] = []
                for j, p in enumerate(ps):
                    acc.append(p)
                    last = j == len(ps) - 1
                    meta = tg.generate_meta(rid, finish, len(ids), j + 1, started, max_new)
                    if not last:
                        meta["finish_reason"] = None
                    yield {"text": "".join(acc), "output_ids": [tg.token_id(x) for x in acc],
                           "meta_info": meta, "index": 0}
                if not ps:
                    yield {"text": "", "output_ids": [], "index": 0,
                           "meta_info": tg.generate_meta(rid, finish, len(ids), 0, started,
                                                         max_new)}
            return await self._sse(request, events())
        out = [{"text": "".join(ps), "output_ids": [tg.token_id(x) for x in ps],
                "meta_info": tg.generate_meta(rid, finish, len(ids), n, started, max_new)}
               for rid, ids, ps, finish, n in results]
        return web.json_response(out if batch else out[0])

    def _check_length(self, prompt_tokens: int, max_tokens: Any) -> None:
        if max_tokens is not None:
            try:
                mt = int(max_tokens)
            except (TypeError, ValueError):
                raise GenError(400, f"max_tokens must be an integer, got {max_tokens!r}",
                               param="max_tokens") from None
            if mt < 0:
                raise GenError(400, "max_tokens must be at least 0", param="max_tokens")
        else:
            mt = 0
        if prompt_tokens + mt > self.cfg.context_length:
            raise GenError(400, f"This model's maximum context length is "
                           f"{self.cfg.context_length} tokens. However, you requested "
                           f"{prompt_tokens + mt} tokens ({prompt_tokens} in the messages, "
                           f"{mt} in the completion).", param="max_tokens")


class GenError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 err_type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.err_type = err_type or {400: "BadRequestError", 404: "NotFoundError"}.get(
            status, "InternalServerError")


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.")


async def _json(request: web.Request) -> dict:
    try:
        body = await request.json()
        return body if isinstance(body, dict) else {}
    except ValueError:
        return {}


def _backoff(attempt: int) -> float:
    """Retry gaps for wiring: quick at first (peers usually come up together), then 1 s."""
    return min(0.1 * (2 ** max(attempt - 1, 0)), 1.0)


def _err_text(text: str) -> str:
    try:
        j = json.loads(text)
        if isinstance(j, dict):
            e = j.get("error", j.get("message", j))
            if isinstance(e, dict):
                e = e.get("message", e)
            return str(e)[:300]
    except ValueError:
        pass
    return text[:300]


# ------------------------------------------------------------------ process entry

async def serve(engine: SimEngine) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signame = {}

    def on_signal(sig: int) -> None:
        signame["sig"] = signal.Signals(sig).name
        engine.stopping = True
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await engine.start()
    except BindError as e:
        engine.log(f"ERROR: {e}")
        await engine.stop()
        return 1
    await stop.wait()
    t = time.monotonic()
    engine.log(f"received {signame.get('sig', 'stop')}: shutting down")
    await engine.stop()
    engine.log(f"shutdown complete in {time.monotonic() - t:.3f}s")
    return 0
