"""Report files of a sweep: whether a path can be written (checked before the sweep
starts), and writing one atomically (a temp file in the same directory, then
``os.replace``), so that a full disk or a Ctrl-C never leaves a truncated report and
never leaves the temp file behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import IO, Any, Iterator

__all__ = ["atomic_write", "check_writable"]


def _target(path: str) -> str:
    """Where writing ``path`` lands: through a symlink to its target."""
    return os.path.realpath(path)


def _special(real: str) -> bool:
    """An existing file that is not a regular one (/dev/stdout, a FIFO): it is written
    in place, there is nothing to replace."""
    try:
        return not stat.S_ISREG(os.stat(real).st_mode)
    except OSError:
        return False


def _create_temp(directory: str, base: str) -> tuple[int, str]:
    """A new empty file next to the target, created as ``open(path, "w")`` would create
    it (mode 0666 less the umask); its fd and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{base[:200]}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name in {directory}")


def check_writable(path: str) -> str | None:
    """Why ``path`` cannot be written as a report, or None when it can: an empty path, a
    directory, a directory that does not exist, an existing file that is read-only, or a
    directory where no file can be created (tried, as the write will do it)."""
    if not path:
        return "an empty path"
    real = _target(path)
    if os.path.isdir(real):
        return f"{path} is a directory"
    if _special(real):
        return None if os.access(real, os.W_OK) else f"{path} is not writable"
    directory = os.path.dirname(real) or "."
    if not os.path.exists(directory):
        return f"no such directory {directory}"
    if not os.path.isdir(directory):
        return f"{directory} is not a directory"
    if os.path.exists(real) and not os.access(real, os.W_OK):
        return f"{path} is read-only"
    try:
        fd, tmp = _create_temp(directory, os.path.basename(real))
    except OSError as e:
        return f"cannot create a file in {directory}: {e.strerror or e}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return None


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", encoding: str | None = None) -> Iterator[IO[Any]]:
    """A file to write ``path`` through: a temp file in the same directory that replaces
    ``path`` (keeping its permissions) only once everything was written and synced. On
    any failure, an interrupt included, the temp file is removed and ``path`` keeps what
    it had. A path that is a device or a FIFO is written in place."""
    if "b" in mode:
        encoding = None
    elif encoding is None:
        encoding = "utf-8"
    real = _target(path)
    if _special(real):
        with open(real, mode, encoding=encoding) as f:
            yield f
        return
    directory, base = os.path.split(real)
    fd, tmp = _create_temp(directory or ".", base)
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(real).st_mode))
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
