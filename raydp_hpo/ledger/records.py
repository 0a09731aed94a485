"""Plain records of the privacy ledger: halting mode, charges, decisions and reports.

Kept apart from :mod:`raydp_hpo.ledger` so that clients of the ledger actor (every trial
worker) can receive these values without importing the accounting code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism, mechanism_to_dict
from raydp_hpo.errors import BudgetExhaustedError

__all__ = ["Adaptivity", "Charge", "ChargeDecision", "LedgerReport"]


class Adaptivity(Enum):
    """Whether charges may be chosen adaptively (decides which halting rule is valid)."""

    #: Fine-grained charges chosen from earlier outputs (trials that charge themselves,
    #: retries): the adaptive RDP filter (Feldman & Zrnic 2021).
    ADAPTIVE = "adaptive"
    #: One sequence fixed before any data is touched: any accountant's composition halts.
    FIXED_PLAN = "fixed_plan"
    #: A dataset's ledger: whole experiments, each chosen adaptively from earlier releases,
    #: each charged as one (εᵢ, δᵢ) point (its tightest fixed-plan figure at its δ share),
    #: halting by basic composition (the filter of Rogers, Roth, Ullman & Vadhan 2016);
    #: see :mod:`raydp_hpo.ledger.experiments`.
    EXPERIMENTS = "experiments"


@dataclass(frozen=True)
class Charge:
    """One admitted charge as recorded in the ledger (and its journal)."""

    seq: int
    charge_id: str
    owner: str
    time: float
    mechanism: Mechanism
    epsilon_after: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "charge_id": self.charge_id,
            "owner": self.owner,
            "time": self.time,
            "mechanism": mechanism_to_dict(self.mechanism),
            "epsilon_after": self.epsilon_after,
        }


@dataclass(frozen=True)
class ChargeDecision:
    """The answer to :meth:`PrivacyLedger.try_charge`.

    ``epsilon_after`` is the spend the ledger would have (refused) or has (admitted) with the
    charge included; ``spent_epsilon`` is the spend after the call. ``replayed`` marks a repeat
    of an already admitted charge id (idempotent: nothing was charged again).
    """

    admitted: bool
    charge_id: str
    epsilon_after: float
    spent_epsilon: float
    budget: PrivacyBudget
    replayed: bool = False

    def raise_if_refused(self) -> ChargeDecision:
        if not self.admitted:
            raise BudgetExhaustedError(
                self.charge_id,
                self.epsilon_after,
                self.spent_epsilon,
                self.budget.epsilon,
                self.budget.delta,
            )
        return self


@dataclass(frozen=True)
class LedgerReport:
    """State of a ledger: budget, spend under the halting rule and under each accountant."""

    budget: PrivacyBudget
    adaptivity: Adaptivity
    halting_accountant: Accountant
    spent_epsilon: float
    remaining_epsilon: float
    epsilon_by_accountant: dict[str, float]
    charges: tuple[Charge, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget.to_dict(),
            "adaptivity": self.adaptivity.value,
            "halting_accountant": self.halting_accountant.value,
            "spent_epsilon": self.spent_epsilon,
            "remaining_epsilon": self.remaining_epsilon,
            "epsilon_by_accountant": dict(self.epsilon_by_accountant),
            "charges": [c.to_dict() for c in self.charges],
        }

    def format(self) -> str:
        lines = [
            f"budget            ε={self.budget.epsilon:g}, δ={self.budget.delta:g}",
            f"halting rule      {self.adaptivity.value} / {self.halting_accountant.value}",
            f"spent (halting)   ε={self.spent_epsilon:.4f}",
            f"remaining         ε={self.remaining_epsilon:.4f}",
        ]
        for name, eps in self.epsilon_by_accountant.items():
            lines.append(f"  {name:<16}ε={eps:.4f} at δ={self.budget.delta:g}")
        lines.append(f"charges           {len(self.charges)}")
        for c in self.charges:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time))
            lines.append(
                f"  #{c.seq:<4} {stamp}  {c.charge_id}  owner={c.owner or '-'}  "
                f"ε_after={c.epsilon_after:.4f}  {type(c.mechanism).__name__}"
            )
        return "\n".join(lines)
