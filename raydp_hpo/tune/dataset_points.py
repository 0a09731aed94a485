"""DPTuner's place on a dataset ledger: its budget and the search's share of it, its slot
(the k-th point, its δ share and ε cap), the point it charges and its reservation
(:class:`_DatasetPoints`, a mixin of :class:`~raydp_hpo.tune.tuner.DPTuner`, whose state it
uses).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raydp_hpo.accounting.accountants import epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism
from raydp_hpo.errors import (
    BudgetExhaustedError,
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.ledger.filter import Adaptivity
from raydp_hpo.tune.ledger_rules import _halting_accountant, _Slot

#: DPTuner's logger (:mod:`raydp_hpo.tune.tuner`): a warning keeps the source it always had.
_log = logging.getLogger("raydp_hpo.tune.tuner")


class _DatasetPoints:
    """The dataset-point methods of :class:`~raydp_hpo.tune.tuner.DPTuner`."""

    # DPTuner's state these methods read and set (DPTuner.__init__ and fit set it)
    _test_epsilon: float | None
    _budget: PrivacyBudget
    _search_budget: PrivacyBudget
    _experiment: str
    _charge_prefix: str  # <experiment>@<run id>: every charge id of this run starts with it
    _slot: _Slot | None
    _point: Mechanism | None
    _dataset_ledger: LedgerHandle | None
    _progress: Callable[[str], None] | None

    if TYPE_CHECKING:
        def _dedicated_adaptivity(self) -> Adaptivity: ...

        def _plan_charged_up_front(self) -> bool | None: ...

    # ------------------------------------------------------------------ dataset points
    def _set_budget(self, budget: PrivacyBudget) -> None:
        """This experiment's budget (the one given, or its point's cap on a dataset ledger) and
        the search's share of it: ε − ε_t with a DP test accuracy, whose Laplace(ε_t) release
        composed on top keeps the total within ε (ε_t-DP composes additively under RDP, PLD and
        basic composition)."""
        if self._test_epsilon is not None and self._test_epsilon >= budget.epsilon:
            raise InvalidParameterError(
                f"test_accuracy_epsilon={self._test_epsilon:g} leaves nothing of the budget "
                f"ε={budget.epsilon:g} for the search; use a smaller value"
            )
        self._budget = budget
        self._search_budget = PrivacyBudget(budget.epsilon - (self._test_epsilon or 0.0),
                                            budget.delta)

    def _slot_id(self) -> str:
        return f"{self._charge_prefix}/point"

    def _point_charged(self) -> bool:
        """Whether this experiment's whole cost is one plan charge (its point on a dataset
        ledger is then that plan, composed with the DP test accuracy's Laplace): a built-in
        searcher's fixed plan with no retries. Otherwise (trials that charge themselves,
        retries, a searcher of the user's) it reserves an ``ApproxDP`` point and its own
        ledger halts within it."""
        return (self._dedicated_adaptivity() is Adaptivity.FIXED_PLAN
                and bool(self._plan_charged_up_front()))

    def _take_slot(self, dataset_ledger: LedgerHandle, resume: bool) -> _Slot:
        """This experiment's place on a dataset ledger, before anything is charged: k (it is
        the k-th charge), its δ share δ_k (:func:`raydp_hpo.ledger.experiments.
        experiment_delta`), the charges before it, and the ε cap it calibrates within. The same
        on resume (the point already charged is then found, and k and the charges before it
        are those of the first run), so the plan is calibrated as it was."""
        from raydp_hpo.ledger.experiments import experiment_delta
        from raydp_hpo.ledger.filter import PrivacyLedger

        charges = dataset_ledger.charges()
        ids = [c.charge_id for c in charges]
        slot_id = self._slot_id()
        if slot_id in ids:
            k = ids.index(slot_id) + 1
            charged: Mechanism | None = charges[k - 1].mechanism
        elif resume:
            raise LedgerMismatchError(
                f"cannot resume experiment {self._experiment!r}: the dataset ledger "
                f"{dataset_ledger.name!r} holds no point {slot_id!r} of the run its experiment "
                "directory records, so that run never charged there (another storage path or "
                "ledger?). Either resume it with the ledger it started on, or run the "
                "experiment again as a new run, which pays again (without --resume / "
                "DPTuner.restore, after removing or renaming its run directory). Nothing was "
                "charged"
            )
        else:
            k, charged = len(charges) + 1, None
        prior = tuple((c.charge_id, c.mechanism) for c in charges[:k - 1])
        total = dataset_ledger.budget
        accountant = dataset_ledger.report().halting_accountant
        delta_k = experiment_delta(total.delta, k)
        if self._point_charged():
            return _Slot(k, self._budget.epsilon, delta_k, prior, accountant, None, charged)
        # a reservation: only basic composition (B) can admit an ApproxDP point, so its cap is
        # what B has left after the charges before it (the same on resume)
        replica = PrivacyLedger(total, adaptivity=Adaptivity.EXPERIMENTS, accountant=accountant)
        for charge_id, mechanism in prior:
            replica.charge(charge_id, mechanism)
        basic = replica.report().epsilon_by_accountant.get("basic_composition", 0.0)
        cap = min(self._budget.epsilon, total.epsilon - basic)
        if cap <= 0:
            raise BudgetExhaustedError(slot_id, math.inf, replica.spent(), total.epsilon,
                                       total.delta)
        return _Slot(k, cap, delta_k, prior, accountant, ApproxDP(cap, delta_k), charged)

    def _point_mechanism(self, plan: Any, searcher: Any, dataset_ledger: LedgerHandle
                         ) -> Mechanism:
        """What this experiment charges to the dataset ledger: its plan (with the DP test
        accuracy's ``Laplace(ε_t)``) as one mechanism; for a grid whose trials charge
        themselves from a configuration fixed up front, the composition of the whole grid when
        the dataset can pay it; else its ``ApproxDP`` reservation. On resume, what it charged."""
        from raydp_hpo.accounting.mechanisms import Composition, Laplace

        slot = self._slot
        assert slot is not None
        if slot.charged is not None:
            return slot.charged

        def with_test(mechanism: Mechanism) -> Mechanism:
            if self._test_epsilon is None:
                return mechanism
            return Composition((mechanism, Laplace(self._test_epsilon)))

        if slot.reserved is None:
            if plan.mechanism is None:
                raise RayDPHPOError(  # pragma: no cover - _point_charged said it has a plan
                    "internal error: a plan-charged experiment stated no plan mechanism"
                )
            return with_test(plan.mechanism)
        composed = getattr(searcher, "composed_mechanism", None)
        if composed is not None and self._dedicated_adaptivity() is Adaptivity.FIXED_PLAN:
            whole = with_test(composed())
            figure = epsilon(whole, slot.delta, _halting_accountant(Adaptivity.FIXED_PLAN))
            if figure <= slot.cap and dataset_ledger.would_admit(whole):
                return whole
        return slot.reserved

    def _point_epsilon(self) -> float:
        """The budget of this experiment's own ledger: its reservation's ε, or its point's
        tightest fixed-plan figure at δ_k (a hair above: its own ledger composes the same
        charges one by one, which may round differently in the last digits), so its own
        ledger can never charge beyond its point."""
        assert self._slot is not None and self._point is not None
        if isinstance(self._point, ApproxDP):
            return self._point.epsilon
        figure = epsilon(self._point, self._slot.delta, _halting_accountant(
            Adaptivity.FIXED_PLAN))
        return min(self._slot.cap, figure * (1.0 + 1e-7))

    def _reserve(self, dataset_ledger: LedgerHandle) -> None:
        """Charge this experiment's point to the dataset ledger (a replay on resume). Refused
        (the dataset's budget cannot pay it, or another experiment was admitted meanwhile and
        took the k-th δ share): an error, and nothing ran."""
        assert self._slot is not None and self._point is not None
        decision = dataset_ledger.try_charge(self._slot_id(), self._point,
                                             owner=self._experiment)
        if not decision.admitted and len(dataset_ledger.charges()) != self._slot.k - 1:
            raise RayDPHPOError(
                f"another experiment was admitted on the dataset ledger {dataset_ledger.name!r}"
                " while this one was being planned (its plan was calibrated as the "
                f"{self._slot.k}-th charge); nothing was charged and nothing ran: run this "
                "experiment again"
            )
        decision.raise_if_refused()
        self._dataset_ledger = dataset_ledger
        if self._budget.epsilon < 0.5 * self._slot.cap:
            line = (f"[raydp-hpo] experiment {self._experiment!r}: the dataset ledger "
                    f"{dataset_ledger.name!r} admitted it at ε={self._budget.epsilon:.4g} "
                    f"(δ={self._budget.delta:.3g}), far below the ε={self._slot.cap:g} asked "
                    "for: that is what the dataset has left, and its noise is calibrated to it")
            _log.warning(line)
            if self._progress is not None:
                self._progress(line)
