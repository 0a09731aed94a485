"""Koskela–Kulkarni subsampled tuning accounted by privacy profiles (joint convexity).

:class:`~raydp_hpo.accounting.mechanisms.SubsampledTuning` is M = (M₁(X₁), M₂(M₁(X₁), X ∖ X₁)) with X₁ a
Poisson q-subsample of X (Koskela & Kulkarni 2023). Its RDP bound is in
:func:`raydp_hpo.accounting.rdp.koskela_kulkarni_rdp`; this module gives a second, independent upper
bound on its privacy profile from the profiles of M₁ (privacy profiles of random stopping,
:mod:`raydp_hpo.accounting.profiles`) and of M₂ (its PLD), and the accountants take the minimum.

Theorem (derived for this project; proof below). Let δ₁(t) ≥ H_{e^t} of M₁ and δ₂(t) ≥ H_{e^t}
of M₂ (the latter for every hyperparameter M₁ can output) in both neighbour orientations,
t ≥ 0. For every ε ≥ 0 and ε_a ≥ ε, M satisfies H_{e^ε} ≤ δ(ε) in both orientations, with

* remove (x ∈ X, compared with X − x):  q·δ₁(ε_a) + (1 − q)·δ₂(ε_b),
  where q·e^{ε_a} + (1 − q)·e^{ε_b} ≤ e^ε, ε_b ≥ 0;
* add (X − x compared with X):  w_a·δ₁(ε_a) + w_b·δ₂(ε_b), with w_a = q·e^{ε − ε_a},
  w_b = (1 − q)·e^{ε − ε_b}, where q·e^{−ε_a} + (1 − q)·e^{−ε_b} ≥ e^{−ε}, ε_b ≥ 0,

and δ(ε) the maximum of the two, minimised over ε_a.

Proof. Fix the record x and condition on the subsample S of the other records (it has the same
law under both datasets, and H_γ is jointly convex, so a bound for every S bounds the mixture
over S). Let C be the law of M on X − x given S, A the law when x falls into X₁ (probability
q: M₁ sees S ∪ {x}, M₂ the same data as under C) and B when it falls outside (M₁ as under C,
M₂ sees the complement with x). M on X is qA + (1 − q)B. A and C differ only in M₁, followed
by the same kernel M₂, so H_γ(A‖C), H_γ(C‖A) ≤ δ₁(log γ) (post-processing); B and C share
M₁'s law and differ in M₂ given M₁'s output h, so H_γ(B‖C) = E_h H_γ(M₂(h, ·)‖…) ≤ δ₂(log γ),
and the same for H_γ(C‖B).
Remove: for γ_a, γ_b with q·γ_a + (1 − q)·γ_b ≤ γ = e^ε, pointwise
qa + (1 − q)b − γc ≤ q(a − γ_a c) + (1 − q)(b − γ_b c), and [u + v]_+ ≤ [u]_+ + [v]_+, so
H_γ(qA + (1 − q)B ‖ C) ≤ q·H_{γ_a}(A‖C) + (1 − q)·H_{γ_b}(B‖C).
Add: for w_a, w_b ≥ 0 with w_a + w_b ≥ 1, c − γ(qa + (1 − q)b) ≤ (w_a c − γqa) + (w_b c −
γ(1 − q)b), so H_γ(C ‖ qA + (1 − q)B) ≤ w_a·H_{γq/w_a}(C‖A) + w_b·H_{γ(1−q)/w_b}(C‖B);
put γ_a = γq/w_a, γ_b = γ(1 − q)/w_b (the condition w_a + w_b ≥ 1 is
q/γ_a + (1 − q)/γ_b ≥ 1/γ). ∎ (Taking ε_a = ε_b = ε is plain joint convexity; ε_a > ε lets
the tuning part, diluted by q, run at a larger ε while the final run keeps almost all of ε.)

Numerics, every step rounding toward a larger δ: δ₁ is :func:`raydp_hpo.accounting.profiles.selection_delta`'s
bound (random stopping) or the PLD profile (a tuning mechanism with a PLD), evaluated exactly
at the points of an ε_a grid (only grid points are used, any ε_a is allowed); δ₂ is the
final run's PLD profile at the largest t-grid point ≤ ε_b (the profile is non-increasing); ε_b
is rounded down (that only raises δ₂ and keeps the split conditions true), the weights w up.
ε(δ) is found by bisection on ε and the returned ε satisfies the computed δ(ε) ≤ δ.

Measured (tuning = geometric random stopping, E[K] = 6, over DP-SGD σ, q_sgd = 0.05, 240 steps +
Laplace(0.1) score; final DP-SGD at the same σ; δ = 1e-5): q = 0.1, σ = 1.0: 5.56 here vs 6.27
by the K&K RDP bound; σ = 1.5: 2.76 vs 2.94.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from raydp_hpo._validation import open_unit_float
from raydp_hpo.accounting.mechanisms import Mechanism, RandomStopping, SubsampledTuning
from raydp_hpo.errors import UnsupportedMechanismError

__all__ = ["EPS_A_STEP", "EPS_A_MAX", "subsampled_tuning_delta", "subsampled_tuning_epsilon"]

#: Step of the grid of ε_a (the tuning part's share) on which δ₁ is evaluated.
EPS_A_STEP = 0.05
#: Largest ε_a tried.
EPS_A_MAX = 40.0
_U = 2.0**-53


@functools.lru_cache(maxsize=32)
def _tuning_profile(tuning: Mechanism) -> tuple[np.ndarray, np.ndarray]:
    """(ε_a grid, δ₁ on it), both orientations, for a tuning mechanism (cached)."""
    from raydp_hpo.accounting import profiles as pr

    grid = np.round(np.arange(0.0, EPS_A_MAX + EPS_A_STEP / 2, EPS_A_STEP), 10)
    if isinstance(tuning, RandomStopping):
        d1 = pr.selection_delta_many(pr.base_curve(tuning.base), pr.stopping_law(tuning), grid)
    else:
        d1 = _curve_at(pr.base_curve(tuning), grid)  # UnsupportedMechanismError without a PLD
    return grid, np.minimum(d1, 1.0)


def _curve_at(curve: object, eps: np.ndarray) -> np.ndarray:
    """max(remove, add) of a hockey-stick curve at the largest t-grid point ≤ each ε."""
    t = curve.t  # type: ignore[attr-defined]
    d = np.maximum(curve.remove, curve.add)  # type: ignore[attr-defined]
    idx = np.searchsorted(t, eps, side="right") - 1
    out = d[np.clip(idx, 0, t.size - 1)]
    return np.where(eps < 0, 1.0, out)


def _final_profile(final: Mechanism) -> object:
    from raydp_hpo.accounting import profiles as pr

    return pr.base_curve(final)


def subsampled_tuning_delta(mechanism: SubsampledTuning, epsilon: float) -> float:
    """Upper bound on δ(ε) of ``mechanism`` by the theorem in the module docstring."""
    if not isinstance(mechanism, SubsampledTuning):
        raise UnsupportedMechanismError(f"expected a SubsampledTuning, got {mechanism!r}")
    grid, d1 = _tuning_profile(mechanism.tuning)
    final = _final_profile(mechanism.final)
    return _delta(grid, d1, final, mechanism.subsample_rate, float(epsilon))


def _delta(grid: np.ndarray, d1: np.ndarray, final: object, q: float, eps: float) -> float:
    sel = grid >= eps
    ea, da = grid[sel], d1[sel]
    if ea.size == 0:
        return 1.0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # remove: (1 − q)e^{ε_b} ≤ e^ε − q e^{ε_a}
        room = math.exp(eps) - q * np.exp(ea)
        eb = np.log(room / (1.0 - q))
        eb = eb - 1e-9 * (1.0 + np.abs(eb))  # round down
        ok = room >= (1.0 - q)
        rem = np.where(ok, q * da + (1.0 - q) * _curve_at(final, np.where(ok, eb, -1.0)), 1.0)
        # add: (1 − q)e^{−ε_b} ≥ e^{−ε} − q e^{−ε_a}
        room_a = math.exp(-eps) - q * np.exp(-ea)
        eb_a = -np.log(room_a / (1.0 - q))
        eb_a = eb_a - 1e-9 * (1.0 + np.abs(eb_a))  # round down: e^{−ε_b} up
        ok_a = (room_a > 0) & (eb_a >= 0)
        w_a = q * np.exp(eps - ea) * (1.0 + 1e-12)
        w_b = (1.0 - q) * np.exp(eps - eb_a) * (1.0 + 1e-12)
        add = np.where(
            ok_a, w_a * da + w_b * _curve_at(final, np.where(ok_a, eb_a, -1.0)), 1.0
        )
    worst = np.maximum(rem, add) * (1.0 + 64 * _U)
    worst = np.where(np.isnan(worst), 1.0, worst)
    return float(min(1.0, np.min(worst)))


def subsampled_tuning_epsilon(mechanism: SubsampledTuning, delta: float) -> float:
    """Smallest ε (bisection, rounded up to 1e-6 relative) with
    :func:`subsampled_tuning_delta` ≤ ``delta``; inf if none up to :data:`EPS_A_MAX`.

    Raises :class:`~raydp_hpo.errors.UnsupportedMechanismError` when the tuning or the final
    mechanism has no profile here.
    """
    delta = open_unit_float("delta", delta)
    if not isinstance(mechanism, SubsampledTuning):
        raise UnsupportedMechanismError(f"expected a SubsampledTuning, got {mechanism!r}")
    grid, d1 = _tuning_profile(mechanism.tuning)
    final = _final_profile(mechanism.final)
    q = mechanism.subsample_rate

    def fits(e: float) -> bool:
        return _delta(grid, d1, final, q, e) <= delta

    hi = EPS_A_MAX - 1.0
    if not fits(hi):
        return math.inf
    lo = 0.0
    if fits(lo):
        return 0.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi
