"""Append-only, fsync'd, hash-chained journal of a privacy ledger.

One JSON object per line. The first line is a header with the budget and settings; each
further line is one admitted charge or a run's release marker (:data:`RECORD_KINDS`). A record is durable (written, flushed and ``fsync``'d)
*before* the ledger acknowledges the admission, so an acknowledged charge is never lost by a
crash of the writer.

Format (version 2, written by this module):

* every line is the canonical JSON of its body (sorted keys, no spaces) with one more key,
  ``"chain"``, appended last: ``<body without its closing brace>,"chain":"<64 hex>"}``;
* ``chain₀ = SHA-256("raydp-hpo journal v2\\0" ‖ header body)`` and
  ``chainₖ = SHA-256(chainₖ₋₁ ‖ body of record k)`` over the raw bytes, so each record's hash
  covers every byte before it: a changed, removed, inserted or reordered record anywhere
  breaks the chain at that record (and ``seq`` must count 1, 2, 3, ...);
* the journal is created atomically: header written and ``fsync``'d to a temporary file,
  which is then hard-linked to the journal's name (``os.link`` fails if the name exists), so
  the name never refers to a file without a complete header.

Version-1 journals (CRC-32 per record, no chain, written by raydp-hpo ≤ 0.1) are still read
and appended to in their own format: an append-only audit log is never rewritten, and a file
of one format is easier to verify than a mixed one. They get every check below except the
chain and the seal (a removed middle record is still caught by ``seq``; a cut-off end is
not). To give an old journal the new checks, start a new ledger; a journal is never migrated
in place.

Replay rules (the same for readers and the writer):

* Only an **incomplete final line** (bytes after the last newline) can be a torn write: it
  was never acknowledged, since a record is acknowledged only after its newline is
  ``fsync``'d. The writer moves those bytes to a side file ``<journal>.torn-<UTC time>``
  (the journal is cut back to its last complete record only after the side file is
  ``fsync``'d) and warns, naming the side file; readers only warn. Nothing is deleted.
* Any complete line that fails its check — bad JSON, bad chain/CRC, wrong ``seq`` or kind,
  at any position, the last one included — is corruption:
  :class:`~raydp_hpo.errors.LedgerCorruptedError` naming the file, line, record and byte
  offset. So are an empty file and a file without a complete header. The budget is never
  reset silently: a reset budget is a privacy breach.

Truncation and replacement (version 2): a file cut inside record k looks exactly like a
crash while record k was being written, and a file cut at a line boundary looks complete. The
witness is a seal file ``<journal>.seal`` beside it: after each record is ``fsync``'d, the writer
records (number of records, chain hash after them, header hash) in one of two fixed 256-byte
slots (alternating, each with its own CRC, so a torn slot leaves the other valid; not
``fsync``'d: after a power loss the seal may lag, which weakens the check but never raises a
false alarm, since it is written only after the records it vouches for are durable). Opening
or reading a journal that has fewer records than its seal claims, or other records up to that
point, or another header, is an error. A seal with a valid slot and no journal beside it
stops a new ledger from starting a fresh budget under that name. Readers read the seal before
the journal. Deleting the seal removes this check (and only this check). ``raydp-hpo ledger
verify`` reports a damaged slot (:func:`inspect_seal`) as corruption; with both slots damaged
the seal vouches for nothing.

Locking: the writer holds an exclusive POSIX record lock on the whole file, NFS-safe where
the export has locking enabled, and checks before every append that the journal's path still
names the file it holds (:mod:`raydp_hpo.ledger.journal_io`, which states what is and is not
guaranteed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raydp_hpo.errors import (
    InvalidParameterError,
    JournalReplacedError,
    LedgerClosedError,
    LedgerCorruptedError,
    RayDPHPOError,
)
from raydp_hpo.ledger.journal_io import (
    _LOCKF_HELD,
    TEST_PAUSE_ENV,
    _fsync_dir,
    _lock_exclusive,
    _pause_for_tests,
    _read_all,
    _write_all,
    _write_new_file,
)

__all__ = [
    "JOURNAL_VERSION",
    "RECORD_KINDS",
    "TEST_PAUSE_ENV",
    "Journal",
    "JournalScan",
    "TornTail",
    "SealClaim",
    "SealState",
    "inspect_seal",
    "read_header",
    "read_seal",
    "seal_path",
    "read_journal",
    "scan_journal",
]

#: The kinds of record after the header: ``charge`` (an admitted charge) and ``release`` (a
#: run's release marker, :meth:`~raydp_hpo.ledger.filter.PrivacyLedger.claim_release`: it
#: charges nothing). Both count in ``seq``, the chain and the seal. A raydp-hpo from before
#: release markers refuses a journal holding one as corrupted (fail closed, never a miscount).
RECORD_KINDS = ("charge", "release")

#: Version written for new journals; version 1 is still read and appended to.
JOURNAL_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_CHAIN_SEED = b"raydp-hpo journal v2\x00"
_CHAIN_KEY = b',"chain":"'
_CHAIN_SUFFIX_LEN = len(_CHAIN_KEY) + 64 + 2  # ,"chain":"<64 hex>"}
_SEAL_SLOT = 256


def _canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)


# -- version 1 (CRC-32, no chain) ---------------------------------------------------------
def _v1_line(record: dict[str, Any]) -> bytes:
    crc = zlib.crc32(_canonical(record).encode())
    return (_canonical({**record, "crc": crc}) + "\n").encode()


def _v1_check(record: dict[str, Any]) -> bool:
    crc = record.get("crc")
    body = {k: v for k, v in record.items() if k != "crc"}
    return isinstance(crc, int) and zlib.crc32(_canonical(body).encode()) == crc


# -- version 2 (hash chain) -----------------------------------------------------------------
def _chain(prev: str | None, body: bytes) -> str:
    seed = _CHAIN_SEED if prev is None else bytes.fromhex(prev)
    return hashlib.sha256(seed + body).hexdigest()


def _v2_line(record: dict[str, Any], prev: str | None) -> tuple[bytes, str]:
    if "chain" in record:
        raise InvalidParameterError(f"a journal record may not have a 'chain' key: {record!r}")
    body = _canonical(record).encode()
    chain = _chain(prev, body)
    return body[:-1] + _CHAIN_KEY + chain.encode() + b'"}\n', chain


def _v2_split(line: bytes) -> tuple[bytes, str] | None:
    """(body bytes, stored chain) of a version-2 line, or None if it is not shaped like one."""
    if len(line) <= _CHAIN_SUFFIX_LEN or not line.endswith(b'"}'):
        return None
    suffix = line[-_CHAIN_SUFFIX_LEN:]
    if not suffix.startswith(_CHAIN_KEY):
        return None
    try:
        stored = suffix[len(_CHAIN_KEY) : -2].decode("ascii")
        bytes.fromhex(stored)
    except (UnicodeDecodeError, ValueError):
        return None
    return line[:-_CHAIN_SUFFIX_LEN] + b"}", stored


@dataclass(frozen=True)
class TornTail:
    """An incomplete final line: ``length`` bytes at byte ``offset`` (moved to ``side_file``
    by the writer; ``None`` when only read)."""

    offset: int
    length: int
    side_file: Path | None = None


@dataclass(frozen=True)
class JournalScan:
    """A journal checked line by line (see the module docstring for the rules).

    ``lines[i]``/``offsets[i]`` locate charge record ``records[i]`` (1-based line number,
    byte offset); ``end`` is the byte just after the last complete record; ``chains[k]`` is
    the chain hash after the header and k records (empty for version 1).
    """

    path: Path
    version: int
    header: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    lines: tuple[int, ...]
    offsets: tuple[int, ...]
    end: int
    chains: tuple[str, ...]
    torn: TornTail | None

    @property
    def chain(self) -> str | None:
        """The chain hash after the last record (``None`` for version 1)."""
        return self.chains[-1] if self.chains else None

    def where(self, index: int) -> str:
        """'line L (record S, byte B)' of charge record ``index`` (for error messages)."""
        return (
            f"line {self.lines[index]} (record {self.records[index].get('seq')}, "
            f"byte offset {self.offsets[index]})"
        )


def _corrupt(path: Path, line_no: int, offset: int, what: str) -> LedgerCorruptedError:
    record = "the header" if line_no == 1 else f"record {line_no - 1}"
    return LedgerCorruptedError(
        f"journal {path} is corrupted at line {line_no} ({record}, byte offset {offset}): "
        f"{what}. This line is complete (newline-terminated), so it was written and fsync'd "
        "and may have been acknowledged: refusing to guess the spent budget. Restore the "
        "journal from a backup (`raydp-hpo ledger verify` checks a copy); do not delete it, "
        "that would reset the budget."
    )


def scan_bytes(path: Path, raw: bytes) -> JournalScan:
    """Check ``raw`` (the bytes of journal ``path``) line by line; raise on corruption."""
    if not raw:
        raise LedgerCorruptedError(
            f"journal {path} is empty (0 bytes). Journals are created with their header in one "
            "atomic step, so an empty file is a truncated journal or not a journal at all; "
            "refusing to start a fresh budget under its name. Restore it from a backup, or "
            "move it away if you are sure no charge was ever made against this dataset."
        )
    cut = raw.rfind(b"\n") + 1  # bytes after the last newline: a torn (unacknowledged) write
    torn = TornTail(cut, len(raw) - cut) if cut < len(raw) else None
    if cut == 0:
        raise LedgerCorruptedError(
            f"journal {path} has no complete header line ({len(raw)} bytes, no newline): it is "
            "truncated or not a journal. Journals are created with their header atomically; "
            "restore it from a backup."
        )
    version = 0
    header: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    offsets: list[int] = []
    chain: str | None = None
    chains: list[str] = []
    pos = 0
    line_no = 0
    while pos < cut:
        nl = raw.index(b"\n", pos)
        line, start, pos = raw[pos:nl], pos, nl + 1
        line_no += 1
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _corrupt(path, line_no, start, f"not valid JSON ({exc})") from None
        if not isinstance(rec, dict):
            raise _corrupt(path, line_no, start, "not a JSON object")
        if line_no == 1:
            version = rec.get("version")  # type: ignore[assignment]
            if rec.get("kind") != "header" or version not in _READABLE_VERSIONS:
                raise _corrupt(
                    path, 1, 0,
                    f"expected a journal header of version {_READABLE_VERSIONS}, got "
                    f"kind={rec.get('kind')!r} version={rec.get('version')!r}",
                )
        if version == 1:
            if not _v1_check(rec):
                raise _corrupt(path, line_no, start, "CRC-32 mismatch (a changed byte)")
            rec.pop("crc")
        else:
            split = _v2_split(line)
            if split is None:
                raise _corrupt(path, line_no, start, "no chain hash at the end of the line")
            body, stored = split
            expected = _chain(chain, body)
            if stored != expected or rec.get("chain") != stored:
                raise _corrupt(
                    path, line_no, start,
                    "chain hash mismatch (this record, or one before it, was changed, removed, "
                    "inserted or reordered)",
                )
            chain = rec.pop("chain")
            chains.append(stored)
        if line_no == 1:
            header = rec
            continue
        seq = line_no - 1
        if rec.get("kind") not in RECORD_KINDS or rec.get("seq") != seq:
            raise _corrupt(
                path, line_no, start,
                f"expected a charge or release record seq={seq}, got kind={rec.get('kind')!r} "
                f"seq={rec.get('seq')!r} (a record is missing or out of order)",
            )
        records.append(rec)
        lines.append(line_no)
        offsets.append(start)
    return JournalScan(
        path, version, header, tuple(records), tuple(lines), tuple(offsets), cut,
        tuple(chains), torn
    )


# -- the seal (a witness of how far the journal got) ------------------------------------------
def seal_path(path: str | os.PathLike[str]) -> Path:
    """Where the seal of the journal at ``path`` lives: ``<journal>.seal``."""
    p = Path(path)
    return p.with_name(p.name + ".seal")


@dataclass(frozen=True)
class SealClaim:
    """A seal slot: the journal had ``records`` records with chain hash ``chain`` after them."""

    records: int
    chain: str
    header: str


def _seal_slot(claim: SealClaim) -> bytes:
    body = {"records": claim.records, "chain": claim.chain, "header": claim.header}
    text = _canonical({**body, "crc": zlib.crc32(_canonical(body).encode())})
    return text.encode().ljust(_SEAL_SLOT - 1) + b"\n"


def _seal_claims(raw: bytes) -> list[SealClaim]:
    claims = []
    for k in range(0, len(raw), _SEAL_SLOT):
        try:
            rec = json.loads(raw[k : k + _SEAL_SLOT])
            if not _v1_check(rec):
                continue
            claims.append(SealClaim(int(rec["records"]), str(rec["chain"]), str(rec["header"])))
        except (ValueError, KeyError, TypeError):
            continue  # a torn or empty slot: no claim
    return claims


@dataclass(frozen=True)
class SealState:
    """What a seal file holds, slot by slot (:func:`inspect_seal`, for ``ledger verify``).

    ``damaged`` lists (slot number from 1, what is wrong) for each slot that holds bytes but
    no valid claim (bad JSON, a failed CRC, missing fields); an all-NUL slot was never written
    and is not damage. ``odd_size`` is set when the file is not a whole number of slots."""

    path: Path
    exists: bool
    size: int
    claims: tuple[SealClaim, ...]
    damaged: tuple[tuple[int, str], ...]
    odd_size: bool

    @property
    def unusable(self) -> bool:
        """The seal holds bytes but not one valid slot: it vouches for nothing, so a journal
        cut at a line boundary would no longer be caught."""
        return self.exists and self.size > 0 and not self.claims

    def problems(self) -> list[str]:
        """Each thing wrong with the seal, as a sentence naming the file."""
        out = []
        if self.odd_size:
            out.append(f"seal {self.path} is {self.size} bytes, not a whole number of "
                       f"{_SEAL_SLOT}-byte slots (at most 2): it was written by something else")
        for slot, why in self.damaged:
            out.append(f"seal {self.path}: slot {slot} is damaged ({why})" + (
                "; the other slot still vouches (a crash during a seal write leaves one torn "
                "slot; the ledger's next open or charge rewrites it)" if self.claims else ""))
        if self.unusable:
            out.append(f"seal {self.path} has no valid slot: it vouches for no record, so a "
                       "truncated journal would go unnoticed. Restore the seal from the "
                       "journal's backup; or, after checking the journal against that backup, "
                       "delete the seal (the next ledger open writes a fresh one)")
        return out


def _slot_problem(raw: bytes) -> str | None:
    """Why a non-empty seal slot is not a valid claim (None: it is valid)."""
    try:
        rec = json.loads(raw)
    except ValueError:
        return "not a JSON record"
    if not isinstance(rec, dict) or not {"records", "chain", "header", "crc"} <= set(rec):
        return "not a seal record (fields missing)"
    if not _v1_check(rec):
        return "CRC mismatch"
    try:
        int(rec["records"])
    except (ValueError, TypeError):
        return "record count is not an integer"
    return None


def inspect_seal(path: str | os.PathLike[str]) -> SealState:
    """Read the seal of the journal at ``path`` slot by slot, without changing anything.

    :func:`read_seal` takes the strongest valid slot and skips a torn one (a crash during a
    seal write leaves one torn slot and the other valid: no false alarm there); this names
    every damaged slot so ``raydp-hpo ledger verify`` can report them."""
    seal = seal_path(path)
    try:
        raw = seal.read_bytes()
    except FileNotFoundError:
        return SealState(seal, False, 0, (), (), False)
    except OSError as exc:
        raise RayDPHPOError(f"cannot read seal {seal}: {exc.strerror or exc}") from None
    damaged = []
    for k in range(0, len(raw), _SEAL_SLOT):
        slot = raw[k : k + _SEAL_SLOT]
        if not slot.strip(b"\x00"):
            continue  # never written (a hole before the second slot)
        why = _slot_problem(slot)
        if why is not None:
            damaged.append((k // _SEAL_SLOT + 1, why))
    odd = len(raw) % _SEAL_SLOT != 0 or len(raw) > 2 * _SEAL_SLOT
    return SealState(seal, True, len(raw), tuple(_seal_claims(raw)), tuple(damaged), odd)


def read_seal(path: Path) -> SealClaim | None:
    """The strongest valid claim of ``path``'s seal, or None (no seal, no valid slot)."""
    try:
        raw = seal_path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RayDPHPOError(f"cannot read seal {seal_path(path)}: {exc.strerror or exc}") from None
    claims = _seal_claims(raw)
    return max(claims, key=lambda c: c.records) if claims else None


def _check_seal(scan: JournalScan, claim: SealClaim | None) -> None:
    """Raise if ``scan`` has fewer or other records than its seal vouches for."""
    if claim is None or scan.version == 1:
        return
    seal = seal_path(scan.path)
    if claim.header != scan.chains[0]:
        raise LedgerCorruptedError(
            f"journal {scan.path} is not the journal its seal {seal} was written for (another "
            "header): the file at this path was replaced. Put the original journal back; a "
            "replaced journal can reset the budget."
        )
    have = len(scan.records)
    if claim.records > have:
        raise LedgerCorruptedError(
            f"journal {scan.path} has {have} complete charge records, but its seal {seal} "
            f"shows that {claim.records} were written and fsync'd: acknowledged charges are "
            "missing (the file was truncated or replaced by an older copy). Restore a copy with "
            f"all {claim.records} records; refusing to undercount the spend."
        )
    if scan.chains[claim.records] != claim.chain:
        raise LedgerCorruptedError(
            f"journal {scan.path}: its first {claim.records} records differ from the ones its "
            f"seal {seal} vouches for (chain hash mismatch): the file was rewritten. Restore "
            "the original journal."
        )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise InvalidParameterError(
            f"journal path {path} is a directory, not a ledger journal; pass a .journal file "
            f"(`raydp-hpo ledger list {path}` lists the journals under it)"
        ) from None
    except OSError as exc:
        raise RayDPHPOError(f"cannot read journal {path}: {exc.strerror or exc}") from None


def _torn_warning(path: Path, torn: TornTail, action: str) -> str:
    return (
        f"journal {path}: an incomplete final line ({torn.length} bytes at byte offset "
        f"{torn.offset}, no newline) is a write interrupted before it was acknowledged; "
        f"{action}. If this journal was instead truncated or copied incompletely, acknowledged "
        "charges are missing: restore the full journal from a backup."
    )


def scan_journal(path: str | os.PathLike[str]) -> JournalScan:
    """Check a journal without changing anything (what ``raydp-hpo ledger verify`` runs).

    Raises :class:`~raydp_hpo.errors.LedgerCorruptedError` on corruption and
    :class:`~raydp_hpo.errors.RayDPHPOError` if there is no journal at ``path``. A torn tail
    is reported in :attr:`JournalScan.torn`, not warned about.
    """
    p = Path(path)
    claim = read_seal(p)  # before the journal: the seal never runs ahead of the file
    if not p.exists():
        cls = RayDPHPOError if claim is None else LedgerCorruptedError
        raise cls(_missing_message(p, claim))
    scan = scan_bytes(p, _read_bytes(p))
    _check_seal(scan, claim)
    return scan


def _missing_message(path: Path, claim: SealClaim | None) -> str:
    if claim is None:
        return f"no ledger journal at {path}"
    return (
        f"no ledger journal at {path}, but its seal {seal_path(path)} shows that "
        f"{claim.records} charge(s) were recorded there: the journal was deleted or moved. "
        "Put it back; refusing to start a fresh budget under its name. (Starting over on "
        "the same data is a new budget on top of everything already released; if that is "
        "really meant, remove the seal as well.)"
    )


def read_journal(path: str | os.PathLike[str]) -> tuple[
    dict[str, Any] | None, list[dict[str, Any]]
]:
    """(header, charge records) of a journal, or ``(None, [])`` if there is no file at ``path``.

    Read-only: a torn tail is skipped with a warning (and left in place). Corruption raises.
    """
    p = Path(path)
    if not p.exists() and read_seal(p) is None:
        return None, []
    scan = scan_journal(p)
    if scan.torn is not None:
        warnings.warn(
            _torn_warning(p, scan.torn, "skipped here (read-only: the file is left as it is)"),
            RuntimeWarning,
            stacklevel=2,
        )
    return scan.header, list(scan.records)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked header of the journal at ``path`` (reads its first line only)."""
    p = Path(path)
    if not p.exists():
        raise RayDPHPOError(f"no ledger journal at {p}")
    if p.is_dir():
        _read_bytes(p)  # raises the directory message
    try:
        with open(p, "rb") as fh:
            first = fh.readline()
    except OSError as exc:
        raise RayDPHPOError(f"cannot read journal {p}: {exc.strerror or exc}") from None
    return scan_bytes(p, first).header


# -- the writer ----------------------------------------------------------------------------


class Journal:
    """The writer side of a journal file, holding an exclusive record lock while open.

    Lifecycle: :meth:`open` (creates the journal atomically if ``create_header`` is given and
    there is no file; checks every line; moves a torn tail to a side file) →
    :meth:`append_charge` any number of times → :meth:`close`.
    """

    def __init__(
        self, path: Path, fd: int, scan: JournalScan, lock_kind: str, *, created: bool
    ) -> None:
        self.path = path
        #: Whether :meth:`open` created this journal (a fresh ledger).
        self.created = created
        self.scan = scan
        self._fd: int | None = fd
        self._lock_kind = lock_kind
        self._ident = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        self._version = scan.version
        self._seq = len(scan.records)
        self._chain = scan.chain
        self._end = scan.end
        self._broken: str | None = None
        self._seal_fd: int | None = None

    @property
    def header(self) -> dict[str, Any]:
        return self.scan.header

    @property
    def records(self) -> tuple[dict[str, Any], ...]:
        return self.scan.records

    @property
    def version(self) -> int:
        return self._version

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], create_header: dict[str, Any] | None = None
    ) -> Journal:
        """Open (and lock) the journal at ``path``; with ``create_header``, create it first if
        there is no file there (atomically: the name never shows a file without a header)."""
        p = Path(path).expanduser().resolve()
        if p.is_dir():
            _read_bytes(p)  # raises the directory message
        created = False
        if not p.exists():
            claim = read_seal(p)
            if claim is not None:
                raise LedgerCorruptedError(_missing_message(p, claim))
            if create_header is not None:
                p.parent.mkdir(parents=True, exist_ok=True)
                created = cls._create(p, create_header)
        try:
            fd = os.open(p, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise RayDPHPOError(f"no ledger journal at {p}") from None
        try:
            lock_kind = _lock_exclusive(fd, p)
            st, fst = os.stat(p), os.fstat(fd)
            if (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
                raise JournalReplacedError(
                    f"journal {p} was replaced while it was being opened; open it again"
                )
            scan = scan_bytes(p, _read_all(fd))
            _check_seal(scan, read_seal(p))
            journal = cls(p, fd, scan, lock_kind, created=created)
        except BaseException:
            os.close(fd)
            raise
        try:
            if scan.torn is not None:
                journal._move_torn_tail(scan.torn)
            journal._open_seal()
        except BaseException:
            journal.close()
            raise
        return journal

    def _open_seal(self) -> None:
        if self._version == 1:
            return
        self._seal_fd = os.open(
            seal_path(self.path), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644
        )
        self._write_seal()

    def _write_seal(self) -> None:
        """Vouch for the records written so far (call only once they are fsync'd)."""
        if self._seal_fd is None or self._chain is None:
            return
        claim = SealClaim(self._seq, self._chain, self.scan.chains[0])
        os.pwrite(self._seal_fd, _seal_slot(claim), (self._seq % 2) * _SEAL_SLOT)

    @staticmethod
    def _create(path: Path, header: dict[str, Any]) -> bool:
        line, _ = _v2_line({"kind": "header", "version": JOURNAL_VERSION, **header}, None)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
        _write_new_file(tmp, line)
        try:
            os.link(tmp, path)  # fails if the name exists: never replaces a journal
            return True
        except FileExistsError:
            return False  # another creator won; open theirs
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            _fsync_dir(path.parent)

    def _move_torn_tail(self, torn: TornTail) -> None:
        assert self._fd is not None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        side = self.path.with_name(f"{self.path.name}.torn-{stamp}-{time.time_ns() % 10**9:09d}")
        _write_new_file(side, os.pread(self._fd, torn.length, torn.offset))
        _fsync_dir(side.parent)
        os.ftruncate(self._fd, torn.offset)  # only after the side file holds the bytes
        os.fsync(self._fd)
        moved = TornTail(torn.offset, torn.length, side)
        self.scan = replace(self.scan, torn=moved)
        warnings.warn(
            _torn_warning(self.path, moved, f"its bytes were moved to {side}"),
            RuntimeWarning,
            stacklevel=3,
        )

    # -- appending --------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Raise unless an append may go ahead: open, not broken, and the path still names
        this file with the size this writer left it at. Changes nothing."""
        if self._fd is None:
            raise LedgerClosedError(
                f"the ledger on journal {self.path} is closed; open the journal again "
                "(PrivacyLedger.open) to charge it"
            )
        if self._broken is not None:
            raise JournalReplacedError(self._broken)
        fst = os.fstat(self._fd)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._ident:
            how = "was deleted" if st is None else "was replaced by another file"
            self._broken = (
                f"journal {self.path} {how} while this ledger held it open; refusing to charge: "
                "another ledger may now be admitting charges against a fresh budget at that "
                "path. Stop every ledger on it, restore the journal this ledger was writing "
                "(its charges are in memory and in the old file if still open elsewhere), then "
                "reopen."
            )
            raise JournalReplacedError(self._broken)
        if fst.st_size != self._end:
            self._broken = (
                f"journal {self.path} changed size behind this ledger's back ({fst.st_size} "
                f"bytes, this ledger wrote {self._end}); refusing to charge. Something else "
                "writes to it without the lock: run `raydp-hpo ledger verify` on it."
            )
            raise JournalReplacedError(self._broken)

    def append_charge(self, record: dict[str, Any], kind: str = "charge") -> None:
        """Append charge ``record`` (gets ``kind``, a :data:`RECORD_KINDS` member, and the
        next ``seq``) and fsync it.

        On return the record is durable; on any error nothing was appended (a partial write
        is cut back) and the journal refuses further appends if that could not be ensured.
        """
        self.check_writable()
        assert self._fd is not None
        if kind not in RECORD_KINDS:
            raise InvalidParameterError(f"journal record kind must be one of {RECORD_KINDS}, "
                                        f"got {kind!r}")
        seq = self._seq + 1
        body = {**record, "kind": kind, "seq": seq}
        if self._version == 1:
            data, chain = _v1_line(body), None
        else:
            data, chain = _v2_line(body, self._chain)
        try:
            os.lseek(self._fd, self._end, os.SEEK_SET)
            if not _pause_for_tests(self._fd, data):
                _write_all(self._fd, data)
            os.fsync(self._fd)
        except BaseException as exc:
            try:
                os.ftruncate(self._fd, self._end)
                os.fsync(self._fd)
            except OSError:
                self._broken = (
                    f"journal {self.path}: a failed append ({exc!r}) could not be cut back; "
                    "refusing further charges. Reopen the ledger (a torn tail is moved aside)."
                )
            raise
        self._seq, self._chain, self._end = seq, chain, self._end + len(data)
        try:
            self._write_seal()
        except OSError as exc:  # the record is durable: the charge stands; the seal lags
            warnings.warn(
                f"journal {self.path}: could not update its seal ({exc}); truncation of the "
                "newest records would go unnoticed",
                RuntimeWarning,
                stacklevel=2,
            )

    def close(self) -> None:
        if self._seal_fd is not None:
            seal_fd, self._seal_fd = self._seal_fd, None
            with contextlib.suppress(OSError):
                os.fsync(seal_fd)
            os.close(seal_fd)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self._lock_kind == "lockf":
                _LOCKF_HELD.discard(self._ident)
            os.close(fd)  # releases the lock

    @property
    def closed(self) -> bool:
        return self._fd is None

    @property
    def head(self) -> tuple[int, str | None]:
        """(number of records written, chain hash after them; None for version 1)."""
        return self._seq, self._chain
