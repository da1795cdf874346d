"""YAML 1.1 reads `on`, `NO`, `0755`, `0x10`, `1.10`, `12:30` and `2024-01-01` as booleans, numbers and
dates. Where the file wants text (env values, args, a model name), the loader puts back the text as
written; where it wants a number, a boolean or a number in another base is refused: never a silent
conversion, and a boolean is never a number.

The loader records each plain scalar that did not resolve to a string by its path (`texts`); the
schema says, for each path, what kinds of scalar it takes.
"""

from __future__ import annotations

import datetime
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from .model import Topology

Path_ = tuple[str | int, ...]
# A number as a reader expects it (no leading 0: YAML 1.1 reads 0755 as octal 493).
_DECIMAL = re.compile(
    r"[-+]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?"
    r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
)
_NUMBER = ("int", "float")


def keep_text(data: Any, texts: Mapping[Path_, str], where: typing.Callable[[Path_], str]) -> list[str]:
    """Put the text as written back where the schema wants a string; the problems where it wants a
    number or a boolean and YAML 1.1 read something else. `where(path)` is `FILE:LINE: PATH`."""
    problems: list[str] = []
    for at, text in texts.items():
        parent, key = _parent(data, at)
        if parent is None:
            continue  # --set replaced it
        value = parent[key]
        if isinstance(value, str):
            continue
        kinds = wanted_kinds(at)
        if not kinds or "any" in kinds:
            continue  # unknown key (the schema says so) or free-form (kv_transfer_config)
        problem = _problem(value, text, kinds)
        if problem == "text":
            parent[key] = text
        elif problem:
            problems.append(f"{where(at)}: {problem}")
    return problems


def _problem(value: Any, text: str, kinds: set[str]) -> str | None:
    """ "text" to keep the text, a message to refuse, None to leave the value."""
    if value is None:
        if "none" in kinds:
            return None
        what = f"{text!r} is null in YAML" if text else "the value is empty (null in YAML)"
        return f'{what}, where text is wanted\n  fix: quote it, or write "" for an empty string'
    if isinstance(value, bool):
        if "bool" in kinds:
            return None
        if "str" in kinds:
            return "text"
        return (
            f"{text!r} is a boolean (YAML 1.1 reads yes/no/on/off/true/false so), not a number\n"
            f"  fix: write a number"
        )
    if isinstance(value, (int, float)):
        if "str" in kinds and not any(k in kinds for k in _NUMBER):
            return "text"
        if any(k in kinds for k in _NUMBER):
            if _DECIMAL.fullmatch(text):
                return None
            return (
                f"YAML 1.1 reads {text!r} as {value!r} (octal, hexadecimal, base 60 or with '_')\n"
                f"  fix: write {value!r} in decimal if you mean it, or quote it"
            )
        return f"{text!r} is a number, not true or false\n  fix: write true or false"
    if isinstance(value, (datetime.date, datetime.datetime)):
        if "str" in kinds:
            return "text"
        return f"YAML reads {text!r} as a date\n  fix: quote it"
    return None


def _parent(data: Any, at: Path_) -> tuple[Any, Any]:
    node = data
    for part in at[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None, None
    last = at[-1] if at else None
    if (
        isinstance(node, dict)
        and last in node
        or isinstance(node, list)
        and isinstance(last, int)
        and last < len(node)
    ):
        return node, last
    return None, None


def wanted_kinds(at: Path_) -> set[str]:
    """The kinds of scalar the schema takes at `at`: str, int, float, bool, none, any; empty if unknown."""
    candidates: list[Any] = [Topology]
    for part in at:
        step: list[Any] = []
        for annotation in candidates:
            for alt in _alternatives(annotation):
                origin, args = typing.get_origin(alt), typing.get_args(alt)
                if isinstance(alt, type) and issubclass(alt, BaseModel):
                    if isinstance(part, str) and part in alt.model_fields:
                        step.append(alt.model_fields[part].annotation)
                elif origin is dict and args and isinstance(part, str):
                    step.append(args[1])
                elif origin is list and args and isinstance(part, int):
                    step.append(args[0])
        candidates = step
    kinds: set[str] = set()
    for annotation in candidates:
        for alt in _alternatives(annotation):
            kinds |= _leaf(alt)
    return kinds


def _alternatives(annotation: Any) -> list[Any]:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


def _leaf(annotation: Any) -> set[str]:
    if annotation is Any:
        return {"any"}
    if typing.get_origin(annotation) is typing.Literal:
        return {_LITERAL_KINDS.get(type(v), "any") for v in typing.get_args(annotation)}
    return _KINDS.get(annotation, set())


_LITERAL_KINDS = {bool: "bool", int: "int", str: "str"}
_KINDS = {str: {"str"}, bool: {"bool"}, int: {"int"}, float: {"float"}, type(None): {"none"}}
