"""The privacy contract between a searcher and its trials: ``config["raydp"]``
(:mod:`.settings`) and the mechanism a trial's configuration costs (:mod:`.privacy`).
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo.trial.privacy import (
        DPSGDPrivacy,
        Optimizer,
        ScoreNoise,
        ScoreRelease,
        privacy_from_config,
        trial_mechanism,
    )
    from raydp_hpo.trial.settings import RAYDP_KEY, RaydpSettings

_EXPORTS: dict[str, str] = {
    "Optimizer": "raydp_hpo.trial.privacy",
    "DPSGDPrivacy": "raydp_hpo.trial.privacy",
    "privacy_from_config": "raydp_hpo.trial.privacy",
    "trial_mechanism": "raydp_hpo.trial.privacy",
    "ScoreNoise": "raydp_hpo.trial.privacy",
    "ScoreRelease": "raydp_hpo.trial.privacy",
    "RaydpSettings": "raydp_hpo.trial.settings",
    "RAYDP_KEY": "raydp_hpo.trial.settings",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
