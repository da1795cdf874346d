"""`up --on slurm --rehearse` on a real SLURM cluster on this machine (scripts/slurm_local.sh:
munged, slurmctld and three slurmd fake nodes at their own addresses, fake GPUs), through the
real CLI: ready, smoke through the router, status with each role's node, down, and nothing left
(no job or step listed by SLURM, no process, no port). Then the faults: a role crashing at start,
the batch supervisor killed, the job cancelled by hand.

The cluster starts once for this module, in the network namespace pytest runs in (so under the
suite's `unshare -n` its daemons and the roles see the same loopback and node addresses).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from harness import REPO, ROUTER, Deployment, wait_for
from rehearsal import READY_AFTER, tails

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

SCRIPT = REPO / "scripts" / "slurm_local.sh"
PD_TWO_NODES = REPO / "topologies" / "helion-gb300.yaml"  # prefill on tray0, decode on tray1, router


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    where = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(
        ["bash", str(SCRIPT), "start", str(where / "c")], capture_output=True, text=True, timeout=180
    )
    assert start.returncode == 0, f"slurm_local.sh start:\n{start.stdout}{start.stderr}"
    assert len(cluster_processes(where / "c")) >= 5  # munged, slurmctld, three slurmd: what stop must end
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(where / "c" / "slurm.conf")
    try:
        yield where / "c"
    finally:
        stop = subprocess.run(
            ["bash", str(SCRIPT), "stop", str(where / "c")], capture_output=True, text=True, timeout=120
        )
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        assert stop.returncode == 0, stop.stderr
        assert not (where / "c").exists(), "stop leaves the cluster's directory"
        assert not cluster_processes(where / "c"), f"stop leaves daemons: {cluster_processes(where / 'c')}"


def cluster_processes(directory: Path) -> list[str]:
    """The daemons (and the slurmstepd they forked) carry the script's mark in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.environ().get("MUSE_SLURM_LOCAL") == str(directory)
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(f"pid {proc.pid} {' '.join(proc.cmdline())}")
        except psutil.Error:
            continue
    return found


def squeue(*args: str) -> list[str]:
    out = subprocess.run(["squeue", "--noheader", *args], capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line.strip()]


def job_id(d: Deployment) -> str:
    return json.loads((d.run_dir / "slurm" / "job.json").read_text())["job_id"]


def listening(d: Deployment) -> list[str]:
    state = json.loads((d.run_dir / "state.json").read_text())
    out = []
    for role in state["roles"]:
        for kind, port in role["ports"].items():
            try:
                socket.create_connection((role["probe_host"], port), timeout=0.3).close()
                out.append(f"{role['name']} {kind} {role['probe_host']}:{port}")
            except OSError:
                pass
    return out


def assert_nothing_left(d: Deployment, job: str) -> None:
    assert squeue("--jobs", job, "--states", "all", "--format", "%i %T", "--steps") == [], (
        "steps still listed"
    )
    assert not [line for line in squeue("--jobs", job, "--format", "%i %T")], "job still listed"
    assert not d.alive(), f"alive after down: {[p.cmdline() for p in d.alive()]}"
    assert not listening(d), listening(d)


def cancel_and_kill(d: Deployment) -> None:
    """A test's last word, whatever it asserted: its job cancelled, anything of it still alive killed."""
    if (d.run_dir / "slurm" / "job.json").exists():
        subprocess.run(["scancel", job_id(d)], timeout=30)
    d.kill_leftovers()


def up(d: Deployment, path: Path, *extra: str) -> subprocess.CompletedProcess:
    return d.cli("up", path, "--on", "slurm", "--rehearse", "-d", "--set", READY_AFTER, *extra, timeout=180)


def down_clean(d: Deployment, job: str) -> str:
    down = d.cli("down", d.name, timeout=180)
    assert down.returncode == 0, f"down: {down.stdout}{down.stderr}\n{tails(d)}"
    assert_nothing_left(d, job)
    return down.stdout


MULTI_NODE_ENGINES = [
    "h200-bf16-2node",
    "vllm-multinode-tp-b200",
    "vllm-multinode-tp-pp-b200",
    "vllm-multinode-tep-b200",
    "vllm-multinode-dep-b200",
]


@pytest.mark.parametrize("name", [*MULTI_NODE_ENGINES, "helion-gb300", "epd-b300"])
def test_up_smoke_down_on_slurm(cluster: Path, tmp_path: Path, name: str):
    path = REPO / "topologies" / f"{name}.yaml"
    d = Deployment(tmp_path / "home", name)
    d.home.mkdir()
    result = up(d, path)
    try:
        assert result.returncode == 0, f"up: {result.stdout}{result.stderr}\n{tails(d)}"
        job = job_id(d)
        assert f"submitted SLURM job {job}" in result.stdout

        status = d.status()
        assert status["state"] == "ready" and status["slurm"]["state"] == "RUNNING", status
        assert all(r["state"] == "ready" and r["health"] == "ok" for r in status["roles"]), status
        nodes = {r["name"]: r["node"] for r in status["roles"]}
        if name == "helion-gb300":  # prefill and decode on two nodes, the router beside its prefill
            assert nodes["prefill@tray0"] != nodes["decode@tray1"], nodes
            assert nodes["router"] == nodes["prefill@tray0"], nodes
        elif name == "epd-b300":  # a file without nodes: one allocated node, its roles sharing GPUs 0-1
            assert len(set(nodes.values())) == 1, nodes
        else:  # one engine over two nodes: rank 1 meets rank 0 at rank 0's allocated address
            assert len(set(nodes.values())) == 2, nodes
            recorded = {r["name"]: r for r in d.state_file()["roles"]}
            rank0, rank1 = (recorded[n] for n in sorted(nodes))
            assert rank0["probe_host"] != rank1["probe_host"]
            assert any(rank0["probe_host"] in a for a in rank1["argv"]), rank1["argv"]
        steps = {line.split()[1] for line in squeue("--steps", "--jobs", job, "--format", "%i %j")}
        assert set(nodes) <= steps, steps  # every role a named step

        submitted = (d.run_dir / "slurm" / "job.sbatch").read_text()
        planned = d.cli("plan", path, "--format", "sbatch", "--rehearse", "--set", READY_AFTER)
        assert planned.stdout == submitted + "\n" or planned.stdout == submitted, (
            "plan --format sbatch differs"
        )

        smoke = d.cli("smoke", name, "--timeout", "60", timeout=120)
        assert smoke.returncode == 0, f"smoke: {smoke.stdout}{smoke.stderr}\n{tails(d)}"
        assert "ok   chat" in smoke.stdout

        logs = d.cli("logs", name, "-n", "5")
        assert logs.returncode == 0 and all(n in logs.stdout for n in nodes), logs.stdout
        down_clean(d, job)
        assert d.status()["state"] == "stopped"
    finally:
        cancel_and_kill(d)


def test_a_role_crashing_at_start_fails_up_and_leaves_nothing(cluster: Path, tmp_path: Path, monkeypatch):
    """Its last log lines are shown, with the `${env:...}` secret it printed hidden."""
    d = Deployment(tmp_path / "home", "helion-gb300")
    d.home.mkdir()
    monkeypatch.setenv("ROUTER_TOKEN", SECRET := "tok-4Rt7-slurm-secret")
    result = up(
        d,
        PD_TWO_NODES,
        "--set",
        "roles.router.env.ROUTER_TOKEN=${env:ROUTER_TOKEN}",
        "--set",
        'roles.router.launcher=[sh, -c, "echo router cannot start with $ROUTER_TOKEN; exit 3"]',
    )
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "role router failed" in result.stdout, result.stdout
        assert "router | router cannot start with ***" in result.stdout, result.stdout
        assert SECRET not in result.stdout + result.stderr
        assert "nothing of it is left" in result.stdout
        assert_nothing_left(d, job_id(d))
    finally:
        d.kill_leftovers()


def pd_two_nodes_up(tmp_path: Path) -> Deployment:
    """helion-gb300 (prefill and decode on two nodes, the router beside the prefill) up on the cluster."""
    d = Deployment(tmp_path / "home", "helion-gb300")
    d.home.mkdir()
    result = up(d, PD_TWO_NODES)
    if result.returncode != 0:
        d.kill_leftovers()
        raise AssertionError(f"up: {result.stdout}{result.stderr}\n{tails(d)}")
    return d


def test_supervisor_killed_then_down_stops_the_steps(cluster: Path, tmp_path: Path):
    d = pd_two_nodes_up(tmp_path)
    try:
        job = job_id(d)
        supervisor = d.state_file()["supervisor_pid"]
        os.kill(supervisor, signal.SIGKILL)  # the local cluster's batch host is this machine
        wait_for(
            lambda: (
                not psutil.pid_exists(supervisor)
                or psutil.Process(supervisor).status() == psutil.STATUS_ZOMBIE
            ),
            timeout=10,
        )
        status = wait_for(lambda: (s := d.status())["supervisor_pid"] is None and s, timeout=15)
        assert status["slurm"]["state"] == "RUNNING", status  # the allocation and its roles stay for `down`
        assert all(r["health"] == "ok" for r in status["roles"]), status
        out = down_clean(d, job)
        assert "no supervisor was running" in out, out
        assert "router" in out and "prefill@tray0" in out
    finally:
        cancel_and_kill(d)


def test_scancel_by_hand_then_status_and_down(cluster: Path, tmp_path: Path):
    d = pd_two_nodes_up(tmp_path)
    try:
        job = job_id(d)
        subprocess.run(["scancel", job], check=True, timeout=30)
        status = wait_for(lambda: (s := d.status())["slurm"]["state"] != "RUNNING" and s, timeout=60)
        wait_for(lambda: not squeue("--jobs", job, "--format", "%i"), timeout=60)
        status = d.status()
        assert status["state"] == "cancelled", status
        assert not any(r["state"] == "ready" for r in status["roles"]), status
        out = down_clean(d, job)
        assert "already ended" in out, out
    finally:
        d.kill_leftovers()


def test_a_role_dying_after_ready_comes_back_as_a_new_step(cluster: Path, tmp_path: Path):
    d = pd_two_nodes_up(tmp_path)
    try:
        job = job_id(d)

        def decode_step() -> str | None:
            return next(
                (
                    line.split()[0]
                    for line in squeue("--steps", "--jobs", job, "--format", "%i %j")
                    if line.split()[1] == "decode@tray1"
                ),
                None,
            )

        before = decode_step()
        engine = [
            p
            for p in d.alive()
            if "muse_launch.sim" in " ".join(p.cmdline())
            and p.environ().get("MUSE_LAUNCH_ROLE") == "decode@tray1"
            and "srun" not in p.cmdline()[0]
        ]
        assert engine, "the decode engine is not running on this machine"
        for proc in engine:
            proc.kill()
        wait_for(
            lambda: (
                (r := d.role("decode@tray1"))["restarts"] == 1
                and r["state"] == "ready"
                and r["health"] == "ok"
            ),
            timeout=30,
        )
        assert decode_step() not in (None, before)
        smoke = d.cli("smoke", d.name, "--timeout", "60", timeout=120)
        assert smoke.returncode == 0, smoke.stdout
        down_clean(d, job)
    finally:
        cancel_and_kill(d)


@pytest.mark.faults("10. a role flooding its log on SLURM: the batch supervisor caps it too")
def test_a_role_log_is_capped_on_slurm(cluster: Path, tmp_path: Path):
    """The router writes 2 MB as it starts (through its srun client, into the run directory on the batch
    host);
    with `logs: {max_size: 64KiB, keep: 1}` the batch supervisor rotates it as `up` on one host does."""
    d = Deployment(tmp_path / "home", "helion-gb300")
    d.home.mkdir()
    flood = (
        f'roles.router.launcher=[sh, -c, "yes muse-launch-flood | head -c 2000000; exec \\"$0\\" \\"$@\\"",'
        f" {ROUTER}, launch]"
    )
    result = up(d, PD_TWO_NODES, "--set", "logs={max_size: 64KiB, keep: 1}", "--set", flood)
    try:
        assert result.returncode == 0, f"up: {result.stdout}{result.stderr}\n{tails(d)}"
        log = d.run_dir / "logs" / "router.log"
        wait_for(
            lambda: log.with_name("router.log.1").exists() and log.stat().st_size < 64 * 1024, timeout=10
        )
        with open(log.with_name("router.log.1"), "rb") as rotated:
            assert b"muse-launch-flood" in rotated.read(4096)
        assert not log.with_name("router.log.2").exists()  # keep: 1
        down_clean(d, job_id(d))
    finally:
        cancel_and_kill(d)


def ignoring_ctrl_c() -> None:
    """A preexec_fn: the child starts with SIGINT ignored and blocked, as a careless parent leaves it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def test_up_in_the_foreground_streams_until_ctrl_c_then_leaves_nothing(cluster: Path, tmp_path: Path):
    """Started with SIGINT ignored and blocked by its parent: Ctrl-C stops it all the same (it used to
    put back the ignored SIGINT it found before it streamed the logs, and never stopped)."""
    d = Deployment(tmp_path / "home", "h200-bf16-2node")
    d.home.mkdir()
    argv = [
        sys.executable,
        "-m",
        "muse_launch",
        "up",
        REPO / "topologies" / "h200-bf16-2node.yaml",
        "--on",
        "slurm",
        "--rehearse",
        "--set",
        READY_AFTER,
    ]
    up_process = subprocess.Popen(
        argv,
        env=d.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignoring_ctrl_c,
    )
    try:
        seen: list[str] = []
        wait_for(
            lambda: (
                seen.append(up_process.stdout.readline()) or "Ctrl-C stops it" in seen[-1] or not seen[-1]
            ),
            timeout=300,
        )
        assert "Ctrl-C stops it" in seen[-1], "".join(seen)
        job = job_id(d)
        assert d.status()["state"] == "ready"
        up_process.send_signal(signal.SIGINT)
        out, _ = up_process.communicate(timeout=300)  # read on: a full pipe must not hold it
        assert up_process.returncode == 130, "".join(seen) + out
        assert_nothing_left(d, job)
    finally:
        if up_process.poll() is None:
            up_process.kill()
        cancel_and_kill(d)


@pytest.mark.bench
def test_sweep_on_slurm_benches_each_combination_as_a_job(cluster: Path, tmp_path: Path):
    """`sweep --on slurm`: each combination is one SLURM job, benched through its router with the real aiperf
    and taken down; nothing of any of them is left."""
    d = Deployment(tmp_path / "home", "helion-gb300")
    d.home.mkdir()
    out = tmp_path / "sweep"
    args = ["sweep", PD_TWO_NODES, "--rehearse", "--on", "slurm", "--set", READY_AFTER]
    args += ["--vary", "rehearse.itl_ms=1,4", "--concurrency", "2", "--requests", "6"]
    args += ["--isl", "64", "--osl", "16", "--duration", "60", "--out", out]
    try:
        r = d.cli(*args, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        sweep = json.loads((out / "sweep.json").read_text())
        assert [x["state"] for x in sweep["results"]] == ["valid", "valid"], sweep
        for itl in (1, 4):
            summary = json.loads((out / f"itl_ms={itl}" / "summary.json").read_text())
            assert summary["valid"] and summary["points"][0]["requests_ok"] == 6, summary
        assert (out / "compare" / "report.html").is_file()
        assert_nothing_left(d, job_id(d))
    finally:
        cancel_and_kill(d)
