"""A misbehaving OpenAI-compatible server, for the bench's validity gate.

    python tests/stand_ins/bad_openai.py --port P --mode ok|sse-error|status-500|zero-tokens|short|miscount
        [--every N] [any vLLM argument, ignored]

Streams chat completions like an engine does, except where --mode says otherwise (on every Nth
request with --every N, on all by default):

* ``sse-error``: an SSE ``error`` event mid-stream, then ``data: [DONE]`` as if all went well;
* ``status-500``: HTTP 500 with an OpenAI error body;
* ``zero-tokens``: a 200 stream with no content and ``completion_tokens: 0``;
* ``short``: a tenth of the requested tokens, usage saying so;
* ``miscount``: the requested tokens streamed, but /metrics counts twice as many as were sent.

It answers /v1/models (model ``bad-model``), /health and /metrics
(``vllm:generation_tokens_total``), and exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

from aiohttp import web

MODEL = "bad-model"
WORDS = ("the", "king", "and", "queen", "of", "love")


class Bad:
    def __init__(self, mode: str, every: int) -> None:
        self.mode, self.every = mode, max(every, 1)
        self.seen = 0
        self.generated = 0

    def misbehaves(self) -> bool:
        self.seen += 1
        return self.mode != "ok" and self.seen % self.every == 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        want = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        bad = self.misbehaves()
        if bad and self.mode == "status-500":
            return web.json_response(
                {
                    "error": {
                        "message": "simulated internal error",
                        "type": "InternalServerError",
                        "code": 500,
                    }
                },
                status=500,
            )
        n = (
            0
            if bad and self.mode == "zero-tokens"
            else max(want // 10, 1)
            if bad and self.mode == "short"
            else want
        )
        self.generated += n * (2 if bad and self.mode == "miscount" else 1)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        created = int(time.time())

        async def send(obj) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        def chunk(delta, finish=None):
            return {
                "id": "chatcmpl-bad",
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        await send(chunk({"role": "assistant", "content": ""}))
        for i in range(n):
            await send(chunk({"content": " " + WORDS[i % len(WORDS)]}))
            if bad and self.mode == "sse-error" and i == n // 2:
                await send(
                    {
                        "error": {
                            "message": "simulated failure mid-stream",
                            "type": "InternalServerError",
                            "code": 500,
                        }
                    }
                )
                break
            await asyncio.sleep(0.001)
        await send(chunk({}, "length" if n else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
            await send(
                {
                    "id": "chatcmpl-bad",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": MODEL,
                    "choices": [],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
                }
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "root": MODEL}]}
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} {float(self.generated)}\n'
        )


async def main(port: int, mode: str, every: int) -> None:
    bad = Bad(mode, every)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", bad.chat)
    app.router.add_get("/v1/models", bad.models)
    app.router.add_get("/metrics", bad.metrics)
    app.router.add_get("/health", lambda r: web.Response(text=""))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"bad_openai: mode {mode} every {every} on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--mode", default="ok", choices=("ok", "sse-error", "status-500", "zero-tokens", "short", "miscount")
    )
    p.add_argument("--every", type=int, default=1)
    a, _ = p.parse_known_args()  # started as a vLLM worker's launcher: its engine arguments are ignored
    asyncio.run(main(a.port, a.mode, a.every))
