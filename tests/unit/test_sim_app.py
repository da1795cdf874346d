"""Response shapes of the rehearsal engine, in-process with aiohttp's test client."""

import asyncio
import json

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from sim_harness import WEATHER_MSG, sse_events

from muse_launch.sim import textgen as tg
from muse_launch.sim.config import parse_engine_args
from muse_launch.sim.modeldir import make_model_dir
from muse_launch.sim.server import SimEngine
from muse_launch.smoke import WEATHER_TOOL

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"


def run(engine_name, argv, tmp_path, fn, ready_after=0.0):
    """Serve one engine's HTTP app in-process and run `fn(client, engine)`."""
    cfg = parse_engine_args(engine_name, argv)

    async def main():
        eng = SimEngine(
            cfg, ready_after=ready_after, state_dir=str(tmp_path), itl=0, out=open("/dev/null", "w")
        )
        eng.model_dir = make_model_dir(str(tmp_path), cfg)
        eng.session = aiohttp.ClientSession()
        client = TestClient(TestServer(eng.http_app()))
        await client.start_server()
        try:
            return await fn(client, eng)
        finally:
            await client.close()
            await eng.session.close()

    return asyncio.run(main())


SGL = ["--model-path", M, "--reasoning-parser", "muse", "--tool-call-parser", "muse", "--tp-size", "4"]


def test_health_turns_ready_after_delay(tmp_path):
    async def fn(c, eng):
        first = (await c.get("/health")).status
        gen_first = (await c.get("/health_generate")).status
        chat = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG})
        later = first
        for _ in range(500):  # poll, no fixed sleep: ready 0.3 s after start, however loaded the host
            later = (await c.get("/health")).status
            if later == 200:
                break
            await asyncio.sleep(0.01)
        return first, gen_first, chat.status, later

    assert run("sglang", SGL, tmp_path, fn, ready_after=0.3) == (503, 503, 503, 200)


def test_info_endpoints_sglang(tmp_path):
    async def fn(c, eng):
        si = await (await c.get("/server_info")).json()
        gsi = await (await c.get("/get_server_info")).json()
        mi = await (await c.get("/model_info")).json()
        gmi = await (await c.get("/get_model_info")).json()
        models = await (await c.get("/v1/models")).json()
        return si, gsi, mi, gmi, models

    si, gsi, mi, gmi, models = run("sglang", SGL + ["--served-model-name", "muse"], tmp_path, fn)
    assert si == gsi or si.keys() == gsi.keys()
    assert si["model_path"] == si["tokenizer_path"] == mi["model_path"]
    assert (tmp_path / "sim-models").is_dir()
    assert (
        json.loads(
            (tmp_path / "sim-models" / si["model_path"].split("/")[-1] / "tokenizer.json").read_text()
        )["model"]["type"]
        == "WordLevel"
    )
    assert si["served_model_name"] == "muse" and si["tp_size"] == 4
    assert si["disaggregation_mode"] == "null" and si["sim"]["original_model_path"] == M
    assert mi["is_generation"] is True and gmi == mi
    assert models["object"] == "list" and models["data"][0]["id"] == "muse"
    assert models["data"][0]["owned_by"] == "sglang"


def test_chat_reasoning_and_usage(tmp_path):
    async def fn(c, eng):
        r = await c.post(
            "/v1/chat/completions",
            json={
                "model": M,
                "messages": [{"role": "user", "content": "What is SGLang?"}],
                "reasoning_effort": "low",
                "max_completion_tokens": 500,
            },
        )
        r2 = await c.post(
            "/v1/chat/completions",
            json={
                "model": M,
                "messages": [{"role": "user", "content": "What is SGLang?"}],
                "reasoning_effort": "xhigh",
            },
        )
        return r.status, await r.json(), await r2.json()

    status, low, xhigh = run("sglang", SGL, tmp_path, fn)
    assert status == 200
    assert low["object"] == "chat.completion" and low["model"] == M
    ch = low["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["index"] == 0
    msg = ch["message"]
    assert msg["role"] == "assistant" and msg["reasoning_content"]
    assert "What is SGLang?" in msg["content"] and msg["tool_calls"] is None
    u = low["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0
    # effort changes the amount of reasoning; answers are deterministic
    assert len(xhigh["choices"][0]["message"]["reasoning_content"]) > len(msg["reasoning_content"])
    assert xhigh["choices"][0]["message"]["content"] == msg["content"]


def test_reasoning_effort_rejected(tmp_path):
    async def fn(c, eng):
        r = await c.post(
            "/v1/chat/completions", json={"messages": WEATHER_MSG, "reasoning_effort": "minimal"}
        )
        return r.status, await r.json()

    status, body = run("sglang", SGL, tmp_path, fn)
    assert status == 400 and body["object"] == "error" and body["code"] == 400
    assert "minimal" in body["message"] and "xhigh" in body["message"]


def test_tool_calls_with_parser(tmp_path):
    async def fn(c, eng):
        r = await c.post(
            "/v1/chat/completions",
            json={"messages": WEATHER_MSG, "tools": [WEATHER_TOOL], "tool_choice": "auto"},
        )
        return await r.json()

    body = run("sglang", SGL, tmp_path, fn)
    ch = body["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    (tc,) = ch["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"location": "Beijing", "unit": "celsius"}
    assert ch["message"]["reasoning_content"]


def test_tools_without_parser_are_plain_content(tmp_path):
    async def fn(c, eng):
        r = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG, "tools": [WEATHER_TOOL]})
        return await r.json()

    body = run("sglang", ["--model-path", M], tmp_path, fn)
    ch = body["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["message"]["tool_calls"] is None
    assert "get_weather" in ch["message"]["content"]
    assert ch["message"]["reasoning_content"] is None  # no reasoning parser: inline
    assert "<think>" in ch["message"]["content"]


def test_tool_result_turn_answers(tmp_path):
    async def fn(c, eng):
        msgs = WEATHER_MSG + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
        ]
        r = await c.post("/v1/chat/completions", json={"messages": msgs, "tools": [WEATHER_TOOL]})
        return await r.json()

    body = run("sglang", SGL, tmp_path, fn)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "21 C, sunny" in body["choices"][0]["message"]["content"]


def test_chat_streaming_shape(tmp_path):
    async def fn(c, eng):
        r = await c.post(
            "/v1/chat/completions",
            json={
                "messages": WEATHER_MSG,
                "tools": [WEATHER_TOOL],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        return r.status, r.headers["Content-Type"], await r.text()

    status, ctype, text = run("sglang", SGL, tmp_path, fn)
    assert status == 200 and ctype.startswith("text/event-stream")
    ev = sse_events(text)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasoning = "".join(
        ch["choices"][0]["delta"].get("reasoning_content", "") for ch in chunks if ch["choices"]
    )
    assert "get_weather" in reasoning
    tcs = [
        ch["choices"][0]["delta"]["tool_calls"][0]
        for ch in chunks
        if ch["choices"] and "tool_calls" in ch["choices"][0]["delta"]
    ]
    assert tcs[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(t["function"].get("arguments", "") for t in tcs))["unit"] == "celsius"
    finals = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    assert finals[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_max_tokens_truncates(tmp_path):
    async def fn(c, eng):
        r = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG, "max_tokens": 3})
        return await r.json()

    body = run("sglang", SGL, tmp_path, fn)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def test_generate_native(tmp_path):
    async def fn(c, eng):
        r = await c.post(
            "/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 5}}
        )
        b = await c.post("/generate", json={"text": ["a", "b c"], "sampling_params": {"max_new_tokens": 2}})
        s = await c.post(
            "/generate",
            json={"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 4}},
        )
        return await r.json(), await b.json(), await s.text()

    one, batch, stream = run("sglang", SGL, tmp_path, fn)
    assert one["text"] and len(one["output_ids"]) == 5
    mi = one["meta_info"]
    assert mi["finish_reason"] == {"type": "length", "length": 5}
    assert mi["prompt_tokens"] == 5 and mi["completion_tokens"] == 5
    assert isinstance(batch, list) and len(batch) == 2
    ev = sse_events(stream)
    assert ev[-1] == "[DONE]" and len(ev) == 5
    assert ev[-2]["text"].startswith(ev[0]["text"])  # cumulative text
    last = ev[-2]["meta_info"]
    assert last["completion_tokens"] == 4 and last["prompt_tokens"] == 3


def test_completions(tmp_path):
    async def fn(c, eng):
        r = await c.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4})
        s = await c.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4, "stream": True})
        return await r.json(), await s.text()

    body, stream = run("sglang", SGL, tmp_path, fn)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {**body["usage"], "prompt_tokens": 2, "completion_tokens": 4}
    ev = sse_events(stream)
    assert ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] == "length"


def test_pd_roles_require_bootstrap_fields(tmp_path):
    async def fn(c, eng):
        r = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG})
        return r.status, await r.json()

    status, body = run("sglang", SGL + ["--disaggregation-mode", "decode"], tmp_path, fn)
    assert status == 400 and "bootstrap_room" in body["message"]


def test_encoder_only_refuses_generation(tmp_path):
    async def fn(c, eng):
        r = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG})
        g = await c.post("/generate", json={"text": "x"})
        return r.status, g.status, (await c.get("/health")).status

    assert run("sglang", ["--model-path", M, "--encoder-only"], tmp_path, fn) == (400, 400, 200)


VLLM = [
    M,
    "--reasoning-parser",
    "muse",
    "--tool-call-parser",
    "muse",
    "--enable-auto-tool-choice",
    "--served-model-name",
    "muse",
]


def test_vllm_shapes(tmp_path):
    async def fn(c, eng):
        models = await (await c.get("/v1/models")).json()
        ok = await c.post(
            "/v1/chat/completions", json={"model": "muse", "messages": WEATHER_MSG, "tools": [WEATHER_TOOL]}
        )
        wrong = await c.post("/v1/chat/completions", json={"model": "nope", "messages": WEATHER_MSG})
        gen = await c.post("/generate", json={"text": "x"})
        ver = await (await c.get("/version")).json()
        metrics = await (await c.get("/metrics")).text()
        return models, await ok.json(), wrong.status, await wrong.json(), gen.status, ver, metrics

    models, ok, wstatus, wbody, gstatus, ver, metrics = run("vllm", VLLM, tmp_path, fn)
    assert models["data"][0]["id"] == "muse" and models["data"][0]["root"] == M
    assert models["data"][0]["owned_by"] == "vllm"
    ch = ok["choices"][0]
    assert ok["id"].startswith("chatcmpl-") and ch["finish_reason"] == "tool_calls"
    assert ch["message"]["tool_calls"][0]["id"].startswith("chatcmpl-tool-")
    assert ch["message"]["reasoning"] == ch["message"]["reasoning_content"]
    assert "kv_transfer_params" in ok
    assert wstatus == 404 and "does not exist" in wbody["error"]["message"]
    assert gstatus == 404  # vLLM has no SGLang-native /generate
    assert ver["version"]
    assert 'vllm:num_requests_running{engine="0"' in metrics


def test_vllm_auto_tool_choice_needs_flag(tmp_path):
    async def fn(c, eng):
        auto = await c.post("/v1/chat/completions", json={"messages": WEATHER_MSG, "tools": [WEATHER_TOOL]})
        named = await c.post(
            "/v1/chat/completions",
            json={
                "messages": WEATHER_MSG,
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
        )
        return auto.status, await auto.json(), await named.json()

    status, body, named = run("vllm", [M], tmp_path, fn)
    assert status == 400 and "--enable-auto-tool-choice" in body["error"]["message"]
    assert named["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_textgen_deterministic_and_argument_filling():
    plan = tg.plan_chat(
        {"messages": WEATHER_MSG, "tools": [WEATHER_TOOL]},
        engine="sglang",
        served_name="m",
        reasoning_parser="muse",
        tool_call_parser="muse",
        enable_auto_tool_choice=False,
    )
    assert json.loads(plan.tool_args) == {"location": "Beijing", "unit": "celsius"}
    a = tg.realize(plan, None)
    b = tg.realize(plan, None)
    assert a.reasoning == b.reasoning and a.tool_call == b.tool_call
    tool = {
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "flag": {"type": "boolean"},
                    "xs": {"type": "array"},
                },
                "required": ["n", "flag", "xs"],
            },
        }
    }
    assert tg.tool_arguments(tool, "do it") == {"n": 1, "flag": True, "xs": []}
