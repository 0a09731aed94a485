"""Noise calibration bracketing: the smallest σ whose plan the admission rule accepts.

:meth:`DPSearcher._calibrate_noise <raydp_hpo.searchers.base.DPSearcher._calibrate_noise>`
asks :func:`_bracketed_by_rdp` first: it starts from the σ that RDP alone admits and closes a
bracket (``fits(hi)``, not ``fits(lo)``) down to the relative tolerance
:data:`CALIBRATION_RTOL`, guided by a secant on log ε(log σ) where the rule's ε figure is
known (:func:`_guided_bracket`). Every σ returned was accepted by ``fits``: the guide only
chooses where to ask. :func:`plan_epsilon` is the default admission figure (RDP). Re-exported
by :mod:`raydp_hpo.searchers.base`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from raydp_hpo.accounting.accountants import Accountant, epsilon, smallest_noise_multiplier
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism

__all__ = ["CALIBRATION_RTOL", "MAX_NOISE_MULTIPLIER", "plan_epsilon"]

#: Largest noise multiplier a searcher will calibrate to before declaring the budget too small.
MAX_NOISE_MULTIPLIER = 1e4

#: Relative tolerance of noise calibration: the calibrated σ is at most this much above the
#: smallest admissible σ (and never below it).
CALIBRATION_RTOL = 1e-3
_SIGMA_FLOOR = 1e-2
#: Factor by which the calibration steps down from the RDP-calibrated σ to find a refused σ.
_BRACKET_STEP = 0.8


def _bracketed_by_rdp(
    fits: Callable[[float], bool],
    rdp_epsilon: Callable[[float], float],
    budget: PrivacyBudget,
    figure: Callable[[float], float] | None = None,
) -> float | None:
    """Smallest σ with ``fits`` (rtol :data:`CALIBRATION_RTOL`), searched below the σ that RDP
    alone admits; ``None`` when that σ does not exist or ``fits`` refuses it (the caller then
    runs the generic search). ``figure(σ)``, when given, is the ε the rule compares with the
    budget; it only guides where ``fits`` is asked (see :func:`_guided_bracket`), the answer
    is always decided by ``fits``. See :meth:`DPSearcher._calibrate_noise`."""
    from raydp_hpo.errors import UnsupportedMechanismError

    try:
        hi = smallest_noise_multiplier(
            lambda s: rdp_epsilon(s) <= budget.epsilon,
            max_noise_multiplier=MAX_NOISE_MULTIPLIER,
            tolerance=CALIBRATION_RTOL,
            floor=_SIGMA_FLOOR,
            refine_below_floor=False,
        )
    except UnsupportedMechanismError:
        return None
    if hi is None or not fits(hi):
        return None
    lo: float | None = None
    if figure is not None:
        lo, hi = _guided_bracket(fits, figure, budget.epsilon, hi)
    if lo is None:
        lo = hi / (1.0 + CALIBRATION_RTOL)
        while fits(lo):  # the rule is looser than RDP: step down until refused
            hi = lo
            if hi <= _SIGMA_FLOOR:
                return hi
            lo = max(hi * _BRACKET_STEP, _SIGMA_FLOOR / 2.0)
    # invariant: fits(hi), not fits(lo)
    while hi > lo * (1.0 + CALIBRATION_RTOL):
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _guided_bracket(
    fits: Callable[[float], bool], figure: Callable[[float], float], target: float, hi: float
) -> tuple[float | None, float]:
    """A bracket (lo, hi) with ``fits(hi)`` and not ``fits(lo)``, found by a secant on
    log ε(log σ) from ``figure`` (ε falls roughly like 1/σ), probing just above and just below
    each estimate so that the bracket closes to the tolerance in a few steps (~5 evaluations
    of ``figure`` instead of ~11 bisection steps). Every end returned was checked with
    ``fits``; ``lo`` is ``None`` if no refused σ was found (the caller steps down itself)."""
    tol = math.log1p(CALIBRATION_RTOL)
    x_hi = math.log(hi)
    y_hi = math.log(max(figure(hi), 1e-300) / target)  # ≤ 0 where the rule fits
    x_lo: float | None = None
    y_lo = 0.0
    for _ in range(8):
        if x_lo is not None and x_hi - x_lo <= tol:
            break
        # the first estimate takes slope −1 (ε ∝ 1/σ), later ones the secant of the bracket
        x_star = x_hi + y_hi if x_lo is None else x_hi - y_hi * (x_hi - x_lo) / (y_hi - y_lo)
        probe = x_star + 0.5 * tol
        if x_lo is not None:
            probe = min(max(probe, x_lo + 0.25 * tol), x_hi - 0.25 * tol)
        else:
            probe = min(probe, x_hi - 0.25 * tol)
        y = math.log(max(figure(math.exp(probe)), 1e-300) / target)
        if y <= 0 and fits(math.exp(probe)):
            x_hi, y_hi = probe, y
            below = x_hi - tol
            if x_lo is None or below > x_lo:
                y_b = math.log(max(figure(math.exp(below)), 1e-300) / target)
                if y_b > 0 and not fits(math.exp(below)):
                    x_lo, y_lo = below, y_b
                elif y_b <= 0 and fits(math.exp(below)):
                    x_hi, y_hi = below, y_b
                else:  # the figure and the rule disagree: let the caller bisect on ``fits``
                    break
        elif y > 0 and not fits(math.exp(probe)):
            x_lo, y_lo = probe, y
        else:
            break
    return (None if x_lo is None else math.exp(x_lo)), math.exp(x_hi)


def plan_epsilon(mechanism: Mechanism, delta: float) -> float:
    """ε of ``mechanism`` at ``delta`` under the RDP accountant (the default admission rule)."""
    return epsilon(mechanism, delta, Accountant.RDP)

