"""What a searcher states and what it releases: the plan and release types and the keys of
the trial contract.

A :class:`PrivacyPlan` is the whole privacy cost of a search, fixed before any trial runs
(``DPTuner`` charges its mechanism under ``f"{experiment}/plan"``); a :class:`Release` is the
public output of a search. :data:`RESERVED_KEY` is the config key carrying a trial's
:class:`~raydp_hpo.trial.settings.RaydpSettings`; :data:`PRIVACY_KEYS` are the keys
:func:`raydp_hpo.trial.privacy.privacy_from_config` reads, of which :data:`NOISE_KEYS` set the
noise. Re-exported by :mod:`raydp_hpo.searchers.base`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.trial.settings import RAYDP_KEY

__all__ = [
    "RESERVED_KEY",
    "PRIVACY_KEYS",
    "NOISE_KEYS",
    "TUNER_ASSIGNED",
    "TUNER_DEFAULTS",
    "Admissible",
    "Phase",
    "PrivacyPlan",
    "Release",
]


#: The config key carrying the privacy contract of a trial; never part of a release.
RESERVED_KEY = RAYDP_KEY
#: Keys read by :func:`raydp_hpo.trial.privacy.privacy_from_config`.
PRIVACY_KEYS: tuple[str, ...] = (
    "noise_multiplier",
    "target_epsilon",
    "target_delta",
    "mu",
    "sample_rate",
    "batch_size",
    "epochs",
    "optimizer",
)
#: Keys that set the DP noise of a trial (at most one may appear in a space).
NOISE_KEYS: tuple[str, ...] = ("noise_multiplier", "target_epsilon", "mu")

#: ``set_search_properties`` spec keys the orchestrator always assigns: which ledger the
#: trials charge and check, and the experiment every charge id is prefixed with. They decide
#: no part of the plan, so a searcher built by the user is told them, never asked for them.
TUNER_ASSIGNED: tuple[str, ...] = ("ledger_name", "namespace", "experiment")
#: Spec keys that fill constructor arguments a searcher built without a space was not given.
TUNER_DEFAULTS: tuple[str, ...] = ("dataset_size", "validation_size", "budget", "seed",
                                   "admissible")

#: Predicate deciding whether a plan mechanism fits the budget (the ledger's rule).
Admissible = Callable[[Mechanism], bool]


class Phase:
    """Values of ``config["raydp"].phase``."""

    TUNE = "tune"
    FINAL = "final"


@dataclass(frozen=True)
class PrivacyPlan:
    """The whole privacy cost of a search, fixed before any trial runs.

    Attributes:
        mechanism: the total mechanism charged up front (``None`` when every trial charges
            itself, as in :class:`~raydp_hpo.searchers.baselines.GridSearchComposed`).
        base: per-trial base mechanism that every covered trial must be dominated by
            (:func:`raydp_hpo.ledger.coverage.is_covered`), or ``None``.
        per_trial_charges: ``True`` when trials charge the ledger individually.
        algorithm: short algorithm name.
        paper: citation of the algorithm and theorem the accounting follows.
        description: one human-readable sentence on how the cost is composed.
        expected_gradient_evaluations: expected number of per-example gradient evaluations
            of the whole search (upper bound where the privacy grid varies).
    """

    mechanism: Mechanism | None
    base: Mechanism | None
    per_trial_charges: bool
    algorithm: str
    paper: str
    description: str
    expected_gradient_evaluations: float


@dataclass(frozen=True)
class Release:
    """The public output of a search.

    Attributes:
        hyperparameters: the selected configuration without the ``"raydp"`` key, or ``None``
            when the search selected nothing (e.g. Poisson random stopping drew K = 0).
        trial_id: the trial whose model is released (the final run, or the best trial of a
            selection without a final run), or ``None``.
        algorithm: the algorithm that produced it.
        extras: public, data-independent or selection-output extras (gradient evaluations,
            flags). Per-trial metrics and the number of trials actually run are private and
            never appear here.
    """

    hyperparameters: dict[str, Any] | None
    trial_id: str | None
    algorithm: str
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def selected(self) -> bool:
        """Whether a configuration was selected."""
        return self.hyperparameters is not None

