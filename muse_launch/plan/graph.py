"""Dependency waves: a node starts when everything it depends on is ready."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class Cycle(Exception):
    def __init__(self, path: list[str]):
        self.path = path
        super().__init__(" -> ".join(path))


def waves(depends_on: Mapping[str, Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    """Kahn's levels, each level in the mapping's order. Raises Cycle naming its members."""
    order = {name: i for i, name in enumerate(depends_on)}
    level: dict[str, int] = {}
    visiting: list[str] = []

    def depth(name: str) -> int:
        if name in level:
            return level[name]
        if name in visiting:
            raise Cycle(visiting[visiting.index(name) :] + [name])
        visiting.append(name)
        level[name] = 1 + max((depth(d) for d in depends_on[name]), default=-1)
        visiting.pop()
        return level[name]

    for name in depends_on:
        depth(name)
    out: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for name in sorted(depends_on, key=order.__getitem__):
        out[level[name]].append(name)
    return tuple(tuple(w) for w in out)
