"""``python -m muse_launch.sim --engine sglang|vllm [options] -- <engine args>``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping

from .config import ArgvError, parse_engine_args, startup_errors
from .timing import (
    DEFAULT_ITL_PER_RUNNING_S,
    DEFAULT_ITL_S,
    DEFAULT_MAX_RUNNING,
    DEFAULT_PREFILL_TOKENS_PER_S,
    Rates,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m muse_launch.sim",
        description="Rehearsal engine: speaks the SGLang / vLLM HTTP protocol and wires itself "
        "to its peers like the real engine, without a GPU.  Everything after '--' "
        "is the real engine's argv (after 'sglang serve' / 'vllm serve').",
    )
    p.add_argument("--engine", required=True, choices=("sglang", "vllm"))
    p.add_argument(
        "--ready-after",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds before /health turns 200 (default 2.0)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="where the tiny local model directory is created (default: "
        "$MUSE_LAUNCH_RUN_DIR/sim/$MUSE_LAUNCH_ROLE under muse-launch, else a "
        "temp dir removed at exit)",
    )
    p.add_argument(
        "--kv-timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how long a KV hand-off waits for the other side (default 3.0)",
    )
    p.add_argument(
        "--itl",
        type=_seconds,
        default=DEFAULT_ITL_S,
        metavar="SECONDS",
        help=f"decode time of one token with one request running (default {DEFAULT_ITL_S})",
    )
    p.add_argument(
        "--itl-per-running",
        type=_seconds,
        default=DEFAULT_ITL_PER_RUNNING_S,
        metavar="SECONDS",
        help="added to each token's decode time per other running request "
        f"(default {DEFAULT_ITL_PER_RUNNING_S})",
    )
    p.add_argument(
        "--prefill-tokens-per-s",
        type=_rate,
        default=DEFAULT_PREFILL_TOKENS_PER_S,
        metavar="RATE",
        help="prompt tokens prefilled per second, one prompt at a time "
        f"(default {DEFAULT_PREFILL_TOKENS_PER_S:g})",
    )
    p.add_argument(
        "--max-running",
        type=_count,
        default=DEFAULT_MAX_RUNNING,
        metavar="N",
        help=f"requests decoded at once; the others queue (default {DEFAULT_MAX_RUNNING})",
    )
    p.add_argument(
        "--loopback", action="store_true", help="bind every listener to 127.0.0.1 whatever --host says"
    )
    return p


def _number(text: str, low: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not low <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: {what}")
    return value


def _seconds(text: str) -> float:
    return _number(text, 0.0, "seconds must be finite and at least 0")


def _rate(text: str) -> float:
    value = _number(text, 0.0, "a rate must be finite and positive")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a rate must be positive")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a count of at least 1")
    return int(text)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def path_part_problem(name: str) -> bool:
    """Not one directory entry (`..`, a '/', a control character): it would leave the run directory."""
    return name in ("", ".", "..") or "/" in name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)


def default_state_dir(environ: Mapping[str, str] = os.environ) -> str | None:
    """Under muse-launch, the role's own directory in the deployment's run directory: it
    survives a SIGKILL in a place `down` and the next `up` know, never in /tmp."""
    run_dir = environ.get("MUSE_LAUNCH_RUN_DIR")
    if not run_dir:
        return None
    role = environ.get("MUSE_LAUNCH_ROLE") or "engine"
    if path_part_problem(role):
        raise ArgvError(f"MUSE_LAUNCH_ROLE {role!r} cannot name a directory under the run directory")
    return os.path.join(run_dir, "sim", role)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, engine_args = split_argv(argv)
    ns, unknown = build_parser().parse_known_args(own)
    engine_args = unknown + engine_args
    try:
        cfg = parse_engine_args(ns.engine, engine_args)
        state_dir = ns.state_dir or default_state_dir()
    except ArgvError as e:
        print(f"usage error: {e}", file=sys.stderr, flush=True)
        return 2
    from .server import SimEngine, serve  # aiohttp import only when actually serving

    engine = SimEngine(
        cfg,
        ready_after=ns.ready_after,
        state_dir=state_dir,
        kv_timeout=ns.kv_timeout,
        itl=ns.itl,
        loopback=ns.loopback,
        rates=Rates(ns.prefill_tokens_per_s, ns.itl, ns.itl_per_running, ns.max_running),
    )
    errs = startup_errors(cfg)
    if errs:
        for e in errs:
            engine.log(f"ERROR: {e}")
        return 1
    try:
        return asyncio.run(serve(engine))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
