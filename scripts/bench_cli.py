"""The CLI's own cost, in one run: start-up per command, and `up -d` beside a hand-written launcher.

    .venv/bin/python scripts/bench_cli.py [--runs N] [--rounds N] [--rehearse]

1. Each command from exec to exit through the console script (.venv/bin/muse-launch): the
   fastest and the median of N runs, wall clock and CPU (user + system; a loaded machine moves
   CPU time less than wall time), each run paired with a bare interpreter's. The start-up budget:
   `--help` 0.10 s, `validate topologies/epd-b300.yaml` 0.20 s, `down` and `status` with nothing
   running 0.20 s.
2. `up -d` beside a launcher written by hand that starts the same waves (the plan's argv and env,
   each role in its own session, its log in a file) and polls the same probes at the same
   interval, with no checks, no state and no supervisor; each started alternately, `--rounds`
   times. Goal: `up -d` within 0.2 s of it. The deployment is EPD-shaped stand-ins with known
   ready delays (scripts/bench_bringup.py's), or with --rehearse the rehearsal of
   topologies/epd-b300.yaml (simulated engines behind the real sglang-router; its ports must be free).

Figures, not asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(Path(sys.executable).with_name("muse-launch"))
EPD = REPO / "topologies" / "epd-b300.yaml"
GOALS = {"--help": 0.10, "validate": 0.20, "down": 0.20, "status": 0.20}  # the start-up budget, seconds

# The hand-written launcher: the standard library only, the waves in order, each role polled ready.
HAND = r"""
import http.client, json, os, socket, subprocess, sys, time
plan = json.load(open(sys.argv[1]))
logs = sys.argv[2]
started = []

def ready(role, proc, born):
    probe = role["probe"]
    if probe["kind"] == "http":
        for path in probe["paths"]:
            try:
                conn = http.client.HTTPConnection(role["host"], role["port"], timeout=2)
                conn.request("GET", path)
                if conn.getresponse().status != probe["status"]:
                    return False
            except OSError:
                return False
        return True
    if probe["kind"] == "tcp":
        try:
            socket.create_connection((role["host"], role["port"]), timeout=2).close()
            return True
        except OSError:
            return False
    return time.monotonic() - born >= probe["interval"]

for wave in plan["waves"]:
    pending = []
    for role in wave:
        with open(os.path.join(logs, role["name"] + ".log"), "wb") as log:
            proc = subprocess.Popen(role["argv"], env={**os.environ, **role["env"]}, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc.pid)
        pending.append((role, proc, time.monotonic()))
    while pending:
        for item in list(pending):
            role, proc, born = item
            if proc.poll() is not None:
                print(json.dumps(started))
                sys.exit(f"{role['name']} exited with {proc.returncode}")
            if ready(role, proc, born):
                pending.remove(item)
        if pending:
            time.sleep(min(r["probe"]["interval"] for r, _, _ in pending))
print(json.dumps(started))
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """Wall and CPU seconds of one process, its exit status and its output."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, proc.returncode, out


def startup(env: dict[str, str], runs: int) -> None:
    """Each command paired, run by run, with a bare interpreter (`python -c pass`): the ratio of their CPU
    medians is what muse-launch adds on this machine, whatever its load."""
    commands = {
        "--help": ["--help"],
        "validate": ["validate", str(EPD.relative_to(REPO))],
        "down": ["down"],
        "status": ["status"],
    }
    print(f"start-up, {runs} runs each, each paired with a bare interpreter ({SCRIPT}):")
    print(
        f"  {'command':<48} {'wall min':>9} {'median':>8} {'cpu min':>9} {'median':>8} "
        f"{'bare cpu':>9} {'x bare':>7}   goal"
    )
    for key, args in commands.items():
        walls, cpus, bare = [], [], []
        for _ in range(runs):
            wall, cpu, code, out = timed([SCRIPT, *args], env)
            if code not in (0, 1 if key == "status" else 0):  # status of nothing running: exit 1
                sys.exit(f"muse-launch {' '.join(args)} exited {code}:\n{out}")
            walls.append(wall)
            cpus.append(cpu)
            bare.append(timed([sys.executable, "-c", "pass"], env)[1])
        label = "muse-launch " + " ".join(args) + (" (nothing running)" if key in ("down", "status") else "")
        verdict = "ok" if min(walls) <= GOALS[key] else "OVER"
        ratio = statistics.median(cpus) / max(statistics.median(bare), 1e-6)
        print(
            f"  {label:<48} {min(walls):8.3f}s {statistics.median(walls):7.3f}s {min(cpus):8.3f}s "
            f"{statistics.median(cpus):7.3f}s {statistics.median(bare):8.3f}s "
            f"{ratio:6.1f}x   {GOALS[key]:.2f}s {verdict}"
        )


def hand_plan(plan, path: Path) -> None:
    """What the hand-written launcher reads: the waves, each role's argv, env, probe and address."""
    from muse_launch.addresses import connect_host
    from muse_launch.proc.programs import program_path

    roles = {s.name: s for s in plan.specs}
    path.write_text(
        json.dumps(
            {
                "waves": [
                    [
                        {
                            "name": name,
                            "argv": [program_path(roles[name].argv[0], os.environ), *roles[name].argv[1:]],
                            "env": dict(roles[name].env),
                            "probe": roles[name].probe.to_dict(),
                            "host": connect_host(roles[name].bind),
                            "port": roles[name].ports.get("http"),
                        }
                        for name in wave
                    ]
                    for wave in plan.waves
                ]
            }
        )
    )


def wait_closed(plan, seconds: float = 20.0) -> None:
    from muse_launch.proc.ports import busy_ports

    deadline = time.monotonic() + seconds
    while busy_ports(plan) and time.monotonic() < deadline:
        time.sleep(0.05)
    if busy := busy_ports(plan):
        sys.exit(f"ports still busy: {busy}")


def stop_groups(pids: list[int]) -> None:
    for pid in reversed(pids):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def bring_up(env: dict[str, str], rounds: int, rehearse: bool, tmp: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from muse_launch.core import load_plan

    if rehearse:
        source, sets, what = EPD, ["rehearse.ready_after=1"], "the rehearsal of topologies/epd-b300.yaml"
        up_args = ["up", str(source), "--rehearse", "-d", "--set", sets[0]]
    else:
        from bench_bringup import READY_AFTER, topology

        source, sets = topology(tmp / "bench.yaml", "bench", sequential=False), []
        what = "EPD-shaped stand-ins, ready after " + ", ".join(f"{k} {v}s" for k, v in READY_AFTER.items())
        up_args = [
            "up",
            str(source),
            "-d",
            "--no-engine-check",
        ]  # the stand-in router lists no router options
    os.environ["MUSE_LAUNCH_HOME"] = env["MUSE_LAUNCH_HOME"]  # the plan's run directory is the one `up` uses
    plan = load_plan(source, sets, rehearse=rehearse).plan
    hand_json, hand_py, logs = tmp / "hand.json", tmp / "hand.py", tmp / "hand-logs"
    hand_plan(plan, hand_json)
    hand_py.write_text(HAND)
    logs.mkdir()
    wait_closed(plan)
    import psutil

    ours, theirs, our_cpu, their_cpu = [], [], [], []
    for _ in range(rounds):
        wall, cpu, code, out = timed([sys.executable, str(hand_py), str(hand_json), str(logs)], env)
        pids = json.loads(out.splitlines()[0]) if out.startswith("[") else []
        stop_groups(pids)
        if code != 0:
            sys.exit(f"the hand-written launcher failed: {out}")
        theirs.append(wall)
        their_cpu.append(cpu)
        wait_closed(plan)
        wall, cpu, code, out = timed([SCRIPT, *up_args], env)
        if code != 0:
            sys.exit(f"muse-launch {' '.join(up_args)} exited {code}:\n{out}")
        supervisor = json.loads((Path(env["MUSE_LAUNCH_HOME"]) / plan.name / "state.json").read_text())
        used = psutil.Process(
            supervisor["supervisor_pid"]
        ).cpu_times()  # the detached supervisor, until ready
        ours.append(wall)
        our_cpu.append(cpu + used.user + used.system)
        timed([SCRIPT, "down", plan.name], env)
        wait_closed(plan)
    mine, hand = statistics.median(ours), statistics.median(theirs)
    print(
        f"\nbring-up of {what}; waves {' -> '.join('+'.join(w) for w in plan.waves)}; {rounds} rounds each:"
    )
    print(f"  {'':<40} {'wall min':>9} {'median':>8} {'cpu median':>11}")
    print(
        f"  {'hand-written launcher (no checks)':<40} {min(theirs):8.3f}s {hand:7.3f}s "
        f"{statistics.median(their_cpu):10.3f}s"
    )
    print(
        f"  {'muse-launch ' + ' '.join(up_args[:1] + up_args[2:]):<40} {min(ours):8.3f}s {mine:7.3f}s "
        f"{statistics.median(our_cpu):10.3f}s  (the command and its supervisor)"
    )
    print(
        f"  up -d over the hand launcher: {mine / hand:.3f} x, {mine - hand:+.3f}s wall (median), "
        f"{statistics.median(our_cpu) - statistics.median(their_cpu):+.3f}s CPU   goal: within 0.20s wall "
        f"{'ok' if mine - hand <= 0.2 else 'OVER'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each start-up command")
    parser.add_argument("--rounds", type=int, default=3, help="bring-ups of each launcher")
    parser.add_argument("--rehearse", action="store_true", help="bring up the EPD file's rehearsal")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MUSE_LAUNCH_HOME": str(Path(tmp) / "home"), "HF_HUB_OFFLINE": "1"}
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        startup(env, args.runs)
        bring_up(env, args.rounds, args.rehearse, Path(tmp))


if __name__ == "__main__":
    main()
