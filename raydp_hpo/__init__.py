"""raydp-hpo: differentially private hyperparameter optimisation on Ray Tune.

The public API is re-exported lazily (PEP 562) so that importing the privacy core from
``search_algs`` or ``trainables`` never pulls in the orchestration layer (Ray Tune, torch).
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
    # budget and mechanisms
    "PrivacyBudget": "raydp_hpo.budget",
    "Mechanism": "raydp_hpo.mechanisms",
    "SubsampledGaussian": "raydp_hpo.mechanisms",
    "Gaussian": "raydp_hpo.mechanisms",
    "Laplace": "raydp_hpo.mechanisms",
    "PureDP": "raydp_hpo.mechanisms",
    "ApproxDP": "raydp_hpo.mechanisms",
    "Composition": "raydp_hpo.mechanisms",
    "WorstCase": "raydp_hpo.mechanisms",
    "StoppingDistribution": "raydp_hpo.mechanisms",
    "RandomStopping": "raydp_hpo.mechanisms",
    "SubsampledTuning": "raydp_hpo.mechanisms",
    # accounting
    "Accountant": "raydp_hpo.accounting",
    "epsilon": "raydp_hpo.accounting",
    "epsilons": "raydp_hpo.accounting",
    "delta": "raydp_hpo.accounting",
    "calibrate_noise": "raydp_hpo.accounting",
    "calibrate_laplace": "raydp_hpo.calibration",
    "calibrate_analytic_gaussian": "raydp_hpo.calibration",
    "gdp_epsilon": "raydp_hpo.gdp",
    "gdp_delta": "raydp_hpo.gdp",
    "gdp_mu": "raydp_hpo.gdp",
    "compose_mu": "raydp_hpo.gdp",
    "is_covered": "raydp_hpo.coverage",
    "Optimizer": "raydp_hpo.trial_privacy",
    "DPSGDPrivacy": "raydp_hpo.trial_privacy",
    "privacy_from_config": "raydp_hpo.trial_privacy",
    "ScoreNoise": "raydp_hpo.trial_privacy",
    "ScoreRelease": "raydp_hpo.trial_privacy",
    "RaydpSettings": "raydp_hpo.trial_settings",
    # ledger
    "Adaptivity": "raydp_hpo.ledger",
    "PrivacyLedger": "raydp_hpo.ledger",
    "ChargeDecision": "raydp_hpo.ledger",
    "LedgerReport": "raydp_hpo.ledger",
    "LedgerLike": "raydp_hpo.ledger_like",
    "get_ledger": "raydp_hpo.ledger_actor",
    "LedgerHandle": "raydp_hpo.ledger_actor",
    "LedgerStopper": "raydp_hpo.tune_hooks",
    "LedgerAuditCallback": "raydp_hpo.tune_hooks",
    "NoTensorBoardLogger": "raydp_hpo.tune_hooks",
    # orchestration
    "DPTuner": "raydp_hpo.tuner",
    "DPResult": "raydp_hpo.tuner",
    "PrivacyCertificate": "raydp_hpo.tuner",
}

__all__ = sorted(_EXPORTS)

# The real types, for mypy and IDEs: under TYPE_CHECKING only, so at run time every name stays
# lazy (tests/raydp_hpo/test_public_api.py checks that these imports match _EXPORTS).
if TYPE_CHECKING:
    from raydp_hpo.accounting import Accountant, calibrate_noise, delta, epsilon, epsilons
    from raydp_hpo.budget import PrivacyBudget
    from raydp_hpo.calibration import calibrate_analytic_gaussian, calibrate_laplace
    from raydp_hpo.coverage import is_covered
    from raydp_hpo.errors import (
        BudgetExhaustedError,
        ChargeConflictError,
        ConfigError,
        DataValidationError,
        InvalidParameterError,
        LedgerCorruptedError,
        LedgerMismatchError,
        RayDPHPOError,
        SearchSpaceError,
        UnsupportedMechanismError,
    )
    from raydp_hpo.gdp import compose_mu, gdp_delta, gdp_epsilon, gdp_mu
    from raydp_hpo.ledger import Adaptivity, ChargeDecision, LedgerReport, PrivacyLedger
    from raydp_hpo.ledger_actor import LedgerHandle, get_ledger
    from raydp_hpo.ledger_like import LedgerLike
    from raydp_hpo.mechanisms import (
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
    from raydp_hpo.trial_privacy import (
        DPSGDPrivacy,
        Optimizer,
        ScoreNoise,
        ScoreRelease,
        privacy_from_config,
    )
    from raydp_hpo.trial_settings import RaydpSettings
    from raydp_hpo.tune_hooks import LedgerAuditCallback, LedgerStopper, NoTensorBoardLogger
    from raydp_hpo.tuner import DPResult, DPTuner, PrivacyCertificate


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
