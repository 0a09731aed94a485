"""Papernot–Steinke random stopping, worst case and Koskela–Kulkarni subsampled tuning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.mechanisms import (
    Gaussian,
    PureDP,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
    SubsampledTuning,
    WorstCase,
    mechanism_from_dict,
    mechanism_to_dict,
)
from raydp_hpo.accounting.pure import pure_epsilon
from raydp_hpo.accounting.rdp import (
    DEFAULT_ORDERS,
    MAX_INTEGER_ORDER,
    koskela_kulkarni_rdp,
    rdp_profile,
)
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.coverage import is_covered


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 3.0])
def test_papernot_steinke_closed_form_gaussian_base(eta: float) -> None:
    # Base Q = Gaussian(σ, T) is ρ-zCDP, ρ = T/(2σ²): ε(λ) = ρλ. Thm. 2 minimised over λ̂ in
    # closed form (λ̂* = √(log(1/γ)/ρ)): ε'(λ) = ρλ + (1+η)(2√(ρ log(1/γ)) − ρ) + log(E[K])/(λ−1).
    # Our grid minimises over a finite set of λ̂, so it is ≥ the closed form; within 2%.
    sigma, count, mean = 3.0, 4, 10.0
    rho = count / (2 * sigma**2)
    dist = {
        0.0: StoppingDistribution.LOGARITHMIC,
        1.0: StoppingDistribution.GEOMETRIC,
    }.get(eta, StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL)
    shape = eta if dist is StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL else None
    mech = RandomStopping(Gaussian(sigma, count), dist, mean, shape)
    gamma = rdp_lib._gamma_truncated_negative_binomial(eta, mean)
    lam_hat = math.sqrt(math.log(1 / gamma) / rho)
    assert lam_hat > 1
    ours = rdp_profile(mech).values

    def closed(lam: float) -> float:
        return (
            rho * lam
            + (1 + eta) * (2 * math.sqrt(rho * math.log(1 / gamma)) - rho)
            + math.log(mean) / (lam - 1)
        )

    for lam in (2.0, 8.0, 32.0):
        got = ours[int(np.argmin(np.abs(DEFAULT_ORDERS - lam)))]
        # Monotonicity in λ (applied after Thm. 2) may only lower a value to one of a larger
        # order, so the grid value lies between min_{λ'≥λ} closed(λ') and closed(λ)·1.02.
        floor = min(closed(a) for a in DEFAULT_ORDERS if a >= lam)
        assert floor - 1e-9 <= got <= closed(lam) * 1.02


def test_repeat_and_select_matches_dp_accounting_event() -> None:
    base = SubsampledGaussian(1.0, 0.02, 300)
    acc = rdp_lib.RdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(
        dp_event.RepeatAndSelectDpEvent(
            dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(1.0)), 300
            ),
            mean=8.0,
            shape=1.0,
        )
    )
    ours = rdp_profile(RandomStopping(base, StoppingDistribution.GEOMETRIC, 8.0)).values
    np.testing.assert_allclose(ours, acc.rdp, rtol=1e-9)


@pytest.mark.parametrize(
    ("dist", "shape", "eta"),
    [
        (StoppingDistribution.GEOMETRIC, None, 1.0),
        (StoppingDistribution.LOGARITHMIC, None, 0.0),
        (StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 0.5, 0.5),
    ],
)
def test_pure_dp_base_gives_two_plus_eta(dist, shape, eta) -> None:
    # Papernot & Steinke (2022) Cor. 4: ε-DP base ⇒ (2+η)ε-DP selection.
    mech = RandomStopping(PureDP(0.4), dist, 20.0, shape)
    assert pure_epsilon(mech) == pytest.approx((2 + eta) * 0.4, rel=1e-12)
    assert epsilon(mech, 1e-6) <= (2 + eta) * 0.4 + 1e-12
    # The RDP route approaches the same value at the largest orders (λ, λ̂ → ∞): within 5%.
    assert rdp_profile(mech).values[-1] == pytest.approx((2 + eta) * 0.4, rel=0.05)


def test_poisson_stopping_has_no_pure_bound_but_finite_rdp() -> None:
    mech = RandomStopping(Gaussian(4.0), StoppingDistribution.POISSON, 5.0)
    assert pure_epsilon(mech) is None
    assert math.isfinite(epsilon(mech, 1e-5, Accountant.RDP))


def test_worst_case_is_pointwise_max() -> None:
    a, b = SubsampledGaussian(0.8, 0.01, 500), SubsampledGaussian(1.5, 0.05, 500)
    wc = rdp_profile(WorstCase((a, b))).values
    np.testing.assert_array_equal(wc, np.maximum(rdp_profile(a).values, rdp_profile(b).values))
    assert is_covered(a, WorstCase((a, b))) and is_covered(b, WorstCase((a, b)))
    assert not is_covered(SubsampledGaussian(0.5, 0.05, 500), WorstCase((a, b)))


def _kk(q: float, tuning, final) -> np.ndarray:
    return koskela_kulkarni_rdp(rdp_profile(tuning).values, rdp_profile(final).values, q)


def test_koskela_kulkarni_limits() -> None:
    # The theorem gives ε1(α) as q → 1 and ε2(α) as q → 0 (tolerance 1e-3 relative at
    # q = 1 − 1e-12 and q = 1e-12). Near q = 1 the (1−q)·e^{(α−1)ε2(α)} terms vanish only once
    # 1 − q ≪ e^{−(α−1)ε2(α)}, which a double can represent for small α only: test α ≤ 6 there.
    tuning = RandomStopping(Gaussian(6.0, 2), StoppingDistribution.GEOMETRIC, 5.0)
    final = Gaussian(2.0, 3)
    low = [i for i, a in enumerate(DEFAULT_ORDERS) if a.is_integer() and 2 <= a <= 6]
    ints = [i for i, a in enumerate(DEFAULT_ORDERS) if a.is_integer() and 2 <= a <= 64]
    e1, e2 = rdp_profile(tuning).values, rdp_profile(final).values
    np.testing.assert_allclose(_kk(1 - 1e-12, tuning, final)[low], e1[low], rtol=1e-3)
    np.testing.assert_allclose(_kk(1e-12, tuning, final)[ints], e2[ints], rtol=1e-3)


def test_koskela_kulkarni_independent_formula_alpha_3() -> None:
    # Direct evaluation of the theorem at α = 3 (sum written out), both directions.
    tuning, final, q = Gaussian(3.0, 1), Gaussian(2.0, 1), 0.3
    e1 = {a: a / 18.0 for a in (1, 2, 3)}
    e2 = {a: a / 8.0 for a in (1, 2, 3)}
    a = 3
    fwd = (
        q**3 * math.exp(2 * e1[3])
        + (1 - q) ** 3 * math.exp(2 * e2[3])
        + 3 * q**2 * (1 - q) * math.exp(1 * e1[2]) * math.exp(0 * e2[1])
        + 3 * q * (1 - q) ** 2 * math.exp(0 * e1[1]) * math.exp(1 * e2[2])
    )
    bwd = q * math.exp(2 * e1[3]) + (1 - q) * math.exp(2 * e2[3])
    # reverse direction: the smaller of joint convexity and −log(q e^{−ε₁} + (1−q) e^{−ε₂})
    harmonic = -math.log(q * math.exp(-e1[3]) + (1 - q) * math.exp(-e2[3]))
    expected = max(math.log(fwd) / (a - 1), min(math.log(bwd) / (a - 1), harmonic))
    got = _kk(q, tuning, final)[int(np.argmin(np.abs(DEFAULT_ORDERS - 3)))]
    assert got == pytest.approx(expected, rel=1e-12)


def test_koskela_kulkarni_between_parts_and_cheaper_than_both() -> None:
    tuning = RandomStopping(SubsampledGaussian(1.0, 0.05, 200), StoppingDistribution.GEOMETRIC, 10)
    final = SubsampledGaussian(1.0, 0.05, 200)
    kk = SubsampledTuning(tuning, final, 0.1)
    both = epsilon([tuning, final], 1e-5, Accountant.RDP)
    assert epsilon(kk, 1e-5, Accountant.RDP) < both
    # fractional orders take the next integer's value; above 256 nothing is claimed
    v = rdp_profile(kk).values
    assert np.all(np.isinf(v[DEFAULT_ORDERS > MAX_INTEGER_ORDER]))


def test_mechanism_validation_and_roundtrip() -> None:
    with pytest.raises(InvalidParameterError, match="sample_rate"):
        SubsampledGaussian(1.0, 0.0, 10)
    with pytest.raises(InvalidParameterError, match="steps"):
        SubsampledGaussian(1.0, 0.1, -3)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        SubsampledGaussian(float("nan"), 0.1, 3)
    with pytest.raises(InvalidParameterError, match="unknown stopping distribution"):
        RandomStopping(Gaussian(1.0), "hypergeometric", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="shape"):
        RandomStopping(Gaussian(1.0), StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 3)
    with pytest.raises(InvalidParameterError, match="mean"):
        RandomStopping(Gaussian(1.0), StoppingDistribution.GEOMETRIC, 0.5)
    mech = SubsampledTuning(
        RandomStopping(
            WorstCase((SubsampledGaussian(1.0, 0.1, 5), Gaussian(2.0, 2))),
            StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL,
            4.0,
            2.0,
        ),
        SubsampledGaussian(1.0, 0.1, 5),
        0.2,
    )
    assert mechanism_from_dict(mechanism_to_dict(mech)) == mech
