"""JSON from outside (state.json read back, a server's answer), bounded before it is parsed: Python's json
recurses once per bracket, so 100,000 of them raise RecursionError, and a huge body costs memory; both are
refused first, as `Damaged` (a ValueError) saying why in one line."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


class Damaged(ValueError):
    """Why the JSON cannot be trusted, in one line."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def load_bounded_json(data: bytes | str, limit: int, depth: int) -> Any:
    """JSON of at most `limit` bytes nested at most `depth` deep, checked before the parser runs."""
    if len(data) > limit:
        raise Damaged(f"larger than {_size(limit)}")
    if isinstance(data, bytes):
        try:
            data = data.decode()
        except UnicodeDecodeError as exc:
            raise Damaged(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    brackets = [1 if c in "[{" else -1 for c in _STRINGS.sub("", data) if c in "[]{}"]
    if brackets and max(accumulate(brackets)) > depth:
        raise Damaged(f"nested more than {depth} deep")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Damaged(f"{type(exc).__name__}: {exc}") from None


MAX_ANSWER_BYTES = 16 << 20
MAX_ANSWER_DEPTH = 64  # an OpenAI answer or a router's worker list nests about 6 deep


def load_answer(body: bytes | str) -> dict:
    """A server's JSON answer (a router's worker list, a chat completion), bounded before it is parsed: deep
    nesting or a huge body is a ValueError (a failed check), never a crash."""
    data = load_bounded_json(body, MAX_ANSWER_BYTES, MAX_ANSWER_DEPTH)
    if not isinstance(data, dict):
        raise Damaged(f"a JSON {type(data).__name__}, not an object")
    return data
