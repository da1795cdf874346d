"""`scale` and `restart --rolling` on Kubernetes (the real control plane of scripts/k8s_local.sh: the real LWS
and RBG controllers make the pods, the node agent runs them), each under the same steady load as the host's
live-change tests: 4 concurrent streaming chats through the router's Service, every answer checked
(tests/stand_ins/steady_load.py). No request may fail, and no pod or process may be left after `down`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from harness import wait_for
from steady_load import SteadyLoad

pytestmark = [pytest.mark.integration, pytest.mark.k8s]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-0.6B"
FLAVOURS = ["lws", "rbg"]
IMAGE = ["--image", "example.org/muse:1"]  # a rehearsal runs no image; the cpu profile names none


def topology(tmp_path: Path, name: str) -> Path:
    """One prefill, one decode, sglang-router; the simulated engine at ~25 ms a token (a 24-token stream
    lasts ~0.6 s, so a drain has streams to wait for)."""
    probe = {"http": "/health", "interval": 0.1, "timeout": 120}
    data = {
        "version": 1,
        "name": name,
        "hardware": "cpu",
        "model": MODEL,
        "engine": "sglang",
        "host": "127.0.0.1",
        "rehearse": {"ready_after": 0.5, "itl_ms": 25},
        "roles": {
            "prefill": {"kind": "prefill", "port": 31001, "bootstrap_port": 31002, "ready": probe},
            "decode": {"kind": "decode", "port": 31003, "ready": probe},
            "router": {"kind": "router", "port": 8100, "prefill": ["prefill"], "decode": ["decode"]},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def ml(k8s_cluster, tmp_path):
    env = k8s_cluster.env(MUSE_LAUNCH_HOME=str(tmp_path / "home"))

    def run(*args: object, timeout: float = 400) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "muse_launch", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env=env,
        )

    run.env = env
    return run


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pods_of(k8s_cluster, instance: str) -> list[str]:
    from muse_launch.k8s.client import connect

    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        items = (
            cluster.core()
            .list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={instance}")
            .items
        )
        return sorted(p.metadata.name for p in items)
    finally:
        cluster.close()


def listed(router: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(f"{router}/workers", timeout=5).json()["workers"]}


def served(url: str) -> float:
    """Tokens the worker generated so far, by its own counter."""
    from muse_launch.engines.metrics import SGLANG

    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(SGLANG.generation_tokens))


def started(logs: Path) -> set[str]:
    """The pids of the decode engines whose start line `logs -f` printed."""
    import re

    return set(re.findall(r"start: engine=sglang role=decode .* pid=(\d+)", logs.read_text()))


def status(ml, name: str) -> dict:
    return json.loads(ok(ml("status", name, "--json")))


def down_clean(ml, k8s_cluster, name: str, instance: str) -> None:
    ok(ml("down", name))
    assert pods_of(k8s_cluster, instance) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_scale_decode_1_2_1_under_load_fails_no_request(flavour, ml, k8s_cluster, tmp_path):
    name = f"live-scale-{flavour}"
    instance = name if flavour == "lws" else f"{name}-rbg"
    ok(ml("up", topology(tmp_path, name), "--on", "k8s", "--rehearse", "--to", flavour, *IMAGE, "-d"))
    try:
        entry = next(r for r in status(ml, name)["roles"] if r["name"] == "router")
        router_url = f"http://{entry['ip']}:8100"
        with SteadyLoad(router_url, MODEL) as load:
            load.wait_for(4)
            out = ok(ml("scale", name, "decode", "2"))
            assert "decode: 1 -> 2 instances" in out and "router: registered decode-1 (decode)" in out, out
            roles = {r["name"]: r for r in status(ml, name)["roles"]}
            assert roles["decode-1"]["state"] == "ready", roles
            new_pod = roles["decode-1"]["pod"]
            assert new_pod.endswith("-decode-1") and new_pod in pods_of(k8s_cluster, instance)
            new = [u for u in listed(router_url) if new_pod in u]
            assert len(new) == 1 and listed(router_url)[new[0]]["is_healthy"], listed(router_url)
            new_ip = f"http://{roles['decode-1']['ip']}:31003"
            wait_for(lambda: served(new_ip) > 0, timeout=60)  # it takes traffic
            load.wait_for(8)
            out = ok(ml("scale", name, "decode", "1"))
            assert "router: removed decode-1" in out and "decode-1: drained in" in out, out
            assert not [u for u in listed(router_url) if new_pod in u]
            assert new_pod not in pods_of(k8s_cluster, instance)
            assert sorted(r["name"] for r in status(ml, name)["roles"]) == ["decode", "prefill", "router"]
            load.wait_for(4)
        assert load.failures == [] and load.ok >= 16, load.failures
    finally:
        down_clean(ml, k8s_cluster, name, instance)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rolling_restart_of_prefill_and_decode_fails_no_request(flavour, ml, k8s_cluster, tmp_path):
    name = f"live-roll-{flavour}"
    instance = name if flavour == "lws" else f"{name}-rbg"
    ok(ml("up", topology(tmp_path, name), "--on", "k8s", "--rehearse", "--to", flavour, *IMAGE, "-d"))
    try:
        before = {r["name"]: r for r in status(ml, name)["roles"]}
        router_url = f"http://{before['router']['ip']}:8100"
        with SteadyLoad(router_url, MODEL) as load:
            load.wait_for(4)
            out = ok(ml("restart", name, "prefill", "--rolling"))
            assert "prefill: 1 restarted" in out and "a surge replica serves" in out, out
            load.wait_for(4)
            logs = tmp_path / "logs-f.txt"
            with logs.open("w") as sink:  # `logs -f` follows decode's pod across its restart
                follower = subprocess.Popen(
                    [sys.executable, "-m", "muse_launch", "logs", name, "decode", "-f", "-n", "10000"],
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env=ml.env,
                    cwd=ROOT,
                )
            try:
                wait_for(lambda: started(logs), timeout=60)
                out = ok(ml("restart", name, "decode", "--rolling"))
                assert "decode: 1 restarted" in out, out
                load.wait_for(4)
                # the old pod's engine, the surge's and the new pod's (deleted, made again under its name)
                wait_for(lambda: len(started(logs)) >= 3, timeout=60)
            finally:
                follower.terminate()
                follower.wait(timeout=30)
        assert load.failures == [] and load.ok >= 12, load.failures
        after = {r["name"]: r for r in status(ml, name)["roles"]}
        assert sorted(after) == ["decode", "prefill", "router"]
        for role in ("prefill", "decode"):
            assert after[role]["state"] == "ready" and after[role]["ip"] != before[role]["ip"], after
        assert after["router"]["pod"] == before["router"]["pod"]
        workers = listed(router_url)
        assert len(workers) == 2 and all(w["is_healthy"] for w in workers.values()), workers
    finally:
        down_clean(ml, k8s_cluster, name, instance)


def delete_pod(k8s_cluster, pod: str) -> None:
    from muse_launch.k8s.client import connect

    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        cluster.core().delete_namespaced_pod(pod, "default")
    finally:
        cluster.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_router_pod_deleted_after_a_scale_up_comes_back_with_every_worker(
    flavour, ml, k8s_cluster, tmp_path
):
    name = f"live-router-{flavour}"
    instance = name if flavour == "lws" else f"{name}-rbg"
    ok(ml("up", topology(tmp_path, name), "--on", "k8s", "--rehearse", "--to", flavour, *IMAGE, "-d"))
    try:
        roles = {r["name"]: r for r in status(ml, name)["roles"]}
        router = roles["router"]
        with SteadyLoad(f"http://{router['ip']}:8100", MODEL) as load:
            load.wait_for(4)
            ok(ml("scale", name, "decode", "2"))
            load.wait_for(4)
        assert load.failures == [], load.failures
        delete_pod(k8s_cluster, router["pod"])  # its controller makes it again, on its command-line workers

        def back() -> dict | None:
            now = {r["name"]: r for r in status(ml, name)["roles"]}  # `status` gives it the workers again
            again = now["router"]
            if again["pod"] == router["pod"] and again["ip"] == router["ip"] or again["state"] != "ready":
                return None
            workers = listed(f"http://{again['ip']}:8100")
            return now if len(workers) == 3 and all(w["is_healthy"] for w in workers.values()) else None

        now = wait_for(back, timeout=120)
        new_ip = f"http://{now['decode-1']['ip']}:31003"
        with SteadyLoad(f"http://{now['router']['ip']}:8100", MODEL) as load:  # served again, by both decodes
            before = served(new_ip)
            load.wait_for(8)
            wait_for(lambda: served(new_ip) > before, timeout=60)
        assert load.failures == [], load.failures
    finally:
        down_clean(ml, k8s_cluster, name, instance)


def pod_commands(k8s_cluster, instance: str) -> dict[str, list[str]]:
    """Each pod's container command and args, as the cluster holds them."""
    from muse_launch.k8s.client import connect

    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        pods = (
            cluster.core()
            .list_namespaced_pod("default", label_selector=f"app.kubernetes.io/instance={instance}")
            .items
        )
        return {
            p.metadata.name: [*(p.spec.containers[0].command or ()), *(p.spec.containers[0].args or ())]
            for p in pods
            if p.metadata.deletion_timestamp is None
        }
    finally:
        cluster.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_up_of_an_edited_mem_fraction_relaunches_pod_by_pod_failing_no_request(
    flavour, ml, k8s_cluster, tmp_path
):
    name = f"live-edit-{flavour}"
    instance = name if flavour == "lws" else f"{name}-rbg"
    path = topology(tmp_path, name)
    ok(ml("up", path, "--on", "k8s", "--rehearse", "--to", flavour, *IMAGE, "-d"))
    try:
        before = {r["name"]: r for r in status(ml, name)["roles"]}
        router_url = f"http://{before['router']['ip']}:8100"
        data = json.loads(path.read_text())
        for role in ("prefill", "decode"):
            data["roles"][role]["mem_fraction"] = 0.71
        path.write_text(json.dumps(data))  # the file edited in place
        with SteadyLoad(router_url, MODEL) as load:
            load.wait_for(4)
            out = ok(ml("up", path, "--on", "k8s", "--rehearse", *IMAGE))
            assert "applied (2 steps)" in out, out
            assert "router: removed prefill" in out and "router: removed decode" in out, out
            load.wait_for(4)
        assert load.failures == [] and load.ok >= 8, load.failures
        commands = pod_commands(k8s_cluster, instance)
        workers = [p for p in commands if p.endswith(("-prefill-0", "-decode-0"))]
        assert len(workers) == 2, commands
        for pod in workers:
            assert "--mem-fraction-static" in commands[pod], commands[pod]
            assert commands[pod][commands[pod].index("--mem-fraction-static") + 1] == "0.71", commands[pod]
        after = {r["name"]: r for r in status(ml, name)["roles"]}
        assert sorted(after) == ["decode", "prefill", "router"], after
        for role in ("prefill", "decode"):
            assert after[role]["state"] == "ready" and after[role]["ip"] != before[role]["ip"], after
        workers = listed(router_url)
        assert len(workers) == 2 and all(w["is_healthy"] for w in workers.values()), workers
        again = ok(ml("up", path, "--on", "k8s", "--rehearse", *IMAGE))  # nothing left to change
        assert "changes nothing of it" in again, again
    finally:
        down_clean(ml, k8s_cluster, name, instance)


def may(k8s_cluster, user: str, verb: str, resource: str, group: str = "", name: str = "") -> bool:
    """Whether the API server lets `user` do it in the default namespace (a SubjectAccessReview)."""
    from kubernetes import client

    from muse_launch.k8s.client import connect

    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        attrs = client.V1ResourceAttributes(
            namespace="default", verb=verb, resource=resource, group=group, name=name or None
        )
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(user=user, resource_attributes=attrs)
        )
        answer = client.AuthorizationV1Api(cluster.api).create_subject_access_review(review)
        return bool(answer.status.allowed)
    finally:
        cluster.close()


def token_kubeconfig(k8s_cluster, account: str, path: Path) -> Path:
    """A kubeconfig of the cluster's with a token of the ServiceAccount (a TokenRequest) as its user."""
    import yaml
    from kubernetes import client

    from muse_launch.k8s.client import connect

    cluster = connect(kubeconfig=str(k8s_cluster.kubeconfig))
    try:
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        made = cluster.core().create_namespaced_service_account_token(account, "default", request)
        token = made.status.token
    finally:
        cluster.close()
    config = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_autoscaler_acts_on_kubernetes_through_scale_with_the_rbac_export_writes(
    ml, k8s_cluster, tmp_path
):
    name = "live-auto-lws"
    path = topology(tmp_path, name)
    data = json.loads(path.read_text())
    data["rehearse"]["max_running"] = 1  # 4 chats queue behind one running request: decode must grow
    data["autoscale"] = {
        "mode": "act",
        "targets": {"ttft": 5, "itl": 0.05, "percentile": 90},
        "interval": 1,
        "cooldown": 0,
        "roles": {"decode": {"min": 1, "max": 2}},
    }
    path.write_text(json.dumps(data))
    ok(ml("up", path, "--on", "k8s", "--rehearse", *IMAGE, "-d"))
    try:
        sa = f"system:serviceaccount:default:{name}-autoscaler"
        lws = ("leaderworkersets", "leaderworkerset.x-k8s.io", f"{name}-decode")
        assert may(k8s_cluster, sa, "patch", *lws) and may(k8s_cluster, sa, "list", "pods")
        assert not may(k8s_cluster, sa, "delete", *lws) and not may(k8s_cluster, sa, "delete", "pods")
        assert not may(k8s_cluster, sa, "get", "secrets")
        roles = {r["name"]: r for r in status(ml, name)["roles"]}
        router_url = f"http://{roles['router']['ip']}:8100"
        as_sa = token_kubeconfig(k8s_cluster, f"{name}-autoscaler", tmp_path / "autoscaler.kubeconfig")
        said = tmp_path / "autoscale.txt"
        with said.open("w") as sink:  # as its ServiceAccount: the RBAC export wrote is enough
            auto = subprocess.Popen(
                [sys.executable, "-m", "muse_launch", "autoscale", name, "--kubeconfig", as_sa],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=ml.env,
                cwd=ROOT,
            )
        try:
            with SteadyLoad(router_url, MODEL) as load:
                load.wait_for(4)
                wait_for(lambda: "decode 1 -> 2" in said.read_text() and "done" in said.read_text(), 240)
                assert "decode-1" in {r["name"] for r in status(ml, name)["roles"]}, said.read_text()
                load.wait_for(4)
            assert load.failures == [], load.failures
            # no load: the idle role goes back to its min, drained, through the same change
            wait_for(lambda: "decode 2 -> 1" in said.read_text(), 240)
            wait_for(lambda: "decode-1" not in {r["name"] for r in status(ml, name)["roles"]}, 120)
        finally:
            auto.terminate()
            auto.wait(timeout=30)
        text = said.read_text()
        assert "acting every 1s" in text and "Traceback" not in text, text
    finally:
        down_clean(ml, k8s_cluster, name, name)
