"""Symbolic links planted in a run directory (issue 9, item 8): `up`, `logs` and `down` never write
through them (the files outside stay as they were, and none is created), and each either replaces
the link or refuses with a clear error naming it."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from harness import free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration

PLANTED = ["logs/web.log", "supervisor.log", "state.json", "lock", "logs"]


def snapshot(outside) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(outside.iterdir())}


def no_traceback(result) -> str:
    said = result.stdout + result.stderr
    assert "Traceback" not in said and "internal error" not in said, said
    return said


@pytest.mark.faults("8. symlinks planted in the run directory")
@pytest.mark.parametrize("planted", PLANTED)
def test_links_planted_before_up_are_never_written_through(deployment, tmp_path, planted):
    d = deployment
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("precious\n")
    (outside / "web.log").write_text("precious log\n")  # what a linked logs/ directory would hold
    before = snapshot(outside)
    link = d.run_dir / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    # A link to a file that exists, and for the lock (opened with O_CREAT) to one that does not.
    os.symlink(
        outside if planted == "logs" else outside / ("absent" if planted == "lock" else "precious"), link
    )
    (port,) = free_ports(1)
    file = d.write({"web": stand_in(port)})

    up = d.cli("up", file, "--detach")
    said = no_traceback(up)
    if up.returncode != 0:  # refused: the link is named, with what to do
        assert "symbolic link" in said and str(link) in said and "fix:" in said, said
    else:
        assert not os.path.islink(link)  # replaced by a file (or directory) of its own
    logs = d.cli("logs", d.name)
    no_traceback(logs)
    down = d.cli("down", d.name)
    assert down.returncode == 0, no_traceback(down)
    assert snapshot(outside) == before  # nothing written through, nothing created
    assert not port_open(port)
    assert d.alive() == []


@pytest.mark.faults("8. symlinks planted in the run directory")
def test_a_log_link_planted_while_running_is_never_written_through(deployment, tmp_path):
    d = deployment
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious"
    victim.write_text("precious\n")
    (port,) = free_ports(1)
    file = d.write({"web": stand_in(port, restart={"policy": "on-failure", "max": 2})})
    assert d.cli("up", file, "--detach").returncode == 0
    first = d.role("web")["pid"]
    log = d.run_dir / "logs" / "web.log"
    log.unlink()
    os.symlink(victim, log)

    shown = d.cli("logs", d.name)  # not read through: a clear error naming the link
    assert shown.returncode == 1 and "symbolic link" in no_traceback(shown) and str(log) in shown.stderr, (
        shown
    )
    os.kill(first, signal.SIGKILL)  # its restart must not open the link for its output
    wait_for(
        lambda: d.role("web")["state"] in ("failed", "ready") and d.role("web")["pid"] != first, timeout=30
    )
    web = d.role("web")
    if web["state"] == "failed":
        assert "symbolic link" in d.state_file()["roles"][0]["reason"]
    down = d.cli("down", d.name)
    assert down.returncode == 0, no_traceback(down)
    assert victim.read_text() == "precious\n"
    assert os.path.islink(log) or not log.exists() or victim.read_text() == "precious\n"
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert d.alive() == []
