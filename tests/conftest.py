"""Shared by every test: the stand-in harness (tests/stand_ins, on pytest's pythonpath)."""

import pytest

pytest.register_assert_rewrite("harness")

from harness import deployment  # noqa: E402,F401  the `deployment` fixture
