"""DPTuner hands the admitted plan's receipt to every trial it covers (marked `ray`).

The trainable here passes the real privacy gate and reports what its plan check found, so
the test sees that each plan-covered trial was admitted from the journal on this node with no
ledger round trip, and that the receipt names the plan charge the ledger holds.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import TrialContractError
from raydp_hpo.ledger.journal import read_journal
from raydp_hpo.trainables.data import Dataset, split
from raydp_hpo.tune.tuner import DPTuner

pytestmark = [pytest.mark.ray]


def gate_trainable(config: dict[str, Any]) -> None:
    """Admits like the real trainable and reports how the plan charge was checked."""
    from raydp_hpo.ledger.plan_receipt import check_receipt
    from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit, resolve_ledger
    from raydp_hpo.trial.privacy import privacy_from_config

    settings = RaydpSettings.from_config(config)
    ledger = resolve_ledger(settings, None)
    receipt = settings.plan_receipt
    admit(settings, privacy_from_config(config, 1000).mechanism(), ledger, owner="test")
    tune.report({
        "val_accuracy": float(config["lr"]),
        "attached": ledger is not None,
        "check": None if receipt is None else check_receipt(receipt, settings.covered_by).value,
        "seq": None if receipt is None else receipt.seq,
    })


def _run(tmp_path: Path, name: str) -> Any:
    rng = np.random.default_rng(0)
    data = split(Dataset(rng.normal(size=(1000, 4)).astype(np.float32),
                         rng.integers(0, 2, size=1000), 2, public_size=1000), 0.1, 0.1)
    space = {"lr": tune.uniform(0.0, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 20.0}
    tuner = DPTuner(tune.with_resources(gate_trainable, {"cpu": 1}), param_space=space,
                    search="random_stopping",
                    budget=PrivacyBudget(20.0, 1e-5), data=data, storage_path=tmp_path,
                    experiment=name, search_kwargs={"mean": 3.0, "distribution": "poisson"},
                    secret_seed=1, fresh_budget=True)
    # gate_trainable reports no noisy score (glue, not a trial_session): fit raises the
    # contract error after the run, with the result (and certificate) attached
    try:
        return tuner.fit()
    except TrialContractError as err:
        assert "no trial reported a noisy score" in str(err)
        return err.result  # type: ignore[attr-defined]


@pytest.mark.parametrize("driver_on_head", [True, False])
def test_plan_covered_trials_check_the_receipt_locally(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver_on_head: bool
) -> None:
    """On the head node the driver charges the plan on the dedicated journal before the
    ledger's actor exists (the actor starts beside the trials); elsewhere the actor is started
    first and charges it. Either way every covered trial checks the receipt locally."""
    import ray

    import raydp_hpo.ledger.actor as ledger_actor
    import raydp_hpo.tune.tuner as tuner_module

    name = f"rcpt-{uuid.uuid4().hex[:6]}"
    made_before_actor: list[bool] = []
    real = tuner_module.charge_before_start

    def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            ray.get_actor(f"ledger-{name}", namespace="raydp_hpo")
            made_before_actor.append(False)
        except ValueError:
            made_before_actor.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner_module, "charge_before_start", spy)
    monkeypatch.setattr(ledger_actor, "driver_on_head_node", lambda: driver_on_head)
    result = _run(tmp_path, name)
    assert made_before_actor == ([True] if driver_on_head else [])
    assert result.certificate.ledger_spent_epsilon == pytest.approx(
        result.certificate.epsilon, rel=1e-9)
    trials = result.private_trials
    assert trials and all(t["error"] is None for t in trials)
    _, records = read_journal(tmp_path / name / "ledger.journal")
    plan_id = result.certificate.charges[0][0]  # <experiment>@<run id>/plan: this run's
    assert plan_id.startswith(f"{name}@") and plan_id.endswith("/plan")
    plan = [r for r in records if r.get("charge_id") == plan_id]  # markers have none
    assert len(plan) == 1
    for t in trials:
        assert t["metrics"]["attached"] is False  # no ledger actor look-up, no round trip
        assert t["metrics"]["check"] == "durable"
        assert t["metrics"]["seq"] == plan[0]["seq"]
