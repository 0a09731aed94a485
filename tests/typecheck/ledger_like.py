"""Static check: both ledgers satisfy :class:`~raydp_hpo.ledger.ledger_like.LedgerLike`.

mypy checks this file (``make lint`` and ``tests/test_typecheck.py``): if either class drops a
member or changes a signature the protocol names, the assignments below stop type-checking.
Never imported at run time.
"""

from __future__ import annotations

from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.ledger_like import LedgerLike


def in_process(ledger: PrivacyLedger) -> LedgerLike:
    return ledger


def actor_handle(handle: LedgerHandle) -> LedgerLike:
    return handle


def either(ledger: PrivacyLedger | LedgerHandle) -> LedgerLike:
    return ledger
