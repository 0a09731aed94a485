"""Random stopping's default law of K — the one place it is set.

:class:`~raydp_hpo.searchers.random_stopping.RandomStoppingSearch` (and so ``search=
"random_stopping"`` with no settings, and an experiment file's ``algorithm: random_stopping``)
and ``raydp-hpo account --search random_stopping`` read the secret number of trials K from
these three constants when they are not given. Ray-free (the ``account`` command imports it).

The default is Papernot & Steinke's (2022, Def. 1) truncated negative binomial D_{η,γ} with
η = 2 and E[K] = 10: P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Π_{ℓ=0}^{k−1} (ℓ + η)/(ℓ + 1),
k ≥ 1, γ set from E[K]. Its privacy cost is their Thm. 2 — RDP of order λ
ε'(λ) = ε(λ) + (1 + η)(1 − 1/λ̂)ε(λ̂) + (1 + η)·log(1/γ)/λ̂ + log E[K]/(λ − 1) for any λ̂ ≥ 1,
and (2 + η)ε = 4ε for a pure ε-DP trial (their Cor. 4) — computed by the same accounting as the
``tnb20`` preset (:func:`raydp_hpo.accounting.rdp.repeat_and_select_rdp`, privacy profiles on
``Accountant.TIGHTEST``). Compared with the geometric law (η = 1, the default before), it puts
less mass on small K (at E[K] = 10: P[K = 1] 5.0% against 10%, P[K ≤ 3] 18.0% against 27.1%)
at a higher privacy price for the same trials.

The default was chosen by the defaults study (issue #42, rule 7.2 of
``benchmarks/results/defaults_study/preregistration.md``, harness ``benchmarks/defaults_study.py``,
setting ``rs_tnb2_k10``): on the worst dataset's 10th percentile of per-seed RERR (minimised over
ε = 1, 3, 8 and over MNIST-1D, digits and a tabular task) it scored 0.22 against −0.18 for the
geometric law with E[K] = 10, far more than the pre-registered tie margin of 0.05, on the
complete grid (``benchmarks/results/defaults_study/summary.md``; the geometric law's low tail
fell below one-shot random search on MNIST-1D at ε = 1). ``rs_geom_k20`` scored 0.23, a tie
within 0.05 that the rule breaks toward less compute (E[K] = 10 against 20).

To switch the default law, change these constants (and nothing else): a law without a shape
(geometric, logarithmic, Poisson) takes ``DEFAULT_SHAPE = None``; the truncated negative
binomial needs η > 0 and the binomial the number of draws m ≥ ``DEFAULT_MEAN``. The import-time
check below refuses an inconsistent combination.
"""

from __future__ import annotations

from raydp_hpo.accounting.mechanisms import PureDP, RandomStopping, StoppingDistribution

__all__ = ["DEFAULT_DISTRIBUTION", "DEFAULT_MEAN", "DEFAULT_SHAPE", "default_law", "law_text"]

#: Law of the secret number of trials K when none is given.
DEFAULT_DISTRIBUTION: StoppingDistribution = StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL
#: E[K] when none is given.
DEFAULT_MEAN: float = 10.0
#: η of the default truncated negative binomial (``None`` for a law without a shape); used
#: only when the distribution is not given either.
DEFAULT_SHAPE: float | None = 2.0


def default_law(
    distribution: StoppingDistribution | str | None, shape: float | None
) -> tuple[StoppingDistribution | str, float | None]:
    """(distribution, shape) with the defaults filled in.

    No distribution given: the default law, with ``shape`` if given (e.g. ``shape=3`` alone is
    the default law with η = 3) and :data:`DEFAULT_SHAPE` otherwise. A distribution given: as
    given, shape included — ``distribution="geometric"`` alone is the geometric law (no η),
    and ``distribution="truncated_negative_binomial"`` without ``shape`` is refused by
    :class:`~raydp_hpo.accounting.mechanisms.RandomStopping` (η has no default there).
    """
    if distribution is None:
        return DEFAULT_DISTRIBUTION, DEFAULT_SHAPE if shape is None else shape
    return distribution, shape


def law_text(distribution: StoppingDistribution, mean: float, shape: float | None) -> str:
    """A law of K in words, e.g. ``truncated negative binomial K (η = 2), E[K] = 10``."""
    name = distribution.value.replace("_", " ")
    if shape is None:
        return f"{name} K, E[K] = {mean:g}"
    what = "m" if distribution is StoppingDistribution.BINOMIAL else "η"
    return f"{name} K ({what} = {shape:g}), E[K] = {mean:g}"


# A consistent default: the law validates (η > 0 for TNB, no shape for geometric, ...).
RandomStopping(PureDP(1.0), DEFAULT_DISTRIBUTION, DEFAULT_MEAN, DEFAULT_SHAPE)
