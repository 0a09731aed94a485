"""A failed search says so (issue #41 item 6): when nothing can be selected, for any reason,
``DPTuner.fit`` raises SearchFailedError after writing the certificate of the spend, and
``release.json`` states the reason; ``raydp-hpo run`` exits non-zero with that message.
(Every trial failing: tests/raydp_hpo/tune/test_user_trainable.py; a failed final run:
test_tuner.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.searchers.random_stopping import sample_stopping_k
from raydp_hpo.trainables.data import load_digits, split
from raydp_hpo.tune.tuner import DPTuner

pytestmark = [pytest.mark.ray]

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}


def _k_zero_seed() -> int:
    """A secret seed whose random stopping (Poisson, E[K] = 1) draws K = 0 (probability
    1/e): its first secret draw is K."""
    for seed in range(100):
        if sample_stopping_k(np.random.default_rng(seed), "poisson", 1.0, None) == 0:
            return seed
    raise AssertionError("no seed draws K = 0")  # pragma: no cover - (1 - 1/e)^100


def test_k_zero_raises_after_the_certificate(ray_session, tmp_path: Path) -> None:
    """K = 0 drawn: the plan was charged and nothing ran; on the old main fit returned
    hyperparameters=None with no warning and release.json read as a selection."""
    from raydp_hpo.errors import SearchFailedError

    tuner = DPTuner(None, param_space=SPACE, search="random_stopping",
                    budget=PrivacyBudget(2.0, 1e-5), data=split(load_digits(), 0.2, 0.2),
                    storage_path=tmp_path, fresh_budget=True, experiment="k0",
                    search_kwargs={"distribution": "poisson", "mean": 1.0},
                    secret_seed=_k_zero_seed())
    with pytest.raises(SearchFailedError, match=r"the search selected nothing: K = 0 was "
                       r"drawn.*spent stays spent \(ε=") as caught:
        tuner.fit()
    out = caught.value.result
    assert out.hyperparameters is None and out.private_trials == []
    assert len(out.certificate.charges) == 1 and out.certificate.epsilon > 0
    public = json.loads((tmp_path / "k0" / "public" / "release.json").read_text())
    assert public["selected"] is False and public["hyperparameters"] is None
    assert public["model_file"] is None and public["files"] == ["release.json",
                                                                "certificate.json"]
    assert public["reason"].startswith("K = 0 was drawn")
    assert "output of the DP selection" not in public["note"]
    assert public["certificate"]["epsilon"]["certified"] == pytest.approx(out.certificate.epsilon)


def test_cli_run_that_selects_nothing_exits_non_zero(ray_session, tmp_path: Path,
                                                     capsys) -> None:
    from raydp_hpo.cli.main import EXIT_ERROR, main

    raw = {
        "experiment": "k0-cli", "storage_path": str(tmp_path),
        "data": {"source": "digits", "val_fraction": 0.2, "test_fraction": 0.2},
        "model": {"name": "mlp"},
        "search": {"algorithm": "random_stopping",
                   "settings": {"distribution": "poisson", "mean": 1.0}},
        "space": {"lr": {"loguniform": [0.05, 1.0]}, "epochs": 1, "batch_size": 64,
                  "max_grad_norm": 1.0, "optimizer": "sgd"},
        "budget": {"epsilon": 2.0, "delta": 1e-5},
        "secret_seed": _k_zero_seed(),
        "ledger": {"name": "k0-cli-ledger"},
    }
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        assert main(["run", str(path), "--num-cpus", "2"]) == EXIT_ERROR
    finally:
        import contextlib

        import ray

        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor("k0-cli-ledger", namespace="raydp_hpo"))
    err = capsys.readouterr().err
    assert "raydp-hpo: the search selected nothing: K = 0 was drawn" in err
    run = json.loads((tmp_path / "k0-cli" / "run.json").read_text())
    assert run["status"] == "nothing_selected" and run["selected"] is False
    public = json.loads((tmp_path / "k0-cli" / "public" / "release.json").read_text())
    assert public["selected"] is False and public["reason"].startswith("K = 0")
