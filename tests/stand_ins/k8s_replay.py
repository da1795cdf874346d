"""Replay exported manifests on this machine, as a cluster would run them.

Reads the manifests back from their directory, makes the pods each LeaderWorkerSet, RoleBasedGroup
role and Deployment would make (one group / instance each, as exported), gives every pod its own
loopback address (127.0.0.x), resolves each DNS name the cluster would give (pods under their
headless Service, Services) to those addresses, expands each container's command and env as the
kubelet does ($(VAR) from the pod's env, its Secret and the variables LWS / RBG inject per group
and index), and starts it: the simulated engine for engine containers, the real router for the
router's. A pod's 0.0.0.0 is its own address, as in its network namespace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from muse_launch.export.expand import expand
from muse_launch.export.validate import merge_patch

COMPONENT = "app.kubernetes.io/component"
ENGINE_IMAGES = {"sglang": "sglang", "vllm": "vllm"}


@dataclass
class Pod:
    name: str  # as the controller names it
    role: str  # the component label: the topology's role
    address: str  # its DNS name under the group's headless Service (or a Service's, for a Deployment)
    container: dict[str, Any]
    injected: dict[str, str]
    depends_on: tuple[str, ...] = ()  # RBG roles that must be ready first
    ip: str = ""
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    log: Path | None = None

    def probe_url(self, probe: str = "readinessProbe") -> str | None:
        get = self.container.get(probe, {}).get("httpGet")
        if not get:
            return None
        port = get["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in self.container["ports"] if p.get("name") == port)
        return f"http://{self.ip}:{port}{get['path']}"


def read(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return [doc for f in kustomization["resources"] for doc in yaml.safe_load_all((directory / f).read_text()) if doc]


def pods(objects: list[dict[str, Any]]) -> tuple[list[Pod], dict[str, str]]:
    """The pods, and the DNS names that point at a Service's pods (Service -> its one pod's name)."""
    out: list[Pod] = []
    services: dict[str, str] = {}
    for obj in objects:
        kind, meta, spec = obj["kind"], obj["metadata"], obj.get("spec", {})
        ns = meta.get("namespace", "default")
        if kind == "LeaderWorkerSet":
            lwt = spec["leaderWorkerTemplate"]
            size = lwt.get("size", 1)
            for group in range(spec.get("replicas", 1)):
                leader = f"{meta['name']}-{group}"
                for index in range(size):
                    template = lwt.get("leaderTemplate", lwt["workerTemplate"]) if index == 0 else lwt["workerTemplate"]
                    name = leader if index == 0 else f"{leader}-{index}"
                    out.append(Pod(name, template["metadata"]["labels"][COMPONENT], f"{name}.{meta['name']}.{ns}",
                                   template["spec"]["containers"][0],
                                   {"LWS_LEADER_ADDRESS": f"{leader}.{meta['name']}.{ns}",
                                    "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}))
        elif kind == "RoleBasedGroup":
            for role in spec["roles"]:
                service = f"s-{meta['name']}-{role['name']}"
                for i in range(role.get("replicas", 1)):
                    instance = f"{meta['name']}-{role['name']}-{i}"
                    deps = tuple(role.get("dependencies", ()))
                    if "standalonePattern" in role:
                        template = role["standalonePattern"]["template"]
                        out.append(Pod(instance, template["metadata"]["labels"][COMPONENT], f"{instance}.{service}.{ns}",
                                       template["spec"]["containers"][0], {}, deps))
                        continue
                    lwp = role["leaderWorkerPattern"]
                    for index in range(lwp.get("size", 1)):
                        patch = lwp.get("leaderTemplatePatch" if index == 0 else "workerTemplatePatch")
                        template = merge_patch(lwp["template"], patch) if patch else lwp["template"]
                        name = f"{instance}-{index}"
                        out.append(Pod(name, template["metadata"]["labels"][COMPONENT], f"{name}.{service}.{ns}",
                                       template["spec"]["containers"][0],
                                       {"RBG_LWP_LEADER_ADDRESS": f"{instance}-0.{service}.{ns}",
                                        "RBG_LWP_GROUP_SIZE": str(lwp.get("size", 1)),
                                        "RBG_LWP_WORKER_INDEX": str(index)}, deps))
        elif kind == "Deployment":
            template = spec["template"]
            name = f"{meta['name']}-pod"
            out.append(Pod(name, template["metadata"]["labels"][COMPONENT], f"{name}.{ns}",
                           template["spec"]["containers"][0], {}))
    for obj in objects:
        if obj["kind"] == "Service" and obj["spec"].get("clusterIP") != "None":
            selector = obj["spec"]["selector"]
            chosen = [p for p in out if p.role == selector.get(COMPONENT)]
            assert len(chosen) == 1, f"Service {obj['metadata']['name']} selects {len(chosen)} pods"
            services[f"{obj['metadata']['name']}.{obj['metadata'].get('namespace', 'default')}"] = chosen[0].address
    return out, services


def resolve(pods_: list[Pod], services: Mapping[str, str], secrets: Mapping[str, str]) -> dict[str, str]:
    """Addresses for every pod, then each pod's argv and env as the kubelet gives them; returns the DNS map."""
    dns = {}
    for i, pod in enumerate(pods_):
        pod.ip = f"127.0.0.{i + 2}"
        dns[pod.address] = pod.ip
    for name, target in services.items():
        dns[name] = dns[target]
    order = sorted(dns, key=len, reverse=True)  # a longer name first: none is cut by a shorter one

    def mapped(text: str, ip: str) -> str:
        for name in order:
            text = text.replace(name, dns[name])
        return ip if text == "0.0.0.0" else text

    for pod in pods_:
        defined = dict(pod.injected)
        env = dict(pod.injected)
        for var in pod.container.get("env", []):
            if "valueFrom" in var:
                ref = var["valueFrom"]["secretKeyRef"]
                value = secrets[ref["key"]]
            else:
                value = expand(var.get("value", ""), defined)
            defined[var["name"]] = env[var["name"]] = value
        pod.argv = [mapped(expand(a, defined), pod.ip) for a in pod.container["command"]]
        pod.env = {k: mapped(v, pod.ip) for k, v in env.items()}
    return dns


def start(pod: Pod, launcher_len: int, engine: str, run_dir: Path, ready_after: float) -> None:
    """Engines run as the simulated engine with the container's arguments; routers as themselves."""
    if engine in ENGINE_IMAGES:
        argv = [sys.executable, "-m", "muse_launch.sim", "--engine", engine, "--ready-after", f"{ready_after:g}",
                "--state-dir", str(run_dir / "sim" / pod.name), "--", *pod.argv[launcher_len:]]
    else:
        program = Path(sys.executable).parent / pod.argv[0]
        argv = [str(program) if program.exists() else pod.argv[0], *pod.argv[1:]]
    env = {**os.environ, **pod.env, "HF_HUB_OFFLINE": "1"}
    pod.log = run_dir / f"{pod.name}.log"
    with open(pod.log, "ab") as log:
        pod.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)


def ready(pod: Pod) -> bool:
    """As Kubernetes sees it: the start-up probe passed, then readiness (no probe: running)."""
    if pod.popen is None or pod.popen.poll() is not None:
        return False
    for probe in ("startupProbe", "readinessProbe"):
        url = pod.probe_url(probe)
        if url is None:
            continue
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if not 200 <= r.status < 400:
                    return False
        except (urllib.error.URLError, OSError):
            return False
    return True


def wait_ready(pods_: list[Pod], timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        dead = [p for p in pods_ if p.popen is not None and p.popen.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited ({dead[0].popen.returncode}):\n{tail(dead[0])}")
        if all(ready(p) for p in pods_):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise TimeoutError("not ready: " + ", ".join(p.name for p in pods_ if not ready(p)) + "\n"
                       + "\n".join(tail(p) for p in pods_))


def tail(pod: Pod, n: int = 15) -> str:
    try:
        lines = pod.log.read_text(errors="replace").splitlines()[-n:] if pod.log else []
    except OSError:
        lines = []
    return f"--- {pod.name}: {' '.join(pod.argv)}\n" + "\n".join(lines)


def stop(pods_: list[Pod], grace: float = 5.0) -> list[str]:
    """SIGTERM every pod's process group (reverse start order), then SIGKILL what is left; the survivors."""
    for pod in reversed(pods_):
        if pod.popen and pod.popen.poll() is None:
            os.killpg(pod.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for pod in pods_:
        if pod.popen:
            try:
                pod.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(pod.popen.pid, signal.SIGKILL)
                pod.popen.wait(timeout=5)
    survivors = []
    for pod in pods_:
        if pod.popen:
            try:
                os.killpg(pod.popen.pid, 0)
                survivors.append(pod.name)
                os.killpg(pod.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return survivors
