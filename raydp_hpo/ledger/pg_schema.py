"""The PostgreSQL ledger schema: its migrations, versions, roles, and the key of its heads.

One concern: what :mod:`raydp_hpo.ledger.pg` stores and who may change it. :data:`MIGRATIONS`
is a short ordered list of SQL steps (each runs once, in order, in one transaction, under an
advisory lock); :func:`init_ledger_database` applies them as the owner and grants the roles
(``raydp-hpo ledger init``); a newer version than :data:`SCHEMA_VERSION` is refused, an older
or missing one names ``ledger init`` (:class:`~raydp_hpo.errors.SchemaVersionError`). Triggers
refuse ``UPDATE``/``DELETE``/``TRUNCATE`` and let a head only grow; :func:`head_mac` keys a
head with HMAC-SHA256 under :func:`ledger_key`, held apart from the database. Split out of
:mod:`raydp_hpo.ledger.pg`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError, SchemaVersionError
from raydp_hpo.ledger.pg_connection import (
    _WATCHDOG,
    FREEZE_BOUND_S,
    _connect,
    _execute,
    _first_line,
)
from raydp_hpo.ledger.pg_location import _psycopg, parse_uri

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
