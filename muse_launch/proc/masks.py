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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Masks:
    salt: str = ""
    shown: Mapping[str, str] = field(default_factory=dict)  # digest of a value -> how it is shown

    @classmethod
    def of(cls, values: Iterable[str], redact: Callable[[str], str]) -> Masks:
        salt = os.urandom(16).hex()
        hidden = {v: redact(v) for v in values}
        return cls(salt, {_digest(salt, v): shown for v, shown in hidden.items() if shown != v})

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


def no_arguments(arg: str) -> str:
    """The mask where the digests are lost with a damaged state.json: no argument is shown, so a process is
    described by its program's name alone (run/process.describe)."""
    return ""


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256(f"{salt}\0{value}".encode(errors="surrogateescape")).hexdigest()
