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
    cb.on_trial_result(1, [], trial, {"val_accuracy": 0.5, "trial_epsilon_rdp": 1.0, "junk": 3})
    cb.on_trial_complete(2, [], trial)
    cb.on_step_end(3, [])  # within the interval: nothing asked
    cb.on_experiment_end([])  # always asked at the end
    lines = [json.loads(x) for x in (tmp_path / "audit" / "trail.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["spend", "start", "result", "complete", "spend"]
    assert lines[0]["spent_epsilon"] == 0.0 and lines[-1]["spent_epsilon"] == ledger.spent()
    assert "raydp" not in lines[1]["config"]
    assert "junk" not in lines[2]["result"]
    # the trial's own RDP ε is kept under its name (it was "epsilon", read as the search's)
    assert lines[2]["result"] == {"val_accuracy": 0.5, "trial_epsilon_rdp": 1.0}


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


# ------------------------------------------------------------------ ProgressCallback

def _progress(ledger, *, mode: str = "max", interval: float = 0.0):
    from raydp_hpo.tune.hooks import ProgressCallback

    lines: list[str] = []
    cb = ProgressCallback(ledger, 3.0, "val_accuracy", mode, out=lines.append,
                          interval_s=interval)
    return cb, lines


def _done(cb, trial_id: str, result: dict) -> None:
    trial = SimpleNamespace(trial_id=trial_id, last_result=result)
    cb.on_trial_start(0, [], trial)
    cb.on_trial_complete(1, [], trial)


def test_progress_shows_only_noisy_scores_and_the_ledger_spend() -> None:
    from raydp_hpo.tune.hooks import NOISY_SCORE_KEY

    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5))
    cb, lines = _progress(ledger)
    cb.on_trial_start(0, [], SimpleNamespace(trial_id="a", last_result={}))
    ledger.charge("a", TRIAL)
    cb.on_step_end(1, [])
    assert lines[-1].endswith(
        f"trials done 0, errored 0, running 1; best val_accuracy (noisy) so far -; "
        f"ledger ε spent {ledger.spent():.4f} / 3")
    # an unnoised final score (a final run, a public validation split) is never shown
    _done(cb, "a", {"val_accuracy": 0.99})
    assert cb.best is None
    _done(cb, "b", {"val_accuracy": 0.61, NOISY_SCORE_KEY: 0.1})
    _done(cb, "c", {"val_accuracy": 0.55, NOISY_SCORE_KEY: 0.1})
    _done(cb, "d", {"val_accuracy": float("nan"), NOISY_SCORE_KEY: 0.1})
    cb.on_trial_error(2, [], SimpleNamespace(trial_id="e"))
    cb.on_experiment_end([])
    assert cb.best == 0.61
    assert "trials done 4, errored 1, running 0; best val_accuracy (noisy) so far 0.6100" \
        in lines[-1]


def test_progress_minimises_for_mode_min_and_waits_for_its_interval() -> None:
    from raydp_hpo.tune.hooks import NOISY_SCORE_KEY

    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5))
    cb, lines = _progress(ledger, mode="min", interval=3600.0)
    cb.on_step_end(0, [])
    _done(cb, "a", {"val_accuracy": 0.4, NOISY_SCORE_KEY: 0.1})
    _done(cb, "b", {"val_accuracy": 0.2, NOISY_SCORE_KEY: 0.1})
    cb.on_step_end(1, [])  # within the interval: no new line
    assert len(lines) == 1
    cb.on_experiment_end([])  # the end always writes its line
    assert len(lines) == 2 and "so far 0.2000" in lines[-1]


def test_progress_survives_a_ledger_that_cannot_be_asked_and_pickles_without_out() -> None:
    import pickle

    class Gone:
        def spent(self) -> float:
            raise RuntimeError("ledger actor died")

    cb, lines = _progress(Gone())
    cb.on_step_end(0, [])
    cb.on_experiment_end([])
    assert lines and "ledger ε spent ? / 3" in lines[-1]
    # Tune pickles its run config when a run starts: `out` (any callable) is not kept
    state = cb.__getstate__()
    assert state["_out"] is print and state["_asked"] is None
    assert pickle.loads(pickle.dumps(state["_out"])) is print


@pytest.mark.ray
def test_progress_asks_the_ledger_actor_without_waiting(ray_session, tmp_path: Path) -> None:
    from raydp_hpo.ledger.actor import get_ledger

    ledger = get_ledger(f"progress-{uuid.uuid4().hex[:8]}", PrivacyBudget(3.0, 1e-5),
                        tmp_path / "p.journal")
    try:
        ledger.charge("a", TRIAL)
        cb, lines = _progress(ledger)
        cb.on_step_end(0, [])  # asked, not waited for: no line while the spend is unknown
        assert lines == [] and cb._asked is not None
        cb.on_experiment_end([])  # waits for the answer
        assert f"ledger ε spent {ledger.spent():.4f} / 3" in lines[-1]
    finally:
        ledger.kill()


class _PicklableSpend:
    def spent(self) -> float:
        return 0.0


def test_audit_callback_keeps_its_file_open_and_pickles_without_it(tmp_path: Path) -> None:
    """One open file for the whole run (not one per record); Tune pickles its callbacks with
    the experiment state, so the pickled form carries no file, and a copy appends again."""
    import pickle

    ledger = _PicklableSpend()  # a ledger handle pickles by name; this stands in for one
    path = tmp_path / "trail.jsonl"
    cb = LedgerAuditCallback(ledger, path, spend_interval_s=3600)
    trial = SimpleNamespace(trial_id="a", config={})
    cb.on_trial_start(0, [], trial)
    handle = cb._fh
    cb.on_trial_complete(1, [], trial)
    assert cb._fh is handle and not handle.closed
    assert len(path.read_text().splitlines()) == 2  # flushed as they happen
    copy = pickle.loads(pickle.dumps(cb))
    assert copy._fh is None and cb._fh is handle
    copy.on_trial_start(2, [], SimpleNamespace(trial_id="b", config={}))
    cb.on_experiment_end([])
    assert handle.closed and cb._fh is None
    copy.close()
    events = [json.loads(x)["event"] for x in path.read_text().splitlines()]
    assert events == ["start", "complete", "start", "spend"]
