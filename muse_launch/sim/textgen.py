"""Deterministic "model output": the text, reasoning and tool calls a request gets.

No model runs: the answer is derived from the prompt, so the same request always gets the
same text.  A "token" is one whitespace-delimited piece of output (and, for prompts, one
word or punctuation mark), which keeps usage counts, ``max_tokens`` truncation and
streaming chunk counts consistent with each other.  The response shapes are in
:mod:`.responses`.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

REASONING_EFFORTS = ("low", "medium", "high", "xhigh")
DEFAULT_REASONING_EFFORT = "xhigh"

_WORD = re.compile(r"<unk>|<\|[a-z_]+\|>|\w+|[^\w\s]")  # as the model directory's tokenizer splits
_PIECE = re.compile(r"\s*\S+\s*")


class RequestError(Exception):
    """A client error the real server reports with 4xx."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, err_type: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or {400: "BadRequestError", 404: "NotFoundError"}.get(
            status, "BadRequestError"
        )


# --------------------------------------------------------------------------- tokens


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text or "")


def token_id(tok: str) -> int:
    return 100 + zlib.crc32(tok.encode()) % 150000


def token_ids(text: str) -> list[int]:
    return [token_id(t) for t in tokenize(text)]


def pieces(text: str) -> list[str]:
    """Output pieces (one per simulated token), whitespace kept so ''.join() == text."""
    return _PIECE.findall(text or "")


def content_text(content: Any) -> str:
    """The text of an OpenAI message content (string or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text", "")))
            elif isinstance(part, str):
                out.append(part)
        return " ".join(out)
    return str(content)


MEDIA_PART_TYPES = (
    "image_url",
    "image",
    "input_image",
    "video_url",
    "video",
    "audio_url",
    "input_audio",
    "audio",
)
TOKENS_PER_MEDIA_ITEM = 256


def media_items(messages: list[dict]) -> list[str]:
    """Media parts (image/video/audio) in chat messages: what an encoder must process."""
    items = []
    for m in messages or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list):
            for part in c:
                if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                    items.append(part["type"])
    return items


def chat_prompt_tokens(messages: list[dict], tools: list[dict] | None) -> list[str]:
    """Tokens of the rendered chat template (approximation: 4 framing tokens per message)."""
    toks: list[str] = []
    for m in messages or []:
        toks += ["<|start|>", str(m.get("role", "user")), "<|message|>"]
        toks += tokenize(content_text(m.get("content")))
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            toks += tokenize(str(fn.get("name", ""))) + tokenize(str(fn.get("arguments", "")))
        toks.append("<|end|>")
    if tools:
        toks += tokenize(json.dumps(tools, sort_keys=True))
    toks += ["<|start|>", "assistant"]
    return toks


# --------------------------------------------------------------------------- the answer


def _last_user_text(messages: list[dict]) -> str:
    for m in reversed(messages or []):
        if m.get("role") == "user":
            return content_text(m.get("content")).strip()
    return ""


def _short(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def _string_for(prop: str, schema: dict, user_text: str) -> Any:
    enum = schema.get("enum")
    if enum:
        low = user_text.lower()
        for v in enum:
            if isinstance(v, str) and v.lower() in low:
                return v
        return enum[0]
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t in ("integer",):
        return 1
    if t in ("number",):
        return 1.0
    if t == "boolean":
        return True
    if t == "array":
        return []
    if t == "object":
        return {}
    # a string: the first capitalised word after the first word of the request (a place,
    # a name), else a placeholder derived from the property name
    words = re.findall(r"[A-Za-z][\w-]*", user_text)
    for w in words[1:]:
        if w[0].isupper():
            return w
    return f"example-{prop}"


def tool_arguments(tool: dict, user_text: str) -> dict[str, Any]:
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or []
    return {name: _string_for(name, props.get(name) or {}, user_text) for name in required}


@dataclass
class Reply:
    """What the simulated model 'generates' for a request, before max_tokens truncation."""

    reasoning: str = ""
    content: str = ""
    tool_name: str | None = None
    tool_args: str | None = None  # JSON text
    raw_tool_text: bool = False  # no tool-call parser: the call stays in content
    inline_reasoning: bool = False  # no reasoning parser: reasoning stays in content


@dataclass
class Output:
    """The generated output after applying the token budget."""

    reasoning: str
    content: str
    tool_call: dict | None
    finish_reason: str
    completion_tokens: int
    reasoning_tokens: int
    content_pieces: list[str] = field(default_factory=list)
    reasoning_pieces: list[str] = field(default_factory=list)


def pick_tool(tools: list[dict], tool_choice: Any) -> dict | None:
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        for t in tools:
            if (t.get("function") or t).get("name") == name:
                return t
        raise RequestError(f"Tool '{name}' named in tool_choice is not in tools", param="tool_choice")
    return tools[0]


def plan_chat(
    body: dict,
    *,
    engine: str,
    served_name: str,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
    enable_auto_tool_choice: bool,
) -> Reply:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("messages must be a non-empty list of message objects", param="messages")
    effort = body.get("reasoning_effort")
    if effort is None:
        effort = (body.get("chat_template_kwargs") or {}).get("reasoning_effort")
    if effort is None:
        effort = DEFAULT_REASONING_EFFORT
    if effort not in REASONING_EFFORTS:
        raise RequestError(
            f"Unsupported reasoning_effort {effort!r}: Muse Spark Open supports "
            f"{', '.join(REASONING_EFFORTS)} (see the model card)",
            param="reasoning_effort",
        )

    tools = body.get("tools") or []
    tool_choice = body.get("tool_choice", "auto" if tools else "none")
    if (
        tools
        and engine == "vllm"
        and tool_choice == "auto"
        and not (enable_auto_tool_choice and tool_call_parser)
    ):
        raise RequestError(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            param="tool_choice",
        )
    if tool_choice == "required" and not tools:
        raise RequestError("tool_choice 'required' needs at least one tool", param="tool_choice")

    user_text = _last_user_text(messages)
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    plan = Reply()
    n_sent = {"low": 1, "medium": 2, "high": 3, "xhigh": 4}[effort]
    tool = None if last.get("role") == "tool" else pick_tool(tools, tool_choice)
    if tool is not None:
        fn = tool.get("function", tool)
        args = tool_arguments(tool, user_text)
        args_text = json.dumps(args, ensure_ascii=False)
        sentences = [
            f"The user wants {fn.get('name')} called.",
            f"Arguments from the request: {args_text}.",
            f"Reasoning effort is {effort}.",
            "I will emit the tool call now.",
        ]
        plan.reasoning = " ".join(sentences[:n_sent])
        plan.tool_name = fn.get("name")
        plan.tool_args = args_text
        # vLLM forces a named/required tool call through structured output, parser or not
        forced = engine == "vllm" and tool_choice != "auto"
        plan.raw_tool_text = not (tool_call_parser or forced)
    else:
        if last.get("role") == "tool":
            answer = (
                f"The tool returned: {_short(content_text(last.get('content')), 120)}. "
                f"That completes the request (rehearsal answer from {served_name})."
            )
        else:
            answer = (
                f'Rehearsal answer from {served_name}: you asked "{_short(user_text)}". '
                f"This reply comes from the muse-launch simulated {engine} engine; "
                f"no GPU was used."
            )
        sentences = [
            f'The user asks: "{_short(user_text, 60)}".',
            "This is a rehearsal, so no weights are loaded.",
            f"Reasoning effort is {effort}.",
            "I will answer briefly and deterministically.",
        ]
        plan.reasoning = " ".join(sentences[:n_sent])
        plan.content = answer
    sep = body.get("separate_reasoning", True)
    plan.inline_reasoning = not (reasoning_parser and sep is not False)
    return plan


def realize(plan: Reply, max_tokens: int | None) -> Output:
    """Spend the token budget: reasoning first, then content, then the tool call."""
    budget = float("inf") if max_tokens is None else max(int(max_tokens), 0)
    r_pieces = pieces(plan.reasoning)
    if plan.inline_reasoning and plan.reasoning:
        r_pieces = pieces("<think>" + plan.reasoning + "</think> ")
    c_text = plan.content
    tool_text = None
    if plan.tool_name is not None:
        tool_text = json.dumps(
            {"name": plan.tool_name, "arguments": json.loads(plan.tool_args or "{}")}, ensure_ascii=False
        )
        if plan.raw_tool_text:
            c_text = (c_text + " " if c_text else "") + f"<tool_call>{tool_text}</tool_call>"
    c_pieces = pieces(c_text)
    used = 0
    out_r: list[str] = []
    out_c: list[str] = []
    truncated = False
    for p in r_pieces:
        if used >= budget:
            truncated = True
            break
        out_r.append(p)
        used += 1
    if not truncated:
        for p in c_pieces:
            if used >= budget:
                truncated = True
                break
            out_c.append(p)
            used += 1
    tool_call = None
    if not truncated and plan.tool_name is not None and not plan.raw_tool_text:
        cost = len(tokenize(tool_text or "")) + 2
        if used + cost > budget:
            truncated = True
            used = budget
        else:
            used += cost
            tool_call = {"name": plan.tool_name, "arguments": plan.tool_args}
    if plan.inline_reasoning:
        # no parser: everything the model said is content
        out_c = out_r + out_c
        out_r = []
    finish = "length" if truncated else ("tool_calls" if tool_call else "stop")
    return Output(
        reasoning="".join(out_r).strip(),
        content="".join(out_c).strip(),
        tool_call=tool_call,
        finish_reason=finish,
        completion_tokens=int(used),
        reasoning_tokens=len(out_r),
        content_pieces=out_c,
        reasoning_pieces=out_r,
    )


def completion_text(prompt_tokens: int, served_name: str, engine: str) -> str:
    return (
        f" and so the rehearsal continues: {prompt_tokens} prompt tokens were read by "
        f"the simulated {engine} engine serving {served_name}, which writes this fixed "
        f"continuation instead of running a model."
    )


def realize_text(text: str, max_tokens: int | None) -> tuple[list[str], str, int]:
    ps = pieces(text)
    if max_tokens is not None and len(ps) > max(int(max_tokens), 0):
        ps = ps[: max(int(max_tokens), 0)]
        return ps, "length", len(ps)
    return ps, "stop", len(ps)


# --------------------------------------------------------------------------- answer length


def length_target(max_tokens: Any, min_tokens: Any, ignore_eos: Any) -> int:
    """How many tokens the answer must have at least: `max_tokens` with ignore_eos, else min_tokens
    (at most max_tokens); 0 when neither is asked for. The answer ends at its own end past that."""

    def count(value: Any, name: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
            raise RequestError(f"{name} must be a non-negative integer, got {value!r}", param=name)
        return int(value)

    most, least = count(max_tokens, "max_tokens"), count(min_tokens, "min_tokens")
    if not isinstance(ignore_eos, (bool, type(None))):
        raise RequestError(f"ignore_eos must be a boolean, got {ignore_eos!r}", param="ignore_eos")
    if least is not None and most is not None and least > most:
        raise RequestError(
            f"min_tokens ({least}) must be less than or equal to max_tokens ({most})", param="min_tokens"
        )
    if ignore_eos and most is not None:
        return most
    return least or 0


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


def lengthen(out: Output, target: int, max_tokens: Any, seed_text: str) -> Output:
    """`out` continued with the vocabulary's words up to `target` tokens, where it stopped short on its own
    (a model that ignores its end-of-sequence token keeps writing)."""
    from .vocab import filler

    if out.finish_reason != "stop" or out.completion_tokens >= target:
        return out
    more = filler(_seed(seed_text), target - out.completion_tokens)
    pieces_ = [*out.content_pieces[:-1], out.content_pieces[-1].rstrip()] if out.content_pieces else []
    pieces_ += more
    finish = "length" if max_tokens is not None and target >= int(max_tokens) else "stop"
    return Output(
        reasoning=out.reasoning,
        content="".join(pieces_).strip(),
        tool_call=None,
        finish_reason=finish,
        completion_tokens=out.completion_tokens + len(more),
        reasoning_tokens=out.reasoning_tokens,
        content_pieces=pieces_,
        reasoning_pieces=out.reasoning_pieces,
    )


def lengthen_text(
    ps: list[str], finish: str, target: int, max_tokens: Any, seed_text: str
) -> tuple[list[str], str, int]:
    """realize_text's pieces continued up to `target` tokens."""
    from .vocab import filler

    if finish != "stop" or len(ps) >= target:
        return ps, finish, len(ps)
    ps = [*ps, *filler(_seed(seed_text), target - len(ps))]
    finish = "length" if max_tokens is not None and target >= int(max_tokens) else "stop"
    return ps, finish, len(ps)
