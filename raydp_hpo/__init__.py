"""raydp-hpo: differentially private hyperparameter optimisation on Ray Tune.

The public API is re-exported lazily (PEP 562) so that importing the privacy core from
``search_algs`` or ``trainables`` never pulls in the orchestration layer (Ray Tune, torch).
"""

from __future__ import annotations

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
