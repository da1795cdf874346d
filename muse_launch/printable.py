"""Text from outside (a role's log, a server's answer) made safe for a terminal: control characters, an
escape sequence (ESC [ ... , an OSC title or hyperlink), a carriage return that would overwrite the line, a
NUL, are shown escaped (`\\x1b`, `\\r`), never sent as they are. Tabs stay."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # SGR: colour and weight only, never a cursor move


def escaped(text: str) -> str:
    """`text` with every control character but the tab shown escaped, as Python writes it."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str) -> str:
    """A model's answer or a server's error body as one printable line: whitespace runs become one space,
    other control characters are shown escaped."""
    return escaped(" ".join(text.replace("\x0b", " ").replace("\x0c", " ").split()))


def uncoloured(text: str) -> str:
    """`text` without its colour codes (a router's log colours its level and time: shown escaped they were
    noise), every other control character shown escaped as `escaped` shows it."""
    return escaped(_COLOUR.sub("", text))
