"""`up --on k8s --rehearse` against the real control plane (the session's `k8s_cluster`): the real LWS / RBG
controllers make the pods, the real scheduler places them on the fake GPU nodes, and the node agent runs them
(simulated engines behind the real router, each pod's DNS name mapped to its address, probes reported as pod
status, pods/log served). Then what a user does: status, logs, ls, smoke through the router's Service, down,
and nothing left: no pod, no process. Also: a pod no node fits is named with the scheduler's reason, and a
missing Secret stops `up` before anything is applied."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.k8s]

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"HF_TOKEN": "hf-secret-value-1234", "MODEL_ALIAS": "alias-5678"}


@pytest.fixture
def ml(k8s_cluster, tmp_path):
    env = k8s_cluster.env(MUSE_LAUNCH_HOME=str(tmp_path / "home"), **SECRETS)

    def run(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "muse_launch", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=env,
        )

    run.env = env  # for a command the test starts itself
    yield run


def core(k8s_cluster):
    from muse_launch.k8s.client import connect

    return connect(kubeconfig=str(k8s_cluster.kubeconfig))


def agent_children(k8s_cluster) -> list[str]:
    pid = int((k8s_cluster.dir / "run" / "nodes.pid").read_text().split()[0])
    return [
        " ".join(p.cmdline()[:4])
        for p in psutil.Process(pid).children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def pod_processes(k8s_cluster) -> dict[str, tuple[list[str], dict[str, str]]]:
    """What the agent runs for each pod (its nodes/pods/NS/POD.json): argv as started, and the process's
    env."""
    out = {}
    for info in (k8s_cluster.dir / "nodes" / "pods").glob("*/*.json"):
        data = json.loads(info.read_text())
        out[info.stem] = (data["argv"], psutil.Process(data["pid"]).environ())
    return out


def assert_commands_are_the_plans(plan, roles: list[dict], k8s_cluster) -> None:
    """Each pod runs the plan's argv, with the variables LWS / RBG injected expanded back to the plan's values
    (its DNS names, ranks and group size), and its wildcard bind at the pod's own address."""
    running = pod_processes(k8s_cluster)
    specs = {s.name: s for s in plan.specs}
    for role in roles:
        argv, _ = running[role["pod"]]
        want = [role["ip"] if a == "0.0.0.0" else a for a in specs[role["name"]].argv]
        assert argv == want, role["name"]


def pods(cluster, namespace: str = "default") -> list[str]:
    return [p.metadata.name for p in cluster.core().list_namespaced_pod(namespace).items]


# Both flavours; one and several nodes per role; sglang and vLLM; replicas; the real routers (sglang's,
# vLLM's).
CASES = [
    ("topologies/epd-b300.yaml", "rbg", []),
    ("topologies/epd-b300.yaml", "lws", []),
    ("topologies/h200-bf16-2node.yaml", "lws", []),
    ("topologies/h200-bf16-2node.yaml", "rbg", []),
    ("topologies/pd-b300-low-latency.yaml", "rbg", []),
    ("topologies/vllm-multinode-tp-pp-b200.yaml", "rbg", []),
    ("topologies/vllm-pd-b200.yaml", "lws", ["--image", "router=example.org/vllm-router:0.1.17"]),
    ("tests/data/export/pd-replicas.yaml", "rbg", ["--image", "example.org/muse:1"]),
]


@pytest.mark.parametrize("path,flavour,extra", CASES, ids=[f"{Path(p).stem}-{f}" for p, f, _ in CASES])
def test_up_smoke_down(path, flavour, extra, ml, k8s_cluster):
    from muse_launch.export.names import FLAVOURS
    from muse_launch.export.transform import export_plan

    plan = export_plan(ROOT / path, FLAVOURS[flavour], "default", rehearse="python3").plan
    name, count = plan.name, len(plan.specs)
    cluster = core(k8s_cluster)
    try:
        up = ml("up", path, "--on", "k8s", "--rehearse", "--to", flavour, *extra, "-d")
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"{name}: ready in" in up.stdout
        assert ": ready on gpu-node-" in up.stdout and "s] " in up.stdout  # live progress, role by role

        status = ml("status", name, "--json")
        data = json.loads(status.stdout)
        assert data["on"] == "k8s" and data["ready"] and data["flavour"] == flavour, status.stdout
        assert len(data["roles"]) == count and all(r["state"] == "ready" for r in data["roles"])
        assert all(r["node"].startswith("gpu-node-") and r["ip"].startswith("10.244.") for r in data["roles"])
        assert_commands_are_the_plans(plan, data["roles"], k8s_cluster)

        here = ml("up", path, "--rehearse", "-d")  # the same name on this host: refused while it is up there
        assert here.returncode == 1 and f"deployment {name!r} is up on Kubernetes" in here.stderr, here.stderr

        ls = ml("ls")
        assert name in ls.stdout and f"{count}/{count} ready" in ls.stdout, ls.stdout

        logs = ml("logs", name, "-n", "5")
        assert logs.returncode == 0, logs.stderr
        assert "[muse-sim " in logs.stdout and "ready: GET /health" in logs.stdout, logs.stdout

        smoke = ml("smoke", name)
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert "http://10.244." in smoke.stdout and "ok   chat" in smoke.stdout, smoke.stdout

        down = ml("down", name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"{name}: stopped" in down.stdout
        assert not [p for p in pods(cluster) if p.startswith(name)], "pods left after down"
        assert agent_children(k8s_cluster) == [], "processes left after down"
        assert "no deployment is running" in ml("ls").stdout
    finally:
        ml("down", name)
        cluster.close()


def test_a_pod_no_node_fits_is_named_with_the_schedulers_reason(ml, k8s_cluster):
    """The nodes offer 4 GPUs for this test; each pod of h200-bf16-2node asks for 8."""
    cluster = core(k8s_cluster)
    v1 = cluster.core()
    nodes = [n.metadata.name for n in v1.list_node().items]
    try:
        for n in nodes:
            v1.patch_node_status(
                n, {"status": {"allocatable": {"nvidia.com/gpu": "4"}, "capacity": {"nvidia.com/gpu": "4"}}}
            )
        up = ml("up", "topologies/h200-bf16-2node.yaml", "--on", "k8s", "--rehearse", "-d")
        assert up.returncode == 1, up.stdout + up.stderr
        assert "error: pod h200-bf16-2node-server-0" in up.stdout and "stays Pending" in up.stdout, up.stdout
        assert "Insufficient nvidia.com/gpu" in up.stdout, up.stdout
        assert "deleting what was applied" in up.stdout
        wait_for(lambda: not pods(cluster), timeout=60, interval=0.5)  # the deletion, seen by the API server
    finally:
        for n in nodes:
            v1.patch_node_status(
                n, {"status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}}
            )
        ml("down", "h200-bf16-2node")
        cluster.close()


def test_a_missing_secret_is_named_and_nothing_starts_until_it_exists(ml, k8s_cluster):
    cluster = core(k8s_cluster)
    v1 = cluster.core()
    args = (
        "up",
        "tests/data/export/pd-secrets.yaml",
        "--on",
        "k8s",
        "--rehearse",
        "--image",
        "example.org/muse:1",
        "-d",
    )
    try:
        refused = ml(*args)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "Secret pd-secrets-secrets in namespace default lacks HF_TOKEN, MODEL_ALIAS" in refused.stderr
        assert (
            "kubectl -n default create secret generic pd-secrets-secrets --from-literal=HF_TOKEN=..."
            in refused.stderr
        )
        assert not pods(cluster) and not [
            s for s in v1.list_namespaced_service("default").items if s.metadata.name.startswith("pd-secrets")
        ]
        v1.create_namespaced_secret(
            "default", {"metadata": {"name": "pd-secrets-secrets"}, "stringData": SECRETS}
        )
        up = ml(*args)
        assert up.returncode == 0, up.stdout + up.stderr
        for value in SECRETS.values():  # a secret's value is nowhere in what `up` printed
            assert value not in up.stdout + up.stderr
        running = pod_processes(k8s_cluster)  # the pods got the Secret's values, by reference
        argv, env = next(v for k, v in running.items() if k.startswith("pd-secrets-prefill"))
        assert env["HF_TOKEN"] == SECRETS["HF_TOKEN"] and f"muse-{SECRETS['MODEL_ALIAS']}" in argv
        smoke = ml("smoke", "pd-secrets")
        assert smoke.returncode == 0 and "muse-alias-5678" in smoke.stdout, (
            smoke.stdout
        )  # read from the Secret
        assert ml("down", "pd-secrets").returncode == 0
    finally:
        ml("down", "pd-secrets")
        try:
            v1.delete_namespaced_secret("pd-secrets-secrets", "default")
        except Exception:  # noqa: BLE001  not created: the test failed before
            pass
        cluster.close()


def test_a_crash_looping_pod_is_named_with_its_log_tail(ml, k8s_cluster):
    cluster = core(k8s_cluster)
    try:
        up = ml(
            "up",
            "tests/data/k8s/crash-loop.yaml",
            "--on",
            "k8s",
            "--rehearse",
            "--image",
            "example.org/tool:1",
            "-d",
        )
        assert up.returncode == 1, up.stdout + up.stderr
        assert "error: pod crash-loop-tool-" in up.stdout and "crash-loops" in up.stdout, up.stdout
        assert "boom: the tool gives up" in up.stdout, up.stdout  # its log, read through the API server
        assert "deleting what was applied" in up.stdout
        assert not [p for p in pods(cluster) if p.startswith("crash-loop")]
        assert agent_children(k8s_cluster) == []
    finally:
        ml("down", "crash-loop")
        cluster.close()


def test_logs_follow_streams_a_pods_new_lines_until_ctrl_c(ml, k8s_cluster):
    """`logs -f` on Kubernetes: the last lines, then each line the pod writes after (pods/log?follow), until
    Ctrl-C (exit 0)."""
    import contextlib
    import queue
    import signal
    import threading

    import httpx

    from muse_launch.export.names import FLAVOURS
    from muse_launch.export.transform import export_plan

    path = "topologies/epd-b300.yaml"
    plan = export_plan(ROOT / path, FLAVOURS["lws"], "default", rehearse="python3").plan
    decode = next(s for s in plan.specs if s.kind == "decode")
    try:
        up = ml("up", path, "--on", "k8s", "--rehearse", "--to", "lws", "-d")
        assert up.returncode == 0, up.stdout + up.stderr
        role = next(
            r
            for r in json.loads(ml("status", plan.name, "--json").stdout)["roles"]
            if r["name"] == decode.name
        )
        follow = subprocess.Popen(
            [sys.executable, "-m", "muse_launch", "logs", plan.name, decode.name, "-f", "-n", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=ml.env,
        )
        got: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [got.put(x) for x in follow.stdout], daemon=True).start()
        try:
            first = got.get(timeout=60)
            assert first.startswith(f"{decode.name} |"), first
            url = f"http://{role['ip']}:{decode.ports['http']}/no-such-path"
            seen = [first]
            deadline = time.monotonic() + 60
            while not any("POST /no-such-path 404" in line for line in seen) and time.monotonic() < deadline:
                httpx.post(url, timeout=5)  # the simulated engine logs each request that is not a GET
                with contextlib.suppress(queue.Empty):
                    seen.append(got.get(timeout=2))
            assert any("POST /no-such-path 404" in line for line in seen), "".join(seen)
            follow.send_signal(signal.SIGINT)
            assert follow.wait(timeout=30) == 0, "".join(seen)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()
        down = ml("down", plan.name)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        ml("down", plan.name)


def test_up_in_the_foreground_stays_until_ctrl_c_then_deletes_everything(ml, k8s_cluster):
    """`up --on k8s` without -d: ready, then it waits; Ctrl-C deletes what it applied and waits until no pod
    of it is left (exit 0)."""
    import queue
    import signal
    import threading

    path = "topologies/epd-b300.yaml"
    name = "epd-b300"
    cluster = core(k8s_cluster)
    up = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "up", path, "--on", "k8s", "--rehearse"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=ml.env,
    )
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [got.put(x) for x in up.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any("Ctrl-C deletes it" in line for line in seen) and time.monotonic() < deadline:
            try:
                seen.append(got.get(timeout=5))
            except queue.Empty:
                assert up.poll() is None, "".join(seen)
        assert any(f"{name}: ready in" in line for line in seen), "".join(seen)
        assert [p for p in pods(cluster) if p.startswith(name)], "no pod while it is up"
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=180) == 0, "".join(seen)
        assert not [p for p in pods(cluster) if p.startswith(name)], "pods left after Ctrl-C"
        assert agent_children(k8s_cluster) == [], "processes left after Ctrl-C"
        assert "no deployment is running" in ml("ls").stdout
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        ml("down", name)
        cluster.close()
