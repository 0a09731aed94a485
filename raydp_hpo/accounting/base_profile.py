"""The privacy profile d(t) of a base mechanism, per neighbour orientation, from its PLD.

:func:`base_curve` gives upper bounds on the hockey-stick curves H_{e^t}(P‖R) (REMOVE) and
H_{e^t}(R‖P) (ADD) of a base mechanism on the t-grid (step :data:`T_STEP`, up to
:data:`T_MAX`), read from dp-accounting's pessimistic PLD with a rigorous rounding pad
(:func:`_pmf_hockey_stick`); a worst case over candidates takes the maximum per orientation
(joint convexity of H_γ, :func:`_pld_alternatives`). These are the d→, d← of the selection
bound in :mod:`raydp_hpo.accounting.profiles`, which re-exports this module's names.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from raydp_hpo.accounting.mechanisms import Composition, Mechanism, WorstCase
from raydp_hpo.errors import InvalidParameterError, UnsupportedMechanismError

__all__ = ["T_STEP", "T_MAX", "HockeyStickCurve", "base_curve"]

#: Step of the t-grid on which the base profile d(t) is evaluated.
T_STEP = 0.01
#: Largest t asked of the base profile (the grid is cut where d(t) stops decreasing).
T_MAX = 64.0
_U = 2.0**-53  # unit roundoff of float64


@dataclass(frozen=True, eq=False)
class HockeyStickCurve:
    """Upper bounds on the privacy profile of a base mechanism, per neighbour orientation.

    For every ordered neighbouring pair (D, D') with D' = D minus one record, P = Q(D),
    R = Q(D'): ``remove[i]`` ≥ H_{e^{t_i}}(P‖R) and ``add[i]`` ≥ H_{e^{t_i}}(R‖P) (dp-accounting's
    REMOVE and ADD privacy loss distributions). ``t`` is ascending and starts at 0. A
    symmetric curve has ``add`` equal to ``remove``.
    """

    t: np.ndarray
    remove: np.ndarray
    add: np.ndarray

    def __post_init__(self) -> None:
        t = np.asarray(self.t, dtype=float).copy()
        if t.ndim != 1 or t.size < 2 or t[0] != 0.0 or np.any(np.diff(t) <= 0):
            raise InvalidParameterError("t must be 1-D, start at 0 and strictly increase")
        for name in ("remove", "add"):
            d = np.asarray(getattr(self, name), dtype=float).copy()
            if d.shape != t.shape:
                raise InvalidParameterError(f"{name} has shape {d.shape}, t has {t.shape}")
            if np.any(~np.isfinite(d)) or np.any(d < 0) or np.any(d > 1):
                raise InvalidParameterError(f"{name} must lie in [0, 1]")
            # H_{e^t} is non-increasing in t, so a bound valid at t' ≤ t is valid at t: take
            # the running minimum from the left (still a valid bound at every t).
            d = np.minimum.accumulate(d)
            d.setflags(write=False)
            object.__setattr__(self, name, d)
        t.setflags(write=False)
        object.__setattr__(self, "t", t)

    @property
    def symmetric(self) -> bool:
        return bool(np.array_equal(self.remove, self.add))

    def orientations(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(forward, reverse) bounds for each ordered pair: (remove, add) and (add, remove)."""
        if self.symmetric:
            return [(self.remove, self.add)]
        return [(self.remove, self.add), (self.add, self.remove)]


def _pld_alternatives(m: Mechanism) -> list[Mechanism]:
    """Mechanisms with a PLD whose profiles' maximum (per orientation) bounds ``m``'s profile.

    * a mechanism with a PLD: itself;
    * WorstCase(c₁, …): the union of the candidates' alternatives. A base trial whose privacy
      hyperparameters are drawn from the space independently of the data is the mixture
      Σ wᵢ Qᵢ on both datasets, and H_γ(Σwᵢ Pᵢ ‖ Σwᵢ Rᵢ) ≤ Σwᵢ H_γ(Pᵢ‖Rᵢ) ≤ maxᵢ (joint
      convexity of H_γ); a fixed but arbitrary candidate is covered by the maximum too;
    * Composition(a, b, …) whose parts after the first all have a PLD: every
      Composition(a', b, …) over the first part's alternatives a' (a data-independent mixture
      followed by fixed mechanisms is the mixture of the compositions). A worst case after
      the first part is refused: its choice could depend on earlier outputs, and the maximum
      of the profiles does not bound an adaptively chosen mixture (RDP's pointwise maximum
      does; use it there).
    """
    from raydp_hpo.accounting.pld import has_pld  # deferred: pld imports dp-accounting (~1 s)

    if has_pld(m):
        return [m]
    if isinstance(m, WorstCase):
        alts = [a for c in m.candidates for a in _pld_alternatives(c)]
        if len(alts) > 256:
            raise UnsupportedMechanismError(
                f"profile accounting would expand {len(alts)} > 256 worst-case candidates; "
                "use Accountant.RDP"
            )
        return alts
    if isinstance(m, Composition):
        first, rest = m.mechanisms[0], m.mechanisms[1:]
        if all(has_pld(p) for p in rest):
            return [Composition((a, *rest)) for a in _pld_alternatives(first)]
        raise UnsupportedMechanismError(
            f"profile accounting needs every part after the first of {m!r} to have a PLD "
            "(a worst case later in a composition may be chosen adaptively); use Accountant.RDP"
        )
    raise UnsupportedMechanismError(
        f"{type(m).__name__} has no privacy profile here (no PLD); profile accounting of a "
        "selection needs a base built from SubsampledGaussian, Gaussian, Laplace, PureDP, "
        "ApproxDP, Composition and WorstCase"
    )


def _pmf_hockey_stick(pmf: object, t: np.ndarray) -> np.ndarray:
    """Upper bounds on H_{e^t} = m_∞ + Σ_{L>t} p_L (1 − e^{t − L}) of one dp-accounting loss pmf.

    With S₁(t) = Σ_{L>t} p_L and S₂(t) = Σ_{L>t} p_L e^{−L} (suffix sums of non-negative
    terms, relative error ≤ n·u each, n the number of bins, u = 2⁻⁵³) the value is
    m_∞ + S₁ − e^t S₂, and e^t S₂ ≤ S₁ since every term has L > t: the absolute rounding
    error is below (2n + 8)·u·S₁(t), which is added. dp-accounting computes the pmf of a
    self-composition by FFT, whose entries carry absolute noise; negative entries are set to
    0 (that only raises the sum) and each of the N(t) bins above t is allowed an extra
    η = max(largest negative entry's size, 4u·max p), added as N(t)·η. Reads the dense pmf's
    attributes (dp-accounting 0.6.0 ``DensePLDPmf``: ``_probs``, ``_lower_loss``,
    ``_discretization``, ``_infinity_mass``); agreement with dp-accounting's own
    ``get_delta_for_epsilon`` is tested.
    """
    dense = pmf.to_dense_pmf()  # type: ignore[attr-defined]
    raw = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
    n = raw.size
    losses = (np.arange(n) + dense._lower_loss) * dense._discretization  # noqa: SLF001
    inf_mass = float(dense._infinity_mass)  # noqa: SLF001
    probs = np.maximum(raw, 0.0)
    eta = max(float(-np.min(raw, initial=0.0)), 4 * _U * float(np.max(probs, initial=0.0)))
    s1 = np.concatenate([np.cumsum(probs[::-1])[::-1], [0.0]])  # s1[k] = Σ_{i≥k} p_i
    s2 = np.concatenate([np.cumsum((probs * np.exp(-losses))[::-1])[::-1], [0.0]])
    k = np.searchsorted(losses, t, side="right")  # first bin with L > t
    value = inf_mass + s1[k] - np.exp(t) * s2[k]
    pad = (2 * n + 8) * _U * s1[k] + (n - k) * eta + 4 * _U * inf_mass
    return np.clip(value + pad, 0.0, 1.0)


def _pld_d(m: Mechanism, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(remove, add) hockey-stick upper bounds of ``m``'s pessimistic PLD at ``t``."""
    from raydp_hpo.accounting import pld  # deferred (see above)

    # pld._pld_of is private; it is the composed PLD of a PLD-capable mechanism (cached
    # leaves). Ask the lead to expose it as pld.pld_of(m). The two directions are read from
    # dp-accounting's PrivacyLossDistribution._pmf_remove / ._pmf_add (0.6.0; their meaning is
    # pinned by tests/raydp_hpo/accounting/test_profiles.py against exact values).
    composed = pld._pld_of(m, 0.0)
    if composed is None:  # pragma: no cover - a PLD-capable mechanism always has one
        raise UnsupportedMechanismError(f"no PLD for {m!r}")
    return (
        _pmf_hockey_stick(composed._pmf_remove, t),  # noqa: SLF001
        _pmf_hockey_stick(composed._pmf_add, t),  # noqa: SLF001
    )


@functools.lru_cache(maxsize=64)  # small: ≤ 6,401 t-points × 3 arrays
def base_curve(mechanism: Mechanism) -> HockeyStickCurve:
    """The privacy profile of a base mechanism on the t-grid, per orientation, from its PLD.

    dp-accounting's pessimistic PLD (built as :mod:`raydp_hpo.accounting.pld` builds it; losses rounded up,
    truncated tails moved to larger losses or +∞) gives upper bounds on the REMOVE and ADD
    hockey-stick curves at each t ≥ 0 (:func:`_pmf_hockey_stick`). A worst case over
    candidates takes the maximum per orientation (see :func:`_pld_alternatives`). Cached
    (mechanisms are immutable values).
    """
    t = np.round(np.arange(0.0, T_MAX + T_STEP / 2, T_STEP), 10)
    remove = np.zeros_like(t)
    add = np.zeros_like(t)
    for alt in _pld_alternatives(mechanism):
        r, a = _pld_d(alt, t)
        remove, add = np.maximum(remove, r), np.maximum(add, a)
    # Cut the grid where both have reached their plateau (larger t adds nothing: same d,
    # steeper lines in G and a larger e^{ε₁} factor). Keep one point past it.
    stop = 2
    for d in (remove, add):
        idx = int(np.argmax(d <= d[-1] * (1.0 + 1e-9)))
        stop = max(stop, idx + 2)
    stop = min(stop, t.size)
    return HockeyStickCurve(t[:stop], remove[:stop], add[:stop])
