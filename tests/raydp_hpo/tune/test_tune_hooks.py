"""LedgerStopper and LedgerAuditCallback, driven through their Tune callbacks directly."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.tune.hooks import BUDGET_EXHAUSTED_KEY, LedgerAuditCallback, LedgerStopper

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
    cb = LedgerAuditCallback(ledger, tmp_path / "audit" / "trail.jsonl", spend_interval_s=3600)
    trial = SimpleNamespace(trial_id="abc", config={"lr": 0.1, "raydp": {"secret": 1}})
    cb.on_step_end(0, [])  # first step: spend asked at once (local ledger: answered at once)
    cb.on_trial_start(0, [], trial)
    ledger.charge("abc", TRIAL)
    cb.on_trial_result(1, [], trial, {"val_accuracy": 0.5, "epsilon": 1.0, "junk": 3})
    cb.on_trial_complete(2, [], trial)
    cb.on_step_end(3, [])  # within the interval: nothing asked
    cb.on_experiment_end([])  # always asked at the end
    lines = [json.loads(x) for x in (tmp_path / "audit" / "trail.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["spend", "start", "result", "complete", "spend"]
    assert lines[0]["spent_epsilon"] == 0.0 and lines[-1]["spent_epsilon"] == ledger.spent()
    assert "raydp" not in lines[1]["config"]
    assert "junk" not in lines[2]["result"]


@pytest.mark.ray
def test_audit_callback_with_ledger_actor_never_waits_mid_run(ray_session, tmp_path: Path) -> None:
    """Spend is asked of the actor without waiting and written once answered; a dead ledger
    is recorded, never raised into Tune."""
    from raydp_hpo.ledger.actor import get_ledger

    ledger = get_ledger(f"audit-{uuid.uuid4().hex[:8]}", PrivacyBudget(3.0, 1e-5), tmp_path / "j.journal")
    try:
        path = tmp_path / "trail.jsonl"
        cb = LedgerAuditCallback(ledger, path, spend_interval_s=0.0)
        a = SimpleNamespace(trial_id="a", config={})
        cb.on_trial_start(0, [], a)
        ledger.charge("a", TRIAL)
        cb.on_step_end(1, [])  # asks; the answer is written at a later step
        cb.on_trial_complete(2, [], a)
        deadline = time.monotonic() + 30
        while "spend" not in path.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
            cb.on_step_end(3, [])
        cb.on_experiment_end([])
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        spends = [x["spent_epsilon"] for x in lines if x["event"] == "spend"]
        assert len(spends) >= 2
        assert all(s == pytest.approx(ledger.spent(), rel=1e-12) for s in spends)
        assert [(x["trial_id"], x["event"]) for x in lines if x["event"] != "spend"] == [
            ("a", "start"), ("a", "complete")
        ]

        ledger.kill()
        with pytest.raises(ray.exceptions.RayActorError):
            for _ in range(100):  # kill() is asynchronous: wait until calls fail
                ledger.spent()
                time.sleep(0.05)
        cb.on_experiment_end([])
        last = json.loads(path.read_text().splitlines()[-1])
        assert last["event"] == "spend" and last["spent_epsilon"] != last["spent_epsilon"]  # NaN
        assert "ledger_error" in last
    finally:
        ledger.kill()


@pytest.mark.ray
def test_stopper_with_ledger_actor_answers_later_and_stops_on_dead_ledger(
    ray_session, tmp_path: Path
) -> None:
    from raydp_hpo.ledger.actor import get_ledger

    ledger = get_ledger(f"stop-{uuid.uuid4().hex[:8]}", PrivacyBudget(3.0, 1e-5), tmp_path / "j")
    try:
        stopper = LedgerStopper(ledger, next_charge=TRIAL, poll_interval_s=0.0)
        assert not stopper.stop_all()  # asked, not waited for
        i = 0
        while ledger.try_charge(f"t{i}", TRIAL).admitted:
            i += 1
        deadline = time.monotonic() + 30
        while not stopper.stop_all() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopper.stop_all() and stopper.ledger_error is None

        dead = LedgerStopper(ledger, poll_interval_s=0.0)
        ledger.kill()
        deadline = time.monotonic() + 30
        while not dead.stop_all() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dead.stop_all() and isinstance(dead.ledger_error, ray.exceptions.RayActorError)
    finally:
        ledger.kill()
