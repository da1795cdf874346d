"""A router's own option list, read from the `--help` it prints (sglang-router, smg and vllm-router
are Rust programs behind a Python console script: no parser to import), cached per installed program."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..host.versions import Installed

HELP_TIMEOUT = 30.0
USAGE_GROUP = re.compile(r"\[(-[-\w]+)((?:\s+[^\[\]]+?)?(?:\s+\[[^\[\]]*\])*)\]")
OPTION_LINE = re.compile(
    r"^\s{1,8}(-[-\w]+(?:[ =][^\s,]+)?(?:,\s+-[-\w]+(?:[ =][^\s,]+)?)*)(?:\s{2,}|$)", re.M
)


@dataclass(frozen=True)
class RouterOptions:
    options: dict[
        str, tuple[str, ...] | None
    ]  # flag -> its choices, () when it takes a free value, None: no value

    @classmethod
    def from_help(cls, text: str) -> RouterOptions:
        options: dict[str, tuple[str, ...] | None] = {}
        usage = text.split("\n\n", 1)[0]
        for flag, rest in USAGE_GROUP.findall(usage):
            rest = rest.strip()
            choices = re.match(r"^\{([^}]*)\}", rest)
            options[flag] = tuple(choices.group(1).split(",")) if choices else (() if rest else None)
        for line in OPTION_LINE.findall(text):  # aliases (-h, --help) and options the usage left out
            for part in line.split(", "):
                flag, _, metavar = part.partition(" ")
                flag = flag.split("=")[0]
                if flag not in options:
                    choices = re.match(r"^\{([^}]*)\}", metavar)
                    options[flag] = (
                        tuple(choices.group(1).split(",")) if choices else (() if metavar else None)
                    )
        return cls(options)

    def problems(self, args: Iterable[str]) -> list[tuple[str, str, str | None, str | None]]:
        """(message, flag, value, suggestion) for each option it lacks and each value off its choices."""
        out = []
        args = list(args)
        for i, arg in enumerate(args):
            if not arg.startswith("--"):
                continue
            flag, eq, inline = arg.partition("=")
            if flag not in self.options:
                near = difflib.get_close_matches(flag, list(self.options), n=1, cutoff=0.6)
                out.append((f"unrecognized arguments: {arg}", flag, None, near[0] if near else None))
                continue
            choices = self.options[flag]
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if choices and value is not None and value not in choices:
                out.append(
                    (
                        f"argument {flag}: invalid choice: {value!r} (choose from "
                        f"{', '.join(repr(c) for c in choices)})",
                        flag,
                        value,
                        None,
                    )
                )
        return out


def help_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muse-launch" / "router-help"


def read_router_help(found: Installed, box: dict) -> None:
    """The installed router's option list into box["options"], or why not into box["why"] (a thread's
    result)."""
    program = found.program
    if program.executable is None:
        box["why"] = program.why
        return
    if found.dist is None:  # a wrapper or a stand-in: its own --help says nothing of the router's options
        box["why"] = found.why or f"{' '.join(program.launcher)} is not a router muse-launch knows"
        return
    try:
        stat = os.stat(program.executable)
    except OSError as exc:
        box["why"] = str(exc)
        return
    key = hashlib.sha256(
        json.dumps(
            [
                program.launcher,
                os.path.realpath(program.executable),
                stat.st_mtime_ns,
                stat.st_size,
                found.dist,
                found.version,
            ]
        ).encode()
    ).hexdigest()[:24]
    cached = help_cache_dir() / f"{key}.txt"
    try:
        text = cached.read_text()
    except OSError:
        argv = [program.executable, *program.launcher[1:], "--help"]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=HELP_TIMEOUT, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError) as exc:
            box["why"] = f"`{' '.join(argv)}` failed: {exc}"
            return
        text = done.stdout
        if done.returncode != 0 or "usage:" not in text:
            box["why"] = f"`{' '.join(argv)}` printed no option list (exit status {done.returncode})"
            return
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(cached)
        except OSError:
            pass  # no cache: the next check asks again
    box["options"] = RouterOptions.from_help(text)
