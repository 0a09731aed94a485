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
from raydp_hpo.errors import BudgetExhaustedError, LedgerCorruptedError

__all__ = ["Adaptivity", "Charge", "ChargeDecision", "LedgerReport", "ReleaseBook",
           "ReleaseClaim", "ReleaseRecord", "release_from_record"]


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
class ReleaseRecord:
    """A run's release marker on the ledger: the run ``run`` (``<experiment>@<run id>``)
    claimed its one release, as record ``seq`` of the ledger (journal line / row), at
    ``time``, publishing to ``where`` (host and folder, for the operator). It charges
    nothing: it is not a :class:`Charge`, takes no slot of a dataset ledger and no part in
    any ε or δ figure. ``token`` is the claiming attempt's nonce: the same attempt asking
    again (a retried actor call, a commit whose answer was lost) is granted again, any other
    attempt is refused."""

    seq: int
    run: str
    time: float
    where: str
    owner: str
    token: str

    @property
    def release_id(self) -> str:
        """``<run>/release``: how ledger listings name the marker."""
        return f"{self.run}/release"

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "run": self.run, "time": self.time, "where": self.where,
                "owner": self.owner, "token": self.token}


def release_from_record(rec: dict[str, Any], where: str) -> ReleaseRecord:
    """The :class:`ReleaseRecord` of a stored ``release`` record (a journal line, a row);
    :class:`~raydp_hpo.errors.LedgerCorruptedError` naming ``where`` if it is not one."""
    try:
        return ReleaseRecord(
            seq=int(rec["seq"]), run=str(rec["run"]), time=float(rec["time"]),
            where=str(rec.get("where", "")), owner=str(rec.get("owner", "")),
            token=str(rec.get("token", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerCorruptedError(
            f"{where} passes its checksum but is not a valid release record "
            f"({type(exc).__name__}: {exc}); restore the ledger from a backup"
        ) from None


class ReleaseBook:
    """The release markers of one ledger, by run, in ledger order: at most one per run."""

    def __init__(self) -> None:
        self._by_run: dict[str, ReleaseRecord] = {}

    def add(self, release: ReleaseRecord, source: Any) -> int:
        """Record ``release``; returns its record number. A second release of one run is
        :class:`~raydp_hpo.errors.LedgerCorruptedError` (a ledger never records one), naming
        the ledger ``source`` and both records."""
        first = self._by_run.get(release.run)
        if first is not None:
            raise LedgerCorruptedError(
                f"ledger {source}: record {release.seq} repeats the release of run "
                f"{release.run!r} (record {first.seq}); a ledger never records two releases "
                "of one run: restore it from a backup")
        self._by_run[release.run] = release
        return release.seq

    def get(self, run: str) -> ReleaseRecord | None:
        return self._by_run.get(run)

    def all(self) -> tuple[ReleaseRecord, ...]:
        return tuple(self._by_run.values())


@dataclass(frozen=True)
class ReleaseClaim:
    """The answer to :meth:`PrivacyLedger.claim_release`: ``granted`` (this attempt holds the
    run's one release; ``replayed`` when it had claimed it already) or refused, ``record``
    then being the first release of the run."""

    granted: bool
    record: ReleaseRecord
    replayed: bool = False


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
    delta_split: str | None = None  # EXPERIMENTS: its DeltaSplit's value
    #: release markers (one per run that published; they charge nothing)
    releases: tuple[ReleaseRecord, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget.to_dict(),
            "adaptivity": self.adaptivity.value,
            "halting_accountant": self.halting_accountant.value,
            "spent_epsilon": self.spent_epsilon,
            "remaining_epsilon": self.remaining_epsilon,
            "epsilon_by_accountant": dict(self.epsilon_by_accountant),
            "charges": [c.to_dict() for c in self.charges],
            "delta_split": self.delta_split,
            "releases": [r.to_dict() for r in self.releases],
        }

    def _figures(self) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
        """(label, ε, δ) of the figures the halting rule decides on, and of those shown for
        information only (each at the δ it holds at)."""
        by = dict(self.epsilon_by_accountant)
        delta = self.budget.delta
        halting: list[tuple[str, float, float]] = []
        info: list[tuple[str, float, float]] = []
        pure = by.pop("pure", None)
        if self.adaptivity is Adaptivity.EXPERIMENTS:
            from raydp_hpo.ledger.experiments import DeltaSplit, filter_delta

            split = DeltaSplit(self.delta_split or DeltaSplit.HALVES.value)
            delta_a = filter_delta(delta, split)
            if "rdp_filter_split_delta" in by:
                halting.append(("(A) RDP filter, adaptive", by.pop("rdp_filter_split_delta"),
                                delta_a))
            if "basic_composition" in by:
                halting.append(("(B) basic composition of points", by.pop("basic_composition"),
                                by.pop("basic_composition_delta", 0.0)))
            if "rdp_filter" in by:
                info.append(("RDP filter at the whole δ (not this rule)",
                             by.pop("rdp_filter"), delta))
        elif self.adaptivity is Adaptivity.ADAPTIVE:
            if "rdp_filter" in by:
                halting.append(("RDP filter, adaptive", by.pop("rdp_filter"), delta))
            if pure is not None:
                halting.append(("basic composition of pure DP", pure, 0.0))
                pure = None
        else:  # FIXED_PLAN: the fixed-sequence figures are valid and decide
            names = {"rdp": ("rdp", "best", "profile"), "pld": ("pld", "best", "profile"),
                     "profile": ("profile",)}
            for key, accs in names.items():
                if key in by and self.halting_accountant.value in accs:
                    halting.append((key, by.pop(key), delta))
            if pure is not None:
                halting.append(("basic composition of pure DP", pure, 0.0))
                pure = None
        fixed = self.adaptivity is not Adaptivity.FIXED_PLAN
        for key, eps in by.items():
            label = key + (" (valid for fixed sequences only)" if fixed and key in
                           ("rdp", "pld", "profile") else "")
            info.append((label, eps, delta))
        if pure is not None:
            info.append(("basic composition of pure DP", pure, 0.0))
        return halting, info

    def format(self) -> str:
        lines = [
            f"budget            ε={self.budget.epsilon:g}, δ={self.budget.delta:g}",
            f"halting rule      {self.adaptivity.value} / {self.halting_accountant.value}"
            + (f" (δ split {self.delta_split})" if self.delta_split else ""),
            f"spent (halting)   ε={self.spent_epsilon:.4f}",
            f"remaining         ε={self.remaining_epsilon:.4f}",
        ]
        halting, info = self._figures()
        if halting:
            lines.append("figures the halting rule decides on (spent = their minimum)")
            for label, eps, d in halting:
                lines.append(f"  {label:<48}ε={eps:.4f} at δ={d:.3g}")
        if info:
            lines.append("shown for information only (do not halt this ledger)")
            for label, eps, d in info:
                lines.append(f"  {label:<48}ε={eps:.4f} at δ={d:.3g}")
        lines.append(f"charges           {len(self.charges)}")
        for c in self.charges:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time))
            lines.append(
                f"  #{c.seq:<4} {stamp}  {c.charge_id}  owner={c.owner or '-'}  "
                f"ε_after={c.epsilon_after:.4f}  {type(c.mechanism).__name__}"
            )
        if self.releases:
            lines.append(f"releases          {len(self.releases)} (markers: they charge nothing)")
            for r in self.releases:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.time))
                lines.append(f"  #{r.seq:<4} {stamp}  {r.release_id}  released to "
                             f"{r.where or '-'}")
        return "\n".join(lines)
