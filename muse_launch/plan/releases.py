"""Release strings in order, pure: the start policy compares an engine's release with the one that
tolerates a late peer, the host's checks with the ones a rule needs (host/versions.py reads them)."""

from __future__ import annotations

import re


def version_key(text: str) -> tuple:
    """Orders release strings: 0.5.9 < 0.5.13 < 0.5.23, 0.33.0rc1 < 0.33.0 < 0.33.0.post1; a local
    tag (+cpu) is ignored."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)(.*)$", text.split("+", 1)[0].strip())
    if not m:
        return ((), 0, text)
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    tag = m.group(2).lstrip(".-_")
    rank = 1 if not tag else 2 if tag.startswith("post") else 0
    return (tuple(release), rank, tag)
