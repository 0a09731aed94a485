"""An experiment's place on a dataset ledger as an object of its own (issue #43): a
:class:`DatasetPlace` takes its inputs (the dataset ledger, a :class:`PointRequest`) and
returns its outputs (its slot, the :class:`Point` it charges, its own ledger's budget) with no
DPTuner anywhere — on a real ``PrivacyLedger`` (what the ledger actor serves), without Ray."""

from __future__ import annotations

import logging

import pytest
from ray import tune

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, Composition, Laplace, SubsampledGaussian
from raydp_hpo.errors import (
    BudgetExhaustedError,
    BudgetTooSmallError,
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.experiments import experiment_delta
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.searchers import OneShotRandomSearch
from raydp_hpo.tune.dataset_points import DatasetPlace, Point, PointRequest, search_share
from raydp_hpo.tune.ledger_rules import ledger_split

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}


class Named(PrivacyLedger):  # the ledger actor handle's one extra: its name
    name = "data-x"


def _ledger(total: float, *prior: tuple[str, object]) -> Named:
    ledger = Named(PrivacyBudget(total, 1e-5), adaptivity=Adaptivity.EXPERIMENTS,
                   accountant=Accountant.TIGHTEST)
    for charge_id, mechanism in prior:
        ledger.charge(charge_id, mechanism)  # type: ignore[arg-type]
    return ledger


def _request(epsilon_asked: float, *, plan_is_point: bool = True,
             test_epsilon: float | None = 0.25) -> PointRequest:
    return PointRequest(
        experiment="exp", charge_prefix="exp@0123", budget=PrivacyBudget(epsilon_asked, 1e-5),
        test_epsilon=test_epsilon,
        adaptivity=Adaptivity.FIXED_PLAN if plan_is_point else Adaptivity.ADAPTIVE,
        plan_is_point=plan_is_point)


def _searcher(place: DatasetPlace, test_epsilon: float | None) -> OneShotRandomSearch:
    """A built-in searcher calibrated within the place, as DPTuner hands it over."""
    return OneShotRandomSearch(SPACE, metric="val_accuracy", mode="max", dataset_size=300,
                               budget=search_share(place.budget, test_epsilon),
                               admissible=place.plan_rule, seed=1)


def test_search_share_leaves_the_dp_test_accuracy_its_epsilon() -> None:
    assert search_share(PrivacyBudget(2.0, 1e-5), None) == PrivacyBudget(2.0, 1e-5)
    assert search_share(PrivacyBudget(2.0, 1e-5), 0.5) == PrivacyBudget(1.5, 1e-5)
    with pytest.raises(InvalidParameterError, match=r"test_accuracy_epsilon=2 leaves nothing"):
        search_share(PrivacyBudget(2.0, 1e-5), 2.0)


def test_a_plan_point_is_calibrated_charged_and_replayed_from_its_inputs_alone() -> None:
    """The k-th place (δ share δ_k, cap = the ε asked for), its plan composed with the DP
    test accuracy's Laplace as the point, its own ledger's budget at that point's tightest
    figure, the charge ``<charge prefix>/point`` owned by the experiment; a resume finds the
    same point, and a resume of a run that never charged is refused with nothing charged."""
    earlier = SubsampledGaussian(1.0, 0.02, 300)
    ledger = _ledger(3.0, ("earlier/point", earlier))
    request = _request(2.0)
    assert request.slot_id == "exp@0123/point"
    place = DatasetPlace.take(ledger, request, resume=False)
    slot = place.slot
    assert (slot.k, slot.cap, slot.reserved, slot.charged) == (2, 2.0, None, None)
    assert slot.delta == experiment_delta(1e-5, 2, ledger_split(ledger))
    assert slot.prior == (("earlier/point", earlier),)
    assert place.budget == PrivacyBudget(2.0, slot.delta)
    rule = place.plan_rule
    assert rule is not None and rule.test_epsilon == 0.25 and rule.prior == slot.prior

    searcher = _searcher(place, 0.25)
    plan = searcher.privacy_plan()
    point = place.point(plan, searcher)
    assert point.mechanism == Composition((plan.mechanism, Laplace(0.25)))
    figure = epsilon(point.mechanism, slot.delta, Accountant.PROFILE)
    assert point.budget == PrivacyBudget(min(2.0, figure * (1 + 1e-7)), slot.delta)
    assert ledger.charges() == ledger.charges()[:1]  # choosing the point charged nothing

    place.reserve(point)
    last = ledger.charges()[-1]
    assert (last.charge_id, last.mechanism, last.owner) == ("exp@0123/point", point.mechanism,
                                                            "exp")
    again = DatasetPlace.take(ledger, request, resume=True)
    assert again.slot.k == 2 and again.slot.charged == point.mechanism
    assert again.point(plan, searcher) == point
    again.reserve(point)  # a replay
    assert len(ledger.charges()) == 2

    before = ledger.charges()
    other = PointRequest(**{**request.__dict__, "charge_prefix": "exp@4567"})
    with pytest.raises(LedgerMismatchError, match="holds no point 'exp@4567/point'"):
        DatasetPlace.take(ledger, other, resume=True)
    assert ledger.charges() == before


def test_a_reservation_is_capped_by_what_basic_composition_has_left() -> None:
    """Trials that charge themselves: an ``ApproxDP`` point at what basic composition leaves
    after the charges before it; its own ledger's ε is the reservation's; nothing left: the
    ledger's refusal, before anything is charged."""
    ledger = _ledger(3.0, ("earlier/point", ApproxDP(2.5, 1e-9)))
    place = DatasetPlace.take(ledger, _request(2.0, plan_is_point=False), resume=False)
    slot = place.slot
    assert slot.cap == pytest.approx(0.5) and slot.reserved == ApproxDP(slot.cap, slot.delta)
    assert place.plan_rule is None  # a reservation: its plan is not its point
    searcher = _searcher(place, 0.25)
    point = place.point(searcher.privacy_plan(), searcher)
    assert point == Point(slot.reserved, PrivacyBudget(slot.cap, slot.delta))
    place.reserve(point)
    assert ledger.charges()[-1].mechanism == slot.reserved

    spent = _ledger(3.0, ("earlier/point", ApproxDP(3.0, 1e-9)))
    with pytest.raises(BudgetExhaustedError):
        DatasetPlace.take(spent, _request(2.0, plan_is_point=False), resume=False)
    assert len(spent.charges()) == 1


def test_a_point_far_below_the_epsilon_asked_is_said(caplog) -> None:
    """The dataset admits far less than asked (its plan's point is small next to the cap):
    a warning, to the log and to ``progress``."""
    ledger = _ledger(50.0)
    place = DatasetPlace.take(ledger, _request(40.0, test_epsilon=None), resume=False)
    small = Point(SubsampledGaussian(5.0, 0.01, 10), PrivacyBudget(1.0, place.slot.delta))
    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="raydp_hpo.tune.tuner"):
        place.reserve(small, lines.append)
    assert len(lines) == 1 and "admitted it at ε=1 " in lines[0]
    assert "far below the ε=40 asked for" in lines[0] and lines[0] in caplog.text


def test_a_race_for_the_same_place_and_a_plan_too_small_say_where_it_stands() -> None:
    ledger = _ledger(3.0)
    place = DatasetPlace.take(ledger, _request(2.0), resume=False)
    racing = DatasetPlace.take(ledger, PointRequest(**{**_request(2.0).__dict__,
                                                       "charge_prefix": "exp@race"}),
                               resume=False)
    searcher = _searcher(place, 0.25)
    place.reserve(place.point(searcher.privacy_plan(), searcher))
    before = ledger.charges()
    with pytest.raises(RayDPHPOError, match="calibrated as the 1-th charge.*run this experiment"):
        racing.reserve(racing.point(searcher.privacy_plan(), searcher))
    assert ledger.charges() == before
    err = place.too_small(BudgetTooSmallError("no σ fits"))
    assert isinstance(err, BudgetTooSmallError)
    assert str(err).startswith("no σ fits. On the dataset ledger 'data-x' (spent ε=")
    assert f"would be charge 1, at δ={place.slot.delta:.3g}" in str(err)
