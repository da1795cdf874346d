"""StateSaver: a supervisor whose state.json cannot be written keeps the record, warns once, and writes
it at the next change or retry once the disk takes it again."""

from __future__ import annotations

import errno

from test_run_state import PLAN

from muse_launch.rundir import state as state_mod
from muse_launch.rundir.state import RunDir, StateSaver
from muse_launch.supervise.planned_record import planned_record


def test_failed_writes_warn_once_and_are_retried(tmp_path, monkeypatch):
    run_dir = RunDir(tmp_path / "home" / "demo")
    record = planned_record(PLAN, "demo.yaml", str)
    written, failing, said, now = [], [True], [], [0.0]

    def write(run_dir, record):
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir.state_file))
        written.append(record)

    monkeypatch.setattr(state_mod, "write_state", write)
    saver = StateSaver(run_dir, said.append, clock=lambda: now[0])
    for _ in range(5):
        saver.save(record)
        saver.retry()
    assert len(said) == 1 and "cannot write" in said[0] and "No space left" in said[0]
    failing[0] = False
    saver.retry()  # too soon: nothing tried
    assert written == []
    now[0] = state_mod.STATE_RETRY_SECONDS
    saver.retry()
    assert written == [record] and saver.pending is None
    assert len(said) == 2 and "written again" in said[1]
    saver.retry()
    assert written == [record]
