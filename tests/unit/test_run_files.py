"""files.py: no link below the home is followed, at any level, for reading or writing."""

from __future__ import annotations

import os

import pytest

from muse_launch.files import PlantedLink, open_fresh, open_nofollow, read_nofollow, replace_file


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home" / "demo" / "logs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim").write_text("precious")
    return tmp_path / "home"


def test_a_linked_file_or_directory_is_refused_at_every_level(home):
    outside = home.parent / "outside"
    os.symlink(outside / "victim", home / "demo" / "logs" / "web.log")
    with pytest.raises(PlantedLink, match="web.log is a symbolic link") as caught:
        open_nofollow(home / "demo" / "logs" / "web.log", os.O_WRONLY | os.O_APPEND, root=home)
    assert "rm " in caught.value.fix and caught.value.filename.endswith("web.log")
    os.rename(home / "demo" / "logs", home / "demo" / "old-logs")
    os.symlink(outside, home / "demo" / "logs")  # the directory itself
    with pytest.raises(PlantedLink, match="logs is a symbolic link"):
        read_nofollow(home / "demo" / "logs" / "victim", root=home)
    assert (outside / "victim").read_text() == "precious"


def test_replacing_and_recreating_remove_the_link_never_its_target(home):
    outside = home.parent / "outside"
    os.symlink(outside / "victim", home / "demo" / "state.json")
    replace_file(home / "demo" / "state.json", b"{}", root=home)
    assert (
        not os.path.islink(home / "demo" / "state.json")
        and read_nofollow(home / "demo" / "state.json") == b"{}"
    )
    os.rmdir(home / "demo" / "logs")
    os.symlink(outside, home / "demo" / "logs")
    os.close(open_fresh(home / "demo" / "logs" / "victim", root=home))
    assert os.path.isdir(home / "demo" / "logs") and not os.path.islink(home / "demo" / "logs")
    assert (outside / "victim").read_text() == "precious"
    assert sorted(os.listdir(home / "demo")) == ["logs", "state.json"]  # no temporary file left


def test_a_fifo_is_refused_without_hanging(home):
    os.mkfifo(home / "demo" / "lock")
    for flags in (os.O_RDONLY, os.O_RDWR, os.O_WRONLY):
        with pytest.raises(PlantedLink, match="not a regular file"):
            open_nofollow(home / "demo" / "lock", flags, root=home)


def test_missing_directories_are_made_private(home):
    fd = open_nofollow(home / "new" / "logs" / "a.log", os.O_WRONLY | os.O_CREAT, root=home)
    os.close(fd)
    assert oct(os.stat(home / "new").st_mode & 0o777) == "0o700"
    with pytest.raises(FileNotFoundError):
        open_nofollow(home / "absent" / "a.log", os.O_RDONLY, root=home)


def test_downs_containment_note_says_nothing_is_wrong_and_a_fix_per_host(monkeypatch) -> None:
    from muse_launch.proc import cgroups

    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "0")
    assert cgroups.best_effort_fix("a b.yaml").startswith("nothing is wrong; MUSE_LAUNCH_CGROUPS=0 turned")
    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "1")
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: None)
    assert cgroups.best_effort_fix("a b.yaml") == (
        "nothing is wrong; this host has no cgroup v2, so there is nothing to turn on"
    )
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: "/sys/fs/cgroup")
    assert cgroups.best_effort_fix("a b.yaml").endswith(
        "`systemd-run --user --scope -p Delegate=yes muse-launch up 'a b.yaml' -d`"
    )
