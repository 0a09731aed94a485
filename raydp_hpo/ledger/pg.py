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
* ``charges(ledger, seq, record, chain)`` — one row per admitted charge, the journal line
  (``json`` keeps its text byte for byte) and its chain hash;
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

Longer than ~600 lines because it is one storage backend: the schema, its migrations, the
head and its key, the deadlines and the statements that append and read a ledger's rows must
agree with each other and with the journal format; splitting would separate the SQL from the
locking and the timeouts it relies on. The URI rules are their own module,
:mod:`raydp_hpo.ledger.pg_location`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
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
    JournalScan,
    _chain,
    _v2_line,
    _v2_split,
    scan_bytes,
    scan_journal,
)
from raydp_hpo.ledger.pg_location import (
    ALLOWED_PARAMETERS,
    PgLocation,
    _psycopg,
    is_postgres_uri,
    parse_uri,
    same_location,
)

__all__ = [
    "MIGRATIONS",
    "PgJournal",
    "PgLocation",
    "ALLOWED_PARAMETERS",
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "grant_ledger_role",
    "head_mac",
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

#: Seconds before a connection attempt, a statement or a lock wait fails (the charge is refused).
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 10_000
#: TCP keepalives and ``tcp_user_timeout`` on every connection: a peer that stops answering
#: (a frozen or partitioned server) is declared dead within :data:`FREEZE_BOUND_S` even while a
#: statement waits for its answer — the server-side ``statement_timeout`` cannot fire on a
#: frozen server, so the client must not wait on it.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 2, 1, 3
TCP_USER_TIMEOUT_MS = 5_000
#: The most a charge waits on an established connection to an unresponsive server before it is
#: refused (or reported indeterminate, when the commit itself went unanswered): the client-side
#: read deadline of :func:`_execute`.
FREEZE_BOUND_S = 12.0


#: How long a database may idle inside an admission transaction before the server ends it
#: (a frozen or lost *client* then releases the ledger's lock; its charge was never committed).
IDLE_IN_TRANSACTION_MS = 30_000


def _connect(loc: PgLocation) -> Any:
    """A connection with every bound of the module docstring's "Fail closed in time": a
    connect timeout, server-side statement/lock/idle-in-transaction timeouts, TCP keepalives
    and ``tcp_user_timeout`` (a dead peer or network), plus :func:`_guarded`'s client-side
    deadline around every statement (a frozen server: its kernel still answers TCP, so only
    the client can stop waiting)."""
    psycopg = _psycopg()
    given = psycopg.conninfo.conninfo_to_dict(loc.conninfo)
    timeout = int(given.get("connect_timeout") or CONNECT_TIMEOUT_S)
    try:
        return psycopg.connect(  # psycopg enforces connect_timeout on the client side
            loc.conninfo,
            autocommit=True,
            connect_timeout=timeout,
            keepalives=1,
            keepalives_idle=KEEPALIVE_IDLE_S,
            keepalives_interval=KEEPALIVE_INTERVAL_S,
            keepalives_count=KEEPALIVE_COUNT,
            tcp_user_timeout=TCP_USER_TIMEOUT_MS,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} "
            f"-c lock_timeout={STATEMENT_TIMEOUT_MS} "
            f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} "
            "-c synchronous_commit=on",
        )
    except psycopg.Error as exc:
        raise LedgerUnavailableError(
            f"cannot reach the ledger database of {loc.uri}: {_first_line(exc)}; the charge is "
            "refused (no local fallback). Check the server and libpq credentials."
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class _Guard:
    """One armed deadline (see :class:`_Watchdog`); ``fired`` once it cut the connection."""

    __slots__ = ("conn", "fired", "until")

    def __init__(self, conn: Any, until: float) -> None:
        self.conn, self.until, self.fired = conn, until, False


class _Watchdog:
    """Client-side deadlines for statements on a connection: one daemon thread per process.

    The server-side ``statement_timeout`` cannot fire on a *frozen* server (SIGSTOP, a hung
    host), and TCP keepalives do not either while the server's kernel still acknowledges
    packets; the client's read would block for the whole freeze and then admit. So every
    statement runs under :meth:`guard`: when its deadline passes, the watchdog shuts the
    connection's socket down (``shutdown(2)``), the blocked read fails at once, and the
    connection is dropped (the server rolls back an uncommitted transaction when it sees the
    socket closed)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: list[_Guard] = []
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, conn: Any, seconds: float = FREEZE_BOUND_S) -> Iterator[_Guard]:
        g = _Guard(conn, time.monotonic() + seconds)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="raydp-hpo-pg-watchdog",
                                                daemon=True)
                self._thread.start()
            self._armed.append(g)
            self._cond.notify()
        try:
            yield g
        finally:
            with self._cond, contextlib.suppress(ValueError):
                self._armed.remove(g)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for g in [g for g in self._armed if g.until <= now]:
                    self._armed.remove(g)
                    g.fired = True
                    _sever(g.conn)
                wait = min((g.until for g in self._armed), default=now + 3600.0) - now
                self._cond.wait(max(wait, 0.0))

    def _reset_in_child(self) -> None:
        """After ``fork``: the parent's thread does not exist here and its lock may be held."""
        self._cond = threading.Condition()
        self._armed = []
        self._thread = None


def _sever(conn: Any) -> None:
    """Shut down ``conn``'s socket so that a read blocked on it returns now."""
    if conn is None:
        return
    try:
        fd = conn.pgconn.socket
    except Exception:  # noqa: BLE001 - already closed: nothing blocks on it
        return
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._reset_in_child)


def _execute(conn: Any, query: Any, params: Any = None, *,
             seconds: float = FREEZE_BOUND_S) -> Any:
    """``conn.execute`` within the client-side deadline (:class:`_Watchdog`)."""
    with _WATCHDOG.guard(conn, seconds):
        return conn.execute(query, params)


# -- the keyed head -----------------------------------------------------------------------------
#: Environment variables that hold the ledger key (the key itself, or a file holding it).
KEY_ENV, KEY_FILE_ENV = "RAYDP_HPO_LEDGER_KEY", "RAYDP_HPO_LEDGER_KEY_FILE"


def ledger_key() -> bytes | None:
    """The HMAC key for ledger heads, held apart from the database: the bytes of the file
    named by ``RAYDP_HPO_LEDGER_KEY_FILE`` (surrounding whitespace stripped), else
    ``RAYDP_HPO_LEDGER_KEY`` (UTF-8); ``None`` when neither is set. At least 16 bytes."""
    path = os.environ.get(KEY_FILE_ENV, "").strip()
    if path:
        try:
            key = Path(path).expanduser().read_bytes().strip()
        except OSError as exc:
            raise InvalidParameterError(
                f"{KEY_FILE_ENV}={path!r}: cannot read the ledger key ({exc.strerror}); point "
                "it at the key file or unset it") from None
        where = f"{KEY_FILE_ENV}={path!r}"
    else:
        raw = os.environ.get(KEY_ENV, "")
        if not raw:
            return None
        key, where = raw.encode(), KEY_ENV
    if len(key) < 16:
        raise InvalidParameterError(
            f"the ledger key from {where} is {len(key)} bytes; use at least 16 random bytes "
            "(e.g. head -c 32 /dev/urandom | base64 > ledger.key)")
    return key


def head_mac(key: bytes, ledger: str, records: int, chain: str) -> str:
    """HMAC-SHA256 over a ledger's head. The chain hash commits to the header and every
    record, so a valid MAC on (name, count, last chain) vouches for the whole ledger to
    whoever holds the key (a keyed chain: recomputing the chain without the key is caught)."""
    msg = f"raydp-hpo ledger head v1\n{ledger}\n{records}\n{chain}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


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


_HEAD_GROWS = """
CREATE FUNCTION raydp_hpo.head_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE last_seq bigint; last_chain char(64);
BEGIN
  IF NEW.ledger <> OLD.ledger OR NEW.records <= OLD.records
     OR (OLD.mac IS NOT NULL AND NEW.mac IS NULL) THEN
    RAISE EXCEPTION 'raydp-hpo ledger heads only grow: % of the head of % refused',
      TG_OP, OLD.ledger;
  END IF;
  SELECT seq, chain INTO last_seq, last_chain FROM raydp_hpo.charges
    WHERE ledger = NEW.ledger ORDER BY seq DESC LIMIT 1;
  IF last_seq IS DISTINCT FROM NEW.records OR last_chain IS DISTINCT FROM NEW.chain THEN
    RAISE EXCEPTION 'raydp-hpo ledger head of % must name its last record', NEW.ledger;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER heads_only_grow BEFORE UPDATE ON raydp_hpo.heads
  FOR EACH ROW EXECUTE FUNCTION raydp_hpo.head_only_grows();
CREATE TRIGGER heads_no_delete BEFORE DELETE ON raydp_hpo.heads
  FOR EACH ROW EXECUTE FUNCTION raydp_hpo.refuse_change();
CREATE TRIGGER heads_no_truncate BEFORE TRUNCATE ON raydp_hpo.heads
  FOR EACH STATEMENT EXECUTE FUNCTION raydp_hpo.refuse_change();
"""
# existing ledgers get their head from their rows; roles that could charge (INSERT on charges)
# may advance heads, roles that could read may read them (``ledger init`` grants the same)
_HEAD_BACKFILL = """
INSERT INTO raydp_hpo.heads (ledger, records, chain)
SELECT l.name, coalesce(c.seq, 0), coalesce(c.chain, l.header_chain)
FROM raydp_hpo.ledgers l LEFT JOIN LATERAL (
  SELECT seq, chain FROM raydp_hpo.charges WHERE ledger = l.name ORDER BY seq DESC LIMIT 1
) c ON true;
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT DISTINCT grantee, privilege_type FROM information_schema.role_table_grants
           WHERE table_schema = 'raydp_hpo' AND table_name = 'charges'
             AND privilege_type IN ('SELECT', 'INSERT') AND grantee <> current_user LOOP
    IF r.privilege_type = 'INSERT' THEN
      EXECUTE format('GRANT SELECT, INSERT, UPDATE ON raydp_hpo.heads TO %I', r.grantee);
    ELSE
      EXECUTE format('GRANT SELECT ON raydp_hpo.heads TO %I', r.grantee);
    END IF;
  END LOOP;
END $$;
"""

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
    (2, "ledger heads (record count, last chain, optional HMAC) that only grow",
     """
CREATE TABLE raydp_hpo.heads (
  ledger text PRIMARY KEY REFERENCES raydp_hpo.ledgers(name),
  records bigint NOT NULL CHECK (records >= 0),
  chain char(64) NOT NULL,
  mac char(64)
);
""" + _HEAD_GROWS + _HEAD_BACKFILL),
)
#: The schema version this raydp-hpo writes and reads.
SCHEMA_VERSION = MIGRATIONS[-1][0]
_SCHEMA_LOCK = 0x72617964  # advisory lock key for schema changes ("rayd")


def _init_hint(uri: str) -> str:
    return (f"as the database owner, run: raydp-hpo ledger init '{uri}' --role <ledger role> "
            "[--read-only-role <reader role>]")


def schema_version(conn: Any) -> int:
    """The highest schema step applied in the database of ``conn`` (0: none)."""
    row = _execute(conn, "SELECT to_regclass('raydp_hpo.schema_version') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    return int(_execute(conn, "SELECT coalesce(max(version), 0) FROM raydp_hpo.schema_version")
               .fetchone()[0])


def _refuse_newer(found: int, uri: str) -> None:
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database of {uri} holds raydp-hpo ledger schema version {found}, newer than "
            f"the version {SCHEMA_VERSION} this raydp-hpo knows; refusing to read or charge it "
            "(an older program could miss what the newer schema enforces). Upgrade raydp-hpo "
            "on this machine to the version that wrote it."
        )


def ensure_schema(conn: Any, uri: str = "this database") -> int:
    """Apply the missing :data:`MIGRATIONS` in order (each once); return the version.

    A newer, unknown version is refused (:class:`SchemaVersionError` naming both versions).
    A role that may not create or change the schema (the least-privilege ledger role on an
    unset or older database) gets an error naming ``raydp-hpo ledger init``."""
    psycopg = _psycopg()
    found = schema_version(conn)
    _refuse_newer(found, uri)
    if found == SCHEMA_VERSION:
        return found
    try:
        with _WATCHDOG.guard(conn, 6 * FREEZE_BOUND_S), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute("CREATE SCHEMA IF NOT EXISTS raydp_hpo")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS raydp_hpo.schema_version (version int PRIMARY KEY, "
                "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            current = schema_version(conn)
            _refuse_newer(current, uri)
            for version, description, sql in MIGRATIONS:
                if version > current:
                    conn.execute(sql)
                    conn.execute(
                        "INSERT INTO raydp_hpo.schema_version (version, description) "
                        "VALUES (%s, %s)", (version, description),
                    )
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject, psycopg.errors.DuplicateFunction) as exc:
        what = ("has no raydp-hpo ledger schema" if found == 0 else
                f"holds ledger schema version {found}, older than {SCHEMA_VERSION}")
        raise SchemaVersionError(
            f"the database of {uri} {what}, and this role cannot set it up "
            f"({_first_line(exc)}); {_init_hint(uri)}"
        ) from None
    return SCHEMA_VERSION


def grant_ledger_role(uri: str, role: str, *, read_only: bool = False) -> None:
    """Grant ``role`` what a ledger needs and nothing more: ``SELECT, INSERT`` on the ledger
    tables and ``UPDATE`` of ledger heads, whose triggers let them only grow (``SELECT`` only
    with ``read_only``, for ``ledger show`` and dashboards). Run as the schema's owner."""
    init_ledger_database(uri, **({"read_only_roles": [role]} if read_only else {"roles": [role]}))


def init_ledger_database(uri: str, *, roles: list[str] | tuple[str, ...] = (),
                         read_only_roles: list[str] | tuple[str, ...] = ()) -> tuple[int, int]:
    """Create or upgrade the ledger schema in the database of ``uri`` and grant ``roles``
    (ledger writers: ``SELECT, INSERT`` on every table, ``UPDATE`` on ``heads`` only) and
    ``read_only_roles`` (``SELECT``); ``raydp-hpo ledger init``. Run as the database owner.
    Returns (version before, version after)."""
    psycopg = _psycopg()
    from psycopg import sql

    loc = parse_uri(uri, need_ledger=False)
    conn = _connect(loc)
    try:
        before = schema_version(conn)
        after = ensure_schema(conn, loc.uri)
        with _WATCHDOG.guard(conn, 6 * FREEZE_BOUND_S), conn.transaction():
            for role, read_only in [*((r, False) for r in roles),
                                    *((r, True) for r in read_only_roles)]:
                ident = sql.Identifier(role)
                privs = sql.SQL("SELECT") if read_only else sql.SQL("SELECT, INSERT")
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA raydp_hpo TO {}").format(ident))
                conn.execute(sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA raydp_hpo TO {}")
                             .format(privs, ident))
                if not read_only:
                    conn.execute(sql.SQL("GRANT UPDATE ON raydp_hpo.heads TO {}").format(ident))
    except psycopg.Error as exc:
        raise RayDPHPOError(f"setting up the ledger schema on {loc.uri}: {_first_line(exc)} "
                            "(run it as the database owner; roles must exist: CREATE ROLE)"
                            ) from None
    finally:
        conn.close()
    return before, after


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
        """Insert charge ``record`` (gets ``kind`` and the next ``seq``), advance the ledger's
        head (and its MAC under the key) and commit: on return it is durable.

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
        seq = self._seq + 1
        data, chain = _v2_line({**record, "kind": "charge", "seq": seq}, self._chain)
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
                f"ledger {self.path}: the commit of charge {record.get('charge_id')!r} was sent "
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
    return len(scan.records)
