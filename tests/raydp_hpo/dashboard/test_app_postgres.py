"""``raydp-hpo dashboard`` over a PostgreSQL database (a real throw-away server): every ledger
of the database with its registry binding, read as the read-only role, the figures of
``ledger show``, and an edit made around the append-only triggers shown as failing integrity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Gaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.dashboard.app import build_app
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.pg import register_dataset
from tests.raydp_hpo.ledger.pg_server import READER, WRITER, PgServer

pytestmark = pytest.mark.postgres
BUDGET = PrivacyBudget(6.0, 1e-5)


def _charge(server: PgServer, monkeypatch: pytest.MonkeyPatch, name: str, n: int) -> str:
    monkeypatch.setenv("PGUSER", WRITER)
    uri = server.uri(name)
    with PrivacyLedger(BUDGET, uri) as ledger:
        for i in range(n):
            ledger.charge(f"exp-{name}/trial-{i}", Gaussian(15.0 + i), owner=f"exp-{name}")
    return uri


def test_postgres_ledgers_show_the_figures_of_ledger_show(
        server: PgServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    digits = _charge(server, monkeypatch, "digits", 3)
    _charge(server, monkeypatch, "adult", 1)
    monkeypatch.setenv("PGUSER", server.superuser)
    register_dataset(digits, "digits:sklearn")
    monkeypatch.setenv("PGUSER", READER)  # SELECT only: the dashboard needs no more
    client = TestClient(build_app([server.uri()]))
    data = client.get("/api/ledgers").json()
    assert data["errors"] == []
    rows = {r["ledger"]: r for r in data["ledgers"]}
    assert set(rows) == {server.uri("digits"), server.uri("adult")}
    assert rows[server.uri("digits")]["binding"] == "registry: digits:sklearn"
    assert rows[server.uri("adult")]["binding"] == "no dataset registered"
    for uri, row in rows.items():
        capsys.readouterr()
        assert main(["ledger", "show", "--json", uri]) == EXIT_OK
        show = json.loads(capsys.readouterr().out)
        assert row["storage"] == "postgresql" and row["integrity"]["status"] == "ok"
        assert row["budget"] == show["budget"]
        assert row["spent_epsilon"] == show["spent_epsilon"]
        assert row["remaining_epsilon"] == show["remaining_epsilon"]
        assert row["charges"] == len(show["charges"])
        page = client.get(f"/api/ledgers/{row['id']}").json()
        assert [c["epsilon_after"] for c in page["charge_rows"][::-1]] == [
            c["epsilon_after"] for c in show["charges"]]
        assert client.get(f"/ledgers/{row['id']}").status_code == 200


def test_an_edit_around_the_triggers_fails_integrity(
        server: PgServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import psycopg

    uri = _charge(server, monkeypatch, "edited", 3)
    with psycopg.connect(server.admin_conninfo(), autocommit=True) as conn:
        conn.execute("ALTER TABLE raydp_hpo.charges DISABLE TRIGGER charges_append_only")
        conn.execute("UPDATE raydp_hpo.charges SET record = replace(record::text, "
                     "'\"owner\":\"exp-edited\"', '\"owner\":\"someone\"')::json "
                     "WHERE ledger = 'edited' AND seq = 2")
        conn.execute("ALTER TABLE raydp_hpo.charges ENABLE TRIGGER charges_append_only")
    monkeypatch.setenv("PGUSER", READER)
    capsys.readouterr()
    assert main(["ledger", "verify", uri]) == EXIT_BAD_INPUT
    rows = {r["ledger"]: r for r in
            TestClient(build_app([server.uri()])).get("/api/ledgers").json()["ledgers"]}
    assert rows[uri]["integrity"]["status"] == "CORRUPTED"
    assert "record 2" in rows[uri]["integrity"]["problems"][0]

