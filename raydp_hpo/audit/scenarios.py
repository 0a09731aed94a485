"""Driving a real searcher as Ray Tune drives it, the audited scenarios and what they claim.

**Claim**: ε of the plan's mechanism at the budget's δ, the minimum of the RDP, PLD and
privacy-profile accountants — the smallest figure a certificate can print (each is an upper
bound; grid search, which charges trial by trial, is claimed as the composition of its whole
grid).
"""

from __future__ import annotations

import inspect
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Mechanism,
)
from raydp_hpo.audit.cheap_trial import METRIC, AuditError, neighbouring_datasets, run_cheap_trial
from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY
from raydp_hpo.trial.settings import RaydpSettings

#: Largest number of trials one audited search may start (a guard against a runaway searcher).
MAX_TRIALS_PER_SEARCH = 10_000


@dataclass(frozen=True)
class AuditScenario:
    """One algorithm's audit set-up: the searcher's public arguments and the data sizes.

    ``searcher_kwargs`` are passed to ``make_searcher`` with ``metric``, ``mode="max"``,
    ``dataset_size=n_train`` and ``budget`` — never a seed. ``name`` tells apart two scenarios
    of one algorithm (default: the algorithm's name; see :attr:`label`).
    """

    algorithm: str
    searcher_kwargs: Mapping[str, Any]
    budget: PrivacyBudget
    n_train: int = 100
    n_val: int = 20
    description: str = ""
    train_features: tuple[float, ...] | None = None
    name: str = ""

    @property
    def label(self) -> str:
        """The scenario's name in reports and in :func:`default_scenarios`."""
        return self.name or self.algorithm

    def build_searcher(self) -> Any:
        from raydp_hpo.searchers import make_searcher
        from raydp_hpo.searchers.base import DPSearcher

        kwargs = dict(self.searcher_kwargs)
        if "validation_size" in inspect.signature(DPSearcher.__init__).parameters:
            kwargs.setdefault("validation_size", self.n_val)  # the declared public size
        return make_searcher(
            self.algorithm,
            metric=METRIC,
            mode="max",
            dataset_size=self.n_train,
            budget=self.budget,
            **kwargs,
        )

    def datasets(self) -> tuple[Any, Any]:
        feats = None if self.train_features is None else np.asarray(self.train_features)
        return neighbouring_datasets(self.n_train, self.n_val, train_features=feats)


@dataclass(frozen=True)
class SearchOutput:
    """The public output of one audited search: the released hyperparameters (a sorted tuple
    of items, ``None`` when nothing was selected) and the released model (``nan`` when no
    trained model is released)."""

    hyperparameters: tuple[tuple[str, Any], ...] | None
    model: float
    trials: int


def _key(hyper: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    if hyper is None:
        return None
    out = []
    for k, val in sorted(hyper.items()):
        if isinstance(val, float):
            val = round(val, 12)
        elif isinstance(val, dict):
            val = repr(sorted(val.items()))
        out.append((k, val))
    return tuple(out)


def run_search(
    scenario: AuditScenario,
    data: Any,
    rng: np.random.Generator,
    *,
    searcher: Any | None = None,
    on_config: Callable[[dict[str, Any]], None] | None = None,
) -> SearchOutput:
    """One search, driven as Ray Tune drives it: ``suggest`` until it returns
    ``Searcher.FINISHED`` (or ``None`` while trials are pending), then complete the pending
    trials (cheap trials, in order), repeat; ``release()`` at the end."""
    from ray.tune.search import Searcher

    s = scenario.build_searcher() if searcher is None else searcher
    pending: list[tuple[str, dict[str, Any]]] = []
    models: dict[str, float] = {}
    started, finished = 0, False
    while not finished or pending:
        if not finished:
            if started >= MAX_TRIALS_PER_SEARCH:
                raise AuditError(f"{scenario.label} started {started} trials without finishing")
            trial_id = f"trial_{started:05d}"
            config = s.suggest(trial_id)
            if config == Searcher.FINISHED:
                finished = True
            elif config is not None:
                started += 1
                if on_config is not None:
                    on_config(config)
                pending.append((trial_id, config))
                continue
            elif not pending:
                raise AuditError(f"{scenario.label} returned None with no trial pending")
        for trial_id, config in pending:
            out = run_cheap_trial(config, data, rng=rng)
            models[trial_id] = out.model
            # as train_dp reports it: a released score says the ε_s it was released at
            score_epsilon = RaydpSettings.from_config(config).score_epsilon
            s.on_trial_complete(trial_id, {METRIC: out.score} if score_epsilon is None
                                else {METRIC: out.score, NOISY_SCORE_KEY: score_epsilon})
        pending = []
    release = s.release()
    model = models.get(release.trial_id, math.nan) if release.trial_id is not None else math.nan
    return SearchOutput(_key(release.hyperparameters), float(model), started)


def _fresh_rng() -> np.random.Generator:
    return np.random.default_rng(secrets.randbits(128))


def default_scenarios() -> dict[str, AuditScenario]:
    """One scenario per algorithm: two learning rates, full-batch GD trials of
    ``Gaussian(σ=1, 1)`` (linear scaling: its own μ-GDP runs), noisy scores with ε_s = 0.1.
    SVT's final run has σ = 3 so that its claim (2.65) is small enough for the AboveThreshold
    selection itself to be tested: without its noise, "lr = 0.1 released" has probability
    1/2 on X (nothing passes, a uniform fallback) and 0 on X' (lr = 1 passes every round)."""
    from ray import tune

    budget = PrivacyBudget(epsilon=10.0, delta=1e-5)
    gd = {"optimizer": "gd", "epochs": 1, "noise_multiplier": 1.0}
    choice = {"lr": tune.choice([0.1, 1.0]), **gd}
    grid = {"lr": tune.grid_search([0.1, 1.0]), **gd}
    svt_space = {"lr": tune.grid_search([0.1, 1.0]), **gd, "noise_multiplier": 3.0}
    # DP-SGD linear scaling with the proportional transfer (two scenarios share it)
    proportional = {"param_space": {}, "runs_per_sweep": 3, "sweep_epsilons": (0.5, 1.0),
                    "lr_range": (0.1, 1.0), "steps_range": (2, 2), "full_batch": False,
                    "sample_rate": 0.5, "optimizer": "sgd", "fit_variable": "inverse_noise",
                    "line_fit": "proportional", "sweep_draw": "log_uniform",
                    "sweep_estimate": "quadratic"}
    scenarios = [
        AuditScenario("random_stopping",
                      {"param_space": choice, "distribution": "geometric", "mean": 3.0}, budget,
                      description="geometric K, E[K]=3"),
        AuditScenario("subsampled_transfer",
                      {"param_space": choice, "mean": 3.0, "subsample_rate": 0.2}, budget,
                      description="q=0.2, geometric K, E[K]=3"),
        AuditScenario("svt_threshold",
                      {"param_space": svt_space, "num_partitions": 5, "round_epsilon": 0.5,
                       "max_rounds": 3, "granularity": 0.05}, budget,
                      description="k=5 partitions, 3 rounds of ϵ=0.5, final run σ=3"),
        AuditScenario("linear_scaling",
                      {"param_space": {}, "preset": "paper", "runs_per_sweep": 2,
                       "sweep_epsilons": (0.5, 1.0), "lr_range": (0.1, 1.0),
                       "steps_range": (1, 3)},
                      PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="2 runs per sweep, T in [1, 3]"),
        # the DP-SGD variant with the proportional transfer: r* = α̂/σ_f, α̂ from a quadratic
        # fit to every released sweep score; the audit checks end to end on neighbouring
        # datasets that it reads nothing else
        AuditScenario("linear_scaling", proportional, PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="DP-SGD q=0.5, T=2, 3 runs per sweep, lr ∝ 1/σ, quadratic peak",
                      name="linear_scaling_proportional"),
        # the same with coarse-to-fine sweeps: the second sweep's lrs are drawn in a window
        # placed by the first sweep's released scores (an adaptive choice the plan must cover)
        AuditScenario("linear_scaling",
                      {**proportional, "sweep_draw": "refined", "refine_decades": 0.25},
                      PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="as linear_scaling_proportional, second sweep within "
                                  "±0.25 decade of the first's best",
                      name="linear_scaling_refined"),
        AuditScenario("one_shot_random", {"param_space": choice}, budget,
                      description="one run"),
        AuditScenario("grid_composed", {"param_space": grid}, budget,
                      description="2 grid points"),
    ]
    return {s.label: s for s in scenarios}


def claimed_epsilon(scenario: AuditScenario) -> dict[str, float]:
    """ε the plan claims at the budget's δ: RDP, PLD and privacy profiles (where each works)
    and their minimum — the smallest figure the certificate can print is the one audited."""
    s = scenario.build_searcher()
    mech = s.privacy_plan().mechanism
    if mech is None:  # grid search charges trial by trial: the whole grid's composition
        mech = s.composed_mechanism()
    return _claims(mech, scenario.budget.delta)


def _claims(mech: Mechanism, delta: float) -> dict[str, float]:
    """ε of ``mech`` at ``delta`` by RDP, PLD and privacy profiles (nan where an accountant
    does not apply) and their minimum, ``claim``."""
    out = {"rdp": epsilon(mech, delta, Accountant.RDP)}
    for name, accountant in (("pld", Accountant.PLD), ("profile", Accountant.TIGHTEST)):
        try:
            out[name] = epsilon(mech, delta, accountant)
        except RayDPHPOError:
            out[name] = math.nan
    out["claim"] = min(v for v in out.values() if not math.isnan(v))
    return out
