"""A refusal is priced by the rule that refused (issue #38): a fixed σ = 1.0 plan of RDP
ε = 2.97 refused by the adaptive RDP filter (ε = 3.79 > 3) was reported as "needs ε=2.969
... (RDP accountant). Use a budget of at least ε=2.969" — a budget that is refused again.
Now the message names the filter, its figure, and a budget that does pass it."""

from __future__ import annotations

import re

import pytest

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.accounting.rdp import rdp_profile
from raydp_hpo.errors import BudgetTooSmallError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, filter_epsilon
from raydp_hpo.searchers import OneShotRandomSearch
from raydp_hpo.tune.ledger_rules import _BothRules, _DatasetPointRule, _FirstChargeRule

BUDGET = PrivacyBudget(3.0, 1e-5)
SPACE = {"lr": 0.1, "epochs": 2, "sample_rate": 0.05, "noise_multiplier": 1.0}
PLAN = SubsampledGaussian(1.0, 0.05, 40)  # what SPACE trains: 2 epochs at q = 0.05


def _refusal(admissible: object, budget: PrivacyBudget = BUDGET) -> str:
    with pytest.raises(BudgetTooSmallError) as info:
        OneShotRandomSearch(SPACE, metric="acc", dataset_size=10_000, budget=budget, seed=1,
                            admissible=admissible)
    return str(info.value)


def _at_least(message: str) -> float:
    found = re.search(r"at least ε=([0-9.]+)", message)
    assert found, message
    return float(found.group(1))


def test_a_filter_refusal_states_the_filter_figure_and_a_budget_that_passes() -> None:
    assert epsilon(PLAN, BUDGET.delta, Accountant.RDP) < 3.0  # what the old message priced
    figure = filter_epsilon(rdp_profile(PLAN), BUDGET.delta)
    assert figure > 3.0
    message = _refusal(_FirstChargeRule(BUDGET, Adaptivity.ADAPTIVE))
    assert "adaptive RDP filter" in message and "(RDP accountant)" not in message
    assert f"ε={figure:.4g}" in message
    enough = _at_least(message)
    assert figure <= enough < figure + 1e-4
    # the budget it names passes the very rule that refused
    assert _FirstChargeRule(PrivacyBudget(enough, BUDGET.delta), Adaptivity.ADAPTIVE)(PLAN)


def test_a_dataset_point_refusal_states_what_the_ledger_would_record() -> None:
    """On a ledger that composes experiments, with ε ≈ 1.4 of 3 already spent by an earlier
    experiment, the plan is refused by the ledger's rule: the message gives what the rule
    would record with it and the ledger budget that would admit it."""
    ledger = PrivacyLedger(BUDGET, adaptivity=Adaptivity.EXPERIMENTS,
                           accountant=Accountant.TIGHTEST)
    earlier = SubsampledGaussian(1.5, 0.05, 40)
    ledger.charge("earlier/point", earlier)
    after = ledger.epsilon_if_charged(PLAN)
    assert after > 3.0
    rule = _BothRules(_FirstChargeRule(BUDGET, Adaptivity.FIXED_PLAN),
                      _DatasetPointRule(BUDGET, Accountant.TIGHTEST,
                                        (("earlier/point", earlier),), None,
                                        ledger.delta_split))
    message = _refusal(rule)
    assert "experiments rule" in message and "as charge 2 on the ledger" in message
    assert f"would record ε={after:.4g}" in message
    enough = _at_least(message)
    bigger = PrivacyLedger(PrivacyBudget(enough, BUDGET.delta), adaptivity=Adaptivity.EXPERIMENTS,
                           accountant=Accountant.TIGHTEST)
    bigger.charge("earlier/point", earlier)
    assert bigger.would_admit(PLAN)


def test_a_shared_adaptive_ledger_refusal_names_its_filter() -> None:
    """Issue #38's case: a fixed σ = 1.0 plan on a named ledger that halts on the adaptive RDP
    filter (one created before #38 keeps that rule), budget ε = 3: the plan's own RDP figure
    (2.97) fits, the ledger's filter (3.79) refuses, and the message says so."""
    from raydp_hpo.tune.ledger_rules import _SharedLedgerRule

    class Named(PrivacyLedger):  # the actor handle's one extra: its name
        name = "org-ledger"

    ledger = Named(BUDGET, adaptivity=Adaptivity.ADAPTIVE, accountant=Accountant.RDP)
    message = _refusal(_SharedLedgerRule(BUDGET, ledger, resumed=False))
    figure = filter_epsilon(rdp_profile(PLAN), BUDGET.delta)
    assert "shared ledger 'org-ledger'" in message and "adaptive RDP filter" in message
    assert f"gives ε={figure:.4g} with this plan" in message and "(RDP accountant)" not in message
    enough = _at_least(message)
    assert PrivacyLedger(PrivacyBudget(enough, BUDGET.delta)).would_admit(PLAN)
    assert ledger.charges() == ()  # nothing charged
