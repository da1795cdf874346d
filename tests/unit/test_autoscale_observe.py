"""What the autoscaler observes of a deployment: each scaled role's instances' readings (as `top` reads
them) turned into one window per role; zero traffic is an idle window, not a missing one."""

from __future__ import annotations

from muse_launch.readiness import Probe, ProbeKind
from muse_launch.rundir.decisions import describe, recent_decisions, record_decision
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord, RunDir
from muse_launch.supervise.autoscaler import Setup, observe
from muse_launch.top.collect import Reading
from muse_launch.topology.model import Topology

TOPOLOGY = Topology.model_validate(
    {
        "version": 1,
        "name": "t",
        "hardware": "b300",
        "roles": {
            "prefill": {"kind": "prefill", "port": 1000, "gpus": [0, 1], "replicas": 2},
            "decode": {"kind": "decode", "port": 2000, "gpus": [2]},
            "router": {"kind": "router", "port": 3000, "prefill": ["prefill"], "decode": ["decode"]},
        },
        "autoscale": {
            "targets": {"ttft": 0.5, "itl": 0.05, "percentile": 50},
            "roles": {"prefill": {"min": 1, "max": 4}, "decode": {"min": 1, "max": 2}},
        },
    }
)


def role(name: str, kind: str, of: str) -> RoleRecord:
    return RoleRecord(
        name,
        kind,
        RoleState.READY,
        (),
        None,
        {},
        Probe(ProbeKind.HTTP, ("/health",)),
        "127.0.0.1",
        "SIGTERM",
        1.0,
        role=of,  # type: ignore[arg-type]
    )


RECORD = DeploymentRecord(
    "t",
    "t.yaml",
    (),
    (
        role("prefill", "prefill", "prefill"),
        role("prefill-1", "prefill", "prefill"),
        role("decode", "decode", "decode"),
    ),
)


def reading(at: float, count: float, running: float = 0.0, itl: dict | None = None, error=None) -> Reading:
    return Reading(
        at,
        "http://x/metrics",
        values={"running": running, "queued": 0.0, "kv_cache_usage": 0.1, "ttft_count": count},
        histograms={"ttft": {0.1: count, 1.0: count, float("inf"): count}, **({"itl": itl} if itl else {})},
        error=error,
    )


def test_windows_sum_the_instances_and_take_quantiles_of_the_interval() -> None:
    setup = Setup.of(TOPOLOGY)
    assert setup is not None and setup.gpus_each == {"prefill": 1, "decode": 1}
    before = {
        "prefill": reading(0, 10),
        "prefill-1": reading(0, 5),
        "decode": reading(0, 15, itl={0.01: 100}),
    }
    now = {
        "prefill": reading(2, 14, running=1),
        "prefill-1": reading(2, 9, running=2),
        "decode": reading(2, 23, running=3, itl={0.01: 100, 0.1: 200}),
    }
    obs = observe(setup, RECORD, now, before, 2.0)
    p, d = obs.roles["prefill"], obs.roles["decode"]
    assert p.instances == 2 and p.requests == 8 and p.rate == 4.0 and p.running == 3.0
    assert p.ttft is not None and p.ttft <= 0.1
    assert d.itl is not None and 0.01 < d.itl <= 0.1  # only the interval's 100 observations, all above 10 ms


def test_zero_traffic_is_idle_and_no_metrics_is_unknown() -> None:
    setup = Setup.of(TOPOLOGY)
    assert setup is not None
    before = {"prefill": reading(0, 10), "prefill-1": reading(0, 5), "decode": reading(0, 15)}
    now = {
        "prefill": reading(2, 10),
        "prefill-1": reading(2, 5),
        "decode": reading(2, 0, error="metrics: connection refused"),
    }
    obs = observe(setup, RECORD, now, before, 2.0)
    assert obs.roles["prefill"].idle and obs.roles["prefill"].error is None
    assert obs.roles["decode"].error == "metrics: connection refused" and not obs.roles["decode"].idle


def test_decisions_are_appended_and_read_back(tmp_path) -> None:
    run_dir = RunDir(tmp_path)
    for i in range(7):
        record_decision(
            run_dir,
            {"role": "decode", "from": i, "to": i + 1, "kind": "up", "reasons": ["x"]},
            "act",
            "done",
            0,
        )
    shown = recent_decisions(run_dir, 3)
    assert [d["from"] for d in shown] == [4, 5, 6]
    assert describe(shown[-1]).endswith("decode 6 -> 7 (up, done): x")
