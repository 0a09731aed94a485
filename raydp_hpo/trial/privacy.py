"""The privacy contract between search algorithms and DP training trials.

A trial's privacy cost is a pure function of its privacy-relevant hyperparameters and the
(public) dataset size — never of the data. Searchers use :func:`privacy_from_config` to plan
and charge; trainables use the same function to declare what they run, so the two cannot
drift. Performance knobs (model width, learning rate, ...) do not enter it.

Config keys read here (all others are ignored by this module):

* ``noise_multiplier`` (σ) — or ``target_epsilon`` (with ``target_delta``) to calibrate σ, or
  ``mu`` for a μ-GDP share (exact for full-batch GD, via (ε, δ) otherwise);
* ``sample_rate`` (q), or ``batch_size`` (expected batch size, q = batch_size / n);
* ``epochs`` (passes over the data in expectation; steps = ⌈epochs / q⌉);
* ``optimizer``: one of :class:`Optimizer` (``gd`` forces q = 1).

**The selection score is a release too.** A search selects on each trial's validation score.
The validation split is part of the private dataset (DESIGN.md), so a score that feeds a
selection must itself be DP and its cost must be in the trial's mechanism. The trial releases
the number of correct validation predictions plus Laplace noise of scale 1/ε_s (the Laplace
mechanism, Dwork et al. 2006): adding or removing one validation record changes the count by
at most 1, whatever the validation set's size, so the release is ε_s-DP for validation records
without any size entering the noise. The reported score is that noisy count divided by the
*declared public* validation size (post-processing by a constant), clipped to [0, 1]; a
training record changes the model, and the score is post-processing of the model for a fixed
validation set, so the training part of the mechanism covers it. The trial declares
``Composition((training, Laplace(ε_s)))`` — :func:`trial_mechanism`. ε_s is the searcher's
``score_epsilon`` (default :data:`DEFAULT_SCORE_EPSILON`). ``score_epsilon=None`` is for
scores that no selection reads (final runs), that a searcher privatises itself (SVT's
AboveThreshold noise), or when the user declares the validation split public.

**Gaussian score** (:class:`ScoreNoise` ``GAUSSIAN``, a :class:`ScoreRelease` with a stated
δ_s): the count plus N(0, σ_s²) with σ_s = ``calibrate_analytic_gaussian(ε_s, δ_s)`` — the
smallest σ for which the one release is (ε_s, δ_s)-DP at ℓ₂ sensitivity 1 (Balle & Wang 2018,
ICML, Thm. 8). The trial declares ``Gaussian(σ_s)`` (sensitivity 1, noise multiplier σ_s),
not an (ε_s, δ_s) pair: δ_s only picks σ_s, and the accountants compose the Gaussian score
with DP-SGD through its exact RDP α/(2σ_s²) (Mironov 2017, Prop. 7) or its PLD, which is much
tighter over many scored trials than Laplace's RDP (Mironov 2017, Prop. 6; at equal per-release
ε_s the Laplace RDP is ≈ αε_s²/2 for small ε_s and grows linearly in α, while the Gaussian's
is α/(2σ_s²) with σ_s of order √(2 ln(1.25/δ_s))/ε_s). The budget's δ covers the whole plan;
no separate δ_s is spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from raydp_hpo._validation import (
    coerce_enum,
    open_unit_float,
    positive_float,
    positive_int,
    unit_interval_float,
)
from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian, calibrate_laplace
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
)
from raydp_hpo.errors import InvalidParameterError

#: Result key present exactly in a result whose score is the trial's noisy (released) score,
#: with the ε_s it was released at: the built-in trainable sets it on its final result
#: (``raydp_hpo.trainables.training.train_dp``); a user trainable that releases a score must
#: set it too, or the searcher does not read the score (:meth:`DPSearcher.on_trial_complete`).
NOISY_SCORE_KEY = "score_epsilon"

#: Result key of the built-in trainable's per-epoch ε: **this trial's own ε under RDP, not the
#: search's** — the RDP figure of the trial's training so far (and, on the final result, its
#: released score), at the budget's δ. The search's cost is the privacy certificate's ε (the
#: plan, the selection, every charge); one trial's figure is neither. (Named ``epsilon``
#: before, which read as the search's ε.)
TRIAL_EPSILON_KEY = "trial_epsilon_rdp"

__all__ = [
    "NOISY_SCORE_KEY",
    "TRIAL_EPSILON_KEY",
    "Optimizer",
    "DPSGDPrivacy",
    "dpsgd_steps",
    "privacy_from_config",
    "trial_mechanism",
    "score_noise_scale",
    "ScoreNoise",
    "ScoreRelease",
    "DEFAULT_SCORE_EPSILON",
]

#: Default ε of the Laplace-noised validation score a tuning trial releases to its searcher.
DEFAULT_SCORE_EPSILON = 0.1


class ScoreNoise(Enum):
    """Noise on a trial's released validation count (sensitivity 1)."""

    LAPLACE = "laplace"  #: Laplace(1/ε_s): pure ε_s-DP (Dwork et al. 2006)
    GAUSSIAN = "gaussian"  #: N(0, σ_s²), σ_s analytic-Gaussian calibrated to (ε_s, δ_s)


@dataclass(frozen=True)
class ScoreRelease:
    """How a trial privatises the validation score a selection reads (module docstring).

    ``epsilon``: ε_s of the one release; ``noise``: :class:`ScoreNoise`; ``delta``: δ_s, the
    δ at which a Gaussian score alone is (ε_s, δ_s)-DP — required for ``GAUSSIAN``, refused
    for ``LAPLACE`` (pure DP has no δ). ``scale`` (derived): the Laplace scale 1/ε_s or the
    Gaussian σ_s = ``calibrate_analytic_gaussian(ε_s, δ_s)``, both at sensitivity 1.

    >>> ScoreRelease(0.1).mechanism()
    Laplace(epsilon=0.1, count=1)
    >>> round(ScoreRelease(1.0, ScoreNoise.GAUSSIAN, 1e-5).scale, 3)
    3.731
    """

    epsilon: float
    noise: ScoreNoise = ScoreNoise.LAPLACE
    delta: float | None = None
    scale: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        eps = positive_float("score_epsilon", self.epsilon)
        noise = coerce_enum(ScoreNoise, self.noise, "score_noise")
        if noise is ScoreNoise.LAPLACE:
            if self.delta is not None:
                raise InvalidParameterError(
                    f"score_delta={self.delta!r} only applies to score_noise='gaussian'; the "
                    "Laplace score is pure DP: drop score_delta or use score_noise='gaussian'"
                )
            scale = calibrate_laplace(eps)
        else:
            if self.delta is None:
                raise InvalidParameterError(
                    "score_noise='gaussian' needs score_delta, the δ_s in (0, 1) at which one "
                    "score release is (score_epsilon, score_delta)-DP (e.g. 1e-6)"
                )
            delta = open_unit_float("score_delta", self.delta)
            object.__setattr__(self, "delta", delta)
            scale = calibrate_analytic_gaussian(eps, delta)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "scale", scale)

    def mechanism(self, count: int = 1) -> Mechanism:
        """``count`` score releases: ``Laplace(ε_s, count)`` or ``Gaussian(σ_s, count)``
        (sensitivity 1, so the noise multiplier is σ_s itself)."""
        if self.noise is ScoreNoise.LAPLACE:
            return Laplace(self.epsilon, count=count)
        return Gaussian(self.scale, count)

    def draw(self, rng: np.random.Generator) -> float:
        """One noise draw for the count: Laplace(0, 1/ε_s) or N(0, σ_s²), from ``rng`` (the
        trial's secret score stream)."""
        if self.noise is ScoreNoise.LAPLACE:
            return float(rng.laplace(0.0, self.scale))
        return float(rng.normal(0.0, self.scale))

    def describe(self) -> str:
        """Short text for plan descriptions and errors."""
        if self.noise is ScoreNoise.LAPLACE:
            return f"Laplace(ε_s={self.epsilon:g})"
        return f"Gaussian(ε_s={self.epsilon:g}, δ_s={self.delta:g}: σ_s={self.scale:.4g})"


def trial_mechanism(
    training: Mechanism, score: float | ScoreRelease | None
) -> Mechanism:
    """A trial's whole mechanism: its training plus, if it releases a noisy validation score
    to a selection, that release (sequential composition). A float ``score`` is ε_s of a
    Laplace score (``ScoreRelease(score)``)."""
    if score is None:
        return training
    if not isinstance(score, ScoreRelease):
        score = ScoreRelease(positive_float("score_epsilon", score))
    return Composition((training, score.mechanism()))


def score_noise_scale(score_epsilon: float) -> float:
    """Laplace scale b = 1/ε_s of the noisy *count* of correct validation predictions: the
    count has sensitivity 1 under add/remove-one (see the module docstring), so no size
    enters the noise. Rounded up where 1/ε_s is not a float (:func:`calibrate_laplace`)."""
    return calibrate_laplace(positive_float("score_epsilon", score_epsilon))


def dpsgd_steps(epochs: float, sample_rate: float) -> int:
    """Optimiser steps of a DP-SGD run of ``epochs`` expected passes at sample rate q:
    ⌈epochs / q⌉ (each step sees q·n records in expectation), at least 1.

    The one steps formula: the mechanism a trial declares, the trainable's step loop and its
    epochs of ⌈1/q⌉ steps (``dpsgd_steps(1, q)``) all use it, so the steps charged are the
    steps run. A 1e-9 slack keeps float noise (``0.3 / 0.1 = 2.9999999999999996``) from
    adding a step.

    >>> dpsgd_steps(5, 256 / 60000), dpsgd_steps(0.3, 0.1), dpsgd_steps(1, 1.0)
    (1172, 3, 1)
    """
    return max(1, math.ceil(epochs / sample_rate - 1e-9))


class Optimizer(Enum):
    """Optimisers a DP trial can use."""

    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"
    GD = "gd"  #: full-batch DP gradient descent (sample rate 1, Panda et al. 2024)
    ADADP = "adadp"  #: Koskela & Honkela (2020) adaptive learning rate, 2 gradients per step

    @property
    def gradient_evaluations_per_step(self) -> int:
        """Noisy gradients per optimiser step: 2 for ADADP (independent Poisson batches)."""
        return 2 if self is Optimizer.ADADP else 1


@dataclass(frozen=True)
class DPSGDPrivacy:
    """Privacy-relevant settings of one DP training run (kept apart from performance knobs)."""

    noise_multiplier: float
    sample_rate: float
    epochs: float
    optimizer: Optimizer = Optimizer.SGD

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", positive_float("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "sample_rate", unit_interval_float("sample_rate", self.sample_rate))
        object.__setattr__(self, "epochs", positive_float("epochs", self.epochs))
        if not isinstance(self.optimizer, Optimizer):
            raise InvalidParameterError(f"optimizer must be an Optimizer, got {self.optimizer!r}")
        if self.optimizer is Optimizer.GD and self.sample_rate != 1.0:
            raise InvalidParameterError(
                f"full-batch GD needs sample_rate=1, got sample_rate={self.sample_rate!r}"
            )

    @property
    def steps(self) -> int:
        """Optimiser steps: ⌈epochs / q⌉ (:func:`dpsgd_steps`)."""
        return dpsgd_steps(self.epochs, self.sample_rate)

    @property
    def gradient_evaluations_per_step(self) -> int:
        """ADADP evaluates two noisy gradients per step on independent Poisson batches."""
        return self.optimizer.gradient_evaluations_per_step

    def expected_gradient_evaluations(self, dataset_size: int) -> float:
        """Expected per-example gradient evaluations of the run on ``dataset_size`` (public)
        records: steps · q · n · (2 for ADADP). A compute figure, not a privacy one."""
        return float(
            self.steps * self.sample_rate * dataset_size * self.gradient_evaluations_per_step
        )

    def mechanism(self) -> Mechanism:
        """The mechanism this run executes.

        * GD: ``Gaussian(σ, T)`` — every step touches every record.
        * ADADP: ``SubsampledGaussian(σ, q, 2T)`` — Koskela & Honkela (2020), Alg. 2 computes
          one full step and two half steps from *independent* Poisson batches, i.e. 2T
          subsampled Gaussian mechanisms (twice the RDP of T steps). Reusing one batch would
          be a subsampled Gaussian with σ/√2 instead, which is much worse and not done here.
        * otherwise: ``SubsampledGaussian(σ, q, T)`` (Abadi et al. 2016).
        """
        return self.mechanism_of_evaluations(self.steps * self.gradient_evaluations_per_step)

    def mechanism_of_evaluations(self, evaluations: int) -> Mechanism:
        """The mechanism of ``evaluations`` noisy gradients of this run (a prefix or a rerun
        part of it): ``Gaussian(σ, evaluations)`` for GD, else
        ``SubsampledGaussian(σ, q, evaluations)``."""
        if self.optimizer is Optimizer.GD:
            return Gaussian(self.noise_multiplier, evaluations)
        return SubsampledGaussian(self.noise_multiplier, self.sample_rate, evaluations)


def _optimizer(value: Any) -> Optimizer:
    if isinstance(value, Optimizer):
        return value
    try:
        return Optimizer(str(value).lower())
    except ValueError:
        names = ", ".join(o.value for o in Optimizer)
        raise InvalidParameterError(f"unknown optimizer {value!r}; use one of {names}") from None


def privacy_from_config(config: Mapping[str, Any], dataset_size: int) -> DPSGDPrivacy:
    """Derive a trial's :class:`DPSGDPrivacy` from its config and the training-set size.

    Raises :class:`~raydp_hpo.errors.InvalidParameterError` naming the missing/bad key.
    """
    n = positive_int("dataset_size", dataset_size)
    optimizer = _optimizer(config.get("optimizer", Optimizer.SGD))
    if optimizer is Optimizer.GD:
        q = 1.0
    elif "sample_rate" in config:
        q = unit_interval_float("sample_rate", config["sample_rate"])
    elif "batch_size" in config:
        batch = positive_int("batch_size", config["batch_size"])
        if batch > n:
            raise InvalidParameterError(
                f"batch_size={batch} exceeds the training set size {n}; use batch_size <= {n}"
            )
        q = batch / n
    else:
        raise InvalidParameterError("config needs 'sample_rate' or 'batch_size' for DP-SGD")
    if "epochs" not in config:
        raise InvalidParameterError("config needs 'epochs'")
    epochs = positive_float("epochs", config["epochs"])
    steps = dpsgd_steps(epochs, q)
    evals = steps * optimizer.gradient_evaluations_per_step

    if "noise_multiplier" in config:
        sigma = positive_float("noise_multiplier", config["noise_multiplier"])
    elif "mu" in config:
        from raydp_hpo.accounting.gdp import gdp_epsilon

        mu = positive_float("mu", config["mu"])
        if optimizer is Optimizer.GD:
            sigma = math.sqrt(steps) / mu  # exact: T Gaussian steps are (√T/σ)-GDP
        else:
            delta = unit_interval_float("target_delta", config.get("target_delta", 1e-5))
            from raydp_hpo.accounting.accountants import Accountant, calibrate_noise

            sigma = calibrate_noise(gdp_epsilon(mu, delta), delta, q, evals, Accountant.RDP)
    elif "target_epsilon" in config:
        from raydp_hpo.accounting.accountants import Accountant, calibrate_noise

        delta = unit_interval_float("target_delta", config.get("target_delta", 1e-5))
        target = positive_float("target_epsilon", config["target_epsilon"])
        if optimizer is Optimizer.GD:
            from raydp_hpo.accounting.gdp import gdp_epsilon, gdp_mu

            mu = gdp_mu(target, delta)
            sigma = math.sqrt(steps) / mu
            # round toward more privacy: never overshoot the target
            while gdp_epsilon(math.sqrt(steps) / sigma, delta) > target:
                sigma *= 1.0 + 1e-9
        else:
            # RDP, as the ledger's adaptive filter prices a trial's own charge (the library
            # default, the tightest fixed-plan figure, would give a σ the filter prices higher)
            sigma = calibrate_noise(target, delta, q, evals, Accountant.RDP)
    else:
        raise InvalidParameterError(
            "config needs 'noise_multiplier', 'target_epsilon' or 'mu' to set the DP noise"
        )
    return DPSGDPrivacy(noise_multiplier=sigma, sample_rate=q, epochs=epochs, optimizer=optimizer)
