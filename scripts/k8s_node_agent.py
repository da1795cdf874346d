#!/usr/bin/env python3
"""k8s_node_agent.py: fake GPU nodes whose kubelet runs each pod bound to them as local processes.

For a control plane with no kubelet (scripts/k8s_local.sh): it registers nodes NAME-0..N-1 with G
`nvidia.com/gpu` each, and for every pod the real scheduler binds to one of them it does a kubelet's part:
- waits for the Secrets / ConfigMaps the pod reads (CreateContainerConfigError until they exist);
- gives the pod an address of its own in POD_CIDR, local to this network namespace (a `local` route on lo:
  an endpoint address may not be loopback, or the Services' EndpointSlices stay empty), and maps its DNS name
  (`hostname.subdomain.ns`, as
  set by the StatefulSet / RBG controller) and every Service selecting it (`service.ns`) to that address in
  the hosts file of the agent's mount namespace (the agent runs under `unshare -m` and bind-mounts it over
  /etc/hosts; its processes see it, nothing outside does);
- runs the first container's command + args with its env: values, Secret / ConfigMap keys, fieldRefs
  (metadata.name, namespace, labels, annotations, status.podIP, spec.nodeName), $(VAR) expanded as the kubelet
  does. A pod has no network namespace of its own here, so a wildcard address in its command (0.0.0.0) becomes
  the pod's address;
- runs its startup and readiness probes (httpGet, tcpSocket) and reports them as pod status (Running, Ready,
  restarts: a container that exits is restarted with back-off, CrashLoopBackOff, its log kept);
- serves the kubelet's /containerLogs/NS/POD/CONTAINER over HTTPS on each node's address (port 10250), so
  that `pods/log` through the API server works;
- on a pod's deletion: SIGTERM to its process group, SIGKILL after its grace period (at most --max-grace),
  then removes the pod object (gracePeriodSeconds=0 in the body).

Exits on SIGTERM/SIGINT (stopping every pod's processes first), after --seconds, or when the API server stays
unreachable for 15 s. Each pod's processes die with the agent (PR_SET_PDEATHSIG) if it is killed.
Needs the `kubernetes` Python client and openssl. Usage:
    unshare -m k8s_node_agent.py --nodes 4 --gpus 8 --dir DIR [--kubeconfig K] [--pid-file DIR/run/nodes.pid]
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import datetime
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException

KUBELET_PORT = 10250
NODE_NET = "127.0.2."  # node i: NODE_NET + (10 + i)
POD_CIDR = "10.244.0.0/16"  # pods: 10.244.N.M, routed to lo in the agent's network namespace
WILDCARDS = ("0.0.0.0", "::", "[::]")
BACKOFF = (1.0, 2.0, 5.0, 10.0)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, defined: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: `$$` is `$`, an undefined $(NAME) stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end >= 0:
                    name = text[i + 2 : end]
                    out.append(defined.get(name, text[i : end + 1]))
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Container:
    """One pod's process, as the kubelet's container: started, probed, restarted, stopped."""

    def __init__(self, pod, ip: str, log: Path):
        self.uid, self.name, self.ns = pod.metadata.uid, pod.metadata.name, pod.metadata.namespace
        self.spec = pod.spec.containers[0]
        self.ip, self.log = ip, log
        self.info = log.parent.parent.parent / "pods" / self.ns / f"{self.name}.json"
        self.popen: subprocess.Popen | None = None
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.restarts = 0
        self.started_at = ""
        self.started = False  # the startup probe passed
        self.ready = False
        self.last_exit: tuple[int, str, str] | None = None  # code, started, finished
        self.next_start = 0.0
        self.stopping_until: float | None = None
        self.reported = None

    def start(self, path: str) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            program = shutil.which(self.argv[0], path=path) or self.argv[0]
            try:
                self.popen = subprocess.Popen(
                    [program, *self.argv[1:]],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**self.env, "PATH": path},
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                out.write(f"k8s_node_agent: cannot start {self.argv[0]}: {exc}\n".encode())
                self.popen = None
                self.last_exit = (128, now(), now())
                self.next_start = time.monotonic() + BACKOFF[min(self.restarts, len(BACKOFF) - 1)]
                return
        self.started_at = now()
        self.started = self.ready = False
        # What it runs, for whoever inspects this node (its env stays in the process: it may hold secrets).
        self.info.parent.mkdir(parents=True, exist_ok=True)
        self.info.write_text(
            json.dumps(
                {"pid": self.popen.pid, "argv": self.argv, "ip": self.ip, "started_at": self.started_at}
            )
        )

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def gone(self) -> bool:
        """No process of its group is left (the leader reaped)."""
        if self.popen is None:
            return True
        if self.popen.poll() is None:
            return False
        try:
            os.killpg(self.popen.pid, 0)
            return False
        except ProcessLookupError:
            return True

    def probe(self, which: str) -> bool:
        p = getattr(self.spec, which)
        if p is None:
            return True
        port = (p.http_get or p.tcp_socket).port if (p.http_get or p.tcp_socket) else None
        if isinstance(port, str) and not port.isdigit():
            port = next((c.container_port for c in self.spec.ports or [] if c.name == port), None)
        if port is None:
            return True
        try:
            if p.http_get:
                url = f"http://{self.ip}:{int(port)}{p.http_get.path or '/'}"
                with urllib.request.urlopen(url, timeout=1.0) as r:
                    return 200 <= r.status < 400
            with socket.create_connection((self.ip, int(port)), timeout=1.0):
                return True
        except (urllib.error.URLError, OSError, ValueError):
            return False


class Agent:
    def __init__(self, a, v1):
        self.a, self.v1 = a, v1
        self.names = [f"{a.prefix}-{i}" for i in range(a.nodes)]
        self.node_ip = {n: f"{NODE_NET}{10 + i}" for i, n in enumerate(self.names)}
        self.dir = Path(a.dir)
        self.hosts = self.dir / "hosts"
        self.containers: dict[str, Container] = {}  # pod uid -> its container
        self.blocked: dict[str, tuple[str, str]] = {}
        self.ips: dict[str, str] = {}  # pod uid -> address
        self.free = [f"10.244.{net}.{host}" for net in range(0, 4) for host in range(2, 255)]
        self.dns_written = ""
        self.path = os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
        )

    # ---- nodes ----
    def register(self) -> None:
        res = {
            "cpu": self.a.cpu,
            "memory": self.a.memory,
            "pods": "110",
            "nvidia.com/gpu": str(self.a.gpus),
            "ephemeral-storage": "10Ti",
        }
        for n in self.names:
            labels = {
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": n,
                "muse-launch/fake-node": "true",
            }
            try:
                self.v1.create_node(
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels}}
                )
            except ApiException as e:
                if e.status != 409:
                    raise
            self.v1.patch_node_status(n, {"status": {"capacity": res, "allocatable": res}})
        self.heartbeat()

    def heartbeat(self) -> None:
        t = now()
        conds = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "k8s_node_agent",
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
        ]
        conds += [
            {
                "type": c,
                "status": "False",
                "reason": "KubeletHasNo" + c,
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
            for c in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]
        for n in self.names:
            # InternalIP only: the API server reaches a kubelet at its node's first preferred address, and
            # a Hostname would resolve outside this agent's hosts file.
            self.v1.patch_node_status(
                n,
                {
                    "status": {
                        "conditions": conds,
                        "addresses": [{"type": "InternalIP", "address": self.node_ip[n]}],
                        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
                        "nodeInfo": {
                            "kubeletVersion": "v1.36.2",
                            "containerRuntimeVersion": "local-process://1",
                            "operatingSystem": "linux",
                            "architecture": "amd64",
                        },
                    }
                },
            )

    # ---- what a pod needs ----
    def _object(self, kind: str, name: str, ns: str, cache: dict) -> dict | None:
        if (kind, name) not in cache:
            try:
                read = (
                    self.v1.read_namespaced_secret if kind == "secret" else self.v1.read_namespaced_config_map
                )
                o = read(name, ns)
                data = dict(o.data or {})
                if kind == "secret":
                    data = {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
                cache[(kind, name)] = data
            except ApiException as e:
                if e.status != 404:
                    raise
                cache[(kind, name)] = None
        return cache[(kind, name)]

    def environment(self, pod, ip: str) -> tuple[dict[str, str], tuple[str, str] | None]:
        """The container's env as the kubelet gives it, or why it cannot start yet."""
        c, ns, cache = pod.spec.containers[0], pod.metadata.namespace, {}
        env: dict[str, str] = {"HOSTNAME": pod.spec.hostname or pod.metadata.name}
        for ef in c.env_from or []:
            ref, kind = (ef.secret_ref, "secret") if ef.secret_ref else (ef.config_map_ref, "configmap")
            data = self._object(kind, ref.name, ns, cache)
            if data is None and not ref.optional:
                return env, ("CreateContainerConfigError", f'{kind} "{ref.name}" not found')
            env.update({(ef.prefix or "") + k: v for k, v in (data or {}).items()})
        for e in c.env or []:
            vf = e.value_from
            if vf is None:
                env[e.name] = expand(e.value or "", env)
                continue
            if vf.secret_key_ref or vf.config_map_key_ref:
                ref, kind = (
                    (vf.secret_key_ref, "secret")
                    if vf.secret_key_ref
                    else (vf.config_map_key_ref, "configmap")
                )
                data = self._object(kind, ref.name, ns, cache)
                if data is None or ref.key not in data:
                    if ref.optional:
                        continue
                    what = (
                        f'{kind} "{ref.name}" not found'
                        if data is None
                        else f"couldn't find key {ref.key} in {kind} {ns}/{ref.name}"
                    )
                    return env, ("CreateContainerConfigError", what)
                env[e.name] = data[ref.key]
            elif vf.field_ref:
                env[e.name] = self.field(pod, vf.field_ref.field_path, ip)
        return env, None

    def field(self, pod, path: str, ip: str) -> str:
        m = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
        if m:
            return ((pod.metadata.labels if m.group(1) == "labels" else pod.metadata.annotations) or {}).get(
                m.group(2), ""
            )
        return {
            "metadata.name": pod.metadata.name,
            "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid,
            "spec.nodeName": pod.spec.node_name or "",
            "spec.serviceAccountName": pod.spec.service_account_name or "",
            "status.podIP": ip,
            "status.hostIP": self.node_ip.get(pod.spec.node_name, ""),
        }.get(path, "")

    # ---- the hosts file ----
    def write_hosts(self, pods, services) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        by_uid = {p.metadata.uid: p for p in pods}
        for uid, ip in self.ips.items():
            pod = by_uid.get(uid)
            if pod is None:
                continue
            ns, host = pod.metadata.namespace, pod.spec.hostname or pod.metadata.name
            names = [host]
            if pod.spec.subdomain:
                fq = f"{host}.{pod.spec.subdomain}.{ns}"
                names = [fq, f"{fq}.svc", f"{fq}.svc.cluster.local", host]
            lines.append(f"{ip} {' '.join(names)}")
        for svc in services:
            selector = svc.spec.selector or {}
            if not selector:
                continue
            ns = svc.metadata.namespace
            for uid, ip in self.ips.items():
                pod = by_uid.get(uid)
                c = self.containers.get(uid)
                if (
                    pod
                    and pod.metadata.namespace == ns
                    and c
                    and c.ready
                    and all((pod.metadata.labels or {}).get(k) == v for k, v in selector.items())
                ):
                    base = f"{svc.metadata.name}.{ns}"
                    lines.append(f"{ip} {base} {base}.svc {base}.svc.cluster.local")
                    break
        text = "\n".join(lines) + "\n"
        if text != self.dns_written:
            with open(
                self.hosts, "r+" if self.hosts.exists() else "w"
            ) as f:  # in place: the bind mount stays
                f.seek(0)
                f.write(text)
                f.truncate()
            self.dns_written = text

    # ---- pods ----
    def sync(self) -> None:
        pods = [
            p
            for p in self.v1.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items
            if p.spec.node_name in self.node_ip
        ]
        seen = set()
        for pod in pods:
            seen.add(pod.metadata.uid)
            try:
                self.sync_pod(pod)
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
        for uid in [u for u in self.containers if u not in seen]:  # removed behind our back: stop it
            self.stop_now(uid)
        self.write_hosts(pods, self.v1.list_service_for_all_namespaces().items)

    def sync_pod(self, pod) -> None:
        uid = pod.metadata.uid
        c = self.containers.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            self.terminate(pod, c)
            return
        if c is None:
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                return
            ip = self.ips.get(uid) or self.free.pop(0)
            self.ips[uid] = ip
            env, why = self.environment(pod, ip)
            if why:
                if self.blocked.get(uid) != why:
                    self.report_waiting(pod, *why)
                    self.blocked[uid] = why
                    print(f"blocked {pod.metadata.namespace}/{pod.metadata.name}: {why[1]}", flush=True)
                return
            self.blocked.pop(uid, None)
            c = Container(pod, ip, self.dir / "logs" / pod.metadata.namespace / f"{pod.metadata.name}.log")
            spec = pod.spec.containers[0]
            argv = [expand(a, env) for a in (spec.command or []) + (spec.args or [])]
            c.argv = [ip if a in WILDCARDS else a for a in argv]
            c.env = {k: (ip if v in WILDCARDS else v) for k, v in env.items()}
            self.containers[uid] = c
            c.start(self.path)
            print(
                f"started {pod.metadata.namespace}/{pod.metadata.name} at {ip}: {' '.join(c.argv)[:200]}",
                flush=True,
            )
        self.step(pod, c)

    def step(self, pod, c: Container) -> None:
        code = c.exited() if c.popen is not None else (None if c.last_exit is None else c.last_exit[0])
        if c.popen is not None and code is not None:
            c.last_exit = (code, c.started_at, now())
            c.popen = None
            c.restarts += 1
            c.started = c.ready = False
            c.next_start = time.monotonic() + BACKOFF[min(c.restarts - 1, len(BACKOFF) - 1)]
            print(
                f"exited {pod.metadata.namespace}/{pod.metadata.name} ({code}); restart {c.restarts}",
                flush=True,
            )
        if c.popen is None and time.monotonic() >= c.next_start:
            c.start(self.path)
        if c.popen is not None:
            if not c.started:
                c.started = c.probe("startup_probe")
            c.ready = c.started and c.probe("readiness_probe")
        self.report(pod, c)

    def report(self, pod, c: Container) -> None:
        t = now()
        running = c.popen is not None
        state = (
            {"running": {"startedAt": c.started_at}}
            if running
            else {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container "
                    f"{c.spec.name} in pod {pod.metadata.name}",
                }
            }
        )
        status = {
            "name": c.spec.name,
            "image": c.spec.image,
            "imageID": "",
            "ready": c.ready,
            "started": c.started,
            "restartCount": c.restarts,
            "containerID": f"local-process://{c.uid}/{c.spec.name}",
            "state": state,
        }
        if c.last_exit:
            status["lastState"] = {
                "terminated": {
                    "exitCode": c.last_exit[0],
                    "reason": "Error" if c.last_exit[0] else "Completed",
                    "startedAt": c.last_exit[1],
                    "finishedAt": c.last_exit[2],
                }
            }
        key = (running, c.ready, c.started, c.restarts)
        if c.reported == key:
            return
        ready = "True" if c.ready else "False"
        conds = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": t},
            {"type": "Ready", "status": ready, "lastTransitionTime": t},
        ]
        self.v1.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Running",
                    "conditions": conds,
                    "podIP": c.ip,
                    "podIPs": [{"ip": c.ip}],
                    "hostIP": self.node_ip[pod.spec.node_name],
                    "hostIPs": [{"ip": self.node_ip[pod.spec.node_name]}],
                    "startTime": c.started_at or t,
                    "containerStatuses": [status],
                }
            },
        )
        c.reported = key

    def report_waiting(self, pod, reason: str, message: str) -> None:
        t = now()
        c = pod.spec.containers[0]
        self.v1.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Pending",
                    "hostIP": self.node_ip[pod.spec.node_name],
                    "startTime": t,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "ContainersNotReady",
                            "lastTransitionTime": t,
                        }
                    ],
                    "containerStatuses": [
                        {
                            "name": c.name,
                            "image": c.image,
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"waiting": {"reason": reason, "message": message}},
                        }
                    ],
                }
            },
        )

    def terminate(self, pod, c: Container | None) -> None:
        if c is not None and not c.gone():
            if c.stopping_until is None:
                grace = pod.metadata.deletion_grace_period_seconds
                grace = min(self.a.max_grace, grace if grace is not None else 30)
                c.stopping_until = time.monotonic() + grace
                c.signal(signal.SIGTERM)
                return
            if time.monotonic() < c.stopping_until:
                return
            c.signal(signal.SIGKILL)
            if c.popen is not None:
                c.popen.wait(timeout=5)
        if c is not None:
            c.info.unlink(missing_ok=True)
        self.containers.pop(pod.metadata.uid, None)
        if (ip := self.ips.pop(pod.metadata.uid, None)) is not None:
            self.free.append(ip)
        self.blocked.pop(pod.metadata.uid, None)
        self.v1.delete_namespaced_pod(
            pod.metadata.name,
            pod.metadata.namespace,
            body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
            ),
        )
        print(f"deleted {pod.metadata.namespace}/{pod.metadata.name}", flush=True)

    def stop_now(self, uid: str, grace: float = 3.0) -> None:
        c = self.containers.pop(uid, None)
        if (ip := self.ips.pop(uid, None)) is not None:
            self.free.append(ip)
        if c is None:
            return
        c.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not c.gone() and time.monotonic() < deadline:
            if c.popen is not None:
                c.popen.poll()
            time.sleep(0.05)
        c.signal(signal.SIGKILL)
        if c.popen is not None:
            c.popen.wait(timeout=5)
        c.info.unlink(missing_ok=True)

    def stop_all(self) -> None:
        for c in self.containers.values():
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not all(c.gone() for c in self.containers.values()):
            for c in self.containers.values():
                if c.popen is not None:
                    c.popen.poll()
            time.sleep(0.05)
        for uid in list(self.containers):
            self.stop_now(uid, grace=0)

    # ---- the kubelet's log endpoint ----
    def log_of(self, ns: str, pod: str) -> Path | None:
        path = self.dir / "logs" / ns / f"{pod}.log"
        return path if path.is_file() else None


def serve_logs(agent: Agent, stop: threading.Event) -> list[http.server.HTTPServer]:
    cert, key = agent.dir / "kubelet.crt", agent.dir / "kubelet.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=k8s-node-agent",
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            m = re.match(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)$", url.path)
            log = agent.log_of(m.group(1), m.group(2)) if m else None
            if log is None:
                self.send_error(404, "no such container log")
                return
            q = urllib.parse.parse_qs(url.query)
            data = log.read_bytes()
            if "tailLines" in q:
                n = int(q["tailLines"][0])
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-n:]) if n else b""
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(data)
            if q.get("follow", ["false"])[0] != "true":
                return
            offset = log.stat().st_size
            try:
                while not stop.is_set() and log.exists():
                    size = log.stat().st_size
                    if size > offset:
                        with open(log, "rb") as f:
                            f.seek(offset)
                            self.wfile.write(f.read(size - offset))
                            self.wfile.flush()
                        offset = size
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass

    servers = []
    for ip in agent.node_ip.values():
        server = http.server.ThreadingHTTPServer((ip, KUBELET_PORT), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def pod_network() -> None:
    """Every address of POD_CIDR local to this network namespace (the caller's own: `unshare -n`)."""
    done = subprocess.run(
        ["ip", "route", "replace", "local", POD_CIDR, "dev", "lo"], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(
            f"k8s_node_agent: cannot route {POD_CIDR} to lo ({done.stderr.strip()}); run it as root inside "
            f"a network namespace of its own (`unshare -n`)"
        )


def private_hosts(agent: Agent) -> None:
    """The agent's own /etc/hosts (it runs under `unshare -m`): what its pods resolve."""
    agent.hosts.write_text("127.0.0.1 localhost\n")
    done = subprocess.run(["mount", "--bind", str(agent.hosts), "/etc/hosts"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"k8s_node_agent: cannot bind-mount {agent.hosts} over /etc/hosts ({done.stderr.strip()}); "
            f"run it under `unshare -m` as root"
        )


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node")
    ap.add_argument("--cpu", default="224")
    ap.add_argument("--memory", default="2Ti")
    ap.add_argument("--prefix", default="gpu-node")
    ap.add_argument("--dir", required=True, help="its hosts file, certificate and the pods' logs")
    ap.add_argument("--seconds", type=float, default=24 * 3600)
    ap.add_argument("--max-grace", type=float, default=10.0, help="longest SIGTERM-to-SIGKILL wait for a pod")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--pid-file")
    a = ap.parse_args()
    if not a.kubeconfig:
        ap.error("give --kubeconfig or set KUBECONFIG")
    return a


def main() -> int:
    a = parse()
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    if a.pid_file:
        start = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
        Path(a.pid_file).write_text(f"{os.getpid()} {start}\n")
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    config.load_kube_config(a.kubeconfig)
    agent = Agent(a, client.CoreV1Api())
    pod_network()
    private_hosts(agent)
    servers = serve_logs(agent, stop)
    agent.register()
    print(
        f"k8s_node_agent: {a.nodes} nodes x {a.gpus} nvidia.com/gpu, kubelets on "
        f"{NODE_NET}10..:{KUBELET_PORT}",
        flush=True,
    )
    end, last_beat, failing_since, code = time.monotonic() + a.seconds, time.monotonic(), None, 0
    while not stop.is_set() and time.monotonic() < end:
        try:
            if time.monotonic() - last_beat >= 10:
                agent.heartbeat()
                last_beat = time.monotonic()
            agent.sync()
            failing_since = None
        except Exception as e:  # noqa: BLE001  the API server restarting or gone: retry a while
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > 15:
                print(
                    f"k8s_node_agent: API server unreachable for 15 s, exiting ({type(e).__name__}: {e})",
                    file=sys.stderr,
                )
                code = 1
                break
        stop.wait(0.3)
    agent.stop_all()
    for server in servers:
        server.shutdown()
    print(f"k8s_node_agent: exiting; {len(agent.containers)} containers left", flush=True)
    if a.pid_file:
        Path(a.pid_file).unlink(missing_ok=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
