"""The plain-Python ledger: admission, atomic refusal, idempotency, journal replay."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, Gaussian, PureDP, SubsampledGaussian
from raydp_hpo.accounting.rdp import rdp_profile
from raydp_hpo.errors import (
    BudgetExhaustedError,
    ChargeConflictError,
    InvalidParameterError,
    LedgerCorruptedError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, filter_epsilon

TRIAL = SubsampledGaussian(1.0, 0.01, 500)
BUDGET = PrivacyBudget(3.0, 1e-5)


def _ledger(tmp_path: Path, **kw) -> PrivacyLedger:
    return PrivacyLedger(BUDGET, tmp_path / "ledger.journal", **kw)


def test_budget_validation_names_value() -> None:
    for eps, dlt, word in [(0, 1e-5, "epsilon"), (-1, 1e-5, "epsilon"), (float("nan"), 1e-5,
                           "epsilon"), (1, 0, "delta"), (1, 1, "delta"), (1, -0.1, "delta")]:
        with pytest.raises(InvalidParameterError, match=word):
            PrivacyBudget(eps, dlt)


def test_admits_until_budget_then_refuses_unchanged(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        admitted = 0
        while ledger.try_charge(f"t{admitted}", TRIAL).admitted:
            admitted += 1
        assert admitted >= 1
        journal_bytes = (tmp_path / "ledger.journal").read_bytes()
        spent, charges = ledger.spent(), ledger.charges()
        refused = ledger.try_charge("extra", TRIAL)
        assert not refused.admitted and refused.epsilon_after > BUDGET.epsilon
        assert ledger.spent() == spent and ledger.charges() == charges
        assert (tmp_path / "ledger.journal").read_bytes() == journal_bytes
        assert spent <= BUDGET.epsilon
        with pytest.raises(BudgetExhaustedError, match="remaining") as err:
            ledger.charge("extra", TRIAL)
        assert err.value.spent_epsilon == spent


def test_spent_is_filter_epsilon_and_exceeds_fixed_sequence(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        small = SubsampledGaussian(1.5, 0.01, 500)
        for i in range(3):
            ledger.charge(f"t{i}", small)
        fixed = epsilon([small] * 3, BUDGET.delta, Accountant.RDP)
        assert ledger.spent() == pytest.approx(
            filter_epsilon(rdp_profile(small).scaled(3), BUDGET.delta), rel=1e-12
        )
        # the union bound over orders costs something but not much (< 40% here)
        assert fixed < ledger.spent() < 1.4 * fixed
        report = ledger.report()
        assert report.epsilon_by_accountant["rdp"] == pytest.approx(fixed)
        assert report.epsilon_by_accountant["pld"] <= fixed + 1e-9
        assert len(report.charges) == 3 and "t2" in report.format()


def test_idempotent_replay_and_conflict(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        first = ledger.charge("a", TRIAL, owner="trial-1")
        again = ledger.charge("a", TRIAL, owner="trial-1")
        assert again.replayed and again.epsilon_after == first.epsilon_after
        assert len(ledger.charges()) == 1
        with pytest.raises(ChargeConflictError):
            ledger.charge("a", SubsampledGaussian(2.0, 0.01, 500))
        # a trial that trains again under a new id pays again
        ledger.charge("a#2", TRIAL)
        assert len(ledger.charges()) == 2


def test_new_attempt_always_pays_and_refusal_changes_nothing(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        first = ledger.try_charge_new_attempt("exp/t1", TRIAL, owner="trial-1")
        second = ledger.try_charge_new_attempt("exp/t1", TRIAL, owner="trial-1")
        assert (first.charge_id, second.charge_id) == ("exp/t1/attempt-0", "exp/t1/attempt-1")
        assert first.admitted and second.admitted and not second.replayed
        assert [c.charge_id for c in ledger.charges()] == [first.charge_id, second.charge_id]
        journal = (tmp_path / "ledger.journal").read_bytes()
        big = SubsampledGaussian(0.5, 0.5, 10_000)
        refused = ledger.try_charge_new_attempt("exp/t1", big)
        assert not refused.admitted and refused.charge_id == "exp/t1/attempt-2"
        assert (tmp_path / "ledger.journal").read_bytes() == journal
        with pytest.raises(BudgetExhaustedError):
            refused.raise_if_refused()
        with pytest.raises(InvalidParameterError, match="charge_id"):
            ledger.try_charge_new_attempt("", TRIAL)


def test_journal_replay_exact(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        ledger.charge("a", TRIAL, owner="x")
        ledger.charge("b", PureDP(0.1, 3))
        spent, charges = ledger.spent(), ledger.charges()
    with _ledger(tmp_path) as again:
        assert again.spent() == spent
        assert again.charges() == charges
    reopened = PrivacyLedger.open(tmp_path / "ledger.journal")
    assert reopened.spent() == spent
    reopened.close()


def test_second_live_ledger_on_same_journal_is_refused(tmp_path: Path) -> None:
    with _ledger(tmp_path), pytest.raises(RayDPHPOError, match="already open"):
        _ledger(tmp_path)


def test_budget_mismatch_is_an_error(tmp_path: Path) -> None:
    with _ledger(tmp_path) as ledger:
        ledger.charge("a", TRIAL)
    with pytest.raises(LedgerMismatchError, match="budget"):
        PrivacyLedger(PrivacyBudget(30.0, 1e-5), tmp_path / "ledger.journal")


def test_torn_last_record_dropped_with_warning(tmp_path: Path) -> None:
    path = tmp_path / "ledger.journal"
    with _ledger(tmp_path) as ledger:
        ledger.charge("a", TRIAL)
        spent = ledger.spent()
    with open(path, "ab") as fh:
        fh.write(b'{"kind":"charge","seq":2,"charge_id":"b"')  # crash mid-write
    with pytest.warns(RuntimeWarning, match="torn"), _ledger(tmp_path) as ledger:
        assert ledger.spent() == spent and len(ledger.charges()) == 1
        ledger.charge("b", TRIAL)  # appends cleanly after the truncated tail
    with _ledger(tmp_path) as ledger:
        assert [c.charge_id for c in ledger.charges()] == ["a", "b"]


def test_corruption_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.journal"
    with _ledger(tmp_path) as ledger:
        ledger.charge("a", TRIAL)
        ledger.charge("b", TRIAL)
    lines = path.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec["mechanism"]["noise_multiplier"] = 100.0  # tamper: CRC no longer matches
    lines[1] = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerCorruptedError, match="line 2"):
        _ledger(tmp_path)


def test_adaptive_mode_rules(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="fixed up front"):
        PrivacyLedger(BUDGET, accountant=Accountant.PLD)
    ledger = PrivacyLedger(BUDGET)
    with pytest.raises(InvalidParameterError, match="ApproxDP"):
        ledger.try_charge("x", ApproxDP(0.1, 1e-7))
    assert ledger.charges() == ()


def test_fixed_plan_pld_halting_admits_more(tmp_path: Path) -> None:
    adaptive = PrivacyLedger(BUDGET)
    fixed = PrivacyLedger(BUDGET, adaptivity=Adaptivity.FIXED_PLAN, accountant=Accountant.BEST)
    n_adaptive = n_fixed = 0
    while adaptive.try_charge(f"t{n_adaptive}", Gaussian(8.0)).admitted:
        n_adaptive += 1
    while fixed.try_charge(f"t{n_fixed}", Gaussian(8.0)).admitted:
        n_fixed += 1
    assert n_fixed > n_adaptive > 0
    assert fixed.spent() <= BUDGET.epsilon
    assert epsilon([Gaussian(8.0)] * n_fixed, BUDGET.delta, Accountant.BEST) <= BUDGET.epsilon


def test_threads_racing_never_exceed_budget() -> None:
    ledger = PrivacyLedger(BUDGET)
    results: list[bool] = []

    def worker(i: int) -> None:
        for j in range(10):
            results.append(ledger.try_charge(f"w{i}-{j}", TRIAL).admitted)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.spent() <= BUDGET.epsilon
    assert sum(results) == len(ledger.charges())
    assert not ledger.would_admit(TRIAL)


def test_profile_accountant_is_refused_with_adaptive_charges_at_construction() -> None:
    """Profile halting is only valid for a fixed plan (the δ split needs the whole sequence):
    refused up front with the adaptive filter, accepted with FIXED_PLAN."""
    from raydp_hpo.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="profile.*fixed"):
        PrivacyLedger(BUDGET, adaptivity=Adaptivity.ADAPTIVE, accountant=Accountant.PROFILE)
    ledger = PrivacyLedger(BUDGET, adaptivity=Adaptivity.FIXED_PLAN, accountant=Accountant.PROFILE)
    assert ledger.halting_accountant is Accountant.PROFILE


@pytest.mark.parametrize("accountant", ["best", "pld", "profile"])
def test_near_noiseless_charge_is_refused_not_raised(accountant):
    """A near-noiseless mechanism has no PLD composable with the others (its grid differs):
    the PLD candidate is inf, so the other accountants decide (here: far over budget), the
    charge is refused cleanly and the ledger is unchanged (used to raise
    UnsupportedMechanismError out of try_charge)."""
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.accounting.mechanisms import Gaussian, SubsampledGaussian

    ledger = PrivacyLedger(
        PrivacyBudget(3.0, 1e-5), adaptivity=Adaptivity.FIXED_PLAN,
        accountant=Accountant(accountant),
    )
    assert ledger.try_charge("a", SubsampledGaussian(1.0, 0.01, 100)).admitted
    before = ledger.spent()
    decision = ledger.try_charge("b", Gaussian(1e-4, 1))
    assert not decision.admitted
    assert ledger.spent() == before and len(ledger.charges()) == 1
