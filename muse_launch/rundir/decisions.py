"""The autoscaler's decisions, made or advised: one JSON line each in the run directory's `decisions.jsonl`
(docs/autoscale.md), appended by the supervisor's autoscaler or `autoscale --advise`, shown by `status` and
`top`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .state import RunDir, now_iso

DECISIONS = "decisions.jsonl"
MAX_SHOWN_BYTES = 256 << 10  # `status` and `top` read the end of the file only


def record_decision(run_dir: RunDir, decision: Mapping[str, Any], mode: str, outcome: str, at: float) -> dict:
    line = {"at": now_iso(at), "mode": mode, **decision, "outcome": outcome}
    fd = os.open(run_dir.path / DECISIONS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())  # one write per line: never interleaved
    finally:
        os.close(fd)
    return line


def recent_decisions(run_dir: RunDir, count: int = 5) -> list[dict[str, Any]]:
    """The last `count` decisions of the run directory (what `status` and `top` show); [] without any."""
    path = run_dir.path / DECISIONS
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - MAX_SHOWN_BYTES))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in tail[-count:]:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def describe(line: Mapping[str, Any]) -> str:
    """One decision as a line: `10:02:03 decode 2 -> 4 (up, done): itl p90 81.0ms of target 50ms (1.62x)`."""
    at = str(line.get("at", ""))[11:19]
    reasons = "; ".join(str(r) for r in line.get("reasons") or [])
    return (
        f"{at} {line.get('role')} {line.get('from')} -> {line.get('to')} "
        f"({line.get('kind')}, {line.get('outcome')}): {reasons}"
    )
