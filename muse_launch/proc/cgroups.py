"""A cgroup (v2) per role, where the host offers one we may create: a process that double-forks,
calls setsid and clears its environment is still in its role's cgroup, and `cgroup.kill` ends
every member at once. Layout: <our own cgroup>/muse-launch/<deployment>-<hash of run dir>/<role>.

The child moves itself in before exec (a preexec_fn writes "0" to cgroup.procs): nothing it runs
is ever outside. Elsewhere (no cgroup2 mount, no permission, MUSE_LAUNCH_CGROUPS=0) roles run as
before, found by their marker and session: best effort.
"""

from __future__ import annotations

import hashlib
import os
import time
from functools import lru_cache
from pathlib import Path

from ..topology.grammar import path_part

CGROUPS_SWITCH = "MUSE_LAUNCH_CGROUPS"  # "0": no cgroups, markers and sessions only
LAYOUT_DIR = "muse-launch"
# Said by `down` (local/down.py containment_note) with a fix line after it: nothing is wrong, and how to
# get containment where one wants it (docs/faults.md).
BEST_EFFORT_NOTE = (
    "note: every role was found by its session and marker (no cgroup of its own here): enough, unless a "
    "role's child leaves its session and clears its environment"
)


def best_effort_fix(source: str) -> str:
    """How roles get their own cgroup on this host, as a line to type, for the file `source` ran."""
    import shlex

    if not enabled():
        return (
            f"nothing is wrong; {CGROUPS_SWITCH}=0 turned cgroups off: unset it and `up` again to have them"
        )
    if cgroup2_mount() is None:
        return "nothing is wrong; this host has no cgroup v2, so there is nothing to turn on"
    return (
        "nothing is wrong; to contain such children too, start it in a cgroup of your own: "
        f"`systemd-run --user --scope -p Delegate=yes muse-launch up {shlex.quote(source)} -d`"
    )


def enabled() -> bool:
    return os.environ.get(CGROUPS_SWITCH, "1") != "0"


@lru_cache(maxsize=1)
def cgroup2_mount() -> Path | None:
    """Where cgroup v2 is mounted (/sys/fs/cgroup on a pure-v2 host, /sys/fs/cgroup/unified on a hybrid
    one)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                before, _, after = line.partition(" - ")
                if after.split()[:1] == ["cgroup2"]:
                    return Path(before.split()[4])
    except (OSError, IndexError):
        pass
    return None


def own_cgroup() -> str | None:
    """Our cgroup in the v2 hierarchy ("0::/path" in /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def deployment_dir(deployment: str, run_dir: str) -> Path | None:
    """Where this process would put the deployment's role cgroups; None where cgroups are off or absent."""
    mount, own = cgroup2_mount(), own_cgroup()
    if not enabled() or mount is None or own is None:
        return None
    base = mount / own.strip("/") if own.strip("/") else mount
    # Never nest under a role's own cgroup (muse-launch started from inside a role): go beside it.
    parts = base.relative_to(mount).parts
    if LAYOUT_DIR in parts:
        base = mount.joinpath(*parts[: parts.index(LAYOUT_DIR)])
    return base / LAYOUT_DIR / path_part(deployment_dir_name(deployment, run_dir), "deployment name")


def deployment_dir_name(deployment: str, run_dir: str) -> str:
    """The name of the deployment's directory in the layout: its name, and a hash of its run directory."""
    return f"{deployment[:60]}-{hashlib.sha256(run_dir.encode()).hexdigest()[:12]}"


def create_role_cgroup(deployment: str, run_dir: str, role: str) -> Path | None:
    """The role's cgroup, made if need be; None where we cannot make one or move a process into it."""
    parent = deployment_dir(deployment, run_dir)
    if parent is None:
        return None
    path = parent / path_part(role, "role name")  # never outside the deployment's subtree
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path / "cgroup.procs", os.W_OK) else None


def role_cgroups(deployment: str, run_dir: str, anywhere: bool = False) -> list[Path]:
    """The role cgroups of a deployment that exist now, where this process would put them: what `up` checks
    for leftovers. With `anywhere`, wherever in the hierarchy an `up` run from another cgroup (another login's
    session scope) put them: what a `down` without state.json can still empty."""
    parent = deployment_dir(deployment, run_dir)
    if parent is not None and anywhere and not parent.is_dir():
        parent = _find_deployment_dir(parent.name)
    try:
        return sorted(p for p in parent.iterdir() if p.is_dir()) if parent else []
    except OSError:
        return []


def _find_deployment_dir(name: str, max_depth: int = 8) -> Path | None:
    """<somewhere>/muse-launch/<name>, looked for through the cgroup2 hierarchy (a few hundred directories on
    a
    systemd host; never below a muse-launch directory)."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    level = [mount]
    for _ in range(max_depth):
        below = []
        for directory in level:
            try:
                children = [c for c in os.scandir(directory) if c.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for child in children:
                if child.name == LAYOUT_DIR:
                    if (Path(child.path) / name).is_dir():
                        return Path(child.path) / name
                else:
                    below.append(child.path)
        level = below
    return None


def is_role_cgroup(path: str | Path | None) -> bool:
    """A path from state.json names a cgroup of ours: under the cgroup2 mount, in the muse-launch layout."""
    mount = cgroup2_mount()
    if path is None or mount is None:
        return False
    path = Path(path)
    try:
        relative = path.relative_to(mount)
    except ValueError:
        return False
    return ".." not in relative.parts and len(relative.parts) >= 3 and relative.parts[-3] == LAYOUT_DIR


def members(path: str | Path | None) -> list[int]:
    """The pids in the cgroup (zombies are not listed); none if it is gone or not ours."""
    if not is_role_cgroup(path):
        return []
    try:
        return [int(p) for p in (Path(path) / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def cgroup_of(pid: int) -> str | None:
    """The v2 cgroup of a process, as a path under the mount."""
    mount = cgroup2_mount()
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::") and mount is not None:
                    return str(mount / line[3:].strip().lstrip("/"))
    except OSError:
        pass
    return None


def kill(path: str | Path | None) -> bool:
    """SIGKILL every member at once (cgroup.kill, kernel 5.14+; else each listed pid). True if it went."""
    if not is_role_cgroup(path):
        return False
    try:
        (Path(path) / "cgroup.kill").write_text("1")
        return True
    except FileNotFoundError:
        for pid in members(path):
            try:
                os.kill(pid, 9)  # a member by the kernel's own list: ours, whatever its pid was before
            except OSError:
                pass
        return True
    except OSError:
        return False


def remove(path: str | Path | None, wait: float = 1.0) -> None:
    """Remove an emptied role cgroup, then its deployment's and the layout's if nothing else is in them."""
    if not is_role_cgroup(path):
        return
    path = Path(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:  # EBUSY: a member is still exiting
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)
    for parent in (path.parent, path.parent.parent):
        try:
            parent.rmdir()
        except OSError:
            return
