"""Secrets in process descriptions, by value: `down` names each process it had to kill by its command
line, and a role's command line may hold a `${env:...}` value; `down` runs without the topology, so it
cannot redact the way `up` does (it never knows the values).

`up` records, in state.json, a salted SHA-256 of each argument and environment value of the plan that
held a secret, with how the value is shown (`--api-key=***`); a process's arguments whose digest is
one of those are shown so (as is the value after `=` of a `--flag=VALUE` argument). Only whole values
are masked: a short secret `1` never mangles `127.0.0.1`. The digests never give a value back, though a
secret short enough to guess can be confirmed against its digest: state.json is mode 0600.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Masks:
    salt: str = ""
    shown: Mapping[str, str] = field(default_factory=dict)  # digest of a value -> how it is shown

    @classmethod
    def of(cls, values: Iterable[str], redact: Callable[[str], str]) -> Masks:
        """Each value, and each word of it (`--token=S`'s S, a secret inside a longer value), whose redaction
        differs: so a secret is found whole in a command line, and as a word in a log line (`text`)."""
        salt = os.urandom(16).hex()
        values = {w for v in values for w in (v, *_words(v)) if w}
        hidden = {v: redact(v) for v in values}
        return cls(salt, {_digest(salt, v): shown for v, shown in hidden.items() if shown != v})

    def adding(self, values: Iterable[str], redact: Callable[[str], str]) -> Masks:
        """These masks and those of `values` (an edited file's secrets, once its launches run), one salt."""
        if not self.salt:
            return Masks.of(values, redact)
        values = {w for v in values for w in (v, *_words(v)) if w}
        more = {_digest(self.salt, v): shown for v in values if (shown := redact(v)) != v}
        return Masks(self.salt, {**self.shown, **more})

    def text(self, line: str) -> str:
        """A line of a role's log with every word that is a secret shown as ***: `logs` knows the digests
        only, not the values (`up`, which knows them, hides them the same way)."""
        if not self.shown:
            return line
        pieces = _EDGES.split(line)
        return "".join(
            self.shown.get(_digest(self.salt, p), p) if i % 2 == 0 and p else p for i, p in enumerate(pieces)
        )

    def __bool__(self) -> bool:
        return bool(self.shown)

    def token(self, text: str) -> str:
        """One argument as it may be shown."""
        if not self.shown:
            return text
        if (shown := self.shown.get(_digest(self.salt, text))) is not None:
            return shown
        flag, eq, value = text.partition("=")
        if eq and (shown := self.shown.get(_digest(self.salt, value))) is not None:
            return f"{flag}={shown}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"salt": self.salt, "sha256": dict(self.shown)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Masks:
        return cls(d["salt"], dict(d["sha256"])) if d else cls()


# A flag whose value is a secret, whoever's process it is (another user's deployment holding a port we want):
# --api-key, --hf-token, --password, --control-plane-api-keys, --auth-header, --client-secret...
# Not --max-total-tokens, --tokenizer-path, --disable-auth-check style names that carry no secret.
SECRET_FLAG = re.compile(
    r"^--?[\w.-]*(key|token(?!s|izer)|secret|passw(or)?d|auth(?!or)|credential|cookie"
    r"|bearer)[\w.-]*$",
    re.I,
)


def command_line(argv: Iterable[str], mask: Callable[[str], str] = lambda arg: arg) -> str:
    """A process's command line fit to print: the value after each secret-looking flag (`--api-key X`,
    `--token=X`) is ***, and `mask` hides what it knows (a secret's value, by digest or as the file's
    `${env:...}`), before anything cuts the line."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        shown = mask(arg)
        if shown and hide_next and not arg.startswith("-"):
            shown = "***"
        elif shown and eq and flag.startswith("-") and SECRET_FLAG.match(flag):
            shown = f"{flag}=***"
        out.append(shown)
        hide_next = bool(shown and SECRET_FLAG.match(arg))
    return " ".join(a for a in out if a).strip()


_EDGES = re.compile(r"([\s'\"=,;:/@()\[\]{}<>]+)")  # what separates words, as load.py's redact reads them


def _words(value: str) -> list[str]:
    return _EDGES.split(value)[::2]


def no_arguments(arg: str) -> str:
    """The mask where the digests are lost with a damaged state.json: no argument is shown, so a process is
    described by its program's name alone (proc/process.describe)."""
    return ""


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256(f"{salt}\0{value}".encode(errors="surrogateescape")).hexdigest()
