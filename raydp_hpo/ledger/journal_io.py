"""Durable file I/O and the exclusive record lock under the journal writer.

One concern: the POSIX primitives :class:`~raydp_hpo.ledger.journal.Journal` writes with —
whole writes, files created and ``fsync``'d before they are named, and the lock that keeps a
second live ledger off a journal — plus the fault tests' pause hook inside an append.

Locking: the writer holds an exclusive POSIX record lock on the whole file
(``fcntl`` ``F_OFD_SETLK`` open-file-description lock on Linux; ``fcntl.lockf`` elsewhere,
where a process-wide table stands in for the lock within the process, because a ``lockf``
lock belongs to the process and is dropped when *any* descriptor of the file is closed).
Record locks are forwarded to the server on NFS (NFSv4 byte-range locks; NLM on NFSv3), unlike
``flock``, which some NFS clients keep local. Guaranteed: two writers on hosts that mount the
same NFS export with locking enabled (not ``nolock``/``local_lock=all``) cannot both hold a
journal. Not guaranteed: locks are advisory (a program that does not lock can still write),
and an NFS lease that expires while a client is partitioned is released by the server. Because
a lock belongs to the open file and not to its name, the writer also checks before every
append that the journal's path still names the file it holds (``st_dev``/``st_ino``) and
that no one else changed its size; if not, it refuses
(:class:`~raydp_hpo.errors.JournalReplacedError`) and writes nothing. On NFS ``stat`` may be
served from the attribute cache, so a replacement can go unseen for up to ``actimeo`` seconds.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from pathlib import Path

from raydp_hpo.errors import RayDPHPOError

__all__ = ["TEST_PAUSE_ENV"]

_LOCKF_HELD: set[tuple[int, int]] = set()  # (st_dev, st_ino) locked by this process (lockf)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_new_file(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist), write ``data`` and fsync it before closing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    pos = 0
    while True:
        chunk = os.pread(fd, max(size - pos, 1 << 16), pos)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        pos += len(chunk)


def _lock_exclusive(fd: int, path: Path) -> str:
    """Take an exclusive whole-file record lock; return which kind ('ofd' or 'lockf')."""
    busy = RayDPHPOError(
        f"journal {path} is already open by another live ledger (file lock held); attach to "
        "that ledger (its Ray actor) instead of opening the journal twice"
    )
    if hasattr(fcntl, "F_OFD_SETLK"):
        # struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid} (+ padding)
        arg = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, arg)
            return "ofd"
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise busy from None
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    # POSIX lockf: per process, so this process keeps its own table of journals it holds.
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _LOCKF_HELD:
        raise busy
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            raise busy from None
        raise
    _LOCKF_HELD.add((st.st_dev, st.st_ino))
    return "lockf"


#: Test hook (set only by the fault tests, in a ledger actor's environment): a folder. While
#: ``<folder>/arm`` holds ``after_write`` or ``mid_write``, an append writes its whole record
#: (or its first half), creates ``<folder>/paused`` and sleeps before the rest and the fsync,
#: so a test can kill the process inside that window.
TEST_PAUSE_ENV = "RAYDP_HPO_TEST_PAUSE_IN_APPEND"
_TEST_PAUSE_S = 60.0


def _pause_for_tests(fd: int, data: bytes) -> bool:
    """The :data:`TEST_PAUSE_ENV` hook: True if it wrote ``data`` (pausing on the way)."""
    folder = os.environ.get(TEST_PAUSE_ENV)
    if not folder:
        return False
    try:
        mode = (Path(folder) / "arm").read_text().strip()
    except OSError:
        return False
    if mode not in ("after_write", "mid_write"):
        return False
    first = data if mode == "after_write" else data[: len(data) // 2]
    _write_all(fd, first)
    (Path(folder) / "paused").write_text(str(os.getpid()))
    time.sleep(_TEST_PAUSE_S)
    _write_all(fd, data[len(first):])
    return True
