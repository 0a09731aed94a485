"""The privacy certificate of a DPTuner release: every charge, the ε of each accountant, the
ledger's halting rule and spend, and which figure is certified (:class:`PrivacyCertificate`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism, mechanism_to_dict
from raydp_hpo.ledger.filter import Adaptivity

#: The privacy unit and neighbouring relation every bound of this project is stated for.
ADJACENCY = (
    "one record; neighbouring datasets differ by adding or removing one record (every bound "
    "holds in both directions)"
)


@dataclass(frozen=True)
class PrivacyCertificate:
    """What the released output costs: every charge of the experiment and the total ε.

    ``epsilon`` is the **certified** figure, the one the ledger's halting rule
    (``ledger_halting_rule``, ``"<adaptivity>/<accountant>"``) stands behind
    (:attr:`certified_accountant`): on a ledger that halts with ``fixed_plan`` every figure is a
    valid bound for the fixed charges, so it is the tightest (``Accountant.TIGHTEST``: the
    minimum of ``epsilon_rdp``, ``epsilon_pld`` and ``epsilon_profile``); on one that halts on
    the adaptive RDP filter it is ``epsilon_rdp`` — the PLD and profile figures are valid only
    for a plan fixed in advance and are then references, not claims. :meth:`format` and
    :meth:`to_dict` name the certified figure and mark the others.

    ``adjacency`` states the privacy unit and neighbouring relation (add/remove one record);
    ``public`` lists every quantity the guarantee treats as public (declared sizes, the
    configuration) — anything computed from the records that is not listed there reaches the
    release only through the charged mechanisms.
    """

    algorithm: str
    paper: str
    description: str
    budget: PrivacyBudget
    charges: tuple[tuple[str, Mechanism], ...]
    epsilon_rdp: float
    epsilon_pld: float
    ledger_name: str
    ledger_spent_epsilon: float
    ledger_halting_rule: str
    public: tuple[tuple[str, str], ...] = ()
    adjacency: str = ADJACENCY
    epsilon_profile: float = math.inf
    #: the dataset ledger this experiment's point (ε, δ) = ``budget`` is charged to, its total
    #: budget and its spend after the charge (basic composition of the experiments' points,
    #: :mod:`raydp_hpo.ledger.experiments`); ``None`` when it ran on no dataset ledger
    dataset_ledger: tuple[str, PrivacyBudget, float] | None = None
    #: what ``search="auto"`` chose and why (:meth:`raydp_hpo.searchers.auto.AutoChoice.
    #: to_dict`: setting, searcher, settings, the table row — ε band, compute band, space
    #: class —, S, G, the "outside the measured range" flag, the reason); ``None`` when the
    #: search was named. Public: a function of the configuration and the shipped table.
    auto_search: Mapping[str, Any] | None = None

    @property
    def fixed_plan(self) -> bool:
        """Whether the ledger halts with ``Adaptivity.FIXED_PLAN`` (standard composition of a
        plan fixed in advance), read from ``ledger_halting_rule``."""
        return self.ledger_halting_rule.split("/", 1)[0] == Adaptivity.FIXED_PLAN.value

    @property
    def certified_accountant(self) -> Accountant:
        """The accountant of the certified figure :attr:`epsilon`: ``TIGHTEST`` under a
        fixed-plan halting rule, ``RDP`` under the adaptive RDP filter."""
        return Accountant.TIGHTEST if self.fixed_plan else Accountant.RDP

    @property
    def epsilon(self) -> float:
        """The certified ε (:attr:`certified_accountant`): with a fixed plan the tightest valid
        bound — RDP, PLD and privacy-profile figures are each an upper bound for the fixed set
        of charges (the profile one accounts random stopping by Koskela, Redberg & Wang 2024;
        :mod:`raydp_hpo.accounting.profiles`); under the adaptive RDP filter the RDP figure."""
        if self.fixed_plan:
            return min(self.epsilon_rdp, self.epsilon_pld, self.epsilon_profile)
        return self.epsilon_rdp

    @property
    def within_budget(self) -> bool:
        return self.epsilon <= self.budget.epsilon

    def _figures(self) -> list[tuple[str, str, float]]:
        """``(key, label, value)`` of each figure, the certified one first."""
        figures = [("rdp", "RDP", self.epsilon_rdp), ("pld", "PLD", self.epsilon_pld),
                   ("profile", "profile", self.epsilon_profile)]
        if self.fixed_plan:
            return [("tightest", "tightest", self.epsilon), *figures]
        return figures

    def _role(self, key: str, value: float) -> str:
        """How a figure is to be read: ``certified``, or a reference (looser, or not valid
        for adaptive charges)."""
        if key == self.certified_accountant.value:
            return "certified"
        if self.fixed_plan:
            return ("reference; the certified minimum" if value == self.epsilon
                    else "looser reference")
        return "reference only: valid for a fixed plan, not for adaptive charges"

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "paper": self.paper,
            "description": self.description,
            "budget": self.budget.to_dict(),
            "charges": [
                {"charge_id": cid, "mechanism": mechanism_to_dict(m)} for cid, m in self.charges
            ],
            # "best" is the certified figure, under its former name (readers of older files)
            "epsilon": {"rdp": self.epsilon_rdp, "pld": self.epsilon_pld,
                        "profile": self.epsilon_profile, "certified": self.epsilon,
                        "certified_accountant": self.certified_accountant.value,
                        "best": self.epsilon},
            "ledger": {
                "name": self.ledger_name,
                "spent_epsilon": self.ledger_spent_epsilon,
                "halting_rule": self.ledger_halting_rule,
            },
            "privacy_unit": self.adjacency,
            "treated_as_public": dict(self.public),
            **({} if self.dataset_ledger is None else {"dataset_ledger": {
                "name": self.dataset_ledger[0], "budget": self.dataset_ledger[1].to_dict(),
                "spent_epsilon": self.dataset_ledger[2],
                "halting_rule": "experiments: the RDP filter at its δ share or basic "
                                "composition of the experiments' (ε, δ) points"}}),
            **({} if self.auto_search is None else {"auto_search": dict(self.auto_search)}),
        }

    def _auto_lines(self) -> list[str]:
        """``search="auto"``'s choice, when it chose."""
        a = self.auto_search
        if a is None:
            return []
        row = a.get("table_row", {})
        flag = " — ε OUTSIDE the measured range" if a.get("outside_measured_range") else ""
        provisional = " (provisional table)" if a.get("table_provisional") else ""
        score = a.get("S")
        return [f"  auto search   chose {a.get('setting')} = {a.get('searcher')} "
                f"{a.get('settings') or '(defaults)'} from the row (ε band "
                f"{row.get('epsilon_band'):g}, compute band {row.get('compute_band')}, "
                f"{row.get('space_class')}), S = "
                + (f"{score:.3f}" if isinstance(score, (int, float)) else str(score))
                + f"{flag}{provisional}"]

    def format(self) -> str:
        lines = [
            "Privacy certificate",
            f"  algorithm     {self.algorithm}",
            *self._auto_lines(),
            f"  paper         {self.paper}",
            f"  accounting    {self.description}",
            f"  budget        ε={self.budget.epsilon:g}, δ={self.budget.delta:g}",
            f"  admitted on   ledger halting rule {self.ledger_halting_rule}; certified figure: "
            f"{self.certified_accountant.value}",
        ]
        for key, label, value in self._figures():
            role = self._role(key, value)
            if role == "certified":
                lines.append(f"  ε ({label}){' ' * max(1, 10 - len(label))}{value:.4f}  "
                             f"certified, ≤ budget: {self.within_budget}")
            else:
                lines.append(f"  ε ({label}){' ' * max(1, 10 - len(label))}{value:.4f}  ({role})")
        lines += [
            f"  ledger        {self.ledger_name} ({self.ledger_halting_rule}), "
            f"spent ε={self.ledger_spent_epsilon:.4f}",
            f"  privacy unit  {self.adjacency}",
        ]
        if self.dataset_ledger is not None:
            name, total, spent = self.dataset_ledger
            lines.append(
                f"  dataset       {name}: this experiment is its point (ε={self.budget.epsilon:.4f}, "
                f"δ={self.budget.delta:.3g}); the dataset has spent ε={spent:.4f} of "
                f"ε={total.epsilon:g}, δ={total.delta:g} (the RDP filter at its δ share or "
                "basic composition of the experiments' points)")
        lines.append(f"  charges       {len(self.charges)}")
        for cid, mech in self.charges[:10]:
            lines.append(f"    {cid}: {type(mech).__name__}")
        if len(self.charges) > 10:
            lines.append(f"    ... {len(self.charges) - 10} more")
        if self.public:
            lines.append("  treated as public")
            lines.extend(f"    {key}: {value}" for key, value in self.public)
        return "\n".join(lines)
