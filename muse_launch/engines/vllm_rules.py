"""vLLM's own rules (0.33), beside its command line: the KV connectors it registers and DSpark's draft
length. Each reads one role's rendered argv (a RoleView); muse_launch/checks/ points what it finds at the key
or argument that decided it."""

from __future__ import annotations

import json
from collections.abc import Iterator

from . import vllm  # the flags; vllm.py imports this module first, so it is read at call time
from .argv import as_int, last_value
from .base import Problem, RoleView, error


def known_connector(view: RoleView) -> Iterator[Problem]:
    """The KV connector is one vLLM 0.33 registers, or comes with the module that registers it."""
    config = vllm.kv_transfer_config(view.args) or {}
    connector = config.get("kv_connector")
    if (
        connector is not None
        and connector not in vllm.KNOWN_CONNECTORS
        and not config.get(vllm.CONNECTOR_MODULE_PATH)
    ):
        yield error(
            vllm.KV_TRANSFER_CONFIG,
            f"vLLM has no KV connector {connector}",
            f"use transfer_backend {', '.join(vllm.CONNECTORS)}",
            "transfer_backend",
        )


def dspark_speculative(view: RoleView) -> Iterator[Problem]:
    """vLLM's DSpark drafts at most seven tokens."""
    flag = vllm.SPECULATIVE_CONFIG
    raw = last_value(view.args, flag)
    try:
        config = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        yield error(
            flag,
            f"{flag} is not JSON: {raw}",
            'write it as one JSON object, e.g. \'{"method":"dspark",...}\'',
        )
        return
    tokens = config.get("num_speculative_tokens") if isinstance(config, dict) else None
    if (
        isinstance(config, dict)
        and config.get("method") == "dspark"
        and tokens is not None
        and not 1 <= (as_int(tokens) or 0) <= 7
    ):
        yield error(
            flag,
            f"DSpark num_speculative_tokens {tokens}: it drafts 1 to 7 tokens",
            "set num_speculative_tokens to 7 or less",
        )


START_UP_RULES = (known_connector,)
HARDWARE_RULES = (dspark_speculative,)
