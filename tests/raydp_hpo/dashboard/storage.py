"""A storage folder as runs leave it, from real journaled ledgers (no Ray): a dataset ledger
charged by two experiments, an experiment with a budget of its own, each released experiment's
``public/`` written by the real writer (:func:`raydp_hpo.tune.publish.write_public_files`) and
private artefacts holding values that must never reach a page."""

from __future__ import annotations

import json
from pathlib import Path

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Gaussian,
    Laplace,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.tune.publish import public_manifest, write_public_files
from raydp_hpo.tune.tuner import PrivacyCertificate

BUDGET = PrivacyBudget(8.0, 1e-5)
#: Values in private artefacts: no page may show them.
PRIVATE_SCORE = 0.987654321
PRIVATE_ACCURACY = 0.876543219
DATASET_LEDGER = "data-digits-0123456789ab"


def release_experiment(storage: Path, name: str, *, spent: float, accuracy: float | None) -> Path:
    """``<storage>/<name>``: public/ (release.json, certificate.json) and private artefacts."""
    run = storage / name
    trial = SubsampledGaussian(1.0, 0.08, 13)
    plan = RandomStopping(trial, StoppingDistribution.GEOMETRIC, 2.0)
    cert = PrivacyCertificate(
        algorithm="random_stopping", paper="Papernot & Steinke 2022", description="one charge",
        budget=BUDGET, charges=((f"{name}/plan", plan),),
        epsilon_rdp=epsilon(plan, 1e-5, Accountant.RDP),
        epsilon_pld=epsilon(plan, 1e-5, Accountant.PLD),
        ledger_name=DATASET_LEDGER, ledger_spent_epsilon=spent,
        ledger_halting_rule="experiments/tightest")
    manifest = public_manifest(
        hyperparameters={"lr": 0.125, "epochs": 3, "noise_multiplier": 1.0},
        certificate=cert.to_dict(), budget_exhausted=False,
        dp_test_accuracy=None if accuracy is None else {"value": accuracy, "epsilon": 0.5},
        model_released=False)
    write_public_files(run / "public", manifest, None)
    (run / "evaluation_private.json").write_text(json.dumps(
        {"test_accuracy": PRIVATE_ACCURACY, "covered_by_certificate": False, "note": "PRIVATE"}))
    (run / "run.json").write_text(json.dumps({"experiment": name,
                                             "ledger_journal": str(run / "ledger.journal")}))
    trial_dir = run / "tune" / "trial_0"
    trial_dir.mkdir(parents=True)
    (trial_dir / "result.json").write_text(json.dumps({"val_accuracy": PRIVATE_SCORE}) + "\n")
    return run


def make_storage(storage: Path, *, dataset_charges: int = 3) -> dict[str, Path]:
    """The journals: a dataset ledger (``ledgers/``) charged by ``exp-a`` and ``exp-b``, and
    ``exp-c``'s own ledger; returns them by name."""
    dataset = storage / "ledgers" / f"{DATASET_LEDGER}.journal"
    dataset.parent.mkdir(parents=True)
    with PrivacyLedger(BUDGET, dataset, adaptivity=Adaptivity.FIXED_PLAN) as ledger:
        for i in range(dataset_charges):
            owner = "exp-a" if i % 2 == 0 else "exp-b"
            ledger.charge(f"{owner}/trial-{i}", Gaussian(20.0 + i), owner=owner)
        spent = ledger.spent()
    release_experiment(storage, "exp-a", spent=spent, accuracy=0.75)
    release_experiment(storage, "exp-b", spent=spent, accuracy=None)
    own = storage / "exp-c" / "ledger.journal"
    own.parent.mkdir(parents=True)
    with PrivacyLedger(PrivacyBudget(2.0, 1e-6), own) as ledger:
        ledger.charge("exp-c/plan", Laplace(0.5), owner="exp-c")
        ledger.charge("exp-c/test_accuracy", Laplace(0.25), owner="exp-c")
        c_spent = ledger.spent()
    release_experiment(storage, "exp-c", spent=c_spent, accuracy=0.5)
    return {"dataset": dataset, "own": own}


def tamper(journal: Path) -> None:
    """Change one digit of the first charge's ε after, keeping the line well-formed JSON: the
    hash chain (and only it) catches it."""
    lines = journal.read_bytes().split(b"\n")
    record = lines[1]
    at = record.index(b'"epsilon_after":') + len(b'"epsilon_after":')
    digit = record[at:at + 1]
    assert digit.isdigit(), record[:200]
    lines[1] = record[:at] + (b"9" if digit != b"9" else b"8") + record[at + 1:]
    journal.write_bytes(b"\n".join(lines))
