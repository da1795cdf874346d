"""`export` proven by running its manifests: each exported directory is read back, every pod's command
expanded as the kubelet would (LWS / RBG variables per group and index, Secret values, $(VAR)), each
DNS name mapped to a loopback address, and the result run with the simulated engine behind the real
router: ready, smoke (chat, reasoning, tool call), down, nothing left alive or listening.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import k8s_replay as replay
import pytest
from harness import REPO

from muse_launch.export.names import FLAVOURS, dns_label
from muse_launch.export.transform import export_plan
from muse_launch.smoke import run_smoke

pytestmark = [pytest.mark.integration, pytest.mark.export]

CASES = [
    ("topologies/epd-b300.yaml", "lws", []),
    ("topologies/epd-b300.yaml", "rbg", []),
    ("topologies/h200-bf16-2node.yaml", "lws", []),
    ("topologies/h200-bf16-2node.yaml", "rbg", []),
    ("topologies/pd-b300-low-latency.yaml", "rbg", []),
    ("topologies/vllm-multinode-tp-pp-b200.yaml", "rbg", []),
    ("topologies/vllm-pd-b200.yaml", "lws", ["--image", "router=example.org/vllm-router:0.1.17"]),
    ("tests/data/export/pd-secrets.yaml", "lws", ["--image", "example.org/muse:1"]),
    ("tests/data/export/pd-replicas.yaml", "rbg", ["--image", "example.org/muse:1"]),
]
SECRETS = {"HF_TOKEN": "hf-secret-value-1234", "MODEL_ALIAS": "alias-5678"}


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "muse_launch", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, **SECRETS})


@pytest.mark.parametrize("path,flavour,extra", CASES, ids=[f"{Path(p).stem}-{f}" for p, f, _ in CASES])
def test_exported_manifests_run(path: str, flavour: str, extra: list[str], tmp_path: Path):
    out = tmp_path / "manifests"
    done = cli("export", path, "--to", flavour, "-o", out, *extra)
    assert done.returncode == 0, done.stderr
    checked = cli("export", "--check", out)
    assert checked.returncode == 0, checked.stderr
    for value in SECRETS.values():
        assert all(value not in f.read_text() for f in out.iterdir()), "a secret's value in the manifests"

    exported = export_plan(REPO / path, FLAVOURS[flavour], "default")
    groups = {dns_label(g.role): g for g in exported.groups}
    pods, services = replay.pods(replay.read(out))
    dns = replay.resolve(pods, services, SECRETS)
    assert sorted(p.role for p in pods) == sorted(dns_label(s.role) for s in exported.plan.specs)

    assert not [a for p in pods for a in [*p.argv, *p.env.values()] if "$(" in a], "a variable left unexpanded"
    # The expanded commands are the plan's, with each DNS name at its address and the secrets' values.
    for role, group in groups.items():
        mine = [p for p in pods if p.role == role]
        for pod, spec in zip(mine, group.specs, strict=True):
            want = list(spec.argv)
            for name in sorted(dns, key=len, reverse=True):
                want = [a.replace(name, dns[name]) for a in want]
            want = [pod.ip if a == "0.0.0.0" else a for a in want]
            for key, value in SECRETS.items():
                want = [a.replace(f"@@muse-secret:{key}@@", value) for a in want]
            assert pod.argv == want, f"{pod.name}"

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started: list[replay.Pod] = []
    try:
        if flavour == "lws":  # LWS has no start order: everything at once, the router waits for its workers
            for pod in pods:
                group = groups[pod.role]
                replay.start(pod, len(group.specs[0].launcher), group.engine, run_dir, ready_after=0.3)
                started.append(pod)
        else:  # RBG creates a role once the roles it depends on (the manifest's `dependencies`) are ready
            waiting, up = list(pods), set()
            while waiting:
                batch = [p for p in waiting if set(p.depends_on) <= up]
                assert batch, f"dependencies never met: {[(p.name, p.depends_on) for p in waiting]}"
                for pod in batch:
                    group = groups[pod.role]
                    replay.start(pod, len(group.specs[0].launcher), group.engine, run_dir, ready_after=0.3)
                    started.append(pod)
                replay.wait_ready(batch, timeout=60)
                up |= {p.role for p in batch}
                waiting = [p for p in waiting if p not in batch]
        replay.wait_ready(started, timeout=90)

        routers = [g for g in exported.groups if g.kind == "router"]
        if routers:
            router = routers[0]
            entry = exported.names.entry_service(router.role) + ".default"
            base = f"http://{dns[entry]}:{router.specs[0].ports['http']}"
        else:
            leader = next(p for p in pods if p.probe_url())
            url = urlsplit(leader.probe_url())
            base = f"{url.scheme}://{url.netloc}"
        args = [a for p in pods for a in p.argv]
        results = run_smoke(base, "--reasoning-parser" in args, "--tool-call-parser" in args, timeout=60)
        assert all(r.ok for r in results), [f"{r.check}: {r.detail}" for r in results] + \
            [replay.tail(p) for p in started]

        if "pd-secrets" in path:  # the pods got the Secret's values, by reference
            prefill = next(p for p in pods if p.role == "prefill")
            assert prefill.env["HF_TOKEN"] == SECRETS["HF_TOKEN"]
            environ = Path(f"/proc/{prefill.popen.pid}/environ").read_bytes()
            assert f"HF_TOKEN={SECRETS['HF_TOKEN']}".encode() in environ
            assert f"muse-{SECRETS['MODEL_ALIAS']}" in prefill.argv
    finally:
        survivors = replay.stop(started)
    assert not survivors, f"alive after down: {survivors}"
    listening = []
    for pod in started:
        for port in pod.container.get("ports", []):
            try:
                socket.create_connection((pod.ip, port["containerPort"]), timeout=0.5).close()
                listening.append(f"{pod.name} {pod.ip}:{port['containerPort']}")
            except OSError:
                pass
    assert not listening, f"still listening after down: {listening}"
