"""`top` against a real rehearsal under load: the simulated engines behind the real sglang-router, a few
streaming chats through the router, and `top` in a pseudo-terminal as a user runs it."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import httpx
import pytest
from harness import REPO, Deployment, free_ports, stand_in
from rehearsal import READY_AFTER, assert_nothing_left, recorded_processes, require_free, tails, tear_down

from muse_launch.core import load_plan

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

EPD = REPO / "topologies/epd-b300.yaml"
MODEL = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
STREAMS = 3  # concurrent streaming chats through the router
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]")


class Load:
    """STREAMS threads, each sending streaming chats through the router until stopped (or 600 requests)."""

    def __init__(self, url: str):
        self.url, self.stop, self.done, self.errors = url, threading.Event(), 0, []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(STREAMS)]

    def _run(self) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me about the weather"}],
            "stream": True,
            "max_tokens": 60,
        }
        with httpx.Client(timeout=30) as client:
            for _ in range(200):
                if self.stop.is_set():
                    return
                try:
                    with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as answer:
                        for _ in answer.iter_lines():
                            pass
                        if answer.status_code != 200:
                            self.errors.append(answer.status_code)
                    self.done += 1
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads)


def _rows(screen: str) -> dict[str, list[str]]:
    """The role table's rows on the last full screen, by role: its cells, stripped."""
    rows = {}
    for line in screen.splitlines():
        cells = [c.strip() for c in line.split("\u2502")]
        if len(cells) >= 13 and cells[1]:
            rows[cells[1]] = cells[1:-1]
    return rows


def _top_in_a_pty(d: Deployment, until, deadline: float) -> tuple[str, int]:
    """`muse-launch top` on a 60x220 pseudo-terminal until `until(screen)` holds; then Ctrl-C (SIGINT)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 220, 0, 0))
    env = {**d.env, "TERM": "xterm-256color", "COLUMNS": "220", "LINES": "60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "top", d.name],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    os.close(slave)
    out, screen = b"", ""
    try:
        end = time.monotonic() + deadline
        while time.monotonic() < end and proc.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
                frames = ANSI.sub("", out.decode(errors="replace")).split("Ctrl-C quits")
                screen = frames[-2] + frames[-1] if len(frames) > 2 else ""
                if screen and until(screen):
                    break
        proc.send_signal(signal.SIGINT)
        # Read on while it exits, as a terminal does: unread, the pty fills and top blocks in its last
        # writes (restoring the screen), never reaching its exit.
        stop_by = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < stop_by:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
        code = proc.wait(10)
        while select.select([master], [], [], 0.2)[0]:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
        return screen + "\n" + out.decode(errors="replace")[-200:], code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)


def test_top_in_a_terminal_shows_the_roles_and_their_token_rates_under_load(tmp_path: Path):
    plan = load_plan(EPD, [READY_AFTER], rehearse=True).plan
    d = Deployment(tmp_path / "home", plan.name)
    d.home.mkdir()
    require_free(plan)
    processes = {}
    try:
        up = d.cli("up", EPD, "--rehearse", "-d", "--set", READY_AFTER, timeout=180)
        assert up.returncode == 0, f"up: {up.stdout}{up.stderr}\n{tails(d)}"
        processes = recorded_processes(d)
        router = next(s for s in plan.specs if s.kind == "router")

        def busy(screen: str) -> bool:
            rows = _rows(screen)
            return (
                all(r in rows for r in ("encoder", "prefill", "decode", "router"))
                and _float(rows["decode"][9]) > 0
                and _float(rows["prefill"][8]) > 0
            )

        with Load(router.url) as load:
            screen, code = _top_in_a_pty(d, busy, deadline=90)
            once = d.cli("top", d.name, "--once", "--json", timeout=60)
        assert code == 0, screen
        rows = _rows(screen)
        assert busy(screen), f"top never showed token rates under load:\n{screen}"
        assert [rows[r][1] for r in ("encoder", "prefill", "decode", "router")] == [
            "encoder",
            "prefill",
            "decode",
            "router",
        ]
        assert all(rows[r][2] == "ready" and rows[r][3] == "ok" for r in rows), screen
        assert rows["router"][5:11] == ["n/a"] * 6  # a router has no token counters: n/a, never 0
        assert "load per worker" in screen and "http://127.0.0.1:30002" in screen
        assert "\x1b[?1049l" in screen  # it gave the terminal back (left the alternate screen)
        assert load.done > 0 and not load.errors, load.errors

        assert once.returncode == 0, once.stderr
        snap = json.loads(once.stdout)
        by_name = {r["name"]: r for r in snap["roles"]}
        assert list(by_name) == [s.name for s in plan.specs]
        assert by_name["decode"]["generation_tokens_total"] > 0
        assert by_name["router"]["metrics_url"].endswith(":29000/metrics")
        workers = {w["role"]: w for w in snap["routers"][0]["workers"]}
        assert set(workers) == {"prefill", "decode"} and all(w["healthy"] for w in workers.values())

        down = d.cli("down", d.name, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert_nothing_left(d, plan, processes)
    except BaseException:
        tear_down(d, processes)
        raise


def _float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return 0.0


def test_top_once_json_says_n_a_for_a_role_without_metrics(deployment: Deployment):
    port = free_ports(1)[0]
    path = deployment.write({"job": stand_in(port)})
    up = deployment.cli("up", path, "-d")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        once = deployment.cli("top", deployment.name, "--once", "--json", "--interval", "0.2")
        assert once.returncode == 0, once.stderr
        job = json.loads(once.stdout)["roles"][0]
        assert job["metrics_unavailable"] == "command exposes no metrics"
        assert [
            job[k]
            for k in (
                "running",
                "queued",
                "kv_cache_usage",
                "prompt_tokens_per_s",
                "generation_tokens_per_s",
                "ttft_s",
            )
        ] == [None] * 6
        assert job["state"] == "ready" and job["health"] == "ok"
        table = deployment.cli("top", deployment.name, "--once", "--interval", "0.2")
        assert (
            table.returncode == 0 and "n/a" in table.stdout and "command exposes no metrics" in table.stdout
        )
    finally:
        assert deployment.cli("down", deployment.name).returncode == 0
