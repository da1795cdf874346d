"""Kubernetes' $(VAR) expansion of a container's command, args and env values, as the kubelet does
it (k8s.io/kubernetes third_party/forked/golang/expansion): `$$` is a literal `$`, `$(NAME)`
is NAME's value when NAME is defined, and is left as written when it is not."""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, defined: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 >= len(text):
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:  # no closing parenthesis: kept as written, the rest read on
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : end]
            out.append(defined[name] if name in defined else text[i : end + 1])
            i = end + 1
        else:
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)
