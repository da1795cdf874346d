"""Reading a server's Prometheus metrics, bounded: its answer is hostile (any size, any pace, any bytes).

`fetch` reads at most MAX_BYTES within a deadline; `parse` turns the text format into samples with
prometheus_client's own parser (of the metric names asked for only), line by line where the whole text does
not parse, so one bad line costs that line only; non-finite values and samples past MAX_SAMPLES are dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import httpx

MAX_BYTES = 4 << 20  # vLLM with a few DP engines answers ~0.5 MiB
MAX_SAMPLES = 100_000
MAX_LINE = 16 << 10
DEADLINE = 0.8  # seconds for one answer, whole (a refresh is every second)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class Parsed:
    samples: list[Sample] = field(default_factory=list)
    bad_lines: int = 0  # lines that did not parse, or were too long
    dropped: int = 0  # samples past MAX_SAMPLES, or not finite

    def values(self, name: str) -> list[float]:
        return [s.value for s in self.samples if s.name == name]

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """name's samples summed per value of `label` (samples without it are left out)."""
        out: dict[str, float] = {}
        for s in self.samples:
            if s.name == name and label in s.labels:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out


class FetchError(Exception):
    """Why no metrics came back: said in a few words, shown in place of the numbers."""


def _name(line: str) -> str:
    """The metric name a sample line starts with (what precedes its labels or value)."""
    return line.split("{", 1)[0].split(None, 1)[0] if line.strip() else ""


def parse(text: str, wanted: Collection[str] | None = None) -> Parsed:
    """The samples of `text`; with `wanted`, only those of these names (the rest is skipped unparsed: a
    vLLM answer holds thousands of histogram buckets that top never reads)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = Parsed()
    lines = text.splitlines()
    if wanted is not None:
        lines = [line for line in lines if not line.startswith("#") and _name(line) in wanted]
    long_lines = [i for i, line in enumerate(lines) if len(line) > MAX_LINE]
    if long_lines:
        out.bad_lines += len(long_lines)
        lines = [line for line in lines if len(line) <= MAX_LINE]
    try:
        _keep(out, text_string_to_metric_families("\n".join(lines) + "\n"))
        return out
    except (ValueError, TypeError, IndexError, KeyError):
        out = Parsed(bad_lines=len(long_lines))
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        try:
            _keep(out, text_string_to_metric_families(line + "\n"))
        except (ValueError, TypeError, IndexError, KeyError):
            out.bad_lines += 1
    return out


def _keep(out: Parsed, families: Iterable) -> None:
    for family in families:
        for s in family.samples:
            if (
                len(out.samples) >= MAX_SAMPLES
                or not isinstance(s.value, (int, float))
                or not math.isfinite(s.value)
            ):
                out.dropped += 1
                continue
            out.samples.append(Sample(str(s.name), dict(s.labels), float(s.value)))


def fetch(client: httpx.Client, url: str, deadline: float = DEADLINE, max_bytes: int = MAX_BYTES) -> str:
    """The body of GET `url`, read within `deadline` seconds and `max_bytes` bytes; FetchError otherwise."""
    start = time.monotonic()
    timeout = httpx.Timeout(deadline, connect=min(deadline, 0.5))
    try:
        headers = {"Accept": "text/plain", "Accept-Encoding": "identity"}  # no decompression bomb
        # the "deadline" extension: the whole answer, headers too, where the client is deadline.bounded_client
        with client.stream(
            "GET", url, timeout=timeout, headers=headers, extensions={"deadline": deadline}
        ) as answer:
            if answer.status_code != 200:
                raise FetchError(f"HTTP {answer.status_code}")
            if answer.headers.get("content-encoding", "identity").lower() != "identity":
                raise FetchError("a compressed answer, though not asked for")
            body = bytearray()
            for chunk in answer.iter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise FetchError(f"answer over {max_bytes >> 20} MiB")
                if time.monotonic() - start > deadline:
                    raise FetchError(f"answer slower than {deadline:g}s")
            return body.decode("utf-8", errors="replace")
    except httpx.TimeoutException:
        raise FetchError(f"no answer within {deadline:g}s") from None
    except httpx.ConnectError:
        raise FetchError("connection refused") from None
    except httpx.HTTPError as exc:
        raise FetchError(type(exc).__name__) from None
