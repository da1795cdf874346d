"""top's reader of Prometheus metrics against hostile answers: bad lines, huge lines, NaN, too many samples,
and servers that answer slowly, hugely, compressed or not at all."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
import time

import httpx
import pytest

from muse_launch.top import prom
from muse_launch.top.prom import FetchError, fetch, parse

GOOD = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
sglang:prompt_tokens_total{model_name="m"} 1.5e3
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 5
"""


def test_samples_with_labels_and_values():
    parsed = parse(GOOD)
    assert parsed.values("sglang:num_running_reqs") == [3.0]
    assert parsed.values("sglang:prompt_tokens_total") == [1500.0]
    assert parsed.by_label("vllm:num_requests_running", "engine") == {"0": 2.0, "1": 5.0}
    assert parsed.bad_lines == 0


def test_a_bad_line_costs_that_line_only():
    text = GOOD + 'broken{x="1} 3\n}}{{ not a sample\nsglang:num_queue_reqs{model_name="m"} 7\n'
    parsed = parse(text)
    assert parsed.values("sglang:num_queue_reqs") == [7.0]
    assert parsed.values("sglang:num_running_reqs") == [3.0]
    assert parsed.bad_lines == 2


def test_label_values_with_quotes_newlines_and_backslashes_read_back():
    parsed = parse('m{worker="http://h:1/\\"x\\"\\n\\\\"} 1\n')
    assert parsed.samples[0].labels == {"worker": 'http://h:1/"x"\n\\'}


def test_non_finite_values_are_dropped_not_shown_as_numbers():
    parsed = parse("a NaN\nb +Inf\nc -Inf\nd 4\n")
    assert [s.name for s in parsed.samples] == ["d"]
    assert parsed.dropped == 3


def test_overlong_lines_are_skipped():
    parsed = parse(f'big{{l="{"x" * (prom.MAX_LINE + 1)}"}} 1\nsmall 2\n')
    assert parsed.values("small") == [2.0] and parsed.values("big") == []
    assert parsed.bad_lines == 1


def test_samples_past_the_cap_are_dropped(monkeypatch):
    monkeypatch.setattr(prom, "MAX_SAMPLES", 10)
    parsed = parse("".join(f's{{i="{i}"}} {i}\n' for i in range(50)))
    assert len(parsed.samples) == 10 and parsed.dropped == 40


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "\x00\x01\x02 garbage \xff",
        "# only comments\n",
        "{" * 10000,
        "a 1 2 3 4\n",
        "a{" + 'l="v",' * 5000 + "} 1\n",
    ],
)
def test_garbage_never_raises(text):
    parse(text)


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "404":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        if mode == "gzip":
            body = gzip.compress(b"a 1\n" * 1000)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.end_headers()
        try:
            if mode == "huge":
                for _ in range(10_000):
                    self.wfile.write(b"x" * 65536)
            elif mode == "drip":
                for _ in range(100):
                    self.wfile.write(b"a 1\n")
                    self.wfile.flush()
                    time.sleep(0.1)
            else:
                self.wfile.write(GOOD.encode())
        except OSError:
            pass  # the reader hung up: what it should do


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _url(httpd) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/metrics"


def test_fetch_reads_a_good_answer(server):
    server.mode = "ok"
    with httpx.Client() as client:
        assert parse(fetch(client, _url(server))).values("sglang:num_running_reqs") == [3.0]


@pytest.mark.parametrize(
    "mode, said",
    [
        ("404", "HTTP 404"),
        ("huge", "answer over 4 MiB"),
        ("drip", "slower than 0.8s"),
        ("gzip", "compressed"),
    ],
)
def test_fetch_bounds_a_hostile_answer(server, mode, said):
    server.mode = mode
    started = time.monotonic()
    with httpx.Client() as client, pytest.raises(FetchError) as caught:
        fetch(client, _url(server))
    assert said in str(caught.value)
    assert time.monotonic() - started < 5  # bounded in time, whatever the server does


def test_fetch_of_a_closed_port_says_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with httpx.Client() as client, pytest.raises(FetchError, match="refused"):
        fetch(client, f"http://127.0.0.1:{port}/metrics")


def test_only_the_names_asked_for_are_parsed_and_a_bad_line_elsewhere_costs_nothing():
    text = GOOD + 'other_histogram_bucket{le="0.1"} 4\nnot even {{ a line\n'
    parsed = parse(text, {"sglang:num_running_reqs", "vllm:num_requests_running"})
    assert {s.name for s in parsed.samples} == {"sglang:num_running_reqs", "vllm:num_requests_running"}
    assert parsed.bad_lines == 0
    assert parse('sglang:num_running_reqs{x="1} 3\n', {"sglang:num_running_reqs"}).bad_lines == 1
