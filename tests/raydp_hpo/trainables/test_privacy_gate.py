"""The privacy gate with plan receipts: no ledger round trip for a trial whose covering plan
charge the journal shows durable; a refusal whenever it cannot be shown."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian, mechanism_to_dict
from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.plan_receipt import receipt_for
from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit, ledger_delta, resolve_ledger

BASE = SubsampledGaussian(2.0, 0.01, 200)
TRIAL = SubsampledGaussian(2.0, 0.01, 100)  # dominated by BASE


@pytest.fixture
def ledger(tmp_path: Path) -> PrivacyLedger:
    ledger = PrivacyLedger(PrivacyBudget(20.0, 1e-6), tmp_path / "ledger.journal")
    ledger.charge("exp/plan", BASE)
    return ledger


def _settings(receipt, covered_by: str = "exp/plan") -> RaydpSettings:
    # names a ledger actor that does not exist: any attempt to reach it raises
    return RaydpSettings(ledger="no-such-ledger-actor", experiment="exp", covered_by=covered_by,
                         base=mechanism_to_dict(BASE), plan_receipt=receipt)


def test_receipt_admits_without_reaching_the_ledger(ledger: PrivacyLedger) -> None:
    settings = _settings(receipt_for(ledger.journal_path, "exp/plan"))
    assert resolve_ledger(settings, None) is None  # no actor look-up
    assert admit(settings, TRIAL, None, owner="t") == "exp/plan"
    assert ledger_delta(settings, None) == 1e-6  # the budget's δ, from the receipt
    # the receipt survives the dict form a hand-written or logged config has
    again = RaydpSettings.from_config({"raydp": settings.to_dict()})
    assert again == settings and admit(again, TRIAL, None, owner="t") == "exp/plan"
    # SVT's non-private partition trials take the same path
    nonprivate = dataclasses.replace(settings, nonprivate=True)
    assert admit(nonprivate, TRIAL, None, owner="t") == "exp/plan"


def test_trial_not_dominated_by_the_plan_is_refused_even_with_a_receipt(
    ledger: PrivacyLedger,
) -> None:
    settings = _settings(receipt_for(ledger.journal_path, "exp/plan"))
    with pytest.raises(RayDPHPOError, match="not covered by the plan"):
        admit(settings, SubsampledGaussian(2.0, 0.01, 400), None, owner="t")


def test_truncated_journal_refuses_the_trial(ledger: PrivacyLedger) -> None:
    receipt = receipt_for(ledger.journal_path, "exp/plan")
    assert receipt is not None
    ledger.close()
    path = Path(receipt.journal)
    path.write_bytes(path.read_bytes()[: receipt.offset])
    with pytest.raises(RayDPHPOError, match="does not match the journal"):
        admit(_settings(receipt), TRIAL, None, owner="t")


def test_forged_plan_id_is_refused(ledger: PrivacyLedger) -> None:
    receipt = receipt_for(ledger.journal_path, "exp/plan")
    assert receipt is not None
    forged = dataclasses.replace(receipt, charge_id="exp/other-plan")
    with pytest.raises(RayDPHPOError, match="does not match the journal"):
        admit(_settings(forged, "exp/other-plan"), TRIAL, ledger, owner="t")


def test_without_local_evidence_the_ledger_decides(ledger: PrivacyLedger, tmp_path: Path) -> None:
    receipt = receipt_for(ledger.journal_path, "exp/plan")
    assert receipt is not None
    # the journal is not on this node: the ledger (here a local one) is asked
    away = dataclasses.replace(receipt, journal=str(tmp_path / "elsewhere" / "ledger.journal"))
    assert admit(_settings(away), TRIAL, ledger, owner="t") == "exp/plan"
    # ... and refuses a plan it never admitted
    other = PrivacyLedger(PrivacyBudget(20.0, 1e-6))
    with pytest.raises(RayDPHPOError, match="is not on the ledger"):
        admit(_settings(away), TRIAL, other, owner="t")
    # with no ledger given, the gate attaches to the named actor (which does not exist)
    with pytest.raises(RayDPHPOError):
        admit(_settings(away), TRIAL, None, owner="t")
