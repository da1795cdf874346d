"""The simulated engine process: binds what the real engine binds, starts its wiring, reports
readiness, and stops on SIGTERM/SIGINT within ~50 ms.

One :class:`SimEngine` per process holds the state its parts share; each concern is its own
module: the HTTP API (:mod:`.api`, :mod:`.generate`), EPD wiring (:mod:`.encoders`),
multi-node rendezvous (:mod:`.wiring`), the KV hand-off (:mod:`.handoff`, :mod:`.transfer`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from . import transfer as tr
from .api import Api
from .config import SimConfig
from .encoders import EncoderWiring
from .handoff import KVHandoff
from .modeldir import make_model_dir
from .timing import Batch, Rates
from .wiring import DistInit, RetryLog, hostport


class BindError(Exception):
    pass


def bind_socket(host: str, port: int) -> socket.socket:
    host = host or "0.0.0.0"
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, stype, proto, _, addr = infos[0]
    s = socket.socket(family, stype, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(addr)
        s.listen(512)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


class SimEngine:
    def __init__(
        self,
        cfg: SimConfig,
        *,
        ready_after: float = 2.0,
        state_dir: str | None = None,
        kv_timeout: float = 3.0,
        itl: float = 0.002,
        loopback: bool = False,
        out=None,
        rates: Rates | None = None,
    ):
        self.cfg = cfg
        self.ready_after = ready_after
        self.kv_timeout = kv_timeout
        self.itl = itl
        self.loopback = loopback
        self.out = out or sys.stdout
        self.t0 = time.monotonic()
        self.started_wall = time.time()
        self.stopping = False
        self.ready_logged = False
        self.engine_id = (cfg.kv_transfer_config or {}).get("engine_id") or str(uuid.uuid4())
        self.slots = tr.SlotTable()
        self.session: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task] = []
        self.runners: list[web.AppRunner] = []
        self._tmp_state: str | None = None
        self.state_dir = state_dir  # None: a temp dir made at start, removed at stop
        self.model_dir: str | None = None
        self.batch = Batch(rates or Rates(itl_s=itl))
        self.retries = RetryLog()
        self.api = Api(self)
        self.encoders = EncoderWiring(self)
        self.dist = DistInit(self)
        self.kv = KVHandoff(self)

    # ----------------------------------------------------------- logging / state
    @property
    def requests_served(self) -> int:
        return self.batch.counters.requests_total

    @requests_served.setter
    def requests_served(self, value: int) -> None:  # an encoder's requests (encoders.py)
        self.batch.counters.requests_total = value

    @property
    def requests_running(self) -> int:
        return self.batch.counters.running

    def log(self, msg: str) -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        ms = int((time.time() % 1) * 1000)
        tag = f"{self.cfg.engine} {self.cfg.role}"
        if self.cfg.nnodes > 1:
            tag += f" node{self.cfg.node_rank}"
        try:
            self.out.write(f"{ts}.{ms:03d} [muse-sim {tag} :{self.cfg.port}] {msg}\n")
            self.out.flush()
        except (ValueError, OSError):
            pass

    def wiring_blockers(self) -> list[str]:
        return self.dist.blockers()  # a language worker is ready without its encoders (SGLang 0.5.23)

    def is_ready(self) -> bool:
        return (
            not self.stopping
            and time.monotonic() - self.t0 >= self.ready_after
            and not self.wiring_blockers()
        )

    def kv_identity(self) -> dict[str, Any]:
        c = self.cfg
        ident = {
            "model": c.model,
            "kv_cache_dtype": c.kv_cache_dtype,
            "page_size": c.page_size,
            "engine_id": self.engine_id,
            "tp_size": c.tp_size,
            "engine": c.engine,
            "url": f"http://{hostport(c.advertised_host, c.port)}",
        }
        if c.engine == "sglang":
            ident["transfer_backend"] = c.transfer_backend
        else:
            ident["kv_connector"] = c.kv_connector
        return ident

    def http_app(self) -> web.Application:
        return self.api.app()

    # ----------------------------------------------------------- binding
    def planned_binds(self) -> list[tuple[str, str, int, Callable[[], web.Application]]]:
        c = self.cfg
        binds = []
        if c.serves_http:
            binds.append(("HTTP", c.host, c.port, self.http_app))
        if c.binds_kv_bootstrap:
            binds.append(
                ("disaggregation bootstrap", c.host, c.bootstrap_port, lambda: tr.sglang_bootstrap_app(self))
            )
        if c.binds_encoder_bootstrap:
            binds.append(("encoder bootstrap", c.host, c.encoder_bootstrap_port, self.encoders.bootstrap_app))
        if c.nixl_side_channel and (c.node_rank == 0 or c.dp_size_local):
            h, p = c.nixl_side_channel  # one listener per local DP rank: base + the DP rank
            for k, rank in enumerate(c.local_dp_ranks):
                purpose = "NIXL side channel" + (f" (DP rank {rank})" if c.dp_size > 1 else "")
                binds.append((purpose, h, p + k, lambda: tr.nixl_side_channel_app(self)))
        if c.mooncake_bootstrap and c.node_rank == 0:
            h, p = c.mooncake_bootstrap
            binds.append(("Mooncake bootstrap", h, p, lambda: tr.mooncake_bootstrap_app(self)))
        if c.dist_init and c.node_rank == 0:
            h, p = c.dist_init
            binds.append(("dist-init", h, p, self.dist.app))
        if self.loopback:
            binds = [(purpose, "127.0.0.1", port, f) for purpose, _, port, f in binds]
        return binds

    def bind_all(self) -> list[tuple[str, str, int, socket.socket, Callable]]:
        bound = []
        for purpose, host, port, factory in self.planned_binds():
            try:
                s = bind_socket(host, port)
            except OSError as e:
                for b in bound:
                    b[3].close()
                raise BindError(
                    f"[Errno {e.errno}] error while attempting to bind on address "
                    f"({host!r}, {port}): {e.strerror.lower() if e.strerror else e}"
                    f" ({purpose} port {port})"
                ) from None
            bound.append((purpose, host, port, s, factory))
        return bound

    # ----------------------------------------------------------- lifecycle
    async def start(self) -> None:
        c = self.cfg
        self.log(
            f"start: engine={c.engine} role={c.role} model={c.model} "
            f"served_model_name={c.served_model_name} tp={c.tp_size} ep={c.ep_size} "
            f"ready_after={self.ready_after}s pid={os.getpid()}"
        )
        if c.ignored:
            self.log(f"ignoring {len(c.ignored)} engine argument(s) the simulator does not model")
        if self.state_dir is None:
            self.state_dir = self._tmp_state = tempfile.mkdtemp(prefix="muse-sim-")
        self.model_dir = make_model_dir(self.state_dir, c)
        self._route_aiohttp_logs()
        bound = self.bind_all()
        for purpose, host, port, sock, factory in bound:
            runner = web.AppRunner(factory(), handle_signals=False, access_log=None, shutdown_timeout=0.2)
            await runner.setup()
            site = web.SockSite(runner, sock, shutdown_timeout=0.2)
            await site.start()
            self.runners.append(runner)
            self.log(f"listening: {purpose} on {hostport(host, port)}")
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        jobs = self.encoders.background()
        if self.dist.pending and c.node_rank > 0:
            jobs.append(self.dist.join())
        jobs.append(self._watch_ready())
        self.tasks.extend(asyncio.create_task(j) for j in jobs)

    def _route_aiohttp_logs(self) -> None:
        """aiohttp's own error logs become single lines in our log.  sglang-router probes
        every worker for gRPC (an HTTP/2 prior-knowledge preface) before using HTTP/1.1;
        that probe is logged in one line instead of a traceback."""
        engine = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                exc = record.exc_info[1] if record.exc_info else None
                text = str(exc or "")
                if any(m in text for m in ("PRI/Upgrade", "b'PRI'", "HTTP/2")):  # C / pure parser
                    engine.log(
                        "refused an HTTP/2 (gRPC) connection attempt; this server "
                        "speaks HTTP/1.1 (routers probe for gRPC first)"
                    )
                    return
                detail = f": {type(exc).__name__}: {text.splitlines()[0] if text else ''}" if exc else ""
                engine.log(f"aiohttp {record.levelname.lower()}: {record.getMessage()}{detail}")

        for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access"):
            lg = logging.getLogger(name)
            lg.handlers = [_Handler()]
            lg.propagate = False
            lg.setLevel(logging.WARNING)

    async def stop(self) -> None:
        self.stopping = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.encoders.unregister()
        await asyncio.gather(*(r.cleanup() for r in self.runners), return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        if self._tmp_state:
            shutil.rmtree(self._tmp_state, ignore_errors=True)

    async def _watch_ready(self) -> None:
        last_blockers: list[str] = []
        while True:
            if self.is_ready():
                if not self.ready_logged:
                    self.ready_logged = True
                    self.log(
                        f"ready: GET /health now returns 200 (start-to-ready "
                        f"{time.monotonic() - self.t0:.2f}s)"
                    )
                return
            b = self.wiring_blockers()
            if b and b != last_blockers and time.monotonic() - self.t0 >= self.ready_after:
                self.log("not ready: " + "; ".join(b))
                last_blockers = b
            await asyncio.sleep(0.05)


async def serve(engine: SimEngine) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signame = {}

    def on_signal(sig: int) -> None:
        signame["sig"] = signal.Signals(sig).name
        engine.stopping = True
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await engine.start()
    except BindError as e:
        engine.log(f"ERROR: {e}")
        await engine.stop()
        return 1
    await stop.wait()
    t = time.monotonic()
    engine.log(f"received {signame.get('sig', 'stop')}: shutting down")
    await engine.stop()
    engine.log(f"shutdown complete in {time.monotonic() - t:.3f}s")
    return 0
