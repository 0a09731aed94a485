"""Static check: the public API has real types for users, not the ``Any`` of lazy exports.

mypy checks this file (``make lint`` and ``tests/raydp_hpo/test_public_api.py``). Every
``assert_type`` fails under mypy if the name it checks were typed ``Any`` (as a PEP 562
``__getattr__`` export is without the packages' ``TYPE_CHECKING`` imports) or had another
type. The functions are never called: only their types matter.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

import raydp_hpo.searchers
import raydp_hpo.trainables
from raydp_hpo import (
    Accountant,
    BudgetExhaustedError,
    ChargeDecision,
    DPResult,
    DPTuner,
    LedgerHandle,
    LedgerLike,
    LedgerReport,
    Mechanism,
    PrivacyBudget,
    PrivacyCertificate,
    PrivacyLedger,
    RandomStopping,
    RayDPHPOError,
    StoppingDistribution,
    SubsampledGaussian,
    calibrate_analytic_gaussian,
    calibrate_laplace,
    calibrate_noise,
    calibrate_search,
    epsilon,
    epsilons,
    gdp_epsilon,
    get_ledger,
    is_covered,
    privacy_from_config,
)
from raydp_hpo.searchers import DPSearcher, PrivacyPlan, SearchAlgorithm, make_searcher
from raydp_hpo.trainables import Dataset, DataSplits, load_mnist1d, split, train_dp


def accounting() -> None:
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    assert_type(budget, PrivacyBudget)
    assert_type(budget.epsilon, float)
    trial = SubsampledGaussian(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14063)
    assert_type(epsilon(trial, 1e-5, Accountant.RDP), float)
    assert_type(epsilons([trial, trial], 1e-5), dict[Accountant, float])
    assert_type(calibrate_noise(3.0, 1e-5, 0.01, 1000), float)
    assert_type(calibrate_laplace(1.0), float)
    assert_type(calibrate_search(lambda s: SubsampledGaussian(s, 0.01, 100), 3.0, 1e-5), float)
    assert_type(calibrate_analytic_gaussian(1.0, 1e-5), float)
    assert_type(gdp_epsilon(1.0, 1e-5), float)
    search = RandomStopping(trial, StoppingDistribution.GEOMETRIC, mean=10)
    assert_type(search.eta, float)
    assert_type(is_covered(trial, search.base), bool)
    assert_type(privacy_from_config({"epochs": 1, "sample_rate": 0.1}, 1000).steps, int)


def spend(ledger: LedgerLike, mechanism: Mechanism) -> float:
    """Code written against either ledger."""
    decision = ledger.try_charge("exp/trial-1", mechanism, owner="exp")
    assert_type(decision, ChargeDecision)
    assert_type(decision.raise_if_refused(), ChargeDecision)
    assert_type(ledger.report(), LedgerReport)
    return ledger.remaining()


def ledgers(path: str) -> None:
    budget = PrivacyBudget(8.0, 1e-5)
    with PrivacyLedger(budget, path) as local:
        assert_type(spend(local, SubsampledGaussian(1.1, 0.01, 100)), float)
    handle = get_ledger("shared", budget)
    assert_type(handle, LedgerHandle)
    assert_type(spend(handle, SubsampledGaussian(1.1, 0.01, 100)), float)
    try:
        handle.charge("exp/plan", SubsampledGaussian(1.1, 0.01, 100))
    except BudgetExhaustedError as exc:
        assert_type(exc, BudgetExhaustedError)
        assert isinstance(exc, RayDPHPOError)


def searchers() -> None:
    searcher = make_searcher(
        SearchAlgorithm.ONE_SHOT_RANDOM,
        param_space={"epochs": 1, "sample_rate": 0.1},
        metric="acc",
        dataset_size=1000,
        budget=PrivacyBudget(2.0, 1e-5),
    )
    assert_type(searcher, DPSearcher)
    assert_type(searcher.privacy_plan(), PrivacyPlan)
    assert_type(searcher.budget, PrivacyBudget)
    assert_type(raydp_hpo.searchers.RandomStoppingSearch, type[raydp_hpo.searchers.RandomStoppingSearch])


def training(config: dict[str, Any]) -> None:
    data = split(load_mnist1d(num_samples=600), val_fraction=0.2, test_fraction=0.2)
    assert_type(data, DataSplits)
    assert_type(data.train, Dataset)
    assert_type(train_dp(config, data), raydp_hpo.trainables.TrainResult)


def tuning(tuner: DPTuner) -> None:
    result = tuner.fit()
    assert_type(result, DPResult)
    assert_type(result.certificate, PrivacyCertificate)
    assert_type(result.hyperparameters, dict[str, Any] | None)
