"""LedgerStopper and LedgerAuditCallback, driven through their Tune callbacks directly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.ledger import PrivacyLedger
from raydp_hpo.mechanisms import SubsampledGaussian
from raydp_hpo.tune_hooks import BUDGET_EXHAUSTED_KEY, LedgerAuditCallback, LedgerStopper

TRIAL = SubsampledGaussian(1.0, 0.01, 500)


def test_stopper_stops_when_next_charge_would_be_refused() -> None:
    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5))
    stopper = LedgerStopper(ledger, next_charge=TRIAL, poll_interval_s=0.0)
    assert not stopper.stop_all()
    i = 0
    while ledger.try_charge(f"t{i}", TRIAL).admitted:
        i += 1
    assert stopper.stop_all()
    assert stopper("any", {"loss": 1.0}) is False  # never stops single trials


def test_stopper_reacts_to_refused_trial_report() -> None:
    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5))
    stopper = LedgerStopper(ledger, poll_interval_s=3600.0)
    assert not stopper.stop_all()
    stopper("t1", {BUDGET_EXHAUSTED_KEY: True})
    assert stopper.stop_all()


def test_audit_callback_writes_jsonl(tmp_path: Path) -> None:
    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5))
    cb = LedgerAuditCallback(ledger, tmp_path / "audit" / "trail.jsonl")
    trial = SimpleNamespace(trial_id="abc", config={"lr": 0.1, "raydp": {"secret": 1}})
    cb.on_trial_start(0, [], trial)
    ledger.charge("abc", TRIAL)
    cb.on_trial_result(1, [], trial, {"val_accuracy": 0.5, "epsilon": 1.0, "junk": 3})
    cb.on_trial_complete(2, [], trial)
    lines = [json.loads(x) for x in (tmp_path / "audit" / "trail.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["start", "result", "complete"]
    assert "raydp" not in lines[0]["config"]
    assert "spent_epsilon" not in lines[0] and lines[2]["spent_epsilon"] == ledger.spent()
    assert "junk" not in lines[1]["result"]
