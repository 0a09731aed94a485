"""Random stopping's default law (issue #42): pinned, and priced by the existing TNB accounting.

The default is set in one place (``raydp_hpo/_stopping_defaults.py``); these tests pin its
value, so a change of default has to change them on purpose.
"""

from __future__ import annotations

import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from ray import tune

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Laplace,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.accounting.rdp import (
    DEFAULT_ORDERS,
    rdp_profile,
    rdp_to_epsilon,
    repeat_and_select_rdp,
)
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers import RandomStoppingSearch
from raydp_hpo.searchers.random_stopping import stopping_pmf
from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON

BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
KW = dict(metric="acc", dataset_size=10_000, budget=BUDGET, seed=1)
# a fixed base: σ given, so no calibration — the trial is SubsampledGaussian(1.2, 0.01, 100)
FIXED = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01,
         "noise_multiplier": 1.2}
BASE = Composition((SubsampledGaussian(1.2, 0.01, 100), Laplace(DEFAULT_SCORE_EPSILON)))


def test_the_default_plan_is_tnb_eta_2_mean_10() -> None:
    """No settings: K ~ truncated negative binomial with η = 2 and E[K] = 10 (P&S 2022 Def. 1)."""
    plan = RandomStoppingSearch(FIXED, **KW).privacy_plan()
    assert plan.base == BASE
    assert plan.mechanism == RandomStopping(
        BASE, StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 10.0, 2.0)
    assert plan.expected_gradient_evaluations == pytest.approx(10.0 * 100 * 0.01 * 10_000)


def test_the_default_selection_epsilon_is_the_tnb_accounting() -> None:
    """The default plan's ε is Papernot & Steinke's Thm. 2 for η = 2, E[K] = 10 over the fixed
    base — the accounting module's own TNB function over the base's RDP curve, and
    dp-accounting's RepeatAndSelectDpEvent (independent implementation) — no new formula."""
    mech = RandomStoppingSearch(FIXED, **KW).privacy_plan().mechanism
    got = epsilon(mech, BUDGET.delta, Accountant.RDP)  # type: ignore[arg-type]
    # the accounting module's TNB curve (P&S Thm. 2), converted at δ
    ours = rdp_to_epsilon(repeat_and_select_rdp(rdp_profile(BASE).values, 10.0, 2.0),
                          BUDGET.delta)
    assert got == pytest.approx(ours, rel=1e-12)  # the same computation: equal up to rounding
    acc = rdp_lib.RdpAccountant(orders=list(DEFAULT_ORDERS))
    event = dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.2)), 100),
        dp_event.LaplaceDpEvent(1.0 / DEFAULT_SCORE_EPSILON),
    ])
    acc.compose(dp_event.RepeatAndSelectDpEvent(event, 10.0, 2.0))
    # tolerance: the subsampled-Gaussian RDP is golden-tested against dp-accounting to 1e-9
    assert got == pytest.approx(acc.get_epsilon(BUDGET.delta), rel=1e-6)
    # the price of the law: more than the geometric law's over the same base (the (1 + η)
    # factor of Thm. 2), and the tightest figure never above the RDP one
    geometric = epsilon(RandomStopping(BASE, StoppingDistribution.GEOMETRIC, 10.0), BUDGET.delta,
                        Accountant.RDP)
    assert got > geometric
    assert epsilon(mech, BUDGET.delta) <= got  # type: ignore[arg-type]


def test_the_default_law_draws_fewer_small_k_than_the_geometric() -> None:
    """Why it won the study's low tail: P[K = 1] halves (10% → 5.0%) at the same E[K]."""
    tnb = [stopping_pmf(k, "truncated_negative_binomial", 10.0, 2.0) for k in (1, 2, 3)]
    geo = [stopping_pmf(k, "geometric", 10.0) for k in (1, 2, 3)]
    assert tnb[0] == pytest.approx(0.0498, abs=1e-4) and geo[0] == pytest.approx(0.1)
    assert sum(tnb) == pytest.approx(0.1804, abs=1e-4) and sum(geo) == pytest.approx(0.271)


@pytest.mark.parametrize(("given", "law", "shape", "mean"), [
    ({"distribution": "geometric"}, StoppingDistribution.GEOMETRIC, None, 10.0),
    ({"distribution": "poisson"}, StoppingDistribution.POISSON, None, 10.0),
    ({"mean": 5}, StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 2.0, 5.0),
    ({"shape": 3.0}, StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 3.0, 10.0),
    ({"preset": "tnb20"}, StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 2.0, 20.0),
    ({"distribution": "binomial", "shape": 20}, StoppingDistribution.BINOMIAL, 20.0, 10.0),
])
def test_partial_settings_fill_in_the_rest_coherently(
    given: dict[str, object], law: StoppingDistribution, shape: float | None, mean: float,
) -> None:
    """A law given alone takes no default η (geometric stays geometric); E[K] or η given
    alone keep the default law; a preset keeps its meaning."""
    plan = RandomStoppingSearch(FIXED, **given, **KW).privacy_plan()  # type: ignore[arg-type]
    assert plan.mechanism == RandomStopping(BASE, law, mean, shape)


def test_the_truncated_negative_binomial_named_without_eta_is_refused() -> None:
    """η has no default once the law is named: the user meant some η, say which."""
    with pytest.raises(InvalidParameterError, match="needs shape η > 0, got shape=None"):
        RandomStoppingSearch(FIXED, distribution="truncated_negative_binomial", **KW)
