"""Random stopping: Papernot & Steinke (2022) private selection (Liu & Talwar 2019 for K geometric).

Algorithm (Papernot & Steinke 2022, Sec. 3 / Alg. "repeat and select"): draw the number of
trials K ~ D secretly, run K independent trials with configurations drawn from the space,
release only the best trial (its hyperparameters and its model). D is one of

* the truncated negative binomial D_{η,γ} of their Def. 1,
  P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Π_{ℓ=0}^{k−1} (ℓ + η)/(ℓ + 1), k ≥ 1, η > 0,
  with η = 1 the geometric distribution γ(1 − γ)^{k−1} and the η → 0 limit the logarithmic
  distribution (1 − γ)^k / (k · log(1/γ)); γ is set from E[K] by the same function the RDP
  and profile accountants use (:func:`raydp_hpo.accounting._rdp_kernels.truncated_negative_binomial_gamma`,
  dp-accounting's inversion, ported), so the sampled law is the one that is accounted;
* Poisson(μ) (their Sec. 3.3), which can give K = 0: nothing is selected then;
* binomial(m, p) with p = E[K]/m (``shape`` = m): at most m trials, K = 0 with probability
  (1 − p)^m. It is priced by privacy profiles (:mod:`raydp_hpo.accounting.profiles`, whose binomial
  PGF is the law sampled here); its RDP figure is the m-fold composition of the base (valid,
  loose), so a plan fixed up front gains from it only on ``Accountant.TIGHTEST``.

Default law (:data:`DEFAULT_DISTRIBUTION`, :data:`DEFAULT_MEAN`, :data:`DEFAULT_SHAPE`, set in
:mod:`raydp_hpo._stopping_defaults` only): the truncated negative binomial with η = 2 and
E[K] = 10, chosen by the defaults study (issue #42, rule 7.2 of
``benchmarks/results/defaults_study/preregistration.md``).

Privacy: one :class:`~raydp_hpo.accounting.mechanisms.RandomStopping` charge over the worst-case base
trial, whose base is the trial's *whole* mechanism Q of P&S (model and score):
``trial_mechanism(training, ε_s) = Composition((training, Laplace(ε_s)))`` — each trial
reports its validation score with Laplace noise because the selection reads it. Admitted
before the first trial — RDP by Papernot & Steinke (2022, arXiv:2110.03620) Thm. 2 (truncated
negative binomial) and Thm. 6 (Poisson), computed by :mod:`raydp_hpo.accounting.rdp` (a port of
dp-accounting's ``RepeatAndSelectDpEvent`` implementation, golden-tested against it). Trials
carry ``charge=False`` and are covered by the plan; each checks that its own mechanism is dominated by the base.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np
from ray.tune.search import Searcher
from scipy.special import gammaln

from raydp_hpo._stopping_defaults import (
    DEFAULT_DISTRIBUTION,
    DEFAULT_MEAN,
    DEFAULT_SHAPE,
    default_law,
)
from raydp_hpo._validation import coerce_enum, positive_float
from raydp_hpo.accounting._rdp_kernels import truncated_negative_binomial_gamma
from raydp_hpo.accounting.mechanisms import Mechanism, PureDP, RandomStopping, StoppingDistribution
from raydp_hpo.searchers.base import DPSearcher, Phase, PrivacyPlan, Release

__all__ = ["RandomStoppingSearch", "RandomStoppingPreset", "PRESETS", "sample_stopping_k",
           "stopping_pmf", "stopping_mechanism", "DEFAULT_DISTRIBUTION", "DEFAULT_MEAN",
           "DEFAULT_SHAPE"]

PAPER = (
    "Papernot & Steinke (2022), Hyperparameter Tuning with Rényi Differential Privacy, "
    "Thm. 2 (truncated negative binomial K) and Thm. 6 (Poisson K); Liu & Talwar (2019) "
    "for geometric K"
)



class RandomStoppingPreset(Enum):
    """Named settings of :class:`RandomStoppingSearch` (``preset=``; settings given explicitly
    override a preset's). The defaults (no preset) are :data:`DEFAULT_DISTRIBUTION`,
    :data:`DEFAULT_MEAN` and :data:`DEFAULT_SHAPE`: the truncated negative binomial with η = 2 and
    E[K] = 10 (:mod:`raydp_hpo._stopping_defaults`).

    ``TNB20``: ``random_stopping_tnb20`` of ``benchmarks/privacy_utility.py`` — K from Papernot
    & Steinke's truncated negative binomial with η = 2 and E[K] = 20. At ε = 3 it went 81%
    [74%, 87%] (MNIST-1D) and 86% [81%, 90%] (digits) of the way from one-shot random search
    to the non-private-tuning oracle (four fresh 20-seed runs pooled; the geometric law with
    E[K] = 10: 66% and 68% over six runs), with no search drawing K = 1, at twice the
    expected compute (``benchmarks/results/privacy_utility/summary.md``).
    """

    TNB20 = "tnb20"


PRESETS: dict[RandomStoppingPreset, dict[str, Any]] = {
    RandomStoppingPreset.TNB20: {
        "distribution": StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL.value,
        "mean": 20.0, "shape": 2.0,
    },
}

def _coerce_distribution(distribution: StoppingDistribution | str) -> StoppingDistribution:
    return coerce_enum(StoppingDistribution, distribution, "stopping distribution")


def stopping_mechanism(
    base: Mechanism, distribution: StoppingDistribution, mean: float, shape: float | None
) -> RandomStopping:
    """The :class:`RandomStopping` value (validates mean ≥ 1 and the shape)."""
    return RandomStopping(base=base, distribution=distribution, mean=mean, shape=shape)


def _binomial_p(mean: float, m: int) -> float:
    """p of the binomial law with E[K] = ``mean`` over m draws (as :mod:`raydp_hpo.accounting.profiles`
    accounts it)."""
    return min(1.0, mean / m)


def _law(distribution: StoppingDistribution, mean: float, shape: float | None) -> RandomStopping:
    """The law's parameters, validated and read (η, m) exactly as the accountants read them:
    a :class:`RandomStopping` over a placeholder base."""
    return RandomStopping(base=PureDP(1.0), distribution=distribution, mean=mean, shape=shape)


def _binomial_m(shape: float | None, mean: float) -> int:
    trials = _law(StoppingDistribution.BINOMIAL, mean, shape).trials
    assert trials is not None  # a binomial law always has m
    return trials


def stopping_pmf(
    k: int, distribution: StoppingDistribution | str, mean: float, shape: float | None = None
) -> float:
    """P[K = k] of the stopping distribution with E[K] = ``mean`` (P&S 2022, Def. 1; Poisson)."""
    dist = _coerce_distribution(distribution)
    if k < 0:
        return 0.0
    if dist is StoppingDistribution.POISSON:
        return math.exp(-mean + k * math.log(mean) - gammaln(k + 1))
    if dist is StoppingDistribution.BINOMIAL:
        m = _binomial_m(shape, mean)
        p = _binomial_p(mean, m)
        if k > m:
            return 0.0
        if p == 1.0:
            return 1.0 if k == m else 0.0
        log_c = gammaln(m + 1) - gammaln(k + 1) - gammaln(m - k + 1)
        return math.exp(log_c + k * math.log(p) + (m - k) * math.log1p(-p))
    if k == 0:
        return 0.0
    eta = _law(dist, mean, shape).eta
    return _tnb_pmf(k, eta, truncated_negative_binomial_gamma(eta, mean))


def _tnb_pmf(k: int, eta: float, gamma: float) -> float:
    """P[K = k] of D_{η,γ} (P&S 2022, Def. 1), k ≥ 1; η = 0 is the logarithmic limit."""
    if gamma >= 1.0:
        return 1.0 if k == 1 else 0.0
    log1g = math.log1p(-gamma)
    if eta == 0.0:
        return math.exp(k * log1g - math.log(k) - math.log(math.log(1.0 / gamma)))
    # (1−γ)^k Γ(k+η) / (Γ(η) k!) / (γ^{−η} − 1)
    log_norm = math.log(math.expm1(-eta * math.log(gamma)))
    return math.exp(k * log1g + gammaln(k + eta) - gammaln(eta) - gammaln(k + 1) - log_norm)


def sample_stopping_k(
    rng: np.random.Generator,
    distribution: StoppingDistribution | str,
    mean: float,
    shape: float | None = None,
) -> int:
    """Draw K from the stopping distribution with E[K] = ``mean``.

    Poisson via numpy; the truncated negative binomial family (incl. geometric and
    logarithmic) by inversion of the exact pmf of P&S (2022) Def. 1 with γ from the
    accountants' inversion of the mean — so the law sampled is the law accounted.
    """
    dist = _coerce_distribution(distribution)
    mean = positive_float("mean", mean)
    if dist is StoppingDistribution.POISSON:
        return int(rng.poisson(mean))
    if dist is StoppingDistribution.BINOMIAL:
        m = _binomial_m(shape, mean)
        return int(rng.binomial(m, _binomial_p(mean, m)))
    eta = _law(dist, mean, shape).eta
    gamma = truncated_negative_binomial_gamma(eta, mean)
    u = float(rng.random())
    cdf = 0.0
    k = 0
    while True:
        k += 1
        p = _tnb_pmf(k, eta, gamma)
        cdf += p
        if cdf >= u:
            return k
        if p == 0.0 and k > mean:  # numerical tail exhausted (probability < 1e-300)
            return k


class RandomStoppingSearch(DPSearcher):
    """Papernot & Steinke (2022) random stopping with the best trial as output.

    Args (beyond :class:`~raydp_hpo.searchers.base.DPSearcher`):
        preset: a :class:`RandomStoppingPreset` (or its value, e.g. ``"tnb20"``); the
            settings given explicitly override its values.
        distribution: law of the secret number of trials K; by default
            :data:`DEFAULT_DISTRIBUTION`, Papernot & Steinke's truncated negative binomial
            (Def. 1), priced by their Thm. 2.
        mean: E[K] (≥ 1); by default :data:`DEFAULT_MEAN` = 10.
        shape: η of the truncated negative binomial, or the number of draws m of the
            binomial (an integer >= mean; p = mean/m). Without ``distribution``, by default
            :data:`DEFAULT_SHAPE` (η = 2); with a ``distribution`` given, no default (the
            geometric, logarithmic and Poisson laws take none; the truncated negative
            binomial and the binomial need one).

    The default law (the truncated negative binomial with η = 2 and E[K] = 10, setting
    ``rs_tnb2_k10``) was chosen by the defaults study (issue #42, rule 7.2 of
    ``benchmarks/results/defaults_study/preregistration.md``): it beat the geometric law with
    E[K] = 10, the default before, on the worst dataset's low tail of seeds. Its selection
    costs more than the geometric law's over the same trials (Papernot & Steinke 2022, Thm. 2:
    the (1 + η) factor; 4ε against 3ε for a pure ε-DP trial, their Cor. 4), which the noise
    calibration pays for; ``distribution="geometric"`` is the law of Liu & Talwar (2019).

    The plan is ``RandomStopping(base, distribution, mean, shape)`` where ``base`` is
    ``trial_mechanism(training, score_epsilon)``: the training mechanism (``WorstCase`` over
    the privacy grid when it varies) composed with the ``Laplace(score_epsilon)`` noisy score
    (omitted when ``score_epsilon=None``). When the space sets no
    noise, ``noise_multiplier`` is calibrated so that the plan is admissible.
    """

    algorithm = "random_stopping"
    paper = PAPER
    preset_type = RandomStoppingPreset
    presets = PRESETS

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        distribution: StoppingDistribution | str | None = None,
        mean: float = DEFAULT_MEAN,
        shape: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(param_space, **kwargs)
        distribution, shape = default_law(distribution, shape)
        self._distribution = _coerce_distribution(distribution)
        self._mean = float(mean) if isinstance(mean, (int, float)) else mean
        self._shape = shape
        stopping_mechanism(
            self._scored(self._base_mechanism_or_placeholder()), self._distribution, mean, shape
        )
        self._calibrated_sigma: float | None = None
        if self._needs_noise_calibration():
            self._calibrated_sigma = self._calibrate_noise(
                lambda s: self._plan_mechanism(
                    self._scored(self._base_mechanism({"noise_multiplier": s}))
                ),
                what=f"random stopping with E[K]={mean}",
            )
        base = self._scored(self._base_mechanism(self._noise_extra()))
        mech = self._plan_mechanism(base)
        self._require_admissible(mech, what=f"random stopping with E[K]={mean}")
        self._plan = self._make_plan(
            mechanism=mech,
            base=base,
            description=(
                f"one RandomStopping charge: K ~ {self._distribution.value}"
                f"{'' if shape is None else f'(η={shape})'} with E[K]={mean} over the "
                "worst-case base trial"
                + self._if_scored(f" + {self._score_text()} noisy score")
                + " (RDP: P&S 2022 Thm. 2/6; privacy profiles: Koskela, Redberg & Wang 2024)"
            ),
            expected_gradient_evaluations=float(mean) * self._max_gradient_evaluations(
                self._noise_extra()
            ),
        )
        # secret: the number of trials, drawn once at construction
        self._k = sample_stopping_k(self._rng, self._distribution, mean, shape)
        self._suggested: list[str] = []

    def _base_mechanism_or_placeholder(self) -> Mechanism:
        extra = {"noise_multiplier": 1.0} if self._needs_noise_calibration() else None
        return self._base_mechanism(extra)

    def _noise_extra(self) -> dict[str, Any] | None:
        if self._calibrated_sigma is None:
            return None
        return {"noise_multiplier": self._calibrated_sigma}

    def _plan_mechanism(self, base: Mechanism) -> RandomStopping:
        return stopping_mechanism(base, self._distribution, self._mean, self._shape)

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    def _suggest(self, trial_id: str) -> dict | str | None:
        if len(self._suggested) >= self._k:
            self._finished = True
            return Searcher.FINISHED
        config = self._sample_config()
        if self._calibrated_sigma is not None:
            config["noise_multiplier"] = self._calibrated_sigma
        config["raydp"] = self._raydp(
            trial_id,
            base=self._plan.base,
            data_view={"kind": "full"},
            phase=Phase.TUNE,
            score_epsilon=self._score_epsilon,  # the selection reads every trial's score
        )
        self._suggested.append(trial_id)
        return self._issue(trial_id, config)

    def release(self) -> Release:
        extras: dict[str, Any] = {
            "expected_gradient_evaluations": self._plan.expected_gradient_evaluations,
        }
        if self._k == 0:
            extras["reason"] = "K = 0 was drawn (Poisson or binomial K): no configuration was selected"
            return Release(None, None, self.algorithm, extras)
        best = self._best_of(self._suggested)
        if best is None:
            extras["reason"] = "no trial reported the metric: no configuration was selected"
            return Release(None, None, self.algorithm, extras)
        return Release(self._public_config(best), best, self.algorithm, extras)
