"""Random stopping with binomial K: the law sampled is the law accounted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ray import tune

from raydp_hpo.accounting import profiles as pr
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers import RandomStoppingSearch
from raydp_hpo.searchers.random_stopping import sample_stopping_k, stopping_pmf
from tests.raydp_hpo.searchers._results import complete

SPACE = {"lr": tune.loguniform(0.01, 1.0), "epochs": 2, "sample_rate": 0.05,
         "noise_multiplier": 1.5}


def test_binomial_pmf_is_the_accounted_law() -> None:
    """stopping_pmf sums to 1, has mean E[K], support {0..m}, and its PGF is the profile law's."""
    m, mean = 12, 4.0
    pmf = np.array([stopping_pmf(k, "binomial", mean, m) for k in range(m + 3)])
    assert pmf[m + 1:].sum() == 0.0
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert (np.arange(m + 3) * pmf).sum() == pytest.approx(mean, rel=1e-12)
    law = pr.binomial_law(m, mean / m)
    for x in (0.0, 0.3, 0.9):
        assert (pmf * x ** np.arange(m + 3)).sum() == pytest.approx(float(law.pgf(x)), rel=1e-12)


def test_binomial_sampler_matches_the_pmf() -> None:
    rng = np.random.default_rng(7)
    m, mean = 8, 3.0
    draws = np.array([sample_stopping_k(rng, "binomial", mean, m) for _ in range(20000)])
    assert draws.min() >= 0 and draws.max() <= m
    counts = np.bincount(draws, minlength=m + 1)
    expected = 20000 * np.array([stopping_pmf(k, "binomial", mean, m) for k in range(m + 1)])
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30.0  # 8 d.o.f.: P[χ² > 30] ≈ 2e-4


def test_searcher_with_binomial_k_plans_it_and_never_exceeds_m_trials() -> None:
    budget = PrivacyBudget(8.0, 1e-5)
    searcher = RandomStoppingSearch(SPACE, metric="val_accuracy", dataset_size=1000,
                                    budget=budget, distribution="binomial", mean=3.0, shape=6,
                                    seed=3)
    plan = searcher.privacy_plan().mechanism
    assert isinstance(plan, RandomStopping)
    assert plan.distribution is StoppingDistribution.BINOMIAL and plan.trials == 6
    suggested = 0
    while isinstance(searcher.suggest(f"t{suggested}"), dict):
        complete(searcher, f"t{suggested}", {"val_accuracy": 0.5})
        suggested += 1
        assert suggested <= 6
    assert math.isfinite(searcher.plan_epsilon())


def test_searcher_refuses_a_binomial_without_m() -> None:
    with pytest.raises(InvalidParameterError, match="shape"):
        RandomStoppingSearch(SPACE, metric="val_accuracy", dataset_size=1000,
                             budget=PrivacyBudget(8.0, 1e-5), distribution="binomial", mean=3.0)
