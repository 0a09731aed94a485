"""Both ledgers satisfy :class:`~raydp_hpo.ledger.ledger_like.LedgerLike` at run time too.

mypy checks the same statically (``tests/typecheck/ledger_like.py``, run by
``test_public_api.py``); this test compares signatures without mypy and without Ray, and runs
protocol-typed code against the in-process ledger.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Laplace, SubsampledGaussian
from raydp_hpo.errors import BudgetExhaustedError
from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.ledger_like import LedgerLike
from raydp_hpo.trainables.privacy_gate import admit, ledger_delta

MEMBERS = sorted(
    name
    for name, value in vars(LedgerLike).items()
    if not name.startswith("_") and (callable(value) or isinstance(value, property))
)


def test_the_protocol_names_what_trainables_and_hooks_use() -> None:
    assert MEMBERS == [
        "budget",
        "charge",
        "charges",
        "epsilon_if_charged",
        "has_charge",
        "remaining",
        "report",
        "spent",
        "try_charge",
        "try_charge_new_attempt",
        "would_admit",
    ]


def _shape(member: object) -> tuple[object, ...]:
    """What must agree: property or method; parameter names, kinds and defaults; the
    return annotation (a string: every module uses ``from __future__ import annotations``)."""
    if isinstance(member, property):
        assert member.fget is not None
        return ("property", inspect.signature(member.fget).return_annotation)
    sig = inspect.signature(member)  # type: ignore[arg-type]
    params = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
    return ("method", params, sig.return_annotation)


@pytest.mark.parametrize("cls", [PrivacyLedger, LedgerHandle])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_ledger_has_each_member_with_the_protocols_signature(cls: type, name: str) -> None:
    # getattr_static: reading LedgerHandle.budget on an instance would be a Ray round trip
    assert _shape(inspect.getattr_static(cls, name)) == _shape(vars(LedgerLike)[name])


def test_protocol_typed_code_runs_on_the_in_process_ledger(tmp_path: Path) -> None:
    def spend_twice(ledger: LedgerLike) -> float:
        ledger.charge("exp/a", SubsampledGaussian(1.1, 0.01, 100), owner="exp")
        assert ledger.try_charge("exp/a", SubsampledGaussian(1.1, 0.01, 100)).replayed
        assert ledger.has_charge("exp/a") and not ledger.has_charge("exp/b")
        assert not ledger.would_admit(Laplace(100.0))
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("exp/b", Laplace(100.0))
        assert not ledger.has_charge("exp/b")  # a refusal changes nothing
        attempt = ledger.try_charge_new_attempt("exp/c", Laplace(0.1))
        assert attempt.admitted and attempt.charge_id == "exp/c/attempt-0"
        assert [c.charge_id for c in ledger.charges()] == ["exp/a", "exp/c/attempt-0"]
        assert ledger.spent() + ledger.remaining() == pytest.approx(ledger.budget.epsilon)
        return ledger.report().spent_epsilon

    with PrivacyLedger(PrivacyBudget(4.0, 1e-5), tmp_path / "l.journal") as ledger:
        assert spend_twice(ledger) == pytest.approx(ledger.spent())


def test_the_privacy_gate_takes_any_ledger_like() -> None:
    from raydp_hpo.trial.settings import RaydpSettings

    ledger = PrivacyLedger(PrivacyBudget(4.0, 1e-5))
    settings = RaydpSettings(ledger="unused", experiment="exp", charge=True, charge_id="exp/t1")
    charged = admit(settings, SubsampledGaussian(1.1, 0.01, 100), ledger, owner="exp")
    assert charged == "exp/t1/attempt-0" and ledger.has_charge(charged)
    assert ledger_delta(settings, ledger) == 1e-5
