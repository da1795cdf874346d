"""`up`'s plain progress lines: "ready" only beside a role that lists all its peers."""

from __future__ import annotations

import dataclasses
import io

from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.render_progress import PlainProgress
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord


def router(wiring) -> RoleRecord:
    return RoleRecord(
        "router",
        "router",
        RoleState.READY,
        (),
        "http://127.0.0.1:8000",
        {"http": 8000},
        Probe(ProbeKind.HTTP, ("/readiness",)),
        "127.0.0.1",
        "SIGTERM",
        1.0,
        started_at="2026-12-03T00:00:00+00:00",
        ready_at="2026-12-03T00:00:01.5+00:00",
        wiring=wiring,
    )


def test_a_router_that_lists_part_of_its_workers_is_wiring_not_ready() -> None:
    out = io.StringIO()
    progress = PlainProgress(out)
    partial = router((("prefill", 0, 1), ("decode", 0, 1)))
    progress.update(DeploymentRecord("d", "f.yaml", (), (partial,)))
    progress.update(
        DeploymentRecord(
            "d", "f.yaml", (), (dataclasses.replace(partial, wiring=(("prefill", 1, 1), ("decode", 1, 1))),)
        )
    )
    assert out.getvalue().splitlines() == [
        "router  wiring      answers after 1.5s  http://127.0.0.1:8000  lists 0/1 prefill, 0/1 decode "
        "so far; ready once it lists them all",
        "router  ready       after 1.5s  http://127.0.0.1:8000  lists 1/1 prefill, 1/1 decode",
    ]
    assert "ready " not in out.getvalue().splitlines()[0].split("answers")[0]
