"""Accounting pinned to published and independently computed values (tolerances stated)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from raydp_hpo.accounting.accountants import Accountant, calibrate_noise, delta, epsilon, epsilons
from raydp_hpo.accounting.gdp import compose_mu, gaussian_mu, gdp_delta, gdp_epsilon, gdp_mu
from raydp_hpo.accounting.mechanisms import (
    ApproxDP,
    Composition,
    Gaussian,
    Laplace,
    PureDP,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.accounting.rdp import classic_rdp_to_epsilon, rdp_profile
from raydp_hpo.errors import InvalidParameterError, UnsupportedMechanismError

ABADI = SubsampledGaussian(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14063)


def test_abadi_mnist_classic_rdp_conversion() -> None:
    # Abadi et al. (2016) MNIST: σ=1.1, q=256/60000, 60 epochs (14063 steps), δ=1e-5 → 3.01
    # with the classic RDP conversion (Mironov 2017, Prop. 3). Tolerance: ±0.005 (rounding).
    eps = classic_rdp_to_epsilon(rdp_profile(ABADI).values, 1e-5)
    assert eps == pytest.approx(3.01, abs=0.005)


def test_tf_privacy_reference_value() -> None:
    # TF Privacy compute_dp_sgd_privacy test: n=60000, batch 150, σ=1.3, 15 epochs, δ=1e-5.
    mech = SubsampledGaussian(1.3, 150 / 60000, 15 * 60000 // 150)
    eps = epsilon(mech, 1e-5, Accountant.RDP)
    assert eps == pytest.approx(0.7242234026109595, rel=1e-9)


def test_vectorised_subsampled_gaussian_matches_dp_accounting() -> None:
    # Our vectorised A_α (Mironov et al. 2019) against dp-accounting's reference loop, rel 1e-9.
    from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, subsampled_gaussian_rdp

    for q, sigma in [(0.01, 1.05), (256 / 60000, 1.1), (0.3, 2.0), (1e-4, 0.8)]:
        ours = subsampled_gaussian_rdp(q, sigma)
        ref = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, sigma, list(DEFAULT_ORDERS))
        finite = np.isfinite(ref)
        assert np.array_equal(np.isfinite(ours), finite)
        np.testing.assert_allclose(ours[finite], ref[finite], rtol=1e-9)


def test_pld_not_above_rdp_on_dpsgd_settings() -> None:
    for mech in [
        ABADI,
        SubsampledGaussian(0.8, 0.01, 2000),
        SubsampledGaussian(2.0, 0.05, 500),
        Gaussian(3.0, 10),
    ]:
        assert epsilon(mech, 1e-5, Accountant.PLD) <= epsilon(mech, 1e-5, Accountant.RDP) + 1e-9
        assert epsilon(mech, 1e-5, Accountant.BEST) == min(
            epsilon(mech, 1e-5, Accountant.PLD), epsilon(mech, 1e-5, Accountant.RDP)
        )


def test_pld_gaussian_matches_analytic_gdp() -> None:
    # Gaussian(σ=1) is exactly 1-GDP: ε(δ=1e-5) = 4.37718 (Dong, Roth & Su 2022). The
    # pessimistic PLD must be an upper bound within its discretisation (1e-3 per step): +0.01.
    exact = gdp_epsilon(1.0, 1e-5)
    pld = epsilon(Gaussian(1.0), 1e-5, Accountant.PLD)
    assert exact <= pld <= exact + 0.01


def test_gdp_mu_one() -> None:
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.37718, abs=5e-6)
    assert gdp_delta(1.0, gdp_epsilon(1.0, 1e-5)) <= 1e-5
    assert gdp_mu(gdp_epsilon(1.0, 1e-5), 1e-5) == pytest.approx(1.0, rel=1e-6)


def test_gdp_composition_panda_total_mu() -> None:
    # Panda et al. (2024): μ_t = √(n μ1² + n μ2² + μ_f²).
    n, mu1, mu2, muf = 5, 0.2, 0.4, 1.5
    assert compose_mu([mu1] * n + [mu2] * n + [muf]) == pytest.approx(
        math.sqrt(n * mu1**2 + n * mu2**2 + muf**2), rel=1e-12
    )
    assert gaussian_mu(2.0, 16) == pytest.approx(2.0)


def test_pure_dp_composes_linearly_and_laplace_rdp() -> None:
    eps = epsilon([PureDP(0.1, 5), Laplace(0.2)], 1e-6)
    assert 0.69 <= eps <= 0.7 + 1e-12  # pure basic composition caps every accountant
    assert epsilon(Laplace(0.5, 3), 1e-6, Accountant.RDP) <= 1.5 + 1e-12


def test_approx_dp_basic_composition() -> None:
    # (ε, δ)-only parts compose on the side (basic composition): δ must leave room.
    eps = epsilon([ApproxDP(0.5, 1e-6), Gaussian(5.0)], 1e-5, Accountant.RDP)
    assert eps > 0.5
    assert math.isinf(epsilon(ApproxDP(0.5, 2e-5), 1e-5, Accountant.RDP))


def test_delta_roundtrip_rdp() -> None:
    eps = epsilon(ABADI, 1e-5, Accountant.RDP)
    assert delta(ABADI, eps, Accountant.RDP) <= 1e-5 * (1 + 1e-6)


def test_delta_pld_refuses_non_pld_mechanisms() -> None:
    rs = RandomStopping(Gaussian(4.0), StoppingDistribution.GEOMETRIC, 5)
    with pytest.raises(UnsupportedMechanismError):
        delta(rs, 2.0, Accountant.PLD)
    assert 0 < delta(rs, 2.0, Accountant.BEST) < 1


def test_random_stopping_pld_uses_delta_split() -> None:
    rs = RandomStopping(Gaussian(4.0), StoppingDistribution.GEOMETRIC, 5)
    pld = epsilon(rs, 1e-5, Accountant.PLD)
    # PLD routes it through (ε at δ/2): never below the RDP figure at δ/2.
    assert pld >= epsilon(rs, 0.5e-5, Accountant.RDP) - 1e-9
    assert epsilons(rs, 1e-5)[Accountant.BEST] == min(pld, epsilon(rs, 1e-5, Accountant.RDP))


def test_bad_inputs_name_the_value() -> None:
    with pytest.raises(InvalidParameterError, match="delta"):
        epsilon(ABADI, 1.5)
    with pytest.raises(InvalidParameterError, match="delta"):
        epsilon(ABADI, float("nan"))
    with pytest.raises(InvalidParameterError, match="unknown accountant"):
        epsilon(ABADI, 1e-5, "moments")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="at least one"):
        epsilon([], 1e-5)
    with pytest.raises(InvalidParameterError, match="target_epsilon"):
        calibrate_noise(-1.0, 1e-5, 0.01, 100)


@settings(max_examples=15, deadline=None)
@given(
    target=st.floats(0.3, 10.0),
    q=st.floats(1e-3, 0.2),
    steps=st.integers(10, 3000),
)
def test_calibration_never_overshoots(target: float, q: float, steps: int) -> None:
    sigma = calibrate_noise(target, 1e-5, q, steps, Accountant.RDP)
    eps = epsilon(SubsampledGaussian(sigma, q, steps), 1e-5, Accountant.RDP)
    assert eps <= target
    # and is tight: 1% less noise overshoots or the bracket was already at tolerance (1e-3).
    tighter = epsilon(SubsampledGaussian(sigma * 0.99, q, steps), 1e-5, Accountant.RDP)
    assert tighter > target or sigma < 1e-2


def test_calibration_pld_roundtrip() -> None:
    sigma = calibrate_noise(2.0, 1e-5, 0.01, 1000, Accountant.PLD)
    assert epsilon(SubsampledGaussian(sigma, 0.01, 1000), 1e-5, Accountant.PLD) <= 2.0


def test_composition_equals_sum_of_rdp() -> None:
    a, b = SubsampledGaussian(1.0, 0.01, 100), Gaussian(10.0, 3)
    np.testing.assert_allclose(
        rdp_profile(Composition((a, b))).values,
        rdp_profile(a).values + rdp_profile(b).values,
        rtol=1e-12,
    )


def test_matches_dp_accounting_event_api() -> None:
    # Independent route: dp-accounting's own event composition on its default orders.
    acc = rdp_lib.RdpAccountant()
    acc.compose(
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(1.2)), 800
        )
    )
    ours = epsilon(SubsampledGaussian(1.2, 0.02, 800), 1e-6, Accountant.RDP)
    # Our grid is a superset-ish of orders, so ours can only be tighter (or equal) ± 1e-3.
    assert ours <= acc.get_epsilon(1e-6) + 1e-9
    assert ours == pytest.approx(acc.get_epsilon(1e-6), rel=2e-2)


def test_prv_upper_bound_is_valid_and_tight_for_gaussians() -> None:
    # Gaussian(σ, T) is exactly (√T/σ)-GDP: the PRV upper bound must lie in
    # [exact, exact + eps_error + 1e-3] (prv-accountant's stated error, plus slack for δ_error).
    from raydp_hpo.accounting.prv import PRV_EPS_ERROR, prv_epsilon

    for mech in [Gaussian(1.0), Gaussian(10.0, 200), Gaussian(3.0, 7)]:
        exact = gdp_epsilon(gaussian_mu(mech.noise_multiplier, mech.count), 1e-5)
        upper = prv_epsilon([mech], 1e-5)
        assert upper is not None
        assert exact <= upper <= exact + PRV_EPS_ERROR + 1e-3


def test_prv_not_used_where_one_directional() -> None:
    from raydp_hpo.accounting.prv import prv_epsilon

    # prv-accountant 0.2.0 models one direction of add/remove for the subsampled Gaussian.
    assert prv_epsilon([SubsampledGaussian(1.0, 0.1, 10)], 1e-5) is None
    assert prv_epsilon([RandomStopping(Gaussian(2.0), StoppingDistribution.GEOMETRIC, 3)],
                       1e-5) is None


def test_vectorised_conversion_matches_dp_accounting() -> None:
    # rdp_to_epsilon re-implements dp-accounting's compute_epsilon in numpy: equal to 1e-12.
    from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, rdp_to_epsilon

    for mech in [ABADI, Gaussian(0.5, 3), SubsampledGaussian(5.0, 0.3, 2), PureDP(0.01)]:
        values = rdp_profile(mech).values
        for d in (1e-3, 1e-5, 1e-9):
            ref, _ = rdp_lib.compute_epsilon(DEFAULT_ORDERS, values, d)
            assert rdp_to_epsilon(values, d) == pytest.approx(ref, rel=1e-12, abs=1e-12)


# ------------------------------------------------ Accountant.PROFILE (raydp_hpo.accounting.profiles)


def test_profile_accountant_on_a_lone_selection_and_its_delta() -> None:
    from raydp_hpo.accounting.profiles import random_stopping_epsilon

    rs = RandomStopping(Gaussian(4.0), StoppingDistribution.GEOMETRIC, 5)
    eps = epsilon(rs, 1e-5, Accountant.PROFILE)
    assert eps == random_stopping_epsilon(rs, 1e-5)
    assert eps < epsilon(rs, 1e-5, Accountant.RDP)
    assert eps < epsilon(rs, 1e-5, Accountant.PLD)
    assert delta(rs, eps, Accountant.PROFILE) <= 1e-5
    assert Accountant("profile") is Accountant.PROFILE


def test_profile_accountant_composes_with_a_final_run() -> None:
    from raydp_hpo.accounting.profiles import random_stopping_epsilon

    rs = RandomStopping(Gaussian(4.0), StoppingDistribution.LOGARITHMIC, 10)
    final = Gaussian(3.0)
    got = epsilon([rs, final], 1e-5, Accountant.PROFILE)
    # not below the final run alone; below the PLD accountant, which prices rs by RDP
    assert got >= epsilon(final, 1e-5, Accountant.PLD)
    assert got < epsilon([rs, final], 1e-5, Accountant.PLD)
    # at most basic composition at the δ/2 + δ/2 split (one of the splits it tries), plus
    # PLD discretisation (1e-3 per part)
    basic = random_stopping_epsilon(rs, 0.5e-5) + epsilon(final, 0.5e-5, Accountant.PLD)
    assert got <= basic + 2e-3
    # nested compositions are flattened: the same figure
    assert epsilon(Composition((rs, final)), 1e-5, Accountant.PROFILE) == got
    # no profile (nor PLD) δ for a composition containing a selection: TIGHTEST's δ(ε) falls
    # back to RDP's (it raised before TIGHTEST became the default of delta())
    with pytest.raises(UnsupportedMechanismError):
        delta([rs, final], 2.0, Accountant.PLD)
    assert delta([rs, final], 2.0) == delta([rs, final], 2.0, Accountant.RDP)


def test_profile_accountant_without_a_selection_is_pld_or_rdp() -> None:
    # Without a selection PROFILE is the PLD composition, capped by RDP (min of valid bounds).
    mech = SubsampledGaussian(1.1, 0.01, 200)
    for m in (mech, [mech, Gaussian(5.0)]):
        got = epsilon(m, 1e-5, Accountant.PROFILE)
        assert got == min(epsilon(m, 1e-5, Accountant.PLD), epsilon(m, 1e-5, Accountant.RDP))
    assert delta(mech, 2.0, Accountant.PROFILE) == min(
        delta(mech, 2.0, Accountant.PLD), delta(mech, 2.0, Accountant.RDP)
    )


def test_profile_accountant_never_above_rdp_for_many_selections() -> None:
    # Twenty selections composed: one (εᵢ, δᵢ) point each at δᵢ = s·δ/20 is lossy; the figure
    # is then the RDP composition's (the minimum of valid bounds).
    rs = RandomStopping(Gaussian(8.0), StoppingDistribution.GEOMETRIC, 3)
    got = epsilon([rs] * 20, 1e-5, Accountant.PROFILE)
    assert got <= epsilon([rs] * 20, 1e-5, Accountant.RDP)


def test_profile_accountant_two_pure_selections() -> None:
    # Two selections over a pure ε₀-DP base: each is ε_M-DP by the pure corollary, so the
    # composition is at most 2ε_M (plus PLD rounding, 1e-3 per part), well below P&S's 2·3ε₀.
    from raydp_hpo.accounting.profiles import pure_selection_epsilon, stopping_law

    rs = RandomStopping(PureDP(0.2), StoppingDistribution.GEOMETRIC, 5)
    eps_m = pure_selection_epsilon(0.2, stopping_law(rs))
    got = epsilon([rs, rs], 1e-5, Accountant.PROFILE)
    assert got <= 2 * eps_m + 2e-3
    assert got < 2 * 3 * 0.2


# ------------------------------ Koskela–Kulkarni subsampled tuning: the reverse direction


def _kk_true_divergences(s1: float, s2: float, q: float, alpha: int) -> tuple[float, float]:
    """Exact (to quadrature) D_α both ways for M₁ = N(·, s1²), M₂ = N(·, s2²), sensitivity 1.

    P = M(X) = N(0, s1²) ⊗ N(0, s2²); M(Y) = q·N(1, s1²) ⊗ N(0, s2²) + (1 − q)·N(0, s1²) ⊗
    N(1, s2²), so M(Y)/P = qU(x) + (1 − q)V(y) with U = e^{(2x − 1)/(2s1²)},
    V = e^{(2y − 1)/(2s2²)}. Tensor-product Gauss–Hermite quadrature (200 × 200 nodes).
    """
    nodes, weights = np.polynomial.hermite_e.hermegauss(200)  # ∫ f(z) e^{−z²/2} dz
    w = weights / math.sqrt(2 * math.pi)
    x, y = s1 * nodes, s2 * nodes
    u = np.exp((2 * x - 1) / (2 * s1**2))[:, None]
    v = np.exp((2 * y - 1) / (2 * s2**2))[None, :]
    ratio = q * u + (1 - q) * v
    ww = w[:, None] * w[None, :]
    forward = math.log(float(np.sum(ww * ratio**alpha))) / (alpha - 1)  # D_α(M(Y) ‖ M(X))
    reverse = math.log(float(np.sum(ww * ratio ** (1 - alpha)))) / (alpha - 1)  # D_α(M(X) ‖ M(Y))
    return forward, reverse


@pytest.mark.parametrize("s1", [0.8, 1.5])
@pytest.mark.parametrize("s2", [1.0, 2.5])
@pytest.mark.parametrize("q", [0.05, 0.3])
def test_koskela_kulkarni_bounds_both_true_directions(s1: float, s2: float, q: float) -> None:
    from raydp_hpo.accounting.rdp import koskela_kulkarni_rdp

    kk = koskela_kulkarni_rdp(
        rdp_profile(Gaussian(s1)).values, rdp_profile(Gaussian(s2)).values, q
    )
    for alpha in (2, 3, 5, 10):
        fwd, rev = _kk_true_divergences(s1, s2, q, alpha)
        # the quadrature is exact enough: forward has a closed form by binomial expansion,
        # E[U^k] = e^{k(k−1)/(2s1²)}, E[V^k] = e^{k(k−1)/(2s2²)}
        closed = sum(
            math.comb(alpha, j) * q ** (alpha - j) * (1 - q) ** j
            * math.exp((alpha - j) * (alpha - j - 1) / (2 * s1**2) + j * (j - 1) / (2 * s2**2))
            for j in range(alpha + 1)
        )
        assert fwd == pytest.approx(math.log(closed) / (alpha - 1), rel=1e-6)
        i = int(np.argmin(np.abs(_orders() - alpha)))
        assert max(fwd, rev) <= kk[i] + 1e-9
        e1, e2 = alpha / (2 * s1**2), alpha / (2 * s2**2)
        assert rev <= -math.log(q * math.exp(-e1) + (1 - q) * math.exp(-e2)) + 1e-9


def _orders() -> np.ndarray:
    from raydp_hpo.accounting.rdp import DEFAULT_ORDERS

    return np.asarray(DEFAULT_ORDERS)


def test_koskela_kulkarni_reverse_term_no_longer_dominates() -> None:
    # The example: σ₁ = 0.8 (tuning), σ₂ = 2.5 (final), q = 0.05, α = 5. The old
    # joint-convexity reverse bound was 3.157 (true reverse 0.378, true forward 0.484); the
    # bound is now the forward term's. Fails on the old code (3.157 > 1).
    from raydp_hpo.accounting.rdp import koskela_kulkarni_rdp

    kk = koskela_kulkarni_rdp(rdp_profile(Gaussian(0.8)).values, rdp_profile(Gaussian(2.5)).values, 0.05)
    i = int(np.argmin(np.abs(_orders() - 5)))
    fwd, rev = _kk_true_divergences(0.8, 2.5, 0.05, 5)
    assert rev == pytest.approx(0.378, abs=1e-3) and fwd == pytest.approx(0.484, abs=1e-3)
    assert max(fwd, rev) <= kk[i] < 1.0
