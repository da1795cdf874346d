"""`top` of a deployment on a real SLURM cluster on this machine (scripts/slurm_local.sh): its roles as SLURM
sees them, each read at its node's address, the router's load per worker named by role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import Deployment
from rehearsal import tails
from test_slurm import PD_TWO_NODES, cancel_and_kill, cluster, down_clean, job_id, up  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def test_top_once_json_on_slurm(cluster: Path, tmp_path: Path):  # noqa: F811
    d = Deployment(tmp_path / "home", "helion-gb300")
    d.home.mkdir()
    result = up(d, PD_TWO_NODES)
    try:
        assert result.returncode == 0, f"up: {result.stdout}{result.stderr}\n{tails(d)}"
        smoke = d.cli("smoke", d.name, "--timeout", "60", timeout=120)
        assert smoke.returncode == 0, f"smoke: {smoke.stdout}{smoke.stderr}"
        top = d.cli("top", d.name, "--once", "--json", "--interval", "0.5")
        assert top.returncode == 0, top.stderr
        snap = json.loads(top.stdout)
        roles = {r["name"]: r for r in snap["roles"]}
        assert list(roles) == ["prefill@tray0", "decode@tray1", "router"], roles
        assert all(r["state"] == "ready" and r["health"] == "ok" for r in roles.values()), roles
        assert all(r["metrics_unavailable"] is None for r in roles.values()), roles
        hosts = {r["name"]: r["probe_host"] for r in d.state_file()["roles"]}
        assert roles["decode@tray1"]["metrics_url"].startswith(f"http://{hosts['decode@tray1']}:")
        assert roles["decode@tray1"]["generation_tokens_total"] > 0, roles["decode@tray1"]
        workers = {w["role"]: w for w in snap["routers"][0]["workers"]}
        assert set(workers) == {"prefill@tray0", "decode@tray1"}, snap["routers"]
        down_clean(d, job_id(d))
    finally:
        cancel_and_kill(d)
