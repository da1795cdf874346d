"""Files in a run directory, opened without following symbolic links.

The run directory is ours, but anyone who can write into it could plant a link there (`logs/ROLE.log` ->
a file outside the home) and have the next `up` write through it. Every component below a trusted `root`
(the state home) is opened with O_NOFOLLOW, directories with O_DIRECTORY, relative to the directory
above it, so no link is followed at any level; only regular files are opened (a FIFO would block).
A link where a file of ours should be is an error (PlantedLink), or, for a file `up` recreates anyway
(a role's log, supervisor.log, state.json), replaced by a new file: never written through.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PlantedLink(OSError):
    """A symbolic link (or a FIFO, a device...) where a file or directory of ours should be."""

    def __init__(self, path: Path | str, what: str = "a symbolic link"):
        super().__init__(
            errno.ELOOP, f"is {what}; muse-launch follows no link in its run directory", str(path)
        )
        self.path = Path(path)
        self.fix = f"remove it (`rm {path}`) and run the command again"

    def __str__(self) -> str:
        return f"{self.filename} {self.strerror}"


def _kind(dir_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not a directory"
    return "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"


def _open_dirs(path: Path, root: Path, create: bool, replace_links: bool = False) -> int:
    """An fd of `path`'s directory, each component below `root` opened without following links."""
    parts = path.parent.relative_to(root).parts
    if create:
        root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)  # the home: trusted as given
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = root
    try:
        for part in parts:
            where = where / part
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile by another process; opened below like any other
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                kind = _kind(fd, part)
                if not (replace_links and kind == "a symbolic link"):
                    raise PlantedLink(where, kind) from None
                os.unlink(part, dir_fd=fd)  # the link goes, not what it points to
                os.mkdir(part, DIR_MODE, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _regular(fd: int, path: Path) -> int:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise PlantedLink(path, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def _root(path: Path, root: Path | None) -> Path:
    return path.parent if root is None else root


def open_nofollow(path: Path, flags: int, mode: int = FILE_MODE, *, root: Path | None = None) -> int:
    """`os.open(path, flags)`, following no link in any component below `root` (default: the file's own
    directory, so only the file itself); with O_CREAT, missing directories are made (0700). A link or
    anything but a regular file raises PlantedLink."""
    path = Path(path)
    dir_fd = _open_dirs(path, _root(path, root), create=bool(flags & os.O_CREAT))
    try:
        # O_NONBLOCK: opening a FIFO must not hang (it is refused below).
        fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PlantedLink(path) from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise PlantedLink(path, "not a regular file") from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # the whole path, for the message
    finally:
        os.close(dir_fd)
    return _regular(fd, path)


def open_fresh(path: Path, *, root: Path | None = None, mode: int = FILE_MODE) -> int:
    """A new, empty regular file at `path` for writing (a log `up` starts afresh): whatever was there,
    a file or a planted link, is removed first (the link, never its target); a linked directory on the
    way is replaced by a real one."""
    path = Path(path)
    dir_fd = _open_dirs(path, _root(path, root), create=True, replace_links=True)
    try:
        try:
            os.unlink(path.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(
            path.name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dir_fd,
        )
    finally:
        os.close(dir_fd)
    return fd


def replace_file(path: Path, data: bytes, *, root: Path | None = None, mode: int = FILE_MODE) -> None:
    """Write `data` to a new temporary file beside `path` and rename it over `path`: readers see the old
    content or the new, and a link planted at `path` is replaced, not written through."""
    path = Path(path)
    dir_fd = _open_dirs(path, _root(path, root), create=True)
    tmp = f".{path.name}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # one of ours left by a crash, or a planted link
        except FileNotFoundError:
            pass
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
            )
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path.with_name(tmp))) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException as exc:
            try:
                os.unlink(tmp, dir_fd=dir_fd)  # a full disk must not keep the half-written file
            except OSError:
                pass
            if isinstance(exc, OSError) and not exc.filename:
                raise OSError(exc.errno, exc.strerror, str(path)) from None
            raise
    finally:
        os.close(dir_fd)


def read_nofollow(path: Path, *, root: Path | None = None, limit: int | None = None) -> bytes:
    """The file's content (at most `limit` bytes), following no link below `root`."""
    fd = open_nofollow(Path(path), os.O_RDONLY, root=root)
    with os.fdopen(fd, "rb") as f:
        return f.read() if limit is None else f.read(limit)
