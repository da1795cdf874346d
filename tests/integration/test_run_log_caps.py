"""Role logs that must not eat the machine (issue 9, item 10): each capped by copy-truncate rotation while
the role keeps writing, and read in bounded chunks by `logs` and `logs -f`, whatever the backlog."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from harness import REPO, free_ports, stand_in, wait_for, writing_to_a_full_pipe

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


LOADED = 60  # seconds: a generous bound for what takes well under one on a quiet machine


def stop_on_ctrl_c(follow: subprocess.Popen) -> None:
    """Ctrl-C to `logs -f`: it must exit at once (status 0), whatever it was doing; killed if it does not."""
    follow.send_signal(signal.SIGINT)
    try:
        follow.communicate(timeout=LOADED)  # reads on: a `logs -f` blocked on a full pipe can exit
    except subprocess.TimeoutExpired:
        follow.kill()
        follow.communicate()
        pytest.fail(f"logs -f did not exit within {LOADED} s of SIGINT")
    assert follow.returncode == 0, f"logs -f exited {follow.returncode} on SIGINT"


def on_disk(log) -> int:
    return sum(p.stat().st_size for p in log.parent.glob(log.name + "*") if p.is_file())


def tail(path, n: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - n))
            return f.read()
    except FileNotFoundError:
        return b""


@pytest.mark.faults("10. a role flooding its log: the log stays under its cap, the newest lines kept")
def test_a_flooding_role_log_stays_under_its_cap(deployment):
    (port,) = free_ports(1)
    cap, keep, flood_mb = 2 * MiB, 1, 120
    topology = deployment.write(
        {"noisy": stand_in(port, "--flood", flood_mb)}, logs={"max_size": "2MiB", "keep": keep}
    )
    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    log = deployment.run_dir / "logs" / "noisy.log"
    # The stand-in writes its 120 MB at up to 50 MB/s; the supervisor checks each log every 0.25 s, so a
    # log may pass its cap by what the role writes between two looks (a generous bound on a busy machine).
    bound = (keep + 1) * cap + 40 * MiB
    largest = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        largest = max(largest, on_disk(log))
        if any(b"flood done" in tail(p) for p in (log, log.parent / "noisy.log.1")):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the flood never ended")
    wait_for(lambda: log.stat().st_size <= cap, timeout=10)  # the next look rotates what is left over
    assert largest <= bound, f"{largest / MiB:.0f} MiB of log on disk, cap {(keep + 1) * cap / MiB:.0f} MiB"
    rotated = sorted(p.name for p in log.parent.glob("noisy.log*"))
    assert rotated == ["noisy.log", "noisy.log.1"], rotated  # keep: 1
    role = deployment.role("noisy")
    assert role["state"] == "ready" and role["health"] == "ok"  # neither slowed to death nor signalled
    # The newest lines are kept, in order: the last of the flood is in the log (or the file just rotated).
    assert any(b"flood done" in tail(p) for p in (log, log.parent / "noisy.log.1"))
    assert deployment.cli("down", deployment.name).returncode == 0


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory since its exec (VmHWM; wait4's ru_maxrss would count the pytest
    process it was forked from)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


@pytest.mark.faults("10. logs and logs -f of a 300 MB backlog (one 40 MB line) in bounded memory")
def test_logs_of_a_huge_backlog_read_in_bounded_memory(deployment):
    (port,) = free_ports(1)
    topology = deployment.write({"server": stand_in(port)}, logs={"max_size": "1GiB"})  # nothing rotated here
    assert deployment.cli("up", topology, "--detach").returncode == 0
    log = deployment.run_dir / "logs" / "server.log"
    follow = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "logs", deployment.name, "-f"],
        cwd=REPO,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,
    )
    try:
        assert b"server |" in follow.stdout.readline()  # following now: what comes next is its backlog
        line = b"y" * 9999 + b"\n"
        with open(
            log, "ab"
        ) as f:  # 260 MB of lines, then a 40 MB line that never ends: a slow reader's backlog
            for _ in range(26):
                f.write(line * 1000)
            for _ in range(40):
                f.write(b"z" * MiB)
        # `logs -f` has read what it could of the backlog and waits on its output, which nobody reads yet
        wait_for(lambda: writing_to_a_full_pipe(follow.pid) or follow.poll() is not None)
        got = 0
        fd = follow.stdout.fileno()
        written = 26 * 1000 * len(line) + 40 * MiB  # each line comes back with its prefix: at least as much
        while got < written and select.select([fd], [], [], LOADED)[0]:
            chunk = os.read(fd, MiB)
            if not chunk:
                break
            got += len(chunk)
        assert got >= written, f"logs -f printed {got / MiB:.0f} MiB of the {written / MiB:.0f} MiB backlog"
        peak = peak_rss_mib(follow.pid)
        assert peak < 100, f"logs -f peaked at {peak:.0f} MiB"
    finally:
        stop_on_ctrl_c(follow)
    tail = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "logs", deployment.name, "-n", "3"],
        cwd=REPO,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    first = tail.stdout.read(
        1
    )  # it has read the end of the log; its output (over a pipe's 64 KiB) waits for us
    wait_for(lambda: writing_to_a_full_pipe(tail.pid) or tail.poll() is not None)
    peak = peak_rss_mib(tail.pid)
    out = first + b"".join(iter(lambda: tail.stdout.read(MiB), b""))
    tail.wait()
    assert peak < 100, f"logs -n 3 peaked at {peak:.0f} MiB"
    assert len(out) < 4 * MiB and out.count(b"\n") == 3  # the last line in pieces of at most a chunk
    assert deployment.cli("down", deployment.name).returncode == 0


@pytest.mark.faults("10. logs -f across the supervisor's rotation: every line once, in order")
def test_logs_follow_reads_on_across_a_rotation(deployment):
    (port,) = free_ports(1)
    topology = deployment.write(
        {"noisy": stand_in(port, "--flood", 1, "--flood-after", 2.0)}, logs={"max_size": "64KiB", "keep": 1}
    )
    assert deployment.cli("up", topology, "--detach").returncode == 0
    follow = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "logs", deployment.name, "-f", "-n", "1"],
        cwd=REPO,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    watchdog = threading.Timer(60, follow.kill)  # a line never seen must fail the test, not hang it
    watchdog.start()
    try:
        assert "noisy |" in follow.stdout.readline()  # following now; the flood starts 2 s after ready
        lines = []
        while not lines or lines[-1] != "flood done":  # 1 MB in 16 writes, rotated past 64 KiB as it goes
            line = follow.stdout.readline()
            assert line, "logs -f ended"
            text = line.rstrip("\n").split(" | ", 1)[1]
            if text[:9].isdigit() or text == "flood done":
                lines.append(text[:9] if text[:9].isdigit() else text)
    finally:
        watchdog.cancel()
        stop_on_ctrl_c(follow)
    assert lines[:-1] == [f"{n:09d}" for n in range(16 * 650)]  # none lost, none twice, in order
    # rotated past its 64 KiB: the supervisor's look (every 0.25 s) may come after the flood's last line on a
    # loaded machine, so wait for it rather than look at once
    wait_for(lambda: (deployment.run_dir / "logs" / "noisy.log.1").exists())
    assert deployment.cli("down", deployment.name).returncode == 0
