"""Journals written before ``Accountant.TIGHTEST`` existed store ``"accountant": "profile"``.

``data/accountant_profile.journal`` (with its ``.pld`` snapshot and ``.seal``) was written by
the code just before the rename: a fixed-plan ledger halting on ``Accountant.PROFILE`` at
(ε=3, δ=1e-5) with one charge, geometric random stopping (E[K]=10) over σ=1, q=0.01, T=1000,
admitted at ε = 2.841072647209511. It must reopen under ``TIGHTEST`` with its spend intact.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Gaussian
from raydp_hpo.errors import LedgerMismatchError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.ledger.journal import read_header

DATA = Path(__file__).parent / "data"
NAME = "accountant_profile.journal"
SPENT = 2.841072647209511  # as written by the old code


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    for suffix in ("", ".pld", ".seal"):
        shutil.copy(DATA / (NAME + suffix), tmp_path / (NAME + suffix))
    path = tmp_path / NAME
    assert read_header(path)["accountant"] == "profile"  # the old stored value
    return path


def test_old_profile_journal_reopens_under_tightest(journal: Path) -> None:
    budget = PrivacyBudget(3.0, 1e-5)
    # the explicit constructor with the new name: no mismatch error (it compared the raw
    # strings "profile" != "tightest" before the header value was read as the member)
    with PrivacyLedger(budget, journal, adaptivity=Adaptivity.FIXED_PLAN,
                       accountant=Accountant.TIGHTEST) as ledger:
        assert ledger.halting_accountant is Accountant.TIGHTEST
        assert ledger.spent() == pytest.approx(SPENT, rel=1e-9)
        # still a working ledger: a small charge is admitted and journaled
        assert ledger.try_charge("exp/extra", Gaussian(50.0), owner="exp").admitted
    with PrivacyLedger.open(journal) as reopened:  # settings read from the header
        assert reopened.halting_accountant is Accountant.TIGHTEST
        assert [c.charge_id for c in reopened.charges()] == ["exp/plan", "exp/extra"]
    assert read_header(journal)["accountant"] == "profile"  # the header is never rewritten


def test_old_profile_journal_still_refuses_other_settings(journal: Path) -> None:
    with pytest.raises(LedgerMismatchError, match="profile"):
        PrivacyLedger(PrivacyBudget(3.0, 1e-5), journal, adaptivity=Adaptivity.FIXED_PLAN,
                      accountant=Accountant.RDP)
