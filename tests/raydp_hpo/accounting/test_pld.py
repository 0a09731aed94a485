"""PLD composition for the ledger: the vectorised ε(δ), incremental candidates, snapshots, and
a PLD-halting ledger that restarts from its snapshot (issue #11: admission flat, restart fast)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Gaussian,
    Laplace,
    PureDP,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.accounting.pld import PldComposer, _leaf_pld, epsilon_for_delta
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger, pld_snapshot_path

MECHS = [
    Laplace(0.5),
    PureDP(1.0),
    Gaussian(1.0),
    Gaussian(0.5, count=3),
    SubsampledGaussian(0.8, 0.1, 100),
    SubsampledGaussian(5.0, 0.01, 1000),
]


@pytest.mark.parametrize("mech", MECHS, ids=repr)
@pytest.mark.parametrize("delta", [1e-12, 1e-5, 1e-2, 0.5])
def test_vectorised_epsilon_is_dp_accountings_rounded_up(mech: object, delta: float) -> None:
    """Pinned to dp-accounting's own ε(δ) on the same PLD: never below it, at most 1e-8
    relative above it (the deliberate 1e-9 round-up plus summation order)."""
    pld = _leaf_pld(mech)
    reference = float(pld.get_epsilon_for_delta(delta))
    ours = epsilon_for_delta(pld, delta)
    assert ours >= reference
    assert ours == pytest.approx(reference, rel=1e-8, abs=1e-8)


def test_candidate_composition_equals_adding_it() -> None:
    base = PldComposer()
    for m in (SubsampledGaussian(3.0, 0.02, 300), Gaussian(4.0), Laplace(0.1)):
        base.add(m)
    extra = SubsampledGaussian(6.0, 0.01, 800)
    trial = base.with_candidate(extra)
    plain = base.copy()
    plain.add(extra)
    assert trial.epsilon(1e-5) == pytest.approx(plain.epsilon(1e-5), rel=1e-12)
    assert base.folded_count == 3 and trial.folded_count == 4  # base is unchanged


def test_identical_non_pld_mechanisms_compose_as_one_group() -> None:
    """Grouped (self-composed) equals one-by-one composition, up to the tail truncation."""
    rs = RandomStopping(Gaussian(4.0), StoppingDistribution.GEOMETRIC, 5)
    grouped = PldComposer()
    for _ in range(3):
        grouped.add(rs)
    share = 0.5 * 1e-5 / 3
    from raydp_hpo.accounting.pld import _approx_dp_pld

    p = _approx_dp_pld(rs, share)
    by_hand = p.compose(p).compose(p).get_epsilon_for_delta(1e-5)
    assert grouped.epsilon(1e-5) == pytest.approx(by_hand, rel=1e-6)


def test_snapshot_round_trip_and_refusals() -> None:
    c = PldComposer()
    for m in (SubsampledGaussian(3.0, 0.02, 300), Laplace(0.1), Gaussian(2.0)):
        c.add(m)
    binding = {"header": "a" * 64, "seq": 3, "chain": "b" * 64}
    data = c.snapshot(binding)
    back = PldComposer.from_snapshot(data, binding)
    assert back is not None and back.folded_count == 3
    assert back.epsilon(1e-5) == c.epsilon(1e-5)
    assert PldComposer.from_snapshot(data, {**binding, "seq": 2}) is None  # stale
    assert PldComposer.from_snapshot(data, {**binding, "chain": "c" * 64}) is None  # foreign
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    assert PldComposer.from_snapshot(bytes(flipped), binding) is None  # damaged
    assert PldComposer.from_snapshot(b"", binding) is None


BUDGET = PrivacyBudget(1e3, 1e-5)
CHARGES = [SubsampledGaussian(4.0 + i, 0.01, 200 + 10 * i) for i in range(6)]


def _pld_ledger(path: Path, accountant: Accountant = Accountant.PLD) -> PrivacyLedger:
    return PrivacyLedger(BUDGET, path, adaptivity=Adaptivity.FIXED_PLAN, accountant=accountant)


@pytest.mark.parametrize("accountant", [Accountant.PLD, Accountant.BEST])
def test_restart_loads_the_snapshot_instead_of_rebuilding(tmp_path: Path,
                                                          accountant: Accountant) -> None:
    journal = tmp_path / "l.journal"
    with _pld_ledger(journal, accountant) as led:
        for i, m in enumerate(CHARGES):
            led.charge(f"c{i}", m)
        live = led.spent()
    assert pld_snapshot_path(journal).exists()
    _leaf_pld.cache_clear()
    with PrivacyLedger.open(journal) as again:
        assert again.spent() == live
        assert _leaf_pld.cache_info().misses == 0  # no charge's PLD was rebuilt


def test_admission_reuses_the_candidate_composition(tmp_path: Path) -> None:
    """The admitted charge's PLD was convolved once, by the admission check: nothing is left
    to fold (before: every admitted charge was composed a second time on the next check)."""
    with _pld_ledger(tmp_path / "l.journal") as led:
        for i, m in enumerate(CHARGES[:3]):
            led.charge(f"c{i}", m)
            assert led._pld._pending == []  # noqa: SLF001


def test_snapshot_behind_the_journal_is_extended(tmp_path: Path) -> None:
    journal = tmp_path / "l.journal"
    with _pld_ledger(journal) as led:
        for i, m in enumerate(CHARGES[:3]):
            led.charge(f"c{i}", m)
    with PrivacyLedger.open(journal) as led:  # RDP figure not needed: no PLD built here
        snapshot = pld_snapshot_path(journal).read_bytes()
        for i, m in enumerate(CHARGES[3:], start=3):
            led.charge(f"c{i}", m)
        full = led.spent()
    pld_snapshot_path(journal).write_bytes(snapshot)  # the snapshot of 3 of 6 charges
    with PrivacyLedger.open(journal) as led:
        assert led.spent() == pytest.approx(full, rel=1e-9)
        assert led._pld_snapshot_seq == 3  # noqa: SLF001 - used, then extended


def test_foreign_or_damaged_snapshot_is_ignored(tmp_path: Path) -> None:
    a, b = tmp_path / "a.journal", tmp_path / "b.journal"
    with _pld_ledger(a) as led:
        led.charge("x", Laplace(5.0))  # a much larger spend than b's
    with _pld_ledger(b) as led:
        for i, m in enumerate(CHARGES[:2]):
            led.charge(f"c{i}", m)
        honest = led.spent()
    pld_snapshot_path(b).write_bytes(pld_snapshot_path(a).read_bytes())
    with PrivacyLedger.open(b) as led:
        assert led.spent() == pytest.approx(honest, rel=1e-9)
    raw = bytearray(pld_snapshot_path(b).read_bytes())
    raw[-5] ^= 0xFF
    pld_snapshot_path(b).write_bytes(bytes(raw))
    with PrivacyLedger.open(b) as led:
        assert led.spent() == pytest.approx(honest, rel=1e-9)


def test_eager_open_rebuilds_instead_of_trusting_the_snapshot(tmp_path: Path) -> None:
    from raydp_hpo.ledger.filter import CurveCheck

    journal = tmp_path / "l.journal"
    with _pld_ledger(journal) as led:
        for i, m in enumerate(CHARGES[:2]):
            led.charge(f"c{i}", m)
        live = led.spent()
    _leaf_pld.cache_clear()
    with PrivacyLedger.open(journal, curve_check=CurveCheck.EAGER) as again:
        assert again.spent() == pytest.approx(live, rel=1e-9)
        assert _leaf_pld.cache_info().misses == 2  # every charge's PLD was rebuilt


def test_overlap_add_composition_matches_dp_accountings() -> None:
    """_compose (overlap-add) against PrivacyLossDistribution.compose (FFT) on a wide
    composed PLD and a narrow candidate: never below dp-accounting's own figure on its own
    composition, and within 1e-8 relative of it (FFT rounding ~1e-10, plus the 1e-9 round-up
    of epsilon_for_delta)."""
    from raydp_hpo.accounting.pld import _compose

    wide = _leaf_pld(SubsampledGaussian(2.0, 0.05, 2000))
    for narrow in (_leaf_pld(SubsampledGaussian(8.0, 0.01, 100)), _leaf_pld(Laplace(0.2)),
                   _leaf_pld(Gaussian(3.0))):
        ours = _compose(wide, narrow)
        theirs = wide.compose(narrow)
        assert ours is not None
        for delta in (1e-8, 1e-5, 1e-2):
            reference = float(theirs.get_epsilon_for_delta(delta))
            assert epsilon_for_delta(ours, delta) >= reference
            assert epsilon_for_delta(ours, delta) == pytest.approx(reference, rel=1e-8)


@pytest.mark.parametrize("accountant", [Accountant.PLD, Accountant.BEST, Accountant.PROFILE])
@pytest.mark.parametrize("extend", [False, True])
def test_a_restart_from_the_snapshot_keeps_the_charges_without_a_pld(
    tmp_path: Path, accountant: Accountant, extend: bool
) -> None:
    """Regression: a snapshot stores only the folded PLD-capable part, so the random-stopping
    plan (no PLD: an (ε, δ) conversion at query time) it covered was dropped on restart and
    the PLD figure fell to that of the other charges (0 with none): the ledger then reported
    ε = 0 spent and would have admitted the whole budget again. The reopened ledger must give
    the figures of the same journal rebuilt without a snapshot."""
    plan = RandomStopping(SubsampledGaussian(20.0, 0.01, 100), StoppingDistribution.POISSON, 3.0)
    journal = tmp_path / "l.journal"
    with _pld_ledger(journal, accountant) as led:
        led.charge("exp/plan", plan)
        if extend:  # a PLD-capable charge too (Laplace: its snapshot always loads)
            led.charge("c0", Laplace(0.5))
        live = led.spent()
        live_pld = led.report().epsilon_by_accountant["pld"]
    assert pld_snapshot_path(journal).exists()
    with PrivacyLedger.open(journal) as again:
        assert again._pld_snapshot_seq == 0  # noqa: SLF001 - nothing read yet (lazy)
        assert again.spent() == pytest.approx(live, rel=1e-12)
        assert again._pld_snapshot_seq == (2 if extend else 1)  # noqa: SLF001 - it was used
        report = again.report().epsilon_by_accountant
        assert report["pld"] == pytest.approx(live_pld, rel=1e-12) and report["pld"] > 0.0
    pld_snapshot_path(journal).unlink()
    with PrivacyLedger.open(journal) as rebuilt:
        assert rebuilt.spent() == pytest.approx(live, rel=1e-12)
        assert rebuilt.report().epsilon_by_accountant["pld"] == pytest.approx(live_pld, rel=1e-12)


@pytest.mark.parametrize("charge", [Gaussian(4.0), SubsampledGaussian(1.0, 0.01, 1000)],
                         ids=repr)
def test_a_snapshot_with_round_off_below_zero_is_used_and_never_lower(
    tmp_path: Path, charge: object
) -> None:
    """A composed PLD carries FFT round-off below zero (~1e-17); such snapshots used to be
    refused (the restart rebuilt every charge's PLD). They load now, with the negatives raised
    to 0, which only adds mass: the restored ε is never below the live one."""
    journal = tmp_path / "l.journal"
    with _pld_ledger(journal) as led:
        led.charge("a", charge)
        live = led.spent()
        negative = min(float(np.min(led._pld._composed._pmf_remove.to_dense_pmf()._probs)),  # noqa: SLF001
                       float(np.min(led._pld._composed._pmf_add.to_dense_pmf()._probs)))  # noqa: SLF001
    assert negative < 0.0  # the case this test is about
    with PrivacyLedger.open(journal) as again:
        restored = again.spent()
        assert again._pld_snapshot_seq == 1  # noqa: SLF001 - the snapshot was used
    assert restored >= live and restored == pytest.approx(live, rel=1e-9)
    data = bytearray(pld_snapshot_path(journal).read_bytes())
    from raydp_hpo.accounting.pld import PldComposer as Composer

    assert Composer.from_snapshot(bytes(data), {"header": "x"}) is None  # binding still checked
