"""What a name, an environment variable or a host in a topology file may be (docs/security.md).

Names become paths (the run directory, log files, cgroups), SLURM step names, container names and,
in `export`, Kubernetes objects and DNS names; env keys are written into shell scripts; hosts into
URLs and comments. So each has a strict grammar, checked whole (`fullmatch`: a `$` would let a
trailing newline through), and nothing outside it reaches a path, a script or a manifest.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

from ..errors import UsageError

MAX_NAME = 63  # a DNS label; the run directory, log files and exported object names are built from names
MAX_HOST = 253

# A role: an RFC 1035 label (it becomes a Kubernetes object and a DNS name in `export`).
ROLE_NAME = re.compile(r"[a-z]([a-z0-9-]*[a-z0-9])?")
# A node of `nodes:`: an RFC 1123 label (may start with a digit).
NODE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
# The deployment: a directory of its own under MUSE_LAUNCH_HOME, `down NAME`.
DEPLOYMENT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
# POSIX: what a shell accepts in `NAME=value`.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?")


def role_name(name: str) -> str:
    if not ROLE_NAME.fullmatch(name):
        raise Refused(
            f"role name {name!r}: a role is named with lowercase letters, digits and '-', starting "
            f"with a letter and not ending with '-' (it names files, and DNS names in export)",
            f"rename the role, e.g. {suggest(name, 'role')!r}",
        )
    if len(name) > MAX_NAME:
        raise Refused(
            f"role name {name[:20]}... is {len(name)} characters; at most {MAX_NAME}",
            "use a shorter name (it names log files and DNS names in export)",
        )
    return name


def node_name(name: str) -> str:
    if not NODE_NAME.fullmatch(name):
        raise Refused(
            f"node name {name!r}: a node is named with lowercase letters, digits and '-', not "
            f"starting or ending with '-' (part of each instance's name, log file and cgroup)",
            f"rename the node, e.g. {suggest(name, 'node')!r}; its address goes in nodes: "
            f"{{NAME: {{address: ...}}}}",
        )
    if len(name) > MAX_NAME:
        raise Refused(
            f"node name {name[:20]}... is {len(name)} characters; at most {MAX_NAME}",
            "use a shorter node name",
        )
    return name


def deployment_name(name: str) -> str:
    if not DEPLOYMENT_NAME.fullmatch(name):
        raise Refused(
            f"deployment name {name!r}: use lowercase letters, digits, '-', '_' and '.', starting "
            f"with a letter or digit (it names the run directory)",
            f"rename it, e.g. name: {suggest(name, 'deployment')}",
        )
    if len(name) > MAX_NAME:
        raise Refused(
            f"deployment name {name[:20]}... is {len(name)} characters; at most {MAX_NAME}",
            "use a shorter name",
        )
    return name


def env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise Refused(
            f"environment name {name!r}: a variable is named with letters, digits and '_', not "
            f"starting with a digit (what a shell takes in NAME=value)",
            f"rename it, e.g. {suggest(name, 'VAR', upper=True)!r}",
        )
    return name


def host(text: str) -> str:
    if not is_host(text):
        raise Refused(
            f"{text!r} is not an IP address or a host name",
            "write an address such as 10.0.0.1, ::1 or gpu-01.cluster.local",
        )
    return text


def one_line(text: str) -> str:
    problem = control_problem(text)
    if problem:
        raise Refused(problem, "write the value on one line, without control characters")
    return text


def suggest(name: str, fallback: str, upper: bool = False) -> str:
    """A name in the grammar close to `name`, for the fix."""
    if upper:
        out = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
        return ("_" + out if out[:1].isdigit() else out) or fallback
    out = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")[:MAX_NAME].strip("-")
    return out if out and out[0].isalpha() else (f"{fallback}-{out}" if out else fallback)


def is_host(text: str) -> bool:
    """An IPv4 or IPv6 address (bare or in brackets) or an RFC 1123 host name."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        address = None
    if address is not None:
        return bare == text or address.version == 6
    if bare != text or not text or len(text) > MAX_HOST:
        return False
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    return all(len(label) <= MAX_NAME and _HOST_LABEL.fullmatch(label) for label in labels)


def control_problem(text: str) -> str | None:
    """CR, LF, NUL and the other control characters: no single-line value may hold one."""
    for char in text:
        if ord(char) < 0x20 or ord(char) == 0x7F or 0x80 <= ord(char) < 0xA0 or char in "\u2028\u2029":
            return f"{text!r} holds a control character ({_char_name(char)}), which this value cannot carry"
    return None


def _char_name(char: str) -> str:
    return {"\n": "LF", "\r": "CR", "\0": "NUL", "\t": "TAB"}.get(char, f"U+{ord(char):04X}")


class Refused(ValueError):
    """A value outside its grammar; the loader prints `fix` under the problem."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


def instance_names(role: str, replicas: int, nodes: Sequence[str]) -> list[str]:
    """The names a role's processes get (log files, cgroups, SLURM steps, `status`): `role`,
    `role-0`.. `role-N` for replicas, `role@node` for each node of a multi-node role."""
    if nodes:
        return [f"{role}@{node}" for node in nodes]
    return [f"{role}-{i}" for i in range(replicas)] if replicas > 1 else [role]


def derived_forms(instance: str) -> tuple[str, ...]:
    """An instance's name and the forms other names are built from: a container name (and an exported
    role) writes '@' as '-'."""
    return tuple(dict.fromkeys((instance, instance.replace("@", "-"))))


def name_clashes(roles: Mapping[str, tuple[int, Sequence[str]]]) -> list[tuple[str, str, str]]:
    """(role, other role, the name both would make) for each generated name two roles share; `roles`
    maps each role to its replicas and nodes."""
    owner: dict[str, str] = {}
    out: list[tuple[str, str, str]] = []
    for role, (replicas, nodes) in roles.items():
        for instance in instance_names(role, replicas, nodes):
            for form in derived_forms(instance):
                other = owner.setdefault(form, role)
                if other != role and not any(r == role and o == other for r, o, _ in out):
                    out.append((role, other, form))
    return out


class UnsafeName(UsageError):
    """A name that would not stay one entry of its directory (`..`, a '/', a control character)."""


def path_part(name: str, what: str = "name") -> str:
    """`name`, if it is one directory entry that stays where it is put: the second line of defence
    behind the grammar, at each place a name becomes a path (run directory, logs, cgroups)."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or one_line_problem(name)
        or len(name.encode(errors="surrogateescape")) > 255
    ):
        raise UnsafeName(
            f"{what} {name[:80]!r} cannot be a file name: it would leave its directory or is not one entry",
            fix="use a name of letters, digits and '-' (docs/security.md)",
        )
    return name


def one_line_problem(text: str) -> bool:
    return control_problem(text) is not None
