"""A toy worker engine: a fork of SGLang under its own name, program, image (none) and default KV bootstrap
port. tests/integration/test_toy_engine.py adds it with one line in muse_launch/registry.py and rehearses it:
nothing else in muse_launch names it, so what works for it works for any engine added the same way."""

from __future__ import annotations

from dataclasses import replace

from muse_launch.engines.sglang import SGLang


class ToyServe(SGLang):
    """Everything but its names (flags, readers, choices, rules) is SGLang's: the fork speaks its command
    line."""

    NAME = "toyserve"
    DEFAULT_LAUNCHER = ("toyserve",)
    DISTRIBUTIONS = ("toyserve",)
    MODULES = ("toyserve",)
    FACTS = replace(
        SGLang.FACTS,
        name=NAME,
        title="ToyServe",
        default_launcher=DEFAULT_LAUNCHER,
        image_field=None,
        bootstrap_port=9100,
    )


ENGINE = ToyServe()
