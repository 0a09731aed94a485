"""Sequential in-process driver for the privacy-utility benchmark (no Ray Tune).

It runs the REAL searchers of :mod:`raydp_hpo.searchers` and the REAL trainable
:func:`raydp_hpo.trainables.training.train_dp` one trial after the other, following the lifecycle of
:class:`raydp_hpo.searchers.base.DPSearcher` exactly as ``DPTuner`` does:

1. build the searcher with a :class:`~raydp_hpo.ledger.PrivacyLedger` (FIXED_PLAN; halting
   accountant ``accountant``, default: the one DPTuner's dedicated ledger uses,
   ``tightest_halting_accountant``) and ``admissible=ledger.would_admit`` — so every
   searcher calibrates its noise and is admitted on that accountant;
2. charge ``searcher.privacy_plan().mechanism`` (when not ``None``) under
   ``searcher.plan_charge_id``;
3. loop ``suggest`` → ``train_dp`` → ``on_trial_complete`` until ``FINISHED``;
4. ``release()``; the released model is the released trial's model, so its test accuracy is
   that trial's ``test_accuracy``.

Also holds the small models the benchmark uses: search spaces must be flat, so model sizes are
fixed by importable factories (``"_driver:mlp64"``) instead of a nested ``model_kwargs``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from raydp_hpo.accounting.accountants import Accountant, epsilon_or_inf
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.errors import BudgetExhaustedError, RayDPHPOError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, tightest_halting_accountant
from raydp_hpo.searchers import make_searcher
from raydp_hpo.trainables.data import DataSplits
from raydp_hpo.trainables.models import MLP
from raydp_hpo.trainables.training import declared_privacy, train_dp

__all__ = ["SearchOutcome", "run_search", "run_oracle", "plan_epsilons", "mlp64", "mlp128",
           "mlp256"]

FINISHED = "FINISHED"  # ray.tune.search.Searcher.FINISHED


def mlp64(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """One hidden layer of 64 ReLU units."""
    return MLP(input_shape, num_classes, hidden=(64,))


def mlp128(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """One hidden layer of 128 ReLU units."""
    return MLP(input_shape, num_classes, hidden=(128,))


def mlp256(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Two hidden layers of 256 ReLU units (the package default MLP)."""
    return MLP(input_shape, num_classes, hidden=(256, 256))


@dataclass
class SearchOutcome:
    """What one search produced (private diagnostics included: this is a benchmark)."""

    status: str  # "ok", "refused", "error", "no_release"
    reason: str = ""
    test_accuracy: float | None = None
    val_accuracy: float | None = None  # the released trial's (possibly noised) score
    hyperparameters: dict[str, Any] | None = None
    trials: int = 0
    refused_trials: int = 0
    gradient_evaluations: float = 0.0
    planned_gradient_evaluations: float | None = None
    plan_epsilon: float | None = None
    #: the admitted plan's ε under each accountant (``inf``: that accountant cannot bound it)
    plan_epsilons: dict[str, float] = field(default_factory=dict)
    accountant: str = ""
    wall_s: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)


def gradient_evaluations(config: Mapping[str, Any], data: DataSplits, result: Any) -> float:
    """Σ over the trial's models of steps × per-step evaluations × expected batch q·n."""
    privacy, n = declared_privacy(config, data)
    steps = int(result.metrics.get("steps", 0))
    per_model = steps * privacy.gradient_evaluations_per_step * privacy.sample_rate * n
    return float(per_model * max(1, len(result.models)))


def run_search(
    method: str,
    space: Mapping[str, Any],
    data: DataSplits,
    budget: PrivacyBudget,
    seed: int,
    searcher_kwargs: Mapping[str, Any] | None = None,
    *,
    metric: str = "val_accuracy",
    max_trials: int = 1000,
    accountant: Accountant | None = None,
) -> SearchOutcome:
    """Run one DP search to its release, sequentially, and return its outcome.

    ``accountant`` is the ledger's halting accountant (``None``: the tightest a fixed-plan
    ledger halts on, as in DPTuner): the searcher calibrates its noise so
    that the plan is admitted under it. The outcome's ``plan_epsilons`` holds the admitted
    plan's ε under RDP, BEST (min of RDP and PLD/PRV) and PROFILE (PLD with random stopping
    by privacy profiles), and ``"tightest"``, their minimum (each is a valid upper bound, so
    is their minimum)."""
    t0 = time.perf_counter()
    if accountant is None:
        accountant = tightest_halting_accountant(Adaptivity.FIXED_PLAN)
    try:
        ledger = PrivacyLedger(budget, adaptivity=Adaptivity.FIXED_PLAN, accountant=accountant)
    except RayDPHPOError as exc:  # e.g. a halting accountant this ledger does not support
        return SearchOutcome("refused", f"{type(exc).__name__}: {exc}",
                             accountant=accountant.value, wall_s=time.perf_counter() - t0)
    experiment = f"{method}-s{seed}"
    try:
        searcher = make_searcher(
            method,
            param_space=dict(space),
            metric=metric,
            mode="max",
            dataset_size=len(data.train),
            budget=budget,
            seed=seed,
            experiment=experiment,
            admissible=EmptyLedgerAdmission(ledger),
            **dict(searcher_kwargs or {}),
        )
    except (ValueError, TypeError) as exc:  # InvalidParameterError / SearchSpaceError
        return SearchOutcome("refused", f"{type(exc).__name__}: {exc}",
                             wall_s=time.perf_counter() - t0)
    plan = searcher.privacy_plan()
    if plan.mechanism is not None:
        ledger.charge(searcher.plan_charge_id, plan.mechanism, owner=experiment)
    out = SearchOutcome("ok", planned_gradient_evaluations=plan.expected_gradient_evaluations,
                        accountant=accountant.value)
    if plan.mechanism is not None:
        out.plan_epsilons = plan_epsilons(plan.mechanism, budget.delta)
    metrics: dict[str, dict[str, Any]] = {}
    live: set[str] = set()
    for i in range(max_trials + 1):
        if i == max_trials:
            out.status, out.reason = "error", f"more than {max_trials} trials: stopped"
            break
        tid = f"t{i:04d}"
        cfg = searcher.suggest(tid)
        if cfg == FINISHED:
            break
        if cfg is None:
            # sequential driver: every suggested trial has completed, so None is a bug
            out.status = "error"
            out.reason = f"suggest returned None with {len(live)} trials running"
            break
        live.add(tid)
        out.trials += 1
        try:
            result = train_dp(cfg, data, ledger=ledger)
        except BudgetExhaustedError as exc:
            out.refused_trials += 1
            out.extras.setdefault("refusals", []).append(str(exc)[:200])
            searcher.on_trial_complete(tid, None, error=True)
            live.discard(tid)
            continue
        metrics[tid] = dict(result.metrics)
        out.gradient_evaluations += gradient_evaluations(cfg, data, result)
        searcher.on_trial_complete(tid, dict(result.metrics), error=False)
        live.discard(tid)
    release = searcher.release()
    out.extras.update({k: v for k, v in release.extras.items() if isinstance(v, (int, float, bool, str))})
    out.hyperparameters = release.hyperparameters
    if ledger.charges():
        out.plan_epsilon = float(ledger.spent())
    if out.status == "ok":
        if release.trial_id is None or release.trial_id not in metrics:
            out.status = "no_release"
            out.reason = str(release.extras.get("reason", "no released trial"))
        else:
            m = metrics[release.trial_id]
            out.test_accuracy = float(m["test_accuracy"])
            out.val_accuracy = float(m["val_accuracy"])
    out.wall_s = time.perf_counter() - t0
    return out


#: per-process memo of admission figures of an EMPTY ledger: (budget, accountant, mechanism) →
#: ε if charged. Searchers calibrate σ by 10–25 admission checks of the same mechanisms for
#: every seed; with PLD / privacy-profile halting each costs 0.1–1 s, so a benchmark that runs
#: many seeds of one method would mostly recompute identical figures.
_FIGURES: dict[tuple[Any, ...], float] = {}
_PLAN_EPS: dict[tuple[Any, ...], dict[str, float]] = {}


class EmptyLedgerAdmission:
    """``ledger.would_admit`` for a ledger with no charges yet, memoised across searches.

    Exact, not an approximation: on an empty fixed-plan ledger, admission depends only on the
    budget, the halting accountant and the mechanism (mechanisms are frozen, hashable values).
    Once the ledger holds a charge it defers to the ledger itself. ``figure`` (the ε the rule
    compares with the budget) lets :meth:`DPSearcher._calibrate_noise` take its guided search.
    """

    def __init__(self, ledger: PrivacyLedger) -> None:
        self._ledger = ledger

    def figure(self, mechanism: Mechanism) -> float:
        if self._ledger.charges():
            return float(self._ledger.epsilon_if_charged(mechanism))
        key = (self._ledger.budget, self._ledger.adaptivity, self._ledger.halting_accountant,
               mechanism)
        if key not in _FIGURES:
            _FIGURES[key] = float(self._ledger.epsilon_if_charged(mechanism))
        return _FIGURES[key]

    def __call__(self, mechanism: Mechanism) -> bool:
        return self.figure(mechanism) <= self._ledger.budget.epsilon


def plan_epsilons(mechanism: Mechanism, delta: float) -> dict[str, float]:
    """ε of ``mechanism`` at ``delta`` under RDP, BEST and PROFILE, and their minimum
    (memoised per process: the same plan recurs for every seed)."""
    key = (mechanism, delta)
    if key not in _PLAN_EPS:
        eps = {a.value: epsilon_or_inf(mechanism, delta, a)
               for a in (Accountant.RDP, Accountant.BEST, Accountant.PROFILE)}
        eps["tightest"] = min(eps.values())
        _PLAN_EPS[key] = eps
    return dict(_PLAN_EPS[key])


def run_oracle(space: Mapping[str, Any], grid_key: str, grid: list[float],
               data: DataSplits, *, nonprivate: bool = False,
               seed: int | None = None) -> SearchOutcome:
    """Oracle grid: train every grid point and return the test accuracy of the configuration
    with the best CLEAN validation accuracy (no score noise); the selection is not charged.

    * ``nonprivate=False`` (the benchmark's oracle, "non-private tuning" in Papernot & Steinke
      2022, Koskela & Kulkarni 2023, Mohapatra et al. 2022): ``space`` must hold
      ``target_epsilon`` (and ``target_delta``), so every grid point is DP-SGD with its noise
      calibrated for ONE run to cost the whole (ε, δ); only the selection among them is free.
    * ``nonprivate=True`` (the "non-DP reference"): no clipping, no noise at all.

    No ledger is used (nothing is charged); ``seed`` makes the trainings reproducible
    (grid point i trains with the secret seed 1000·seed + i).
    """
    t0 = time.perf_counter()
    best: tuple[float, float, float] | None = None
    evals = 0.0
    for i, value in enumerate(grid):
        cfg: dict[str, Any] = {**space, grid_key: value}
        if nonprivate:
            cfg["raydp"] = {"nonprivate": True}
        elif "target_epsilon" not in cfg and "noise_multiplier" not in cfg:
            raise ValueError("a DP oracle needs target_epsilon (or noise_multiplier) in space")
        result = train_dp(cfg, data,
                          secret_seed=None if seed is None else 1000 * int(seed) + i)
        evals += gradient_evaluations(cfg, data, result)
        val, test = float(result.metrics["val_accuracy"]), float(result.metrics["test_accuracy"])
        if best is None or val > best[0]:
            best = (val, test, value)
    assert best is not None
    return SearchOutcome("ok", test_accuracy=best[1], val_accuracy=best[0],
                         hyperparameters={grid_key: best[2]}, trials=len(grid),
                         gradient_evaluations=evals, wall_s=time.perf_counter() - t0)
