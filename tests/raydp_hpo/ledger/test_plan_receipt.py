"""Plan receipts: a trial admitted without a ledger round trip only on a durable charge.

Every case that could let a trial run without a durable covering charge — a receipt for
another charge, a sequence number, offset or chain hash the journal does not hold, a truncated
or replaced journal — must refuse; only missing local evidence falls back to the ledger.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.ledger.journal import seal_path
from raydp_hpo.ledger.plan_receipt import PlanReceipt, ReceiptCheck, check_receipt, receipt_for

MECH = SubsampledGaussian(2.0, 0.01, 200)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A journal with three charges; the plan is the second one."""
    path = tmp_path / "ledger.journal"
    ledger = PrivacyLedger(PrivacyBudget(20.0, 1e-5), path)
    for cid in ("exp/other", "exp/plan", "exp/third"):
        ledger.charge(cid, MECH)
    ledger.close()
    return path


def test_receipt_of_an_admitted_charge_is_durable(journal: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    assert (receipt.seq, receipt.charge_id, receipt.delta) == (2, "exp/plan", 1e-5)
    assert check_receipt(receipt, "exp/plan") is ReceiptCheck.DURABLE
    last = receipt_for(journal, "exp/third")  # the seal's head: its chain is compared too
    assert last is not None and check_receipt(last, "exp/third") is ReceiptCheck.DURABLE
    assert receipt_for(journal, "exp/never-charged") is None


def test_receipt_for_another_charge_is_refused(journal: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    with pytest.raises(RayDPHPOError, match="is covered by 'other/plan'"):
        check_receipt(receipt, "other/plan")
    # a receipt relabelled to name the trial's plan: the record there is another charge
    forged = dataclasses.replace(receipt, charge_id="other/plan")
    with pytest.raises(RayDPHPOError, match="another charge"):
        check_receipt(forged, "other/plan")


@pytest.mark.parametrize("change", ["seq", "offset", "chain", "prev_chain"])
def test_receipt_the_journal_does_not_hold_is_refused(journal: Path, change: str) -> None:
    receipt = receipt_for(journal, "exp/plan")
    other = receipt_for(journal, "exp/other")
    assert receipt is not None and other is not None
    forged = {
        "seq": dataclasses.replace(receipt, seq=1),
        "offset": dataclasses.replace(receipt, offset=other.offset, length=other.length),
        "chain": dataclasses.replace(receipt, chain="0" * 64),
        "prev_chain": dataclasses.replace(receipt, prev_chain="0" * 64),
    }[change]
    with pytest.raises(RayDPHPOError, match="does not match the journal"):
        check_receipt(forged, "exp/plan")


def test_journal_missing_the_record_is_refused(journal: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    raw = journal.read_bytes()
    journal.write_bytes(raw[: receipt.offset])  # cut before the plan; the seal still says 3
    with pytest.raises(RayDPHPOError, match="no complete line"):
        check_receipt(receipt, "exp/plan")
    journal.unlink()  # the seal is left: the journal was removed
    with pytest.raises(RayDPHPOError, match="journal is missing"):
        check_receipt(receipt, "exp/plan")


def test_receipt_of_another_journal_is_refused(journal: Path, tmp_path: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    other = tmp_path / "other.journal"
    ledger = PrivacyLedger(PrivacyBudget(20.0, 1e-5), other)
    for cid in ("exp/other", "exp/plan"):
        ledger.charge(cid, MECH)
    ledger.close()
    with pytest.raises(RayDPHPOError, match="another header"):
        check_receipt(dataclasses.replace(receipt, journal=str(other)), "exp/plan")


def test_no_local_evidence_asks_the_ledger(journal: Path, tmp_path: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    # the journal is not on this node's file system (no journal, no seal)
    away = dataclasses.replace(receipt, journal=str(tmp_path / "elsewhere" / "x.journal"))
    assert check_receipt(away, "exp/plan") is ReceiptCheck.ASK_LEDGER
    # the seal lags behind the record (it is not fsync'd: a power loss can leave it behind)
    path = tmp_path / "lag.journal"
    ledger = PrivacyLedger(PrivacyBudget(20.0, 1e-5), path)
    ledger.charge("exp/first", MECH)
    shutil.copy(seal_path(path), tmp_path / "seal.bak")
    ledger.charge("exp/plan", MECH)
    ledger.close()
    shutil.copy(tmp_path / "seal.bak", seal_path(path))
    lagging = receipt_for(path, "exp/plan")
    assert lagging is not None
    assert check_receipt(lagging, "exp/plan") is ReceiptCheck.ASK_LEDGER


def test_malformed_receipts_are_refused_with_the_bad_value(journal: Path) -> None:
    receipt = receipt_for(journal, "exp/plan")
    assert receipt is not None
    raw = dataclasses.asdict(receipt)
    assert PlanReceipt.from_dict(raw) == receipt
    with pytest.raises(InvalidParameterError, match="seq=0"):
        PlanReceipt.from_dict({**raw, "seq": 0})
    with pytest.raises(InvalidParameterError, match="journal='relative'"):
        PlanReceipt.from_dict({**raw, "journal": "relative"})
    with pytest.raises(InvalidParameterError, match="differ from"):
        PlanReceipt.from_dict({**raw, "extra": 1})
