"""sglang-router 0.3.2 (PyPI `sglang-router`): PD and aggregated routing for SGLang workers."""

from __future__ import annotations

from functools import partial

from . import router
from .router import PORT_FLAGS, SHADOWED, WIRING  # noqa: F401  the routers' shared command line

FACTS = router.RouterFacts(
    name="sglang-router",
    default_launcher=("sglang-router", "launch"),
    pd_flag="--pd-disaggregation",
    shipped_in="sglang",
    unhealthy_after_s=3.3,
)  # the SGLang image has it
NAME, DEFAULT_LAUNCHER = FACTS.name, FACTS.default_launcher
DISTRIBUTIONS = ("sglang-router",)  # what provides it (host/versions.py reads the installed release)
MODULE = "sglang_router"  # its wheel also installs an `smg` program, which runs this
render = partial(router.render, facts=FACTS)
