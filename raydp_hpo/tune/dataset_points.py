"""An experiment's place on a dataset ledger (:class:`DatasetPlace`): its slot there (the k-th
point, its δ share and ε cap), the point it charges (:class:`Point`) and its reservation; and
the search's share of an experiment's budget (:func:`search_share`).

:class:`~raydp_hpo.tune.tuner.DPTuner` composes it: it states what its experiment asks for
(:class:`PointRequest`), takes a place (:meth:`DatasetPlace.take`), calibrates within the
place's :attr:`~DatasetPlace.budget`, asks it for the :class:`Point` of its plan and reserves
that point before anything runs. Nothing here reads or sets the tuner's state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydp_hpo.accounting.accountants import epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism
from raydp_hpo.errors import (
    BudgetExhaustedError,
    BudgetTooSmallError,
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.ledger.filter import Adaptivity
from raydp_hpo.tune.ledger_rules import (
    _DatasetPointRule,
    _halting_accountant,
    _Slot,
    ledger_split,
)

#: DPTuner's logger (:mod:`raydp_hpo.tune.tuner`): a warning keeps the source it always had.
_log = logging.getLogger("raydp_hpo.tune.tuner")


def search_share(budget: PrivacyBudget, test_epsilon: float | None) -> PrivacyBudget:
    """The search's share of an experiment's ``budget``: ε − ε_t with a DP test accuracy,
    whose Laplace(ε_t) release composed on top keeps the total within ε (ε_t-DP composes
    additively under RDP, PLD and basic composition); refused when ε_t leaves nothing."""
    if test_epsilon is not None and test_epsilon >= budget.epsilon:
        raise InvalidParameterError(
            f"test_accuracy_epsilon={test_epsilon:g} leaves nothing of the budget "
            f"ε={budget.epsilon:g} for the search; use a smaller value"
        )
    return PrivacyBudget(budget.epsilon - (test_epsilon or 0.0), budget.delta)


@dataclass(frozen=True)
class PointRequest:
    """What an experiment asks of a dataset ledger.

    ``charge_prefix`` is its run's ``<experiment>@<run id>`` (its point is charged as
    ``<charge_prefix>/point``, owned by ``experiment``); ``budget`` the (ε, δ) asked for (its
    ε caps the point); ``test_epsilon`` the ε_t of a DP test accuracy composed into a plan
    point; ``adaptivity`` the halting rule of its own ledger; ``plan_is_point`` whether its
    whole cost is one plan charge (a built-in searcher's fixed plan with no retries: its
    point is then that plan; otherwise it reserves an ``ApproxDP`` point and its own ledger
    halts within it)."""

    experiment: str
    charge_prefix: str
    budget: PrivacyBudget
    test_epsilon: float | None
    adaptivity: Adaptivity
    plan_is_point: bool

    @property
    def slot_id(self) -> str:
        """The id of its point's charge on the dataset ledger."""
        return f"{self.charge_prefix}/point"


@dataclass(frozen=True)
class Point:
    """What an experiment charges to a dataset ledger, and the budget of its own ledger
    (its ε: the point's; its δ: the slot's δ share), which can never charge beyond it."""

    mechanism: Mechanism
    budget: PrivacyBudget


@dataclass(frozen=True)
class DatasetPlace:
    """An experiment's place on the dataset ledger ``ledger``: what it asked for
    (``request``) and its ``slot`` there (:meth:`take` computes it from the ledger's charges).
    """

    ledger: LedgerHandle
    request: PointRequest
    slot: _Slot

    @classmethod
    def take(cls, ledger: LedgerHandle, request: PointRequest, *, resume: bool
             ) -> DatasetPlace:
        """The place of ``request`` on ``ledger``, before anything is charged: k (it is the
        k-th charge), its δ share δ_k (:func:`raydp_hpo.ledger.experiments.experiment_delta`),
        the charges before it, and the ε cap it calibrates within. The same on resume (the
        point already charged is then found, and k and the charges before it are those of the
        first run), so the plan is calibrated as it was."""
        from raydp_hpo.ledger.experiments import experiment_delta
        from raydp_hpo.ledger.filter import PrivacyLedger

        charges = ledger.charges()
        ids = [c.charge_id for c in charges]
        slot_id = request.slot_id
        if slot_id in ids:
            k = ids.index(slot_id) + 1
            charged: Mechanism | None = charges[k - 1].mechanism
        elif resume:
            raise LedgerMismatchError(
                f"cannot resume experiment {request.experiment!r}: the dataset ledger "
                f"{ledger.name!r} holds no point {slot_id!r} of the run its experiment "
                "directory records, so that run never charged there (another storage path or "
                "ledger?). Either resume it with the ledger it started on, or run the "
                "experiment again as a new run, which pays again (without --resume / "
                "DPTuner.restore, after removing or renaming its run directory). Nothing was "
                "charged"
            )
        else:
            k, charged = len(charges) + 1, None
        prior = tuple((c.charge_id, c.mechanism) for c in charges[:k - 1])
        total = ledger.budget
        accountant = ledger.report().halting_accountant
        split = ledger_split(ledger)
        delta_k = experiment_delta(total.delta, k, split)
        if request.plan_is_point:
            return cls(ledger, request, _Slot(k, request.budget.epsilon, delta_k, prior,
                                              accountant, None, charged, split))
        # a reservation: only basic composition (B) can admit an ApproxDP point, so its cap is
        # what B has left after the charges before it (the same on resume)
        replica = PrivacyLedger(total, adaptivity=Adaptivity.EXPERIMENTS, accountant=accountant,
                                delta_split=split)
        for charge_id, mechanism in prior:
            replica.charge(charge_id, mechanism)
        basic = replica.report().epsilon_by_accountant.get("basic_composition", 0.0)
        cap = min(request.budget.epsilon, total.epsilon - basic)
        if cap <= 0:
            raise BudgetExhaustedError(slot_id, math.inf, replica.spent(), total.epsilon,
                                       total.delta)
        return cls(ledger, request, _Slot(k, cap, delta_k, prior, accountant,
                                          ApproxDP(cap, delta_k), charged, split))

    @property
    def budget(self) -> PrivacyBudget:
        """The experiment's budget at this place: (its ε cap, its δ share δ_k)."""
        return PrivacyBudget(self.slot.cap, self.slot.delta)

    @property
    def plan_rule(self) -> _DatasetPointRule | None:
        """Where its plan is its point: the rule its plan must also pass (admitted here as the
        next charge), so it is calibrated to fit; ``None`` for a reservation."""
        if self.slot.reserved is not None:
            return None
        return _DatasetPointRule(self.ledger.budget, self.slot.accountant, self.slot.prior,
                                 self.request.test_epsilon, self.slot.split)

    def too_small(self, exc: BudgetTooSmallError) -> BudgetTooSmallError:
        """``exc`` (no plan fits its budget) with where the experiment stands here."""
        report = self.ledger.report()
        return BudgetTooSmallError(
            f"{exc}. On the dataset ledger {self.ledger.name!r} (spent "
            f"ε={report.spent_epsilon:.4g} of ε={report.budget.epsilon:g}, "
            f"δ={report.budget.delta:g}) this experiment would be charge {self.slot.k}, "
            f"at δ={self.slot.delta:.3g}: its plan must also fit what the dataset has left"
        )

    def point(self, plan: Any, searcher: Any) -> Point:
        """What the experiment charges here: its plan (with the DP test accuracy's
        ``Laplace(ε_t)``) as one mechanism; for a grid whose trials charge themselves from a
        configuration fixed up front, the composition of the whole grid when the dataset can
        pay it; else its ``ApproxDP`` reservation. On resume, what it charged. With the budget
        of its own ledger (:meth:`own_epsilon`)."""
        mechanism = self._mechanism(plan, searcher)
        return Point(mechanism, PrivacyBudget(self.own_epsilon(mechanism), self.slot.delta))

    def _mechanism(self, plan: Any, searcher: Any) -> Mechanism:
        from raydp_hpo.accounting.mechanisms import Composition, Laplace

        slot, test_epsilon = self.slot, self.request.test_epsilon
        if slot.charged is not None:
            return slot.charged

        def with_test(mechanism: Mechanism) -> Mechanism:
            if test_epsilon is None:
                return mechanism
            return Composition((mechanism, Laplace(test_epsilon)))

        if slot.reserved is None:
            if plan.mechanism is None:
                raise RayDPHPOError(  # pragma: no cover - plan_is_point said it has a plan
                    "internal error: a plan-charged experiment stated no plan mechanism"
                )
            return with_test(plan.mechanism)
        composed = getattr(searcher, "composed_mechanism", None)
        if composed is not None and self.request.adaptivity is Adaptivity.FIXED_PLAN:
            whole = with_test(composed())
            figure = epsilon(whole, slot.delta, _halting_accountant(Adaptivity.FIXED_PLAN))
            if figure <= slot.cap and self.ledger.would_admit(whole):
                return whole
        return slot.reserved

    def own_epsilon(self, mechanism: Mechanism) -> float:
        """The ε of the experiment's own ledger for the point ``mechanism``: a reservation's
        ε, or the point's tightest fixed-plan figure at δ_k (a hair above: its own ledger
        composes the same charges one by one, which may round differently in the last
        digits), so its own ledger can never charge beyond its point."""
        if isinstance(mechanism, ApproxDP):
            return mechanism.epsilon
        figure = epsilon(mechanism, self.slot.delta, _halting_accountant(
            Adaptivity.FIXED_PLAN))
        return min(self.slot.cap, figure * (1.0 + 1e-7))

    def reserve(self, point: Point, progress: Callable[[str], None] | None = None) -> None:
        """Charge ``point`` to the dataset ledger (a replay on resume). Refused (the dataset's
        budget cannot pay it, or another experiment was admitted meanwhile and took the k-th δ
        share): an error, and nothing ran. Admitted far below the ε asked for: a warning,
        also to ``progress``."""
        ledger, slot, experiment = self.ledger, self.slot, self.request.experiment
        decision = ledger.try_charge(self.request.slot_id, point.mechanism, owner=experiment)
        if not decision.admitted and len(ledger.charges()) != slot.k - 1:
            raise RayDPHPOError(
                f"another experiment was admitted on the dataset ledger {ledger.name!r}"
                " while this one was being planned (its plan was calibrated as the "
                f"{slot.k}-th charge); nothing was charged and nothing ran: run this "
                "experiment again"
            )
        decision.raise_if_refused()
        if point.budget.epsilon < 0.5 * slot.cap:
            line = (f"[raydp-hpo] experiment {experiment!r}: the dataset ledger "
                    f"{ledger.name!r} admitted it at ε={point.budget.epsilon:.4g} "
                    f"(δ={point.budget.delta:.3g}), far below the ε={slot.cap:g} asked "
                    "for: that is what the dataset has left, and its noise is calibrated to it")
            _log.warning(line)
            if progress is not None:
                progress(line)
