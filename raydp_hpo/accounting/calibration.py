"""Noise calibration for one-shot releases: the Laplace and the analytic Gaussian mechanism.

A one-shot release publishes ``f(D) + noise`` once (a test accuracy, a count, a score). This
module answers "how much noise for a target (ε, δ)?" for the two classic additive mechanisms.

* **Laplace** (Dwork, McSherry, Nissim & Smith 2006, "Calibrating Noise to Sensitivity in
  Private Data Analysis", TCC 2006, Prop. 1; Dwork & Roth 2014, Thm. 3.6): if ``f`` has ℓ₁
  sensitivity Δ₁, adding Lap(b) noise with scale ``b = Δ₁/ε`` to each coordinate is ε-DP.
* **Analytic Gaussian** (Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential
  Privacy: Analytical Calibration and Optimal Denoising", ICML 2018, Thm. 8 and Algorithm 1):
  if ``f`` has ℓ₂ sensitivity Δ, the mechanism ``f(D) + N(0, σ² I)`` is (ε, δ)-DP **iff**

      δ(ε; σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ) ≤ δ,

  where Φ is the standard normal CDF. δ(ε; σ) is strictly decreasing in σ, so the smallest σ
  meeting the condition is the exact (optimal) calibration. The classic calibration
  σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm. A.1) is only valid for ε < 1 and is
  always larger than the analytic σ; see :func:`classic_gaussian_sigma`.

:func:`calibrate_search` answers the same question for a whole search plan (DP-SGD trials,
a random-stopping search, ...) built from one noise multiplier; it uses the accountants of
:mod:`raydp_hpo.accounting.accountants`, imported when called.

Layer: privacy core (numpy/scipy only; no torch, no Ray).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import erfcx, log_ndtr

from raydp_hpo._validation import nonnegative_float, open_unit_float, positive_float
from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.errors import InvalidParameterError

if TYPE_CHECKING:
    from raydp_hpo.accounting.mechanisms import Mechanism

__all__ = [
    "DEFAULT_SIGMA_RTOL",
    "calibrate_laplace",
    "calibrate_analytic_gaussian",
    "calibrate_search",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_log_delta",
]

#: Default relative tolerance of the bisection in :func:`calibrate_analytic_gaussian` (the
#: rounding margin comes on top of it; see there).
DEFAULT_SIGMA_RTOL = 1e-12

_UNIT_ROUNDOFF = float(np.finfo(float).eps) / 2.0
_TINY = float(np.finfo(float).tiny)  # smallest normal float
_SQRT2 = math.sqrt(2.0)
_LOG_HALF = math.log(0.5)
_MIN_RTOL = 4 * float(np.finfo(float).eps)
_MAX_BRACKET_STEPS = 2200  # factor-2 steps: covers every positive float from any start


def calibrate_laplace(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale ``b`` of Laplace noise that makes a release with ℓ₁ sensitivity Δ₁ ε-DP.

    ``b = Δ₁ / ε`` (Dwork, McSherry, Nissim & Smith 2006, TCC, Prop. 1; Dwork & Roth 2014,
    Thm. 3.6): the privacy loss of ``f(D) + Lap(b)`` is at most ``Δ₁/b = ε`` for every output.
    The returned float is rounded up when ``Δ₁/ε`` is not exactly representable, so that
    ``sensitivity / b <= epsilon`` holds in floating point too (round toward more privacy).

    >>> calibrate_laplace(0.5, sensitivity=2.0)
    4.0

    Raises:
        InvalidParameterError: ε or Δ₁ is not a finite number > 0.
    """
    eps = positive_float("epsilon", epsilon)
    sens = positive_float("sensitivity", sensitivity)
    scale = sens / eps
    if not math.isfinite(scale) or scale < _TINY:
        raise InvalidParameterError(
            f"sensitivity/epsilon = {sens!r}/{eps!r} is outside the float range; rescale the "
            "statistic"
        )
    while sens / scale > eps:  # at most a step or two of one ulp
        scale = math.nextafter(scale, math.inf)
    return scale


def gaussian_log_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """``log δ(ε; σ)`` of the Gaussian mechanism (Balle & Wang 2018, ICML, Thm. 8).

    With ``a = Δ/(2σ) − εσ/Δ`` and ``b = −Δ/(2σ) − εσ/Δ``: for ``a <= 0`` (small δ),
    ``δ = ½ e^{−a²/2} (erfcx(−a/√2) − erfcx(−b/√2))``, which uses ``b² − a² = 2ε`` to cancel
    ``e^ε`` exactly; for ``a > 0``, ``log δ = log Φ(a) + log1p(−exp(ε + log Φ(b) − log Φ(a)))``
    with ``scipy.special.log_ndtr``. Neither ``e^ε`` nor the normal tails overflow or underflow
    (ε up to hundreds, δ down to 1e-300). Relative accuracy of δ, against 50-digit mpmath:
    better than 1e-9 for ε >= 1e-3 (tested); it degrades as ε → 0 (the difference of two close
    tails), which the calibration covers with a rounding-error margin. Returns ``-inf`` where
    δ(ε; σ) underflows to 0.
    """
    sig = positive_float("sigma", sigma)
    eps = nonnegative_float("epsilon", epsilon)
    sens = positive_float("sensitivity", sensitivity)
    return _log_delta(sig, eps, sens)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact δ(ε) of the Gaussian mechanism ``f(D) + N(0, σ²I)`` with ℓ₂ sensitivity Δ.

    By Balle & Wang 2018 (ICML, Thm. 8), the mechanism is (ε, δ)-DP iff ``δ >= δ(ε; σ)`` with

        δ(ε; σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ).

    The privacy loss of the Gaussian mechanism is symmetric in the two neighbour directions
    (both are N(Δ²/(2σ²), Δ²/σ²)), so this one expression is the privacy profile for both.
    Computed in log space (:func:`gaussian_log_delta`).

    >>> round(gaussian_delta(1.0, 1.0), 4)
    0.1269
    """
    return float(math.exp(gaussian_log_delta(sigma, epsilon, sensitivity)))


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The classic calibration ``σ = Δ·√(2 ln(1.25/δ))/ε`` (Dwork & Roth 2014, Thm. A.1).

    Valid (a sufficient condition for (ε, δ)-DP) only for ε < 1, and never tight: the analytic
    σ of :func:`calibrate_analytic_gaussian` is smaller. Kept for comparison only.

    Raises:
        InvalidParameterError: ε not in (0, 1), δ not in (0, 1) or Δ not a finite number > 0.
    """
    eps = open_unit_float("epsilon", epsilon)
    dlt = open_unit_float("delta", delta)
    sens = positive_float("sensitivity", sensitivity)
    return sens * math.sqrt(2.0 * math.log(1.25 / dlt)) / eps


def calibrate_analytic_gaussian(
    epsilon: float,
    delta: float,
    sensitivity: float = 1.0,
    rtol: float = DEFAULT_SIGMA_RTOL,
) -> float:
    """Smallest σ making ``f(D) + N(0, σ²I)`` (ε, δ)-DP for ℓ₂ sensitivity Δ — analytic Gaussian.

    Balle & Wang 2018 (ICML, Thm. 8) give the exact condition ``δ(ε; σ) <= δ`` with

        δ(ε; σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε · Φ(−Δ/(2σ) − εσ/Δ),

    strictly decreasing in σ (their Algorithm 1 solves the same equation after the change of
    variables ``σ = (√(2+u) + √u)·Δ/ε`` shown in the lecture notes). Here it is solved by
    bisection on σ directly, with δ(ε; σ) computed stably in log space
    (:func:`gaussian_log_delta`), which works for ε up to hundreds and δ down to 1e-300.

    Guarantees (round toward more privacy):

    * ``gaussian_delta(σ, ε, Δ) <= δ`` holds for the returned σ exactly as computed here, and
      so does ``δ·(1 + η) <= target``, η a bound on the relative rounding error of the
      computed δ (checked against mpmath in the tests), so the *exact* δ(ε; σ) does not exceed
      the target either;
    * a σ' >= σ/(1 + rtol) was found to fail that check, so σ exceeds the exact minimum by at
      most ``rtol`` plus the margin η's share: < 1e-9 relative for ε >= 1e-3 (tested), more
      only as ε → 0 (< 1e-6 down to ε = 1e-8).

    Compared with the classic ``σ = Δ·√(2 ln(1.25/δ))/ε`` (Dwork & Roth 2014, Thm. A.1, valid
    only for ε < 1), the analytic σ is always smaller (e.g. ε = 0.5, δ = 1e-5: 7.03 vs 9.69) and
    is valid for every ε > 0.

    >>> round(calibrate_analytic_gaussian(1.0, 1e-5), 3)
    3.731

    Args:
        epsilon: target ε > 0 (finite).
        delta: target δ in (0, 1).
        sensitivity: ℓ₂ sensitivity Δ > 0 of the released statistic.
        rtol: relative tolerance of the bisection, in [4·machine-ε, 1e-2].

    Raises:
        InvalidParameterError: a parameter is out of range (the message names it).
    """
    eps = positive_float("epsilon", epsilon)
    dlt = open_unit_float("delta", delta)
    sens = positive_float("sensitivity", sensitivity)
    tol = positive_float("rtol", rtol)
    if not _MIN_RTOL <= tol <= 1e-2:
        raise InvalidParameterError(f"rtol must be in [{_MIN_RTOL:.3g}, 0.01], got rtol={rtol!r}")

    def ok(sigma: float) -> bool:
        # valid as computed, and with the rounding-error bound η added (never overshoot)
        log_delta, eta = _log_delta_and_error(sigma, eps, sens)
        value = math.exp(log_delta)
        return value <= dlt and value * (1.0 + eta) <= dlt

    # Bracket [lo, hi]: lo violates, hi satisfies. Start near the classic guess.
    guess = sens * math.sqrt(2.0 * math.log(1.25 / dlt)) / eps
    lo = hi = guess
    if ok(guess):
        for _ in range(_MAX_BRACKET_STEPS):
            lo = lo / 2.0
            if lo == 0.0 or not ok(lo):
                break
            hi = lo
    else:
        for _ in range(_MAX_BRACKET_STEPS):
            hi = hi * 2.0
            if not math.isfinite(hi) or ok(hi):
                break
            lo = hi
    if lo == 0.0 or not math.isfinite(hi) or not ok(hi) or ok(lo):
        raise InvalidParameterError(
            f"no σ in the float range calibrates epsilon={epsilon!r}, delta={delta!r}, "
            f"sensitivity={sensitivity!r}; rescale the statistic"
        )
    # Bisection (geometric mean while the bracket spans orders of magnitude); the invariant
    # ok(hi) and not ok(lo) is kept, so hi is always a valid (ε, δ) calibration.
    while hi - lo > tol * lo:
        mid = math.sqrt(lo * hi) if hi > 4.0 * lo else 0.5 * (lo + hi)
        if not lo < mid < hi:  # adjacent floats
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_search(
    plan_of: Callable[[float], Mechanism | Sequence[Mechanism]],
    target_epsilon: float,
    delta: float,
    accountant: Accountant | str = Accountant.TIGHTEST,
    *,
    tolerance: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest noise multiplier σ (to within ``tolerance``, relative) such that the whole
    search plan ``plan_of(σ)`` is (``target_epsilon``, ``delta``)-DP under ``accountant``
    (default ``Accountant.TIGHTEST``, the tightest valid figure for a fixed plan).

    ``plan_of`` builds the plan from σ — one mechanism or a list composed — and must be
    deterministic and monotone (more noise never raises ε), e.g. a random-stopping search
    over DP-SGD trials::

        calibrate_search(lambda s: RandomStopping(SubsampledGaussian(s, q, T),
                                                  StoppingDistribution.GEOMETRIC, mean=10),
                         target_epsilon=3.0, delta=1e-5)

    The same bisection as :func:`~raydp_hpo.accounting.accountants.calibrate_noise`
    (:func:`~raydp_hpo.accounting.accountants.calibrate_plan`). Guarantee: ``epsilon(plan_of(σ),
    delta, accountant) <= target_epsilon`` for the returned σ — it is the upper end of the final
    bracket ("round toward more privacy") and is checked again after the search; a σ smaller by
    the factor ``1 + tolerance`` was found not to fit (or σ is at the 1e-3 floor's bisection
    limit). A fixed-plan figure is valid only for a plan fixed before any data is seen: an
    adaptively chosen plan must be calibrated with ``Accountant.RDP``.

    >>> from raydp_hpo.accounting.accountants import epsilon
    >>> from raydp_hpo.accounting.mechanisms import (RandomStopping, StoppingDistribution,
    ...                                              SubsampledGaussian)
    >>> def plan(s):
    ...     return RandomStopping(SubsampledGaussian(s, 0.01, 1000),
    ...                           StoppingDistribution.GEOMETRIC, mean=10)
    >>> sigma = calibrate_search(plan, 3.0, 1e-5)
    >>> round(sigma, 2), epsilon(plan(sigma), 1e-5) <= 3.0
    (0.97, True)

    Raises:
        InvalidParameterError: a bad target, δ, tolerance or accountant, ``plan_of`` not
            callable, or no σ up to ``max_noise_multiplier`` reaches the target (a plan whose
            ε does not fall to the target as σ grows, e.g. a part without noise).
        RayDPHPOError: the plan at the returned σ fails the final check (``plan_of`` is not
            deterministic).
    """
    from raydp_hpo._validation import coerce_enum
    from raydp_hpo.accounting.accountants import _warn_if_deprecated, calibrate_plan

    if not callable(plan_of):
        raise InvalidParameterError(
            f"plan_of must be a function from the noise multiplier to the plan's mechanism(s), "
            f"got {plan_of!r}"
        )
    target = positive_float("target_epsilon", target_epsilon)
    dlt = open_unit_float("delta", delta)
    tol = positive_float("tolerance", tolerance)
    top = positive_float("max_noise_multiplier", max_noise_multiplier)
    acc = coerce_enum(Accountant, accountant, "accountant")
    _warn_if_deprecated(acc)
    return calibrate_plan(plan_of, target, dlt, acc, tolerance=tol, max_noise_multiplier=top,
                          what="the search plan")


def _log_delta(sigma: float, eps: float, sens: float) -> float:
    """log δ(ε; σ) of Balle & Wang 2018, Thm. 8, for validated inputs."""
    return _log_delta_and_error(sigma, eps, sens)[0]


def _log_delta_and_error(sigma: float, eps: float, sens: float) -> tuple[float, float]:
    """``(log δ(ε; σ), η)``: the computed value and a bound η on its relative rounding error.

    Two evaluations of the same expression, chosen by the sign of ``a = r/2 − εσ/Δ``
    (``r = Δ/σ``):

    * ``a <= 0`` (the regime of small δ): with ``t₁ = −a``, ``t₂ = −b = t₁ + r`` and
      ``Φ(−t) = ½ e^{−t²/2} erfcx(t/√2)``, the identity ``t₂²/2 − t₁²/2 = ε`` cancels ``e^ε``
      exactly: ``δ = ½ e^{−t₁²/2} (erfcx(t₁/√2) − erfcx(t₂/√2))``. No large terms cancel; the
      only loss is the difference of two close erfcx values, ≈ ``u·erfcx(t₁/√2)/difference``.
    * ``a > 0``: ``log Φ(a) + log1p(−exp(ε + log Φ(b) − log Φ(a)))`` with ``log_ndtr``; the
      error is that of the log terms divided by the gap ``|ε + log Φ(b) − log Φ(a)|``.

    η is a deliberately generous bound (32 units of roundoff per term, inputs' rounding
    included); the calibration requires ``δ·(1 + η) <= target`` so that the *exact* δ of the
    returned σ cannot exceed the target through rounding. η is below 1e-10 in the documented
    range (ε >= 1e-3, δ >= 1e-300) and grows only for ε far below 1e-3.
    """
    unit = 32.0 * _UNIT_ROUNDOFF
    r = sens / sigma
    shift = eps / r  # εσ/Δ
    if shift >= 0.5 * r:  # a <= 0
        t1 = shift - 0.5 * r
        t2 = shift + 0.5 * r
        f1 = float(erfcx(t1 / _SQRT2))
        f2 = float(erfcx(t2 / _SQRT2))
        gap = f1 - f2
        if not gap > 0.0:
            return -math.inf, 0.0
        log_delta = _LOG_HALF - 0.5 * t1 * t1 + math.log(gap)
        # erfcx's rounding magnified by the difference (f₁/gap), the rounding of t₂ − t₁ = r
        # relative to r (t₂/r), and that of the exponent t₁²/2
        eta = unit * (f1 / gap + t2 / r + 1.0 + t1 * t1)
        return log_delta, eta
    log_phi_a = float(log_ndtr(0.5 * r - shift))
    log_phi_b = float(log_ndtr(-0.5 * r - shift))
    log_neg = eps + log_phi_b  # log(e^ε Φ(b))
    if not log_neg < log_phi_a:  # δ(ε; σ) = 0 within float precision (or -inf tails)
        return -math.inf, 0.0
    z = log_neg - log_phi_a
    terms = 1.0 + abs(log_phi_a) + abs(log_phi_b) + eps + (0.5 * r + shift) ** 2
    eta = unit * terms * (1.0 + 1.0 / abs(z))
    return log_phi_a + math.log1p(-math.exp(z)), eta
