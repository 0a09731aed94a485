"""The privacy ledger: the filter that admits each charge before its mechanism runs
(:mod:`.filter`), its append-only hash-chained journal (:mod:`.journal`), plain records
(:mod:`.records`), plan receipts that trials verify locally (:mod:`.plan_receipt`), coverage
checks (:mod:`.coverage`) and the Ray actor (:mod:`.actor`, the only module here that imports Ray).
"""

from __future__ import annotations

from raydp_hpo._lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "Adaptivity": "raydp_hpo.ledger.filter",
    "Charge": "raydp_hpo.ledger.filter",
    "ChargeDecision": "raydp_hpo.ledger.filter",
    "LedgerReport": "raydp_hpo.ledger.filter",
    "PrivacyLedger": "raydp_hpo.ledger.filter",
    "filter_epsilon": "raydp_hpo.ledger.filter",
    "tightest_halting_accountant": "raydp_hpo.ledger.filter",
    "get_ledger": "raydp_hpo.ledger.actor",
    "LedgerHandle": "raydp_hpo.ledger.actor",
    "DEFAULT_NAMESPACE": "raydp_hpo.ledger.actor",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
