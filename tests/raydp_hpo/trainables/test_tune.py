"""The trainable inside a real Ray Tune run, charging a real ledger actor (marked ``ray``)."""

from __future__ import annotations

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import BudgetExhaustedError, InvalidParameterError
from raydp_hpo.trainables.tune_trainable import make_trainable

pytestmark = pytest.mark.ray


def _space(name: str, ns: str, charge_id) -> dict:
    return {
        "model": "mlp",
        "model_kwargs": {"hidden": [16]},
        "optimizer": "sgd",
        "batch_size": 256,
        "epochs": 2,
        "noise_multiplier": 1.0,
        "lr": 0.5,
        "raydp": {
            "ledger": name, "namespace": ns, "experiment": "t", "charge": True,
            "charge_id": charge_id,
        },
    }


def test_tuner_trials_charge_the_ledger_actor_once_each(ray_session, digits, tmp_path):
    from ray import tune

    from raydp_hpo.ledger.actor import get_ledger

    ns = "raydp_trainables_test"
    ledger = get_ledger("tl", PrivacyBudget(30.0, 1e-5), tmp_path / "j.jsonl", namespace=ns)
    try:
        space = _space("tl", ns, tune.grid_search(["t/a", "t/b"]))
        tuner = tune.Tuner(
            make_trainable(digits),
            param_space=space,
            tune_config=tune.TuneConfig(metric="val_accuracy", mode="max", reuse_actors=True),
            run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
        )
        grid = tuner.fit()
        assert grid.num_errors == 0
        assert sorted(c.charge_id for c in ledger.charges()) == ["t/a/attempt-0", "t/b/attempt-0"]
        best = grid.get_best_result()
        assert best.metrics["epoch"] == 2 and "test_accuracy" in best.metrics
        assert best.checkpoint is not None
        # a trial whose charge is refused reports nothing and errors with BudgetExhaustedError
        space = {**_space("tl", ns, "t/huge"), "noise_multiplier": 0.3, "epochs": 20}
        grid = tune.Tuner(
            make_trainable(digits),
            param_space=space,
            run_config=tune.RunConfig(storage_path=str(tmp_path / "r2"), verbose=0),
        ).fit()
        assert grid.num_errors == 1
        assert isinstance(grid[0].error.cause, BudgetExhaustedError) or "BudgetExhausted" in str(
            grid[0].error
        )
        assert len(ledger.charges()) == 2
    finally:
        ledger.kill()


@pytest.mark.parametrize(("resources", "message"), [
    ({"cpu": 1, "gpu": 1}, "gpu=1 but the largest node of the Ray cluster has gpu=0"),
    ({"cpu": 64}, "cpu=64 but the largest node of the Ray cluster has cpu=2"),
    ({"cpu": 1, "memory": 10**15}, "memory=1e\\+15"),
])
def test_resource_request_no_node_can_hold_fails_fast(ray_session, digits, resources, message):
    """A request no node can hold would leave Tune waiting forever after the plan was charged:
    refused up front as bad input (InvalidParameterError, CLI exit 2)."""
    with pytest.raises(InvalidParameterError, match=message):
        make_trainable(digits, resources)
