"""A throw-away PostgreSQL server for the ledger tests: ``initdb`` + ``pg_ctl`` of the installed
server (Debian's ``postgresql`` package: ``/usr/lib/postgresql/<v>/bin``) under a temp dir, on a
free local port. PostgreSQL refuses to run as root, so as root the server runs as the
unprivileged ``postgres`` system user (``runuser -u postgres --``), which owns the temp dir.

Roles: the cluster's superuser (``postgres`` or the current user) owns the schema; ``ledger_rw``
gets ``SELECT, INSERT`` and ``UPDATE`` of the growing ``heads`` only (what a ledger uses) and
``ledger_ro`` ``SELECT`` only. Auth is ``trust`` on 127.0.0.1 (a test server); the tests pass
the role in ``PGUSER``, as libpq users do.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WRITER = "ledger_rw"
READER = "ledger_ro"
DB = "raydp"


def find_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One throw-away cluster; :meth:`start`, :meth:`stop` (``mode='immediate'`` kills it)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="raydp-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_user: str | None = None
        self.superuser = pwd.getpwuid(os.getuid()).pw_name
        if os.geteuid() == 0:
            self.as_user = self.superuser = "postgres"
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o755)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_user is not None:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.superuser,
                  "--no-instructions")

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c fsync=on -c synchronous_commit=on -c max_connections=60")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def uri(self, ledger: str | None = None, db: str = DB) -> str:
        base = f"postgresql://127.0.0.1:{self.port}/{db}"
        return base if ledger is None else f"{base}?ledger={ledger}"

    def admin_conninfo(self, db: str = DB) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={db} user={self.superuser}"

    def setup_roles(self) -> None:
        """Create the database and the two least-privilege roles; apply the schema as owner."""
        import psycopg

        from raydp_hpo.ledger.pg import grant_ledger_role

        with psycopg.connect(self.admin_conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
            conn.execute(f"CREATE ROLE {WRITER} LOGIN")
            conn.execute(f"CREATE ROLE {READER} LOGIN")
        old = os.environ.get("PGUSER")
        os.environ["PGUSER"] = self.superuser
        try:
            grant_ledger_role(self.uri(), WRITER)
            grant_ledger_role(self.uri(), READER, read_only=True)
        finally:
            if old is None:
                os.environ.pop("PGUSER", None)
            else:
                os.environ["PGUSER"] = old

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_server() -> tuple[PgServer | None, str]:
    """A started, set-up server, or (None, why not) when none can be started here."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None, "psycopg 3 is not installed (pip install 'raydp-hpo[postgres]')"
    bindir = find_bindir()
    if bindir is None:
        return None, ("no PostgreSQL server binaries (initdb, pg_ctl) found; install Debian's "
                      "postgresql package (make test-postgres does)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None, "running as root and there is no 'postgres' system user to run the server"
    server = PgServer(bindir)
    try:
        server.init()
        server.start()
        server.setup_roles()
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        server.cleanup()
        return None, f"could not start a throw-away PostgreSQL server: {exc} {detail}".strip()
    return server, ""


@contextmanager
def running_server() -> Iterator[PgServer]:
    """A started throw-away server for a test fixture, cleaned up on exit; the test is skipped
    (with :func:`start_server`'s reason) where none can start here."""
    import pytest

    srv, why = start_server()
    if srv is None:
        pytest.skip(why)
    try:
        yield srv
    finally:
        srv.cleanup()
