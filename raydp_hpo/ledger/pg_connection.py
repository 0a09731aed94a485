"""Connections to a PostgreSQL ledger that fail closed in time.

One concern: how :mod:`raydp_hpo.ledger.pg` talks to the server. Every connection has a
connect timeout, ``statement_timeout``, ``lock_timeout``,
``idle_in_transaction_session_timeout``, TCP keepalives and ``tcp_user_timeout``; since a
frozen server answers none of those (its kernel still acknowledges TCP), every statement also
runs under a client-side deadline (:data:`FREEZE_BOUND_S`, :class:`_Watchdog`) that shuts the
socket down. Split out of :mod:`raydp_hpo.ledger.pg`, which re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from raydp_hpo.errors import LedgerUnavailableError
from raydp_hpo.ledger.pg_location import PgLocation, _psycopg

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
