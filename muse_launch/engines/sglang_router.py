"""sglang-router 0.3.2 (PyPI `sglang-router`): PD and aggregated routing for SGLang workers."""

from __future__ import annotations

from . import router
from .base import Context, Instance, Rendered

FACTS = router.RouterFacts(name="sglang-router", default_launcher=("sglang-router", "launch"),
                           pd_flag="--pd-disaggregation")
NAME = FACTS.name
DISTRIBUTIONS = ("sglang-router",)  # what provides it (host/versions.py reads the installed release)
MODULE = "sglang_router"  # its wheel also installs an `smg` program, which runs this
DEFAULT_LAUNCHER = FACTS.default_launcher
PORT_FLAGS = router.PORT_FLAGS
SHADOWED = router.SHADOWED
WIRING = router.WIRING


def render(inst: Instance, ctx: Context) -> Rendered:
    return router.render(inst, ctx, FACTS)
