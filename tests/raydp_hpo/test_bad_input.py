"""Bad input against a live, journaled ledger: one row per case — the input, the error class,
the words its message must contain — and the journal's bytes (and the ledger's spend) are
unchanged afterwards. "Bad input gets a clear error and loses nothing" (issue #11)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raydp_hpo.accounting import Accountant
from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.errors import (
    BudgetExhaustedError,
    ChargeConflictError,
    InvalidParameterError,
    LedgerClosedError,
    RayDPHPOError,
)
from raydp_hpo.ledger import Adaptivity, PrivacyLedger
from raydp_hpo.mechanisms import Gaussian, Laplace, SubsampledGaussian

BUDGET = PrivacyBudget(3.0, 1e-5)
TRIAL = SubsampledGaussian(1.0, 0.01, 100)


def _charge(cid: str, mech: Any) -> Callable[[PrivacyLedger], Any]:
    return lambda ledger: ledger.charge(cid, mech, owner="bad-input")


def _closed(ledger: PrivacyLedger) -> Any:
    ledger.close()
    return ledger.charge("after-close", TRIAL)


CASES: list[tuple[str, Callable[[PrivacyLedger], Any], type[BaseException], tuple[str, ...]]] = [
    ("budget exhausted", _charge("big", Gaussian(0.3, 10)), BudgetExhaustedError,
     ("budget exhausted", "Nothing was charged")),
    ("exhausted by a count", _charge("many", Laplace(0.5, count=10)), BudgetExhaustedError,
     ("remaining",)),
    ("same id, other mechanism", _charge("seed", Gaussian(5.0)), ChargeConflictError,
     ("seed",)),
    ("mechanism is not a mechanism", _charge("x", "gaussian"), RayDPHPOError, ("mechanism",)),
    ("charge id empty", _charge("", TRIAL), InvalidParameterError, ("charge_id",)),
    ("charge after close", _closed, LedgerClosedError, ("closed",)),
]


@pytest.mark.parametrize(("name", "action", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path, name: str,
                                                        action: Callable[[PrivacyLedger], Any],
                                                        error: type[BaseException],
                                                        words: tuple[str, ...]) -> None:
    journal = tmp_path / "ledger.journal"
    ledger = PrivacyLedger(BUDGET, journal)
    ledger.charge("seed", TRIAL, owner="setup")
    before_bytes, before_spent = journal.read_bytes(), ledger.spent()
    with pytest.raises(error) as info:
        action(ledger)
    message = str(info.value)
    for word in words:
        assert word in message, (name, message)
    assert journal.read_bytes() == before_bytes, name
    reopened = PrivacyLedger.read_only(journal)
    assert [c.charge_id for c in reopened.charges()] == ["seed"]
    assert reopened.spent() == pytest.approx(before_spent, rel=1e-12)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"epsilon": -1.0, "delta": 1e-5}, InvalidParameterError, ("epsilon",)),
    ({"epsilon": 1.0, "delta": 1.5}, InvalidParameterError, ("delta",)),
    ({"epsilon": float("nan"), "delta": 1e-5}, InvalidParameterError, ("epsilon",)),
])
def test_bad_budgets_are_refused_by_name(kwargs: dict[str, float], error: type[BaseException],
                                        words: tuple[str, ...]) -> None:
    with pytest.raises(error) as info:
        PrivacyBudget(**kwargs)
    assert all(w in str(info.value) for w in words)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"adaptivity": Adaptivity.ADAPTIVE, "accountant": Accountant.PLD}, ("fixed",)),
    ({"adaptivity": Adaptivity.ADAPTIVE, "accountant": Accountant.PROFILE}, ("profile", "fixed")),
])
def test_halting_rules_without_a_theorem_are_refused_up_front(tmp_path: Path, kwargs: Any,
                                                              words: tuple[str, ...]) -> None:
    journal = tmp_path / "ledger.journal"
    with pytest.raises(InvalidParameterError) as info:
        PrivacyLedger(BUDGET, journal, **kwargs)
    assert all(w in str(info.value) for w in words)
    assert not journal.exists()  # nothing was created
