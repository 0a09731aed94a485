"""Baselines for honest comparison (DESIGN.md, "The four searches").

* :class:`OneShotRandomSearch` — one configuration drawn from the space *before* any data is
  touched, trained once at the whole budget. Its hyperparameters are data-independent, so the
  only privacy cost is that one training run (no selection happens).
* :class:`GridSearchComposed` — every grid point is trained and the best is released; the cost
  is the composition of every trial (each trial charges the ledger itself). This is the naive
  approach whose cost grows with the grid (Ding et al., Table 1, "Naive").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher

from raydp_hpo.accounting.mechanisms import Composition, Mechanism
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.searchers.base import (
    RESERVED_KEY,
    DPSearcher,
    Phase,
    PrivacyPlan,
    Release,
    finite_grid,
)
from raydp_hpo.trial.privacy import privacy_from_config

__all__ = ["OneShotRandomSearch", "GridSearchComposed"]


class OneShotRandomSearch(DPSearcher):
    """One random configuration, trained once with noise calibrated to the whole budget.

    The configuration (including its privacy settings) is drawn at construction from the
    searcher's RNG, so the plan is exactly that one run's mechanism — no worst case is needed.
    No selection reads its score, so it carries no noisy-score part (``score_epsilon`` unused).
    """

    algorithm = "one_shot_random"
    paper = "baseline: a single DP training run (basic composition of nothing: its own RDP)"

    def __init__(self, param_space: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(param_space, **kwargs)
        self._privacy_grid()  # validates privacy keys (finite domains only)
        self._config = self._sample_config()
        if self._needs_noise_calibration():
            self._config["noise_multiplier"] = self._calibrate_noise(
                lambda s: self._mechanism_of({**self._config, "noise_multiplier": s}),
                what="one training run",
            )
        mech = self._mechanism_of(self._config)
        self._require_admissible(mech, what="one training run")
        p = privacy_from_config(self._config, self._dataset_size)
        self._plan = self._make_plan(
            mechanism=mech,
            base=mech,
            description="one DP training run at the whole budget",
            expected_gradient_evaluations=p.expected_gradient_evaluations(self._dataset_size),
        )
        self._trial: str | None = None

    def _mechanism_of(self, config: Mapping[str, Any]) -> Mechanism:
        return privacy_from_config(config, self._dataset_size).mechanism()

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    def _suggest(self, trial_id: str) -> dict | str | None:
        if self._trial is not None:
            self._finished = True
            return Searcher.FINISHED
        self._trial = trial_id
        config = dict(self._config)
        config[RESERVED_KEY] = self._raydp(
            trial_id,
            base=self._plan.base,
            data_view={"kind": "full"},
            phase=Phase.FINAL,
            score_epsilon=None,  # one run, no selection: its score is not read
        )
        return self._issue(trial_id, config)

    def release(self) -> Release:
        extras = {"expected_gradient_evaluations": self._plan.expected_gradient_evaluations}
        hyper = {k: v for k, v in self._config.items() if k != RESERVED_KEY}
        if self._trial is None or self._results.get(self._trial) is None:
            extras["final_failed"] = self._trial is not None
            return Release(hyper, None, self.algorithm, extras)
        return Release(hyper, self._trial, self.algorithm, extras)


class GridSearchComposed(DPSearcher):
    """Grid search over every combination of finite domains, composing every trial.

    Every key must be a constant, ``tune.choice`` or ``tune.grid_search`` (the grid is their
    Cartesian product, in order). Each trial charges the ledger itself (``charge=True``,
    ``covered_by=None``). When the space sets no noise, one ``noise_multiplier`` is calibrated so
    that the composition of the *whole* grid is admissible. When the space fixes the noise, the
    grid may not fit: the ledger then refuses a trial (it fails with ``BudgetExhaustedError``)
    and the searcher stops (``FINISHED``) at the first failed trial — the adaptive RDP filter
    of the ledger (Feldman & Zrnic 2021) is what makes this halting rule valid.

    Every trial's score feeds the final selection, so each trial's charge is
    ``trial_mechanism(training, score_epsilon)`` (training + ``Laplace(score_epsilon)``) and
    the noise calibration composes these whole per-trial mechanisms.
    """

    algorithm = "grid_composed"
    paper = "baseline: sequential composition of every trial (RDP composition, Mironov 2017)"

    def __init__(self, param_space: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(param_space, **kwargs)
        self._grid = finite_grid(
            self._space,
            "grid search needs tune.choice([...]), tune.grid_search([...]) or a constant for "
            "every key",
        )
        self._sigma: float | None = None
        if self._needs_noise_calibration():
            self._sigma = self._calibrate_noise(
                lambda s: self._composition(s), what=f"a grid of {len(self._grid)} trials"
            )
            self._require_admissible(self._composition(self._sigma), what="the grid")
        else:
            first = self._trial_mechanism(self._grid[0])
            self._require_admissible(first, what="the first grid trial")
        total = self._composition(self._sigma)
        fits = self._admissible(total)
        self._plan = self._make_plan(
            mechanism=None,
            base=None,
            per_trial_charges=True,
            description=(
                f"{len(self._grid)} trials, each charged by itself; their composition "
                + ("fits the budget" if fits else "exceeds the budget: the ledger stops the grid")
            ),
            expected_gradient_evaluations=sum(self._gradient_evaluations(c) for c in self._grid),
        )
        self._next = 0
        self._stopped = False

    def _with_sigma(self, config: Mapping[str, Any], sigma: float | None) -> dict[str, Any]:
        return dict(config) if sigma is None else {**config, "noise_multiplier": sigma}

    def _trial_mechanism(self, config: Mapping[str, Any], sigma: float | None = None) -> Mechanism:
        """What one grid trial charges: its training plus its noisy selection score."""
        try:
            return self._scored(
                privacy_from_config(self._with_sigma(config, sigma), self._dataset_size).mechanism()
            )
        except InvalidParameterError as exc:
            raise SearchSpaceError(f"grid point {dict(config)} is invalid: {exc}") from None

    def _composition(self, sigma: float | None) -> Composition:
        return Composition(tuple(self._trial_mechanism(c, sigma) for c in self._grid))

    def _gradient_evaluations(self, config: Mapping[str, Any]) -> float:
        p = privacy_from_config(self._with_sigma(config, self._sigma or 1.0), self._dataset_size)
        return p.expected_gradient_evaluations(self._dataset_size)

    @property
    def grid_size(self) -> int:
        return len(self._grid)

    def composed_mechanism(self) -> Composition:
        """The composition of every grid trial (what the ledger sees if the grid completes)."""
        return self._composition(self._sigma)

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    def _on_complete(self, trial_id: str, value: float | None) -> None:
        if value is None:  # refused by the ledger (or crashed): stop the grid here
            self._stopped = True

    def _suggest(self, trial_id: str) -> dict | str | None:
        if self._stopped or self._next >= len(self._grid):
            self._finished = True
            return Searcher.FINISHED
        config = self._with_sigma(self._grid[self._next], self._sigma)
        self._next += 1
        config[RESERVED_KEY] = self._raydp(
            trial_id,
            base=None,
            data_view={"kind": "full"},
            phase=Phase.TUNE,
            score_epsilon=self._score_epsilon,  # the final selection reads every score
            charge=True,
            covered=False,
        )
        return self._issue(trial_id, config)

    def release(self) -> Release:
        extras: dict[str, Any] = {
            "expected_gradient_evaluations": self._plan.expected_gradient_evaluations,
        }
        best = self._best_of(list(self._configs))
        if best is None:
            extras["reason"] = "no trial reported the metric: no configuration was selected"
            return Release(None, None, self.algorithm, extras)
        return Release(self._public_config(best), best, self.algorithm, extras)
