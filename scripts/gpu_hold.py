"""Hold GPU memory like an engine does, for scripts/gpu_check.sh: through the CUDA driver API (libcuda,
which every NVIDIA driver ships), so no torch is needed. Optionally with the children that make engines
hard to stop: one that calls setsid, one that ignores SIGTERM, each holding memory of its own.

    python scripts/gpu_hold.py --gib 2 --port 31000 --setsid-child --stubborn-child
"""

from __future__ import annotations

import argparse
import ctypes
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def hold(gib: float) -> ctypes.c_uint64:
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(what: str, status: int) -> None:
        if status:
            sys.exit(f"{what} failed: CUresult {status}")

    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    check("cuInit", cuda.cuInit(0))
    check(
        "cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0)
    )  # the first GPU CUDA_VISIBLE_DEVICES shows
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(context))
    check("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(gib * (1 << 30)))))
    return pointer


def spawn_child(gib: float, ready: Path, *flags: str, setsid: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--gib", str(gib), "--ready-file", str(ready), *flags],
        start_new_session=setsid,
    )


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, required=True, help="GPU memory to hold")
    p.add_argument("--port", type=int, help="answer GET /health here once everything holds its memory")
    p.add_argument(
        "--setsid-child", action="store_true", help="a child in its own session, holding --gib too"
    )
    p.add_argument(
        "--stubborn-child", action="store_true", help="a child ignoring SIGTERM, holding --gib too"
    )
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--ready-file", type=Path, help="created once the memory is held")
    args = p.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Children first: a process must not fork once it has initialised CUDA.
    waiting = []
    scratch = Path(tempfile.mkdtemp(prefix="gpu-hold-")) if args.setsid_child or args.stubborn_child else None
    if args.setsid_child:
        waiting.append((spawn_child(args.gib, scratch / "setsid", setsid=True), scratch / "setsid"))
    if args.stubborn_child:
        waiting.append(
            (spawn_child(args.gib, scratch / "stubborn", "--ignore-sigterm"), scratch / "stubborn")
        )
    for child, ready in waiting:
        while not ready.exists():
            if child.poll() is not None:
                sys.exit(f"child {child.pid} exited with {child.returncode} before holding its memory")
            time.sleep(0.05)
        print(f"child {child.pid} (session {os.getsid(child.pid)}) holds {args.gib:g} GiB", flush=True)
    hold(args.gib)
    print(
        f"pid {os.getpid()} holds {args.gib:g} GiB on CUDA device 0 "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})",
        flush=True,
    )
    if args.ready_file:
        args.ready_file.touch()
    if args.port:
        http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
