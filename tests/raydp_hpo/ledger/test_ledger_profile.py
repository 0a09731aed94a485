"""Fixed-plan ledgers halting on Accountant.PROFILE, and searchers calibrated on the same rule.

Figures here are computed independently of the ledger by :func:`raydp_hpo.accounting.epsilon`
and :func:`raydp_hpo.accounting.profiles.profile_epsilon`; the ledger must agree with them and never
report more than RDP, PLD or BEST for the same charges.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ray import tune

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Gaussian,
    Laplace,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.accounting.profiles import profile_epsilon
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, tightest_halting_accountant
from raydp_hpo.searchers import RandomStoppingSearch
from raydp_hpo.searchers.base import CALIBRATION_RTOL

DELTA = 1e-5
# the demo's trial: 12 epochs at sample rate 0.05, noisy score ε_s = 0.1
BASE = Composition((SubsampledGaussian(1.0, 0.05, 240), Laplace(0.1)))
SELECTION = RandomStopping(BASE, StoppingDistribution.GEOMETRIC, 6.0)
SPACE = {
    "lr": tune.loguniform(0.03, 1.0),
    "momentum": tune.choice([0.0, 0.5, 0.9]),
    "epochs": 12,
    "sample_rate": 0.05,
    "optimizer": "momentum",
}


def _fixed(budget: PrivacyBudget, accountant: Accountant, journal: Path | None = None
           ) -> PrivacyLedger:
    return PrivacyLedger(budget, journal, adaptivity=Adaptivity.FIXED_PLAN, accountant=accountant)


def test_tightest_halting_accountant_per_rule() -> None:
    assert tightest_halting_accountant(Adaptivity.FIXED_PLAN) is Accountant.PROFILE
    assert tightest_halting_accountant(Adaptivity.ADAPTIVE) is Accountant.RDP


def test_profile_ledger_admits_a_selection_that_rdp_and_best_refuse() -> None:
    """RDP 9.27, PLD ~9.5, profile 7.08 at δ = 1e-5: a budget of 8 admits it only on profiles
    (fails on the old code, which refused Accountant.PROFILE in the constructor)."""
    rdp = epsilon(SELECTION, DELTA, Accountant.RDP)
    best = epsilon(SELECTION, DELTA, Accountant.BEST)
    prof = epsilon(SELECTION, DELTA, Accountant.PROFILE)
    assert prof < 8.0 < best <= rdp
    budget = PrivacyBudget(8.0, DELTA)
    assert not _fixed(budget, Accountant.BEST).would_admit(SELECTION)
    ledger = _fixed(budget, Accountant.PROFILE)
    decision = ledger.try_charge("plan", SELECTION)
    assert decision.admitted
    assert decision.epsilon_after == pytest.approx(prof, rel=1e-9)
    assert ledger.spent() == pytest.approx(prof, rel=1e-9)
    assert ledger.report().epsilon_by_accountant["profile"] == pytest.approx(prof, rel=1e-9)


def test_profile_ledger_composes_a_selection_with_a_final_run(tmp_path: Path) -> None:
    """Spend = min(RDP, PLD, profile composition by δ split) of all charges; the figure never
    exceeds RDP or PLD; a journal replays to the same spend; a refusal changes nothing."""
    final = SubsampledGaussian(2.0, 0.05, 240)
    budget = PrivacyBudget(12.0, DELTA)
    journal = tmp_path / "ledger.journal"
    with _fixed(budget, Accountant.PROFILE, journal) as ledger:
        ledger.charge("plan", SELECTION)
        ledger.charge("final", final)
        both = [SELECTION, final]
        want = min(epsilon(both, DELTA, Accountant.RDP), epsilon(both, DELTA, Accountant.PLD),
                   profile_epsilon(both, DELTA))
        assert ledger.spent() == pytest.approx(want, rel=1e-9)
        assert ledger.spent() <= epsilon(both, DELTA, Accountant.BEST) + 1e-12
        assert ledger.spent() == pytest.approx(epsilon(both, DELTA, Accountant.PROFILE), rel=1e-9)
        before = journal.read_bytes()
        assert not ledger.try_charge("huge", Gaussian(0.5)).admitted
        assert journal.read_bytes() == before
        spent = ledger.spent()
    reopened = PrivacyLedger.open(journal)
    try:
        assert reopened.halting_accountant is Accountant.PROFILE
        assert reopened.spent() == pytest.approx(spent, rel=1e-12)
    finally:
        reopened.close()


def test_profile_ledger_without_selections_is_the_best_ledger() -> None:
    """Charges that all have a PLD: the profile figure is the PLD composition, so PROFILE and
    BEST ledgers admit exactly the same charges with the same spend."""
    budget = PrivacyBudget(3.0, DELTA)
    best, prof = _fixed(budget, Accountant.BEST), _fixed(budget, Accountant.PROFILE)
    trial = SubsampledGaussian(1.2, 0.02, 300)
    while True:
        a = best.try_charge(f"t{len(best.charges())}", trial)
        b = prof.try_charge(f"t{len(prof.charges())}", trial)
        assert a.admitted == b.admitted
        assert a.epsilon_after == pytest.approx(b.epsilon_after, rel=1e-12)
        if not a.admitted:
            break
    assert len(best.charges()) >= 2


@pytest.mark.parametrize("mech", [
    SELECTION,
    RandomStopping(BASE, StoppingDistribution.LOGARITHMIC, 6.0),
    RandomStopping(BASE, StoppingDistribution.POISSON, 6.0),
    [SELECTION, SubsampledGaussian(2.0, 0.05, 240)],
    [SubsampledGaussian(1.0, 0.05, 240), Laplace(0.5)],
], ids=["geometric", "logarithmic", "poisson", "selection+final", "no-selection"])
def test_profile_never_reports_more_than_rdp_pld_or_best(mech: object) -> None:
    figures = {a: epsilon(mech, DELTA, a) for a in Accountant}  # type: ignore[arg-type]
    assert figures[Accountant.PROFILE] <= min(
        figures[Accountant.RDP], figures[Accountant.PLD], figures[Accountant.BEST]
    )


@pytest.mark.parametrize("target", [3.0, pytest.param(8.0, marks=pytest.mark.slow)])
def test_calibration_on_profile_is_what_the_ledger_admits(target: float) -> None:
    """The searcher calibrates σ on DPTuner's fixed-plan rule: profile ε of the plan ≤ target
    and within 1 % of it; a fresh PROFILE ledger admits exactly that plan and refuses the plan
    at a σ just below (1 + 1.5·rtol below)."""
    from raydp_hpo.tune.tuner import _FirstChargeRule

    budget = PrivacyBudget(target, DELTA)
    rule = _FirstChargeRule(budget, Adaptivity.FIXED_PLAN)
    searcher = RandomStoppingSearch(SPACE, metric="val_accuracy", dataset_size=4200, budget=budget,
                                    mean=6.0, seed=0, admissible=rule)
    plan = searcher.privacy_plan().mechanism
    assert isinstance(plan, RandomStopping)
    eps = epsilon(plan, DELTA, Accountant.PROFILE)
    assert 0.99 * target <= eps <= target
    assert epsilon(plan, DELTA, Accountant.RDP) > target  # RDP alone would refuse this σ
    ledger = _fixed(budget, tightest_halting_accountant(Adaptivity.FIXED_PLAN))
    assert ledger.would_admit(plan)
    sigma = searcher._calibrated_sigma  # noqa: SLF001
    assert sigma is not None
    smaller = RandomStopping(
        Composition((SubsampledGaussian(sigma / (1 + 1.5 * CALIBRATION_RTOL), 0.05, 240),
                     Laplace(searcher.score_epsilon))),  # type: ignore[arg-type]
        plan.distribution, 6.0, plan.shape)  # the searcher's (default) law of K
    assert smaller.base.mechanisms[1:] == plan.base.mechanisms[1:]  # type: ignore[union-attr]
    assert not ledger.would_admit(smaller)
