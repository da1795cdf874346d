"""Bring-up and teardown figures for an EPD topology of stand-ins with known delays.

    .venv/bin/python scripts/bench_bringup.py

Prints, in one run: `up` time over the critical path (goal <= 1.05), a sequential start over
`up`, `down` time beyond the roles' own exit times (goal <= 0.5 s), and the idle supervisor's
CPU share and memory (goals < 1% of a core, < 80 MB). Figures, not asserts: a loaded machine
moves them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
STAND_IN = str(REPO / "tests" / "stand_ins" / "server.py")
READY_AFTER = {"encoder": 1.0, "prefill": 2.0, "decode": 1.5, "router": 0.5}
EXIT_AFTER = {"encoder": 0.2, "prefill": 0.5, "decode": 0.3, "router": 0.2}  # from SIGTERM to exit
IDLE_SECONDS = 10.0


def free_ports(n: int) -> list[int]:
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def topology(path: Path, name: str, sequential: bool) -> Path:
    encoder, prefill, decode, router, metrics, boot, enc_boot_p, enc_boot_d = free_ports(8)
    probe = {"http": "/health", "interval": 0.05, "timeout": 60}

    def stand_in(role: str) -> list[str]:
        return ["--ready-after", str(READY_AFTER[role]), "--stop-delay", str(EXIT_AFTER[role])]

    roles = {
        "encoder": {"kind": "encoder", "port": encoder, "args": stand_in("encoder"), "ready": probe},
        "prefill": {
            "kind": "prefill",
            "port": prefill,
            "encoders": ["encoder"],
            "bootstrap_port": boot,
            "encoder_bootstrap_port": enc_boot_p,
            "args": stand_in("prefill"),
            "ready": probe,
        },
        "decode": {
            "kind": "decode",
            "port": decode,
            "encoders": ["encoder"],
            "encoder_bootstrap_port": enc_boot_d,
            "args": stand_in("decode"),
            "ready": probe,
            **({"after": ["prefill"]} if sequential else {}),
        },
        "router": {
            "kind": "router",
            "launcher": [sys.executable, STAND_IN],
            "port": router,
            "metrics_port": metrics,
            "prefill": ["prefill"],
            "decode": ["decode"],
            "args": stand_in("router"),
            "ready": probe,
        },
    }
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": name,
                "hardware": "cpu",
                "model": str(REPO),
                "launcher": [sys.executable, STAND_IN],
                "roles": roles,
            }
        )
    )
    return path


def cli(home: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "MUSE_LAUNCH_HOME": str(home)},
        cwd=REPO,
    )
    if result.returncode != 0:
        sys.exit(f"muse-launch {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return time.monotonic() - started, result


def bring_up_seconds(home: Path, name: str) -> float:
    """From the supervisor's first spawn to the last role ready, as state.json records them."""
    roles = json.loads((home / name / "state.json").read_text())["roles"]
    stamp = lambda iso: datetime.fromisoformat(iso).timestamp()  # noqa: E731
    return max(stamp(r["ready_at"]) for r in roles) - min(stamp(r["started_at"]) for r in roles)


def cli_start_seconds() -> float:
    """What any `muse-launch` command costs before doing anything: interpreter and imports."""
    runs = []
    for _ in range(3):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "muse_launch", "--help"], capture_output=True, cwd=REPO)
        runs.append(time.monotonic() - started)
    return min(runs)


def main() -> None:
    critical = (
        READY_AFTER["encoder"] + max(READY_AFTER["prefill"], READY_AFTER["decode"]) + READY_AFTER["router"]
    )
    sequential_path = sum(READY_AFTER.values())
    exit_path = (
        EXIT_AFTER["router"] + max(EXIT_AFTER["prefill"], EXIT_AFTER["decode"]) + EXIT_AFTER["encoder"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        parallel = topology(Path(tmp) / "bench.yaml", "bench", sequential=False)
        sequential = topology(Path(tmp) / "bench-seq.yaml", "bench-seq", sequential=True)
        start_cost = cli_start_seconds()

        up_wall, _ = cli(home, "up", str(parallel), "--detach", "--no-engine-check")
        up_supervised = bring_up_seconds(home, "bench")

        supervisor = psutil.Process(json.loads((home / "bench" / "state.json").read_text())["supervisor_pid"])
        before = supervisor.cpu_times()
        time.sleep(IDLE_SECONDS)
        after = supervisor.cpu_times()
        cpu_share = (after.user + after.system - before.user - before.system) / IDLE_SECONDS
        rss_mb = supervisor.memory_info().rss / 2**20

        down_wall, result = cli(home, "down", "bench")
        down_itself = float(re.search(r" in ([\d.]+)s", result.stdout)[1])

        seq_wall, _ = cli(home, "up", str(sequential), "--detach", "--no-engine-check")
        seq_supervised = bring_up_seconds(home, "bench-seq")
        cli(home, "down", "bench-seq")

    print(
        f"topology: encoder {READY_AFTER['encoder']}s -> prefill {READY_AFTER['prefill']}s + decode "
        f"{READY_AFTER['decode']}s -> router {READY_AFTER['router']}s; critical path {critical:.2f}s"
    )
    print(
        f"up, first spawn to all ready:      {up_supervised:.2f}s = {up_supervised / critical:.3f} x "
        "critical path"
        f"  (goal <= 1.05)"
    )
    print(
        f"up -d, whole command:              {up_wall:.2f}s = {up_wall / critical:.3f} x critical path"
        f"  (of which {start_cost:.2f}s starting Python and importing the CLI)"
    )
    print(
        f"sequential start over up:          {seq_supervised / up_supervised:.2f} x  ({seq_supervised:.2f}s "
        "vs "
        f"{up_supervised:.2f}s; sum of delays {sequential_path:.2f}s)  whole commands: "
        f"{seq_wall / up_wall:.2f} x"
    )
    print(
        f"down, stopping:                    {down_itself:.2f}s; the roles' own exit times in reverse order "
        f"{exit_path:.2f}s -> {down_itself - exit_path:.2f}s beyond  (goal <= 0.5)"
    )
    slowest = max(EXIT_AFTER.values())
    print(
        f"down, whole command:               {down_wall:.2f}s -> {down_wall - exit_path:.2f}s beyond; "
        f"beyond the slowest role alone ({slowest:.2f}s): {down_wall - slowest:.2f}s"
    )
    print(
        f"idle supervisor over {IDLE_SECONDS:.0f}s:          {100 * cpu_share:.2f}% of a core, RSS "
        f"{rss_mb:.0f} MB"
        f"  (goals < 1%, < 80 MB)"
    )


if __name__ == "__main__":
    main()
