"""The organisation's registry for every run (issue #32): with ``RAYDP_HPO_REGISTRY`` set,
data bound in PostgreSQL to one ledger cannot get a fresh budget by any other route —
``DPTuner(fresh_budget=True)``, the default journal-file dataset ledger, or an experiment file
naming a journal file — and a registry that cannot be reached refuses the run (fail closed).
Against a REAL throw-away server (``make test-postgres``)."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from pathlib import Path

import pytest
import yaml
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.main import EXIT_BAD_INPUT, main
from raydp_hpo.errors import InvalidParameterError, LedgerMismatchError, LedgerUnavailableError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.pg import ledger_for_dataset, register_dataset
from raydp_hpo.trainables.data import DataSplits, load_mnist1d, split
from raydp_hpo.tune.dataset_ledger import REGISTRY_ENV, check_data_registry
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.ledger.pg_server import WRITER, PgServer

pytestmark = [pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]
SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(2.0, 1e-5)


@pytest.fixture
def bound(server: PgServer, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A fresh data name bound to PostgreSQL ledger A: (name, ledger A's URI)."""
    monkeypatch.setenv("PGUSER", WRITER)
    name = f"census-{uuid.uuid4().hex[:8]}"
    uri = server.uri(f"a-{name}")
    PrivacyLedger(BUDGET, uri).close()
    register_dataset(uri, name)
    return name, uri


def _data(name: str) -> DataSplits:
    splits = split(load_mnist1d(num_samples=300, seed=7), 0.2, 0.2, seed=0)
    return dataclasses.replace(splits, name=name)  # keeps the declared public sizes


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there


def test_registry_refuses_every_ledger_but_the_bound_one(
    server: PgServer, bound: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, uri_a = bound
    lines: list[str] = []
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    # not set: nothing is looked up, even for a fresh budget on bound data
    check_data_registry([name], None, lines.append)
    assert lines == []
    monkeypatch.setenv(REGISTRY_ENV, server.uri())
    check_data_registry([name], uri_a, lines.append)  # the bound ledger itself
    assert "may be charged" in lines[-1]
    for charged, what in ((None, "fresh budget"), (tmp_path / "x.journal", "journal file"),
                          (server.uri("other"), "ledger postgresql")):
        with pytest.raises(LedgerMismatchError, match=f"already has its budget.*{what}"):
            check_data_registry([None, name], charged, lines.append)
    # the same ledger name in another database is another ledger
    with pytest.raises(LedgerMismatchError, match="already has its budget"):
        check_data_registry([name], uri_a.replace("/raydp?", "/postgres?"), lines.append)
    check_data_registry([f"unbound-{name}"], None, lines.append)  # unbound data: as today
    monkeypatch.setenv(REGISTRY_ENV, server.uri().replace("://", "://u:secret@"))
    with pytest.raises(InvalidParameterError, match=f"{REGISTRY_ENV}.*password"):
        check_data_registry([name], uri_a, lines.append)
    monkeypatch.setenv(REGISTRY_ENV, "/srv/registry")
    with pytest.raises(InvalidParameterError, match="not a PostgreSQL URI"):
        check_data_registry([name], uri_a, lines.append)
    assert ledger_for_dataset(server.uri(), name) == [f"a-{name}"]


@pytest.mark.ray
def test_dptuner_fresh_budget_on_bound_data_is_refused_and_charges_nothing(
    ray_session: None, server: PgServer, bound: tuple[str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    name, uri_a = bound
    data = _data(name)
    monkeypatch.setenv(REGISTRY_ENV, server.uri())
    for how, fresh in (("fresh budget", True),
                       ("journal file", False)):  # the default dataset ledger: a journal file
        store = tmp_path / how.replace(" ", "-")
        with pytest.raises(LedgerMismatchError, match=f"already has its budget.*{how}"):
            DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=store, fresh_budget=fresh).fit()
        assert not list(store.rglob("*.journal")) and not list(store.rglob("tune"))
    # registry down: fail closed, nothing charged
    monkeypatch.setenv(REGISTRY_ENV, f"postgresql://127.0.0.1:{_closed_port()}/raydp")
    with pytest.raises(LedgerUnavailableError, match="cannot reach"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=data, storage_path=tmp_path / "down", fresh_budget=True).fit()
    assert not list((tmp_path / "down").rglob("*.journal"))
    assert PrivacyLedger.read_only(uri_a).charges() == ()


@pytest.mark.ray
@pytest.mark.slow  # one small search
def test_dptuner_without_the_registry_variable_is_unchanged(
    ray_session: None, bound: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = bound
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    result = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                     data=_data(name), storage_path=tmp_path, fresh_budget=True).fit()
    assert len(result.certificate.charges) == 1


def test_cli_run_naming_a_journal_file_for_bound_data_is_refused(
    server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PGUSER", WRITER)
    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_postgres.yaml").read_text())
    fingerprint = f"mnist1d:size={raw['data']['size']}:generator_seed=" \
                  f"{raw['data']['generator_seed']}"
    uri_a = server.uri(f"cli-a-{uuid.uuid4().hex[:6]}")
    PrivacyLedger(BUDGET, uri_a).close()
    register_dataset(uri_a, fingerprint)
    journal = tmp_path / "own.journal"
    raw.update(experiment="cli-file", storage_path=str(tmp_path / "store"))
    raw["ledger"] = {"name": "own", "journal": str(journal),
                     "budget": {"epsilon": 20.0, "delta": 1e-5}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(REGISTRY_ENV, server.uri())
    capsys.readouterr()
    code = main(["run", str(path), "--num-cpus", "2",
                 "--ray-temp-dir", f"/tmp/rdrg{uuid.uuid4().hex[:6]}"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert "already has its budget" in err and uri_a in err and str(journal) in err
    assert not journal.exists() and not (tmp_path / "store" / "cli-file" / "tune").exists()
    # registry down: refused too, nothing charged
    monkeypatch.setenv(REGISTRY_ENV, f"postgresql://127.0.0.1:{_closed_port()}/raydp")
    assert main(["run", str(path), "--num-cpus", "2"]) != 0
    assert "cannot reach" in capsys.readouterr().err
    assert not journal.exists()
