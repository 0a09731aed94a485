"""Release markers: at most one release per run id, claimed atomically on the ledger.

A run's charges carry its run id, and a resume proves it; but a run directory copied and
resumed twice continues *one* run under *one* charge twice. The release marker
(:meth:`PrivacyLedger.claim_release`, a ``release`` record in the ledger's chain) lets exactly
one attempt publish. It charges nothing: every ε/δ figure, a dataset ledger's slots, ``ledger
verify`` and replay are what they are without it. Journal file here; PostgreSQL below (marked
``postgres``). (On the old main ``claim_release`` does not exist: every test here fails.)
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Gaussian, SubsampledGaussian
from raydp_hpo.cli.main import EXIT_OK, main
from raydp_hpo.errors import LedgerCorruptedError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.ledger.journal import scan_journal

BUDGET = PrivacyBudget(6.0, 1e-5)
POINT = Gaussian(3.0)


def _experiments(journal: Path | str | None) -> PrivacyLedger:
    return PrivacyLedger(BUDGET, journal, adaptivity=Adaptivity.EXPERIMENTS,
                         accountant=Accountant.TIGHTEST)


def test_one_claim_per_run_and_the_spend_is_unchanged(tmp_path: Path) -> None:
    journal = tmp_path / "data.journal"
    twin = _experiments(None)  # the same charges, no marker
    with _experiments(journal) as led:
        led.charge("e@aa/point", POINT)
        twin.charge("e@aa/point", POINT)
        before = led.report()
        twin.report()  # the same calls, so the PLD is composed in the same order
        first = led.claim_release("e@aa", "host:/runs/e/public", "e", "t1")
        assert first.granted and not first.replayed
        assert first.record.seq == 2 and first.record.release_id == "e@aa/release"
        # a second attempt of the same run (a copy of its directory): refused, the first named
        second = led.claim_release("e@aa", "host:/copy/e/public", "e", "t2")
        assert not second.granted and second.record == first.record
        # the same attempt asking again (a retried call): a replay, still one marker
        again = led.claim_release("e@aa", "host:/runs/e/public", "e", "t1")
        assert again.granted and again.replayed and again.record == first.record
        assert led.report().epsilon_by_accountant == before.epsilon_by_accountant
        assert led.spent() == before.spent_epsilon and len(led.charges()) == 1
        # the next experiment is the 2nd charge (its δ share is δ₂), marker or not
        nxt, ref = led.charge("e@bb/point", POINT), twin.charge("e@bb/point", POINT)
        assert nxt.epsilon_after == ref.epsilon_after
        assert led.report().epsilon_by_accountant == twin.report().epsilon_by_accountant
        assert led.charges()[-1].seq == 3  # a charge's seq is its record number
        assert led.claim_release("e@bb", "h:/b", "e", "t3").granted  # another run: its own
    # durable: a reopened ledger and a read-only replay hold both markers and the same spend
    with PrivacyLedger.open(journal) as again_led:
        assert [r.run for r in again_led.releases()] == ["e@aa", "e@bb"]
        assert not again_led.claim_release("e@aa", "h:/x", "e", "t9").granted
        assert again_led.spent() == twin.spent()
    replay = PrivacyLedger.read_only(journal)
    assert replay.release_of("e@aa") == first.record and replay.release_of("e@cc") is None
    assert [c.charge_id for c in replay.charges()] == ["e@aa/point", "e@bb/point"]
    assert [r.get("kind") for r in scan_journal(journal).records] == [
        "charge", "release", "charge", "release"]


def test_ledger_verify_and_show_count_no_marker_as_a_charge(tmp_path: Path, capsys) -> None:
    journal = tmp_path / "data.journal"
    with _experiments(journal) as led:
        led.charge("e@aa/point", POINT)
        led.claim_release("e@aa", "host:/runs/e/public", "e", "t1")
        spent = led.spent()
    assert main(["ledger", "verify", str(journal), "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["charges"] == 1 and out["releases"] == 1
    assert out["spent_epsilon"] == spent
    assert main(["ledger", "verify", str(journal)]) == EXIT_OK
    assert "1 charge records, 1 run release(s) (markers: no charge)" in capsys.readouterr().out
    assert main(["ledger", "show", str(journal)]) == EXIT_OK
    shown = capsys.readouterr().out
    assert "charges           1" in shown and "e@aa/release  released to host:/runs/e/public" in (
        shown)


def test_racing_claims_of_one_run_grant_exactly_one(tmp_path: Path) -> None:
    with _experiments(tmp_path / "data.journal") as led:
        led.charge("e@aa/point", POINT)
        go = threading.Barrier(8)
        got: list[bool] = []

        def claim(k: int) -> None:
            go.wait()
            got.append(led.claim_release("e@aa", f"h:/copy{k}", "e", f"tok{k}").granted)

        threads = [threading.Thread(target=claim, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == [False] * 7 + [True]
        assert len(led.releases()) == 1


def test_a_pld_snapshot_with_markers_between_charges_restores_the_same_spend(
        tmp_path: Path) -> None:
    journal = tmp_path / "plan.journal"
    mech = SubsampledGaussian(1.0, 0.01, 100)
    with PrivacyLedger(BUDGET, journal, adaptivity=Adaptivity.FIXED_PLAN,
                       accountant=Accountant.PLD) as led:
        led.charge("a@1/plan", mech)
        led.claim_release("a@1", "h:/a", "a", "t")
        led.charge("b@2/plan", mech)
        spent = led.spent()
    assert journal.with_name(journal.name + ".pld").exists()
    with PrivacyLedger.open(journal) as again:
        assert again.spent() == pytest.approx(spent, rel=1e-9)
        assert again._pld_snapshot_seq == 2  # the snapshot was used, covering both charges


def test_a_repeated_marker_in_a_journal_is_corruption(tmp_path: Path) -> None:
    journal = tmp_path / "forged.journal"
    with _experiments(journal) as led:
        led.charge("e@aa/point", POINT)
        led.claim_release("e@aa", "h:/a", "e", "t1")
        # what a writer that skipped the check would leave: a second marker of the run
        led._journal.append_charge({"run": "e@aa", "time": 1.0, "where": "h:/b",  # type: ignore[union-attr]
                                    "owner": "e", "token": "t2"}, kind="release")
    with pytest.raises(LedgerCorruptedError, match="repeats the release of run 'e@aa'"):
        PrivacyLedger.read_only(journal)


# -- PostgreSQL ---------------------------------------------------------------------------------
@pytest.fixture()
def as_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.raydp_hpo.ledger.pg_server import WRITER

    monkeypatch.setenv("PGUSER", WRITER)


@pytest.mark.postgres
def test_postgres_claims_race_across_connections_and_one_wins(
        server, as_writer: None, capsys) -> None:  # type: ignore[no-untyped-def]
    uri = server.uri("release-race")
    ledgers = [_experiments(uri) for _ in range(6)]  # one connection each, like 6 processes
    try:
        ledgers[0].charge("e@aa/point", POINT)
        spent = ledgers[0].spent()
        go = threading.Barrier(len(ledgers))
        got: list[tuple[bool, int]] = []

        def claim(k: int) -> None:
            go.wait()
            c = ledgers[k].claim_release("e@aa", f"h:/copy{k}", "e", f"tok{k}")
            got.append((c.granted, c.record.seq))

        threads = [threading.Thread(target=claim, args=(k,)) for k in range(len(ledgers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(g for g, _ in got) == [False] * (len(ledgers) - 1) + [True]
        assert {seq for _, seq in got} == {2}  # every refusal names the one marker
        # the spend is unchanged, and a new charge is still the 2nd experiment's
        ledgers[1].charge("e@bb/point", POINT)
        twin = _experiments(None)
        twin.charge("e@aa/point", POINT)
        twin.charge("e@bb/point", POINT)
        for led in ledgers:
            led.refresh()
            assert led.spent() == twin.spent() and led.spent() > spent
            assert [r.run for r in led.releases()] == ["e@aa"]
    finally:
        for led in ledgers:
            led.close()
    replay = PrivacyLedger.read_only(uri)
    assert [c.charge_id for c in replay.charges()] == ["e@aa/point", "e@bb/point"]
    assert main(["ledger", "verify", uri, "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["charges"] == 2 and out["releases"] == 1
