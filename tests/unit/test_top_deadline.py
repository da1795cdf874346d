"""A server that sends its status line and headers a byte at a time, each byte well within a read timeout,
holds a plain httpx request for as long as it likes; `top`'s client bounds the whole answer."""

import socket
import threading
import time

import pytest

from muse_launch.top.deadline import bounded_client
from muse_launch.top.prom import FetchError, fetch


@pytest.fixture
def trickler():
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                for b in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Slow: " + b"y" * 10_000:
                    if stop.wait(0.02):  # one byte every 20 ms: far inside any read timeout
                        break
                    try:
                        conn.send(bytes([b]))
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
    stop.set()
    thread.join(5)
    srv.close()


def test_fetch_of_a_header_trickle_ends_by_its_deadline(trickler):
    with bounded_client(3.0) as client:
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.5s"):
            fetch(client, trickler, deadline=0.5)
        assert time.monotonic() - started < 1.5
        started = time.monotonic()
        with pytest.raises(Exception, match="deadline|timed out|ReadTimeout") as err:
            client.get(trickler, timeout=1.0)  # a health probe: bounded by the client's 3 s
        assert "Timeout" in type(err.value).__name__
        assert time.monotonic() - started < 4.5
