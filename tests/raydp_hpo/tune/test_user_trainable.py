"""DPTuner with a trainable of the user's own (raydp_hpo.trial_session), end to end with real
Ray Tune and Opacus: honest trials released, every contract break caught (marked `ray`)."""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Composition, Laplace, SubsampledGaussian
from raydp_hpo.errors import TrialContractError
from raydp_hpo.trainables.data import Dataset, split
from raydp_hpo.trainables.release import load_released_model
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.tune import _user_trainables as user

pytestmark = [pytest.mark.ray]

BUDGET = PrivacyBudget(50.0, 1e-5)
SPACE = {"lr": 0.5, "epochs": 1, "batch_size": 20, "noise_multiplier": 1.0,
         "max_grad_norm": 1.0}
SCORE_EPS = 0.5


def _data():
    """DataSplits only for the declared sizes (the trainable loads its own tensors)."""
    x, y = user.arrays(user.N + user.N_VAL, 0)
    return split(Dataset(x, y, 2), user.N_VAL / (user.N + user.N_VAL), 0.0)


def _tuner(tmp_path: Path, variants: list[str], **kwargs) -> DPTuner:
    return DPTuner(user.trainable, param_space={**SPACE, "variant": tune.grid_search(variants)},
                   search="grid_composed", budget=BUDGET, data=_data(), fresh_budget=True,
                   storage_path=tmp_path, dataset_size=user.N, validation_size=user.N_VAL,
                   search_kwargs={"score_epsilon": SCORE_EPS}, **kwargs)


def _independent_epsilon(trials: int, steps: int, q: float, sigma: float) -> float:
    """ε of `trials` × (DP-SGD(σ, q, steps) then Laplace(ε_s)) by Google's dp_accounting."""
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps),
        dp_accounting.LaplaceDpEvent(1.0 / SCORE_EPS),
    ])
    accountant.compose(event, trials)
    return accountant.get_epsilon(BUDGET.delta)


def test_honest_trial_released_violations_failed(ray_session, tmp_path: Path) -> None:
    variants = ["good", "sigma_low", "extra_steps", "loader_q"]
    # the grid stops suggesting after a failed trial: all four are suggested up front
    result = _tuner(tmp_path, variants,
                    tune_config=tune.TuneConfig(max_concurrent_trials=4)).fit()
    assert result.hyperparameters is not None and result.hyperparameters["variant"] == "good"
    errors = {t["config"]["variant"]: t["error"] for t in result.private_trials}
    assert errors["good"] is None
    assert "noise_multiplier=0.25" in errors["sigma_low"]
    assert "step 11 refused" in errors["extra_steps"]
    assert "batch_size=33" in errors["loader_q"]
    for bad in variants[1:]:
        assert "TrialContractError" in errors[bad]
    # every trial was admitted (charged) before it broke the contract: the ledger counts all
    per_trial = Composition((SubsampledGaussian(1.0, 0.1, 10), Laplace(SCORE_EPS)))
    assert [m for _, m in result.certificate.charges] == [per_trial] * 4
    theirs = _independent_epsilon(4, 10, 0.1, 1.0)
    assert result.certificate.epsilon_rdp == pytest.approx(theirs, rel=0.02)  # α grids differ
    # the released model is the user's own class, rebuilt from the public file
    model = load_released_model(result.model_path)
    assert isinstance(model, user.TinyMLP) and isinstance(result.model, user.TinyMLP)


def test_a_trial_without_a_session_is_not_released(ray_session, tmp_path: Path) -> None:
    with pytest.raises(TrialContractError, match="raydp_session") as caught:
        _tuner(tmp_path, ["no_session"]).fit()
    out = caught.value.result
    assert out.hyperparameters is None and out.model is None
    assert out.certificate.charges == ()  # it was never admitted: nothing charged
    public = json.loads((Path(out.experiment_path) / "public" / "release.json").read_text())
    assert public["hyperparameters"] is None


def test_missing_score_and_wrong_metric_are_errors(ray_session, tmp_path: Path) -> None:
    with pytest.raises(TrialContractError, match="ended without trial.report_score") as caught:
        _tuner(tmp_path / "a", ["no_score"]).fit()
    assert len(caught.value.result.certificate.charges) == 1  # charged, stays charged
    # DPTuner selects on 'val_accuracy' (the only private score it allows); the trial
    # reported its score under 'accuracy'
    with pytest.raises(TrialContractError, match=r"not under the metric 'val_accuracy'.*'accuracy'"):
        _tuner(tmp_path / "b", ["wrong_metric"]).fit()


def test_unreadable_checkpoint_releases_the_hyperparameters(ray_session, tmp_path: Path
                                                            ) -> None:
    with pytest.warns(UserWarning, match="model is not released"):
        result = _tuner(tmp_path, ["corrupt_checkpoint"]).fit()
    assert result.hyperparameters == {**SPACE, "variant": "corrupt_checkpoint"}
    assert result.model is None and result.model_path is None
    assert "user_model.pt" in result.extras["model_not_released"]


def test_a_search_whose_every_trial_fails_says_so(ray_session, tmp_path: Path) -> None:
    """Every trial dies of an ordinary exception after its charge — a ValueError in the
    user's loop, ``trial.report(dict)``, Opacus's own ValueError (issues #41, #37): ``fit``
    raises SearchFailedError after writing the certificate of the spend; release.json says
    nothing was selected and why, and nothing in it reads as a selection."""
    from raydp_hpo.errors import SearchFailedError
    from tests.raydp_hpo.tune import _failing_trainables as failing

    variants = ["value_error", "report_dict", "opacus_value_error"]
    tuner = DPTuner(failing.trainable,
                    param_space={**SPACE, "variant": tune.grid_search(variants)},
                    search="grid_composed", budget=BUDGET, data=_data(), fresh_budget=True,
                    storage_path=tmp_path, dataset_size=user.N, validation_size=user.N_VAL,
                    search_kwargs={"score_epsilon": SCORE_EPS},
                    tune_config=tune.TuneConfig(max_concurrent_trials=3))
    with pytest.raises(SearchFailedError, match=r"the search selected nothing: trials failed "
                       r"\(an exception in the trainable\).*3 of 3 trial\(s\) failed.*spent "
                       r"stays spent.*\"selected\": false") as caught:
        tuner.fit()
    out = caught.value.result
    errors = {t["config"]["variant"]: t["error"] for t in out.private_trials}
    assert "ValueError" in errors["value_error"] and "n/a" in errors["value_error"]
    assert "TypeError" in errors["report_dict"]
    assert "ValueError" in errors["opacus_value_error"]
    assert "Per sample gradient is not initialized" in errors["opacus_value_error"]
    assert out.hyperparameters is None and len(out.certificate.charges) == 3
    public = json.loads((Path(out.experiment_path) / "public" / "release.json").read_text())
    assert public["selected"] is False and public["hyperparameters"] is None
    assert public["reason"] == caught.value.reason
    assert "output of the DP selection" not in public["note"]
    assert "selected nothing" in public["note"] and "n/a" not in json.dumps(public)
    assert public["certificate"]["epsilon"]["certified"] == pytest.approx(out.certificate.epsilon)
