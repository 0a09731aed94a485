"""A privacy ledger stored in PostgreSQL: the same records and hash chain as the journal file.

A ledger is named by a URI ``postgresql://host:port/db?ledger=NAME`` (``postgres://`` too).
Everything above the storage is unchanged: :class:`~raydp_hpo.ledger.filter.PrivacyLedger`
decides with the same filter, and every record is the *same bytes* a version-2 journal line
would hold (canonical JSON with its ``"chain"`` key, :mod:`raydp_hpo.ledger.journal`), so a
ledger's rows concatenated are a journal that :func:`~raydp_hpo.ledger.journal.scan_bytes`
checks exactly as it checks a file.

Schema (schema ``raydp_hpo``, versioned by :data:`MIGRATIONS` in table ``schema_version``: a
short ordered list of SQL steps rather than Alembic, which would pull SQLAlchemy into a
package that issues a handful of fixed statements; each step runs once, in order, in one
transaction, under an advisory lock):

* ``ledgers(name, header, header_chain, created_at, migrated_from)`` — the header line;
* ``charges(ledger, seq, record, chain)`` — one row per admitted charge, the journal line
  (``json`` keeps its text byte for byte) and its chain hash;
* ``datasets(fingerprint, ledger, registered_at, registered_by, admin_reason)`` — which ledger
  holds a data source's budget (:func:`register_dataset`);
* triggers refuse ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on all three, and
  :func:`grant_ledger_role` grants a role ``SELECT, INSERT`` only (readers: ``SELECT``).
  A superuser can still change rows around the triggers; the chain then fails to verify at
  the changed record, and the ledger refuses to charge.

Admission (:meth:`PgJournal.begin_admission` … :meth:`PgJournal.append_charge`) is one
transaction: ``pg_advisory_xact_lock`` on the ledger's name (row locks would need ``UPDATE``
privilege), read the charges since the last one this process saw (chain-checked), decide,
``INSERT``, ``COMMIT`` (``synchronous_commit`` on: durable before it returns). Any number of
processes may admit on one ledger; the lock serialises them. Fail closed: any database error
(unreachable, timeout, failed commit) raises
:class:`~raydp_hpo.errors.LedgerUnavailableError` and nothing is acknowledged; the next
admission reconnects and catches up.

Credentials come only from libpq (``PGUSER``, ``PGPASSWORD``, ``~/.pgpass``, a service file):
a URI with a password is refused, and the URI shown in messages is the one given.

Longer than ~600 lines because it is one storage backend: the schema, its migrations and the
statements that append and read a ledger's rows must agree with each other and with the journal
format; splitting would separate the SQL from the locking it relies on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerClosedError,
    LedgerCorruptedError,
    LedgerMismatchError,
    LedgerUnavailableError,
    RayDPHPOError,
)
from raydp_hpo.ledger.journal import (
    JOURNAL_VERSION,
    JournalScan,
    _chain,
    _v2_line,
    _v2_split,
    scan_bytes,
    scan_journal,
)

__all__ = [
    "MIGRATIONS",
    "PgJournal",
    "PgLocation",
    "grant_ledger_role",
    "is_postgres_uri",
    "dataset_bindings",
    "ledger_for_dataset",
    "list_ledgers",
    "migrate_journal",
    "parse_uri",
    "register_dataset",
    "scan_ledger",
    "schema_version",
]

_SCHEMES = ("postgresql", "postgres")
#: Seconds before a connection attempt, a statement or a lock wait fails (the charge is refused).
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 10_000


def is_postgres_uri(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL ledger (``postgresql://…``) rather than a path."""
    return isinstance(target, str) and target.split("://", 1)[0].lower() in _SCHEMES and (
        "://" in target)


@dataclass(frozen=True)
class PgLocation:
    """A parsed ledger URI: the libpq connection string (no ``ledger`` parameter) and the
    ledger's name. ``uri`` is what messages show (it never holds a password)."""

    conninfo: str
    ledger: str
    uri: str

    def __str__(self) -> str:
        return self.uri


def parse_uri(uri: str, *, need_ledger: bool = True) -> PgLocation:
    """Split ``postgresql://host:port/db?ledger=NAME``; refuse an embedded password."""
    if not is_postgres_uri(uri):
        raise InvalidParameterError(
            f"not a PostgreSQL ledger URI: {uri!r}; use postgresql://host:port/db?ledger=NAME"
        )
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is not None or any(k == "password" for k, _ in query):
        raise InvalidParameterError(
            "a ledger URI may not hold a password (it would end up in logs, run.json and "
            "certificates); remove it and give it to libpq instead: PGPASSWORD, ~/.pgpass or a "
            "service file (PGSERVICE)"
        )
    names = [v for k, v in query if k == "ledger"]
    if len(names) > 1 or (need_ledger and (not names or not names[0])):
        raise InvalidParameterError(
            f"ledger URI {uri!r} must name exactly one ledger: add ?ledger=NAME"
        )
    rest = [(k, v) for k, v in query if k != "ledger"]
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    return PgLocation(conninfo, names[0] if names else "", uri)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise RayDPHPOError(
            "PostgreSQL ledgers need psycopg 3: pip install 'raydp-hpo[postgres]'"
        ) from None
    return psycopg


def _connect(loc: PgLocation) -> Any:
    psycopg = _psycopg()
    try:
        return psycopg.connect(
            loc.conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} "
            f"-c lock_timeout={STATEMENT_TIMEOUT_MS} -c synchronous_commit=on",
        )
    except psycopg.Error as exc:
        raise LedgerUnavailableError(
            f"cannot reach the ledger database of {loc.uri}: {_first_line(exc)}; the charge is "
            "refused (no local fallback). Check the server and libpq credentials."
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# -- schema ---------------------------------------------------------------------------------
_REFUSE = """
CREATE FUNCTION raydp_hpo.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'raydp-hpo ledger tables are append-only: % on %.% refused',
    TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME;
END $$;
"""


def _guard(table: str) -> str:
    return (
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON raydp_hpo.{table} "
        "FOR EACH ROW EXECUTE FUNCTION raydp_hpo.refuse_change();\n"
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON raydp_hpo.{table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION raydp_hpo.refuse_change();\n"
    )


#: Ordered schema steps: (version, description, SQL). Append only; never edit a released step.
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "ledgers, charges, dataset registry; append-only triggers",
     """
CREATE TABLE raydp_hpo.ledgers (
  name text PRIMARY KEY,
  header json NOT NULL,
  header_chain char(64) NOT NULL UNIQUE,
  created_at timestamptz NOT NULL DEFAULT now(),
  migrated_from text
);
CREATE TABLE raydp_hpo.charges (
  ledger text NOT NULL REFERENCES raydp_hpo.ledgers(name),
  seq bigint NOT NULL CHECK (seq >= 1),
  record json NOT NULL,
  chain char(64) NOT NULL,
  PRIMARY KEY (ledger, seq)
);
CREATE TABLE raydp_hpo.datasets (
  fingerprint text NOT NULL,
  ledger text NOT NULL REFERENCES raydp_hpo.ledgers(name),
  registered_at timestamptz NOT NULL DEFAULT now(),
  registered_by text NOT NULL DEFAULT current_user,
  admin_reason text,
  PRIMARY KEY (fingerprint, ledger)
);
""" + _REFUSE + _guard("ledgers") + _guard("charges") + _guard("datasets")),
)
_SCHEMA_LOCK = 0x72617964  # advisory lock key for schema changes ("rayd")


def schema_version(conn: Any) -> int:
    """The highest schema step applied in the database of ``conn`` (0: none)."""
    row = conn.execute(
        "SELECT to_regclass('raydp_hpo.schema_version') IS NOT NULL"
    ).fetchone()
    if not row[0]:
        return 0
    return int(conn.execute("SELECT coalesce(max(version), 0) FROM raydp_hpo.schema_version")
               .fetchone()[0])


def ensure_schema(conn: Any) -> int:
    """Apply the missing :data:`MIGRATIONS` in order (each once); return the version."""
    latest = MIGRATIONS[-1][0]
    if schema_version(conn) >= latest:
        return latest
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS raydp_hpo")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raydp_hpo.schema_version (version int PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = schema_version(conn)
        for version, description, sql in MIGRATIONS:
            if version > current:
                conn.execute(sql)
                conn.execute(
                    "INSERT INTO raydp_hpo.schema_version (version, description) VALUES (%s, %s)",
                    (version, description),
                )
    return latest


def grant_ledger_role(uri: str, role: str, *, read_only: bool = False) -> None:
    """Grant ``role`` what a ledger needs and nothing more: ``SELECT, INSERT`` on the ledger
    tables (``SELECT`` only with ``read_only``, for ``ledger show`` and dashboards). Run as
    the schema's owner."""
    psycopg = _psycopg()
    from psycopg import sql

    loc = parse_uri(uri, need_ledger=False)
    conn = _connect(loc)
    try:
        ensure_schema(conn)
        ident = sql.Identifier(role)
        privs = sql.SQL("SELECT") if read_only else sql.SQL("SELECT, INSERT")
        with conn.transaction():
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA raydp_hpo TO {}").format(ident))
            conn.execute(sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA raydp_hpo TO {}")
                         .format(privs, ident))
    except psycopg.Error as exc:
        raise RayDPHPOError(f"granting {role!r} on {uri}: {_first_line(exc)}") from None
    finally:
        conn.close()


# -- reading and checking ---------------------------------------------------------------------
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


def _fetch_scan(conn: Any, loc: PgLocation) -> JournalScan | None:
    row = conn.execute(
        "SELECT header::text FROM raydp_hpo.ledgers WHERE name = %s", (loc.ledger,)
    ).fetchone()
    if row is None:
        return None
    rows = conn.execute(
        "SELECT seq, record::text, chain FROM raydp_hpo.charges WHERE ledger = %s ORDER BY seq",
        (loc.ledger,),
    ).fetchall()
    return _rows_to_scan(loc, row[0], rows)


def scan_ledger(uri: str) -> JournalScan:
    """Read and check every record of the ledger at ``uri`` (read-only, like
    :func:`~raydp_hpo.ledger.journal.scan_journal`). ``scan.path`` holds the URI."""
    loc = parse_uri(uri)
    psycopg = _psycopg()
    conn = _connect(loc)
    try:
        if schema_version(conn) == 0:
            raise RayDPHPOError(f"no raydp-hpo ledger schema in the database of {uri}")
        scan = _fetch_scan(conn, loc)
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"reading ledger {uri}: {_first_line(exc)}") from None
    finally:
        conn.close()
    if scan is None:
        raise RayDPHPOError(f"no ledger {loc.ledger!r} in the database of {uri}")
    return scan


def list_ledgers(uri: str) -> list[str]:
    """Names of the ledgers in the database of ``uri`` (``?ledger=`` optional)."""
    loc = parse_uri(uri, need_ledger=False)
    conn = _connect(loc)
    try:
        if schema_version(conn) == 0:
            return []
        rows = conn.execute("SELECT name FROM raydp_hpo.ledgers ORDER BY name").fetchall()
        return [r[0] for r in rows]
    finally:
        conn.close()


class PgJournal:
    """The writer side of a PostgreSQL ledger, with the interface of
    :class:`~raydp_hpo.ledger.journal.Journal` plus the admission transaction
    (:meth:`begin_admission`, :meth:`end_admission`)."""

    def __init__(self, loc: PgLocation, conn: Any, scan: JournalScan, *, created: bool) -> None:
        self.location = loc
        self.created = created
        self.scan = scan
        self._conn: Any = conn
        self._seq = len(scan.records)
        self._chain = scan.chain
        self._header_chain = scan.chains[0]
        self._closed = False
        self._in_tx = False

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
        there is none of that name, and read and check every record."""
        loc = parse_uri(uri)  # first: a password is refused with or without psycopg
        psycopg = _psycopg()
        conn = _connect(loc)
        try:
            ensure_schema(conn)
            created = False
            if create_header is not None:
                line, chain = _v2_line(
                    {"kind": "header", "version": JOURNAL_VERSION, **create_header}, None
                )
                cur = conn.execute(
                    "INSERT INTO raydp_hpo.ledgers (name, header, header_chain) VALUES "
                    "(%s, %s::json, %s) ON CONFLICT DO NOTHING",
                    (loc.ledger, line.decode().rstrip("\n"), chain),
                )
                created = cur.rowcount == 1
            scan = _fetch_scan(conn, loc)
            if scan is None:
                raise RayDPHPOError(f"no ledger {loc.ledger!r} in the database of {uri}")
            return cls(loc, conn, scan, created=created)
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

    def _unavailable(self, what: str, exc: BaseException) -> LedgerUnavailableError:
        self._drop_connection()
        return LedgerUnavailableError(
            f"ledger {self.path}: {what} failed ({_first_line(exc)}); the charge is refused "
            "(fail closed, nothing was acknowledged). It is retried on a new connection at the "
            "next charge."
        )

    def _drop_connection(self) -> None:
        self._in_tx = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close
                conn.close()

    def begin_admission(self) -> list[dict[str, Any]]:
        """Start the admission transaction: lock the ledger and return the charge records
        written since this process last saw it (chain-checked), which the caller must absorb
        before deciding. Ends with :meth:`append_charge` (commits) or :meth:`end_admission`."""
        psycopg = _psycopg()
        self.check_writable()
        if self._in_tx:
            raise RayDPHPOError(f"ledger {self.path}: admission already in progress")
        try:
            if self._conn is None or self._conn.closed:
                self._conn = _connect(self.location)
            self._conn.execute("BEGIN")
            self._in_tx = True
            self._conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self.location.ledger,)
            )
            rows = self._conn.execute(
                "SELECT seq, record::text, chain FROM raydp_hpo.charges "
                "WHERE ledger = %s AND seq > %s ORDER BY seq",
                (self.location.ledger, self._seq),
            ).fetchall()
        except LedgerUnavailableError:
            self._drop_connection()
            raise
        except psycopg.Error as exc:
            raise self._unavailable("locking and reading the ledger", exc) from None
        try:
            return self._absorb_rows(rows)
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
                    or rec.get("seq") != seq + 1 or rec.get("kind") != "charge"):
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

    def append_charge(self, record: dict[str, Any]) -> None:
        """Insert charge ``record`` (gets ``kind`` and the next ``seq``) and commit: on return
        it is durable. Must follow :meth:`begin_admission`; on any error nothing is
        acknowledged (the transaction is rolled back, or its outcome is read at the next
        admission)."""
        psycopg = _psycopg()
        if not self._in_tx:
            raise RayDPHPOError(f"ledger {self.path}: append outside an admission transaction")
        seq = self._seq + 1
        data, chain = _v2_line({**record, "kind": "charge", "seq": seq}, self._chain)
        try:
            self._conn.execute(
                "INSERT INTO raydp_hpo.charges (ledger, seq, record, chain) "
                "VALUES (%s, %s, %s::json, %s)",
                (self.location.ledger, seq, data.decode().rstrip("\n"), chain),
            )
            self._conn.execute("COMMIT")
            self._in_tx = False
        except psycopg.Error as exc:
            raise self._unavailable("writing the charge", exc) from None
        self._seq, self._chain = seq, chain

    def end_admission(self) -> None:
        """Roll back an admission that wrote nothing (a refusal or an error)."""
        if not self._in_tx:
            return
        self._in_tx = False
        try:
            self._conn.execute("ROLLBACK")
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
    conn = _connect(loc)
    try:
        ensure_schema(conn)
        rows = conn.execute(
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
        ensure_schema(conn)
        with conn.transaction():
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
    conn = _connect(loc)
    try:
        ensure_schema(conn)
        with conn.transaction():
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
            check = _fetch_scan(conn, loc)
            if check is None or check.chain != scan.chain:
                raise LedgerCorruptedError(f"ledger {uri}: the migrated chain does not match "
                                           f"{path}; nothing was committed")
    except psycopg.Error as exc:
        raise LedgerUnavailableError(f"migrating {path} into {uri}: {_first_line(exc)}") from None
    finally:
        conn.close()
    return len(scan.records)
