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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from raydp_hpo._validation import positive_float, positive_int, unit_interval_float
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.mechanisms import Composition, Gaussian, Laplace, Mechanism, SubsampledGaussian

__all__ = [
    "Optimizer",
    "DPSGDPrivacy",
    "privacy_from_config",
    "trial_mechanism",
    "score_noise_scale",
    "DEFAULT_SCORE_EPSILON",
]

#: Default ε of the Laplace-noised validation score a tuning trial releases to its searcher.
DEFAULT_SCORE_EPSILON = 0.1


def trial_mechanism(training: Mechanism, score_epsilon: float | None) -> Mechanism:
    """A trial's whole mechanism: its training plus, if it releases a noisy validation score
    to a selection, ``Laplace(score_epsilon)`` (sequential composition)."""
    if score_epsilon is None:
        return training
    return Composition((training, Laplace(positive_float("score_epsilon", score_epsilon))))


def score_noise_scale(score_epsilon: float) -> float:
    """Laplace scale b = 1/ε_s of the noisy *count* of correct validation predictions: the
    count has sensitivity 1 under add/remove-one (see the module docstring), so no size
    enters the noise."""
    return 1.0 / positive_float("score_epsilon", score_epsilon)


class Optimizer(Enum):
    """Optimisers a DP trial can use."""

    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"
    GD = "gd"  #: full-batch DP gradient descent (sample rate 1, Panda et al. 2024)
    ADADP = "adadp"  #: Koskela & Honkela (2020) adaptive learning rate, 2 gradients per step


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
        """Optimiser steps: ⌈epochs / q⌉ (each step sees q·n records in expectation)."""
        return max(1, math.ceil(self.epochs / self.sample_rate - 1e-9))

    @property
    def gradient_evaluations_per_step(self) -> int:
        """ADADP evaluates two noisy gradients per step on independent Poisson batches."""
        return 2 if self.optimizer is Optimizer.ADADP else 1

    def mechanism(self) -> Mechanism:
        """The mechanism this run executes.

        * GD: ``Gaussian(σ, T)`` — every step touches every record.
        * ADADP: ``SubsampledGaussian(σ, q, 2T)`` — Koskela & Honkela (2020), Alg. 2 computes
          one full step and two half steps from *independent* Poisson batches, i.e. 2T
          subsampled Gaussian mechanisms (twice the RDP of T steps). Reusing one batch would
          be a subsampled Gaussian with σ/√2 instead, which is much worse and not done here.
        * otherwise: ``SubsampledGaussian(σ, q, T)`` (Abadi et al. 2016).
        """
        if self.optimizer is Optimizer.GD:
            return Gaussian(self.noise_multiplier, self.steps)
        return SubsampledGaussian(
            self.noise_multiplier,
            self.sample_rate,
            self.steps * self.gradient_evaluations_per_step,
        )


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
    steps = max(1, math.ceil(epochs / q - 1e-9))
    evals = steps * (2 if optimizer is Optimizer.ADADP else 1)

    if "noise_multiplier" in config:
        sigma = positive_float("noise_multiplier", config["noise_multiplier"])
    elif "mu" in config:
        from raydp_hpo.gdp import gdp_epsilon

        mu = positive_float("mu", config["mu"])
        if optimizer is Optimizer.GD:
            sigma = math.sqrt(steps) / mu  # exact: T Gaussian steps are (√T/σ)-GDP
        else:
            delta = unit_interval_float("target_delta", config.get("target_delta", 1e-5))
            from raydp_hpo.accounting import calibrate_noise

            sigma = calibrate_noise(gdp_epsilon(mu, delta), delta, q, evals)
    elif "target_epsilon" in config:
        from raydp_hpo.accounting import calibrate_noise

        delta = unit_interval_float("target_delta", config.get("target_delta", 1e-5))
        target = positive_float("target_epsilon", config["target_epsilon"])
        if optimizer is Optimizer.GD:
            from raydp_hpo.gdp import gdp_epsilon, gdp_mu

            mu = gdp_mu(target, delta)
            sigma = math.sqrt(steps) / mu
            # round toward more privacy: never overshoot the target
            while gdp_epsilon(math.sqrt(steps) / sigma, delta) > target:
                sigma *= 1.0 + 1e-9
        else:
            sigma = calibrate_noise(target, delta, q, evals)
    else:
        raise InvalidParameterError(
            "config needs 'noise_multiplier', 'target_epsilon' or 'mu' to set the DP noise"
        )
    return DPSGDPrivacy(noise_multiplier=sigma, sample_rate=q, epochs=epochs, optimizer=optimizer)
