"""`start: overlap | waves` on the simulated engine behind the real sglang-router: the order roles
start in, and `up` ready only once the router lists every worker and each language worker its encoder."""

from __future__ import annotations

import pytest
from harness import REPO, Deployment

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

EPD = REPO / "topologies" / "epd-b300.yaml"
WIRED = {
    "encoder": {},
    "prefill": {"encoder": "1/1"},
    "decode": {"encoder": "1/1"},
    "router": {"prefill": "1/1", "decode": "1/1"},
}


def changes(d: Deployment) -> list[tuple[str, str]]:
    """(role, state) in the order the supervisor reported them."""
    lines = (d.run_dir / "supervisor.log").read_text().splitlines()
    states = ("starting", "wiring", "ready")  # wiring: it answers, and does not list all its peers yet
    return [(w[0], w[1]) for w in map(str.split, lines) if len(w) >= 2 and w[1] in states]


def answered(seen: list[tuple[str, str]], name: str) -> int:
    """When `name` first answered its probe: its `wiring` line, or `ready` where it was wired at once."""
    return min(i for i, (role, state) in enumerate(seen) if role == name and state in ("wiring", "ready"))


@pytest.mark.parametrize("start", ["overlap", "waves"])
def test_epd_comes_up_wired_in_the_order_its_policy_says(tmp_path, start):
    home = tmp_path / "home"
    home.mkdir()
    d = Deployment(home, "epd-b300")
    sets = ["--set", "rehearse={ready_after: 0.3}"] + (["--set", "start=waves"] if start == "waves" else [])
    up = d.cli("up", EPD, "--rehearse", "--detach", *sets, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        status = d.status()
        assert status["state"] == "ready"
        assert {r["name"]: r["wiring"] for r in status["roles"]} == WIRED
        seen = changes(d)
        first_ready = next(i for i, (_, state) in enumerate(seen) if state in ("wiring", "ready"))
        started_before = {name for name, state in seen[:first_ready] if state == "starting"}
        if start == "overlap":
            assert "start: overlap" in up.stdout
            assert started_before == {"encoder", "prefill", "decode"}
        else:
            assert "start: waves (as the file asks)" in up.stdout
            assert started_before == {"encoder"}
        # Either way the router starts once its workers answer (start_policy.py says why).
        assert seen.index(("router", "starting")) > max(answered(seen, "prefill"), answered(seen, "decode"))
        assert (
            "wiring: prefill: 1/1 encoders; decode: 1/1 encoders; router: 1/1 prefill, 1/1 decode"
            in d.cli("status", d.name).stdout.replace("\n", " ")
        )
    finally:
        down = d.cli("down", d.name)
        leftovers = d.alive()
        d.kill_leftovers()
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers == []
