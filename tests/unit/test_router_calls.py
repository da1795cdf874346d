"""The supervisor's calls to a router's worker API go again on a fresh connection where the transport failed
once (a pooled connection that broke: seen as `[Errno 9] Bad file descriptor` failing a scale under load)."""

from __future__ import annotations

import httpx
import pytest

from muse_launch.supervise.wiring import WiringCheck
from muse_launch.supervise.workers import deregister


def test_a_broken_connection_is_tried_again_and_a_lasting_one_is_said():
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            raise httpx.ConnectError("[Errno 9] Bad file descriptor", request=request)
        if request.method == "GET":
            return httpx.Response(200, json={"workers": [{"id": "w1", "url": "http://127.0.0.1:9/"}]})
        return httpx.Response(204)

    check = WiringCheck("router", "http://127.0.0.1:8000/workers", ())
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert deregister(client, check, "http://127.0.0.1:9") is True
    assert calls == ["GET", "GET", "DELETE"]

    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(broken)) as client, pytest.raises(httpx.ConnectError):
        deregister(client, check, "http://127.0.0.1:9")
