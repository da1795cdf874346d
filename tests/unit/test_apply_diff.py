"""`up FILE` of a running deployment: the pure difference (plan/diff.py), how it prints (plan/diff_text.py),
and its application above the backend seam (commands/apply.py) against a recording fake backend."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import pytest
from cli_run import muse
from hypothesis import given, settings
from hypothesis import strategies as st

from muse_launch.backend import Backend
from muse_launch.backend_types import Capability
from muse_launch.change import AddInstance, Adopt, RemoveInstance, RestartInstance, from_wire
from muse_launch.commands.apply import execute, recorded_instances
from muse_launch.core import load_plan
from muse_launch.errors import NotSupported, RuntimeFailure
from muse_launch.host.versions import engine_versions, recorded_versions
from muse_launch.plan.diff import (
    KIND_ORDER,
    ComparedInstance,
    Launch,
    StepKind,
    diff,
    own_argv,
    planned,
)
from muse_launch.plan.diff_text import difference_lines, plan_lines
from muse_launch.plan.start_policy import choose
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import RunDir, read_state, write_state
from muse_launch.supervise.planned_record import planned_record

EPD = "topologies/epd-b300.yaml"
FAST = "rehearse={ready_after: 0.3}"
SMALL = "model=example/tiny-model"  # a model of no known size: replicas may split the GPUs
DECODE_2 = ("roles.decode.replicas=2", "roles.decode.tp=2", "roles.decode.ep=2")


def epd(*sets: str):
    return load_plan(EPD, [FAST, SMALL, *sets], rehearse=True)


def running(*sets: str):
    """The record `up --rehearse` of the file writes: the plan as its start policy runs it."""
    loaded = epd(*sets)
    versions = engine_versions(loaded.plan)
    plan = choose(loaded.plan, loaded.loaded.topology.start, versions).plan
    record = planned_record(plan, EPD, loaded.redact, recorded_versions(plan, versions))
    return record, plan


def against(record, *sets: str):
    new = epd(*sets)
    return diff(
        recorded_instances(record, {s.role for s in new.plan.specs}),
        planned(choose(new.plan, None, engine_versions(new.plan)).plan, new.redact, record.masks.salt),
    )


# ---- the difference ---------------------------------------------------------------------------------


def test_peer_lists_are_not_part_of_a_launch():
    argv = ("r", "--pd-disaggregation", "--prefill", "http://a:1", "8998", "--prefill", "http://b:1", "none")
    argv += ("--decode", "http://c:2", "--policy", "x")
    assert own_argv("sglang-router", argv) == ("r", "--pd-disaggregation", "--policy", "x")
    assert own_argv("sglang-router", ("r", "--worker-urls", "http://a", "http://b")) == ("r",)
    worker = ("s", "--encoder-urls", "http://e:1", "http://e:2", "--mem-fraction-static", "0.8")
    assert own_argv("sglang", worker) == ("s", "--mem-fraction-static", "0.8")
    assert own_argv("vllm", worker) == worker  # vLLM lists no encoders: nothing of it is a peer list


def test_a_plan_against_its_own_record_is_empty():
    record, _ = running()
    difference = against(record)
    assert difference.empty and difference.steps == ()
    assert difference.unchanged == ("encoder", "prefill", "decode", "router")


def test_a_record_read_back_from_disk_compares_equal(tmp_path):
    record, _ = running()
    run_dir = RunDir(tmp_path / "epd-b300")
    write_state(run_dir, record)
    assert against(read_state(run_dir)).empty


def test_replicas_and_mem_fraction_of_decode():
    two = ("roles.decode.gpus=[4, 5]", "roles.decode.tp=2", "roles.decode.ep=2")
    record, _ = running(*two)
    edited = ("roles.decode.gpus=[4, 5, 6, 7]", "roles.decode.replicas=2", "roles.decode.mem_fraction=0.7")
    difference = against(record, *two[1:], *edited)  # decode-0 keeps GPUs 4-5; decode-1 gets 6-7
    assert [(s.kind, s.instance) for s in difference.steps] == [
        (StepKind.ADD, "decode-1"),
        (StepKind.ROLL, "decode"),
    ]
    assert difference.role("decode").before == 1 and difference.role("decode").after == 2
    lines = difference_lines(difference)
    assert lines[0] == "+ decode-1 (replicas 1 -> 2)"
    assert lines[1] == "~ decode: args --mem-fraction-static 0.75 -> 0.7 (rolled, one instance at a time)"
    assert lines[2:] == ["unchanged, not touched: encoder, prefill, router"]
    assert plan_lines(difference) == [
        "1. start decode-1 (decode), wait until it is ready, then register it with its router",
        "2. restart decode with its new launch, wait until it is ready and wired",
    ]


def test_adding_a_worker_does_not_restart_its_router():
    record, _ = running()
    difference = against(record, "roles.encoder.replicas=2", "roles.encoder.tp=1")
    # the new encoder is listed to the language workers, which keep their own launch: nothing else restarts
    assert {"prefill", "decode", "router"} <= set(difference.unchanged)
    assert [(s.kind, s.instance) for s in difference.steps] == [
        (StepKind.ADD, "encoder-1"),
        (StepKind.ROLL, "encoder"),  # TP 2 -> 1: its own launch changed
    ]


def test_a_changed_router_is_restarted_last():
    record, _ = running()
    sets = ("roles.router.args=[--policy, round_robin]", "roles.decode.mem_fraction=0.7")
    difference = against(record, *sets)
    assert [(s.kind, s.instance) for s in difference.steps] == [
        (StepKind.ROLL, "decode"),
        (StepKind.RESTART_ROUTER, "router"),
    ]
    assert "~ router: args --policy round_robin (added) (restarted, workers re-registered)" in (
        difference_lines(difference)
    )
    assert (
        plan_lines(difference)[-1] == "2. restart router with its new launch, then register its workers again"
    )


def test_removed_language_workers_go_before_the_encoders_they_list():
    record, _ = running("roles.encoder.replicas=2", "roles.encoder.tp=1", *DECODE_2)
    difference = against(record)  # back to one encoder (TP 2) and one decode
    removed = [s.instance for s in difference.steps if s.kind is StepKind.REMOVE]
    assert removed == ["decode-1", "encoder-1"]
    assert "- encoder-1 (replicas 2 -> 1)" in difference_lines(difference)


def test_added_encoders_go_before_the_language_workers():
    record, _ = running()
    difference = against(record, "roles.encoder.replicas=2", "roles.encoder.tp=1", *DECODE_2)
    added = [s.instance for s in difference.steps if s.kind is StepKind.ADD]
    assert added == ["encoder-1", "decode-1"]
    kinds = [s.kind for s in difference.steps]
    assert kinds == sorted(kinds, key=[StepKind.ADD, StepKind.ROLL, StepKind.REMOVE].index)


def test_a_role_removed_and_one_added(tmp_path):
    record, _ = running()
    new = replace(
        epd().plan,
        specs=tuple(
            replace(s, role="decoder", name="decoder") if s.role == "decode" else s for s in epd().plan.specs
        ),
    )
    difference = diff(recorded_instances(record, {s.role for s in new.specs}), planned(new, str))
    lines = difference_lines(difference)
    assert "+ decoder (new role)" in lines and "- decode (role removed)" in lines
    assert [s.kind for s in difference.steps][:1] == [StepKind.ADD]  # the new one up before the old goes


def test_an_older_state_without_roles_or_env_groups_replicas_by_name():
    record, _ = running(*DECODE_2)
    old = replace(
        record, roles=tuple(replace(r, role=None, env=None, launch_sha256=None) for r in record.roles)
    )
    difference = against(old, *DECODE_2)
    assert difference.empty and "decode" in difference.unchanged


def test_a_changed_secret_is_seen_and_never_shown(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text(
        open(EPD).read().replace("env: &mooncake_nvlink", "env: &mooncake_nvlink\n      HF_TOKEN: ${env:TOK}")
    )
    monkeypatch.setenv("TOK", "first-secret-value")
    loaded = load_plan(path, [FAST], rehearse=True)
    record = planned_record(loaded.plan, str(path), loaded.redact)
    assert "first-secret-value" not in str(record.to_json())
    monkeypatch.setenv("TOK", "second-secret-value")
    new = load_plan(path, [FAST], rehearse=True)
    difference = diff(
        recorded_instances(record, {"prefill", "decode"}), planned(new.plan, new.redact, record.masks.salt)
    )
    text = "\n".join(difference_lines(difference) + plan_lines(difference))
    assert [s.instance for s in difference.steps] == ["prefill", "decode"]
    assert "a secret value changed (not shown)" in text
    assert "secret-value" not in text


# ---- properties -------------------------------------------------------------------------------------

ROLES = {"encoder": "sglang", "prefill": "sglang", "decode": "sglang", "router": "sglang-router"}


def _launch(role: str, variant: int) -> Launch:
    return Launch(
        ROLES[role], role, ("prog", "--v", str(variant)), (("E", str(variant % 2)),), (variant,), ()
    )


@st.composite
def sides(draw):
    out = []
    for role in ROLES:
        variants = draw(st.lists(st.integers(0, 3), max_size=3 if role != "router" else 1))
        names = [role] if len(variants) == 1 else [f"{role}-{i}" for i in range(len(variants))]
        out += [ComparedInstance(n, role, _launch(role, v)) for n, v in zip(names, variants, strict=True)]
    return out


def applied(old: list[ComparedInstance], steps) -> Counter:
    """The (role, launch) of each instance once the steps are made, as a backend would make them."""
    now = {i.name: (i.role, i.launch) for i in old}
    for n, step in enumerate(steps):
        if step.kind is StepKind.ADD:
            now[f"added-{n}"] = (step.role, step.new.launch)
        elif step.kind is StepKind.REMOVE:
            del now[step.instance]
        else:
            assert now[step.instance][0] == step.role
            now[step.instance] = (step.role, step.new.launch)
    return Counter(now.values())


@settings(max_examples=300, deadline=None)
@given(sides())
def test_a_deployment_diffed_against_itself_is_empty(instances):
    difference = diff(instances, instances)
    assert difference.empty and set(difference.unchanged) == {i.role for i in instances}


@settings(max_examples=300, deadline=None)
@given(sides(), sides())
def test_applying_the_steps_yields_the_new_instances(old, new):
    difference = diff(old, new)
    assert applied(old, difference.steps) == Counter((i.role, i.launch) for i in new)
    phases = [StepKind.ADD, StepKind.ROLL, StepKind.REMOVE, StepKind.RESTART_ROUTER]
    kinds = [s.kind for s in difference.steps]
    assert kinds == sorted(kinds, key=phases.index)  # capacity first: adds, rolls, removals; routers last
    rank = lambda s: KIND_ORDER[(s.new or s.old).launch.kind]  # noqa: E731
    adds = [rank(s) for s in difference.steps if s.kind is StepKind.ADD]
    removes = [rank(s) for s in difference.steps if s.kind is StepKind.REMOVE]
    assert adds == sorted(adds) and removes == sorted(removes, reverse=True)
    touched = {s.role for s in difference.steps}
    assert not touched & set(difference.unchanged)
    unchanged_roles = {
        r
        for r in ROLES
        if Counter(i.launch for i in old if i.role == r) == Counter(i.launch for i in new if i.role == r)
        and any(i.role == r for i in old)
    }
    assert set(difference.unchanged) == unchanged_roles


# ---- the application, against a recording backend -----------------------------------------------------


class Recording(Backend):
    """A backend that makes each change in memory and records it; `refuse`: the changes it cannot make."""

    name = "fake"
    capabilities = frozenset({Capability.CHANGES, Capability.RELAUNCH})  # its restart starts the new launch

    def __init__(self, names, refuse=(), fail=()):
        self.instances = set(names)
        self.calls: list[tuple[str, str]] = []
        self.refuse, self.fail = set(refuse), set(fail)
        self.added = 0
        self.relaunched: list[bool] = []

    def _call(self, method: str, arg: str) -> None:
        self.calls.append((method, arg))
        if method in self.refuse:
            raise NotSupported(f"{method} of {arg}: not on this backend", fix="do it by hand")
        if (method, arg) in self.fail:
            raise RuntimeFailure(f"{arg} did not get ready")

    def change(self, run_dir, change, say=print):
        match change:
            case AddInstance(role=role):
                self._call("add", role)
                self.added += 1
                self.instances.add(f"{role}-new{self.added}")
            case RemoveInstance(instance=instance):
                self._call("remove", instance)
                self.instances.remove(instance)
            case RestartInstance(instance=instance, relaunch=relaunch):
                self.restart(instance)
                self.relaunched.append(relaunch)  # with the adopted file's launch
            case Adopt(file=source, sets=sets):
                self.adopted = (source, sets)
        return {}

    def restart(self, instance):
        self._call("restart", instance)


def changes_of(**made):
    """A LocalBackend.change that makes each kind of change by the function given for it (`add`, `remove`,
    `restart`, `adopt`: each takes the change), and records the others as made."""

    def change(self, run_dir, change, say=print):
        made_by = made.get(change.op)
        return (made_by(change) if made_by else None) or {}

    return change


def _steps_for_everything():
    record, _ = running(*DECODE_2)
    sets = ("roles.encoder.replicas=2", "roles.encoder.tp=1", "roles.prefill.mem_fraction=0.7")
    return record, against(record, *sets, "roles.router.args=[--policy, round_robin]")


def test_the_steps_are_made_in_order_and_unchanged_roles_untouched(tmp_path):
    record, difference = _steps_for_everything()
    backend = Recording(r.name for r in record.roles)
    said: list[str] = []
    execute(difference, backend, RunDir(tmp_path / "x"), said.append, lambda: set(backend.instances))
    assert backend.calls == [
        ("add", "encoder"),
        ("restart", "encoder"),
        ("restart", "prefill"),
        ("restart", "decode-0"),  # back to TP 4
        ("remove", "decode-1"),
        ("restart", "router"),
    ]
    assert backend.relaunched == [True] * 4  # each with the launch the file gives it now
    assert said[0].startswith("[1/6] start encoder-1") and said[-1] == "x: applied (6 steps)"


def test_a_refusal_undoes_what_this_up_added_and_says_nothing_changed(tmp_path):
    record, difference = _steps_for_everything()
    backend = Recording((r.name for r in record.roles), refuse={"restart"})
    before = set(backend.instances)
    with pytest.raises(NotSupported) as refused:
        execute(difference, backend, RunDir(tmp_path / "x"), lambda _: None, lambda: set(backend.instances))
    assert backend.instances == before  # the encoder it added is removed again
    assert backend.calls == [("add", "encoder"), ("restart", "encoder"), ("remove", "encoder-new1")]
    assert "nothing was changed" in str(refused.value) and refused.value.fix == "do it by hand"


def test_a_refusal_on_the_first_step_touches_nothing(tmp_path):
    record, difference = _steps_for_everything()
    backend = Recording((r.name for r in record.roles), refuse={"add", "remove", "restart"})
    with pytest.raises(NotSupported, match="nothing was changed"):
        execute(difference, backend, RunDir(tmp_path / "x"), lambda _: None, lambda: set(backend.instances))
    assert backend.calls == [("add", "encoder")]


def test_a_failed_step_stops_there_undoes_what_it_added_and_says_what_stays_applied(tmp_path):
    record, difference = _steps_for_everything()
    backend = Recording((r.name for r in record.roles), fail={("restart", "prefill")})
    before = set(backend.instances)
    with pytest.raises(RuntimeFailure) as failed:
        execute(difference, backend, RunDir(tmp_path / "x"), lambda _: None, lambda: set(backend.instances))
    assert "step 3 failed: prefill did not get ready" in str(failed.value)
    assert (
        "undone: add encoder-1; left applied: roll encoder; not applied: roll prefill, roll decode-0, "
        "remove decode-1, restart-router router"
    ) in str(failed.value)
    assert backend.instances == before  # no instance half added
    assert ("restart", "router") not in backend.calls


# ---- the command --------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home; a test here that would start anything fails instead (none may)."""

    def no_start(*args, **kwargs):
        raise AssertionError("up started a deployment")

    monkeypatch.setattr("muse_launch.local.local_backend.LocalBackend.bring_up", no_start)
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _ready(record):
    """Every role ready and wired."""
    return replace(
        record,
        roles=tuple(
            replace(r, state=RoleState.READY, wiring=tuple((k, want, want) for k, _, want in r.wiring))
            for r in record.roles
        ),
    )


def _supervised(record):
    """As a live supervisor writes it: this test process stands in for the supervisor."""
    return replace(record, supervisor=ProcessRef.of(os.getpid()))


def _write_running(*sets: str) -> None:
    record, _ = running(*sets)
    record = _supervised(record)
    write_state(
        RunDir.of(record.name),
        _ready(record),
    )


def test_dry_run_without_a_deployment_says_what_up_would_start(home):
    ran = muse("up", EPD, "--rehearse", "--dry-run", "--set", FAST, "--set", SMALL)
    assert ran.returncode == 0, ran.stderr
    assert (
        ran.stdout.splitlines()[0] == "epd-b300 is not running; `up` would start 4 instances, in this order:"
    )
    assert "  + router (router, sglang-router, http://127.0.0.1:8000)" in ran.stdout
    assert not home.exists() or not any(home.iterdir())  # nothing started, nothing written


def test_dry_run_of_a_running_deployment_prints_the_difference_and_changes_nothing(home):
    _write_running()
    state = (home / "epd-b300" / "state.json").read_bytes()
    ran = muse(
        "up",
        EPD,
        "--rehearse",
        "--dry-run",
        "--set",
        FAST,
        "--set",
        SMALL,
        "--set",
        "roles.decode.mem_fraction=0.7",
    )
    assert ran.returncode == 0, ran.stderr
    assert "epd-b300: running; topologies/epd-b300.yaml changes it (1 steps):" in ran.stdout
    assert "  ~ decode: args --mem-fraction-static 0.75 -> 0.7 (rolled, one instance at a time)" in ran.stdout
    assert "--dry-run: nothing was changed" in ran.stdout
    assert (home / "epd-b300" / "state.json").read_bytes() == state


def _lease(monkeypatch) -> list[bool]:
    """The supervisor's lease, faked as its other requests are here: what `up` ends it with (commit or not)
    is recorded."""
    from contextlib import contextmanager

    from muse_launch.supervise.requests import Held

    ended: list[bool] = []

    @contextmanager
    def held(self, run_dir, what, say=print):
        lease = Held()
        try:
            yield lease
        finally:
            ended.append(lease.commit)

    monkeypatch.setattr("muse_launch.local.local_backend.LocalBackend.held", held)
    return ended


def test_up_of_a_running_deployment_says_cleanly_what_the_backend_cannot_do(home, monkeypatch):
    def refuse(change):
        raise NotSupported(
            f"restarting {change.instance} alone is not supported on this host yet", fix="down, then up"
        )

    monkeypatch.setattr("muse_launch.local.local_backend.LocalBackend.change", changes_of(restart=refuse))
    ended = _lease(monkeypatch)
    _write_running()
    state = (home / "epd-b300" / "state.json").read_bytes()
    ran = muse(
        "up", EPD, "--rehearse", "--set", FAST, "--set", SMALL, "--set", "roles.decode.mem_fraction=0.7"
    )
    assert ran.returncode == 1
    assert "Traceback" not in ran.stdout + ran.stderr
    assert "error: restarting decode alone is not supported on this host yet (nothing was changed)" in (
        ran.stderr
    )
    assert "  fix: down, then up" in ran.stderr
    assert (home / "epd-b300" / "state.json").read_bytes() == state
    assert ended == [False]  # refused, nothing changed: the file it adopted does not stand


def test_up_of_an_unchanged_running_file_does_nothing(home):
    _write_running()
    ran = muse("up", EPD, "--rehearse", "--set", FAST, "--set", SMALL)
    assert ran.returncode == 0 and "changes nothing of it; nothing to do" in ran.stdout


def test_a_rehearsal_is_not_changed_into_real_engines(home):
    _write_running()
    ran = muse("up", EPD, "--dry-run", "--no-engine-check", "--set", FAST, "--set", SMALL)
    assert ran.returncode == 2
    assert "epd-b300 runs a rehearsal (--rehearse); this `up` would replace every engine of it" in ran.stderr


def test_dry_run_and_only_do_not_mix(home):
    ran = muse("up", EPD, "--rehearse", "--dry-run", "--only", "decode")
    assert ran.returncode == 2 and "--dry-run shows the difference of the whole file" in ran.stderr


def test_a_damaged_state_of_a_stopped_deployment_is_left_to_up(home):
    (home / "epd-b300").mkdir(parents=True)
    (home / "epd-b300" / "state.json").write_text('{"name": "epd-b300", "roles": 3}')
    ran = muse("up", EPD, "--rehearse", "--dry-run", "--set", FAST, "--set", SMALL)
    assert ran.returncode == 0, ran.stderr
    assert "epd-b300 is not running; `up` would start 4 instances" in ran.stdout


def test_a_deployment_still_starting_is_not_changed(home, monkeypatch):
    record, _ = running()
    starting = replace(record, roles=tuple(replace(r, state=RoleState.STARTING) for r in record.roles))
    write_state(RunDir.of(record.name), _supervised(starting))
    called = []
    monkeypatch.setattr(
        "muse_launch.local.local_backend.LocalBackend.change", lambda self, *a, **k: called.append(a)
    )
    ran = muse(
        "up", EPD, "--rehearse", "--set", FAST, "--set", SMALL, "--set", "roles.decode.mem_fraction=0.7"
    )
    assert ran.returncode == 1 and "epd-b300 is starting: nothing was changed" in ran.stderr
    assert called == []


def test_a_recorded_role_name_with_a_control_character_is_damage(tmp_path):
    from muse_launch.rundir.state import StateDamaged

    record, _ = running()
    run_dir = RunDir(tmp_path / "epd-b300")
    write_state(run_dir, record)
    data = run_dir.state_file.read_text().replace('"role": "decode"', '"role": "dec\\u001bode"')
    run_dir.state_file.write_text(data)
    with pytest.raises(StateDamaged, match="role name holds a control character"):
        read_state(run_dir)


def test_what_a_backend_says_goes_out_with_the_files_secrets_hidden(tmp_path):
    record, difference = _steps_for_everything()

    class Leaky(Recording):
        def restart(self, instance):
            raise NotSupported(f"token s3cr3t refused for {instance}", fix="give s3cr3t again")

    backend = Leaky(r.name for r in record.roles)
    said: list[str] = []
    with pytest.raises(NotSupported) as refused:
        execute(
            difference,
            backend,
            RunDir(tmp_path / "x"),
            said.append,
            lambda: set(backend.instances),
            redact=lambda text: text.replace("s3cr3t", "***"),
        )
    assert "s3cr3t" not in str(refused.value) + refused.value.fix + "".join(said)
    assert "token *** refused for encoder (nothing was changed)" == str(refused.value)


def test_a_deployment_no_supervisor_watches_is_left_to_up(home, monkeypatch):
    started = []
    monkeypatch.setattr(
        "muse_launch.local.local_backend.LocalBackend.bring_up",
        lambda self, *a: started.append(a[0].plan.name) or 0,
    )
    record, _ = running()
    write_state(
        RunDir.of(record.name),
        _ready(record),
    )
    ran = muse("up", EPD, "--rehearse", "--set", FAST, "--set", SMALL)  # as before: up's own checks decide
    assert ran.returncode == 0 and started == ["epd-b300"]  # (they refuse what an earlier run left alive)
    dry = muse("up", EPD, "--rehearse", "--dry-run", "--set", FAST, "--set", SMALL)
    assert dry.returncode == 0 and started == ["epd-b300"]
    assert (
        "epd-b300: no supervisor watches it; `up` starts it afresh once what is left of it stops"
        in dry.stdout
    )


def test_a_failed_instance_of_an_unchanged_role_is_started_again():
    record, _ = running()
    failed = record.with_role(replace(record.role("decode"), state=RoleState.FAILED, reason="exit 1"))
    difference = against(failed)
    assert [(s.kind, s.instance) for s in difference.steps] == [(StepKind.ROLL, "decode")]
    assert "~ decode: not running (failed: exit 1) (rolled, one instance at a time)" in difference_lines(
        difference
    )
    assert "decode" not in difference.unchanged


def test_a_new_launch_is_refused_before_anything_where_the_backend_restarts_the_old_one(home, monkeypatch):
    calls = []
    monkeypatch.setattr(
        "muse_launch.local.local_backend.LocalBackend.change", lambda self, *a: calls.append(a)
    )
    # a backend that cannot
    only_changes = frozenset({Capability.CHANGES})
    monkeypatch.setattr("muse_launch.local.local_backend.LocalBackend.capabilities", only_changes)
    _write_running()
    edits = ("roles.decode.mem_fraction=0.7", "roles.encoder.replicas=2", "roles.encoder.tp=1")
    ran = muse(
        "up", EPD, "--rehearse", "--set", FAST, "--set", SMALL, *[x for e in edits for x in ("--set", e)]
    )
    assert ran.returncode == 1 and calls == []
    assert (
        "error: epd-b300: a new launch of encoder, decode: not made while it runs on local (its restart "
        "starts the launch an instance already runs); nothing was changed"
    ) in ran.stderr
    assert "a change of replicas alone (the file's other changes undone) is made while it runs" in ran.stderr


def test_replicas_alone_are_applied_through_the_backend(home, monkeypatch):
    calls = []
    monkeypatch.setattr(
        "muse_launch.local.local_backend.LocalBackend.change",
        changes_of(
            add=lambda change: calls.append(change.role) or {"instance": "decode-1"},
            adopt=lambda change: calls.append("adopt"),
        ),
    )
    ended = _lease(monkeypatch)
    two = ("roles.decode.gpus=[4, 5]", "roles.decode.tp=2", "roles.decode.ep=2")
    _write_running(*two)
    edited = ("roles.decode.gpus=[4, 5, 6, 7]", "roles.decode.replicas=2", *two[1:])
    ran = muse(
        "up", EPD, "--rehearse", "--set", FAST, "--set", SMALL, *[x for e in edited for x in ("--set", e)]
    )
    assert ran.returncode == 0, ran.stderr
    assert calls == ["adopt", "decode"]  # the edited file first: the new instance is placed by it
    assert "  + decode-1 (replicas 1 -> 2)" in ran.stdout
    assert (
        "[1/1] start decode-1 (decode), wait until it is ready, then register it with its router"
        in ran.stdout
    )
    assert ran.stdout.rstrip().endswith("epd-b300: applied (1 steps)")
    assert ended == [True]  # applied: the adopted file stands


def test_a_refusal_after_a_removal_adds_an_instance_back(tmp_path):
    record, _ = running(*DECODE_2)
    one = ("roles.decode.replicas=1", "roles.decode.gpus=[4, 5]", "roles.router.args=[--policy, random]")
    difference = against(record, *DECODE_2[1:], *one)  # decode-0 runs on as it is
    assert [(s.kind, s.instance) for s in difference.steps] == [
        (StepKind.REMOVE, "decode-1"),
        (StepKind.RESTART_ROUTER, "router"),
    ]
    backend = Recording((r.name for r in record.roles), refuse={"restart"})
    before = len(backend.instances)
    with pytest.raises(NotSupported, match="nothing was changed"):
        execute(difference, backend, RunDir(tmp_path / "x"), lambda _: None, lambda: set(backend.instances))
    assert backend.calls == [("remove", "decode-1"), ("restart", "router"), ("add", "decode")]
    assert len(backend.instances) == before


def test_up_of_a_running_deployment_hands_its_supervisor_the_env_values_it_read(home, monkeypatch):
    """A changed `${env:...}` secret is the change: the supervisor must relaunch with the value this `up`
    read, not the one it was started with, so `up` hands it those values (and no other variable)."""
    seen = {}
    monkeypatch.setattr(
        "muse_launch.local.local_backend.LocalBackend.change",
        changes_of(adopt=lambda change: seen.update(change.environ)),
    )
    _lease(monkeypatch)
    secret = ("roles.decode.env.DECODE_TOKEN=${env:DECODE_TOKEN}",)
    monkeypatch.setenv("DECODE_TOKEN", "first-value-1")
    _write_running(*secret)
    monkeypatch.setenv("DECODE_TOKEN", "second-value-2")
    monkeypatch.setenv("UNRELATED_SECRET", "not-for-the-supervisor")
    ran = muse("up", EPD, "--rehearse", "--set", FAST, "--set", SMALL, "--set", secret[0])
    assert ran.returncode == 0, ran.stderr
    assert seen == {"DECODE_TOKEN": "second-value-2"}
    assert "  ~ decode: a secret value changed (not shown) (rolled, one instance at a time)" in ran.stdout
    assert "unchanged, not touched: encoder, prefill, router" in ran.stdout  # prefill shares the env by alias
    assert "second-value-2" not in ran.stdout + ran.stderr


@pytest.mark.parametrize(
    "env",
    [
        '["DECODE_TOKEN"]',
        '{"1BAD": "x"}',
        '{"A B": "x"}',
        '{"TOKEN": 1}',
        '{"TOKEN": "a\\u0000b"}',
        "not json",
    ],
)
def test_the_supervisor_refuses_an_environment_that_is_not_names_to_strings(env):
    from muse_launch.errors import UsageError

    with pytest.raises(UsageError, match="environment"):  # refused before it reaches a supervisor
        from_wire("adopt", {"file": "/a/file.yaml", "sets": "[]", "env": env})


ENCODER2 = (
    "roles.encoder2={kind: encoder, gpus: [2, 3], tp: 2, port: 30011, "
    "encoder_transfer_backend: zmq_to_tokenizer}",
    "roles.prefill.encoders=[encoder, encoder2]",
    "roles.decode.encoders=[encoder, encoder2]",
)


def test_a_second_encoder_role_rolls_the_language_workers_that_list_it():
    """Their own launch is the same; their encoder list (on their command line) is not: each is rolled after
    the new encoder starts, and the router is left alone."""
    record, _ = running()
    difference = against(record, *ENCODER2)
    assert [(s.kind.value, s.instance) for s in difference.steps] == [
        ("add", "encoder2"),
        ("roll", "prefill"),
        ("roll", "decode"),
    ]
    assert difference.steps[1].changes == (
        "encoders http://127.0.0.1:30010 -> http://127.0.0.1:30010 http://127.0.0.1:30011",
    )
    assert difference.unchanged == ("encoder", "router")


def test_dropping_that_encoder_role_rolls_them_first_then_stops_it():
    record, _ = running(*ENCODER2)
    difference = against(record)
    assert [(s.kind.value, s.instance) for s in difference.steps] == [
        ("roll", "prefill"),
        ("roll", "decode"),
        ("remove", "encoder2"),
    ]


def test_a_peer_list_alone_changes_no_launch_where_no_encoder_role_comes_or_goes():
    record, _ = running("roles.decode.gpus=[4, 5]", "roles.decode.tp=2", "roles.decode.ep=2")
    difference = against(
        record,
        "roles.decode.gpus=[4, 5, 6, 7]",
        "roles.decode.replicas=2",
        "roles.decode.tp=2",
        "roles.decode.ep=2",
    )
    assert [(s.kind.value, s.instance) for s in difference.steps] == [("add", "decode-1")]  # the router's
    # --decode list grows; it takes decode-1 at run time


def test_the_supervisor_refuses_a_file_that_changed_after_up_printed_its_difference():
    """`up` prints the difference of the bytes it read; the supervisor reads the path again. Edited in
    between, it would apply a difference nobody saw: refused, nothing changed."""
    from muse_launch.errors import RuntimeFailure as Failure
    from muse_launch.supervise.change_executor import Changes, Placement

    def never(*_):
        raise AssertionError("nothing is planned from a file refused")

    edited = Placement(never, never, sha256="b" * 64)
    first = Placement(never, never, reload=lambda source, sets, environ: edited, sha256="a" * 64)
    changes = Changes(None, first, None)
    with pytest.raises(Failure, match="changed while `up` ran"):
        changes.adopt(Adopt("/a/file.yaml", sha256="a" * 64), print)
    assert changes.placement is first


def test_a_loaded_file_carries_the_digest_of_the_bytes_read(tmp_path):
    import hashlib

    from muse_launch.topology.load import load_topology

    raw = open(EPD, "rb").read()
    assert load_topology(EPD, environ={}).sha256 == hashlib.sha256(raw).hexdigest()
