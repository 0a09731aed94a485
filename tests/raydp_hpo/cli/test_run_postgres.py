"""``raydp-hpo run`` end to end on a PostgreSQL ledger (issue #32), against a REAL throw-away
server: an experiment file names the ledger by URI (no credentials in it); the password
reaches libpq only through ``PGPASSWORD`` (the server demands it: scram-sha-256 for that
role); the charges land in PostgreSQL (``ledger show`` / ``verify`` on the URI); nothing the
run writes holds the password; and a second run on the same data that names another ledger
is refused before anything is charged (the registry binds the data to its first ledger)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.ledger.pg import grant_ledger_role, ledger_for_dataset
from tests.raydp_hpo.ledger.pg_server import PgServer, running_server

pytestmark = [pytest.mark.postgres, pytest.mark.ray, pytest.mark.slow]  # two small runs

ROOT = Path(__file__).resolve().parents[3]
ROLE = "ledger_pw"
PASSWORD = f"pw-{uuid.uuid4().hex}"  # a value no file of the run may contain


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server on which the ledger role must give a password (scram-sha-256), so a run that
    gets in got the password from the environment."""
    import psycopg

    with running_server() as srv:
        with psycopg.connect(srv.admin_conninfo(), autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        old = os.environ.get("PGUSER")
        os.environ["PGUSER"] = srv.superuser
        try:
            grant_ledger_role(srv.uri(), ROLE)
        finally:
            os.environ.pop("PGUSER") if old is None else os.environ.__setitem__("PGUSER", old)
        hba = srv.data / "pg_hba.conf"
        hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        srv._run("pg_ctl", "-D", str(srv.data), "-w", "reload")
        yield srv


def _experiment(tmp_path: Path, name: str, uri: str) -> Path:
    # the cluster example for PostgreSQL ledgers, pointed at the throw-away server
    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_postgres.yaml").read_text())
    raw.update(experiment=name, storage_path=str(tmp_path / "store"))
    raw["data"]["size"] = 1000
    raw["ledger"].update(name=f"{name}-ledger", uri=uri)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert PASSWORD not in path.read_text()
    return path


def _run(path: Path, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    temp = Path(os.path.join("/tmp", f"rdpg{uuid.uuid4().hex[:6]}"))
    return subprocess.run(
        [sys.executable, "-m", "raydp_hpo.cli.main", "run", str(path), "--num-cpus", "2",
         "--ray-temp-dir", str(temp), "--progress-interval", "5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_run_charges_a_postgres_ledger_without_credentials_and_keeps_one_budget(
    server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    uri = server.uri("mnist1d-org")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "PGUSER": ROLE, "RAY_AUTH_MODE": "disabled"}
    env.pop("PGPASSWORD", None)
    env.pop("RAY_ADDRESS", None)
    first = _experiment(tmp_path, "pg-first", uri)
    # without the password the server refuses the role, and so does the run: nothing ran
    denied = _run(first, tmp_path, env)
    assert denied.returncode != EXIT_OK
    assert "refused" in denied.stdout + denied.stderr or "password" in denied.stderr
    assert not (tmp_path / "store" / "pg-first" / "tune").exists()

    env["PGPASSWORD"] = PASSWORD
    done = _run(first, tmp_path, env)
    assert done.returncode == EXIT_OK, done.stdout[-4000:] + done.stderr[-4000:]
    assert PASSWORD not in done.stdout + done.stderr
    run_dir = tmp_path / "store" / "pg-first"
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["ledger_journal"] == uri
    # no file of the run (run.json, certificate, release, Tune's files) holds the password
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert leaked == []

    # the charges are in PostgreSQL: read back through libpq with the same environment
    monkeypatch.setenv("PGUSER", ROLE)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    ledger = PrivacyLedger.read_only(uri)
    stored = ledger.charges()
    # one point, under this run's fresh run id (issue #41): <experiment>@<run id>/point
    assert [re.sub(r"@[0-9a-f]{16}/", "/", c.charge_id) for c in stored] == ["pg-first/point"]
    # issue #38: a PostgreSQL ledger named in the file composes whole experiments, so it
    # records what the experiment certifies (the union-bound RDP filter recorded ~1.6× a
    # plan's PLD figure before); the refusal-free run spent its certificate's ε
    assert ledger.adaptivity is Adaptivity.EXPERIMENTS
    certified = json.loads((run_dir / "public" / "certificate.json").read_text())[
        "epsilon"]["certified"]
    assert 0.98 * ledger.spent() <= certified <= ledger.spent() * (1 + 1e-6)
    capsys.readouterr()
    assert main(["ledger", "verify", uri]) == EXIT_OK
    assert main(["ledger", "show", uri]) == EXIT_OK
    assert re.search(r"pg-first@[0-9a-f]{16}/point", capsys.readouterr().out)
    fingerprint = "mnist1d:size=1000:generator_seed=42"
    assert ledger_for_dataset(server.uri(), fingerprint) == ["mnist1d-org"]

    # the same data naming another ledger: a fresh budget on the same people, refused
    other_uri = server.uri("mnist1d-fresh")
    second = _run(_experiment(tmp_path, "pg-second", other_uri), tmp_path, env)
    assert second.returncode == EXIT_BAD_INPUT, second.stdout[-3000:] + second.stderr[-3000:]
    assert "already has its budget in ledger" in second.stderr
    assert not (tmp_path / "store" / "pg-second" / "tune").exists()
    assert PrivacyLedger.read_only(other_uri).charges() == ()
    assert ledger_for_dataset(server.uri(), fingerprint) == ["mnist1d-org"]
    assert [re.sub(r"@[0-9a-f]{16}/", "/", c.charge_id)
            for c in PrivacyLedger.read_only(uri).charges()] == ["pg-first/point"]
