"""The laws of the number of runs K of a random-stopping selection, by their PGFs.

A :class:`StoppingLaw` is the law of K by its probability generating function f(x) = E[x^K]
and the derivative f' the profile bound of :mod:`raydp_hpo.accounting.profiles` integrates:
truncated negative binomial (Papernot & Steinke 2022, Def. 1), Poisson and binomial;
:func:`stopping_law` is the law a :class:`~raydp_hpo.accounting.mechanisms.RandomStopping`
samples (the searcher's law, with γ from E[K] as the searcher computes it). Re-exported by
:mod:`raydp_hpo.accounting.profiles`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from raydp_hpo._validation import (
    nonnegative_float,
    positive_float,
    positive_int,
    unit_interval_float,
)
from raydp_hpo.accounting._rdp_kernels import truncated_negative_binomial_gamma
from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution
from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "LawKind",
    "StoppingLaw",
    "truncated_negative_binomial_law",
    "poisson_law",
    "binomial_law",
    "stopping_law",
]


class LawKind(Enum):
    """Family of the law of K (one PGF each)."""

    TRUNCATED_NEGATIVE_BINOMIAL = "truncated_negative_binomial"
    POISSON = "poisson"
    BINOMIAL = "binomial"


@dataclass(frozen=True)
class StoppingLaw:
    """Law of the number of runs K, by its PGF f(x) = E[x^K].

    * truncated negative binomial (Papernot & Steinke 2022, Def. 1), η ≥ 0 (η = 0 logarithmic,
      η = 1 geometric), γ ∈ (0, 1):
      f(x) = ((1 − (1 − γ)x)^{−η} − 1)/(γ^{−η} − 1) (η = 0: log(1 − (1 − γ)x)/log γ),
      f'(x) = η(1 − γ)(1 − (1 − γ)x)^{−η−1}/(γ^{−η} − 1) (η = 0: (1 − γ)/((1 − (1 − γ)x)·log(1/γ))),
      f(0) = 0;
    * Poisson(μ): f(x) = e^{μ(x − 1)}, f'(x) = μe^{μ(x − 1)}, f(0) = e^{−μ};
    * binomial(m, p): f(x) = (1 − p + px)^m, f'(x) = mp(1 − p + px)^{m − 1}, f(0) = (1 − p)^m.

    Build with :func:`truncated_negative_binomial_law`, :func:`poisson_law`,
    :func:`binomial_law` or :func:`stopping_law`.
    """

    kind: LawKind
    eta: float = 0.0
    gamma: float = 0.0
    mu: float = 0.0
    m: int = 0
    p: float = 0.0

    def log_fprime(self, w: np.ndarray) -> np.ndarray:
        """log f'(1 − w) for w = 1 − x ∈ [0, 1] (the complement keeps precision near x = 1)."""
        w = np.asarray(w, dtype=float)
        if self.kind is LawKind.TRUNCATED_NEGATIVE_BINOMIAL:
            g = self.gamma
            base = g + (1.0 - g) * w  # 1 − (1 − γ)x
            return self._log_tnb_constant() - (self.eta + 1.0) * np.log(base)
        if self.kind is LawKind.POISSON:
            return math.log(self.mu) - self.mu * w
        if self.m == 1:
            return np.full_like(w, math.log(self.p))
        with np.errstate(divide="ignore"):
            return math.log(self.m * self.p) + (self.m - 1) * np.log1p(-self.p * w)

    def _log_tnb_constant(self) -> float:
        """log of η(1 − γ)/(γ^{−η} − 1) (η > 0) or (1 − γ)/log(1/γ) (η = 0)."""
        g, eta = self.gamma, self.eta
        if eta == 0.0:
            return math.log1p(-g) - math.log(-math.log(g))
        return math.log(eta) + math.log1p(-g) - math.log(math.expm1(-eta * math.log(g)))

    @property
    def expected_k(self) -> float:
        """E[K] = f'(1) of this exact law (for the TNB: of its γ, not the nominal mean)."""
        return float(math.exp(float(self.log_fprime(np.array([0.0]))[0])))

    @property
    def f0(self) -> float:
        """P[K = 0] = f(0): the probability that nothing is selected."""
        if self.kind is LawKind.TRUNCATED_NEGATIVE_BINOMIAL:
            return 0.0
        if self.kind is LawKind.POISSON:
            return math.exp(-self.mu)
        return (1.0 - self.p) ** self.m

    def pgf(self, x: np.ndarray) -> np.ndarray:
        """f(x) = E[x^K] on [0, 1] (used by tests for exact output laws)."""
        x = np.asarray(x, dtype=float)
        if self.kind is LawKind.TRUNCATED_NEGATIVE_BINOMIAL:
            g, eta = self.gamma, self.eta
            inner = 1.0 - (1.0 - g) * x
            if eta == 0.0:
                return np.log(inner) / math.log(g)
            return np.expm1(-eta * np.log(inner)) / math.expm1(-eta * math.log(g))
        if self.kind is LawKind.POISSON:
            return np.exp(self.mu * (x - 1.0))
        return (1.0 - self.p + self.p * x) ** self.m


def truncated_negative_binomial_law(eta: float, mean: float) -> StoppingLaw:
    """TNB(η, γ) with γ from ``mean`` exactly as the searcher samples it (see module doc).

    ``mean`` = 1 can give γ = 1 (K = 1 surely; returned as binomial(1, 1)) or a γ a hair
    below 1, which is the law the searcher then samples and is used as it is.
    """
    eta = nonnegative_float("eta", eta)
    mean = positive_float("mean", mean)
    if mean < 1.0:
        raise InvalidParameterError(
            f"mean must be >= 1 for a truncated negative binomial law, got mean={mean!r}"
        )
    gamma = truncated_negative_binomial_gamma(eta, mean)
    if gamma >= 1.0:
        return binomial_law(1, 1.0)
    if not gamma > 0.0:  # pragma: no cover - the bisection stays inside (0, 1]
        raise InvalidParameterError(f"no γ in (0, 1) for eta={eta!r}, mean={mean!r}")
    return StoppingLaw(LawKind.TRUNCATED_NEGATIVE_BINOMIAL, eta=eta, gamma=gamma)


def poisson_law(mean: float) -> StoppingLaw:
    """Poisson(μ) with μ = ``mean`` (K = 0, nothing selected, has probability e^{−μ})."""
    return StoppingLaw(LawKind.POISSON, mu=positive_float("mean", mean))


def binomial_law(m: int, p: float) -> StoppingLaw:
    """Binomial(m, p): E[K] = mp, K ≤ m (p = 1 is the fixed K = m)."""
    return StoppingLaw(
        LawKind.BINOMIAL, m=positive_int("m", m), p=unit_interval_float("p", p)
    )


def stopping_law(mechanism: RandomStopping) -> StoppingLaw:
    """The law of K that the random-stopping searcher samples for ``mechanism``."""
    if mechanism.distribution is StoppingDistribution.POISSON:
        return poisson_law(mechanism.mean)
    if mechanism.trials is not None:
        m = mechanism.trials
        return binomial_law(m, min(1.0, mechanism.mean / m))
    return truncated_negative_binomial_law(mechanism.eta, mechanism.mean)
