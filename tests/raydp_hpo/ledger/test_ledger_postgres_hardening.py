"""PostgreSQL ledgers hardened (issue #41, items 2-5): locations as libpq reads them, tamper
evidence equal to the journal's (a head that only grows, an optional HMAC key), schema
versions and ``ledger init``, and fail-closed deadlines against a frozen server.

The URI checks at the top need no server. Every test that needs one is marked ``postgres``
(``make test-postgres``) and runs against a REAL throw-away server (SIGSTOP, SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerCorruptedError,
    LedgerMismatchError,
    LedgerOutcomeUnknownError,
    LedgerUnavailableError,
    SchemaVersionError,
)
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.pg import FREEZE_BOUND_S, SCHEMA_VERSION, is_postgres_uri, parse_uri

from .pg_server import DB, READER, WRITER, PgServer

SMALL = SubsampledGaussian(4.0, 0.001, 50)
BUDGET = PrivacyBudget(3.0, 1e-5)
SECRET = "s3cret-value-41"
postgres = pytest.mark.postgres


# -- locations: no server needed ----------------------------------------------------------------
@pytest.mark.parametrize("uri", [
    "postgresql+psycopg://db/dp?ledger=x", "postgresql+asyncpg://db/dp?ledger=x",
    "postgress://db/dp?ledger=x", "pg://db/dp?ledger=x", "POSTGRESQL+psycopg2://db/dp?ledger=x",
    "postgresql:db/dp?ledger=x", "file:///srv/x.journal",
])
def test_a_near_miss_scheme_is_an_error_never_a_journal_file(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidParameterError, match="no other scheme is supported"):
        is_postgres_uri(uri)
    with pytest.raises(InvalidParameterError):
        PrivacyLedger(BUDGET, uri)
    with pytest.raises(InvalidParameterError):
        PrivacyLedger.read_only(uri)
    assert list(tmp_path.rglob("*")) == []  # no journal file with a fresh budget appeared


def test_the_supported_schemes_and_plain_paths_are_still_told_apart() -> None:
    assert is_postgres_uri("postgresql://db/dp?ledger=x")
    assert is_postgres_uri("POSTGRES://db/dp?ledger=x")
    assert not is_postgres_uri("/srv/ledgers/census.journal")
    assert not is_postgres_uri("ledgers/pg-census.journal")
    assert not is_postgres_uri(Path("postgresql+psycopg:/x"))  # a Path is a path


@pytest.mark.parametrize("uri", [
    f"postgresql://db/dp?ledger=x&PASSWORD={SECRET}",
    f"postgresql://db/dp?ledger=x&Password={SECRET}",
    f"postgresql://db/dp?ledger=x&sslpassword={SECRET}",
    f"postgresql://db/dp?SSLPASSWORD={SECRET}&ledger=x",
    f"postgresql://u:{SECRET}@db/dp?ledger=x",
    f"postgresql://db/dp?ledger=x&passfile=/home/u/{SECRET}",
])
def test_a_secret_in_any_case_is_refused_without_echoing_it(
    uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidParameterError, match="may not hold a secret") as info:
        parse_uri(uri)
    assert SECRET not in str(info.value)
    assert main(["ledger", "show", uri]) == EXIT_BAD_INPUT
    assert main(["ledger", "verify", uri]) == EXIT_BAD_INPUT
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "secret" in out.err


def test_a_secret_in_an_experiment_file_is_refused_by_dry_run_without_echoing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    example = Path(__file__).resolve().parents[3] / "cluster/examples/mnist1d_small.yaml"
    raw = {**yaml.safe_load(example.read_text()),
           "ledger": {"name": "m", "uri": f"postgresql://db/dp?ledger=m&PASSWORD={SECRET}"}}
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_BAD_INPUT
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "PASSWORD" in out.err


@pytest.mark.parametrize(("query", "name"), [
    ("hostaddr=10.9.9.9", "hostaddr"), ("service=other", "service"),
    ("options=-csearch_path%3Devil", "options"), ("keepalives=0", "keepalives"),
    ("Ledger=y", "Ledger"),
])
def test_a_parameter_outside_the_allow_list_is_refused_by_name(query: str, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"parameter '{name}' is not allowed"):
        parse_uri(f"postgresql://db/dp?ledger=x&{query}")


@pytest.mark.parametrize("uri", [
    "postgresql://h1:5432,h2:5433/dp?ledger=x", "postgresql://h1,h2/dp?ledger=x",
    "postgresql://h1/dp?ledger=x&host=h1,h2", "postgresql://h1/dp?ledger=x&port=5432,5433",
])
def test_a_multi_host_uri_gets_a_clear_refusal(uri: str) -> None:
    with pytest.raises(InvalidParameterError, match="several hosts or ports") as info:
        parse_uri(uri)
    assert "could not be cast" not in str(info.value)


def test_a_parameter_given_twice_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="ledger more than once"):
        parse_uri("postgresql://db/dp?ledger=a&ledger=b")
    with pytest.raises(InvalidParameterError, match="dbname more than once"):
        parse_uri("postgresql://db/dp?ledger=a&dbname=b&dbname=c")


def test_query_parameters_override_the_path_as_libpq_reads_them(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("psycopg")
    monkeypatch.setenv("PGUSER", "alice")
    for var in ("PGHOST", "PGPORT", "PGDATABASE"):
        monkeypatch.delenv(var, raising=False)
    a = parse_uri("postgresql://H:5432/db?ledger=A&dbname=other")
    assert a.database() == ("h", "5432", "other", "alice")
    b = parse_uri("postgresql://h/other?ledger=A")
    assert a.same_database(b)
    c = parse_uri("postgresql://h:5432/db?ledger=A&port=6543")
    assert c.database()[1] == "6543" and not c.same_database(parse_uri("postgresql://h/db?ledger=A"))
    d = parse_uri("postgresql://h/?ledger=A")  # no database: libpq uses the user's name
    assert d.database() == ("h", "5432", "alice", "alice")


# -- a real server ------------------------------------------------------------------------------
@pytest.fixture
def as_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGUSER", WRITER)
    monkeypatch.delenv("RAYDP_HPO_LEDGER_KEY", raising=False)
    monkeypatch.delenv("RAYDP_HPO_LEDGER_KEY_FILE", raising=False)
    monkeypatch.delenv("RAYDP_HPO_REGISTRY", raising=False)


def _admin(server: PgServer, db: str = DB) -> Any:
    import psycopg

    return psycopg.connect(server.admin_conninfo(db), autocommit=True)


def _create_db(server: PgServer, name: str) -> str:
    with _admin(server, "postgres") as conn:
        conn.execute(f"CREATE DATABASE {name}")
        conn.execute(f"GRANT CONNECT ON DATABASE {name} TO {WRITER}, {READER}")
    return server.uri(db=name)


# -- item 2: the registry reads locations as libpq does ---------------------------------------
@postgres
def test_the_registry_sees_through_overriding_query_parameters(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raydp_hpo.ledger.pg import register_dataset
    from raydp_hpo.trainables.data import dataset_fingerprint
    from raydp_hpo.tune.dataset_ledger import check_data_registry

    fp = dataset_fingerprint("mnist1d", size=41, generator_seed=41)
    bound = server.uri("reg-a")
    PrivacyLedger(BUDGET, bound).close()
    register_dataset(bound, fp)
    other_db = _create_db(server, "regother")
    monkeypatch.setenv("RAYDP_HPO_REGISTRY", server.uri())
    lines: list[str] = []
    for elsewhere in (f"{bound}&dbname=regother", f"{bound}&port={server.port + 1}",
                      f"{other_db}?ledger=reg-a"):
        with pytest.raises(LedgerMismatchError, match="already has its budget") as info:
            check_data_registry([fp], elsewhere, lines.append)
        assert "regother" in str(info.value) or str(server.port + 1) in str(info.value)
    check_data_registry([fp], bound, lines.append)  # the bound ledger itself: fine
    # the same database written another way is the same ledger
    same = f"postgresql://127.0.0.1:{server.port}/regother?ledger=reg-a&dbname={DB}"
    check_data_registry([fp], same, lines.append)


@postgres
def test_a_federated_run_on_registered_data_is_refused_before_it_charges(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import yaml

    from raydp_hpo.cli.federated_experiment import parse_federated, run_federated_experiment
    from raydp_hpo.ledger.pg import register_dataset

    uri = server.uri("fed-digits")
    PrivacyLedger(BUDGET, uri).close()
    register_dataset(uri, "digits")
    monkeypatch.setenv("RAYDP_HPO_REGISTRY", server.uri())
    example = Path(__file__).resolve().parents[3] / "cluster/examples/federated_digits.yaml"
    raw = yaml.safe_load(example.read_text())
    raw.update(storage_path=str(tmp_path), ray=False,
               privacy={"clip_norm": 1.0, "noise_multiplier": 5.0,  # within ε=8: it would run
                        "budget": {"epsilon": 8.0, "delta": 1e-5}})
    raw["training"]["rounds"] = 1
    spec = parse_federated(raw)
    with pytest.raises(LedgerMismatchError, match="already has its budget in ledger"):
        run_federated_experiment(spec, out=lambda _: None)
    assert not spec.journal.exists()  # nothing was charged to a client-level journal


# -- item 3: a deleted tail, a recomputed chain ---------------------------------------------------
@postgres
def test_a_deleted_tail_is_named_by_verify_and_refused_on_open_and_by_a_live_ledger(
    server: PgServer, as_writer: None, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = server.uri("tail")
    live = PrivacyLedger(BUDGET, uri)
    with PrivacyLedger(BUDGET, uri) as led:
        for k in range(5):
            led.charge(f"t{k}", SMALL)
        spent = led.spent()
    live.refresh()
    with _admin(server) as conn:  # a superuser deletes the tail with the triggers off
        conn.execute("SET session_replication_role = replica")
        conn.execute("DELETE FROM raydp_hpo.charges WHERE ledger = 'tail' AND seq >= 4")
    capsys.readouterr()
    assert main(["ledger", "verify", uri, "--json"]) == EXIT_BAD_INPUT
    result = json.loads(capsys.readouterr().out)
    assert not result["ok"] and "records 4..5 missing" in result["reason"], result
    with pytest.raises(LedgerCorruptedError, match="records 4..5 missing"):
        PrivacyLedger(BUDGET, uri)
    with pytest.raises(LedgerCorruptedError, match="records 4..5 missing"):
        PrivacyLedger.read_only(uri)
    with pytest.raises(LedgerCorruptedError, match="record 5 is missing"):
        live.try_charge("next", SMALL)  # it saw 5 records, the head says 5: record 5 is gone
    live.close()
    assert spent > 0


@postgres
def test_the_head_only_grows_for_the_ledger_role_and_the_owner(
    server: PgServer, as_writer: None
) -> None:
    import psycopg

    uri = server.uri("head-grows")
    with PrivacyLedger(BUDGET, uri) as led:
        led.charge("a", SMALL)
        led.charge("b", SMALL)
    with psycopg.connect(parse_uri(uri).conninfo, autocommit=True) as conn:
        for sql in ("UPDATE raydp_hpo.heads SET records = 1 WHERE ledger = 'head-grows'",
                    "UPDATE raydp_hpo.heads SET records = 3 WHERE ledger = 'head-grows'",
                    "DELETE FROM raydp_hpo.heads WHERE ledger = 'head-grows'"):
            with pytest.raises(psycopg.Error):
                conn.execute(sql)
    with _admin(server) as conn, pytest.raises(psycopg.Error, match="only grow"):
        conn.execute("UPDATE raydp_hpo.heads SET records = 0 WHERE ledger = 'head-grows'")
    assert main(["ledger", "verify", uri, "--quick"]) == EXIT_OK


def _rewrite_without(server: PgServer, ledger: str, drop_seq: int) -> None:
    """As a superuser without the key: remove record ``drop_seq``, recompute the chain of the
    rest and the head, so the rows verify as a chain (the attack an unkeyed chain misses)."""
    from raydp_hpo.ledger.journal import _v2_line

    with _admin(server) as conn:
        header = conn.execute("SELECT header_chain FROM raydp_hpo.ledgers WHERE name = %s",
                              (ledger,)).fetchone()[0]
        rows = conn.execute("SELECT seq, record::text FROM raydp_hpo.charges WHERE ledger = %s "
                            "ORDER BY seq", (ledger,)).fetchall()
        conn.execute("SET session_replication_role = replica")
        conn.execute("DELETE FROM raydp_hpo.charges WHERE ledger = %s", (ledger,))
        chain, seq = header, 0
        for old_seq, text in rows:
            if old_seq == drop_seq:
                continue
            rec = json.loads(text)
            rec.pop("chain")
            seq += 1
            rec["seq"] = seq
            line, chain = _v2_line(rec, chain)
            conn.execute("INSERT INTO raydp_hpo.charges VALUES (%s, %s, %s::json, %s)",
                         (ledger, seq, line.decode().rstrip("\n"), chain))
        conn.execute("UPDATE raydp_hpo.heads SET records = %s, chain = %s WHERE ledger = %s",
                     (seq, chain, ledger))


@postgres
def test_a_recomputed_chain_is_caught_only_by_whoever_holds_the_key(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "ledger.key"
    key.write_bytes(os.urandom(32).hex().encode())
    monkeypatch.setenv("RAYDP_HPO_LEDGER_KEY_FILE", str(key))
    uri, plain = server.uri("keyed"), server.uri("unkeyed")
    with PrivacyLedger(BUDGET, uri) as led:
        for k in range(4):
            led.charge(f"t{k}", SMALL)
    assert main(["ledger", "verify", uri, "--quick"]) == EXIT_OK
    assert "checked under the ledger key" in capsys.readouterr().out
    monkeypatch.delenv("RAYDP_HPO_LEDGER_KEY_FILE")
    with PrivacyLedger(BUDGET, plain) as led:
        for k in range(4):
            led.charge(f"t{k}", SMALL)
    with pytest.raises(LedgerMismatchError, match="is keyed"):
        PrivacyLedger(BUDGET, uri)  # charging a keyed ledger needs the key
    _rewrite_without(server, "keyed", 2)
    _rewrite_without(server, "unkeyed", 2)
    # without the key a consistent rewrite verifies: that is what the key is for (docs say so)
    assert main(["ledger", "verify", plain, "--quick"]) == EXIT_OK
    assert main(["ledger", "verify", uri, "--quick"]) == EXIT_OK
    assert "NOT checked" in capsys.readouterr().out
    monkeypatch.setenv("RAYDP_HPO_LEDGER_KEY_FILE", str(key))
    assert main(["ledger", "verify", uri, "--quick", "--json"]) == EXIT_BAD_INPUT
    assert "MAC does not match" in json.loads(capsys.readouterr().out)["reason"]
    with pytest.raises(LedgerCorruptedError, match="MAC does not match"):
        PrivacyLedger(BUDGET, uri)
    with pytest.raises(LedgerCorruptedError, match="no MAC"):
        PrivacyLedger.read_only(plain)  # under a key, an unkeyed ledger is not vouched for


# -- item 4: schema versions and ledger init -----------------------------------------------------
@postgres
def test_a_newer_unknown_schema_version_is_refused_naming_both_versions(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = _create_db(server, "newer")
    monkeypatch.setenv("PGUSER", server.superuser)
    assert main(["ledger", "init", uri, "--role", WRITER]) == EXIT_OK
    monkeypatch.setenv("PGUSER", WRITER)
    PrivacyLedger(BUDGET, f"{uri}?ledger=x").close()
    with _admin(server, "newer") as conn:
        conn.execute("INSERT INTO raydp_hpo.schema_version VALUES (99, 'from the future')")
    for attempt in (lambda: PrivacyLedger(BUDGET, f"{uri}?ledger=x"),
                    lambda: PrivacyLedger.read_only(f"{uri}?ledger=x")):
        with pytest.raises(SchemaVersionError, match=f"version 99.*version {SCHEMA_VERSION}"):
            attempt()


@postgres
def test_an_unset_up_database_names_ledger_init_which_sets_it_up(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    uri = _create_db(server, "fresh")
    with pytest.raises(SchemaVersionError, match="raydp-hpo ledger init") as info:
        PrivacyLedger(BUDGET, f"{uri}?ledger=x")
    assert "no raydp-hpo ledger schema" in str(info.value)
    monkeypatch.setenv("PGUSER", server.superuser)
    assert main(["ledger", "init", uri, "--role", WRITER, "--read-only-role", READER]) == EXIT_OK
    assert f"version {SCHEMA_VERSION} (created; was none)" in capsys.readouterr().out
    assert main(["ledger", "init", uri, "--role", WRITER]) == EXIT_OK  # idempotent
    assert "up to date" in capsys.readouterr().out
    monkeypatch.setenv("PGUSER", WRITER)
    with PrivacyLedger(BUDGET, f"{uri}?ledger=x") as led:
        led.charge("a", SMALL)
    monkeypatch.setenv("PGUSER", READER)
    assert len(PrivacyLedger.read_only(f"{uri}?ledger=x").charges()) == 1


@postgres
def test_an_old_layout_without_versions_names_ledger_init(
    server: PgServer, as_writer: None
) -> None:
    uri = _create_db(server, "legacy")
    with _admin(server, "legacy") as conn:  # "relation ledgers already exists"
        conn.execute("CREATE SCHEMA raydp_hpo")
        conn.execute("CREATE TABLE raydp_hpo.ledgers (name text)")
        conn.execute(f"GRANT ALL ON SCHEMA raydp_hpo TO {WRITER}")
        conn.execute(f"GRANT CREATE ON DATABASE legacy TO {WRITER}")
    with pytest.raises(SchemaVersionError, match="raydp-hpo ledger init") as info:
        PrivacyLedger(BUDGET, f"{uri}?ledger=x")
    assert "already exists" in str(info.value)


@postgres
def test_a_version_1_database_is_upgraded_by_ledger_init_with_heads_from_its_rows(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from raydp_hpo.ledger.journal import scan_journal
    from raydp_hpo.ledger.pg import MIGRATIONS

    uri = _create_db(server, "older")
    journal = tmp_path / "old.journal"
    with PrivacyLedger(BUDGET, journal) as led:
        for k in range(3):
            led.charge(f"t{k}", SMALL)
    scan = scan_journal(journal)
    lines = journal.read_bytes().decode().splitlines()
    with _admin(server, "older") as conn:  # the layout version 1 of raydp-hpo made
        conn.execute("CREATE SCHEMA raydp_hpo")
        conn.execute("CREATE TABLE raydp_hpo.schema_version (version int PRIMARY KEY, "
                     "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        conn.execute(MIGRATIONS[0][2])
        conn.execute("INSERT INTO raydp_hpo.schema_version VALUES (1, 'v1')")
        conn.execute("INSERT INTO raydp_hpo.ledgers (name, header, header_chain) "
                     "VALUES ('old', %s::json, %s)", (lines[0], scan.chains[0]))
        for k in range(1, 4):
            conn.execute("INSERT INTO raydp_hpo.charges VALUES ('old', %s, %s::json, %s)",
                         (k, lines[k], scan.chains[k]))
        conn.execute(f"GRANT USAGE ON SCHEMA raydp_hpo TO {WRITER}")
        conn.execute(f"GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA raydp_hpo TO {WRITER}")
    with pytest.raises(SchemaVersionError, match="version 1, older than.*ledger init"):
        PrivacyLedger.open(f"{uri}?ledger=old")
    monkeypatch.setenv("PGUSER", server.superuser)
    assert main(["ledger", "init", uri]) == EXIT_OK  # the v1 grants carry over to heads
    monkeypatch.setenv("PGUSER", WRITER)
    with PrivacyLedger.open(f"{uri}?ledger=old") as led:
        assert len(led.charges()) == 3
        led.charge("t3", SMALL)
    assert main(["ledger", "verify", f"{uri}?ledger=old", "--quick"]) == EXIT_OK


# -- item 5: a frozen server ------------------------------------------------------------------------
def _server_pids(server: PgServer) -> list[int]:
    """The postmaster and every process it started (its backends)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                pids.append(int(entry.name))
    return pids


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


#: A freeze lasts at most this long (a code without deadlines blocks until then, then admits)
FREEZE_S = FREEZE_BOUND_S + 15


def _freeze(server: PgServer) -> list[int]:
    """SIGSTOP the postmaster and its backends; they are thawed after :data:`FREEZE_S`."""
    pids = _server_pids(server)
    _signal_all(pids, signal.SIGSTOP)
    timer = threading.Timer(FREEZE_S, _signal_all, (pids, signal.SIGCONT))
    timer.daemon = True
    timer.start()
    _THAW_TIMERS.append(timer)
    return pids


_THAW_TIMERS: list[threading.Timer] = []  # cancelled after each test: a late one would thaw
# the server in the middle of the next test's freeze


class _FreezeBefore:
    """A connection proxy that freezes the whole server (SIGSTOP of the postmaster and its
    backends) just before sending the first statement that starts with ``prefix``."""

    def __init__(self, conn: Any, server: PgServer, prefix: str) -> None:
        self._conn, self._server, self._prefix = conn, server, prefix
        self.frozen: list[int] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        if not self.frozen and str(query).lstrip().upper().startswith(self._prefix):
            self.frozen = _freeze(self._server)
        return self._conn.execute(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.fixture
def thaw(server: PgServer) -> Iterator[list[int]]:
    frozen: list[int] = []
    yield frozen
    _signal_all(_server_pids(server) + frozen, signal.SIGCONT)
    while _THAW_TIMERS:
        _THAW_TIMERS.pop().cancel()


@postgres
@pytest.mark.parametrize("where", ["BEGIN", "INSERT"])
def test_a_frozen_server_refuses_a_charge_on_an_open_connection_within_the_bound(
    server: PgServer, as_writer: None, thaw: list[int], where: str
) -> None:
    uri = server.uri(f"frozen-{where.lower()}")
    with PrivacyLedger(BUDGET, uri) as led:
        assert led.try_charge("before", SMALL).admitted  # the connection is open and used
        journal: Any = led._journal
        proxy = _FreezeBefore(journal._conn, server, where)
        journal._conn = proxy
        start = time.monotonic()
        with pytest.raises(LedgerUnavailableError, match=f"no answer within {FREEZE_BOUND_S:g} s"
                           ) as info:
            led.try_charge("during", SMALL)
        waited = time.monotonic() - start
        print(f"frozen before {where}: refused after {waited:.2f} s")
        assert not isinstance(info.value, LedgerOutcomeUnknownError)
        assert "refused" in str(info.value)
        assert proxy.frozen, "the server was frozen"
        assert FREEZE_BOUND_S - 0.5 <= waited <= FREEZE_BOUND_S + 3, waited
        thaw.extend(proxy.frozen)
        _signal_all(proxy.frozen, signal.SIGCONT)
        time.sleep(1.0)  # the backend sees its socket closed and rolls back
        assert led.try_charge("after", SMALL).admitted  # reconnects
    stored = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
    assert stored == ["before", "after"]  # the refused charge never landed, even after a thaw


@postgres
def test_a_commit_that_goes_unanswered_is_reported_unknown_not_refused(
    server: PgServer, as_writer: None, thaw: list[int]
) -> None:
    uri = server.uri("frozen-commit")
    with PrivacyLedger(BUDGET, uri) as led:
        assert led.try_charge("before", SMALL).admitted
        journal: Any = led._journal
        proxy = _FreezeBefore(journal._conn, server, "COMMIT")
        journal._conn = proxy
        start = time.monotonic()
        with pytest.raises(LedgerOutcomeUnknownError, match="MAY be stored"):
            led.try_charge("during", SMALL)
        assert time.monotonic() - start <= FREEZE_BOUND_S + 3
        thaw.extend(proxy.frozen)
        _signal_all(proxy.frozen, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while True:  # the frozen backend reads the COMMIT that was already in its socket
            stored = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
            if "during" in stored or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        again = led.try_charge("during", SMALL)  # asking again learns the outcome
        assert again.admitted and again.replayed == ("during" in stored)
        assert led.spent() == PrivacyLedger.read_only(uri).spent()
    stored = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
    assert stored.count("during") == 1 and stored[0] == "before"


@postgres
def test_a_frozen_server_refuses_a_new_ledger_within_the_connect_timeout(
    server: PgServer, as_writer: None, thaw: list[int]
) -> None:
    from raydp_hpo.ledger.pg import CONNECT_TIMEOUT_S

    thaw.extend(_freeze(server))
    start = time.monotonic()
    with pytest.raises(LedgerUnavailableError, match="no local fallback"):
        PrivacyLedger(BUDGET, server.uri("frozen-new"))
    assert time.monotonic() - start <= CONNECT_TIMEOUT_S + 3


# -- SIGKILL of the server under concurrent chargers ------------------------------------------------
_CHARGER = r"""
import json, sys, time
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.errors import LedgerOutcomeUnknownError, LedgerUnavailableError
from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
uri, who, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = {"acked": [], "refused": [], "unknown": [], "over_budget": []}
led = PrivacyLedger(PrivacyBudget(50.0, 1e-5), uri, curve_check=CurveCheck.ON_DEMAND)
end, k = time.monotonic() + seconds, 0
while time.monotonic() < end:
    cid = f"{who}-{k}"
    k += 1
    try:
        d = led.try_charge(cid, SubsampledGaussian(4.0, 0.001, 50))
        out["acked" if d.admitted else "over_budget"].append(cid)
    except LedgerOutcomeUnknownError:
        out["unknown"].append(cid)
    except LedgerUnavailableError:
        out["refused"].append(cid)
        time.sleep(0.05)
led.close()
print(json.dumps(out))
"""


@postgres
def test_sigkill_of_the_server_under_four_chargers_loses_nothing_and_admits_nothing_refused(
    server: PgServer, as_writer: None
) -> None:
    import subprocess
    import sys

    uri = server.uri("sigkill")
    PrivacyLedger(PrivacyBudget(50.0, 1e-5), uri).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _CHARGER, uri, f"p{i}", "30"],
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(4)]
    deadline = time.monotonic() + 60
    while len({c.charge_id.split("-")[0] for c in PrivacyLedger.read_only(uri).charges()}) < 4:
        assert time.monotonic() < deadline, "the four chargers did not start"
        time.sleep(0.2)
    time.sleep(0.5)  # all four are admitting
    pids = _server_pids(server)
    _signal_all(pids[:1], signal.SIGSTOP)  # the postmaster forks no backend from now on
    pids = _server_pids(server)
    _signal_all(pids, signal.SIGKILL)  # postmaster and every backend at once
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)
    try:
        server.start()  # crash recovery
    except Exception:
        print((server.root / "log").read_text()[-3000:])
        raise
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results.append(json.loads(out))
    stored = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
    acked = {c for r in results for c in r["acked"]}
    refused = {c for r in results for c in r["refused"]}
    unknown = {c for r in results for c in r["unknown"]}
    print(f"SIGKILL under 4 chargers: {len(acked)} acknowledged, {len(stored)} stored, "
          f"{len(refused)} refused, {len(unknown)} unknown "
          f"({len(unknown & set(stored))} of them stored)")
    assert len(stored) == len(set(stored))  # nothing doubled
    assert acked <= set(stored)  # nothing acknowledged was lost
    assert not refused & set(stored)  # nothing told "refused" was admitted
    assert set(stored) <= acked | unknown  # every stored charge was acked or said unknown
    assert refused, "the chargers saw the outage"
    assert any(c.split("-")[1] != "0" for c in acked), "they charged after the restart"
    assert main(["ledger", "verify", uri, "--quick"]) == EXIT_OK
