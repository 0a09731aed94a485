"""The privacy ledger: the filter that admits each charge before its mechanism runs
(:mod:`.filter`), its append-only hash-chained journal (:mod:`.journal`), plain records
(:mod:`.records`), plan receipts that trials verify locally (:mod:`.plan_receipt`), coverage
checks (:mod:`.coverage`) and the Ray actor (:mod:`.actor`, the only module here that imports Ray).
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo.ledger.actor import DEFAULT_NAMESPACE, LedgerHandle, get_ledger
    from raydp_hpo.ledger.experiments import DeltaSplit
    from raydp_hpo.ledger.filter import (
        Adaptivity,
        Charge,
        ChargeDecision,
        LedgerReport,
        PrivacyLedger,
        filter_epsilon,
        tightest_halting_accountant,
    )
    from raydp_hpo.ledger.ledger_like import LedgerLike
    from raydp_hpo.ledger.records import ReleaseClaim, ReleaseRecord

_EXPORTS: dict[str, str] = {
    "Adaptivity": "raydp_hpo.ledger.filter",
    "Charge": "raydp_hpo.ledger.filter",
    "DeltaSplit": "raydp_hpo.ledger.experiments",
    "ChargeDecision": "raydp_hpo.ledger.filter",
    "LedgerReport": "raydp_hpo.ledger.filter",
    "PrivacyLedger": "raydp_hpo.ledger.filter",
    "filter_epsilon": "raydp_hpo.ledger.filter",
    "tightest_halting_accountant": "raydp_hpo.ledger.filter",
    "get_ledger": "raydp_hpo.ledger.actor",
    "LedgerLike": "raydp_hpo.ledger.ledger_like",
    "ReleaseClaim": "raydp_hpo.ledger.records",
    "ReleaseRecord": "raydp_hpo.ledger.records",
    "LedgerHandle": "raydp_hpo.ledger.actor",
    "DEFAULT_NAMESPACE": "raydp_hpo.ledger.actor",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
