"""`start: overlap | waves`: which roles wait for which, from the engines' versions (ENGINE-FACTS "Start
order")."""

from __future__ import annotations

from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.plan.start_policy import OVERLAP, WAVES, choose
from muse_launch.supervise.wiring import Wire, wiring_checks


def spec(name: str, kind: str, engine: str, port: int, *depends_on: str, **extra) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        role=name,
        kind=kind,
        engine=engine,
        launcher=("x",),
        args=(),
        ports={"http": port, **extra.pop("ports", {})},
        depends_on=depends_on,
        **extra,
    )


EPD = Plan(
    "epd",
    (
        spec("encoder", "encoder", "sglang", 30010, probe=Probe(ProbeKind.HTTP, ("/health",), timeout=900.0)),
        spec("prefill", "prefill", "sglang", 30001, "encoder", ports={"encoder_bootstrap": 8997}),
        spec(
            "decode",
            "decode",
            "sglang",
            30002,
            "encoder",
            ports={"encoder_bootstrap": 8999},
            env={"SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL": "5"},
        ),
        spec("router", "router", "sglang-router", 8000, "prefill", "decode"),
    ),
    (("encoder",), ("prefill", "decode"), ("router",)),
)
NEW = {"sglang": "0.5.23", "sglang-router": "0.3.2"}


def test_overlap_starts_encoders_with_their_language_workers_and_keeps_a_slow_encoder_listed():
    """The router still waits for its workers: started early, it registers them late (start_policy.py)."""
    policy = choose(EPD, None, NEW)
    assert policy.policy == OVERLAP
    assert policy.start_after == {"encoder": (), "prefill": (), "decode": (), "router": ("prefill", "decode")}
    prefill, decode = policy.plan.spec("prefill"), policy.plan.spec("decode")
    assert prefill.env["SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL"] == "960"  # the encoder's 900 s timeout + 60
    assert decode.env["SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL"] == "5"  # the file's own value stays
    assert policy.plan.waves == EPD.waves  # stopping keeps the reverse dependency order


def test_older_or_unknown_versions_fall_back_to_waves_saying_why():
    for versions, said in (
        ({"sglang": "0.5.16", "sglang-router": "0.3.2"}, "sglang 0.5.16"),
        ({"sglang": None, "sglang-router": "0.3.2"}, "sglang version unknown"),
    ):
        policy = choose(EPD, None, versions)
        assert policy.policy == WAVES and policy.start_after["router"] == ("prefill", "decode")
        assert "overlap needs SGLang >= 0.5.17" in policy.note and said in policy.note
        assert policy.plan is EPD


def test_the_file_decides_when_it_says():
    assert choose(EPD, "waves", NEW).start_after["prefill"] == ("encoder",)
    policy = choose(EPD, "overlap", {"sglang": "0.5.16", "sglang-router": "0.3.2"})
    assert policy.start_after["prefill"] == ("encoder",)  # an old SGLang would drop a late encoder for good
    assert policy.start_after["router"] == ("prefill", "decode")
    assert "those keep waves" in policy.note


def test_pd_without_encoders_has_nothing_to_overlap():
    plan = Plan("pd", EPD.specs[1:3] + EPD.specs[3:], (("prefill", "decode"), ("router",)))
    plan = Plan(
        "pd",
        tuple(
            spec(s.name, s.kind, s.engine, s.ports["http"], *(d for d in s.depends_on if d != "encoder"))
            for s in plan.specs
        ),
        plan.waves,
    )
    policy = choose(plan, None, NEW)
    assert (
        policy.policy == WAVES
        and policy.note is None
        and policy.start_after["router"] == ("prefill", "decode")
    )


def test_vllm_keeps_waves_without_a_word():
    plan = Plan(
        "pd",
        (
            spec("prefill", "prefill", "vllm", 1),
            spec("decode", "decode", "vllm", 2),
            spec("router", "router", "vllm-router", 3, "prefill", "decode"),
        ),
        (("prefill", "decode"), ("router",)),
    )
    policy = choose(plan, None, {"vllm": "0.33.0", "vllm-router": "0.1.17"})
    assert policy.policy == WAVES and policy.note is None


def test_the_wiring_each_role_must_show():
    checks = wiring_checks(EPD)
    assert set(checks) == {"prefill", "decode", "router"}
    assert checks["prefill"].list_url == "http://127.0.0.1:8997/list_encoder_urls"
    assert checks["router"].list_url == "http://127.0.0.1:8000/workers"
    assert checks["router"].wires == (
        Wire("prefill", "prefill", "http://127.0.0.1:30001"),
        Wire("decode", "decode", "http://127.0.0.1:30002"),
    )
    assert checks["router"].counts(()) == (("prefill", 1, 1), ("decode", 1, 1))
    assert checks["router"].counts(checks["router"].wires[:1]) == (("prefill", 0, 1), ("decode", 1, 1))
