"""muse_launch/signals.py: a muse-launch process undoes the signal dispositions and mask it inherited (a
shell's `cmd &` ignores SIGINT and SIGQUIT), and so does what it execs; SIGHUP ignored (nohup) stays."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from muse_launch import signals
from muse_launch.topology.model import STOP_SIGNALS

pytestmark = pytest.mark.integration  # starts processes

IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}


def hostile_parent() -> None:
    """A preexec_fn: ignore and block what a careless or a shell parent would."""
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)


def sig_sets(status: str) -> dict[str, set[int]]:
    out = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigBlk"):
            mask = int(value.strip(), 16)
            out[key] = {n + 1 for n in range(64) if mask >> n & 1}
    return out


def run_under_hostile_parent(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, preexec_fn=hostile_parent
    )


def test_reset_unblocks_and_restores_the_stop_signals_but_sighup():
    code = (
        "import os, signal\nfrom muse_launch.signals import reset_inherited\nprint(reset_inherited())\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)\n"
        "os.execv('/bin/cat', ['cat', '/proc/self/status'])"
    )
    done = run_under_hostile_parent(code)
    assert done.returncode == 0, done.stderr
    restored, int_handler, status = done.stdout.split("\n", 2)
    assert restored == "['mask', 'SIGINT', 'SIGTERM', 'SIGQUIT', 'SIGUSR2']"
    assert int_handler == "True"  # Ctrl-C raises KeyboardInterrupt
    sets = sig_sets(status)  # what the program it execs starts with
    assert sets["SigBlk"] == set()
    assert sets["SigIgn"] & set(IGNORED) == {signal.SIGHUP}  # nohup's choice is kept


def test_without_a_reset_the_exec_inherits_them():
    """What the test above guards against: the mask and SIG_IGN survive exec."""
    done = run_under_hostile_parent("import os\nos.execv('/bin/cat', ['cat', '/proc/self/status'])")
    sets = sig_sets(done.stdout)
    assert sets["SigBlk"] == BLOCKED and set(IGNORED) <= sets["SigIgn"]


def test_every_stop_signal_is_restored_or_left_for_a_reason():
    # SIGINT: its own case; SIGHUP: nohup's; SIGKILL: never ignored; SIGPIPE, SIGXFSZ: Python's own
    left = {"SIGINT", "SIGHUP", "SIGKILL", "SIGPIPE", "SIGXFSZ"}
    assert set(signals.RESET_TO_DEFAULT) == set(STOP_SIGNALS) - left


def test_a_slurm_step_execs_the_role_with_default_dispositions():
    """slurm/step.py is a Python process that execs the role: neither what it inherited nor what the
    interpreter itself ignores (SIGPIPE, SIGXFSZ) reaches the role."""
    code = (
        "import sys\nfrom muse_launch.slurm.step import main\n"
        "main(['--gpus', '0', '--', 'cat', '/proc/self/status'])"
    )
    done = run_under_hostile_parent(code)
    assert done.returncode == 0, done.stderr
    sets = sig_sets(done.stdout)
    assert sets["SigBlk"] == set()
    assert sets["SigIgn"] == {signal.SIGHUP}
