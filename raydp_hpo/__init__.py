"""raydp-hpo: differentially private hyperparameter optimisation on Ray Tune.

The public API is re-exported lazily (PEP 562) so that importing the privacy core from
:mod:`raydp_hpo.searchers` or :mod:`raydp_hpo.trainables` never pulls in the orchestration layer
(Ray Tune, torch). Where things live: :mod:`raydp_hpo.accounting` (mechanisms and bounds, no Ray
or torch), :mod:`raydp_hpo.ledger` (the privacy filter, journal and Ray actor),
:mod:`raydp_hpo.trial` (the searcher–trial contract), :mod:`raydp_hpo.searchers`,
:mod:`raydp_hpo.trainables`, :mod:`raydp_hpo.tune` (DPTuner) and :mod:`raydp_hpo.cli`.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # errors
    "RayDPHPOError": "raydp_hpo.errors",
    "InvalidParameterError": "raydp_hpo.errors",
    "UnsupportedMechanismError": "raydp_hpo.errors",
    "BudgetExhaustedError": "raydp_hpo.errors",
    "ChargeConflictError": "raydp_hpo.errors",
    "LedgerCorruptedError": "raydp_hpo.errors",
    "LedgerMismatchError": "raydp_hpo.errors",
    "DataValidationError": "raydp_hpo.errors",
    "SearchSpaceError": "raydp_hpo.errors",
    "ConfigError": "raydp_hpo.errors",
    "TrialContractError": "raydp_hpo.errors",
    "SearchFailedError": "raydp_hpo.errors",
    "ReleaseAlreadyPublishedError": "raydp_hpo.errors",
    # budget and mechanisms
    "PrivacyBudget": "raydp_hpo.accounting.budget",
    "Mechanism": "raydp_hpo.accounting.mechanisms",
    "SubsampledGaussian": "raydp_hpo.accounting.mechanisms",
    "Gaussian": "raydp_hpo.accounting.mechanisms",
    "Laplace": "raydp_hpo.accounting.mechanisms",
    "PureDP": "raydp_hpo.accounting.mechanisms",
    "ApproxDP": "raydp_hpo.accounting.mechanisms",
    "Composition": "raydp_hpo.accounting.mechanisms",
    "WorstCase": "raydp_hpo.accounting.mechanisms",
    "StoppingDistribution": "raydp_hpo.accounting.mechanisms",
    "RandomStopping": "raydp_hpo.accounting.mechanisms",
    "SubsampledTuning": "raydp_hpo.accounting.mechanisms",
    # accounting
    "Accountant": "raydp_hpo.accounting.accountants",
    "epsilon": "raydp_hpo.accounting.accountants",
    "epsilons": "raydp_hpo.accounting.accountants",
    "delta": "raydp_hpo.accounting.accountants",
    "calibrate_noise": "raydp_hpo.accounting.accountants",
    "calibrate_laplace": "raydp_hpo.accounting.calibration",
    "calibrate_analytic_gaussian": "raydp_hpo.accounting.calibration",
    "calibrate_search": "raydp_hpo.accounting.calibration",
    "gdp_epsilon": "raydp_hpo.accounting.gdp",
    "gdp_delta": "raydp_hpo.accounting.gdp",
    "gdp_mu": "raydp_hpo.accounting.gdp",
    "compose_mu": "raydp_hpo.accounting.gdp",
    "is_covered": "raydp_hpo.ledger.coverage",
    "Optimizer": "raydp_hpo.trial.privacy",
    "DPSGDPrivacy": "raydp_hpo.trial.privacy",
    "privacy_from_config": "raydp_hpo.trial.privacy",
    "ScoreNoise": "raydp_hpo.trial.privacy",
    "ScoreRelease": "raydp_hpo.trial.privacy",
    "RaydpSettings": "raydp_hpo.trial.settings",
    # ledger
    "Adaptivity": "raydp_hpo.ledger.filter",
    "DeltaSplit": "raydp_hpo.ledger.experiments",
    "PrivacyLedger": "raydp_hpo.ledger.filter",
    "ChargeDecision": "raydp_hpo.ledger.filter",
    "LedgerReport": "raydp_hpo.ledger.filter",
    "LedgerLike": "raydp_hpo.ledger.ledger_like",
    "get_ledger": "raydp_hpo.ledger.actor",
    "LedgerHandle": "raydp_hpo.ledger.actor",
    "LedgerStopper": "raydp_hpo.tune.hooks",
    "LedgerAuditCallback": "raydp_hpo.tune.hooks",
    "NoTensorBoardLogger": "raydp_hpo.tune.hooks",
    # orchestration
    "DPTuner": "raydp_hpo.tune.tuner",
    "choose_auto": "raydp_hpo.searchers.auto",
    "AutoChoice": "raydp_hpo.searchers.auto",
    "trial_session": "raydp_hpo.trainables.session",
    "TrialSession": "raydp_hpo.trainables.session",
    "DPEngine": "raydp_hpo.trainables.native_private",
    "NoiseSource": "raydp_hpo.trainables.dp_step.noise",
    "load_released_model": "raydp_hpo.trainables.release",
    "DPResult": "raydp_hpo.tune.tuner",
    "PrivacyCertificate": "raydp_hpo.tune.tuner",
    "create_dataset_ledger": "raydp_hpo.tune.dataset_ledger",
}

__all__ = sorted(_EXPORTS)

# The real types, for mypy and IDEs: under TYPE_CHECKING only, so at run time every name stays
# lazy (tests/raydp_hpo/test_public_api.py checks that these imports match _EXPORTS).
if TYPE_CHECKING:
    from raydp_hpo.accounting.accountants import (
        Accountant,
        calibrate_noise,
        delta,
        epsilon,
        epsilons,
    )
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.calibration import (
        calibrate_analytic_gaussian,
        calibrate_laplace,
        calibrate_search,
    )
    from raydp_hpo.accounting.gdp import compose_mu, gdp_delta, gdp_epsilon, gdp_mu
    from raydp_hpo.accounting.mechanisms import (
        ApproxDP,
        Composition,
        Gaussian,
        Laplace,
        Mechanism,
        PureDP,
        RandomStopping,
        StoppingDistribution,
        SubsampledGaussian,
        SubsampledTuning,
        WorstCase,
    )
    from raydp_hpo.errors import (
        BudgetExhaustedError,
        ChargeConflictError,
        ConfigError,
        DataValidationError,
        InvalidParameterError,
        LedgerCorruptedError,
        LedgerMismatchError,
        RayDPHPOError,
        ReleaseAlreadyPublishedError,
        SearchFailedError,
        SearchSpaceError,
        TrialContractError,
        UnsupportedMechanismError,
    )
    from raydp_hpo.ledger.actor import LedgerHandle, get_ledger
    from raydp_hpo.ledger.coverage import is_covered
    from raydp_hpo.ledger.experiments import DeltaSplit
    from raydp_hpo.ledger.filter import Adaptivity, ChargeDecision, LedgerReport, PrivacyLedger
    from raydp_hpo.ledger.ledger_like import LedgerLike
    from raydp_hpo.searchers.auto import AutoChoice, choose_auto
    from raydp_hpo.trainables.dp_step.noise import NoiseSource
    from raydp_hpo.trainables.native_private import DPEngine
    from raydp_hpo.trainables.release import load_released_model
    from raydp_hpo.trainables.session import TrialSession, trial_session
    from raydp_hpo.trial.privacy import (
        DPSGDPrivacy,
        Optimizer,
        ScoreNoise,
        ScoreRelease,
        privacy_from_config,
    )
    from raydp_hpo.trial.settings import RaydpSettings
    from raydp_hpo.tune.dataset_ledger import create_dataset_ledger
    from raydp_hpo.tune.hooks import LedgerAuditCallback, LedgerStopper, NoTensorBoardLogger
    from raydp_hpo.tune.tuner import DPResult, DPTuner, PrivacyCertificate


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
