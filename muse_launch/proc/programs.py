"""Where a role's program is found on this host, as `up` will spawn it (standard library only: `down` and
the process layer import it)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path


def program_path(program: str, env: Mapping[str, str]) -> str:
    """A bare name from PATH, else from this interpreter's bin directory: the routers muse-launch
    depends on live in its venv, which need not be on PATH (`.venv/bin/muse-launch up ...`)."""
    if os.sep in program or shutil.which(program, path=env.get("PATH")):
        return program
    sibling = Path(sys.executable).parent / program
    return str(sibling) if os.access(sibling, os.X_OK) else program
