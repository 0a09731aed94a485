"""Rényi-DP curves of every mechanism, and RDP → (ε, δ) conversion.

An :class:`RdpProfile` holds an upper bound on the RDP ε(α) of a mechanism at each order α of
:data:`DEFAULT_ORDERS`, plus an (ε₀, δ₀) part for components that only have an approximate-DP
guarantee (:class:`~raydp_hpo.accounting.mechanisms.ApproxDP`), composed on the side by basic composition
(Dwork et al. 2006): if the RDP part gives (ε_R, δ − δ₀), the whole is (ε_R + ε₀, δ)-DP.

Sources of each curve:

* Poisson-subsampled Gaussian: vectorised A_α at integer orders, the fractional-order series
  of Mironov, Talwar & Zhang (2019, Sec. 3.3) elsewhere. Gaussian: α/(2σ²). Laplace: Mironov
  (2017, Prop. 6). The scalar kernels are a port of dp-accounting's (:mod:`raydp_hpo.accounting._rdp_kernels`,
  golden-tested against dp-accounting), so RDP accounting never imports dp-accounting.
* Pure ε-DP: min(ε, αε²/2) (Mironov 2017, Prop. 3; Bun & Steinke 2016, Prop. 3.3).
* Worst case over candidates: pointwise maximum.
* Random stopping over any base curve: Papernot & Steinke (2022) Thm. 2 (truncated negative
  binomial) / Thm. 6 (Poisson), ported from dp-accounting's implementation of those formulas.
* Subsampled tuning: Koskela & Kulkarni (2023, "Practical Differentially Private
  Hyperparameter Tuning with Subsampling", arXiv:2301.11989), their RDP bound for tuning on
  a Poisson subsample and a final run on the rest; integer orders, log-space.

Conversions: :func:`rdp_to_epsilon` uses the improved bound of Canonne, Kamath & Steinke
(2020, Prop. 12) / Asoodeh et al. (2020) (dp-accounting's ``compute_epsilon``);
:func:`classic_rdp_to_epsilon` is Mironov (2017, Prop. 3), ε = ε(α) + log(1/δ)/(α − 1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from raydp_hpo.accounting import _rdp_kernels
from raydp_hpo.accounting.mechanisms import (
    ApproxDP,
    Composition,
    Gaussian,
    Laplace,
    Mechanism,
    PureDP,
    RandomStopping,
    SubsampledGaussian,
    SubsampledTuning,
    WorstCase,
)
from raydp_hpo.errors import InvalidParameterError, UnsupportedMechanismError

__all__ = [
    "DEFAULT_ORDERS",
    "MAX_INTEGER_ORDER",
    "RdpProfile",
    "rdp_profile",
    "rdp_to_epsilon",
    "rdp_to_delta",
    "classic_rdp_to_epsilon",
    "koskela_kulkarni_rdp",
    "repeat_and_select_rdp",
    "subsampled_gaussian_rdp",
]

#: Largest integer order at which every order 2..N is present (Koskela–Kulkarni needs them all).
MAX_INTEGER_ORDER = 256


def _default_orders() -> np.ndarray:
    fractional_low: list[float] = [1.01, 1.05] + [1.0 + x / 10.0 for x in range(1, 10)]
    fractional_mid = [k + f for k in range(2, 12) for f in (0.25, 0.5, 0.75)]
    integers: list[float] = [float(a) for a in range(2, MAX_INTEGER_ORDER + 1)]
    large: list[float] = [320.0, 384.0, 448.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0]
    return np.array(sorted(set(fractional_low + fractional_mid + integers + large)), dtype=float)


#: The RDP order grid: fractional orders near 1, quarter orders up to 12, every integer
#: 2..256 (needed by the Koskela–Kulkarni theorem) and large orders for small-δ regimes.
DEFAULT_ORDERS: np.ndarray = _default_orders()
DEFAULT_ORDERS.setflags(write=False)
_INTEGER_INDEX = {int(a): i for i, a in enumerate(DEFAULT_ORDERS) if float(a).is_integer()}


@dataclass(frozen=True, eq=False)
class RdpProfile:
    """RDP upper bounds ε(α) on :data:`DEFAULT_ORDERS`, plus a basic-composition (ε₀, δ₀) part."""

    values: np.ndarray
    side_epsilon: float = 0.0
    side_delta: float = 0.0

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=float)
        if values.shape != DEFAULT_ORDERS.shape:
            raise InvalidParameterError(
                f"RDP values have shape {values.shape}, orders have {DEFAULT_ORDERS.shape}"
            )
        values = values.copy()
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    @classmethod
    def zero(cls) -> RdpProfile:
        return cls(np.zeros_like(DEFAULT_ORDERS))

    def __add__(self, other: RdpProfile) -> RdpProfile:
        """Sequential composition: RDP adds order-wise (Mironov 2017, Prop. 1)."""
        return RdpProfile(
            self.values + other.values,
            self.side_epsilon + other.side_epsilon,
            self.side_delta + other.side_delta,
        )

    def scaled(self, count: int) -> RdpProfile:
        return RdpProfile(
            self.values * count, self.side_epsilon * count, self.side_delta * count
        )

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` (improved conversion), +inf when δ₀ already uses all of δ."""
        if self.side_delta >= delta:
            return math.inf
        return rdp_to_epsilon(self.values, delta - self.side_delta) + self.side_epsilon

    def delta(self, epsilon: float) -> float:
        """δ at ``epsilon`` (improved conversion), 1 when ε₀ already exceeds ε."""
        if self.side_epsilon > epsilon:
            return 1.0
        return min(1.0, rdp_to_delta(self.values, epsilon - self.side_epsilon) + self.side_delta)


def rdp_to_epsilon(values: np.ndarray, delta: float, orders: np.ndarray = DEFAULT_ORDERS) -> float:
    """Smallest ε over orders for which the RDP curve implies (ε, δ)-DP.

    Canonne, Kamath & Steinke (2020), Prop. 12: (α, ρ)-RDP implies (ε, δ)-DP with
    ε = ρ + log1p(−1/α) − log(δ·α)/(α − 1); a vectorised form of dp-accounting's
    ``compute_epsilon`` (golden-tested against it).
    """
    values = np.asarray(values, dtype=float)
    if np.any(np.isnan(values)):
        return math.inf
    if delta <= 0:
        raise InvalidParameterError(f"delta must be > 0, got delta={delta!r}")
    orders = np.asarray(orders, dtype=float)
    # Vectorised form of dp-accounting's compute_epsilon (same cases, golden-tested):
    # r < 0 (numerical noise) → 0; δ² + expm1(−r) > 0 (KL bound) → 0; α > 1.01 → CKS bound;
    # otherwise no claim (+inf).
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        cks = values + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
        kl_ok = delta**2 + np.expm1(-values) > 0
    eps = np.where(orders > 1.01, cks, np.inf)
    eps = np.where(kl_ok, 0.0, eps)
    eps = np.where(values < 0, 0.0, eps)
    eps = np.where(np.isnan(eps), np.inf, eps)
    return float(max(0.0, float(np.min(eps))))


def rdp_to_delta(values: np.ndarray, epsilon: float, orders: np.ndarray = DEFAULT_ORDERS) -> float:
    """Smallest δ over orders for which the RDP curve implies (ε, δ)-DP (same proposition)."""
    delta, _ = _rdp_kernels.compute_delta(orders, values, epsilon)
    return float(delta)


def classic_rdp_to_epsilon(
    values: np.ndarray, delta: float, orders: np.ndarray = DEFAULT_ORDERS
) -> float:
    """Mironov (2017), Prop. 3: ε = min_α ε(α) + log(1/δ)/(α − 1). Used by Abadi et al.'s figure."""
    orders = np.asarray(orders, dtype=float)
    mask = orders > 1
    eps = np.asarray(values)[mask] + math.log(1 / delta) / (orders[mask] - 1)
    return float(np.min(eps))


@functools.lru_cache(maxsize=4096)
def _rdp_cached(mechanism: Mechanism) -> RdpProfile:
    return _compute_rdp(mechanism)


def rdp_profile(mechanism: Mechanism) -> RdpProfile:
    """The RDP profile of ``mechanism`` (cached: mechanisms are immutable values)."""
    return _rdp_cached(mechanism)


def _compute_rdp(m: Mechanism) -> RdpProfile:
    if isinstance(m, SubsampledGaussian):
        per_step = _subsampled_gaussian_rdp_cached(m.sample_rate, m.noise_multiplier)
        return RdpProfile(per_step * m.steps)
    if isinstance(m, Gaussian):
        # Exact: ε(α) = α·count/(2σ²) (Mironov 2017, Prop. 7).
        return RdpProfile(DEFAULT_ORDERS * m.count / (2.0 * m.noise_multiplier**2))
    if isinstance(m, Laplace):
        # Exact (Mironov 2017, Prop. 6), composed count times.
        per = np.array([_rdp_kernels.laplace_rdp(m.epsilon, a) for a in DEFAULT_ORDERS])
        return RdpProfile(per * m.count)
    if isinstance(m, PureDP):
        per = np.minimum(m.epsilon, DEFAULT_ORDERS * m.epsilon**2 / 2.0)
        return RdpProfile(per * m.count)
    if isinstance(m, ApproxDP):
        return RdpProfile(
            np.zeros_like(DEFAULT_ORDERS), side_epsilon=m.epsilon * m.count, side_delta=m.delta * m.count
        )
    if isinstance(m, Composition):
        total = RdpProfile.zero()
        for part in m.mechanisms:
            total = total + rdp_profile(part)
        return total
    if isinstance(m, WorstCase):
        profiles = [rdp_profile(c) for c in m.candidates]
        _require_pure_rdp("WorstCase", profiles)
        return RdpProfile(np.max(np.stack([p.values for p in profiles]), axis=0))
    if isinstance(m, RandomStopping):
        base = rdp_profile(m.base)
        _require_pure_rdp("RandomStopping.base", [base])
        if m.trials is not None:
            # Binomial K ≤ m: a post-processing of the m-fold composition (see RandomStopping)
            return base.scaled(m.trials)
        return RdpProfile(repeat_and_select_rdp(base.values, mean=m.mean, eta=m.eta))
    if isinstance(m, SubsampledTuning):
        tuning, final = rdp_profile(m.tuning), rdp_profile(m.final)
        _require_pure_rdp("SubsampledTuning", [tuning, final])
        return RdpProfile(koskela_kulkarni_rdp(tuning.values, final.values, m.subsample_rate))
    raise UnsupportedMechanismError(f"no RDP bound for {m!r}")


@functools.lru_cache(maxsize=4096)
def _subsampled_gaussian_rdp_cached(q: float, sigma: float) -> np.ndarray:
    values = subsampled_gaussian_rdp(q, sigma)
    values.setflags(write=False)
    return values


def subsampled_gaussian_rdp(q: float, sigma: float) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step on :data:`DEFAULT_ORDERS`.

    Mironov, Talwar & Zhang (2019): ε(α) = log(A_α)/(α − 1). At integer α (Sec. 3.3),

        A_α = Σ_{i=0}^{α} C(α, i) (1 − q)^{α−i} q^i exp((i² − i)/(2σ²)),

    evaluated here as one log-sum-exp over a matrix of all orders (the per-term Python loop of
    dp-accounting is ~15× slower, too slow for ledger admission at 1000 charges), with the
    constant log C(α, i) matrix built once at import; fractional orders use the series of
    their Sec. 3.3 (fractional case), ported from dp-accounting and evaluated for all orders
    at once (:func:`raydp_hpo.accounting._rdp_kernels.log_a_frac_orders`). Golden-tested against dp-accounting at every
    order. q = 1 is the plain Gaussian, ε(α) = α/(2σ²).
    """
    orders = DEFAULT_ORDERS
    if q == 1.0:
        return orders / (2.0 * sigma**2)
    out = np.empty_like(orders)
    log_q, log_1q = math.log(q), math.log1p(-q)
    inv_2s2 = 1.0 / (2.0 * sigma**2)
    # All integer orders 2..MAX_INTEGER_ORDER at once: rows α, columns i (−inf for i > α).
    # The log-binomial matrix and the i, α − i, i² − i grids are constants, built at import.
    log_terms = _SMALL_LOG_BINOM + _SMALL_I * log_q  # same operation order as the formula
    log_terms += _SMALL_A_MINUS_I * log_1q
    log_terms += _SMALL_I2_MINUS_I * inv_2s2
    out[_SMALL_INT_INDEX] = _logsumexp_rows(log_terms) / (_SMALL_INT_ORDERS - 1)
    # The larger integer orders (320..4096) likewise, as one matrix padded with −inf.
    log_terms = _LARGE_LOG_BINOM + _LARGE_I * log_q
    log_terms += _LARGE_A_MINUS_I * log_1q
    log_terms += _LARGE_I2_MINUS_I * inv_2s2
    out[_LARGE_INT_INDEX] = _logsumexp_rows(log_terms) / (_LARGE_INT_ORDERS - 1)
    # The fractional-order series returns +inf (order excluded: no claim) when it does not
    # converge, which is routine near α = 1 for large q.
    out[_FRACTIONAL_INDEX] = _rdp_kernels.log_a_frac_orders(q, sigma, _FRACTIONAL_ORDERS) / (
        _FRACTIONAL_ORDERS - 1
    )
    return out


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """log Σ_j exp(x_ij) per row, rows with a finite maximum, computed as scipy ≥ 1.15 does:
    m + log(k) + log1p(Σ_{x_ij < m} e^{x_ij − m} / k) with m the row maximum and k the number
    of entries equal to it; the log1p keeps values near 0 accurate (α-th moments A_α ≈ 1).
    Same arithmetic as ``scipy.special.logsumexp(x, axis=1)`` without its per-call overhead."""
    m = x.max(axis=1, keepdims=True)
    at_max = x == m
    k = at_max.sum(axis=1, keepdims=True).astype(float)
    shifted = np.exp(x - m)
    shifted[at_max] = 0.0
    rest = shifted.sum(axis=1, keepdims=True) / k
    return (np.log1p(rest) + np.log(k) + m)[:, 0]


_INT_MASK = np.array([float(a).is_integer() for a in DEFAULT_ORDERS])
_SMALL_INT_INDEX = np.flatnonzero(_INT_MASK & (DEFAULT_ORDERS <= MAX_INTEGER_ORDER))
_SMALL_INT_ORDERS = DEFAULT_ORDERS[_SMALL_INT_INDEX]
_LARGE_INT_INDEX = np.flatnonzero(_INT_MASK & (DEFAULT_ORDERS > MAX_INTEGER_ORDER))
_FRACTIONAL_INDEX = np.flatnonzero(~_INT_MASK)
_FRACTIONAL_ORDERS = DEFAULT_ORDERS[_FRACTIONAL_INDEX]


def _integer_order_tables(orders: np.ndarray) -> tuple[np.ndarray, ...]:
    """Constant parts of the integer-order terms of :func:`subsampled_gaussian_rdp`.

    For the integer ``orders`` α (rows) and i = 0..max α (columns): log C(α, i) (−inf for
    i > α), i, α − i and i² − i, read-only. Built once at import (~6 ms for all orders).
    """
    top = int(orders.max())
    lgamma = gammaln(np.arange(top + 2, dtype=float) + 1)
    a = orders[:, None]
    i = np.arange(top + 1, dtype=float)[None, :]
    log_binom = lgamma[orders.astype(int)][:, None] - lgamma[: top + 1][None, :]
    log_binom = log_binom - lgamma[np.clip(a - i, 0, None).astype(int)]
    log_binom = np.where(i <= a, log_binom, -np.inf)
    zeros = np.zeros_like(log_binom)
    tables = (log_binom, i + zeros, a - i + zeros, i * i - i + zeros)
    for t in tables:
        t.setflags(write=False)
    return tables


_SMALL_LOG_BINOM, _SMALL_I, _SMALL_A_MINUS_I, _SMALL_I2_MINUS_I = _integer_order_tables(
    _SMALL_INT_ORDERS
)
_LARGE_INT_ORDERS = DEFAULT_ORDERS[_LARGE_INT_INDEX]
_LARGE_LOG_BINOM, _LARGE_I, _LARGE_A_MINUS_I, _LARGE_I2_MINUS_I = _integer_order_tables(
    _LARGE_INT_ORDERS
)


def _require_pure_rdp(where: str, profiles: list[RdpProfile]) -> None:
    if any(p.side_delta > 0 or p.side_epsilon > 0 for p in profiles):
        raise UnsupportedMechanismError(
            f"{where}: an ApproxDP component has no RDP curve, and this construction needs one"
        )


def repeat_and_select_rdp(base_rdp: np.ndarray, mean: float, eta: float) -> np.ndarray:
    """RDP of Papernot & Steinke (2022) random stopping over a base RDP curve.

    Truncated negative binomial D_{η,γ} (η ∈ [0, ∞), E[K] = ``mean``), Thm. 2:

        ε'(λ) = ε(λ) + (1 + η)·min_λ̂ [(1 − 1/λ̂)·ε(λ̂) + log(1/γ)/λ̂] + log(E[K])/(λ − 1),

    and Poisson (η = ∞), Thm. 6: ε'(λ) = ε(λ) + E[K]·δ̂ + log(E[K])/(λ − 1) with
    δ̂ = δ(log(1 + 1/(λ − 1))) of the base. Monotonicity of RDP in λ tightens low orders.
    Computed by the port of dp-accounting's implementation of these formulas
    (:func:`raydp_hpo.accounting._rdp_kernels.repeat_and_select_rdp`, golden-tested against it).
    """
    if math.isnan(mean) or mean < 1:
        raise InvalidParameterError(f"mean must be >= 1, got mean={mean!r}")
    return _rdp_kernels.repeat_and_select_rdp(DEFAULT_ORDERS, base_rdp, mean, eta)


def koskela_kulkarni_rdp(
    tuning_rdp: np.ndarray, final_rdp: np.ndarray, subsample_rate: float
) -> np.ndarray:
    """RDP of subsampled tuning + final run on the rest (Koskela & Kulkarni 2023, Theorem).

    With ε₁ the RDP of the tuning mechanism M₁ (run on the q-subsample X₁) and ε₂ that of the
    final mechanism M₂ (run on X ∖ X₁), for integer α ≥ 2 and Y = X ∪ {x'}:

        D_α(M(Y) ‖ M(X)) ≤ 1/(α−1) · log( q^α e^{(α−1)ε₁(α)} + (1−q)^α e^{(α−1)ε₂(α)}
              + Σ_{j=1}^{α−1} C(α, j) q^{α−j} (1−q)^j e^{(α−j−1)ε₁(α−j)} e^{(j−1)ε₂(j)} ).

    The other direction, D_α(M(X) ‖ M(Y)) with M(Y) = q·P₁ + (1−q)·P₂ a mixture in the second
    argument, is not stated in the paper ("a similar expression"). Bound used here (derived
    for this project; proof below):

        D_α(M(X) ‖ M(Y)) ≤ −log( q·e^{−ε₁(α)} + (1−q)·e^{−ε₂(α)} ).

    Proof. Condition on the subsample X₁ (the same law under X and Y restricted to X; joint
    convexity of e^{(α−1)D_α} over that common mixture leaves the supremum over X₁). Write
    P = A(θ)·B(θ₂|θ) for M(X) (A: M₁ on X₁; B: M₂ on X ∖ X₁ with hyperparameters from θ),
    P₁ = A'·B (x' fell into X₁, M₁ sees X₁ ∪ {x'}) and P₂ = A·B' (x' fell outside, M₂ sees it).
    Then M(Y)/P = qU + (1−q)V with U = A'/A (a function of θ) and V = B'/B. With β = α − 1,
    e^{βD_α(P‖M(Y))} = E_P[(qU + (1−q)V)^{−β}]. s ↦ s^{−β} is convex on s > 0, so for any fixed
    λ ∈ (0, 1), writing qU + (1−q)V = λ(qU/λ) + (1−λ)((1−q)V/(1−λ)),
    (qU + (1−q)V)^{−β} ≤ λ^α q^{−β} U^{−β} + (1−λ)^α (1−q)^{−β} V^{−β}. E_A[U^{−β}] =
    e^{βD_α(A‖A')} ≤ e^{βε₁(α)}, and E_B[V^{−β} | θ] ≤ e^{βε₂(α)} for every θ (ε₂ covers the
    worst hyperparameters). So E_P[…] ≤ λ^α a + (1−λ)^α b with a = q^{−β}e^{βε₁},
    b = (1−q)^{−β}e^{βε₂}; its minimum over λ is (a^{−1/β} + b^{−1/β})^{−β}
    = (q e^{−ε₁} + (1−q) e^{−ε₂})^{−β}. ∎ λ = q gives the joint-convexity bound
    (1/β)·log(q e^{βε₁(α)} + (1−q) e^{βε₂(α)}) used before, so the new bound is never larger;
    both are computed and the minimum kept. It needs ε₁, ε₂ to bound D_α(A‖A') and D_α(B‖B')
    (the "add" direction), true for every curve produced here: dp-accounting's subsampled
    Gaussian bound A_α dominates both directions (Mironov et al. 2019, Thm. 5), and
    Papernot & Steinke's selection bound holds for either order. Checked against numerical
    integration of Gaussian instances (M₁, M₂ Gaussian) in both directions in
    tests/raydp_hpo/accounting/test_accounting.py: at σ₁ = 0.8, σ₂ = 2.5, q = 0.05, α = 5 the reverse
    term is 0.450 (true 0.378; the old bound 3.157), below the forward term (true 0.484).
    The result is the maximum of both directions.

    Sums are evaluated in log space. The theorem needs every integer order up to α, so only
    integer orders 2..:data:`MAX_INTEGER_ORDER` get a direct value; fractional orders take the
    value of the next integer order (RDP is non-decreasing in α, van Erven & Harremoës 2014),
    orders above :data:`MAX_INTEGER_ORDER` are +inf (no bound claimed).
    """
    q = float(subsample_rate)
    if not 0.0 < q < 1.0:
        raise InvalidParameterError(f"subsample_rate must be in (0, 1), got {subsample_rate!r}")
    eps1 = {a: float(tuning_rdp[i]) for a, i in _INTEGER_INDEX.items()}
    eps2 = {a: float(final_rdp[i]) for a, i in _INTEGER_INDEX.items()}
    eps1[1] = eps2[1] = 0.0  # only ever multiplied by (1 − 1) = 0
    log_q, log_1q = math.log(q), math.log1p(-q)

    integer_values: dict[int, float] = {}
    for alpha in range(2, MAX_INTEGER_ORDER + 1):
        j = np.arange(1, alpha)
        log_binom = gammaln(alpha + 1) - gammaln(j + 1) - gammaln(alpha - j + 1)
        e1 = np.array([eps1[alpha - int(k)] for k in j])
        e2 = np.array([eps2[int(k)] for k in j])
        cross = log_binom + (alpha - j) * log_q + j * log_1q + (alpha - j - 1) * e1 + (j - 1) * e2
        terms = np.concatenate(
            [
                [alpha * log_q + (alpha - 1) * eps1[alpha]],
                [alpha * log_1q + (alpha - 1) * eps2[alpha]],
                cross,
            ]
        )
        forward = float(logsumexp(terms)) / (alpha - 1)
        convexity = float(
            logsumexp([log_q + (alpha - 1) * eps1[alpha], log_1q + (alpha - 1) * eps2[alpha]])
        ) / (alpha - 1)
        harmonic = -float(logsumexp([log_q - eps1[alpha], log_1q - eps2[alpha]]))
        integer_values[alpha] = max(forward, min(convexity, harmonic))

    out = np.full_like(DEFAULT_ORDERS, np.inf)
    for i, order in enumerate(DEFAULT_ORDERS):
        ceiling = math.ceil(order - 1e-12)
        if order <= 1:
            continue
        if ceiling <= MAX_INTEGER_ORDER:
            out[i] = integer_values[int(max(ceiling, 2))]
    # Orders in (1, 2) are bounded by the value at 2 (monotonicity), which is what ceil gives.
    return out
