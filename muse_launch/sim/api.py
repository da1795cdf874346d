"""The engine's HTTP API: routes, health and info endpoints, and the error and admission
helpers the generation endpoints (:mod:`.generate`) share."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from . import metrics
from . import textgen as tg
from .config import SGLANG_VERSION, VLLM_VERSION

if TYPE_CHECKING:
    from .server import SimEngine

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class GenError(tg.RequestError):
    """A request the server answers with an error status (the hand-off, an encoder, a limit)."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None):
        super().__init__(
            message,
            status,
            param,
            err_type or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError"),
        )


class Api:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.cfg = engine.cfg

    # ----------------------------------------------------------- routes
    @web.middleware
    async def _request_log(self, request: web.Request, handler):
        t = time.monotonic()
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            if request.method != "GET":
                self.engine.log(f"{request.method} {request.path} {e.status}")
            raise
        if request.method != "GET":
            self.engine.log(
                f"{request.method} {request.path} {resp.status} ({(time.monotonic() - t) * 1000:.0f} ms)"
            )
        return resp

    def app(self) -> web.Application:
        from .generate import Generation

        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._request_log])
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
        if c.engine == "sglang":
            r.add_get("/v1/loads", self.h_loads)
        metrics.install(app, self.engine)  # GET /metrics, and the counters behind it
        r.add_post("/flush_cache", _flush_cache)
        gen = Generation(self)
        r.add_post("/v1/chat/completions", gen.h_chat)
        r.add_post("/v1/completions", gen.h_completions)
        if c.engine == "sglang":
            r.add_post("/generate", gen.h_generate)
        if c.encoder_only:
            self.engine.encoders.add_encoder_routes(app)
        return app

    # ----------------------------------------------------------- info endpoints
    async def h_health(self, request: web.Request) -> web.Response:
        c = self.cfg
        if not self.engine.is_ready():
            return web.Response(status=503, text="")
        if c.engine == "sglang" and c.node_rank == 0 and request.path in ("/health", "/health_generate"):
            await self.engine.batch.health_generation()  # SGLang's runs a one-token generation
        return web.Response(status=200, text="")

    def server_info(self) -> dict[str, Any]:
        c, e = self.cfg, self.engine
        if c.engine == "vllm":
            return {
                "vllm_config": {
                    "model": e.model_dir,
                    "served_model_name": c.served_model_names,
                    "tensor_parallel_size": c.tp_size,
                    "data_parallel_size": c.dp_size,
                    "kv_transfer_config": c.kv_transfer_config,
                    "max_model_len": c.context_length,
                },
                "model_path": e.model_dir,
                "tokenizer_path": e.model_dir,
                "served_model_name": c.served_model_name,
                "version": VLLM_VERSION,
                "sim": self._sim_info(),
            }
        return {
            "model_path": e.model_dir,
            "tokenizer_path": e.model_dir,
            "served_model_name": c.served_model_name,
            "host": c.host,
            "port": c.port,
            "tp_size": c.tp_size,
            "ep_size": c.ep_size,
            "dp_size": c.dp_size,
            "pp_size": c.pp_size,
            "page_size": c.page_size,
            "kv_cache_dtype": c.kv_cache_dtype,
            "context_length": c.context_length,
            "is_embedding": c.is_embedding,
            "is_generation": not c.is_embedding,
            "skip_tokenizer_init": False,
            "reasoning_parser": c.reasoning_parser,
            "tool_call_parser": c.tool_call_parser,
            "disaggregation_mode": c.disaggregation_mode,
            "disaggregation_transfer_backend": c.transfer_backend,
            "disaggregation_bootstrap_port": c.bootstrap_port,
            "encoder_only": c.encoder_only,
            "language_only": c.language_only,
            "encoder_urls": e.encoders.urls,
            "encoder_bootstrap_port": c.encoder_bootstrap_port,
            "encoder_transfer_backend": c.encoder_transfer_backend,
            "nnodes": c.nnodes,
            "node_rank": c.node_rank,
            "dist_init_addr": c.dist_init_addr,
            "max_total_num_tokens": 1 << 20,
            "max_req_input_len": c.context_length - 1,
            "internal_states": [{"last_gen_throughput": 0.0, "load": e.batch.counters.running}],
            "version": SGLANG_VERSION,
            "sim": self._sim_info(),
        }

    def _sim_info(self) -> dict[str, Any]:
        e = self.engine
        return {
            "simulated": True,
            "original_model_path": self.cfg.model,
            "role": self.cfg.role,
            "ready": e.is_ready(),
            "uptime_s": round(time.monotonic() - e.t0, 3),
            "wiring_blockers": e.wiring_blockers(),
            "engine_id": e.engine_id,
            **({"encoders": e.encoders.state()} if self.cfg.language_only else {}),
        }

    async def h_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def h_model_info(self, request: web.Request) -> web.Response:
        c = self.cfg
        return web.json_response(
            {
                "model_path": self.engine.model_dir,
                "tokenizer_path": self.engine.model_dir,
                "is_generation": not c.is_embedding,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": True,
                "has_audio_understanding": True,
                "model_type": "muse_spark",
                "architectures": ["MuseSparkForConditionalGeneration"],
                "served_model_name": c.served_model_name,
            }
        )

    async def h_models(self, request: web.Request) -> web.Response:
        c = self.cfg
        created = int(self.engine.started_wall)
        data = []
        for name in c.served_model_names:
            card = {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": c.engine,
                "root": name if c.engine == "sglang" else c.model,
                "parent": None,
                "max_model_len": c.context_length,
            }
            if c.engine == "vllm":
                card["permission"] = [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ]
            data.append(card)
        return web.json_response({"object": "list", "data": data})

    async def h_version(self, request: web.Request) -> web.Response:
        v = VLLM_VERSION if self.cfg.engine == "vllm" else SGLANG_VERSION
        return web.json_response({"version": v})

    async def h_loads(self, request: web.Request) -> web.Response:
        """SGLang 0.5.23's /v1/loads: the scheduler's own count, one entry per DP rank."""
        c = self.engine.batch.counters
        entry = {"dp_rank": 0, "num_running_reqs": c.running, "num_waiting_reqs": c.queued}
        return web.json_response({"loads": [entry]})

    async def h_load(self, request: web.Request) -> web.Response:
        c = self.engine.batch.counters
        return web.json_response(
            [{"dp_rank": 0, "num_reqs": c.running, "num_waiting_reqs": c.queued, "num_tokens": 0}]
        )

    # ----------------------------------------------------------- errors and admission
    def error(
        self,
        status: int,
        message: str,
        param: str | None = None,
        err_type: str | None = None,
        native: bool = False,
    ) -> web.Response:
        err_type = err_type or {
            400: "BadRequestError",
            404: "NotFoundError",
            503: "ServiceUnavailableError",
        }.get(status, "InternalServerError")
        if native:
            body: dict[str, Any] = {"error": {"message": message, "type": err_type, "code": status}}
        elif self.cfg.engine == "vllm":
            body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
        else:
            body = {"object": "error", "message": message, "type": err_type, "param": param, "code": status}
        return web.json_response(body, status=status)

    def error_of(self, e: tg.RequestError, native: bool = False) -> web.Response:
        return self.error(e.status, e.message, e.param, e.err_type, native=native)

    def _precheck(self, native: bool = False) -> web.Response | None:
        if self.cfg.encoder_only:
            return self.error(
                400,
                "This server runs with --encoder-only: it embeds media "
                "for language workers and does not generate text",
                native=native,
            )
        if not self.engine.is_ready():
            return self.error(503, "The server is not ready yet", native=native)
        return None

    async def admit(self, request: web.Request, native: bool = False) -> tuple[dict, web.Response | None]:
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
        return {}, self.error(400, "request body must be a JSON object", native=native)

    def check_vllm_model(self, body: dict) -> None:
        if self.cfg.engine != "vllm":
            return
        m = body.get("model")
        if m is not None and m not in self.cfg.served_model_names:
            raise GenError(404, f"The model `{m}` does not exist.", param="model", err_type="NotFoundError")

    def response_model(self, body: dict) -> str:
        m = body.get("model")
        return m if isinstance(m, str) and m else self.cfg.served_model_name

    def check_length(self, prompt_tokens: int, max_tokens: Any) -> None:
        if max_tokens is not None:
            try:
                mt = int(max_tokens)
            except (TypeError, ValueError):
                raise GenError(
                    400, f"max_tokens must be an integer, got {max_tokens!r}", param="max_tokens"
                ) from None
            if mt < 0:
                raise GenError(400, "max_tokens must be at least 0", param="max_tokens")
        else:
            mt = 0
        if prompt_tokens + mt > self.cfg.context_length:
            raise GenError(
                400,
                f"This model's maximum context length is "
                f"{self.cfg.context_length} tokens. However, you requested "
                f"{prompt_tokens + mt} tokens ({prompt_tokens} in the messages, "
                f"{mt} in the completion).",
                param="max_tokens",
            )

    async def sse(self, request: web.Request, events, tokens: int, done: bool = True) -> web.StreamResponse:
        """Stream `events`, one decode step before each token after the first; `tokens` (the answer's
        count) is what the engine's counters add by the end, whatever the events carry."""
        batch = self.engine.batch
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        counted = 0
        try:
            for ev in events:
                if _is_token(ev):
                    if counted:
                        await batch.step()
                    if counted < tokens:
                        batch.emitted()
                        counted += 1
                await resp.write(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode())
            batch.emitted(tokens - counted)
            counted = tokens
            if done:
                await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            batch.emitted(tokens - counted)  # a client gone mid-stream: what was generated for it
        return resp

    async def decode(self, tokens: int) -> None:
        """A whole answer's decode steps, for a response that is not streamed."""
        batch = self.engine.batch
        for i in range(tokens):
            if i:
                await batch.step()
            batch.emitted()


def _is_token(ev: dict) -> bool:
    """An event that carries generated output (its first makes the time to first token)."""
    if "output_ids" in ev:  # SGLang /generate
        return bool(ev.get("output_ids"))
    for choice in ev.get("choices") or ():
        delta = choice.get("delta")
        if delta is not None:
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                return True
        elif choice.get("text"):
            return True
    return False


async def _flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.")
