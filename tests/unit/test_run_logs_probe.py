"""Logs (tail, follow, prefixes) and readiness probes, on their own."""

from __future__ import annotations

import io
import os
import socket

import httpx

from muse_launch.addresses import connect_host
from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.proc.process import describe_exit
from muse_launch.rundir.logs import LogFollower, RolePrinter, last_lines
from muse_launch.supervise.probe import ReadinessCheck


def test_exit_statuses_read_as_words():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "killed by SIGKILL"


def test_last_lines_reads_only_the_end(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert last_lines(log, 3) == ["line 99997", "line 99998", "line 99999"]
    assert last_lines(log, 0) == []
    assert last_lines(tmp_path / "missing.log", 5) == []


def test_follower_gives_complete_lines_and_survives_truncation(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("old\n")
    follower = LogFollower({"a": log}, from_end=True)
    with open(log, "a") as f:
        f.write("new 1\nhalf")
    assert follower.read_new() == [("a", "new 1")]
    with open(log, "a") as f:
        f.write(" done\n")
    assert follower.read_new() == [("a", "half done")]
    log.write_text("fresh\n")  # a new `up` truncates the log
    assert follower.read_new() == [("a", "fresh")]


def test_role_prefix_is_padded_and_coloured_only_on_a_terminal(tmp_path):
    plain, coloured = io.StringIO(), io.StringIO()
    RolePrinter(plain, ["router", "encoder"], colour=False).line("router", "hello [bold]")
    RolePrinter(coloured, ["router", "encoder"], colour=True).line("router", "hello")
    assert plain.getvalue() == "router  | hello [bold]\n"
    assert coloured.getvalue() == "\x1b[36mrouter  |\x1b[0m hello\n"


def probe_client(answers: dict[str, list[int]]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        queue = answers[request.url.path]
        code = queue.pop(0) if len(queue) > 1 else queue[0]
        if code == 0:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(code)

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_http_probe_treats_refused_and_503_as_not_yet(tmp_path):
    check = ReadinessCheck(
        Probe(ProbeKind.HTTP, ("/health",)),
        "127.0.0.1",
        1,
        tmp_path / "x.log",
        probe_client({"/health": [0, 503, 200]}),
    )
    assert not check.check(0) and check.last_seen == "GET /health: connection refused"
    assert not check.check(0) and check.last_seen == "GET /health answered 503"
    assert check.check(0)


def test_http_probe_asks_every_path_in_order(tmp_path):
    probe = Probe(ProbeKind.HTTP, ("/health", "/v1/models"))
    check = ReadinessCheck(
        probe, "127.0.0.1", 1, tmp_path / "x.log", probe_client({"/health": [200], "/v1/models": [404, 200]})
    )
    assert not check.check(0) and check.last_seen == "GET /v1/models answered 404"
    assert check.check(0)


def test_log_and_tcp_probes(tmp_path):
    log = tmp_path / "role.log"
    log.write_text("loading\nUvicorn running on")
    check = ReadinessCheck(
        Probe(ProbeKind.LOG, pattern="Uvicorn running"), "127.0.0.1", None, log, httpx.Client()
    )
    assert not check.check(0)  # the line is not complete yet
    with open(log, "a") as f:
        f.write(" http://0.0.0.0:8000\n")
    assert check.check(0)

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert ReadinessCheck(Probe(ProbeKind.TCP), "127.0.0.1", port, log, httpx.Client()).check(0)
    closed = ReadinessCheck(Probe(ProbeKind.TCP), "127.0.0.1", port, log, httpx.Client())
    assert not closed.check(0) and "refused" in closed.last_seen.lower()
    assert connect_host("0.0.0.0") == "127.0.0.1" and connect_host("::") == "::1"


def _role_log(path):
    """As a role holds its log: O_APPEND (process.open_role_log)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)


def test_copy_truncate_keeps_the_newest_and_the_writer_appends_at_the_new_end(tmp_path):
    from muse_launch.plan.spec import LogPolicy
    from muse_launch.rundir.logfiles import LogCaps, rotated

    log = tmp_path / "logs" / "r.log"
    fd = _role_log(log)
    caps = LogCaps({"r": (log, LogPolicy(max_size=100, keep=2))})
    for n in range(4):
        os.write(fd, f"batch {n}\n".encode() * 20)  # 160 bytes: past the cap
        caps.tend(now=float(n))
    os.write(fd, b"after\n")
    os.close(fd)
    assert log.read_bytes() == b"after\n"  # written at offset 0 of the truncated file: no hole
    assert rotated(log, 1).read_text() == "batch 3\n" * 20
    assert rotated(log, 2).read_text() == "batch 2\n" * 20
    assert not rotated(log, 3).exists()  # keep: 2


def test_follower_reads_on_across_a_rotation_and_splits_a_line_longer_than_a_chunk(tmp_path):
    from muse_launch.rundir.logfiles import READ_CHUNK, rotate

    log = tmp_path / "r.log"
    fd = _role_log(log)
    follower = LogFollower({"r": log}, from_end=True)
    os.write(fd, b"one\ntwo\n")
    rotate(log, keep=1)  # before the follower read them: they are in r.log.1 now
    os.write(fd, b"three\n" + b"x" * (READ_CHUNK + 10) + b"\n")
    os.close(fd)
    seen = []
    while new := follower.read_new():
        seen += [text for _, text in new]
    assert [s[:5] + str(len(s)) for s in seen] == ["one3", "two3", "three5", f"xxxxx{READ_CHUNK}", "xxxxx10"]


def test_last_lines_of_a_file_without_newlines_reads_a_bounded_end(tmp_path):
    from muse_launch.rundir.logfiles import READ_CHUNK

    log = tmp_path / "one-line.log"
    log.write_bytes(b"z" * (READ_CHUNK * 50))
    assert last_lines(log, 2) == ["z" * READ_CHUNK] * 2


def test_masks_hide_secret_arguments_by_value():
    from muse_launch.proc.masks import Masks

    masks = Masks.of(
        ["--key", "s3cret-value", "1", "--token=s3cret-value"],
        lambda v: v.replace("s3cret-value", "***").replace("1", "***") if v in ("s3cret-value", "1") else v,
    )
    masks = Masks.from_json(masks.to_json())
    assert [masks.token(a) for a in ["--key", "s3cret-value", "127.0.0.1", "1", "--api=s3cret-value"]] == [
        "--key",
        "***",
        "127.0.0.1",
        "***",
        "--api=***",
    ]
    assert "s3cret" not in str(masks.to_json())


def test_up_forgets_an_earlier_runs_rotated_logs_but_never_a_links_target(tmp_path):
    from muse_launch.rundir.logfiles import forget_rotated, rotated

    log = tmp_path / "logs" / "prefill.log"
    log.parent.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("not the launcher's\n")
    for n in (1, 2, 5):  # a gap: someone removed .3 and .4 by hand
        rotated(log, n).write_text(f"earlier run {n}\n")
    rotated(log, 6).symlink_to(outside)
    forget_rotated(log)
    assert sorted(p.name for p in log.parent.iterdir()) == []
    assert outside.read_text() == "not the launcher's\n"


def test_a_follower_looking_in_the_middle_of_a_rotation_sees_it_done(tmp_path, monkeypatch):
    """A follower looks between the rotation's steps (here: right after the truncation, r.log.1 moved to
    .2 and the new r.log.1 not yet in place): it waits for the rotation to end, then reads on from
    r.log.1. Looking at the half-done rotation, it took the log for truncated and read it all twice."""
    import threading

    from muse_launch.rundir.logfiles import rotate

    log = tmp_path / "home" / "dep" / "logs" / "r.log"
    fd = _role_log(log)
    follower = LogFollower({"r": log}, from_end=True)
    os.write(fd, b"".join(b"%d\n" % n for n in range(10)))
    rotate(log, keep=2)  # a first rotation: a r.log.1 that the next one moves to .2
    assert [t for _, t in follower.read_new()] == [str(n) for n in range(10)]
    os.write(fd, b"".join(b"%d\n" % n for n in range(10, 15)))
    assert [t for _, t in follower.read_new()] == [str(n) for n in range(10, 15)]  # read up to the log's end
    os.write(fd, b"".join(b"%d\n" % n for n in range(15, 20)))
    seen: list[str] = []
    looks: list[threading.Thread] = []
    truncate = os.ftruncate

    def truncate_then_look(file: int, length: int) -> None:
        truncate(file, length)
        look = threading.Thread(target=lambda: seen.extend(t for _, t in follower.read_new()))
        look.start()
        look.join(1.0)  # it waits for the rotation's lock (it did not: it read the half-done state)
        looks.append(look)

    monkeypatch.setattr(os, "ftruncate", truncate_then_look)
    assert rotate(log, keep=2) is True
    monkeypatch.undo()
    for look in looks:
        look.join()
    while new := follower.read_new():
        seen += [t for _, t in new]
    os.close(fd)
    assert seen == [str(n) for n in range(15, 20)]  # each line once


def test_a_rotation_waits_for_a_followers_look_unless_forced(tmp_path):
    import fcntl

    from muse_launch.rundir.logfiles import rotate, rotated

    log = tmp_path / "r.log"
    log.write_text("x\n" * 10)
    with open(log, "rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)  # a follower in the middle of a look
        assert rotate(log, keep=1) is False and log.stat().st_size == 20 and not rotated(log).exists()
        assert rotate(log, keep=1, force=True) is True and log.stat().st_size == 0 and rotated(log).exists()


def test_masks_grow_with_an_adopted_files_secrets_under_the_same_salt():
    """`up FILE` of a running deployment with a new secret: the masks `logs` and `down` read hide the new
    value and still the first one (what the first launches print is still in their logs)."""
    from muse_launch.proc.masks import Masks

    first = Masks.of(["--api-key", "first-s3cret"], lambda v: "***" if v == "first-s3cret" else v)
    grown = first.adding(["--api-key", "second-s3cret", "plain"], lambda v: "***" if "second" in v else v)
    assert grown.salt == first.salt
    line = "started with first-s3cret, now second-s3cret on plain"
    assert grown.text(line) == "started with ***, now *** on plain"
    assert (
        first.text(line) == "started with ***, now second-s3cret on plain"
    )  # the record before is unchanged
    assert Masks().adding(["x-s3cret"], lambda v: "***").text("x-s3cret") == "***"  # no masks yet: a salt
