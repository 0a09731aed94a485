"""A dataset ledger composes whole experiments: admitted when the RDP filter at δ/2 (A) or
basic composition of (εₖ, δₖ) points at δ shares (δ/2)·6/(π²k²) (B) admits
(:mod:`raydp_hpo.ledger.experiments`). The points are checked against dp-accounting's own PLD
accountant, computed here independently of this project's wrappers."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, SubsampledGaussian
from raydp_hpo.ledger.experiments import experiment_delta, experiment_point
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, filter_epsilon

BUDGET = PrivacyBudget(8.0, 1e-5)


def _ledger(journal: Path | None = None, budget: PrivacyBudget = BUDGET) -> PrivacyLedger:
    return PrivacyLedger(budget, journal, adaptivity=Adaptivity.EXPERIMENTS,
                         accountant=Accountant.TIGHTEST)


def _dp_accounting_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε of DP-SGD at ``delta`` by dp-accounting's PLD accountant (add/remove neighbours),
    straight from the library: the independent reference."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    acc.compose(dp_event.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


def test_delta_shares_sum_to_half_delta_and_never_run_out() -> None:
    shares = [experiment_delta(1e-5, k) for k in range(1, 100_001)]
    assert shares[0] == pytest.approx(1e-5 / 2 * 6 / math.pi**2, rel=1e-12)
    assert shares[1] == pytest.approx(shares[0] / 4, rel=1e-12)
    assert math.fsum(shares) < 0.5e-5  # partial sums of 6/(π²k²) stay below 1
    assert math.fsum(shares) > 0.5e-5 * (1 - 1e-4)  # ... and approach it (tail < 6/(π²n))
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        experiment_delta(1e-5, 0)


def test_points_match_dp_accounting_and_the_tighter_rule_halts() -> None:
    """Two DP-SGD experiments charged one after the other: each point (rule B) is its own PLD
    ε at its δ share (dp-accounting, to 1 %); the spend is the smaller of rule B (their sum)
    and rule A (the RDP filter at δ/2 over both curves), each computed independently here.
    One experiment: B is the tighter (its own tightest figure); two: A is."""
    from raydp_hpo.accounting.rdp import rdp_profile

    ledger = _ledger()
    plans = [SubsampledGaussian(1.0, 0.01, 1000), SubsampledGaussian(1.5, 0.02, 500)]
    basic, rdp = 0.0, None
    for k, plan in enumerate(plans, start=1):
        delta_k = experiment_delta(BUDGET.delta, k)
        reference = _dp_accounting_epsilon(plan.noise_multiplier, plan.sample_rate,
                                           plan.steps, delta_k)
        assert ledger.try_charge(f"exp{k}/plan", plan).admitted
        by = ledger.report().epsilon_by_accountant
        eps_k = by["basic_composition"] - basic
        # an upper bound, and tight: within 1 % above dp-accounting's own figure
        assert reference * (1 - 1e-3) <= eps_k <= reference * 1.01
        basic = by["basic_composition"]
        rdp = rdp_profile(plan) if rdp is None else rdp + rdp_profile(plan)
        rule_a = filter_epsilon(rdp, BUDGET.delta / 2)
        assert by["rdp_filter_half_delta"] == pytest.approx(rule_a, rel=1e-9)
        assert ledger.spent() == pytest.approx(min(basic, rule_a), rel=1e-12)
        if k == 1:
            assert basic < rule_a  # one experiment: its own tightest figure wins
            # issue #30's waste: the RDP filter at the whole δ charged far more for it
            assert basic < 0.8 * filter_epsilon(rdp, BUDGET.delta)
    assert rule_a < basic  # two: RDP composes them sub-additively
    assert by["basic_composition_delta"] == pytest.approx(
        experiment_delta(1e-5, 1) + experiment_delta(1e-5, 2), rel=1e-12)


def test_a_reservation_is_its_own_point_and_may_not_exceed_its_delta_share() -> None:
    ledger = _ledger()
    first = experiment_delta(BUDGET.delta, 1)
    too_big = ledger.try_charge("a/point", ApproxDP(1.0, first * 1.01))
    assert not too_big.admitted and math.isinf(too_big.epsilon_after)
    assert ledger.charges() == ()
    assert ledger.try_charge("a/point", ApproxDP(1.0, first)).admitted
    # the second share is a quarter of the first: the first's δ no longer fits
    assert not ledger.try_charge("b/point", ApproxDP(1.0, first)).admitted
    assert ledger.try_charge("b/point", ApproxDP(6.5, experiment_delta(BUDGET.delta, 2)))
    assert ledger.spent() == pytest.approx(7.5)
    refused = ledger.try_charge("c/point", ApproxDP(0.6, experiment_delta(BUDGET.delta, 3)))
    assert not refused.admitted and refused.epsilon_after == pytest.approx(8.1)
    assert experiment_point(ApproxDP(0.5, 1e-7, count=3), 1e-6,
                            Accountant.TIGHTEST) == (1.5, pytest.approx(3e-7))


def test_a_reopened_journal_replays_the_same_points(tmp_path: Path) -> None:
    journal = tmp_path / "data.journal"
    with _ledger(journal) as ledger:
        ledger.charge("e1/point", ApproxDP(2.0, experiment_delta(1e-5, 1)))
        ledger.charge("e2/plan", SubsampledGaussian(2.0, 0.01, 500))
        before = ledger.report()
    with _ledger(journal) as again:
        after = again.report()
        assert after.spent_epsilon == before.spent_epsilon
        assert after.epsilon_by_accountant == before.epsilon_by_accountant
        assert again.try_charge("e1/point", ApproxDP(2.0, experiment_delta(1e-5, 1))).replayed
    assert PrivacyLedger.read_only(journal).report().adaptivity is Adaptivity.EXPERIMENTS


def test_racing_experiments_never_exceed_the_budget_or_share_a_delta() -> None:
    """64 threads reserve points at once, each with the δ share it read before charging: the
    ledger admits each share at most once and never beyond ε (admission is one locked
    check-and-commit); what it admitted equals a sequential replay of its own record."""
    ledger = _ledger(budget=PrivacyBudget(10.0, 1e-5))
    barrier = threading.Barrier(64)

    def reserve(i: int) -> None:
        k = len(ledger.charges()) + 1
        barrier.wait()
        ledger.try_charge(f"exp{i}/point", ApproxDP(0.7, experiment_delta(1e-5, k)))

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    charges = ledger.charges()
    assert 1 <= len(charges) <= 14  # 14 × 0.7 = 9.8 ≤ 10 < 15 × 0.7
    assert ledger.spent() <= 10.0
    deltas = [c.mechanism.delta for c in charges]
    assert all(d <= experiment_delta(1e-5, k) for k, d in enumerate(deltas, start=1))
    replay = _ledger(budget=PrivacyBudget(10.0, 1e-5))
    for c in charges:
        assert replay.try_charge(c.charge_id, c.mechanism).admitted
    assert replay.spent() == pytest.approx(ledger.spent(), rel=1e-12)
