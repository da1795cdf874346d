"""Watching a router's worker list from a test: which workers it lists healthy, and when one leaves it."""

from __future__ import annotations

import threading
import time

import httpx


def listed_urls(router_url: str, timeout: float = 5.0) -> set[str] | None:
    """The URLs the router lists as healthy; None when it does not answer."""
    try:
        answer = httpx.get(f"{router_url}/workers", timeout=timeout).json()
    except (httpx.HTTPError, ValueError):
        return None
    return {w["url"] for w in answer["workers"] if w.get("is_healthy", True)}


class OutWatch:
    """When `url` first leaves the router's healthy worker list (asked every 20 ms from a thread)."""

    def __init__(self, router_url: str, url: str):
        self.router_url, self.url = router_url, url
        self.out_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while self.out_at is None:
            urls = listed_urls(self.router_url)
            if urls is not None and self.url not in urls:
                self.out_at = time.monotonic()
            if self._stop.wait(0.02):  # the next look, or at once when stopped
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
