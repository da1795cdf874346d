"""bench's report.html in a real headless Chromium, driven over the DevTools protocol: the page loads with no
console or JavaScript error and no failed load, every chart image is there and decoded (naturalWidth > 0), and
every link to aiperf's exports names a file of the record. Chromium comes from scripts/install_browser.sh
(scripts/test.sh bench runs it); without it this test fails, saying so."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import pytest
from harness import Deployment, free_ports

pytestmark = [pytest.mark.bench, pytest.mark.integration, pytest.mark.rehearsal]

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
TOP = {"hardware": "b300", "model": M, "engine": "sglang", "rehearse": {"ready_after": 0.3}}
CHARTS = {"throughput.png", "latency.png", "cdf.png", "pareto.png"}
BROWSERS = (
    "chromium-headless-shell",
    "/usr/lib/chromium/chromium-headless-shell",
    "chromium",
    "chromium-browser",
    "google-chrome",
)


def chromium() -> str:
    for name in (os.environ.get("MUSE_LAUNCH_CHROMIUM"), *BROWSERS):
        found = name and shutil.which(name)
        if found:
            return found
    pytest.fail(
        "no headless Chromium to open bench's report in: install it with `bash scripts/install_browser.sh` "
        "(Debian's chromium-headless-shell; `scripts/test.sh bench` runs it), or set MUSE_LAUNCH_CHROMIUM "
        "to a Chromium or Chrome binary"
    )


class DevTools:
    """One page of a headless Chromium over the DevTools protocol (its WebSocket), events kept in order."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(url, max_size=64 * 2**20, open_timeout=30)
        self.events: queue.Queue[dict] = queue.Queue()
        self.replies: dict[int, dict] = {}
        self.next_id = 0
        self.lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.ws:
                msg = json.loads(raw)
                if "id" in msg:
                    with self.lock:
                        self.replies[msg["id"]] = msg
                        self.lock.notify_all()
                else:
                    self.events.put(msg)
        except Exception:  # noqa: BLE001  the socket closed: callers time out on what they wait for
            pass

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        with self.lock:
            self.next_id += 1
            mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        with self.lock:
            if not self.lock.wait_for(lambda: mid in self.replies, timeout):
                raise AssertionError(f"DevTools {method}: no answer in {timeout} s")
            reply = self.replies.pop(mid)
        assert "error" not in reply, f"DevTools {method}: {reply['error']}"
        return reply.get("result", {})

    def wait_event(self, method: str, timeout: float, seen: list[dict]) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {method} in {timeout} s; events: {[e['method'] for e in seen]}")
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            seen.append(event)
            if event["method"] == method:
                return event

    def drain(self, seen: list[dict]) -> None:
        while True:
            try:
                seen.append(self.events.get_nowait())
            except queue.Empty:
                return


def start_browser(binary: str, profile: Path) -> tuple[subprocess.Popen, str]:
    """Chromium headless on a loopback DevTools port of its choosing; the process and its page's WebSocket."""
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # the tests run as root
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: Debian's launcher is a script, the browser its child
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    deadline, said = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"{binary} exited {proc.returncode}: {''.join(said)}"
            continue
        said.append(line)
        if line.startswith("DevTools listening on ws://"):
            port = urlparse(line.split(" on ", 1)[1].strip()).port
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            return proc, next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
    stop_browser(proc)
    raise AssertionError(f"{binary} gave no DevTools address in 60 s: {''.join(said)}")


def stop_browser(proc: subprocess.Popen) -> None:
    """The browser and every process it started (its group, which it leads), then its launcher reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def open_report(binary: str, page: Path, tmp: Path) -> tuple[list[dict], list[dict], bytes]:
    """The page's images (as the browser decoded them), its errors, and a screenshot of the whole page."""
    proc, ws = start_browser(binary, tmp / "profile")
    try:
        tools, seen = DevTools(ws), []
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable")
        tools.call("Page.navigate", url=page.as_uri())
        tools.wait_event("Page.loadEventFired", 60, seen)
        images = tools.call(
            "Runtime.evaluate",
            expression="JSON.stringify([...document.images].map(i => ({alt: i.alt, complete: i.complete, "
            "width: i.naturalWidth, height: i.naturalHeight, src: i.src.slice(0, 22)})))",
            returnByValue=True,
        )["result"]["value"]
        height = tools.call(
            "Runtime.evaluate", expression="document.documentElement.scrollHeight", returnByValue=True
        )
        tools.call(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=min(int(height["result"]["value"]), 16000),
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"])
        tools.drain(seen)
        errors = [
            e
            for e in seen
            if e["method"] in ("Runtime.exceptionThrown", "Network.loadingFailed")
            or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
            or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
        ]
        tools.ws.close()
        return json.loads(images), errors, shot
    finally:
        stop_browser(proc)


def test_the_report_opens_in_a_real_browser_with_every_chart(deployment: Deployment, tmp_path):
    binary = chromium()  # first: without a browser there is nothing to start a deployment for
    d = deployment
    roles = {
        "prefill": {"kind": "prefill", "gpus": "0-3", "tp": 4, "port": free_ports(1)[0]},
        "decode": {"kind": "decode", "gpus": "4-7", "tp": 4, "port": free_ports(1)[0]},
        "router": {"kind": "router", "port": free_ports(1)[0], "prefill": ["prefill"], "decode": ["decode"]},
    }
    r = d.cli("up", d.write(roles, **TOP), "-d", "--rehearse", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "run"
    try:
        r = d.cli(
            "bench", d.name, "--concurrency", "1,4", "--requests", "8", "--isl", "64", "--osl", "16",
            "--duration", "60", "--slo", "ttft=5s,itl=1s", "--out", run, timeout=400,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        down = d.cli("down", d.name, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    images, errors, shot = open_report(binary, run / "report.html", tmp_path)
    (tmp_path / "report.png").write_bytes(shot)
    keep = os.environ.get("MUSE_LAUNCH_REPORT_SHOT")  # where a person wants the screenshot, to look at it
    if keep:
        Path(keep).write_bytes(shot)
    assert errors == [], json.dumps(errors, indent=1)[:4000]
    assert sorted(i["alt"] for i in images) == sorted(CHARTS), images
    for image in images:
        assert image["complete"] and image["width"] > 0 and image["height"] > 0, image
        assert image["src"].startswith("data:image/png;base64")  # inlined: the page travels alone
    assert shot.startswith(b"\x89PNG") and len(shot) > 50_000
    page = (run / "report.html").read_text()
    for href in re.findall(r"href='([^':#]+)'", page):  # aiperf's exports, beside the page
        assert (run / unquote(href)).exists(), href
