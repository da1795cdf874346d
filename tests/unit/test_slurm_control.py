"""`scale` and `restart` on SLURM reach the batch host's supervisor through request and answer files in the
shared run directory (slurm/request_files.py), relayed to its control socket: the answer comes back line by
line,
a refusal keeps its kind, a hostile request file is never read through, and a supervisor that stops beating
is said to be gone."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from wire_handler import WireHandler

from muse_launch.change import adopt
from muse_launch.errors import NotSupported, RuntimeFailure
from muse_launch.rundir.state import RunDir
from muse_launch.slurm.files import SlurmFiles
from muse_launch.slurm.request_files import FileDesk, request
from muse_launch.supervise.control_socket import ControlServer


@pytest.fixture
def files(tmp_path, monkeypatch) -> SlurmFiles:
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = RunDir.of("demo")
    run_dir.path.mkdir()
    return SlurmFiles(run_dir)


class BatchHost:
    """The batch host's half: a heartbeat and the desk polled, as slurm/batch.py's watcher does."""

    def __init__(self, files: SlurmFiles, handler):
        self.files = files
        self.server = ControlServer(files.run_dir, WireHandler(handler))
        self.desk = FileDesk(files)
        self.desk.open = True
        self.beating = True
        self.stop = threading.Event()
        self.files.write_text(self.files.heartbeat, f"{time.time():.3f}\n")
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            if self.beating:
                self.files.write_text(self.files.heartbeat, f"{time.time():.3f}\n")
            self.desk.poll()
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.server.close()


def test_a_change_is_answered_through_files_with_its_progress_then_its_result(files):
    def handler(op, args, say):
        say(f"doing {op} {args['role']}")
        say("decode-1: ready in 0.50s")
        return {"instance": "decode-1"}

    host = BatchHost(files, handler)
    try:
        lines: list[str] = []
        assert request(files, "add", {"role": "decode"}, lines.append, timeout=30) == {"instance": "decode-1"}
        assert lines == ["doing add decode", "decode-1: ready in 0.50s"]
        assert list(files.changes.iterdir()) == []  # request and answer removed
    finally:
        host.close()


def test_a_refusal_comes_back_with_its_kind_and_fix(files):
    def handler(op, args, say):
        raise NotSupported("decode spans nodes", fix="give each replica its own role")

    host = BatchHost(files, handler)
    try:
        with pytest.raises(NotSupported, match="decode spans nodes") as caught:
            request(files, "add", {"role": "decode"}, print, timeout=30)
        assert caught.value.fix == "give each replica its own role"
    finally:
        host.close()


def test_a_request_that_is_a_link_or_garbage_is_not_followed_nor_run(files, tmp_path):
    ran = []
    host = BatchHost(files, lambda op, args, say: ran.append(op) or {})
    try:
        files.changes.mkdir(parents=True, exist_ok=True)
        outside = tmp_path / "outside.json"
        outside.write_text(json.dumps({"op": "remove", "args": {"instance": "decode"}}))
        os.symlink(outside, files.changes / f"{'a' * 16}.request")
        (files.changes / f"{'b' * 16}.request").write_text('{"op": "rm -rf", "args": {}}')
        (files.changes / f"{'c' * 16}.request").write_bytes(b"x" * (200 << 10))
        deadline = time.monotonic() + 10
        while any(p.suffix == ".request" for p in files.changes.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(p.suffix == ".request" for p in files.changes.iterdir())
        assert outside.exists() and ran == []
        assert not (files.changes / f"{'a' * 16}.answer").exists()  # a link is removed unread
        for name in ("b", "c"):
            answer = json.loads((files.changes / f"{name * 16}.answer").read_text())
            assert answer["ok"] is False and answer["error"].startswith("bad request")
    finally:
        host.close()


def test_no_heartbeat_no_request(files):
    with pytest.raises(RuntimeFailure, match="no supervisor runs") as caught:
        request(files, "add", {"role": "decode"}, print, timeout=5)
    assert "down demo" in caught.value.fix
    assert not files.changes.exists() or list(files.changes.iterdir()) == []


def test_a_supervisor_that_stops_beating_mid_change_is_said_gone(files):
    started, finish, finished = threading.Event(), threading.Event(), threading.Event()

    def handler(op, args, say):
        started.set()
        finish.wait(60)  # the change goes on until the test lets it end
        finished.set()
        return {}

    host = BatchHost(files, handler)
    try:
        threading.Thread(target=lambda: started.wait(10) and setattr(host, "beating", False)).start()
        with pytest.raises(RuntimeFailure, match="went away before it answered"):
            request(files, "add", {"role": "decode"}, print, timeout=60)
        assert not finished.is_set()  # the heartbeat's staleness said so, not the change's end
    finally:
        finish.set()
        host.close()


def test_an_edited_file_goes_to_the_batch_host_as_a_copy_and_its_secrets_as_digests(files, tmp_path):
    """`up FILE --on slurm` of a running job: the request names a copy in the run directory (the batch host
    may not see the user's path) and carries each `${env:...}` value as a salted digest, never the value."""
    from muse_launch.slurm.slurm_backend import SlurmBackend
    from muse_launch.supervise.change_executor import env_digest

    seen = {}

    def handler(op, args, say):
        seen.update(op=op, **args)
        return {"file": args["file"]}

    edited = tmp_path / "edited.yaml"
    edited.write_text("version: 1\n")
    host = BatchHost(files, handler)
    try:
        change = adopt(str(edited), ("a=1",), {"TOKEN": "s3cret-value-9"}, "ab" * 32)
        SlurmBackend().change(files.run_dir, change, print)
    finally:
        host.close()
    assert seen["op"] == "adopt" and seen["sets"] == '["a=1"]' and seen["sha256"] == "ab" * 32
    assert seen["file"] == str(files.dir / "adopted.yaml")
    assert (files.dir / "adopted.yaml").read_text() == "version: 1\n"
    assert json.loads(seen["env_sha256"]) == {"TOKEN": env_digest("", "TOKEN", "s3cret-value-9")}
    assert "env" not in seen
    on_disk = "".join(p.read_text(errors="replace") for p in files.run_dir.path.rglob("*") if p.is_file())
    assert "s3cret-value-9" not in on_disk and "s3cret-value-9" not in json.dumps(seen)


@pytest.mark.parametrize(
    "placed",
    [None, {}, {"nodes": "n0"}, {"nodes": [{"name": 1, "address": "10.0.0.1"}]}, {"nodes": [["n0"]]}],
)
def test_a_job_whose_nodes_are_not_recorded_is_not_diffed(files, placed):
    from muse_launch.core import load_plan
    from muse_launch.slurm.slurm_backend import SlurmBackend

    if placed is not None:
        files.write_json(files.placement, placed)
    loaded = load_plan("examples/slurm-scale.yaml")
    with pytest.raises(RuntimeFailure, match="its job's nodes are not recorded"):
        SlurmBackend().plan_as_started(files.run_dir, loaded, rehearse=True)


def test_the_edited_file_is_moved_onto_the_jobs_nodes(files):
    from muse_launch.core import load_plan
    from muse_launch.slurm.slurm_backend import SlurmBackend

    nodes = [{"name": "n0", "address": "10.9.0.1"}, {"name": "n1", "address": "10.9.0.2"}]
    files.write_json(files.placement, {"nodes": nodes})
    loaded = load_plan("examples/slurm-scale.yaml")
    plan = SlurmBackend().plan_as_started(files.run_dir, loaded, rehearse=True)
    hosts = {s.name: s.host for s in plan.specs}
    assert hosts == {"prefill": "10.9.0.1", "decode": "10.9.0.2", "router": "10.9.0.1"}
