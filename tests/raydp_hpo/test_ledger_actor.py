"""The ledger as a real Ray actor: racing tasks, kill + restart, attach rules."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray

from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.errors import BudgetExhaustedError, LedgerMismatchError, RayDPHPOError
from raydp_hpo.ledger_actor import get_ledger
from raydp_hpo.mechanisms import SubsampledGaussian

pytestmark = [pytest.mark.ray]

TRIAL = SubsampledGaussian(1.0, 0.01, 500)
BUDGET = PrivacyBudget(3.0, 1e-5)


@ray.remote(num_cpus=0)
def _charge_many(name: str, namespace: str, worker: int, n: int) -> int:
    from raydp_hpo.ledger_actor import get_ledger

    ledger = get_ledger(name, namespace=namespace)
    return sum(ledger.try_charge(f"w{worker}-{j}", TRIAL).admitted for j in range(n))


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_racing_tasks_never_exceed_budget(ray_session, tmp_path: Path) -> None:
    name = _name()
    ledger = get_ledger(name, BUDGET, tmp_path / "j", namespace="tests")
    try:
        admitted = sum(ray.get([_charge_many.remote(name, "tests", w, 8) for w in range(6)]))
        assert admitted == len(ledger.charges()) >= 1
        assert ledger.spent() <= BUDGET.epsilon
        assert not ledger.would_admit(TRIAL)
        with pytest.raises(BudgetExhaustedError):
            ledger.charge("one-more", TRIAL)
    finally:
        ledger.kill()


def test_killed_actor_restarts_from_journal(ray_session, tmp_path: Path) -> None:
    name = _name()
    ledger = get_ledger(name, BUDGET, tmp_path / "j", namespace="tests")
    try:
        ledger.charge("a", TRIAL)
        ledger.charge("b", TRIAL)
        spent, charges = ledger.spent(), ledger.charges()
        pid = ray.get(ledger.actor.pid.remote())
        os.kill(pid, signal.SIGKILL)  # the actor's process dies mid-run
        deadline = time.time() + 60
        while True:
            try:
                new_pid = ray.get(ledger.actor.pid.remote(), timeout=10)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        assert new_pid != pid
        again = get_ledger(name, BUDGET, tmp_path / "j", namespace="tests")
        assert again.spent() == spent
        assert again.charges() == charges
        assert again.try_charge("a", TRIAL).replayed  # retried call is idempotent
    finally:
        ledger.kill()


def test_attach_rules(ray_session, tmp_path: Path) -> None:
    name = _name()
    with pytest.raises(RayDPHPOError, match="no ledger named"):
        get_ledger(name, namespace="tests")
    ledger = get_ledger(name, BUDGET, tmp_path / "j", namespace="tests")
    try:
        assert ledger.created  # this call made it: its settings are the ones asked for
        assert get_ledger(name, namespace="tests").budget == BUDGET
        again = get_ledger(name, BUDGET, tmp_path / "j", namespace="tests", wait=False)
        assert not again.created  # attached: settings must be verified
        again.verify()
        with pytest.raises(LedgerMismatchError, match="already exists"):
            get_ledger(name, PrivacyBudget(5.0, 1e-5), namespace="tests")
    finally:
        ledger.kill()
    # re-creating from the same journal with another budget is refused, journal untouched
    before = (tmp_path / "j").read_bytes()
    with pytest.raises(RayDPHPOError):
        get_ledger(_name(), PrivacyBudget(5.0, 1e-5), tmp_path / "j", namespace="tests")
    assert (tmp_path / "j").read_bytes() == before
