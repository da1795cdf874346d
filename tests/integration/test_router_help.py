"""host/versions.py: following a launcher to its interpreter and module, and reading the installed
release there; the version findings of the engine check; routers' option lists from their --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from muse_launch.checks.router_options import RouterOptions

pytestmark = pytest.mark.integration  # starts processes

BIN = Path(sys.executable).parent


def test_router_options_from_its_help() -> None:
    printed = subprocess.run(
        [str(BIN / "sglang-router"), "launch", "--help"], capture_output=True, text=True, timeout=60
    )
    options = RouterOptions.from_help(printed.stdout)
    assert options.options["--policy"] == ("random", "round_robin", "cache_aware", "power_of_two", "manual")
    assert options.options["--dp-aware"] is None and options.options["--port"] == ()
    assert "--help" in options.options and "-h" in options.options
    problems = options.problems(
        ["--pd-disaggregation", "--policy", "fastest", "--prometheus-prot", "29000", "--port=8000"]
    )
    assert [(p[1], p[3]) for p in problems] == [
        ("--policy", None),
        ("--prometheus-prot", "--prometheus-port"),
    ]
