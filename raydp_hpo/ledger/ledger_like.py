"""What a searcher, trainable or Tune hook needs from a privacy ledger: :class:`LedgerLike`.

Two classes implement it: the in-process :class:`~raydp_hpo.ledger.PrivacyLedger` and
:class:`~raydp_hpo.ledger.actor.LedgerHandle`, the synchronous client of the ledger actor
(each method one round trip). Code that only charges, checks and reads spend takes a
``LedgerLike`` and runs unchanged against either; code that needs more (closing a journal,
killing an actor, plan receipts) names the concrete class.

The contract is the ledger's (see :class:`~raydp_hpo.ledger.PrivacyLedger`): a charge is
admitted before its mechanism runs, only if the composed guarantee including it stays within
budget; a refused charge leaves the ledger exactly as it was; a charge id already on the
ledger is replayed, never paid twice.

The protocol is static only (not ``runtime_checkable``): on Python < 3.12 an ``isinstance``
check reads every member, and reading :attr:`LedgerLike.budget` of a ``LedgerHandle`` is a Ray
round trip. ``tests/typecheck/ledger_like.py`` has mypy check that both classes satisfy it,
and ``tests/raydp_hpo/ledger/test_ledger_like.py`` that their signatures match it at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import Mechanism
    from raydp_hpo.ledger.records import Charge, ChargeDecision, LedgerReport

__all__ = ["LedgerLike"]


class LedgerLike(Protocol):
    """A privacy ledger: a filter over one budget that admits or refuses charges."""

    @property
    def budget(self) -> PrivacyBudget:
        """The total (ε, δ) budget, fixed at creation."""
        ...

    def try_charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        """Admit ``mechanism`` under ``charge_id`` if it fits, else refuse and change nothing.

        A ``charge_id`` already on the ledger with the same mechanism is replayed (admitted
        without paying again); with another mechanism it raises
        :class:`~raydp_hpo.errors.ChargeConflictError`."""
        ...

    def charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        """:meth:`try_charge`, raising :class:`~raydp_hpo.errors.BudgetExhaustedError` when
        refused."""
        ...

    def try_charge_new_attempt(
        self, charge_id: str, mechanism: Mechanism, owner: str = ""
    ) -> ChargeDecision:
        """:meth:`try_charge` under ``f"{charge_id}/attempt-{k}"``, k the smallest unused
        (one atomic step): every fresh start of a retried run pays."""
        ...

    def epsilon_if_charged(self, mechanism: Mechanism) -> float:
        """ε of the halting rule if ``mechanism`` were charged now (nothing is charged)."""
        ...

    def would_admit(self, mechanism: Mechanism) -> bool:
        """Whether :meth:`try_charge` would admit ``mechanism`` now (nothing is charged)."""
        ...

    def has_charge(self, charge_id: str) -> bool:
        """Whether ``charge_id`` is admitted (and so durable, for a journaled ledger)."""
        ...

    def spent(self) -> float:
        """ε spent so far under the ledger's halting rule, at the budget's δ."""
        ...

    def remaining(self) -> float:
        """Budget ε minus :meth:`spent` (never negative)."""
        ...

    def charges(self) -> tuple[Charge, ...]:
        """Every admitted charge, in admission order."""
        ...

    def report(self) -> LedgerReport:
        """Budget, spend and every charge, with ε under several accountants."""
        ...
