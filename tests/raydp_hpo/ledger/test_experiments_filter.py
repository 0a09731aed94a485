"""A ledger that composes whole experiments: admitted when the RDP filter at δ_A (A) or
basic composition of (εₖ, δₖ) points at δ shares δₖ (B) admits, δ split by the ledger's
:class:`DeltaSplit` (:mod:`raydp_hpo.ledger.experiments`). The points are checked against dp-accounting's own PLD
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
from raydp_hpo.errors import LedgerMismatchError
from raydp_hpo.ledger.experiments import (
    DeltaSplit,
    experiment_delta,
    experiment_point,
    filter_delta,
)
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


@pytest.mark.parametrize("split", list(DeltaSplit))
def test_delta_shares_and_rule_a_never_exceed_delta_and_never_run_out(split: DeltaSplit) -> None:
    """The proof needs δ_A + Σₖ δₖ ≤ δ on every path, however many charges."""
    shares = [experiment_delta(1e-5, k, split) for k in range(1, 100_001)]
    total = filter_delta(1e-5, split) + math.fsum(shares)
    assert total < 1e-5
    assert total > 1e-5 * (1 - 1e-4) if split is DeltaSplit.FIRST_HEAVY else True
    assert all(b < a for a, b in zip(shares, shares[1:]))  # never zero, always shrinking
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        experiment_delta(1e-5, 0, split)


def test_the_splits_are_what_the_docstring_states() -> None:
    halves, heavy = DeltaSplit.HALVES, DeltaSplit.FIRST_HEAVY
    assert filter_delta(1e-5, halves) == 0.5e-5
    assert experiment_delta(1e-5, 1, halves) == pytest.approx(1e-5 / 2 * 6 / math.pi**2,
                                                              rel=1e-12)
    assert experiment_delta(1e-5, 2, halves) == pytest.approx(
        experiment_delta(1e-5, 1, halves) / 4, rel=1e-12)
    assert filter_delta(1e-5, heavy) == pytest.approx(0.21e-5, rel=1e-12)
    assert experiment_delta(1e-5, 1, heavy) == pytest.approx(0.78e-5, rel=1e-12)
    assert experiment_delta(1e-5, 2, heavy) == pytest.approx(0.01e-5 * 6 / math.pi**2,
                                                             rel=1e-12)
    assert experiment_delta(1e-5, 3, heavy) == pytest.approx(
        experiment_delta(1e-5, 2, heavy) / 4, rel=1e-12)
    assert experiment_delta(1e-5, 1) == experiment_delta(1e-5, 1, heavy)  # the latest


def test_the_first_experiment_loses_at_most_3_percent_against_the_whole_delta() -> None:
    """Issue #38: a plan admitted as the first experiment is priced at δ₁; the halves split's
    δ₁ = 0.30δ cost 9-10 %, the first-heavy split's δ₁ = 0.78δ must cost at most 3 % (one-shot
    DP-SGD and random stopping as the built-in searchers calibrate them at ε = 3)."""
    from raydp_hpo.accounting.accountants import calibrate_plan, epsilon
    from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution

    plans = {
        "one_shot": lambda s: SubsampledGaussian(s, 0.05, 20),
        "random_stopping": lambda s: RandomStopping(SubsampledGaussian(s, 0.05, 20),
                                                    StoppingDistribution.GEOMETRIC, 2.0),
    }
    for name, plan_of in plans.items():
        for split, most in ((DeltaSplit.FIRST_HEAVY, 0.03), (DeltaSplit.HALVES, 0.12)):
            delta_1 = experiment_delta(1e-5, 1, split)
            sigma = calibrate_plan(plan_of, 3.0, delta_1, Accountant.TIGHTEST, tolerance=1e-4,
                                   max_noise_multiplier=100.0, what=name)
            at_whole = epsilon(plan_of(sigma), 1e-5, Accountant.TIGHTEST)
            at_point = epsilon(plan_of(sigma), delta_1, Accountant.TIGHTEST)
            loss = 1 - at_whole / at_point
            assert loss <= most, (name, split, loss)
            if split is DeltaSplit.HALVES:
                assert loss > 0.05  # the halves split's first point did lose more than 3 %


def test_a_journal_from_before_splits_keeps_the_halves_split(tmp_path: Path) -> None:
    """tests/raydp_hpo/ledger/data/experiments_halves.journal was written by the code before
    issue #38 (its header has no ``delta_split``): reopened, it replays and admits under the
    halves split it was admitted under (its recorded ε_after are reproduced), while a new
    journal states the first-heavy split in its header."""
    import shutil

    src = Path(__file__).parent / "data" / "experiments_halves.journal"
    journal = tmp_path / src.name
    for suffix in ("", ".seal"):
        shutil.copy(str(src) + suffix, str(journal) + suffix)
    from raydp_hpo.ledger.journal import read_header

    assert "delta_split" not in read_header(journal)
    old = PrivacyLedger.open(journal)
    try:
        assert old.delta_split is DeltaSplit.HALVES
        by = old.report().epsilon_by_accountant
        assert by["basic_composition_delta"] == pytest.approx(
            experiment_delta(1e-5, 1, DeltaSplit.HALVES)
            + experiment_delta(1e-5, 2, DeltaSplit.HALVES), rel=1e-12)
        # the same figure it recorded when it admitted its last charge (1.8251 at the time)
        assert old.spent() == pytest.approx(old.charges()[-1].epsilon_after, rel=1e-9)
    finally:
        old.close()
    with _ledger(journal, PrivacyBudget(3.0, 1e-5)) as again:  # no split given: the journal's
        assert again.delta_split is DeltaSplit.HALVES
    with pytest.raises(LedgerMismatchError, match="delta_split"):
        PrivacyLedger(PrivacyBudget(3.0, 1e-5), journal, adaptivity=Adaptivity.EXPERIMENTS,
                      accountant=Accountant.TIGHTEST, delta_split=DeltaSplit.FIRST_HEAVY)
    fresh = tmp_path / "new.journal"
    with _ledger(fresh) as new:
        assert new.delta_split is DeltaSplit.FIRST_HEAVY
    assert read_header(fresh)["delta_split"] == "first-heavy"
    assert PrivacyLedger.read_only(fresh).delta_split is DeltaSplit.FIRST_HEAVY
    with pytest.raises(ValueError, match="only for adaptivity"):
        PrivacyLedger(BUDGET, adaptivity=Adaptivity.ADAPTIVE, delta_split=DeltaSplit.HALVES)


def test_points_match_dp_accounting_and_the_tighter_rule_halts() -> None:
    """Two DP-SGD experiments charged one after the other: each point (rule B) is its own PLD
    ε at its δ share (dp-accounting, to 1 %); the spend is the smaller of rule B (their sum)
    and rule A (the RDP filter at δ_A over both curves), each computed independently here.
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
        rule_a = filter_epsilon(rdp, BUDGET.delta * 0.21)
        assert by["rdp_filter_split_delta"] == pytest.approx(rule_a, rel=1e-9)
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
    # the second share is far below the first: the first's δ no longer fits
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


def test_ledger_show_separates_the_figures_that_halt_and_prints_delta_as_delta() -> None:
    """Issue #38: ``ledger show`` listed the fixed-sequence rdp / pld figures beside the spend
    as if they halted, and the basic composition's δ as "ε=0.0000"."""
    ledger = _ledger(budget=PrivacyBudget(3.0, 1e-5))
    ledger.charge("e1/point", SubsampledGaussian(1.2, 0.05, 20))
    ledger.charge("e2/point", SubsampledGaussian(3.0, 0.05, 20))
    text = ledger.report().format()
    halting, info = text.split("shown for information only")
    basic = ledger.report().epsilon_by_accountant["basic_composition_delta"]
    assert "(B) basic composition of points" in halting and f"at δ={basic:.3g}" in halting
    assert "(A) RDP filter, adaptive" in halting and "at δ=2.1e-06" in halting
    assert "ε=0.0000" not in text
    assert "rdp (valid for fixed sequences only)" in info
    assert "pld (valid for fixed sequences only)" in info
    assert "rdp" not in halting.split("decides on")[1].replace("RDP", "")
    assert "(δ split first-heavy)" in text


def test_a_split_this_version_does_not_know_is_refused_by_name() -> None:
    from raydp_hpo.ledger.experiments import split_of_header

    assert split_of_header({"adaptivity": "experiments"}) is DeltaSplit.HALVES
    assert split_of_header({"delta_split": "first-heavy"}) is DeltaSplit.FIRST_HEAVY
    with pytest.raises(LedgerMismatchError, match="delta_split='thirds'.*does not know"):
        split_of_header({"delta_split": "thirds"})
