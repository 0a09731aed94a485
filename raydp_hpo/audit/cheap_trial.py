"""The audit's neighbouring datasets and the cheap trial that stands in for DP-SGD.

**Neighbouring datasets** (add/remove one record, the project's adjacency): X has ``n`` training
records with scalar feature 0; X' = X plus one canary record with feature +1, appended last.
Both searchers get the same declared public size ``dataset_size = n``. The validation split is
the same in X and X': ``n_val`` records with features spread over (0, 1] and label 1.

**Cheap trial** (:func:`run_cheap_trial`) in place of DP-SGD, with exactly the trial's declared
privacy parameters: the records it trains on are those of
:func:`raydp_hpo.trainables.training.training_sets` (the view / partition code the DP trainable uses);
the statistic is the clipped sum s = Σ clip(xᵢ, −1, 1) (ℓ₂ sensitivity 1 under add/remove).
Full-batch GD (``optimizer="gd"``) releases s + N(0, σ²) at each of its T steps; other
optimisers release the clipped sum over a Poisson(q) batch plus N(0, σ²) at each gradient
evaluation (Abadi et al. 2016) — either way the run *is* ``privacy.mechanism()``. The model m is
a post-processing (mean of the releases, rescaled by 1/q). Non-private SVT partition trials
(``settings.nonprivate``) use m = s. A validation record v is predicted correctly iff
``lr · m ≥ v``, so the hyperparameter ``lr`` matters and candidate ``lr = 1`` moves from
accuracy 0 to accuracy 1 on a partition when the canary enters it: the largest change Ding et
al.'s Lemma 2 allows (1/k of the partition average). A trial whose score feeds a selection
(``score_epsilon`` set) reports ``(correct + Laplace(1/ε_s)) / n_val`` (or ``+ N(0, σ_s²)``,
σ_s analytic-Gaussian calibrated to (ε_s, δ_s), for ``score_noise="gaussian"``) — a count of sensitivity 1
under one validation record, divided by the public validation size. Every trial counts its
releases and raises :class:`AuditError` unless what ran equals the declared
``trial_mechanism(privacy.mechanism(), ε_s)`` and is covered by its block's ``base``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
    mechanism_from_dict,
)
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trial.privacy import Optimizer, ScoreNoise, trial_mechanism
from raydp_hpo.trial.settings import RaydpSettings

#: The metric every cheap trial reports (maximised).
METRIC = "score"

#: Feature of the canary record (the largest value a record may take: sensitivity 1).
CANARY = 1.0


class AuditError(RayDPHPOError):
    """A search did something the audit cannot account for (a trial that ran a mechanism other
    than the one it declared, a searcher that never finishes, ...)."""


def _val_set(n_val: int) -> Any:
    from raydp_hpo.trainables.data import Dataset

    v = np.linspace(1.0 / n_val, 1.0, n_val, dtype=np.float32).reshape(-1, 1)
    return Dataset(v, np.ones(n_val, dtype=np.int64), 2)


def neighbouring_datasets(
    n_train: int, n_val: int, *, train_features: np.ndarray | None = None
) -> tuple[Any, Any]:
    """(X, X'): ``DataSplits`` whose training splits differ by one canary record (feature +1,
    appended last); validation and test splits are identical.

    ``train_features`` (length ``n_train``, values in [−1, 1)) replaces the all-zero training
    records (the partition check uses distinct values to identify records).
    """
    from raydp_hpo.trainables.data import Dataset, DataSplits

    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise InvalidParameterError(f"n_train must be an integer >= 1, got {n_train=!r}")
    if isinstance(n_val, bool) or not isinstance(n_val, int) or n_val < 2:
        raise InvalidParameterError(f"n_val must be an integer >= 2, got {n_val=!r}")
    x = np.zeros(n_train, np.float32) if train_features is None else np.asarray(
        train_features, np.float32
    )
    if x.shape != (n_train,) or np.any(np.abs(x) > 1) or np.any(x == CANARY):
        raise InvalidParameterError(
            f"train_features must have shape ({n_train},), values in [-1, 1) and no {CANARY}"
        )
    y = np.zeros(n_train, np.int64)
    val = _val_set(n_val)
    train = Dataset(x.reshape(-1, 1), y, 2)
    train2 = Dataset(
        np.append(x, np.float32(CANARY)).reshape(-1, 1), np.append(y, np.int64(0)), 2
    )
    return DataSplits(train, val, val), DataSplits(train2, val, val)


@dataclass(frozen=True)
class CheapTrial:
    """Outcome of one cheap trial: its reported score, its model(s) and what it released."""

    score: float
    model: float
    models: tuple[float, ...]
    ran: Mechanism | None  # None: a non-private trial (its outputs go only to the SVT)
    declared: Mechanism | None


def _ran_training(privacy: Any, releases: int) -> Mechanism:
    if privacy.optimizer is Optimizer.GD:
        return Gaussian(privacy.noise_multiplier, releases)
    return SubsampledGaussian(privacy.noise_multiplier, privacy.sample_rate, releases)


def run_cheap_trial(
    config: Mapping[str, Any],
    data: Any,
    *,
    rng: np.random.Generator,
) -> CheapTrial:
    """Run one trial with a cheap mechanism of exactly its declared privacy (module doc): the
    privacy settings and the public validation size come from the DP trainable's own
    :func:`raydp_hpo.trainables.training.declared_privacy` and :func:`~raydp_hpo.trainables.training.public_sizes`.

    Raises :class:`AuditError` when the releases it ran differ from the declared mechanism or
    are not covered by the block's ``base``.
    """
    from raydp_hpo.ledger.coverage import is_covered
    from raydp_hpo.trainables.training import (
        declared_privacy,
        public_sizes,
        training_sets,
        validation_count,
    )

    settings = RaydpSettings.from_config(config)
    lr = float(config.get("lr", 1.0))
    sets = training_sets(data.train, settings)
    _, n_val = public_sizes(settings, data)  # the declared public validation size
    v = np.asarray(data.val.features, np.float64).reshape(-1)
    models: list[float] = []
    ran: Mechanism | None = None
    declared: Mechanism | None = None
    if settings.nonprivate:
        if settings.score_epsilon is not None:
            raise AuditError(f"a non-private trial reports a noisy score: {settings}")
        models = [float(np.clip(np.asarray(t.features, np.float64), -1, 1).sum()) for t in sets]
    else:
        privacy, _ = declared_privacy(config, data)
        evaluations = privacy.steps * privacy.gradient_evaluations_per_step
        sigma, q = privacy.noise_multiplier, privacy.sample_rate
        ran_parts: list[Mechanism] = []
        for t in sets:
            x = np.clip(np.asarray(t.features, np.float64).reshape(-1), -1.0, 1.0)
            if privacy.optimizer is Optimizer.GD:
                noisy = x.sum() + rng.normal(0.0, sigma, evaluations)
                models.append(float(noisy.mean()))
            else:
                mask = rng.random((evaluations, len(x))) < q
                noisy = mask @ x + rng.normal(0.0, sigma, evaluations)
                models.append(float(noisy.mean() / q))
            ran_parts.append(_ran_training(privacy, len(noisy)))
        # each model is its own release stream on disjoint records (parallel composition):
        # every one must be exactly the declared training mechanism
        declared_training = privacy.mechanism()
        for part in ran_parts:
            if part != declared_training:
                raise AuditError(f"trial ran {part} but declared {declared_training}")
        ran = ran_parts[0]
        declared = trial_mechanism(declared_training, settings.score_release)
    # the mean of the models' counts, each clipped to the declared validation size (train_dp's)
    correct = validation_count([int(np.count_nonzero(lr * m >= v)) for m in models], n_val)
    release = settings.score_release
    if release is not None:
        # count of correct predictions (sensitivity 1) + Laplace(1/ε_s) or N(0, σ_s²), over the
        # public size, clipped to [0, 1] (post-processing); what ran is built from the noise
        # actually drawn, independently of the declaration
        if release.noise is ScoreNoise.LAPLACE:
            noisy_count = correct + rng.laplace(0.0, 1.0 / release.epsilon)
            score_ran: Mechanism = Laplace(release.epsilon, count=1)
        else:
            delta_s = math.nan if release.delta is None else release.delta
            sigma_s = calibrate_analytic_gaussian(release.epsilon, delta_s)
            noisy_count = correct + rng.normal(0.0, sigma_s)
            score_ran = Gaussian(sigma_s, count=1)
        score = min(1.0, max(0.0, noisy_count / n_val))
        if ran is None:
            raise AuditError(f"a non-private trial reports a noisy score: {settings}")
        ran = Composition((ran, score_ran))
    else:
        score = correct / n_val
    if declared is not None and ran != declared:
        raise AuditError(f"trial ran {ran} but declared {declared}")
    if ran is not None and settings.base is not None:
        base = mechanism_from_dict(dict(settings.base))
        if not is_covered(ran, base):
            raise AuditError(f"trial ran {ran}, not covered by its plan base {base}")
    return CheapTrial(score, float(np.mean(models)), tuple(models), ran, declared)
