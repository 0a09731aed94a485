"""Random stopping ("best of K runs") accounted by privacy profiles.

Bounds the privacy profile δ_M(ε) of Papernot & Steinke's private selection M (run a base
mechanism Q K times, K ~ a data-independent law, release only the best-scoring output) from
the privacy profile of Q and the probability generating function (PGF) f(x) = E[x^K] of K,
following the approach of Koskela, Redberg & Wang, "Privacy Profiles for Private Selection"
(ICML 2024, PMLR 235; arXiv:2402.06701). Only the paper's abstract and introduction could be
read, not its theorem statements: the theorem below is our reconstruction of that approach,
checked and proved here in full. Do not cite it as "KRW Theorem x".

Notation
--------
H_γ(P‖R) = sup_S [P(S) − γR(S)] = ∫ [p − γr]_+ (hockey-stick divergence). For an ordered
neighbouring pair (X, Y) let P = Q(X), R = Q(Y), and let d→(t) ≥ H_{e^t}(P‖R) and
d←(t) ≥ H_{e^t}(R‖P) for t ≥ 0. Under add/remove adjacency, dp-accounting's REMOVE
distribution bounds H(Q(D)‖Q(D − x)) and its ADD distribution H(Q(D)‖Q(D + x)) over all D, x;
so for Y = X − x one may take (d→, d←) = (remove, add), and for Y = X + x (add, remove).
f(x) = Σ_k P[K=k] x^k; f' is ≥ 0 and non-decreasing on [0, 1] and f'(1) = E[K].

Theorem (reconstructed; proof below)
------------------------------------
Let G(u) = min{1, inf_{t≥0} [e^t u + d→(t)], inf_{t≥0} [1 − e^{−t}(1 − u − d←(t))]} for
u ∈ [0, 1]. For every ε ≥ 0 and every split ε = ε₁ + ε₂ with ε₁, ε₂ ≥ 0,

    H_{e^ε}(M(X)‖M(Y)) ≤ E[K]·d→(ε₁) + e^{ε₁} ∫₀¹ [f'(G(u)) − e^{ε₂} f'(u)]_+ du,

and M is (ε, δ)-DP with δ the maximum of the right-hand side over the two orientations.

Proof. Fix an ordered neighbouring pair (X, Y); P = Q(X), R = Q(Y).

(i) Continuous scores. Append an independent U ~ Unif(0, 1) to Q's output and order the
augmented outputs by (score, tie-break, U) lexicographically. H_γ of the augmented pair equals
H_γ(P‖R) (the same independent factor on both sides), so d→, d← still bound it; the selection
on augmented outputs followed by dropping U is the original selection whenever the original
breaks ties in a way that does not look at the data (e.g. by trial index: the K runs are
i.i.d., so among tied-score runs any data-independent rule gives the same output law as a
uniformly random one), and post-processing cannot increase H_γ. So assume the order is total
and F_P(y) = P[Y' ≤ y] is continuous; then F_P(Y') ~ Unif(0, 1) for Y' ~ P.

(ii) Output law (Papernot & Steinke 2022, Lemma in Sec. 3): P[best of K ≤ y] = E[F_P(y)^K] =
f(F_P(y)), so M(X) has density p(y)·f'(F_P(y)) off the "nothing selected" atom ⊥, which has
mass f(0) under both X and Y.

(iii) Split. p f'(F_P) − e^ε r f'(F_R) = f'(F_P)(p − e^{ε₁} r) + e^{ε₁} r (f'(F_P) −
e^{ε₂} f'(F_R)), and [a + b]_+ ≤ [a]_+ + [b]_+. The atom ⊥ contributes [f(0)(1 − e^ε)]_+ = 0
for ε ≥ 0.

(iv) First term. 0 ≤ f'(F_P) ≤ f'(1) = E[K], so ∫ f'(F_P)[p − e^{ε₁} r]_+ ≤
E[K]·H_{e^{ε₁}}(P‖R) ≤ E[K]·d→(ε₁).

(v) Second term. {Y' ≤ y} is an event, so for every t ≥ 0, F_P(y) ≤ e^t F_R(y) + d→(t), and
R[Y' > y] ≤ e^t P[Y' > y] + d←(t), i.e. F_P(y) ≤ 1 − e^{−t}(1 − F_R(y) − d←(t)). Hence
F_P(y) ≤ G(F_R(y)). f' is non-decreasing, so
∫ e^{ε₁} r [f'(F_P) − e^{ε₂} f'(F_R)]_+ ≤ e^{ε₁} ∫ r(y) [f'(G(F_R(y))) − e^{ε₂} f'(F_R(y))]_+ dy
= e^{ε₁} ∫₀¹ [f'(G(u)) − e^{ε₂} f'(u)]_+ du, since F_R(Y') ~ Unif(0, 1) for Y' ~ R.

Summing (iii)–(v) bounds H_{e^ε}(M(X)‖M(Y)); every ordered pair is one of the two
orientations. ∎ (The reverse branch of G is the t < 0 branch of a one-sided G rewritten with
H_γ(P‖R) = 1 − γ + γH_{1/γ}(R‖P); only t ≥ 0 is ever asked of the PLD. Keeping the two
orientations apart, instead of a symmetric max(remove, add) in both places, is
valid by the pairing above and lowers ε for DP-SGD, whose two directions differ.)

Pure-DP corollary. If Q is ε₀-DP, d→(t) = d←(t) = 0 for t ≥ ε₀. Take ε₁ = ε₀: G(u) = min(e^{ε₀}u,
1 − e^{−ε₀}(1 − u)) and the integral vanishes iff ε₂ ≥ sup_u log f'(G(u))/f'(u). For each law
below that ratio increases in u up to the kink u* = 1/(e^{ε₀} + 1) and decreases after it
(checked by differentiating each closed form), so M is ε_M-DP with
(:func:`pure_selection_epsilon`)

* truncated negative binomial (η, γ): ε₀ + (1 + η)·log[(e^{ε₀} + γ)/(1 + γe^{ε₀})]
  ≤ (2 + η)ε₀ (Papernot & Steinke 2022, Cor. 4), since e^{ε₀} + γ ≤ e^{ε₀}(1 + γe^{ε₀});
* Poisson(μ): ε₀ + μ·tanh(ε₀/2);
* binomial(m, p): ε₀ + (m − 1)·log[(e^{ε₀} + 1 − p)/((1 − p)e^{ε₀} + 1)].

Numerical recipe (every step rounds toward a larger δ)
------------------------------------------------------
* d→, d← on a t-grid (step :data:`T_STEP`, t ≥ 0) from dp-accounting's pessimistic PLD of Q
  (its REMOVE and ADD distributions; losses rounded up, truncated tails moved to larger
  losses or +∞, so each value is an upper bound). The hockey-stick sums are computed here
  from the dense loss pmf (:func:`_pmf_hockey_stick`) with a rigorous rounding pad, plus an
  allowance for the noise of dp-accounting's FFT self-composition; clipped to [0, 1].
* G is evaluated as a minimum over the finite t-grid (a min over a subset of t can only be
  larger than the infimum), through its complement 1 − G (which keeps precision near u = 1,
  where f' of a truncated negative binomial is steep) lowered by :data:`G_PAD`.
* The integral is an upper Riemann sum on a u-grid dense near both ends: G and f' are
  non-decreasing, so on [u_i, u_{i+1}] the integrand is at most
  [f'(G(u_{i+1})) − e^{ε₂} f'(u_i)]_+.
* ε₁ ranges over t-grid points only (d is never interpolated); δ is the minimum over them.
  The candidates are ranked by a fast evaluation (suffix sums); the best
  :data:`_N_CHECKED` are evaluated again as a direct sum of the non-negative cell terms with a
  rigorous bound on its rounding error added (:meth:`_Integrand.checked_integral`), and δ is
  the minimum of those checked values (a minimum over a subset of valid ε₁ is still valid).
* ε(δ) solves the discretised bound exactly per ε₁ (the upper sum is piecewise linear in
  e^{ε₂}), then re-checks δ(ε) ≤ δ by direct evaluation and moves ε up if rounding ever made it
  fail: the returned ε always satisfies the discretised bound.

K's law is the one the searcher samples (``raydp_hpo/searchers/random_stopping.py``): for the truncated
negative binomial, γ comes from E[K] by :func:`raydp_hpo.accounting._rdp_kernels.truncated_negative_binomial_gamma`
(the port of dp-accounting's bisection; its lower end, so the law's own E[K] = f'(1) is used
here, never the nominal mean).

Composition with other charges: :func:`profile_epsilon` (below) gives a selection one (εᵢ, δᵢ)
point at an explicit δ split and composes it, as the worst-case PLD of (εᵢ, δᵢ)-DP, with the
PLD of everything else; see its docstring.

Longer than ~600 lines because it is one theorem, its proof (above) and the numerics that
evaluate it; splitting would separate the proof from its code. Its two inputs are neighbours,
their names re-exported here: the laws of K (:mod:`~raydp_hpo.accounting.stopping_laws`) and
the base profile d→, d← (:mod:`~raydp_hpo.accounting.base_profile`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from raydp_hpo._validation import nonnegative_float, open_unit_float
from raydp_hpo.accounting.base_profile import (  # noqa: F401 (re-exported)
    _U,
    T_MAX,
    T_STEP,
    HockeyStickCurve,
    _pld_alternatives,
    _pld_d,
    _pmf_hockey_stick,
    base_curve,
)
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Mechanism,
    RandomStopping,
    SubsampledTuning,
    WorstCase,
)
from raydp_hpo.accounting.stopping_laws import (  # noqa: F401 (re-exported)
    LawKind,
    StoppingLaw,
    binomial_law,
    poisson_law,
    stopping_law,
    truncated_negative_binomial_law,
)
from raydp_hpo.errors import InvalidParameterError, UnsupportedMechanismError

__all__ = [
    "T_STEP",
    "T_MAX",
    "G_PAD",
    "LawKind",
    "StoppingLaw",
    "truncated_negative_binomial_law",
    "poisson_law",
    "binomial_law",
    "stopping_law",
    "HockeyStickCurve",
    "base_curve",
    "selection_delta",
    "selection_delta_many",
    "selection_epsilon",
    "pure_selection_epsilon",
    "random_stopping_delta",
    "random_stopping_epsilon",
    "profile_epsilon",
    "profile_delta",
    "DELTA_SPLITS",
]

#: Absolute amount by which the computed 1 − G(u) is lowered (covers its rounding, ~1e-15).
G_PAD = 1e-14
_N_CHECKED = 16  # ε₁ candidates whose value is re-evaluated with a rigorous rounding bound

_N_LOG = 6000  # log-spaced u points near each end of [0, 1]
_N_LIN = 12000  # linearly spaced u points
_LOG_MIN = -17.0  # smallest u (and 1 − u) on the log grids: 1e-17


# -------------------------------------------------------------------------- the recipe


@functools.lru_cache(maxsize=1)
def _u_grid() -> tuple[np.ndarray, np.ndarray]:
    """Points (u, w = 1 − u) of [0, 1], ascending in u, dense near both ends.

    Each half stores the coordinate it is precise in: u for u ≤ 1/2, w for u > 1/2.
    """
    lo = np.concatenate([[0.0], np.logspace(_LOG_MIN, math.log10(0.5), _N_LOG)])
    lin = np.linspace(0.0, 1.0, _N_LIN + 1)[1:-1]
    lo = np.union1d(lo, lin[lin <= 0.5])
    hi_w = np.concatenate([[0.0], np.logspace(_LOG_MIN, math.log10(0.5), _N_LOG)])
    hi_w = np.union1d(hi_w, 1.0 - lin[lin > 0.5])  # 1 − x exact for x ∈ [1/2, 1]
    hi_w = hi_w[hi_w < 0.5]
    u = np.concatenate([lo, 1.0 - hi_w[::-1]])
    w = np.concatenate([1.0 - lo, hi_w[::-1]])
    u.setflags(write=False)
    w.setflags(write=False)
    return u, w


@dataclass(frozen=True, eq=False)
class _Envelope:
    """The u-grid, its cell widths and the complement 1 − G on it, for one base curve."""

    u: np.ndarray
    w: np.ndarray
    width: np.ndarray  # width[i] = u[i+1] − u[i]
    wg: np.ndarray  # lower bound on 1 − G(u[i])


def _widths(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    du = np.diff(u)
    dw = -np.diff(w)
    # use the coordinate stored precisely on each side of 1/2
    return np.where(u[1:] <= 0.5, du, dw)


def _line_complement(
    j: np.ndarray, u: np.ndarray, w: np.ndarray, t: np.ndarray, fwd: np.ndarray, rev: np.ndarray
) -> np.ndarray:
    """1 − (line j)(u), computed in its precise form, for line indices ``j`` (one per u).

    Lines 0..n−1 are the forward family e^{t}u + d→(t), n..2n−1 the reverse family
    1 − e^{−t}(1 − u − d←(t)); their complements are w − (e^t − 1)u − d→(t) and e^{−t}(w − d←(t)).
    """
    n = t.size
    k = j % n
    forward = w - np.expm1(t[k]) * u - fwd[k]
    reverse = np.exp(-t[k]) * (w - rev[k])
    return np.where(j < n, forward, reverse)


def _complement_bruteforce(
    u: np.ndarray, w: np.ndarray, t: np.ndarray, fwd: np.ndarray, rev: np.ndarray
) -> np.ndarray:
    """max over all 2n lines of their complement at each u (reference for the hull version)."""
    out = np.empty(u.shape)
    for s in range(0, u.size, 1024):
        uu, ww = u[s : s + 1024, None], w[s : s + 1024, None]
        f = np.max(ww - np.expm1(t)[None, :] * uu - fwd[None, :], axis=1)
        r = np.max(np.exp(-t)[None, :] * (ww - rev[None, :]), axis=1)
        out[s : s + 1024] = np.maximum(f, r)
    return out


def _complement_envelope(
    u: np.ndarray, w: np.ndarray, t: np.ndarray, fwd: np.ndarray, rev: np.ndarray
) -> np.ndarray:
    """Lower bound on 1 − G(u) = max over lines of 1 − line(u), via the lower hull of the lines.

    G(u) = min(1, min_j line_j(u)) over the 2n lines above. The lower envelope of lines is
    built once (slopes e^{t} and e^{−t}, sorted descending; O(n)), each sorted u is located
    on it, and the complement of the located line and of its two hull neighbours is evaluated
    in its precise form. Validity does not depend on the hull being exact: every value
    returned is 1 − line_j(u) for an actual line j, and G(u) ≤ line_j(u) for every j. The hull
    only decides which line (for tightness); it matches the brute-force maximum in tests.
    """
    slopes = np.concatenate([np.exp(t), np.exp(-t)])
    inter = np.concatenate([fwd, 1.0 - np.exp(-t) * (1.0 - rev)])
    order = np.lexsort((inter, -slopes))  # slope descending, then intercept ascending
    hull: list[int] = []
    for k in order.tolist():
        m, c = slopes[k], inter[k]
        if hull and slopes[hull[-1]] == m:
            continue  # same slope, intercept not smaller
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (c - inter[a]) * (slopes[a] - slopes[b]) <= (inter[b] - inter[a]) * (slopes[a] - m):
                hull.pop()  # the new line undercuts a before b does: b is never the minimum
            else:
                break
        hull.append(k)
    h = np.asarray(hull, dtype=int)
    breaks = (inter[h[1:]] - inter[h[:-1]]) / (slopes[h[:-1]] - slopes[h[1:]])
    pos = np.searchsorted(breaks, u)
    best = np.full(u.shape, -np.inf)
    for off in (-1, 0, 1):
        j = h[np.clip(pos + off, 0, h.size - 1)]
        best = np.maximum(best, _line_complement(j, u, w, t, fwd, rev))
    return best


@functools.lru_cache(maxsize=16)  # ~0.4 MB each (the u-grid itself is shared)
def _envelope(curve: HockeyStickCurve, orientation: int) -> _Envelope:
    u, w = _u_grid()
    fwd, rev = curve.orientations()[orientation]
    wg = _complement_envelope(u, w, curve.t, fwd, rev)
    wg = np.clip(wg - G_PAD, 0.0, 1.0)
    # G is non-decreasing, so 1 − G(u) ≥ 1 − G(u') ≥ wg(u') for u' ≥ u: a running maximum from
    # the right keeps every value a lower bound on 1 − G.
    wg = np.maximum.accumulate(wg[::-1])[::-1]
    return _Envelope(u=u, w=w, width=_widths(u, w), wg=wg)


@dataclass(frozen=True, eq=False)
class _Integrand:
    """Upper-sum cells: width·[A − c·B]_+ with A = f'(G(u_{i+1})), B = f'(u_i), c = e^{ε₂}."""

    width: np.ndarray
    a: np.ndarray
    b: np.ndarray
    # breakpoints r = A/B sorted descending, with cumulative Σ width·A and Σ width·B
    r_sorted: np.ndarray
    cum_a: np.ndarray
    cum_b: np.ndarray

    def checked_integral(self, c: np.ndarray) -> np.ndarray:
        """Σ width·[A − cB]_+ for each c, summed directly, plus a bound on its rounding error.

        Each positive term A − cB is computed with absolute error ≤ 3u(A + cB) ≤ 6uA (A, B
        themselves carry relative error ≤ 4u from exp/log, counted in the factor 16 below),
        times width (relative error u); the sum of n non-negative terms has relative error
        ≤ n·u. So |error| ≤ 16u·Σ_{A>cB} width·A + (n + 2)u·value, which is added.
        """
        c = np.atleast_1d(np.asarray(c, dtype=float))
        out = np.empty(c.shape)
        n = self.width.size
        for s in range(0, c.size, 16):
            cc = c[s : s + 16, None]
            diff = self.a[None, :] - cc * self.b[None, :]
            active = diff > 0
            value = np.sum(self.width * np.where(active, diff, 0.0), axis=1)
            wa = np.sum(self.width * np.where(active, self.a[None, :], 0.0), axis=1)
            out[s : s + 16] = value + 16 * _U * wa + (n + 2) * _U * value
        return out

    def integral(self, c: np.ndarray) -> np.ndarray:
        """Σ width·[A − cB]_+ for each c ≥ 0, by the sorted breakpoints (fast; ranking only)."""
        c = np.asarray(c, dtype=float)
        # cells with r > c contribute width·(A − cB)
        k = np.searchsorted(-self.r_sorted, -c, side="left")  # number of r strictly > c
        sa = np.where(k > 0, self.cum_a[np.maximum(k - 1, 0)], 0.0)
        sb = np.where(k > 0, self.cum_b[np.maximum(k - 1, 0)], 0.0)
        return np.maximum(sa - c * sb, 0.0)

    def integral_upper(self, c: np.ndarray) -> np.ndarray:
        """:meth:`integral` plus a rigorous bound on its rounding error (fast and valid).

        The k cells summed all have A > cB, so c·SB_k ≤ SA_k. The prefix sums SA_k, SB_k of n
        non-negative terms have relative error ≤ n·u, A and B themselves ≤ 4u (exp/log), the
        difference and the product one u each, so |computed − exact sum over the k cells| ≤
        (2n + 16)·u·(SA_k + c·SB_k) ≤ (4n + 32)·u·SA_k (with a factor 2 to spare for the
        rounding of c·SB_k itself). A cell whose computed ratio r = A/B is at or below c while
        its exact one is above (rounding of r, ≤ 2u relative) has A ≤ cB(1 + 2u) and so
        contributes at most width·A·4u: ≤ 4u·SA_total over all cells. Both are added.
        """
        c = np.asarray(c, dtype=float)
        k = np.searchsorted(-self.r_sorted, -c, side="left")
        sa = np.where(k > 0, self.cum_a[np.maximum(k - 1, 0)], 0.0)
        sb = np.where(k > 0, self.cum_b[np.maximum(k - 1, 0)], 0.0)
        sa_total = float(self.cum_a[-1]) if self.cum_a.size else 0.0
        value = np.maximum(sa - c * sb, 0.0)
        n = self.width.size
        return value + (4 * n + 32) * _U * sa + 8 * _U * sa_total

    def smallest_c(self, budget: np.ndarray) -> np.ndarray:
        """Smallest c ≥ 1 with ``integral(c) ≤ budget`` (inf where no c works or budget < 0).

        With r₀ ≥ r₁ ≥ … the sorted breakpoints, integral(c) = SA_j − c·SB_j on [r_j, r_{j−1})
        (SA_j, SB_j: sums over cells 0..j−1), and integral(r_j) is non-decreasing in j. For
        budget b ≥ 0 let j* be the first j with integral(r_j) > b (j* ≥ 1 since
        integral(r₀) = 0; j* = n if none): the smallest c ≥ 0 meeting b is
        max(0, (SA_{j*} − b)/SB_{j*}) (inf when SB_{j*} = 0 < SA_{j*} − b: cells with f'(u_i) = 0
        contribute whatever c is).
        """
        budget = np.asarray(budget, dtype=float)
        r = self.r_sorted
        sa = np.concatenate([[0.0], self.cum_a])  # sa[j] = Σ_{i<j} width·A
        sb = np.concatenate([[0.0], self.cum_b])
        with np.errstate(invalid="ignore"):
            at_r = np.where(np.isinf(r), 0.0, sa[:-1] - r * sb[:-1])  # integral(r_j)
        at_r = np.maximum.accumulate(at_r)  # guard against rounding (it is non-decreasing)
        out = np.full(budget.shape, np.inf)
        ok = budget >= 0
        b = budget[ok]
        j = np.searchsorted(at_r, b, side="right")
        j = np.maximum(j, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = (sa[j] - b) / sb[j]
        c = np.where((sb[j] == 0) & (sa[j] <= b), 0.0, c)
        c = np.where(np.isnan(c), np.inf, c)
        out[ok] = np.maximum(c, 1.0)
        return out


def _integrand(env: _Envelope, law: StoppingLaw) -> _Integrand:
    log_a = law.log_fprime(env.wg[1:])  # f'(G(u_{i+1})) ≥ f' on the cell
    log_b = law.log_fprime(env.w[:-1])  # f'(u_i) ≤ f' on the cell
    a, b = np.exp(log_a), np.exp(log_b)
    keep = (env.width > 0) & (a > 0)
    width, a, b = env.width[keep], a[keep], b[keep]
    with np.errstate(divide="ignore"):
        r = a / b
    order = np.argsort(-r, kind="stable")
    width, a, b, r = width[order], a[order], b[order], r[order]
    return _Integrand(
        width=width,
        a=a,
        b=b,
        r_sorted=r,
        cum_a=np.cumsum(width * a),
        cum_b=np.cumsum(width * b),
    )


@functools.lru_cache(maxsize=32)  # ~1 MB each
def _prepared(curve: HockeyStickCurve, orientation: int, law: StoppingLaw) -> _Integrand:
    return _integrand(_envelope(curve, orientation), law)


def _oriented_delta(curve: HockeyStickCurve, o: int, law: StoppingLaw, eps: float) -> float:
    integ = _prepared(curve, o, law)
    fwd = curve.orientations()[o][0]
    sel = curve.t <= eps
    t, d = curve.t[sel], fwd[sel]
    ek = law.expected_k
    fast = ek * d + np.exp(t) * integ.integral(np.exp(eps - t))
    best = np.argsort(fast, kind="stable")[:_N_CHECKED]
    t, d = t[best], d[best]
    checked = (ek * d + np.exp(t) * integ.checked_integral(np.exp(eps - t))) * (1 + 8 * _U)
    return float(np.min(checked))


def selection_delta_many(curve: HockeyStickCurve, law: StoppingLaw, epsilons: np.ndarray
                         ) -> np.ndarray:
    """:func:`selection_delta` at many ε ≥ 0 at once (vectorised; for
    :mod:`raydp_hpo.accounting.profiles_subsampled`). Per ε and orientation only the best ε₁ by the fast
    sum is kept (a minimum over fewer valid ε₁ is still valid), its value with the rigorous
    rounding bound of :meth:`_Integrand.integral_upper` added.
    """
    eps = np.asarray(epsilons, dtype=float)
    if eps.ndim != 1 or np.any(~(eps >= 0)):
        raise InvalidParameterError("epsilons must be a 1-D array of numbers >= 0")
    worst = np.zeros(eps.shape)
    ek = law.expected_k
    for o, (fwd, _rev) in enumerate(curve.orientations()):
        integ = _prepared(curve, o, law)
        t = curve.t
        best = np.empty(eps.size, dtype=int)
        low = np.empty(eps.size, dtype=bool)
        for i, e in enumerate(eps):
            n = int(np.searchsorted(t, e, side="right"))
            fast = ek * fwd[:n] + np.exp(t[:n]) * integ.integral(np.exp(e - t[:n]))
            best[i] = int(np.argmin(fast))
            low[i] = fast[best[i]] < 0.5  # else the bound is checked as 1 (trivially valid)
        checked = np.ones(eps.size)
        tb = t[best[low]]
        checked[low] = (
            ek * fwd[best[low]] + np.exp(tb) * integ.integral_upper(np.exp(eps[low] - tb))
        ) * (1 + 8 * _U)
        worst = np.maximum(worst, checked)
    return np.minimum(worst, 1.0)


def _oriented_epsilon(curve: HockeyStickCurve, o: int, law: StoppingLaw, delta: float) -> float:
    integ = _prepared(curve, o, law)
    fwd = curve.orientations()[o][0]
    ek = law.expected_k
    budget = (delta * (1 - 1e-9) - ek * fwd) / np.exp(curve.t)
    c = integ.smallest_c(budget)
    with np.errstate(divide="ignore"):
        eps_j = np.maximum(curve.t + np.log(c), curve.t)  # ε₂ ≥ 0
    return float(np.min(eps_j))


def selection_delta(curve: HockeyStickCurve, law: StoppingLaw, epsilon: float) -> float:
    """Upper bound on δ_M(ε) of best-of-K over a base with profile ``curve`` (theorem above).

    For each neighbour orientation (forward d→, reverse d←): min over ε₁ ∈ t-grid ∩ [0, ε] of
    E[K]·d→(ε₁) + e^{ε₁}·(upper sum at e^{ε − ε₁}) (rounding bounded as in the module
    docstring); then the maximum over orientations; capped at 1.
    """
    eps = nonnegative_float("epsilon", epsilon)
    worst = max(
        _oriented_delta(curve, o, law, eps) for o in range(len(curve.orientations()))
    )
    return float(min(1.0, worst))


def selection_epsilon(curve: HockeyStickCurve, law: StoppingLaw, delta: float) -> float:
    """Smallest ε (up to rounding upward) with :func:`selection_delta` ≤ ``delta``; inf if none.

    Per orientation and grid ε₁ = t_j the upper sum is piecewise linear and non-increasing in
    c = e^{ε₂}, so the smallest c meeting δ − pad − E[K]d→(t_j) ≥ e^{t_j}·sum(c) is found
    from the sorted breakpoints; ε = max over orientations of min_j t_j + log c_j. The
    result is then checked against :func:`selection_delta` and raised by doubling steps from
    1e-9 (relative) until the check passes.
    """
    delta = open_unit_float("delta", delta)
    eps = max(
        _oriented_epsilon(curve, o, law, delta) for o in range(len(curve.orientations()))
    )
    if not math.isfinite(eps):
        return math.inf
    step = 1e-9 * max(1.0, eps)
    for _ in range(200):
        if selection_delta(curve, law, eps) <= delta:
            return eps
        eps += step
        step *= 2.0
    return math.inf  # pragma: no cover - the bound is monotone; never reached in tests


def pure_selection_epsilon(epsilon0: float, law: StoppingLaw) -> float:
    """ε of a selection over an ε₀-DP base (pure-DP corollary in the module docstring)."""
    e0 = nonnegative_float("epsilon0", epsilon0)
    if law.kind is LawKind.TRUNCATED_NEGATIVE_BINOMIAL:
        g = law.gamma
        # log((e^{ε₀} + γ)/(1 + γe^{ε₀})) computed stably
        extra = (e0 + math.log1p(g * math.exp(-e0))) - math.log1p(g * math.exp(e0)) if e0 < 700 else e0
        return e0 + (1.0 + law.eta) * max(0.0, extra)
    if law.kind is LawKind.POISSON:
        return e0 + law.mu * math.tanh(e0 / 2.0)
    if law.m == 1:
        return e0
    p = law.p
    if p == 1.0:
        return e0 * law.m
    num = e0 + math.log1p((1.0 - p) * math.exp(-e0))  # log(e^{ε₀} + 1 − p)
    den = math.log1p(-p) + e0 + math.log1p(math.exp(-e0) / (1.0 - p))  # log((1 − p)e^{ε₀} + 1)
    return e0 + (law.m - 1) * max(0.0, num - den)


# ------------------------------------------------------------- mechanism-level bounds


def _base_pure_epsilon(base: Mechanism) -> float | None:
    from raydp_hpo.accounting.pure import pure_epsilon

    return pure_epsilon(base)


def _rdp_epsilon(m: Mechanism, delta: float) -> float:
    from raydp_hpo.accounting.rdp import rdp_profile

    try:
        return rdp_profile(m).epsilon(delta)
    except UnsupportedMechanismError:
        return math.inf


def _rdp_delta(m: Mechanism, epsilon: float) -> float:
    from raydp_hpo.accounting.rdp import rdp_profile

    try:
        return rdp_profile(m).delta(epsilon)
    except UnsupportedMechanismError:
        return 1.0


def _profile_only_epsilon(m: RandomStopping, delta: float) -> float:
    try:
        curve = base_curve(m.base)
    except UnsupportedMechanismError:
        return math.inf
    return selection_epsilon(curve, stopping_law(m), delta)


def random_stopping_epsilon(mechanism: RandomStopping, delta: float) -> float:
    """Upper bound on ε at ``delta`` of a :class:`RandomStopping`: the minimum of

    * the privacy-profile bound (:func:`selection_epsilon` on :func:`base_curve`),
    * the pure-DP corollary (:func:`pure_selection_epsilon`) when the base is pure DP,
    * Papernot & Steinke's RDP bound (Thm. 2 / Thm. 6, :mod:`raydp_hpo.accounting.rdp`).

    Each is a valid upper bound for the same mechanism, so their minimum is one. Cached per
    (mechanism, δ): a calibration asks the same σ of the searcher's rule and of the ledger.
    """
    if not isinstance(mechanism, RandomStopping):
        raise InvalidParameterError(f"expected a RandomStopping, got {mechanism!r}")
    return _random_stopping_epsilon(mechanism, open_unit_float("delta", delta))


@functools.lru_cache(maxsize=256)
def _random_stopping_epsilon(mechanism: RandomStopping, delta: float) -> float:
    candidates = [_profile_only_epsilon(mechanism, delta), _rdp_epsilon(mechanism, delta)]
    pure = _base_pure_epsilon(mechanism.base)
    if pure is not None:
        candidates.append(pure_selection_epsilon(pure, stopping_law(mechanism)))
    return float(min(candidates))


def random_stopping_delta(mechanism: RandomStopping, epsilon: float) -> float:
    """Upper bound on δ at ``epsilon`` of a :class:`RandomStopping` (minimum of the same bounds)."""
    if not isinstance(mechanism, RandomStopping):
        raise InvalidParameterError(f"expected a RandomStopping, got {mechanism!r}")
    eps = nonnegative_float("epsilon", epsilon)
    law = stopping_law(mechanism)
    pure = _base_pure_epsilon(mechanism.base)
    if pure is not None and pure_selection_epsilon(pure, law) <= eps:
        return 0.0
    candidates = [_rdp_delta(mechanism, eps)]
    with contextlib.suppress(UnsupportedMechanismError):
        candidates.append(selection_delta(base_curve(mechanism.base), law, eps))
    return float(min(candidates))


# -------------------------------------------------------------------- composition

#: Shares s of the total δ tried for the (εᵢ, δᵢ) points of the mechanisms without a PLD
#: (δᵢ = s·δ/n each; 0.5 is :data:`raydp_hpo.accounting.pld.NON_PLD_DELTA_FRACTION`, the PLD accountant's).
DELTA_SPLITS: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)


def _leaves(mechs: Iterable[Mechanism]) -> list[Mechanism]:
    out: list[Mechanism] = []
    for m in mechs:
        if isinstance(m, Composition):
            out.extend(_leaves(m.mechanisms))
        else:
            out.append(m)
    return out


def _point_epsilon(m: Mechanism, delta_i: float) -> float:
    """ε of an (ε, δᵢ) guarantee of a leaf without a PLD: the smallest valid one.

    * RandomStopping: :func:`random_stopping_epsilon` (profile, pure corollary, P&S RDP);
    * SubsampledTuning: the smaller of its K&K RDP figure and the joint-convexity profile
      bound of :mod:`raydp_hpo.accounting.profiles_subsampled`;
    * WorstCase: the smaller of its RDP figure and the largest of its candidates' points. The
      maximum is valid in every use of WorstCase here: a base drawn from the candidates
      independently of the data is a mixture, and H_γ of a mixture is at most the largest
      H_γ (joint convexity); a neighbouring pair covered by one of the candidates (subsampled
      transfer: a training or a validation record) is bounded by that candidate's point.
    """
    if isinstance(m, RandomStopping):
        return random_stopping_epsilon(m, delta_i)
    candidates = [_rdp_epsilon(m, delta_i)]
    if isinstance(m, SubsampledTuning):
        from raydp_hpo.accounting.profiles_subsampled import subsampled_tuning_epsilon

        with contextlib.suppress(UnsupportedMechanismError):
            candidates.append(subsampled_tuning_epsilon(m, delta_i))
    if isinstance(m, WorstCase):
        candidates.append(max(_point_epsilon(c, delta_i) for c in m.candidates))
    pure = _base_pure_epsilon(m)
    if pure is not None:
        candidates.append(pure)
    return float(min(candidates))


def profile_epsilon(mechanisms: Sequence[Mechanism], delta: float) -> float:
    """ε at ``delta`` of a composition in which random stopping is accounted by profiles.

    * A lone :class:`RandomStopping`: :func:`random_stopping_epsilon` at ``delta``.
    * Otherwise: the leaves with a PLD are composed by dp-accounting (as
      :func:`raydp_hpo.accounting.pld.pld_epsilon` does); each of the n leaves without one (random
      stopping, subsampled tuning, worst cases over such) gets an explicit δᵢ = s·δ/n and its
      smallest valid εᵢ at δᵢ (:func:`_point_epsilon`: for random stopping the profile,
      pure-DP corollary or P&S RDP; for subsampled tuning K&K RDP or the joint-convexity
      profile bound; for a worst case its RDP or its candidates' largest point). A lone leaf
      without a PLD gets its point at the whole δ. An (εᵢ, δᵢ)-DP mechanism is
      dominated by the canonical (εᵢ, δᵢ) pair (Kairouz, Oh & Viswanath 2015, Thm. 2.1 /
      Murtagh & Vadhan 2016), whose PLD is dp-accounting's ``from_privacy_parameters``; PLD
      composition of dominating pairs is valid, also adaptively (Zhu, Dong & Wang 2022,
      Thm. 10). The composed PLD's ε at the total δ then accounts for the point masses δᵢ at
      +∞ automatically. The share s is tried over :data:`DELTA_SPLITS` (public constants, so
      the minimum over them is still a valid bound) and the smallest ε is returned.

    The pure-DP sum is a cap as everywhere in :mod:`raydp_hpo.accounting`, which also takes
    the minimum with the RDP composition. Measured: one point is lossy in composition (its
    worst-case pair puts all the privacy loss at ±εᵢ). For the reference selection
    (logarithmic, E[K] = 10 over σ = 1, q = 0.01, T = 1000) plus one more such DP-SGD run,
    δ = 1e-5: 4.671 here vs 4.333 RDP vs 5.538 PLD, so RDP is reported; one selection with
    a cheap final run, or a lone selection, is where this route wins. A dominating pair
    built from both orientation curves (connect-the-dots) would compose better; it needs its
    own proof and is not done.
    """
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    from raydp_hpo.accounting import pld

    delta = open_unit_float("delta", delta)
    leaves = _leaves(mechanisms)
    if not leaves:
        raise InvalidParameterError("at least one mechanism is needed, got none")
    if len(leaves) == 1 and isinstance(leaves[0], RandomStopping):
        return random_stopping_epsilon(leaves[0], delta)
    if len(leaves) == 1 and not pld.has_pld(leaves[0]):
        return _point_epsilon(leaves[0], delta)  # alone: its own guarantee at the whole δ
    with_pld = [m for m in leaves if pld.has_pld(m)]
    without = [m for m in leaves if not pld.has_pld(m)]
    if not without:
        return pld.pld_epsilon(with_pld, delta)
    composed = None
    if with_pld:
        composed = pld._pld_of(Composition(tuple(with_pld)), 0.0)
    best = math.inf
    for share in DELTA_SPLITS:
        delta_i = share * delta / len(without)
        total = composed
        ok = True
        for m in without:
            eps_i = _point_epsilon(m, delta_i)
            if not math.isfinite(eps_i):
                ok = False
                break
            p = pld_lib.from_privacy_parameters(
                pld_common.DifferentialPrivacyParameters(eps_i, delta_i), pld.VALUE_DISCRETIZATION
            )
            total = p if total is None else total.compose(p)
        if ok and total is not None:
            best = min(best, float(total.get_epsilon_for_delta(delta)))
    return best


def profile_delta(mechanisms: Sequence[Mechanism], epsilon: float) -> float:
    """δ at ``epsilon`` under profile accounting: a lone :class:`RandomStopping`
    (:func:`random_stopping_delta`) or a composition of mechanisms that all have a PLD.

    A composition with a selection in it has no δ(ε) curve here (its selection enters through
    one (ε, δ) point): :class:`~raydp_hpo.errors.UnsupportedMechanismError`.
    """
    from raydp_hpo.accounting import pld

    eps = nonnegative_float("epsilon", epsilon)
    leaves = _leaves(mechanisms)
    if len(leaves) == 1 and isinstance(leaves[0], RandomStopping):
        return random_stopping_delta(leaves[0], eps)
    if all(pld.has_pld(m) for m in leaves):
        return pld.pld_delta(leaves, eps)
    raise UnsupportedMechanismError(
        "δ(ε) under profile accounting is defined for a lone RandomStopping or for mechanisms "
        "that all have a PLD; use Accountant.RDP for δ(ε) of this composition"
    )
