"""DPTuner on a PostgreSQL ledger (issue #32): the Python path consults the dataset registry
as ``raydp-hpo run`` does, so data bound to one ledger cannot start a fresh budget by naming
another. Against a REAL throw-away server (``make test-postgres``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import LedgerMismatchError
from raydp_hpo.ledger.actor import get_ledger
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.pg import ledger_for_dataset
from raydp_hpo.trainables.data import load_mnist1d, split
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.ledger.pg_server import WRITER, PgServer

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(2.0, 1e-5)

pytestmark = [pytest.mark.postgres, pytest.mark.ray, pytest.mark.slow]  # three small searches


def _as_writer(uri: str) -> str:
    # the ledger actor's process reads its role from the URI (libpq's user; never a password)
    return uri.replace("127.0.0.1", f"{WRITER}@127.0.0.1", 1)


def test_dptuner_binds_its_data_to_the_postgres_ledger_and_refuses_another(
    ray_session: None, server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGUSER", WRITER)
    data = split(load_mnist1d(num_samples=600, seed=7), 0.2, 0.2, seed=0)
    tag = uuid.uuid4().hex[:6]
    first = get_ledger(f"pg-tuner-a-{tag}", BUDGET, _as_writer(server.uri("tuner-a")),
                       namespace="tests-pg")
    other = get_ledger(f"pg-tuner-b-{tag}", BUDGET, _as_writer(server.uri("tuner-b")),
                       namespace="tests-pg")
    lines: list[str] = []
    try:
        result = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                         data=data, storage_path=tmp_path / "a", ledger=first,
                         progress=lines.append).fit()
        assert any("is bound to ledger" in line for line in lines)
        assert ledger_for_dataset(server.uri(), str(data.name)) == ["tuner-a"]
        stored = PrivacyLedger.read_only(server.uri("tuner-a")).charges()
        assert [c.charge_id for c in stored] == [result.certificate.charges[0][0]]
        # the same data naming another ledger: a fresh budget on the same people, refused
        # before Ray Tune starts and before any charge
        with pytest.raises(LedgerMismatchError, match="already has its budget in ledger"):
            DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=tmp_path / "b", ledger=other).fit()
        assert other.charges() == ()
        assert PrivacyLedger.read_only(server.uri("tuner-b")).charges() == ()
        assert not list((tmp_path / "b").rglob("tune"))
        assert ledger_for_dataset(server.uri(), str(data.name)) == ["tuner-a"]
        # its own ledger again is fine (the binding is idempotent)
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=data, storage_path=tmp_path / "c", ledger=first).fit()
        assert len(PrivacyLedger.read_only(server.uri("tuner-a")).charges()) == 2
    finally:
        first.kill()
        other.kill()
