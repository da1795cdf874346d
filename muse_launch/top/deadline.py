"""An httpx client whose every request has a deadline for the WHOLE answer, headers included (`top`,
`status`, `smoke` and `bench` read what servers answer through it).

httpx's timeouts are per read: a server that sends its status line and headers a byte at a time, each byte
within the read timeout, holds a request for ever. Here each socket read and write gets at most what is
left of the request's deadline, and a read past it raises httpx's ReadTimeout, as a slow read does.
The deadline starts when the request is sent and covers the body read through the response's stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpcore
import httpx

_local = threading.local()  # .end: the monotonic time the current request of this thread must end by


def _left(timeout: float | None) -> float | None:
    end = getattr(_local, "end", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the answer took past its deadline")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, end: float) -> None:
        self._inner, self._end = inner, end

    def __iter__(self) -> Iterator[bytes]:
        it = iter(self._inner)
        while True:
            _local.end = self._end
            try:
                chunk = next(it)
            except StopIteration:
                return
            finally:
                _local.end = None
            yield chunk

    def close(self) -> None:
        self._inner.close()


class DeadlineTransport(httpx.BaseTransport):
    """httpx's own transport, each request (headers and body) bounded to `total` seconds, or less where the
    request's own read timeout is less."""

    def __init__(self, total: float, **kwargs) -> None:
        self.total = total
        self._inner = httpx.HTTPTransport(**kwargs)
        self._inner._pool._network_backend = _Backend()  # httpcore's pool takes any NetworkBackend

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        asked = request.extensions.get("deadline")  # a tighter one, e.g. prom.fetch's
        end = time.monotonic() + (min(self.total, asked) if isinstance(asked, int | float) else self.total)
        _local.end = end
        try:
            response = self._inner.handle_request(request)
        finally:
            _local.end = None
        response.stream = _Body(response.stream, end)  # type: ignore[arg-type]
        return response

    def close(self) -> None:
        self._inner.close()


def bounded_client(total: float, verify: bool = False, **options) -> httpx.Client:
    """A client (no proxy from the environment) whose every answer is whole within `total` seconds;
    `options`: httpx.Client's own (auth, timeout)."""
    return httpx.Client(transport=DeadlineTransport(total, verify=verify), trust_env=False, **options)
