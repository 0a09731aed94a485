"""raydp-hpo: differentially private hyperparameter optimisation on Ray Tune.

The public API is re-exported lazily (PEP 562) so that importing the privacy core from
:mod:`raydp_hpo.searchers` or :mod:`raydp_hpo.trainables` never pulls in the orchestration layer
(Ray Tune, torch). Where things live: :mod:`raydp_hpo.accounting` (mechanisms and bounds, no Ray
or torch), :mod:`raydp_hpo.ledger` (the privacy filter, journal and Ray actor),
:mod:`raydp_hpo.trial` (the searcher–trial contract), :mod:`raydp_hpo.searchers`,
:mod:`raydp_hpo.trainables`, :mod:`raydp_hpo.tune` (DPTuner) and :mod:`raydp_hpo.cli`.
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
    "PrivacyLedger": "raydp_hpo.ledger.filter",
    "ChargeDecision": "raydp_hpo.ledger.filter",
    "LedgerReport": "raydp_hpo.ledger.filter",
    "get_ledger": "raydp_hpo.ledger.actor",
    "LedgerHandle": "raydp_hpo.ledger.actor",
    "LedgerStopper": "raydp_hpo.tune.hooks",
    "LedgerAuditCallback": "raydp_hpo.tune.hooks",
    "NoTensorBoardLogger": "raydp_hpo.tune.hooks",
    # orchestration
    "DPTuner": "raydp_hpo.tune.tuner",
    "DPResult": "raydp_hpo.tune.tuner",
    "PrivacyCertificate": "raydp_hpo.tune.tuner",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
