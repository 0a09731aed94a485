"""A privacy ledger stored in PostgreSQL: the same records and hash chain as the journal file.

A ledger is named by a URI ``postgresql://host:port/db?ledger=NAME`` (``postgres://`` too),
read as libpq reads it (:func:`parse_uri`): query parameters override the path, only
:data:`ALLOWED_PARAMETERS` are accepted, a secret in any case is refused without its value, one
host only. :func:`is_postgres_uri` is the one place that tells a URI from a journal path; any
other scheme is an error, never a path. Everything above the storage is unchanged:
:class:`~raydp_hpo.ledger.filter.PrivacyLedger` decides with the same filter, and every record
is the *same bytes* a version-2 journal line would hold (canonical JSON with its ``"chain"``
key, :mod:`raydp_hpo.ledger.journal`), so a ledger's rows concatenated are a journal that
:func:`~raydp_hpo.ledger.journal.scan_bytes` checks exactly as it checks a file.

Schema (schema ``raydp_hpo``, versioned by :data:`MIGRATIONS` in table ``schema_version``: a
short ordered list of SQL steps rather than Alembic, which would pull SQLAlchemy into a
package that issues a handful of fixed statements; each step runs once, in order, in one
transaction, under an advisory lock; ``raydp-hpo ledger init`` applies them as the owner and
grants the roles, :func:`init_ledger_database`; a newer version than :data:`SCHEMA_VERSION` is
refused, an older or missing one names ``ledger init``: :class:`SchemaVersionError`):

* ``ledgers(name, header, header_chain, created_at, migrated_from)`` — the header line;
* ``charges(ledger, seq, record, chain)`` — one row per admitted charge (or run's release
  marker, ``"kind": "release"``, which charges nothing), the journal line (``json`` keeps its
  text byte for byte) and its chain hash;
* ``heads(ledger, records, chain, mac)`` — the ledger's record count and last chain hash (the
  journal's ``.seal``), advanced in each admission transaction; its trigger lets it only grow
  and only to the last stored row; ``mac`` is HMAC-SHA256 under the ledger key
  (:func:`ledger_key`, held apart from the database) when the ledger is keyed;
* ``datasets(fingerprint, ledger, registered_at, registered_by, admin_reason)`` — which ledger
  holds a data source's budget (:func:`register_dataset`);
* triggers refuse ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on all of them (``heads``: updates
  that grow only), and the ledger role gets ``SELECT, INSERT`` plus ``UPDATE`` of ``heads``
  (readers: ``SELECT``). A superuser can still change rows around the triggers: a changed or
  removed record breaks the chain there, a deleted tail disagrees with the head, and a
  rewrite of rows, chain and head together fails the head's MAC for whoever holds the key;
  the ledger then refuses to charge. Without the key such a rewrite, and with it a rollback to
  an earlier state whose head and MAC were kept, are not detected (docs: shared budgets).

Admission (:meth:`PgJournal.begin_admission` … :meth:`PgJournal.append_charge`) is one
transaction: ``pg_advisory_xact_lock`` on the ledger's name (row locks would need ``UPDATE``
privilege), read the charges since the last one this process saw (chain-checked) and the head,
decide, ``INSERT``, advance the head, ``COMMIT`` (``synchronous_commit`` on: durable before it
returns). Any number of processes may admit on one ledger; the lock serialises them.

Fail closed in time: every connection has a connect timeout, ``statement_timeout``,
``lock_timeout``, ``idle_in_transaction_session_timeout``, TCP keepalives and
``tcp_user_timeout``; and since a frozen server answers none of those (its kernel still
acknowledges TCP), every statement also runs under a client-side deadline
(:data:`FREEZE_BOUND_S`, :class:`_Watchdog`) that shuts the socket down. Any database error
before the ``COMMIT`` is sent raises :class:`~raydp_hpo.errors.LedgerUnavailableError`: refused,
nothing stored. A ``COMMIT`` sent and never answered raises
:class:`~raydp_hpo.errors.LedgerOutcomeUnknownError`: the charge may be stored, so it is
neither acknowledged nor called refused; the next admission reconnects and reads it if it was.

Credentials come only from libpq (``PGUSER``, ``PGPASSWORD``, ``~/.pgpass``, a service file
named by ``PGSERVICE``): a URI with a secret is refused, and the URI shown in messages is the
one given.

Its neighbours, one concern each (this module re-exports their public names): the URI rules
(:mod:`raydp_hpo.ledger.pg_location`), connections and their deadlines
(:mod:`raydp_hpo.ledger.pg_connection`), the schema, its migrations and the head's key
(:mod:`raydp_hpo.ledger.pg_schema`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerClosedError,
    LedgerCorruptedError,
    LedgerMismatchError,
    LedgerOutcomeUnknownError,
    LedgerUnavailableError,
    RayDPHPOError,
    SchemaVersionError,
)
from raydp_hpo.ledger.journal import (
    JOURNAL_VERSION,
    RECORD_KINDS,
    JournalScan,
    _chain,
    _v2_line,
    _v2_split,
    scan_bytes,
    scan_journal,
)
from raydp_hpo.ledger.pg_connection import (
    _WATCHDOG,
    CONNECT_TIMEOUT_S,
    FREEZE_BOUND_S,
    _connect,
    _execute,
    _first_line,
    _Guard,
)
from raydp_hpo.ledger.pg_location import (
    ALLOWED_PARAMETERS,
    PgLocation,
    _psycopg,
    is_postgres_uri,
    parse_uri,
    same_location,
)
from raydp_hpo.ledger.pg_schema import (
    KEY_ENV,
    KEY_FILE_ENV,
    MIGRATIONS,
    SCHEMA_VERSION,
    _init_hint,
    _refuse_newer,
    ensure_schema,
    grant_ledger_role,
    head_mac,
    init_ledger_database,
    ledger_key,
    schema_version,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FREEZE_BOUND_S",
    "MIGRATIONS",
    "PgJournal",
    "PgLocation",
    "ALLOWED_PARAMETERS",
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "grant_ledger_role",
    "head_mac",
    "head_mac_status",
    "init_ledger_database",
    "is_postgres_uri",
    "dataset_bindings",
    "ledger_head",
    "ledger_key",
    "ledger_for_dataset",
    "list_ledgers",
    "migrate_journal",
    "parse_uri",
    "same_location",
    "register_dataset",
    "scan_ledger",
    "schema_version",
]



def _rows_to_scan(loc: PgLocation, header: str, rows: list[tuple[int, str, str]]) -> JournalScan:
    """Check a ledger's rows exactly as a journal file is checked (they are its lines), plus
    the ``seq`` and ``chain`` columns against the records."""
    raw = "".join([header, "\n", *(f"{r[1]}\n" for r in rows)]).encode()
    # the URI stands where a file's path would (messages name the ledger, not a mangled path)
    scan = scan_bytes(loc.uri, raw)  # type: ignore[arg-type]
    for i, (seq, _record, chain) in enumerate(rows):
        if seq != i + 1 or chain != scan.chains[i + 1]:
            raise LedgerCorruptedError(
                f"ledger {loc.uri}: row {i + 1} (record {scan.records[i].get('seq')}) has "
                f"seq={seq} chain={chain[:12]}… in its columns but its record says seq={i + 1} "
                f"chain={scan.chains[i + 1][:12]}…: the table was changed around the "
                "append-only triggers; restore the database from a backup"
            )
    return scan


#: A ledger's head as stored: (records, chain, mac or None).
Head = tuple[int, str, "str | None"]


def _check_head(loc: PgLocation, records: int, chain: str, head: Head | None,
                key: bytes | None) -> None:
    """Compare the ledger's rows (``records`` of them, ending in ``chain``) with its head row:
    a deleted tail, rows added around the admission transaction, or (with the key) a head
    whose MAC does not vouch for it is :class:`LedgerCorruptedError` naming what is missing."""
    where = f"ledger {loc.uri}"
    fix = ("the rows were changed around the append-only triggers; restore the database from "
           "a backup (run `raydp-hpo ledger verify` on it)")
    if head is None:
        raise LedgerCorruptedError(
            f"{where} has no head row (its record count and last hash): it was removed, or the "
            f"ledger was created by an older raydp-hpo after the schema upgrade; {fix}")
    h_records, h_chain, mac = head
    if records < h_records:
        missing = (f"record {h_records}" if h_records == records + 1
                   else f"records {records + 1}..{h_records}")
        raise LedgerCorruptedError(
            f"{where}: its head vouches for {h_records} charge records (last hash "
            f"{h_chain[:12]}…) but only {records} are stored: {missing} missing (a deleted "
            f"tail; the budget they spent would come back); {fix}")
    if records > h_records or chain != h_chain:
        raise LedgerCorruptedError(
            f"{where}: its head vouches for {h_records} charge records ending in hash "
            f"{h_chain[:12]}…, the rows hold {records} ending in {chain[:12]}…; {fix}")
    if key is not None:
        if mac is None:
            raise LedgerCorruptedError(
                f"{where}: a ledger key is set ({KEY_FILE_ENV}/{KEY_ENV}) but the head carries "
                "no MAC: the ledger was created without the key, or its MAC was stripped. "
                "Refusing it under the key; unset the key to use an unkeyed ledger")
        if not hmac.compare_digest(mac, head_mac(key, loc.ledger, h_records, h_chain)):
            raise LedgerCorruptedError(
                f"{where}: the head's MAC does not match under the ledger key: the ledger was "
                "rewritten without the key (a recomputed chain), or the key is not this "
                f"ledger's; {fix}")


def _fetch_scan(conn: Any, loc: PgLocation, key: bytes | None
                ) -> tuple[JournalScan, Head | None] | None:
    """The ledger's header, rows and head, read in ONE snapshot (a ``REPEATABLE READ``
    transaction unless ``conn`` is in one already: with writers admitting meanwhile, rows and
    head read apart would disagree), then checked (:func:`_rows_to_scan`, :func:`_check_head`)."""
    psycopg = _psycopg()
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return _fetch_scan_in(conn, loc, key)
    _execute(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        return _fetch_scan_in(conn, loc, key)
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):
                _execute(conn, "ROLLBACK")


def _fetch_scan_in(conn: Any, loc: PgLocation, key: bytes | None
                   ) -> tuple[JournalScan, Head | None] | None:
    row = _execute(conn,
        "SELECT header::text FROM raydp_hpo.ledgers WHERE name = %s", (loc.ledger,)
    ).fetchone()
    if row is None:
        return None
    rows = _execute(conn,
        "SELECT seq, record::text, chain FROM raydp_hpo.charges WHERE ledger = %s ORDER BY seq",
        (loc.ledger,), seconds=6 * FREEZE_BOUND_S,
    ).fetchall()
    head = _fetch_head(conn, loc)
    scan = _rows_to_scan(loc, row[0], rows)
    _check_head(loc, len(scan.records), scan.chains[-1], head, key)
    return scan, head


def _fetch_head(conn: Any, loc: PgLocation) -> Head | None:
    row = _execute(conn, "SELECT records, chain, mac FROM raydp_hpo.heads WHERE ledger = %s",
                   (loc.ledger,)).fetchone()
    return None if row is None else (int(row[0]), row[1], row[2])


def _open_checked(loc: PgLocation) -> Any:
    """A connection to a database whose schema is this raydp-hpo's (read side: no upgrade)."""
    psycopg = _psycopg()
    conn = _connect(loc)
    try:
        found = schema_version(conn)
    except psycopg.Error as exc:
        conn.close()
        raise SchemaVersionError(f"reading the ledger schema of {loc.uri}: {_first_line(exc)}; "
                                 f"{_init_hint(loc.uri)}") from None
    _refuse_newer(found, loc.uri)
    if found < SCHEMA_VERSION:
        conn.close()
        what = "has no raydp-hpo ledger schema" if found == 0 else (
            f"holds ledger schema version {found}, older than {SCHEMA_VERSION}")
        raise SchemaVersionError(f"the database of {loc.uri} {what}; {_init_hint(loc.uri)}")
    return conn


def scan_ledger(uri: str, *, key: bytes | None = None, use_key: bool = True) -> JournalScan:
    """Read and check every record of the ledger at ``uri`` (read-only, like
    :func:`~raydp_hpo.ledger.journal.scan_journal`), its head included, and its MAC under the
    ledger key (``key``, else :func:`ledger_key`, unless ``use_key=False``). ``scan.path``
    holds the URI."""
    loc = parse_uri(uri)
    psycopg = _psycopg()
    if key is None and use_key:
        key = ledger_key()
    conn = _open_checked(loc)
    try:
        got = _fetch_scan(conn, loc, key)
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"reading ledger {uri}: {_first_line(exc)}") from None
    finally:
        conn.close()
    if got is None:
        raise RayDPHPOError(f"no ledger {loc.ledger!r} in the database of {uri}")
    return got[0]


def ledger_head(uri: str) -> Head | None:
    """The stored head of the ledger at ``uri``: (records, last chain, MAC or None)."""
    loc = parse_uri(uri)
    conn = _open_checked(loc)
    try:
        return _fetch_head(conn, loc)
    finally:
        conn.close()


def head_mac_status(head: Head | None) -> str:
    """How a head's MAC stands for a reader (``ledger verify``, the dashboard): checked under
    the ledger key (:func:`ledger_key` set; the scan has checked it), present but not checked,
    or none."""
    if ledger_key() is not None:
        return "checked under the ledger key"
    if head is not None and head[2] is not None:
        return "present, NOT checked (no key: set RAYDP_HPO_LEDGER_KEY_FILE)"
    return "none (unkeyed ledger)"


def list_ledgers(uri: str) -> list[str]:
    """Names of the ledgers in the database of ``uri`` (``?ledger=`` optional)."""
    loc = parse_uri(uri, need_ledger=False)
    conn = _connect(loc)
    try:
        found = schema_version(conn)
        _refuse_newer(found, loc.uri)
        if found == 0:
            return []
        rows = _execute(conn, "SELECT name FROM raydp_hpo.ledgers ORDER BY name").fetchall()
        return [r[0] for r in rows]
    finally:
        conn.close()


class PgJournal:
    """The writer side of a PostgreSQL ledger, with the interface of
    :class:`~raydp_hpo.ledger.journal.Journal` plus the admission transaction
    (:meth:`begin_admission`, :meth:`end_admission`)."""

    def __init__(self, loc: PgLocation, conn: Any, scan: JournalScan, *, created: bool,
                 key: bytes | None = None) -> None:
        self.location = loc
        self.created = created
        self.scan = scan
        self._conn: Any = conn
        self._seq = len(scan.records)
        self._chain = scan.chain
        self._header_chain = scan.chains[0]
        self._closed = False
        self._in_tx = False
        self._key = key

    @property
    def path(self) -> str:
        """The ledger's URI (shown in messages; never holds a password)."""
        return self.location.uri

    @property
    def header(self) -> dict[str, Any]:
        return self.scan.header

    @property
    def records(self) -> tuple[dict[str, Any], ...]:
        return self.scan.records

    @property
    def version(self) -> int:
        return JOURNAL_VERSION

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def head(self) -> tuple[int, str | None]:
        return self._seq, self._chain

    @classmethod
    def open(cls, uri: str, create_header: dict[str, Any] | None = None) -> PgJournal:
        """Connect, bring the schema up to date, create the ledger with ``create_header`` if
        there is none of that name (with its head, keyed when a ledger key is set), and read
        and check every record and the head."""
        loc = parse_uri(uri)  # first: a password is refused with or without psycopg
        psycopg = _psycopg()
        key = ledger_key()
        conn = _connect(loc)
        try:
            ensure_schema(conn, loc.uri)
            created = False
            if create_header is not None:
                line, chain = _v2_line(
                    {"kind": "header", "version": JOURNAL_VERSION, **create_header}, None
                )
                with _WATCHDOG.guard(conn), conn.transaction():
                    cur = conn.execute(
                        "INSERT INTO raydp_hpo.ledgers (name, header, header_chain) VALUES "
                        "(%s, %s::json, %s) ON CONFLICT DO NOTHING",
                        (loc.ledger, line.decode().rstrip("\n"), chain),
                    )
                    created = cur.rowcount == 1
                    if created:
                        conn.execute(
                            "INSERT INTO raydp_hpo.heads (ledger, records, chain, mac) "
                            "VALUES (%s, 0, %s, %s)",
                            (loc.ledger, chain,
                             None if key is None else head_mac(key, loc.ledger, 0, chain)),
                        )
            got = _fetch_scan(conn, loc, key)
            if got is None:
                raise RayDPHPOError(f"no ledger {loc.ledger!r} in the database of {uri}")
            scan, head = got
            if key is None and head is not None and head[2] is not None:
                raise LedgerMismatchError(
                    f"ledger {loc.uri} is keyed (its head carries an HMAC) and no ledger key is "
                    f"set: set {KEY_FILE_ENV} (or {KEY_ENV}) to its key to charge it (reading "
                    "it needs no key)")
            return cls(loc, conn, scan, created=created, key=key)
        except psycopg.Error as exc:
            conn.close()
            raise LedgerUnavailableError(f"opening ledger {uri}: {_first_line(exc)}") from None
        except BaseException:
            conn.close()
            raise

    # -- admission ------------------------------------------------------------------------
    def check_writable(self) -> None:
        if self._closed:
            raise LedgerClosedError(
                f"the ledger {self.path} is closed; open it again (PrivacyLedger.open) to charge it"
            )

    def _unavailable(self, what: str, exc: BaseException, fired: bool = False
                     ) -> LedgerUnavailableError:
        self._drop_connection()
        why = (f"no answer within {FREEZE_BOUND_S:g} s" if fired else _first_line(exc))
        return LedgerUnavailableError(
            f"ledger {self.path}: {what} failed ({why}); the charge is refused "
            "(fail closed, nothing was acknowledged or stored). It is retried on a new "
            "connection at the next charge."
        )

    def _drop_connection(self) -> None:
        self._in_tx = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close
                conn.close()

    def begin_admission(self) -> list[dict[str, Any]]:
        """Start the admission transaction: lock the ledger and return the charge records
        written since this process last saw it (chain-checked, and checked against the
        ledger's head), which the caller must absorb before deciding. Ends with
        :meth:`append_charge` (commits) or :meth:`end_admission`."""
        psycopg = _psycopg()
        self.check_writable()
        if self._in_tx:
            raise RayDPHPOError(f"ledger {self.path}: admission already in progress")
        guard: _Guard | None = None
        try:
            if self._conn is None or self._conn.closed:
                self._conn = _connect(self.location)
            with _WATCHDOG.guard(self._conn) as guard:
                self._conn.execute("BEGIN")
                self._in_tx = True
                self._conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                                   (self.location.ledger,))
                rows = self._conn.execute(
                    "SELECT seq, record::text, chain FROM raydp_hpo.charges "
                    "WHERE ledger = %s AND seq > %s ORDER BY seq",
                    (self.location.ledger, self._seq),
                ).fetchall()
                # the head, and the row it names (a deleted tail leaves a head without it)
                head = self._conn.execute(
                    "SELECT h.records, h.chain, h.mac, (SELECT c.chain FROM raydp_hpo.charges c "
                    "WHERE c.ledger = h.ledger AND c.seq = h.records) FROM raydp_hpo.heads h "
                    "WHERE h.ledger = %s", (self.location.ledger,)).fetchone()
        except LedgerUnavailableError:
            self._drop_connection()
            raise
        except psycopg.Error as exc:
            raise self._unavailable("locking and reading the ledger", exc,
                                    guard is not None and guard.fired) from None
        try:
            out = self._absorb_rows(rows)
            if head is not None and head[0] > 0 and head[3] != head[1]:
                raise LedgerCorruptedError(
                    f"ledger {self.path}: its head vouches for {head[0]} charge records but "
                    f"record {head[0]} is missing or changed (a deleted tail: the budget it "
                    "spent would come back). Refusing to charge; run `raydp-hpo ledger verify` "
                    "on it and restore the database from a backup.")
            _check_head(self.location, self._seq, self._chain or self._header_chain,
                        None if head is None else (int(head[0]), head[1], head[2]), self._key)
            return out
        except BaseException:
            self.end_admission()
            raise

    def _absorb_rows(self, rows: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
        out = []
        seq, chain = self._seq, self._chain
        for row_seq, text, col_chain in rows:
            line = text.encode()
            split = _v2_split(line)
            where = f"ledger {self.path}: record {row_seq}"
            if split is None:
                raise LedgerCorruptedError(f"{where} has no chain hash; run `raydp-hpo ledger "
                                           "verify` on it")
            body, stored = split
            expected = _chain(chain, body)
            rec = json.loads(line)
            if (row_seq != seq + 1 or stored != expected or col_chain != stored
                    or rec.get("seq") != seq + 1 or rec.get("kind") not in RECORD_KINDS):
                raise LedgerCorruptedError(
                    f"{where} does not continue the chain after record {seq} (expected seq "
                    f"{seq + 1} with chain {expected[:12]}…): a record was changed, removed or "
                    "inserted around the append-only triggers. Refusing to charge; run "
                    "`raydp-hpo ledger verify` on it and restore the database from a backup."
                )
            rec.pop("chain")
            out.append(rec)
            seq, chain = seq + 1, stored
        self._seq, self._chain = seq, chain
        return out

    def append_charge(self, record: dict[str, Any], kind: str = "charge") -> None:
        """Insert charge ``record`` (gets ``kind``, ``charge`` or ``release``: a run's release
        marker, and the next ``seq``), advance the ledger's head (and its MAC under the key)
        and commit: on return it is durable.

        Must follow :meth:`begin_admission`. An error before the ``COMMIT`` is sent, or an
        error the server answers to it, is a refusal: :class:`LedgerUnavailableError`, and
        nothing is stored (the transaction is rolled back, by us or by the server when the
        connection goes). A ``COMMIT`` sent but never answered (the server froze past
        :data:`FREEZE_BOUND_S` or died, the network broke) is
        :class:`~raydp_hpo.errors.LedgerOutcomeUnknownError`: the charge may be stored, so it
        is neither acknowledged nor reported refused; the next admission reads it if it was."""
        psycopg = _psycopg()
        if not self._in_tx:
            raise RayDPHPOError(f"ledger {self.path}: append outside an admission transaction")
        if kind not in RECORD_KINDS:
            raise InvalidParameterError(f"ledger record kind must be one of {RECORD_KINDS}, "
                                        f"got {kind!r}")
        seq = self._seq + 1
        data, chain = _v2_line({**record, "kind": kind, "seq": seq}, self._chain)
        mac = None if self._key is None else head_mac(self._key, self.location.ledger, seq, chain)
        guard: _Guard | None = None
        try:
            with _WATCHDOG.guard(self._conn) as guard:
                self._conn.execute(
                    "INSERT INTO raydp_hpo.charges (ledger, seq, record, chain) "
                    "VALUES (%s, %s, %s::json, %s)",
                    (self.location.ledger, seq, data.decode().rstrip("\n"), chain),
                )
                self._conn.execute(
                    "UPDATE raydp_hpo.heads SET records = %s, chain = %s, mac = %s "
                    "WHERE ledger = %s", (seq, chain, mac, self.location.ledger),
                )
        except psycopg.Error as exc:
            raise self._unavailable("writing the charge", exc,
                                    guard is not None and guard.fired) from None
        try:
            with _WATCHDOG.guard(self._conn) as commit:
                self._conn.execute("COMMIT")
            self._in_tx = False
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) is not None and not commit.fired:
                # the server answered the COMMIT with an error: it did not commit
                raise self._unavailable("committing the charge", exc) from None
            self._drop_connection()
            why = (f"no answer within {FREEZE_BOUND_S:g} s" if commit.fired
                   else _first_line(exc))
            raise LedgerOutcomeUnknownError(
                f"ledger {self.path}: the commit of {kind} "
                f"{record.get('charge_id', record.get('run'))!r} was sent "
                f"but not answered ({why}): it MAY be stored. It is not acknowledged, so its "
                "mechanism must not run; it is not refused either. Ask again under the same "
                "charge id once the server answers: a stored charge is replayed (admitted), an "
                "unstored one decided afresh."
            ) from None
        self._seq, self._chain = seq, chain

    def end_admission(self) -> None:
        """Roll back an admission that wrote nothing (a refusal or an error)."""
        if not self._in_tx:
            return
        self._in_tx = False
        try:
            _execute(self._conn, "ROLLBACK")
        except Exception:  # noqa: BLE001 - the connection is dropped and reopened next time
            self._drop_connection()

    def close(self) -> None:
        self._closed = True
        self._drop_connection()


# -- dataset registry ---------------------------------------------------------------------------
def ledger_for_dataset(uri: str, fingerprint: str) -> list[str]:
    """Ledgers registered for data source ``fingerprint`` (oldest first; empty if none).
    A database that fails the query raises :class:`LedgerUnavailableError` (fail closed)."""
    psycopg = _psycopg()
    loc = parse_uri(uri, need_ledger=False)
    conn = _open_checked(loc)
    try:
        rows = _execute(conn,
            "SELECT ledger FROM raydp_hpo.datasets WHERE fingerprint = %s "
            "ORDER BY registered_at, ledger", (fingerprint,)
        ).fetchall()
        return [r[0] for r in rows]
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"looking up {fingerprint!r} in the registry of {loc.uri}: "
                                     f"{_first_line(exc)}") from None
    finally:
        conn.close()


def dataset_bindings(uri: str) -> dict[str, list[str]]:
    """Every binding of the registry in the database of ``uri``: ledger name -> the data
    sources (fingerprints) registered for it. Read-only (``SELECT``; no schema is created):
    a database without the schema has none."""
    psycopg = _psycopg()
    loc = parse_uri(uri, need_ledger=False)
    conn = _connect(loc)
    try:
        if schema_version(conn) == 0:
            return {}
        rows = conn.execute("SELECT ledger, fingerprint FROM raydp_hpo.datasets "
                            "ORDER BY registered_at, fingerprint").fetchall()
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"reading the registry of {loc.uri}: "
                                     f"{_first_line(exc)}") from None
    finally:
        conn.close()
    out: dict[str, list[str]] = {}
    for ledger, fingerprint in rows:
        out.setdefault(ledger, []).append(fingerprint)
    return out


def register_dataset(uri: str, fingerprint: str, *, admin_reason: str | None = None) -> str:
    """Bind data source ``fingerprint`` (:func:`raydp_hpo.trainables.data.dataset_fingerprint`)
    to the ledger of ``uri``; return that ledger's name.

    Registering the ledger a source already has changes nothing. A *second* ledger for
    registered data is a second budget on the same people: refused with
    :class:`~raydp_hpo.errors.LedgerMismatchError` unless ``admin_reason`` says why, which is
    then stored with the row (who, when, why). One transaction under the registry's lock."""
    psycopg = _psycopg()
    loc = parse_uri(uri)
    if not isinstance(fingerprint, str) or not fingerprint:
        raise InvalidParameterError(f"fingerprint must be a non-empty string, got {fingerprint!r}")
    conn = _connect(loc)
    try:
        ensure_schema(conn, loc.uri)
        with _WATCHDOG.guard(conn, 2 * FREEZE_BOUND_S), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (fingerprint,))
            if conn.execute("SELECT 1 FROM raydp_hpo.ledgers WHERE name = %s",
                            (loc.ledger,)).fetchone() is None:
                raise RayDPHPOError(f"no ledger {loc.ledger!r} in the database of {uri}; "
                                    "open it once (PrivacyLedger(budget, uri)) to create it")
            have = [r[0] for r in conn.execute(
                "SELECT ledger FROM raydp_hpo.datasets WHERE fingerprint = %s", (fingerprint,)
            ).fetchall()]
            if loc.ledger in have:
                return loc.ledger
            if have and not admin_reason:
                raise LedgerMismatchError(
                    f"data source {fingerprint!r} already has its budget in ledger(s) {have}; "
                    f"a second ledger {loc.ledger!r} would be a fresh budget on the same data. "
                    "Use that ledger, or, if a second budget is really meant, register it with "
                    "an admin_reason (recorded)."
                )
            conn.execute(
                "INSERT INTO raydp_hpo.datasets (fingerprint, ledger, admin_reason) "
                "VALUES (%s, %s, %s)", (fingerprint, loc.ledger, admin_reason or None),
            )
        return loc.ledger
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"registering {fingerprint!r} on {uri}: "
                                     f"{_first_line(exc)}") from None
    finally:
        conn.close()


# -- moving a journal file into PostgreSQL ---------------------------------------------------------
def migrate_journal(journal: str | os.PathLike[str], uri: str) -> int:
    """Copy the version-2 journal at ``journal`` into a new ledger at ``uri``, byte for byte
    (header and every record line, so the chain is intact); return the number of charges.

    Refuses: a version-1 journal (no chain to carry), a ledger name that already exists, and a
    journal already migrated (same header hash) — so running it twice changes nothing. The
    file is checked first (lines, chain, seal) and left as it is; stop every ledger on it
    before migrating, and use only the URI afterwards."""
    psycopg = _psycopg()
    loc = parse_uri(uri)
    path = Path(journal).expanduser().resolve()
    scan = scan_journal(path)
    if scan.version != JOURNAL_VERSION:
        raise InvalidParameterError(
            f"journal {path} is version {scan.version} (no hash chain); only version-2 "
            "journals can be migrated: start a new ledger for the data instead"
        )
    raw = path.read_bytes()[: scan.end]
    lines = raw.split(b"\n")[:-1]
    if len(lines) != len(scan.records) + 1:
        raise LedgerCorruptedError(f"journal {path} changed while it was being migrated")
    digest = hashlib.sha256(raw).hexdigest()
    key = ledger_key()
    conn = _connect(loc)
    try:
        ensure_schema(conn, loc.uri)
        with _WATCHDOG.guard(conn, 6 * FREEZE_BOUND_S), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (loc.ledger,))
            same = conn.execute(
                "SELECT name FROM raydp_hpo.ledgers WHERE name = %s OR header_chain = %s",
                (loc.ledger, scan.chains[0]),
            ).fetchall()
            if same:
                raise RayDPHPOError(
                    f"refusing to migrate {path} into {uri}: ledger(s) {[r[0] for r in same]} "
                    "already exist there with this name or this journal's header (it was "
                    "migrated before); a ledger is moved once"
                )
            conn.execute(
                "INSERT INTO raydp_hpo.ledgers (name, header, header_chain, migrated_from) "
                "VALUES (%s, %s::json, %s, %s)",
                (loc.ledger, lines[0].decode(), scan.chains[0], f"{path} sha256={digest}"),
            )
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO raydp_hpo.charges (ledger, seq, record, chain) "
                    "VALUES (%s, %s, %s::json, %s)",
                    [(loc.ledger, k, lines[k].decode(), scan.chains[k])
                     for k in range(1, len(lines))],
                )
            n, last = len(lines) - 1, scan.chains[-1]
            conn.execute(
                "INSERT INTO raydp_hpo.heads (ledger, records, chain, mac) VALUES (%s, %s, %s, %s)",
                (loc.ledger, n, last, None if key is None else head_mac(key, loc.ledger, n, last)),
            )
            got = _fetch_scan(conn, loc, key)
            check = None if got is None else got[0]
            if check is None or check.chain != scan.chain:
                raise LedgerCorruptedError(f"ledger {uri}: the migrated chain does not match "
                                           f"{path}; nothing was committed")
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"migrating {path} into {uri}: {_first_line(exc)}") from None
    finally:
        conn.close()
    return sum(r.get("kind") == "charge" for r in scan.records)  # release markers are no charges
