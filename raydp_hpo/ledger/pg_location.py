"""Where a PostgreSQL ledger lives: its URI read as libpq reads it.

:func:`is_postgres_uri` is the one place that tells a ledger URI from a journal file's path
(any other scheme is an error, never a path); :func:`parse_uri` checks a URI against libpq's
rules (query parameters override the path; an allow-list of parameters; no secret in any
case, never echoed; one host) and :class:`PgLocation` says which database it really names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

__all__ = ["ALLOWED_PARAMETERS", "PgLocation", "is_postgres_uri", "parse_uri", "same_location"]

_SCHEMES = ("postgresql", "postgres")
#: A URI scheme at the start of a location (``scheme://`` or a scheme naming PostgreSQL).
_SCHEME_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):(//)?")
#: Query parameters a ledger URI may carry (``ledger`` is ours, the rest libpq's): where the
#: server is (``host``, ``port``, ``dbname``, ``user``; they override the URI's path, as libpq
#: reads them) and settings that cannot move the ledger elsewhere. Anything else is refused
#: by name: ``hostaddr`` and ``service`` would connect somewhere the URI does not show,
#: ``options`` could change ``search_path`` or our timeouts, ``keepalives*`` and
#: ``tcp_user_timeout`` are set by :func:`_connect` (the documented freeze bound).
ALLOWED_PARAMETERS = frozenset({
    "ledger", "host", "port", "dbname", "user", "sslmode", "sslrootcert", "sslcert", "sslkey",
    "sslcrl", "sslcrldir", "sslnegotiation", "sslsni", "connect_timeout", "application_name",
    "target_session_attrs", "channel_binding", "gssencmode", "krbsrvname", "client_encoding",
    "require_auth",
})
#: Substrings of a parameter name (any case) that mark a secret: refused without its value.
_SECRET_MARKS = ("password", "secret", "scram_", "passfile")

def is_postgres_uri(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL ledger (``postgresql://…`` or ``postgres://…``)
    rather than a journal file's path: the ONE place that tells them apart.

    A ``str`` that starts with any other URI scheme (``postgresql+psycopg://``,
    ``postgress://``, ``pg://``, ``file://``, ``s3://`` …) or a scheme naming PostgreSQL without
    ``//`` is neither: :class:`InvalidParameterError` (never taken as a file path, which would
    be a fresh journal with a fresh budget). A :class:`~pathlib.Path` is always a path."""
    if not isinstance(target, str):
        return False
    match = _SCHEME_RE.match(target)
    if match is None:
        return False
    scheme = match.group(1).lower()
    if scheme in _SCHEMES and match.group(2):
        return True
    looks_pg = scheme.startswith(("postgres", "pg", "psql")) or "postgres" in scheme
    if match.group(2) or looks_pg:
        raise InvalidParameterError(
            f"ledger location with scheme {match.group(1)!r}: raydp-hpo stores a ledger in a "
            "journal file (a path, no scheme) or in PostgreSQL as "
            "postgresql://host:port/db?ledger=NAME (postgres:// too); no other scheme is "
            "supported, and it is not taken as a file path"
        )
    return False


@dataclass(frozen=True)
class PgLocation:
    """A parsed ledger URI: the libpq connection URI (no ``ledger`` parameter) and the
    ledger's name. ``uri`` is what messages show (it never holds a secret: those are refused).
    Two locations are the same database when host, port and database as libpq reads them
    (:meth:`database`, :meth:`same_database`) are equal, however the URIs are written."""

    conninfo: str
    ledger: str
    uri: str

    def __str__(self) -> str:
        return self.uri

    def database(self) -> tuple[str, str, str, str]:
        """``(host, port, dbname, user)`` as libpq will connect: the URI's query parameters
        override its authority and path (``?dbname=other&port=…``), then ``PG*`` environment
        variables, then libpq's defaults (a local socket, 5432, the OS user, dbname = user).
        Host names are compared lower-cased and unresolved."""
        psycopg = _psycopg()
        given = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        defaults = {o.keyword.decode(): (o.val.decode() if o.val else "")
                    for o in psycopg.pq.Conninfo.get_defaults()}

        def get(key: str) -> str:
            return str(given.get(key) or defaults.get(key) or "")

        user = get("user")
        return get("host").lower(), get("port") or "5432", get("dbname") or user, user

    def same_database(self, other: PgLocation) -> bool:
        """Whether libpq connects both to one database: the same host, port and database name
        (:meth:`database`). The user is not compared: every role sees the same schema-qualified
        ``raydp_hpo`` tables there, and a deployment reads with one role (``ledger_ro``) and
        charges with another (``ledger_rw``)."""
        return self.database()[:3] == other.database()[:3]

    def with_ledger(self, name: str) -> str:
        """This database's URI naming ledger ``name``."""
        sep = "&" if "?" in self.conninfo else "?"
        return f"{self.conninfo}{sep}{urlencode({'ledger': name})}"


def _refuse_secret(uri_scheme: str, key: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"a ledger URI may not hold a secret ({key!r} given; its value is not shown): it would "
        "end up in logs, run.json and certificates. Remove it and give it to libpq instead: "
        f"PGPASSWORD, ~/.pgpass or a service file (PGSERVICE); e.g. {uri_scheme}://host:port/"
        "db?ledger=NAME"
    )


def parse_uri(uri: str, *, need_ledger: bool = True) -> PgLocation:
    """Split ``postgresql://host:port/db?ledger=NAME`` and check it as libpq will read it.

    Refused, each naming the fix and never echoing a secret: a password in the authority or
    any secret-bearing parameter in any case (``password``, ``PASSWORD``, ``sslpassword``…),
    a parameter outside :data:`ALLOWED_PARAMETERS` (by name), a parameter given twice, more
    than one host or port (libpq would try each in turn: the ledger would be wherever the
    first answering server is), and a URI that names no (or more than one) ledger."""
    if not is_postgres_uri(uri):
        raise InvalidParameterError(
            "not a PostgreSQL ledger URI; use postgresql://host:port/db?ledger=NAME"
        )
    uri = uri.strip()
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.password is not None:
        raise _refuse_secret(scheme, "password in user:password@host")
    query = parse_qsl(parts.query, keep_blank_values=True)
    for key, _ in query:
        if any(mark in key.lower() for mark in _SECRET_MARKS):
            raise _refuse_secret(scheme, key)
    shown = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
    for key, _ in query:
        if key not in ALLOWED_PARAMETERS:
            raise InvalidParameterError(
                f"parameter {key!r} is not allowed in a ledger URI (its value is not shown); "
                f"allowed: {', '.join(sorted(ALLOWED_PARAMETERS))}. Remove it (settings that "
                "move the connection elsewhere, like hostaddr, service or options, are refused)"
            )
    keys = [k for k, _ in query]
    if len(keys) != len(set(keys)):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise InvalidParameterError(
            f"ledger URI {shown!r} gives {', '.join(twice)} more than once; give each once"
            + (" (a URI must name exactly one ledger: ?ledger=NAME)" if "ledger" in twice else "")
        )
    hosts = [parts.netloc.rsplit("@", 1)[-1]] + [v for k, v in query if k in ("host", "port")]
    if any("," in h for h in hosts):
        raise InvalidParameterError(
            f"ledger URI {shown!r} names several hosts or ports; a ledger lives in one "
            "database, so give one host and one port (libpq would charge whichever server "
            "answers first)"
        )
    names = [v for k, v in query if k == "ledger"]
    if need_ledger and (not names or not names[0]):
        raise InvalidParameterError(
            f"ledger URI {shown!r} must name exactly one ledger: add ?ledger=NAME"
        )
    rest = [(k, v) for k, v in query if k != "ledger"]
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise InvalidParameterError(
            f"ledger URI {shown!r}: the port is not a number; use postgresql://host:port/db"
        ) from None
    return PgLocation(conninfo, names[0] if names else "", shown)


def same_location(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same ledger: two PostgreSQL URIs with the same
    database as libpq reads it (:meth:`PgLocation.database`) and the same ledger name, or two
    paths to the same file (resolved)."""
    a_pg, b_pg = is_postgres_uri(a), is_postgres_uri(b)
    if a_pg != b_pg:
        return False
    if a_pg:
        la, lb = parse_uri(str(a)), parse_uri(str(b))
        return la.ledger == lb.ledger and la.same_database(lb)
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise RayDPHPOError(
            "PostgreSQL ledgers need psycopg 3: pip install 'raydp-hpo[postgres]'"
        ) from None
    return psycopg
