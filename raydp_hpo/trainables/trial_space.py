"""The search space the DP trainable accepts: its config keys and their checks.

One concern: which keys of a trial's config :func:`~raydp_hpo.trainables.training.train_dp`
reads (:data:`TRAINABLE_CONFIG_KEYS`) and :func:`validate_trial_space`, which refuses a space
key the trainable ignores (it would release a value that never changed the trained model) or
a constant / choice / grid value out of range, before anything is charged.
:mod:`raydp_hpo.trainables.training` re-exports both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from raydp_hpo._validation import closest_match
from raydp_hpo.errors import InvalidParameterError

__all__ = ["TRAINABLE_CONFIG_KEYS", "validate_trial_space"]


def _finite_real(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value) if math.isfinite(float(value)) else None


#: Config keys the DP trainable reads (besides the reserved ``"raydp"`` block). A space key
#: outside this set would be released without having changed the trained model.
TRAINABLE_CONFIG_KEYS: dict[str, str] = {
    "lr": "a positive number",
    "model": "a model name",
    "model_kwargs": "a mapping",
    "max_grad_norm": "a positive number",
    "grad_sample_mode": "one of auto, bk, opacus",
    "noise_source": "seeded or secure (the DP noise from the trial's secret generator or "
                    "os.urandom; raydp_hpo.NoiseSource)",
    "momentum": "a non-negative number",
    "ema_decay": "a number in [0, 1)",
    "adadp_tol": "a positive number",
    "adadp_alpha_min": "a positive number",
    "adadp_alpha_max": "a positive number",
    "optimizer": "an optimizer (sgd, momentum, adam, gd, adadp)",
    "noise_multiplier": "a positive number",
    "target_epsilon": "a positive number",
    "target_delta": "a probability in (0, 1]",
    "mu": "a positive number",
    "sample_rate": "a probability in (0, 1]",
    "batch_size": "a positive integer",
    "epochs": "a positive number",
}


#: Names other libraries use for the trainable's keys (for the "did you mean" hint).
_ALIASES = {
    "learning_rate": "lr", "learningrate": "lr", "step_size": "lr", "clip": "max_grad_norm",
    "clipping_norm": "max_grad_norm", "sigma": "noise_multiplier", "noise": "noise_multiplier",
    "batch": "batch_size", "epoch": "epochs", "q": "sample_rate", "delta": "target_delta",
    "epsilon": "target_epsilon", "ema": "ema_decay", "polyak": "ema_decay",
}


def _finite_options(value: Any) -> list[Any] | None:
    """The values a space entry can take when finite (constant, choice, grid), else None."""
    from ray.tune.search.sample import Categorical, Domain

    if isinstance(value, dict) and set(value) == {"grid_search"}:
        return list(value["grid_search"])
    if isinstance(value, Categorical):
        return list(value.categories)
    if isinstance(value, Domain):
        return None
    return [value]


def _check_value(key: str, kind: str, value: Any) -> None:
    from raydp_hpo.trial.privacy import Optimizer

    x = _finite_real(value)
    ok: bool
    if kind == "a positive number":
        ok = x is not None and x > 0
    elif kind == "a non-negative number":
        ok = x is not None and x >= 0
    elif kind == "a probability in (0, 1]":
        ok = x is not None and 0 < x <= 1
    elif kind == "a number in [0, 1)":
        ok = x is not None and 0 <= x < 1
    elif kind == "a positive integer":
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 1)
    elif kind == "a mapping":
        ok = isinstance(value, Mapping)
    elif kind == "one of auto, bk, opacus":
        ok = value in ("auto", "bk", "opacus")
    elif kind == "an optimizer (sgd, momentum, adam, gd, adadp)":
        ok = isinstance(value, Optimizer) or str(value).lower() in {o.value for o in Optimizer}
    else:  # model name: build_model checks it when the model is built
        ok = isinstance(value, str) and bool(value)
    if not ok:
        raise InvalidParameterError(
            f"search space key {key!r} must be {kind}, got {value!r}; nothing was charged"
        )


def validate_trial_space(space: Mapping[str, Any]) -> None:
    """Check a search space against what the DP trainable reads, before anything is charged.

    Every key must be one the trainable uses (:data:`TRAINABLE_CONFIG_KEYS`): a key it ignores
    (``learning_rate`` for ``lr``) would train with the default and release the unused value.
    Constants, ``tune.choice`` and ``tune.grid_search`` values are checked for type and range
    (``lr: "fast"`` fails here, not in a trial after the plan was charged).
    """
    for key, value in space.items():
        if key == "raydp":
            continue
        if key not in TRAINABLE_CONFIG_KEYS:
            close = _ALIASES.get(key) or closest_match(key, TRAINABLE_CONFIG_KEYS, cutoff=0.5)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise InvalidParameterError(
                f"search space key {key!r} is not read by the DP trainable{hint}. A released "
                "configuration must describe the model that was trained (keys the trainable "
                f"reads: {', '.join(sorted(TRAINABLE_CONFIG_KEYS))})"
            )
        options = _finite_options(value)
        for option in options or ():
            _check_value(key, TRAINABLE_CONFIG_KEYS[key], option)
