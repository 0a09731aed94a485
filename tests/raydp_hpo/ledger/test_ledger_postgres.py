"""The privacy ledger on PostgreSQL (issue #32), against a REAL throw-away server.

Every test that needs the server is marked ``postgres`` (``make test-postgres``; excluded from
``make test``) and skips, naming the reason, when no server can be started here. The URI
checks at the top need no server and run everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerCorruptedError,
    LedgerMismatchError,
    LedgerUnavailableError,
    RayDPHPOError,
)
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.pg import is_postgres_uri, migrate_journal, parse_uri

from .pg_server import READER, WRITER, PgServer

TRIAL = SubsampledGaussian(1.0, 0.01, 500)
SMALL = SubsampledGaussian(4.0, 0.001, 50)  # many fit in BUDGET
BUDGET = PrivacyBudget(3.0, 1e-5)


# -- no server needed ---------------------------------------------------------------------------
def test_a_uri_names_a_postgres_ledger_and_a_path_does_not() -> None:
    assert is_postgres_uri("postgresql://db.example:5432/dp?ledger=census-2024")
    assert is_postgres_uri("postgres://db/dp?ledger=x")
    assert not is_postgres_uri("/srv/ledgers/census.journal")
    assert not is_postgres_uri(Path("postgresql:/x"))
    loc = parse_uri("postgresql://db:5433/dp?ledger=census-2024&sslmode=require")
    assert loc.ledger == "census-2024"
    assert loc.conninfo == "postgresql://db:5433/dp?sslmode=require"


@pytest.mark.parametrize("uri", [
    "postgresql://alice:s3cret@db/dp?ledger=x",
    "postgresql://db/dp?ledger=x&password=s3cret",
])
def test_a_uri_with_a_password_is_refused_without_echoing_it(uri: str) -> None:
    with pytest.raises(InvalidParameterError, match="PGPASSWORD") as info:
        parse_uri(uri)
    assert "s3cret" not in str(info.value)
    with pytest.raises(InvalidParameterError):
        PrivacyLedger(BUDGET, uri)


def test_a_uri_must_name_one_ledger() -> None:
    with pytest.raises(InvalidParameterError, match=r"\?ledger=NAME"):
        parse_uri("postgresql://db/dp")


def test_an_unreachable_server_refuses_the_ledger_with_no_local_fallback(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    port = _closed_port()  # nothing listens there
    with pytest.raises(LedgerUnavailableError, match="no local fallback"):
        PrivacyLedger(BUDGET, f"postgresql://127.0.0.1:{port}/dp?ledger=x")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


EXAMPLE = Path(__file__).resolve().parents[3] / "cluster/examples/mnist1d_small.yaml"


def _experiment(ledger: dict[str, str]):  # type: ignore[no-untyped-def]
    import yaml

    from raydp_hpo.cli.experiment import parse_experiment

    return parse_experiment({**yaml.safe_load(EXAMPLE.read_text()), "ledger": ledger})


def test_an_experiment_file_names_a_postgres_ledger_by_uri() -> None:
    uri = "postgresql://db:5432/dp?ledger=mnist1d"
    assert _experiment({"name": "mnist1d", "uri": uri}).ledger_journal() == uri
    assert _experiment({"name": "mnist1d", "journal": uri}).ledger_journal() == uri
    assert isinstance(_experiment({"name": "m", "journal": "/srv/m.journal"}).ledger_journal(),
                      Path)


@pytest.mark.parametrize(("ledger", "match"), [
    ({"name": "m", "uri": "postgresql://u:s3cret@db/dp?ledger=m"}, "ledger.uri: a ledger URI"),
    ({"name": "m", "journal": "postgresql://u:s3cret@db/dp?ledger=m"}, "ledger.journal: a ledger"),
    ({"name": "m", "uri": "/srv/m.journal"}, "not a PostgreSQL ledger URI"),
    ({"name": "m", "uri": "postgresql://db/dp?ledger=m", "journal": "/srv/m.journal"}, "not both"),
])
def test_a_bad_ledger_uri_in_an_experiment_file_is_refused(ledger: dict[str, str],
                                                            match: str) -> None:
    from raydp_hpo.errors import ConfigError

    with pytest.raises(ConfigError, match=match) as info:
        _experiment(ledger)
    assert "s3cret" not in str(info.value)


# -- a real server ------------------------------------------------------------------------------
@pytest.fixture
def as_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connect as the least-privilege ledger role (libpq reads PGUSER, as in production)."""
    monkeypatch.setenv("PGUSER", WRITER)


def _admin(server: PgServer):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(server.admin_conninfo(), autocommit=True)


pytestmark_pg = pytest.mark.postgres  # make test-postgres


@pytestmark_pg
def test_admission_and_refusal_are_those_of_the_file_journal(
    server: PgServer, as_writer: None, tmp_path: Path
) -> None:
    uri = server.uri("same-as-file")
    with PrivacyLedger(BUDGET, uri) as pg, PrivacyLedger(BUDGET, tmp_path / "j") as file:
        for k in range(12):
            a, b = pg.try_charge(f"t{k}", TRIAL), file.try_charge(f"t{k}", TRIAL)
            assert (a.admitted, a.epsilon_after, a.spent_epsilon) == (
                b.admitted, b.epsilon_after, b.spent_epsilon)
        assert not pg.try_charge("late", TRIAL).admitted
        assert pg.try_charge("t0", TRIAL).replayed
        assert pg.location == uri and pg.journal_path is None
    # the stored records are journal lines: same keys and chain rule; a reader replays them
    again = PrivacyLedger.read_only(uri)
    assert [c.charge_id for c in again.charges()] == [c.charge_id for c in file.charges()]
    assert again.spent() == file.spent()
    with pytest.raises(LedgerMismatchError):
        PrivacyLedger(PrivacyBudget(5.0, 1e-5), uri)


@pytestmark_pg
def test_two_ledgers_on_one_uri_see_each_others_charges(server: PgServer, as_writer: None) -> None:
    uri = server.uri("shared")
    with PrivacyLedger(BUDGET, uri) as a, PrivacyLedger(BUDGET, uri) as b:
        assert a.try_charge("x", TRIAL).admitted
        replay = b.try_charge("x", TRIAL)  # b catches up inside its admission transaction
        assert replay.admitted and replay.replayed
        admitted = [led.try_charge(f"{name}{k}", TRIAL).admitted for k in range(10)
                    for name, led in (("a", a), ("b", b))]
        b.refresh()
        a.refresh()
        assert len(a.charges()) == len(b.charges()) == 1 + sum(admitted)
        assert a.spent() == b.spent() <= BUDGET.epsilon


_RACER = r"""
import json, os, sys
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
uri, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
budget = PrivacyBudget(float(sys.argv[4]), 1e-5)
mech = SubsampledGaussian(2.0, 0.01, 1)
acked = []
with PrivacyLedger(budget, uri, curve_check=CurveCheck.ON_DEMAND) as led:
    for k in range(n):
        if led.try_charge(f"{who}-{k}", mech).admitted:
            acked.append(f"{who}-{k}")
print(json.dumps(acked))
"""


@pytestmark_pg
def test_racing_processes_never_admit_beyond_the_budget(server: PgServer, as_writer: None) -> None:
    # the scale: RAYDP_PG_RACE=8,1250 (10,000 charges, 8 processes)
    procs, per_proc = (int(x) for x in os.environ.get("RAYDP_PG_RACE", "4,500").split(","))
    eps = 1.0 if procs * per_proc <= 2000 else 2.5  # ~8,440 fit in ε=2.5
    mech = SubsampledGaussian(2.0, 0.01, 1)  # ~1,480 fit in ε=1: the budget runs out mid-race
    # the sequential replay: how many of these charges a single ledger admits, in any order
    sequential = PrivacyLedger(PrivacyBudget(eps, 1e-5))
    expected = 0
    while sequential.try_charge(f"s{expected}", mech).admitted:
        expected += 1
    assert 0 < expected < procs * per_proc, "the budget must run out during the race"
    uri = server.uri("race")
    PrivacyLedger(PrivacyBudget(eps, 1e-5), uri).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    running = [subprocess.Popen([sys.executable, "-c", _RACER, uri, f"p{i}", str(per_proc),
                                 str(eps)], stdout=subprocess.PIPE, text=True, env=env)
               for i in range(procs)]
    acked: list[str] = []
    for p in running:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0
        acked += json.loads(out)
    stored = PrivacyLedger.read_only(uri)
    ids = [c.charge_id for c in stored.charges()]
    assert len(acked) == expected and sorted(ids) == sorted(acked)  # 0 beyond, 0 lost
    assert stored.spent() <= eps
    assert all(c.epsilon_after <= eps for c in stored.charges())
    assert len({i.split("-")[0] for i in ids}) > 1, "the processes really raced"


@pytestmark_pg
def test_server_killed_mid_admission_loses_and_doubles_nothing(
    server: PgServer, as_writer: None
) -> None:
    uri = server.uri("killed")
    mech = SubsampledGaussian(4.0, 0.001, 50)
    budget = PrivacyBudget(50.0, 1e-5)
    acked: list[str] = []
    refused_while_down: list[str] = []
    with PrivacyLedger(budget, uri) as led:
        for round_ in range(int(os.environ.get("RAYDP_PG_KILLS", "3"))):  # issue: 20
            stop = threading.Event()

            def charge_loop(r: int = round_, stop: threading.Event = stop) -> None:
                k = 0
                while not stop.is_set():
                    try:
                        if led.try_charge(f"r{r}-{k}", mech).admitted:
                            acked.append(f"r{r}-{k}")
                    except LedgerUnavailableError:
                        pass
                    k += 1

            worker = threading.Thread(target=charge_loop)
            worker.start()
            deadline = time.monotonic() + 60
            while not any(a.startswith(f"r{round_}-") for a in acked):
                assert time.monotonic() < deadline, "no charge admitted after the restart"
                time.sleep(0.001)
            server.stop("immediate")  # while the loop is admitting
            stop.set()
            worker.join()
            with pytest.raises(LedgerUnavailableError, match="refused"):
                led.try_charge(f"down-{round_}", mech)
            refused_while_down.append(f"down-{round_}")
            server.start()
        assert led.try_charge("after", mech).admitted
        acked.append("after")
    stored = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
    assert len(stored) == len(set(stored))  # nothing doubled (a replay also refuses repeats)
    assert set(acked) <= set(stored)  # nothing acknowledged was lost
    assert not set(refused_while_down) & set(stored)


@pytestmark_pg
def test_the_ledger_role_cannot_update_or_delete_and_the_reader_cannot_insert(
    server: PgServer, as_writer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    uri = server.uri("append-only")
    with PrivacyLedger(BUDGET, uri) as led:
        led.charge("a", TRIAL)
    conninfo = parse_uri(uri).conninfo
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for sql in ("UPDATE raydp_hpo.charges SET record = record WHERE ledger = 'append-only'",
                    "DELETE FROM raydp_hpo.charges WHERE ledger = 'append-only'",
                    "TRUNCATE raydp_hpo.charges"):
            with pytest.raises(psycopg.Error):
                conn.execute(sql)
    # even the owner's UPDATE/DELETE hit the trigger
    with _admin(server) as conn, pytest.raises(psycopg.Error, match="append-only"):
        conn.execute("DELETE FROM raydp_hpo.charges WHERE ledger = 'append-only'")
    monkeypatch.setenv("PGUSER", READER)
    assert len(PrivacyLedger.read_only(uri).charges()) == 1  # readers need only SELECT
    with psycopg.connect(conninfo, autocommit=True) as conn, pytest.raises(psycopg.Error):
        conn.execute("INSERT INTO raydp_hpo.charges VALUES ('append-only', 9, '{}', 'x')")


@pytestmark_pg
def test_a_superuser_edit_is_named_by_verify_and_refused_by_the_ledger(
    server: PgServer, as_writer: None, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = server.uri("tampered")
    live = PrivacyLedger(BUDGET, uri)
    with PrivacyLedger(BUDGET, uri) as led:
        for k in range(4):
            led.charge(f"t{k}", SMALL)
    assert main(["ledger", "verify", uri]) == EXIT_OK
    with _admin(server) as conn:  # around the trigger, as a superuser can
        conn.execute("ALTER TABLE raydp_hpo.charges DISABLE TRIGGER charges_append_only")
        conn.execute("UPDATE raydp_hpo.charges SET record = replace(record::text, "
                     "'\"owner\":\"\"', '\"owner\":\"x\"')::json "
                     "WHERE ledger = 'tampered' AND seq = 3")
        conn.execute("ALTER TABLE raydp_hpo.charges ENABLE TRIGGER charges_append_only")
    capsys.readouterr()
    assert main(["ledger", "verify", uri]) == EXIT_BAD_INPUT
    out = capsys.readouterr().out
    assert "CORRUPTED" in out and "record 3" in out and "chain hash mismatch" in out
    with pytest.raises(LedgerCorruptedError, match="record 3"):
        live.try_charge("next", SMALL)  # catching up: the chain breaks at the edited record
    live.close()
    with pytest.raises(LedgerCorruptedError):
        PrivacyLedger(BUDGET, uri)


@pytestmark_pg
def test_a_deleted_record_is_named_by_verify(server: PgServer, as_writer: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    uri = server.uri("deleted")
    with PrivacyLedger(BUDGET, uri) as led:
        for k in range(3):
            led.charge(f"t{k}", SMALL)
    with _admin(server) as conn:
        conn.execute("SET session_replication_role = replica")  # triggers off, as a superuser
        conn.execute("DELETE FROM raydp_hpo.charges WHERE ledger = 'deleted' AND seq = 2")
    assert main(["ledger", "verify", uri, "--json"]) == EXIT_BAD_INPUT
    result = json.loads(capsys.readouterr().out)
    assert not result["ok"] and "record 2" in result["reason"]


@pytestmark_pg
def test_migrate_moves_a_journal_with_its_chain_and_refuses_twice(
    server: PgServer, as_writer: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "census.journal"
    with PrivacyLedger(BUDGET, journal) as led:
        for k in range(5):
            led.charge(f"t{k}", SMALL)
        before = led.spent()
    raw = journal.read_bytes()
    uri = server.uri("census")
    assert main(["ledger", "migrate", str(journal), uri]) == EXIT_OK
    capsys.readouterr()
    assert main(["ledger", "migrate", str(journal), server.uri("census-again")]) == EXIT_BAD_INPUT
    assert "migrated before" in capsys.readouterr().err
    assert main(["ledger", "migrate", str(journal), uri]) == EXIT_BAD_INPUT
    assert "already exist" in capsys.readouterr().err
    with pytest.raises(RayDPHPOError, match="migrated before"):
        migrate_journal(journal, server.uri("census-again"))
    assert journal.read_bytes() == raw  # the file is left as it was
    with PrivacyLedger.open(uri) as moved:  # the same budget, and it keeps charging
        assert moved.spent() == before and len(moved.charges()) == 5
        moved.charge("t5", SMALL)
    assert main(["ledger", "verify", uri]) == EXIT_OK
    capsys.readouterr()
    assert main(["ledger", "list", server.uri()]) == EXIT_OK
    assert "census" in capsys.readouterr().out
    assert main(["ledger", "show", uri]) == EXIT_OK


@pytestmark_pg
def test_the_migrated_rows_are_the_journal_lines_byte_for_byte(
    server: PgServer, as_writer: None, tmp_path: Path
) -> None:
    import psycopg

    journal = tmp_path / "bytes.journal"
    with PrivacyLedger(BUDGET, journal) as led:
        led.charge("a", TRIAL)
        led.charge("b", TRIAL)
    uri = server.uri("bytes")
    main(["ledger", "migrate", str(journal), uri])
    with psycopg.connect(parse_uri(uri).conninfo) as conn:
        header = conn.execute("SELECT header::text FROM raydp_hpo.ledgers WHERE name='bytes'"
                              ).fetchone()[0]
        rows = [r[0] for r in conn.execute(
            "SELECT record::text FROM raydp_hpo.charges WHERE ledger='bytes' ORDER BY seq")]
    assert "\n".join([header, *rows]).encode() + b"\n" == journal.read_bytes()


@pytestmark_pg
def test_a_dataset_has_one_ledger_unless_an_admin_records_a_second(
    server: PgServer, as_writer: None
) -> None:
    import psycopg

    from raydp_hpo.ledger.pg import ledger_for_dataset, register_dataset
    from raydp_hpo.trainables.data import dataset_fingerprint

    fp = dataset_fingerprint("digits")
    first, second = server.uri("digits-a"), server.uri("digits-b")
    PrivacyLedger(BUDGET, first).close()
    PrivacyLedger(BUDGET, second).close()
    assert register_dataset(first, fp) == "digits-a"
    assert register_dataset(first, fp) == "digits-a"  # idempotent
    with pytest.raises(LedgerMismatchError, match="admin_reason"):
        register_dataset(second, fp)
    assert ledger_for_dataset(server.uri(), fp) == ["digits-a"]
    register_dataset(second, fp, admin_reason="new data release 2025, approved by DPO")
    assert ledger_for_dataset(server.uri(), fp) == ["digits-a", "digits-b"]
    with psycopg.connect(parse_uri(first).conninfo) as conn:
        row = conn.execute("SELECT registered_by, admin_reason FROM raydp_hpo.datasets "
                           "WHERE ledger = 'digits-b'").fetchone()
    assert row == (WRITER, "new data release 2025, approved by DPO")


@pytestmark_pg
def test_the_schema_is_versioned_and_applied_once(server: PgServer) -> None:
    from raydp_hpo.ledger.pg import MIGRATIONS, ensure_schema, schema_version

    with _admin(server) as conn:
        assert schema_version(conn) == MIGRATIONS[-1][0]
        assert ensure_schema(conn) == MIGRATIONS[-1][0]  # nothing left to apply
        rows = conn.execute("SELECT version FROM raydp_hpo.schema_version").fetchall()
    assert [r[0] for r in rows] == [m[0] for m in MIGRATIONS]


@pytestmark_pg
@pytest.mark.ray
def test_a_ledger_actor_and_a_local_ledger_share_one_postgres_budget(
    ray_session: None, server: PgServer, as_writer: None
) -> None:
    from raydp_hpo.ledger.actor import get_ledger

    # the user may be named in the URI (a password may not); the actor's process reads it there
    uri = server.uri("actor").replace("127.0.0.1", f"{WRITER}@127.0.0.1", 1)
    budget, mech = PrivacyBudget(1.0, 1e-5), SubsampledGaussian(2.0, 0.01, 20)  # ~73 fit
    handle = get_ledger("pg-actor", budget, uri, namespace="tests-pg")
    try:
        assert handle.settings()["journal"] == uri
        with PrivacyLedger(budget, uri) as local:
            decisions = [(handle.try_charge(f"a{k}", mech).admitted,
                          local.try_charge(f"l{k}", mech).admitted) for k in range(200)]
            # spent() answers from what a ledger saw at its last admission (or refresh())
            assert handle.spent() <= local.spent() <= budget.epsilon
    finally:
        handle.kill()
    admitted = sum(a + b for a, b in decisions)
    stored = PrivacyLedger.read_only(server.uri("actor")).charges()
    assert 0 < admitted == len(stored) < 400  # the budget ran out, and nothing went past it


@pytestmark_pg
def test_a_resume_checks_the_postgres_ledger_for_earlier_charges(
    server: PgServer, as_writer: None
) -> None:
    from raydp_hpo.tune.tuner import require_earlier_charges

    uri = server.uri("resume")
    with PrivacyLedger(BUDGET, uri) as led:
        led.charge("exp1/plan", SMALL)
    require_earlier_charges(uri, "exp1")  # its charges are there: the resume may go on
    with pytest.raises(LedgerMismatchError, match="holds no charge of this run"):
        require_earlier_charges(uri, "exp2")


@pytestmark_pg
def test_a_run_on_registered_data_cannot_start_a_fresh_postgres_budget(
    server: PgServer, as_writer: None
) -> None:
    from raydp_hpo.cli.experiment import bind_data_to_postgres_ledger

    first = _experiment({"name": "m1", "uri": server.uri("mnist1d-one")})
    other = _experiment({"name": "m2", "uri": server.uri("mnist1d-two")})
    lines: list[str] = []
    bind_data_to_postgres_ledger(first, BUDGET, lines.append)
    bind_data_to_postgres_ledger(first, BUDGET, lines.append)  # the same ledger again: fine
    assert "bound to ledger" in lines[0]
    with pytest.raises(LedgerMismatchError, match="already has its budget in ledger"):
        bind_data_to_postgres_ledger(other, BUDGET, lines.append)
    assert PrivacyLedger.read_only(server.uri("mnist1d-two")).charges() == ()  # nothing charged


@pytestmark_pg
def test_a_fixed_plan_pld_ledger_shared_by_two_writers_spends_as_one(
    server: PgServer, as_writer: None
) -> None:
    from raydp_hpo.accounting.accountant_kind import Accountant
    from raydp_hpo.ledger.filter import Adaptivity

    kw = {"adaptivity": Adaptivity.FIXED_PLAN, "accountant": Accountant.PLD}
    uri = server.uri("pld-shared")
    alone = PrivacyLedger(BUDGET, **kw)  # type: ignore[arg-type]
    with PrivacyLedger(BUDGET, uri, **kw) as a, PrivacyLedger(BUDGET, uri, **kw) as b:  # type: ignore[arg-type]
        for k in range(6):
            for name, led in (("a", a), ("b", b)):
                got = led.try_charge(f"{name}{k}", SMALL)
                want = alone.try_charge(f"{name}{k}", SMALL)
                assert got.admitted == want.admitted
                assert got.epsilon_after == pytest.approx(want.epsilon_after, rel=1e-9)


@pytestmark_pg
@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.slow  # ~35 s: two Ray clusters start
def test_two_ray_clusters_and_processes_race_on_one_ledger_and_admit_the_sequential_count(
    server: PgServer, as_writer: None
) -> None:
    # two drivers, each starting its own local Ray cluster (own head, own temp dir) running
    # racing tasks, and plain processes, all charging one ledger at once. The scale
    # (>= 10,000 charges, 2 clusters, 8 processes) is benchmarks/ledger_postgres.py --race.
    from .postgres_race import run_race

    result = run_race(server.uri("race-clusters"), eps=0.5, processes=2, clusters=2, workers=1,
                      per_racer=150)
    assert result.problems() == []
    assert 0 < result.sequential < result.charges, "the budget must run out during the race"
    assert len(result.clusters) == 2, "two distinct Ray clusters (GCS addresses) raced"
    assert set(result.by_source) == {"c0", "c1", "processes"}, result.by_source
    assert result.switches > 2, "the racers' charges interleave"


def test_the_cluster_postgres_example_names_its_ledger_by_uri_without_credentials() -> None:
    from raydp_hpo.cli.experiment import load_experiment

    path = EXAMPLE.parent / "mnist1d_postgres.yaml"
    spec = load_experiment(path)
    uri = spec.ledger_journal()
    assert isinstance(uri, str) and is_postgres_uri(uri)
    assert parse_uri(uri).ledger == spec.ledger_name == "mnist1d-2000"
