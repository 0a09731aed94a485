"""``raydp-hpo report``: replay of a real ledger journal, plots, report.md (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution, SubsampledGaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.cli.report import replay_spend, write_report
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.tune.tuner import PrivacyCertificate

BUDGET = PrivacyBudget(8.0, 1e-5)


def _run_dir(tmp_path: Path) -> Path:
    """A run dir as `raydp-hpo run` leaves it, from a real journaled ledger."""
    run = tmp_path / "exp"
    trial = SubsampledGaussian(1.0, 0.08, 13)
    plan = RandomStopping(trial, StoppingDistribution.GEOMETRIC, 2.0)
    with PrivacyLedger(BUDGET, run / "ledger.journal") as ledger:
        ledger.charge("exp/plan", plan, owner="exp")
        ledger.charge("other/t1", trial, owner="other")
        spent = ledger.spent()
    cert = PrivacyCertificate(
        algorithm="random_stopping", paper="P&S 2022", description="one charge",
        budget=BUDGET, charges=(("exp/plan", plan),),
        epsilon_rdp=epsilon(plan, 1e-5, Accountant.RDP),
        epsilon_pld=epsilon(plan, 1e-5, Accountant.PLD),
        ledger_name="l", ledger_spent_epsilon=spent, ledger_halting_rule="adaptive/rdp")
    release = {"hyperparameters": {"lr": 0.5, "epochs": 1}, "model_path": None,
               "budget_exhausted": False, "certificate": cert.to_dict()}
    (run / "release.json").write_text(json.dumps(release))
    (run / "evaluation_private.json").write_text(json.dumps(
        {"test_accuracy": 0.8125, "covered_by_certificate": False, "note": "PRIVATE"}))
    (run / "run.json").write_text(json.dumps({"experiment": "exp",
                                             "ledger_journal": str(run / "ledger.journal")}))
    for i, accs in enumerate(([0.2, 0.3], [0.25, 0.4])):
        d = run / "tune" / f"trial_{i}"
        d.mkdir(parents=True)
        # trial 0 under the metric's name today, trial 1 as runs before the rename wrote it
        key = "trial_epsilon_rdp" if i == 0 else "epsilon"
        rows = [{"trial_id": f"t{i}", "epoch": e + 1, "val_accuracy": a, key: 1.0 + e}
                for e, a in enumerate(accs)]
        (d / "result.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_replay_matches_the_live_ledger(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    budget, points = replay_spend(run / "ledger.journal")
    assert budget == BUDGET
    assert [p.charge_id for p in points] == ["", "exp/plan", "other/t1"]
    with PrivacyLedger.open(run / "ledger.journal") as ledger:
        final = ledger.report().epsilon_by_accountant
    for key in ("rdp", "rdp_filter", "pld"):
        assert points[-1].epsilon[key] == pytest.approx(final[key], rel=1e-9)
    rdp = [p.epsilon["rdp"] for p in points]
    assert rdp == sorted(rdp)  # spend never decreases


def test_report_writes_markdown_and_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    run = _run_dir(tmp_path)
    files = write_report(run)
    assert files.budget_plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert files.trials_plot is not None and files.trials_plot.stat().st_size > 10_000
    md = files.markdown.read_text()
    assert "Privacy certificate" in md and "PRIVATE ARTEFACT" in md
    assert "| lr | `0.5` |" in md and "exp/plan" in md
    # the certified figure is named (the adaptive RDP filter's), the others are references
    rdp = epsilon(RandomStopping(SubsampledGaussian(1.0, 0.08, 13), StoppingDistribution.GEOMETRIC,
                                 2.0), 1e-5, Accountant.RDP)
    assert f"**ε certified = {rdp:.4f}** (rdp; the ledger halts on adaptive/rdp" in md
    assert "- references: ε (RDP)" in md
    # the noiseless test accuracy is not listed as part of the covered release
    public_part = md.split("## Public release (covered by the certificate)")[1].split("## ")[0]
    assert "test accuracy" not in public_part
    evaluation = md.split("## Evaluation (NOT covered by the certificate")[1].split("## ")[0]
    assert "0.8125" in evaluation  # read from evaluation_private.json
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == EXIT_OK
    assert (tmp_path / "out" / "report.md").exists()
    assert main(["report", str(tmp_path / "nope")]) == EXIT_BAD_INPUT
    assert "no release.json" in capsys.readouterr().err
