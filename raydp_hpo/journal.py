"""Append-only, fsync'd journal of a privacy ledger.

One JSON object per line. The first line is a header with the budget and settings; each
further line is one admitted charge, with a sequence number and a CRC-32 of its canonical
JSON. A record is durable (written, flushed and ``fsync``'d) *before* the ledger acknowledges
the admission, so an acknowledged charge can never be lost by a crash.

Replay rules:

* A torn **last** record (no trailing newline, or unparsable / bad CRC on the last line) was
  never acknowledged; it is dropped with a warning and truncated away.
* Any other damage — a bad line in the middle, a sequence gap, a missing or mismatching
  header — raises :class:`~raydp_hpo.errors.LedgerCorruptedError`. The budget is never reset
  silently: a reset budget is a privacy breach.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

from raydp_hpo.errors import LedgerCorruptedError, RayDPHPOError

__all__ = ["Journal", "read_journal", "JOURNAL_VERSION"]

JOURNAL_VERSION = 1


def _canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _with_crc(record: dict[str, Any]) -> str:
    body = _canonical(record)
    crc = zlib.crc32(body.encode())
    return _canonical({**record, "crc": crc}) + "\n"


def _check_crc(record: dict[str, Any]) -> bool:
    crc = record.get("crc")
    body = {k: v for k, v in record.items() if k != "crc"}
    return isinstance(crc, int) and zlib.crc32(_canonical(body).encode()) == crc


def read_journal(path: str | os.PathLike[str], *, repair: bool = False) -> tuple[
    dict[str, Any] | None, list[dict[str, Any]]
]:
    """Parse a journal: (header or None if the file is empty/missing, charge records).

    With ``repair`` a torn last record is truncated away on disk; without it, it is only
    skipped. Both warn.
    """
    p = Path(path)
    if not p.exists():
        return None, []
    raw = p.read_bytes()
    if not raw:
        return None, []
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    records: list[dict[str, Any]] = []
    offsets: list[int] = []
    pos = 0
    torn_at: int | None = None
    for i, line in enumerate(complete):
        start = pos
        pos += len(line) + 1
        try:
            rec = json.loads(line)
            ok = isinstance(rec, dict) and _check_crc(rec)
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
        if not ok:
            if i == len(complete) - 1 and not tail:
                torn_at = start
                break
            raise LedgerCorruptedError(
                f"journal {p} is corrupted at line {i + 1} (bad JSON or checksum) and it is not "
                "the last record; refusing to guess the spent budget. Restore the journal from "
                "a backup; do not delete it (that would reset the budget)."
            )
        records.append(rec)
        offsets.append(start)
    if tail:
        torn_at = pos
    if torn_at is not None:
        warnings.warn(
            f"journal {p}: dropping a torn last record at byte {torn_at} (never acknowledged)",
            RuntimeWarning,
            stacklevel=2,
        )
        if repair:
            with open(p, "r+b") as fh:
                fh.truncate(torn_at)
                fh.flush()
                os.fsync(fh.fileno())
    if not records:
        if torn_at == 0:
            return None, []
        raise LedgerCorruptedError(f"journal {p} has no header")
    header, charges = records[0], records[1:]
    if header.get("kind") != "header" or header.get("version") != JOURNAL_VERSION:
        raise LedgerCorruptedError(
            f"journal {p} does not start with a version-{JOURNAL_VERSION} header: {header!r}"
        )
    for expected_seq, rec in enumerate(charges, start=1):
        if rec.get("kind") != "charge" or rec.get("seq") != expected_seq:
            raise LedgerCorruptedError(
                f"journal {p}: record {expected_seq} is out of sequence or not a charge: {rec!r}"
            )
    return header, charges


class Journal:
    """The writer side of a journal file; holds an exclusive ``flock`` while open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a+b")  # noqa: SIM115 - kept open for the ledger's life
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise RayDPHPOError(
                f"journal {self.path} is already open by another live ledger (file lock held); "
                "attach to that ledger instead of opening the journal twice"
            ) from None
        self._seq = 0

    def load(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        header, charges = read_journal(self.path, repair=True)
        self._seq = len(charges)
        self._fh.seek(0, os.SEEK_END)
        return header, charges

    def _append_line(self, line: str) -> None:
        data = line.encode()
        size_before = self._fh.seek(0, os.SEEK_END)
        try:
            self._fh.write(data)
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                self._fh.truncate(size_before)
                self._fh.flush()
                os.fsync(self._fh.fileno())
            raise

    def write_header(self, header: dict[str, Any]) -> None:
        self._append_line(_with_crc({"kind": "header", "version": JOURNAL_VERSION, **header}))
        self._fsync_dir()

    def append_charge(self, record: dict[str, Any]) -> None:
        seq = self._seq + 1
        self._append_line(_with_crc({"kind": "charge", "seq": seq, **record}))
        self._seq = seq

    def _fsync_dir(self) -> None:
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if not self._fh.closed:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
