"""The audit of a dataset ledger across experiments, the second chosen from the first's release
(:func:`audit_dataset_ledger`): the guarantee of the whole adaptive interaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.audit.scenarios import AuditScenario, SearchOutput, default_scenarios, run_search
from raydp_hpo.audit.statistics import AuditResult, _audit_result, _audit_setup

#: Name of the dataset-ledger audit in :func:`run_audit`.
DATASET_LEDGER = "dataset_ledger"


def _dataset_ledger_experiments() -> tuple[AuditScenario, AuditScenario, AuditScenario]:
    """The first experiment (random stopping, E[K]=3) and the two second experiments an
    adaptive analyst picks between from the first's release: one-shot random search when it
    released lr = 1.0, else random stopping with E[K]=2."""
    from dataclasses import replace

    scenarios = default_scenarios()
    first = scenarios["random_stopping"]
    after_high = scenarios["one_shot_random"]
    after_low = replace(first, searcher_kwargs={**first.searcher_kwargs, "mean": 2.0},
                        description="geometric K, E[K]=2")
    return first, after_high, after_low


def _dataset_ledger(budget: PrivacyBudget) -> Any:
    from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger

    return PrivacyLedger(budget, adaptivity=Adaptivity.EXPERIMENTS,
                         accountant=Accountant.TIGHTEST)


def dataset_ledger_claim(delta: float = 1e-5) -> dict[str, float]:
    """The dataset ledger's budget the audit claims: the larger of what the ledger records
    for the two paths (first then either second experiment), each the real ledger's spend,
    min(RDP filter at δ_A, basic composition of the points) (:mod:`raydp_hpo.ledger.
    experiments`). The filter theorem guarantees the budget whatever path the analyst takes;
    the budget is set to exactly the costlier path, so the claim is as small as can hold."""
    first, after_high, after_low = _dataset_ledger_experiments()
    spends = []
    for second in (after_high, after_low):
        ledger = _dataset_ledger(PrivacyBudget(1e6, delta))
        ledger.charge("first/point", first.build_searcher().privacy_plan().mechanism)
        ledger.charge("second/point", second.build_searcher().privacy_plan().mechanism)
        spends.append(ledger.spent())
    return {"claim": max(spends), "rdp": math.nan, "pld": math.nan, "profile": math.nan}


def run_dataset_ledger(data: Any, rng: np.random.Generator, budget: PrivacyBudget
                       ) -> SearchOutput:
    """Two experiments on one real dataset ledger (``Adaptivity.EXPERIMENTS``), as ``DPTuner``
    runs them: each plan is admitted as the experiment's point before the search runs; the
    second experiment is chosen from the first's released hyperparameters. The output is
    both releases and the second's model (``nan`` when the ledger refused it)."""
    first, after_high, after_low = _dataset_ledger_experiments()
    ledger = _dataset_ledger(budget)
    s1 = first.build_searcher()
    ledger.charge("first/point", s1.privacy_plan().mechanism)
    out1 = run_search(first, data, rng, searcher=s1)
    released_lr = dict(out1.hyperparameters or ()).get("lr")
    second = after_high if released_lr == 1.0 else after_low
    s2 = second.build_searcher()
    if not ledger.try_charge("second/point", s2.privacy_plan().mechanism).admitted:
        return SearchOutput((("first", out1.hyperparameters), ("second", None)), math.nan,
                            out1.trials)
    out2 = run_search(second, data, rng, searcher=s2)
    return SearchOutput((("first", out1.hyperparameters), ("second", out2.hyperparameters)),
                        out2.model, out1.trials + out2.trials)


def audit_dataset_ledger(*, runs: int, selection_runs: int | None = None,
                         alpha: float = 0.05, rng: np.random.Generator | None = None,
                         claim: Mapping[str, float] | None = None) -> AuditResult:
    """The dataset ledger end to end: :func:`run_dataset_ledger` on X and X' (the
    random-stopping scenario's neighbouring datasets), against the ledger's budget
    (:func:`dataset_ledger_claim`): the guarantee of the whole adaptive interaction."""
    selection_runs, rng, start = _audit_setup(runs, selection_runs, rng)
    first, _, _ = _dataset_ledger_experiments()
    x, x2 = first.datasets()
    delta = first.budget.delta
    claim = dataset_ledger_claim(delta) if claim is None else claim
    budget = PrivacyBudget(claim["claim"] * (1 + 1e-9), delta)

    def outputs(neighbour: int, count: int) -> list[SearchOutput]:
        data = x2 if neighbour else x
        return [run_dataset_ledger(data, rng, budget) for _ in range(count)]

    return _audit_result(DATASET_LEDGER, "random stopping E[K]=3, then one-shot if it "
                         "released lr=1 else random stopping E[K]=2, on one dataset ledger",
                         claim, outputs, runs=runs, selection_runs=selection_runs,
                         delta=delta, alpha=alpha, start=start, mean_trials=True)
