"""Gaussian differential privacy (Dong, Roth & Su 2022) helpers used by Panda et al. (2024).

A mechanism is μ-GDP iff it is (ε, δ(ε))-DP for all ε ≥ 0 with (Dong et al., Cor. 2.13)

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2).

μ-GDP mechanisms compose to √(Σ μᵢ²)-GDP (Dong et al., Cor. 3.3); Panda et al. (2024) spend
their budget as μ_t = √(n·μ₁² + n·μ₂² + μ_f²). The Gaussian mechanism with noise multiplier σ
run T times is exactly (√T/σ)-GDP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from raydp_hpo._validation import nonnegative_float, open_unit_float, positive_float
from raydp_hpo.errors import InvalidParameterError

__all__ = ["gdp_delta", "gdp_epsilon", "gdp_mu", "compose_mu", "gaussian_mu"]


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a μ-GDP mechanism (exact; Dong, Roth & Su 2022, Cor. 2.13)."""
    mu = positive_float("mu", mu)
    epsilon = nonnegative_float("epsilon", epsilon)
    a = _phi(-epsilon / mu + mu / 2.0)
    # e^ε·Φ(−ε/μ − μ/2) computed in log space to avoid overflow at large ε.
    x = -epsilon / mu - mu / 2.0
    tail = 0.5 * math.erfc(-x / math.sqrt(2.0))
    b = math.exp(epsilon + math.log(tail)) if tail > 0 else 0.0
    return max(a - b, 0.0)


def gdp_epsilon(mu: float, delta: float, *, tol: float = 1e-12) -> float:
    """Smallest ε with δ(ε) ≤ ``delta`` for a μ-GDP mechanism (bisection, rounded up).

    >>> round(gdp_epsilon(1.0, 1e-5), 5)
    4.37718
    """
    mu = positive_float("mu", mu)
    delta = open_unit_float("delta", delta)
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            raise InvalidParameterError(f"no finite ε for mu={mu} at delta={delta}")
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2.0
        if gdp_delta(mu, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi  # δ(hi) ≤ delta: the conservative end


def gdp_mu(epsilon: float, delta: float, *, tol: float = 1e-12) -> float:
    """Largest μ whose μ-GDP guarantee implies (ε, δ)-DP (bisection, rounded down)."""
    epsilon = positive_float("epsilon", epsilon)
    delta = open_unit_float("delta", delta)
    lo, hi = 0.0, 1.0
    while gdp_delta(hi, epsilon) <= delta:
        hi *= 2.0
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2.0
        if gdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    if lo == 0.0:
        raise InvalidParameterError(f"no μ > 0 meets epsilon={epsilon} at delta={delta}")
    return lo  # δ(lo) ≤ delta: the conservative end


def compose_mu(mus: Iterable[float]) -> float:
    """μ of the composition of μᵢ-GDP mechanisms: √(Σ μᵢ²) (Dong, Roth & Su 2022, Cor. 3.3)."""
    values = [positive_float("mu", m) for m in mus]
    if not values:
        raise InvalidParameterError("compose_mu needs at least one μ, got none")
    return math.sqrt(math.fsum(m * m for m in values))


def gaussian_mu(noise_multiplier: float, count: int = 1) -> float:
    """μ = √count / σ of ``count`` Gaussian mechanisms with noise multiplier σ (sensitivity 1)."""
    sigma = positive_float("noise_multiplier", noise_multiplier)
    if count < 1:
        raise InvalidParameterError(f"count must be >= 1, got count={count!r}")
    return math.sqrt(count) / sigma
