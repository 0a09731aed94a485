"""Orchestration on Ray Tune: :class:`DPTuner` (one DP search against one budget, and its
release with a certificate, :mod:`.tuner`), the Tune stopper/callbacks around the ledger
(:mod:`.hooks`), Tune's configs as DPTuner takes them (:mod:`.config`); ``ensure_ray``
(connecting to Ray) is re-exported from :mod:`raydp_hpo._ray_runtime`.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo._ray_runtime import ensure_ray
    from raydp_hpo.tune.hooks import LedgerAuditCallback, LedgerStopper, NoTensorBoardLogger
    from raydp_hpo.tune.tuner import DPResult, DPTuner, PrivacyCertificate

_EXPORTS: dict[str, str] = {
    "DPTuner": "raydp_hpo.tune.tuner",
    "DPResult": "raydp_hpo.tune.tuner",
    "PrivacyCertificate": "raydp_hpo.tune.tuner",
    "LedgerStopper": "raydp_hpo.tune.hooks",
    "LedgerAuditCallback": "raydp_hpo.tune.hooks",
    "NoTensorBoardLogger": "raydp_hpo.tune.hooks",
    "ensure_ray": "raydp_hpo._ray_runtime",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
