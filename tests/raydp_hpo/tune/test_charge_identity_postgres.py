"""Charge identity on a PostgreSQL ledger (issue #41, item 1): ``DPTuner.fit`` twice under
one experiment name (another storage path) pays twice — on the old main the second plan was
a replay of the first (one charge, two releases); a resume attaches only with the run id its
experiment directory records. Against a REAL throw-away server (``make test-postgres``)."""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import LedgerMismatchError, ReleaseAlreadyPublishedError
from raydp_hpo.ledger.actor import get_ledger
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.data import load_digits, split
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.ledger.pg_server import WRITER, PgServer

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(1.0, 1e-5)

pytestmark = [pytest.mark.postgres, pytest.mark.ray, pytest.mark.slow]  # two small searches


def test_fit_twice_under_one_name_pays_twice_on_postgres(
    ray_session: None, server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGUSER", WRITER)
    data = split(load_digits(), 0.2, 0.2, seed=0)
    tag = uuid.uuid4().hex[:6]
    uri = server.uri(f"identity-{tag}")
    ledger = get_ledger(f"pg-identity-{tag}", PrivacyBudget(4.0, 1e-5),
                        uri.replace("127.0.0.1", f"{WRITER}@127.0.0.1", 1),
                        namespace="tests-pg")
    try:
        tuners = []
        for storage in ("a", "b"):
            t = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=data, storage_path=tmp_path / storage, ledger=ledger,
                        experiment="same-name")
            t.fit()
            tuners.append(t)
        ids = [c.charge_id for c in PrivacyLedger.read_only(uri).charges()]
        assert len(ids) == 2, f"two releases, {len(ids)} charge(s): {ids}"
        assert ids == [f"same-name@{t.run_id}/plan" for t in tuners]

        # a resume of b's own run proves it, but b has released: refused (one release per
        # run), no third charge ...
        exp_b = tmp_path / "b" / "same-name"
        with pytest.raises(ReleaseAlreadyPublishedError, match="already published"):
            DPTuner.restore(exp_b, data=data, ledger=ledger).fit()
        assert len(PrivacyLedger.read_only(uri).charges()) == 2
        # ... a run id on no charge of the ledger is refused, nothing charged
        saved = pickle.loads((exp_b / "dptuner.pkl").read_bytes())
        (exp_b / "dptuner.pkl").write_bytes(pickle.dumps({**saved, "run_id": "e" * 16}))
        with pytest.raises(LedgerMismatchError, match="holds no charge of this run"):
            DPTuner.restore(exp_b, data=data, ledger=ledger).fit()
        assert len(PrivacyLedger.read_only(uri).charges()) == 2
    finally:
        ledger.kill()
