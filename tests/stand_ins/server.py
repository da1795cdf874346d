"""A stand-in serving process for tests: speaks enough of an engine's HTTP to be probed and
registered by the real sglang-router, and misbehaves on request. It accepts `sglang serve`'s
command line (unknown flags ignored), so a topology's `launcher:` can put it in SGLang's place.

Standard library only, so any Python can run it. Delays count from the process's exec, so a
launcher's overhead is what remains when they are subtracted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEALTH_PATHS = {"/health", "/health_generate", "/readiness", "/ready", "/liveness"}
SERVER_INFO_PATHS = {"/server_info", "/get_server_info", "/model_info", "/get_model_info"}


def process_age() -> float:
    """Seconds since this process was exec'd (from /proc), or since the script started."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - SCRIPT_START


SCRIPT_START = time.monotonic()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--also-listen", type=int, action="append", default=[], help="extra TCP port to hold")
    p.add_argument(
        "--ready-after", type=float, default=0.0, help="/health answers 503 until this age, then 200"
    )
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--exit-during-startup", type=int, metavar="CODE", help="exit with CODE at --exit-after")
    p.add_argument("--exit-after", type=float, default=0.3)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument(
        "--setsid-grandchild", action="store_true", help="spawn a child that calls setsid and lingers"
    )
    p.add_argument(
        "--escape-holding",
        type=int,
        metavar="PORT",
        help="spawn a child that double-forks, calls setsid, clears its environment and holds PORT",
    )
    p.add_argument(
        "--retitled-child",
        action="store_true",
        help="spawn a child that rewrites its title (blanking its environ), as vLLM's EngineCore does",
    )
    p.add_argument(
        "--crash-after-ready", type=float, metavar="S", help="exit 1 this long after becoming ready"
    )
    p.add_argument(
        "--crash-once", metavar="FILE", help="with --crash-after-ready: crash only while FILE is absent"
    )
    p.add_argument("--stop-delay", type=float, default=0.0, help="seconds between SIGTERM and exit")
    p.add_argument("--hang", action="store_true", help="accept every connection and never answer")
    p.add_argument(
        "--spew", type=int, default=0, metavar="BYTES", help="once ready, log this many bytes a second"
    )
    p.add_argument(
        "--flood",
        type=int,
        default=0,
        metavar="MB",
        help="once ready, log this many MB at 50 MB/s (65,000-byte writes of numbered 100-byte lines)",
    )
    p.add_argument(
        "--flood-after", type=float, default=0.0, metavar="S", help="start the flood S seconds after ready"
    )
    p.add_argument("--bind-when", metavar="FILE", help="listen only once FILE exists (until then: refused)")
    p.add_argument(
        "--survive-bind-failure",
        action="store_true",
        help="a port it cannot bind is reported, and the process lives on (as some servers do)",
    )
    p.add_argument(
        "--crash-tokens",
        metavar="DIR",
        help="once ready: for each file put in DIR, remove it and exit 1 (a crash on demand)",
    )
    p.add_argument("--model-path", default=os.path.dirname(os.path.abspath(__file__)))
    # SGLang's own flags, when the planner renders this script in place of `sglang serve`.
    p.add_argument("--disaggregation-mode")
    p.add_argument("--disaggregation-bootstrap-port", type=int)
    p.add_argument("--language-only", action="store_true")
    p.add_argument("--encoder-bootstrap-port", type=int)
    p.add_argument("--encoder-urls", nargs="*", default=[])
    # A router's wiring, when a topology's router `launcher:` puts this script in its place: GET /workers
    # lists it.
    p.add_argument("--prefill", nargs="+", action="append", default=[], metavar="URL [BOOTSTRAP_PORT]")
    p.add_argument("--decode", action="append", default=[])
    p.add_argument("--worker-urls", nargs="*", default=[])
    args, _ = p.parse_known_args(argv)
    # Hold the ports SGLang 0.5.23 binds: KV bootstrap on a prefill, encoder bootstrap on a language worker
    # (which answers GET /list_encoder_urls there: its --encoder-urls, see encoder_list_server).
    if args.disaggregation_mode == "prefill" and args.disaggregation_bootstrap_port:
        args.also_listen.append(args.disaggregation_bootstrap_port)
    return args


def encoder_list_server(host: str, port: int, urls: list[str]) -> ThreadingHTTPServer:
    """A language worker's encoder bootstrap server, as SGLang 0.5.23 has it: up before the worker's
    own /health, listing --encoder-urls (this stand-in never evicts one)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"encoder_urls": urls} if self.path == "/list_encoder_urls" else "OK"
            data = json.dumps(body).encode()
            self.send_response(200 if self.path in ("/list_encoder_urls", "/health") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *a) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    ready_at = float("inf") if args.never_ready or args.exit_during_startup is not None else args.ready_after

    def is_ready() -> bool:
        return process_age() >= ready_at

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if args.hang:
                time.sleep(3600)  # the connection stays open, unanswered
            if path in HEALTH_PATHS:
                self.reply(200 if is_ready() else 503, {"status": "ok" if is_ready() else "starting"})
            elif path in SERVER_INFO_PATHS:
                info = {
                    "model_path": args.model_path,
                    "tokenizer_path": args.model_path,
                    "is_generation": True,
                }
                self.reply(200, info)
            elif path == "/workers" and (args.prefill or args.decode or args.worker_urls):
                urls = [p[0] for p in args.prefill] + args.decode + args.worker_urls
                self.reply(
                    200, {"workers": [{"url": u, "is_healthy": True} for u in urls], "total": len(urls)}
                )
            elif path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": args.model_path, "object": "model"}]})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not is_ready():
                self.reply(503, {"error": "starting"})
                return
            self.reply(
                200, {"text": "ok", "meta_info": {"id": "stand-in", "finish_reason": {"type": "stop"}}}
            )

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *a) -> None:
            print(fmt % a, flush=True)

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop_later(args.stop_delay))

    if args.bind_when:
        while not os.path.exists(args.bind_when):
            time.sleep(0.05)
    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        if not args.survive_bind_failure:
            raise
        print(f"cannot listen on {args.host}:{args.port} ({e.strerror}); living on without it", flush=True)
        while True:
            time.sleep(3600)
    if args.language_only and args.encoder_bootstrap_port:
        encoder_list_server(args.host, args.encoder_bootstrap_port, args.encoder_urls)
    held = [socket.create_server((args.host, port)) for port in args.also_listen]  # noqa: F841 (held open until exit)
    print(f"stand-in pid {os.getpid()} listening on {args.host}:{args.port} {args.also_listen}", flush=True)

    if args.setsid_grandchild:
        escape = "import os, time; os.setsid(); print('escaped', os.getpid(), flush=True); time.sleep(3600)"
        child = subprocess.Popen([sys.executable, "-c", escape])
        print(f"spawned escaping grandchild {child.pid}", flush=True)

    if args.escape_holding:
        escape = (
            "import os, socket, time\n"
            "if os.fork(): os._exit(0)\n"
            "os.setsid()\n"
            "if os.fork(): os._exit(0)\n"
            f"held = socket.create_server(({args.host!r}, {args.escape_holding}))\n"
            "print('escaped', os.getpid(), flush=True)\n"
            "time.sleep(3600)\n"
        )
        subprocess.Popen([sys.executable, "-c", escape], env={})  # no marker: an empty environment
        print(f"spawned a child escaping with port {args.escape_holding}", flush=True)

    if args.retitled_child:
        engine = (
            "import os, time, setproctitle; setproctitle.setproctitle('stand-in::engine'); "
            "print('retitled', os.getpid(), flush=True); time.sleep(3600)"
        )
        child = subprocess.Popen([sys.executable, "-c", engine])
        print(f"spawned retitled child {child.pid}", flush=True)

    threading.Thread(target=server.serve_forever, daemon=True).start()
    watch_lifecycle(args, ready_at)


def spew(per_second: int) -> None:
    for second in range(3600):
        for i in range(per_second // 100):
            print(f"{second:04d} {i:06d} " + "x" * 88)
        sys.stdout.flush()
        time.sleep(1.0)


FLOOD_RATE = 50 * 1024 * 1024  # bytes a second: the rate issue 9 saw fill 1 GB of log in 20 s


def flood(megabytes: int) -> None:
    started = time.monotonic()
    for n in range(megabytes * 16):
        block = b"".join(b"%09d " % (n * 650 + i) + b"x" * 90 + b"\n" for i in range(650))  # 65,000 bytes
        os.write(1, block)  # stdout is the log file: no Python buffering in between
        ahead = (n + 1) * len(block) / FLOOD_RATE - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    os.write(1, b"flood done\n")


def crash_on_token(directory: str) -> None:
    while True:
        for name in sorted(os.listdir(directory)):
            os.unlink(os.path.join(directory, name))
            print(f"crash token {name}: crashing", flush=True)
            os._exit(1)
        time.sleep(0.05)


def stop_later(delay: float) -> None:
    print(f"SIGTERM: stopping in {delay}s", flush=True)
    threading.Timer(delay, lambda: os._exit(0)).start()


def watch_lifecycle(args: argparse.Namespace, ready_at: float) -> None:
    if args.exit_during_startup is not None:
        time.sleep(max(0.0, args.exit_after - process_age()))
        print(f"failing during startup with exit code {args.exit_during_startup}", flush=True)
        os._exit(args.exit_during_startup)
    if ready_at != float("inf"):
        time.sleep(max(0.0, ready_at - process_age()))
        print(f"ready after {process_age():.2f}s", flush=True)
        if args.spew:
            threading.Thread(target=spew, args=(args.spew,), daemon=True).start()
        if args.flood:
            flooding = threading.Timer(args.flood_after, flood, args=(args.flood,))
            flooding.daemon = True
            flooding.start()
        if args.crash_tokens:
            threading.Thread(target=crash_on_token, args=(args.crash_tokens,), daemon=True).start()
        if args.crash_after_ready is not None and not (args.crash_once and os.path.exists(args.crash_once)):
            time.sleep(args.crash_after_ready)
            if args.crash_once:
                open(args.crash_once, "w").close()
            print("crashing after ready", flush=True)
            os._exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
