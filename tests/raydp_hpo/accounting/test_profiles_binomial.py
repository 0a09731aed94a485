"""Binomial K in random stopping: the spec, its RDP/pure bound and its privacy-profile figure."""

from __future__ import annotations

import pytest

from raydp_hpo.accounting import profiles as pr
from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Laplace,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
    mechanism_from_dict,
    mechanism_to_dict,
)
from raydp_hpo.accounting.pure import pure_epsilon
from raydp_hpo.accounting.rdp import rdp_profile
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger

BIN = StoppingDistribution.BINOMIAL
REF = SubsampledGaussian(1.0, 0.01, 1000)  # the digest's reference base
DELTA = 1e-5


@pytest.mark.parametrize("shape", [None, 2.5, 5.0, float("inf"), True, "20"])
def test_binomial_needs_an_integer_number_of_draws_at_least_the_mean(shape: object) -> None:
    with pytest.raises(InvalidParameterError, match="shape"):
        RandomStopping(Laplace(1.0), BIN, 10.0, shape)  # type: ignore[arg-type]


def test_binomial_spec_round_trips_and_names_its_law() -> None:
    rs = RandomStopping(REF, BIN, 10.0, 40)
    assert rs.trials == 40 and rs.shape == 40.0
    assert mechanism_from_dict(mechanism_to_dict(rs)) == rs
    assert pr.stopping_law(rs) == pr.binomial_law(40, 0.25)
    with pytest.raises(InvalidParameterError, match="trials"):
        _ = rs.eta


def test_binomial_rdp_and_pure_bounds_are_the_m_fold_composition() -> None:
    """Best of K ≤ m runs post-processes m runs: RDP m·ε(α), pure m·ε₀ (exact multiples)."""
    rs = RandomStopping(REF, BIN, 10.0, 40)
    assert (rdp_profile(rs).values == 40 * rdp_profile(REF).values).all()
    assert pure_epsilon(RandomStopping(Laplace(0.3), BIN, 2.0, 4)) == pytest.approx(1.2)


def test_binomial_profile_figure_near_poisson_and_far_below_rdp() -> None:
    """Bin(m, 10/m) → Poisson(10) as m grows: at m = 1000 the profile figure is within 2 % of
    Poisson's (3.742 pinned in test_profiles) and never above it by more than that; RDP's
    m-fold bound is ~17× larger. PROFILE ≤ RDP, PLD, BEST."""
    rs = RandomStopping(REF, BIN, 10.0, 1000)
    figures = {a: epsilon(rs, DELTA, a) for a in Accountant}
    poisson = epsilon(RandomStopping(REF, StoppingDistribution.POISSON, 10.0), DELTA,
                      Accountant.PROFILE)
    assert figures[Accountant.PROFILE] == pytest.approx(poisson, rel=0.02)
    assert figures[Accountant.PROFILE] <= min(figures[a] for a in Accountant)
    assert figures[Accountant.RDP] > 10 * figures[Accountant.PROFILE]


def test_binomial_selection_admitted_on_profile_ledger_and_priced_by_rdp_filter() -> None:
    """A fixed-plan PROFILE ledger admits it at its profile figure; the adaptive RDP filter
    accepts it too (valid m-fold RDP curve) but at the much larger composition cost."""
    rs = RandomStopping(REF, BIN, 10.0, 100)
    budget = PrivacyBudget(5.0, DELTA)
    fixed = PrivacyLedger(budget, adaptivity=Adaptivity.FIXED_PLAN, accountant=Accountant.PROFILE)
    assert fixed.try_charge("plan", rs).admitted
    adaptive = PrivacyLedger(budget)
    assert not adaptive.try_charge("plan", rs).admitted
    assert adaptive.charges() == ()
