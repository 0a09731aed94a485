"""Pure ε-DP bounds, where a mechanism has one.

A pure bound is exact bookkeeping (basic composition, Dwork et al. 2006) and is used in
addition to the RDP/PLD figures: every reported ε is the minimum of valid upper bounds.
"""

from __future__ import annotations

from raydp_hpo.accounting.mechanisms import (
    Composition,
    Laplace,
    Mechanism,
    PureDP,
    RandomStopping,
    StoppingDistribution,
    WorstCase,
)

__all__ = ["pure_epsilon"]


def pure_epsilon(m: Mechanism) -> float | None:
    """The ε of a pure ε-DP guarantee of ``m``, or ``None`` if it has none.

    * Laplace / PureDP: count·ε (basic composition).
    * Composition: the sum, if every part is pure.
    * WorstCase: the maximum, if every candidate is pure.
    * RandomStopping with a pure ε-DP base and K from the truncated negative binomial family
      (η ≥ 0: logarithmic η = 0, geometric η = 1): (2 + η)·ε — Papernot & Steinke (2022),
      Cor. 4 (the λ, λ̂ → ∞ limit of their Thm. 2); for geometric this is Liu & Talwar
      (2019)'s 3ε. Poisson K has no pure bound here (``None``). Binomial K ≤ m: m·ε (a
      post-processing of the m-fold composition; see RandomStopping).
    """
    if isinstance(m, (Laplace, PureDP)):
        return m.epsilon * m.count
    if isinstance(m, Composition):
        values = [pure_epsilon(p) for p in m.mechanisms]
        present = [v for v in values if v is not None]
        return None if len(present) < len(values) else float(sum(present))
    if isinstance(m, WorstCase):
        values = [pure_epsilon(p) for p in m.candidates]
        present = [v for v in values if v is not None]
        return None if len(present) < len(values) else float(max(present))
    if isinstance(m, RandomStopping):
        if m.distribution is StoppingDistribution.POISSON:
            return None
        base = pure_epsilon(m.base)
        if base is None:
            return None
        if m.trials is not None:
            return m.trials * base
        return (2.0 + m.eta) * base
    return None
