"""Calibration of one-shot releases: Laplace (Dwork et al. 2006) and the analytic Gaussian
mechanism (Balle & Wang 2018, ICML, Thm. 8).

Independent references: δ(ε; σ) evaluated with mpmath at 50 significant digits, dp-accounting's
own exact Gaussian calibration (``dp_accounting.gaussian_mechanism``), its Gaussian privacy loss
(``GaussianPrivacyLoss.get_delta_for_epsilon``) and its PLD ε, and its Laplace privacy loss.
"""

from __future__ import annotations

import math

import mpmath
import pytest
from dp_accounting import gaussian_mechanism as dpa_gaussian
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from dp_accounting.pld import privacy_loss_mechanism as dpa_plm
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raydp_hpo.accounting.calibration import (
    _log_delta_and_error,
    calibrate_analytic_gaussian,
    calibrate_laplace,
    classic_gaussian_sigma,
    gaussian_delta,
    gaussian_log_delta,
)
from raydp_hpo.errors import InvalidParameterError

# (ε, δ, Δ) spanning the range the module promises: ε up to 50, δ down to 1e-12.
GRID = [
    (1e-3, 1e-12, 1.0),
    (0.01, 1e-5, 3.0),
    (0.1, 1e-5, 1.0),
    (0.5, 1e-5, 1.0),
    (1.0, 1e-5, 1.0),
    (1.0, 1e-12, 0.25),
    (3.0, 1e-6, 2.0),
    (8.0, 1e-9, 1.0),
    (20.0, 1e-12, 1.0),
    (50.0, 1e-12, 1.0),
    (2.0, 0.3, 1.0),
]


# σ·(1 − TIGHTNESS) must violate the target: rtol (1e-12) plus the rounding margin η, which is
# < 1e-9 of δ for ε >= 1e-3 (see test_rounding_error_bound_holds); the elasticity of δ in σ is > 1.
TIGHTNESS = 1e-9


def mp_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """δ(ε; σ) of Balle & Wang 2018 Thm. 8 in 50-digit arithmetic (no log-space tricks)."""
    with mpmath.workdps(50):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
        a = d / (2 * s) - e * s / d
        b = -d / (2 * s) - e * s / d
        return float(mpmath.ncdf(a) - mpmath.exp(e) * mpmath.ncdf(b))


# ---------------------------------------------------------------- the exact δ(ε; σ)


@pytest.mark.parametrize("sigma, epsilon, sensitivity", [
    (1.0, 1.0, 1.0), (0.3, 0.0, 1.0), (5.0, 0.2, 2.0), (0.19, 50.0, 1.0), (578.0, 0.01, 1.0),
    (5412.0, 1e-3, 1.0), (0.05, 200.0, 1.0), (10.0, 3.0, 1.0),
])
def test_gaussian_delta_matches_50_digit_reference(sigma, epsilon, sensitivity) -> None:
    """Log-space evaluation vs mpmath: 1e-9 relative, down to δ ~ 1e-300 and up to ε = 200
    (where e^ε·Φ(b) must not overflow)."""
    ref = mp_delta(sigma, epsilon, sensitivity)
    assert ref > 0
    assert gaussian_delta(sigma, epsilon, sensitivity) == pytest.approx(ref, rel=1e-9)


def test_gaussian_delta_matches_dp_accounting_privacy_loss() -> None:
    for sigma, epsilon, sens in [(1.0, 1.0, 1.0), (3.0, 0.5, 2.0), (0.7, 4.0, 0.5)]:
        ref = dpa_plm.GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(epsilon)
        assert gaussian_delta(sigma, epsilon, sens) == pytest.approx(ref, rel=1e-9)


def test_gaussian_delta_is_decreasing_in_sigma_and_scale_free() -> None:
    sigmas = [0.06 * 1.3**k for k in range(40)]  # δ from 1 - 1e-16 down to e^-1.4e6
    log_deltas = [gaussian_log_delta(s, 1.0) for s in sigmas]
    assert all(x > y for x, y in zip(log_deltas, log_deltas[1:]))
    assert log_deltas[-1] < -1000 and gaussian_delta(sigmas[-1], 1.0) == 0.0  # underflow only
    # δ depends on σ/Δ only
    assert gaussian_delta(6.0, 0.7, 2.0) == pytest.approx(gaussian_delta(3.0, 0.7), rel=1e-12)
    # ε = 0: total variation distance 2Φ(Δ/2σ) − 1
    tv = 2 * mpmath.ncdf(0.5) - 1
    assert gaussian_delta(1.0, 0.0) == pytest.approx(float(tv), rel=1e-12)


# ---------------------------------------------------------------- calibration of σ


@pytest.mark.parametrize("epsilon, delta, sensitivity", GRID)
def test_analytic_sigma_is_tight_and_never_overshoots(epsilon, delta, sensitivity) -> None:
    sigma = calibrate_analytic_gaussian(epsilon, delta, sensitivity)
    # as computed here: valid, and equal to δ within 1e-9 relative
    assert gaussian_delta(sigma, epsilon, sensitivity) <= delta
    assert gaussian_delta(sigma, epsilon, sensitivity) >= delta * (1 - 1e-9)
    # against the 50-digit reference: valid (the rounding margin η makes it strict), and
    # minimal within TIGHTNESS (rtol = 1e-12 plus the margin)
    assert mp_delta(sigma, epsilon, sensitivity) <= delta
    smaller = sigma * (1 - TIGHTNESS)
    assert gaussian_delta(smaller, epsilon, sensitivity) > delta
    assert mp_delta(smaller, epsilon, sensitivity) > delta


@pytest.mark.parametrize("epsilon, delta, sensitivity", GRID)
def test_analytic_sigma_matches_dp_accounting_exact_calibration(epsilon, delta,
                                                                sensitivity) -> None:
    """dp-accounting's ``get_sigma_gaussian`` (brentq on the same Thm. 8 equation, Δ = 1,
    xtol 1e-12 absolute): the two agree to 1e-9 relative."""
    ref = dpa_gaussian.get_sigma_gaussian(epsilon, delta) * sensitivity
    assert calibrate_analytic_gaussian(epsilon, delta, sensitivity) == pytest.approx(ref,
                                                                                     rel=1e-9)


@pytest.mark.parametrize("epsilon, delta, sensitivity", [
    (0.1, 1e-5, 1.0), (1.0, 1e-5, 2.0), (1.0, 1e-12, 1.0),
])
def test_pld_epsilon_of_the_calibrated_sigma(epsilon, delta, sensitivity) -> None:
    """dp-accounting's PLD at the returned σ: the optimistic (lower) estimate of ε is ≤ ε (no
    overshoot) and the pessimistic (upper) one is ≥ ε; both within the discretisation interval
    1e-4 of ε (close, so σ is not wastefully large)."""
    interval = 1e-4
    sigma = calibrate_analytic_gaussian(epsilon, delta, sensitivity)
    upper = dpa_pld.from_gaussian_mechanism(
        sigma, sensitivity, pessimistic_estimate=True, value_discretization_interval=interval,
    ).get_epsilon_for_delta(delta)
    lower = dpa_pld.from_gaussian_mechanism(
        sigma, sensitivity, pessimistic_estimate=False, value_discretization_interval=interval,
        use_connect_dots=False,
    ).get_epsilon_for_delta(delta)
    assert lower <= epsilon + 1e-9
    assert upper >= epsilon - 1e-9
    assert epsilon - interval <= lower and upper <= epsilon + interval


def test_known_values() -> None:
    """ε = 1, δ = 1e-5, Δ = 1: σ = 3.7306 (dp-accounting and mpmath agree, tests above); the
    classic formula gives √(2 ln 125000) = 4.8448 for the same target."""
    assert calibrate_analytic_gaussian(1.0, 1e-5) == pytest.approx(3.730632, abs=5e-7)
    assert calibrate_analytic_gaussian(1.0, 1e-5, sensitivity=2.0) == pytest.approx(7.461263,
                                                                                     abs=5e-6)
    assert classic_gaussian_sigma(0.99, 1e-5) * 0.99 == pytest.approx(4.844805, abs=5e-6)


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9, 1e-12])
def test_analytic_sigma_is_smaller_than_the_classic_one(epsilon, delta) -> None:
    """Dwork & Roth 2014 Thm. A.1's σ (valid for ε < 1) is valid but never optimal."""
    classic = classic_gaussian_sigma(epsilon, delta)
    analytic = calibrate_analytic_gaussian(epsilon, delta)
    assert gaussian_delta(classic, epsilon) <= delta  # the classic σ is valid ...
    assert analytic < classic  # ... but the analytic one is smaller


def test_coarser_tolerance_still_never_overshoots() -> None:
    fine = calibrate_analytic_gaussian(1.0, 1e-5)
    coarse = calibrate_analytic_gaussian(1.0, 1e-5, rtol=1e-3)
    assert gaussian_delta(coarse, 1.0) <= 1e-5
    assert fine <= coarse <= fine * (1 + 1e-3)


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(1e-3, 50.0),
    log10_delta=st.floats(-12.0, math.log10(0.5)),
    sensitivity=st.floats(1e-3, 1e3),
)
def test_calibration_never_overshoots_property(epsilon, log10_delta, sensitivity) -> None:
    delta = 10.0**log10_delta
    sigma = calibrate_analytic_gaussian(epsilon, delta, sensitivity)
    assert gaussian_delta(sigma, epsilon, sensitivity) <= delta
    assert mp_delta(sigma, epsilon, sensitivity) <= delta  # exact δ: never overshoots
    assert mp_delta(sigma * (1 - TIGHTNESS), epsilon, sensitivity) > delta


@settings(max_examples=60, deadline=None)
@given(
    log10_epsilon=st.floats(-8.0, 2.5),
    log10_sigma=st.floats(-2.5, 9.0),
    log10_sensitivity=st.floats(-3.0, 3.0),
)
def test_rounding_error_bound_holds(log10_epsilon, log10_sigma, log10_sensitivity) -> None:
    """η bounds the relative error of the computed δ wherever δ >= 1e-300 (the targets a float
    can state), ε from 1e-8 to 300. 10,000 random points measured: error/η <= 0.39."""
    epsilon, sigma, sens = 10.0**log10_epsilon, 10.0**log10_sigma, 10.0**log10_sensitivity
    with mpmath.workdps(50):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sens)
        ref = mpmath.ncdf(d / (2 * s) - e * s / d) - mpmath.exp(e) * mpmath.ncdf(
            -d / (2 * s) - e * s / d)
        assume(ref >= mpmath.mpf("1e-300"))
        log_delta, eta = _log_delta_and_error(sigma, epsilon, sens)
        assert abs(mpmath.exp(log_delta) / ref - 1) <= eta


@pytest.mark.parametrize("epsilon, delta", [(1e-4, 1e-5), (1e-6, 1e-12), (1e-7, 1e-9),
                                            (1e-8, 1e-9)])
def test_tiny_epsilon_stays_valid_by_the_rounding_margin(epsilon, delta) -> None:
    """Far below the documented range the difference of two close normal tails loses up to ~8
    digits. Without the margin η the returned σ overshot the exact δ in these cases (by up to
    8e-9 relative); with it, the exact δ stays below the target and σ grows by < 1e-6."""
    sigma = calibrate_analytic_gaussian(epsilon, delta)
    assert mp_delta(sigma, epsilon) <= delta
    assert mp_delta(sigma * (1 - 1e-6), epsilon) > delta


# ---------------------------------------------------------------- Laplace


@pytest.mark.parametrize("epsilon, sensitivity", [
    (1.0, 1.0), (0.5, 2.0), (0.1, 1.0), (3.0, 0.7), (1e-3, 1e3), (50.0, 0.3),
])
def test_laplace_scale_is_sensitivity_over_epsilon(epsilon, sensitivity) -> None:
    b = calibrate_laplace(epsilon, sensitivity)
    assert b == pytest.approx(sensitivity / epsilon, rel=1e-15)
    assert sensitivity / b <= epsilon  # worst-case privacy loss Δ₁/b, rounded toward privacy
    # dp-accounting's Laplace privacy loss: (ε, 0)-DP at b, not at 0.99ε
    loss = dpa_plm.LaplacePrivacyLoss(b, sensitivity=sensitivity)
    assert loss.get_delta_for_epsilon(epsilon) <= 1e-15
    assert loss.get_delta_for_epsilon(0.99 * epsilon) > 0


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, name", [
    ({"epsilon": 0.0, "delta": 1e-5}, "epsilon"),
    ({"epsilon": -1.0, "delta": 1e-5}, "epsilon"),
    ({"epsilon": math.nan, "delta": 1e-5}, "epsilon"),
    ({"epsilon": math.inf, "delta": 1e-5}, "epsilon"),
    ({"epsilon": 1.0, "delta": 0.0}, "delta"),
    ({"epsilon": 1.0, "delta": 1.0}, "delta"),
    ({"epsilon": 1.0, "delta": math.nan}, "delta"),
    ({"epsilon": 1.0, "delta": 1e-5, "sensitivity": 0.0}, "sensitivity"),
    ({"epsilon": 1.0, "delta": 1e-5, "sensitivity": -2.0}, "sensitivity"),
    ({"epsilon": 1.0, "delta": 1e-5, "sensitivity": math.nan}, "sensitivity"),
    ({"epsilon": 1.0, "delta": 1e-5, "rtol": 0.5}, "rtol"),
    ({"epsilon": True, "delta": 1e-5}, "epsilon"),
])
def test_gaussian_bad_inputs_name_the_value(kwargs, name) -> None:
    with pytest.raises(InvalidParameterError) as info:
        calibrate_analytic_gaussian(**kwargs)
    assert f"{name}={kwargs[name]!r}" in str(info.value)


@pytest.mark.parametrize("epsilon, sensitivity, name", [
    (0.0, 1.0, "epsilon"), (-0.5, 1.0, "epsilon"), (math.nan, 1.0, "epsilon"),
    (1.0, 0.0, "sensitivity"), (1.0, -1.0, "sensitivity"), (1.0, math.nan, "sensitivity"),
    (1.0, math.inf, "sensitivity"),
])
def test_laplace_bad_inputs_name_the_value(epsilon, sensitivity, name) -> None:
    with pytest.raises(InvalidParameterError) as info:
        calibrate_laplace(epsilon, sensitivity)
    value = epsilon if name == "epsilon" else sensitivity
    assert f"{name}={value!r}" in str(info.value)


def test_laplace_scale_outside_float_range_is_refused() -> None:
    for epsilon, sensitivity in ((1e10, 1e-320), (1e-10, 1e300)):
        with pytest.raises(InvalidParameterError, match="outside the float range"):
            calibrate_laplace(epsilon, sensitivity)


def test_classic_formula_refuses_epsilon_at_least_one() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon=1.5"):
        classic_gaussian_sigma(1.5, 1e-5)


def test_gaussian_delta_bad_inputs() -> None:
    with pytest.raises(InvalidParameterError, match="sigma=0.0"):
        gaussian_delta(0.0, 1.0)
    with pytest.raises(InvalidParameterError, match="epsilon=-1.0"):
        gaussian_delta(1.0, -1.0)
