"""The ledger as a real Ray actor: racing tasks, kill + restart, attach rules."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.errors import BudgetExhaustedError, LedgerMismatchError, RayDPHPOError
from raydp_hpo.ledger.actor import get_ledger

pytestmark = [pytest.mark.ray]

TRIAL = SubsampledGaussian(1.0, 0.01, 500)
BUDGET = PrivacyBudget(3.0, 1e-5)


@ray.remote(num_cpus=0)
def _charge_many(name: str, namespace: str, worker: int, n: int) -> int:
    from raydp_hpo.ledger.actor import get_ledger

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


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after_write", "mid_write"])
def test_actor_killed_inside_the_fsync_of_a_charge(ray_session, tmp_path: Path,
                                                   where: str) -> None:
    """SIGKILL the ledger actor between a record's write (whole, or half of it) and its fsync
    (journal.TEST_PAUSE_ENV hook), then let it restart: the charge is either in the journal
    once and acknowledged, or absent and never acknowledged (a half record is moved aside as
    a torn tail), the chain checks, and the spend never shrinks."""
    from raydp_hpo.ledger.actor import LedgerHandle, _remote_ledger_class
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.ledger.journal import TEST_PAUSE_ENV, scan_journal
    from raydp_hpo.ledger.records import Adaptivity

    hooks, journal, name = tmp_path / "hooks", tmp_path / "j", _name()
    hooks.mkdir()
    actor = _remote_ledger_class().options(
        name=name, namespace="tests", lifetime="detached", num_cpus=0, max_restarts=-1,
        max_task_retries=-1, runtime_env={"env_vars": {TEST_PAUSE_ENV: str(hooks)}},
    ).remote(BUDGET, str(journal), Adaptivity.ADAPTIVE.value, "rdp")
    ledger = LedgerHandle(name, "tests", actor, created=True)
    try:
        ledger.charge("a", TRIAL)
        spent_before = ledger.spent()
        pid = ray.get(actor.pid.remote())
        (hooks / "arm").write_text(where)
        ref = actor.try_charge.remote("b", TRIAL, "fault-test")
        deadline = time.time() + 60
        while not (hooks / "paused").exists():
            assert time.time() < deadline, "the append never reached the hook"
            time.sleep(0.05)
        (hooks / "arm").unlink()  # the restarted actor appends normally
        os.kill(pid, signal.SIGKILL)  # inside the write → fsync window
        try:
            decision = ray.get(ref, timeout=120)  # retried on the restarted actor
            acknowledged = decision.admitted
        except ray.exceptions.RayActorError:
            acknowledged = False
        spent_after = ledger.spent()
        ids = [c.charge_id for c in ledger.charges()]
    finally:
        ledger.kill()
    scan = scan_journal(journal)  # every complete record passes the chain check
    on_disk = [r["charge_id"] for r in scan.records]
    assert on_disk == ids
    assert on_disk.count("a") == 1 and on_disk.count("b") <= 1
    assert ("b" in on_disk) == acknowledged  # acknowledged ⟺ durable, never half
    assert scan.torn is None  # a half record was moved to a side file on restart
    torn_files = list(tmp_path.glob("j.torn-*"))
    assert len(torn_files) == (1 if where == "mid_write" else 0)
    assert spent_after >= spent_before
    assert PrivacyLedger.read_only(journal).spent() == pytest.approx(spent_after, rel=1e-12)


def test_a_charge_made_before_the_actor_starts(ray_session, tmp_path: Path) -> None:
    """charge_before_start admits and fsyncs the charge in this process; the actor started
    with its receipt replays it (one charge, the same spend); a refusal charges nothing."""
    from raydp_hpo.accounting.accountant_kind import Accountant
    from raydp_hpo.ledger.actor import (
        LedgerHandle,
        charge_before_start,
        driver_on_head_node,
        start_ledger,
    )
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.ledger.journal import read_journal
    from raydp_hpo.ledger.records import Adaptivity

    assert driver_on_head_node()  # a one-node local Ray: the driver is on the head node
    journal = tmp_path / "j"
    kw = {"adaptivity": Adaptivity.FIXED_PLAN, "accountant": Accountant.BEST}
    with pytest.raises(BudgetExhaustedError):
        charge_before_start(BUDGET, journal, charge_id="big", mechanism=SubsampledGaussian(
            0.5, 0.1, 5000), **kw)
    assert read_journal(journal)[1] == []  # refused: nothing recorded
    receipt = charge_before_start(BUDGET, journal, charge_id="exp/plan", mechanism=TRIAL, **kw)
    assert receipt.charge_id == "exp/plan" and receipt.seq == 1
    with PrivacyLedger(BUDGET, **kw) as reference:  # the same rule, in memory
        expected = reference.charge("exp/plan", TRIAL).epsilon_after
    name = _name()
    handle = LedgerHandle(name, "tests", None)
    with pytest.raises(RayDPHPOError, match="not started yet"):
        handle.spent()
    handle.kill()  # nothing to kill: no error
    start_ledger(handle, BUDGET, journal, expect_charge=receipt, **kw)
    try:
        assert handle.created and handle.verify().has_charge("exp/plan")
        assert handle.receipt("exp/plan") == receipt
        # the actor starts from the PLD snapshot the driver left: never below, ~1e-10 above
        # (round-off below zero raised to 0, raydp_hpo.accounting.pld)
        spent = handle.spent()
        assert spent >= expected and spent == pytest.approx(expected, rel=1e-9)
        assert len(handle.charges()) == 1
        with pytest.raises(RayDPHPOError, match="already started"):
            start_ledger(handle, BUDGET, journal, **kw)
    finally:
        handle.kill()


def test_the_actor_refuses_to_start_without_the_expected_charge(ray_session, tmp_path: Path
                                                               ) -> None:
    """An actor that does not see the charge its driver made before starting it (another
    file: the driver was not on its node) must not serve that ledger: it would admit the
    budget a second time. It fails to start, and verify() says why."""
    from raydp_hpo.accounting.accountant_kind import Accountant
    from raydp_hpo.ledger.actor import charge_before_start
    from raydp_hpo.ledger.records import Adaptivity

    kw = {"adaptivity": Adaptivity.FIXED_PLAN, "accountant": Accountant.BEST}
    receipt = charge_before_start(BUDGET, tmp_path / "driver.j", charge_id="exp/plan",
                                  mechanism=TRIAL, **kw)
    ledger = get_ledger(_name(), BUDGET, tmp_path / "elsewhere.j", namespace="tests",
                        wait=False, expect_charge=receipt, **kw)
    try:
        with pytest.raises(RayDPHPOError, match="does not hold charge 'exp/plan'"):
            ledger.verify()
        with pytest.raises(ray.exceptions.RayActorError):
            ledger.try_charge("more", TRIAL)  # every call fails: nothing can be admitted
    finally:
        ledger.kill()
