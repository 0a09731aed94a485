"""The CLI's storage defaults: experiment files default to ~/raydp_results ($RAYDP_HPO_STORAGE),
`ledger list` finds every journal a run or DPTuner writes there, and a temporary storage path
is warned about. No Ray started."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest
import yaml

from raydp_hpo._storage import STORAGE_ENV
from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.experiment import parse_experiment
from raydp_hpo.cli.main import EXIT_OK, main
from raydp_hpo.errors import EphemeralStorageWarning
from raydp_hpo.ledger.actor import charge_before_start
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from tests.raydp_hpo.cli.bad_input_catalogue import BASE

DURABLE = Path("/srv") / f"raydp-hpo-test-{uuid.uuid4().hex[:8]}"  # never created


def _raw(**changes: object) -> dict:
    raw = copy.deepcopy(BASE)
    raw.pop("storage_path")
    raw.update(changes)
    return raw


def test_experiment_files_default_to_home_raydp_results(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(DURABLE))
    monkeypatch.chdir(tmp_path)
    spec = parse_experiment(_raw())
    assert Path(spec.storage_path) == DURABLE / "raydp_results"
    assert spec.run_dir == DURABLE / "raydp_results" / "bad-input"
    assert spec.ledger_journal().parent == DURABLE / "raydp_results" / "ledgers"
    assert parse_experiment(_raw(storage_path=None)).storage_path == spec.storage_path
    monkeypatch.setenv(STORAGE_ENV, str(DURABLE / "env"))
    assert Path(parse_experiment(_raw()).storage_path) == DURABLE / "env"
    assert Path(parse_experiment(_raw(storage_path="rel")).storage_path) == tmp_path / "rel"
    # the default is read when a file is validated, not when the module is imported
    assert parse_experiment(_raw(storage_path=None)).storage_path == str(DURABLE / "env")


def test_ledger_list_finds_every_journal_of_the_default_storages(monkeypatch, tmp_path,
                                                                  capsys) -> None:
    """Journals written by the real ledger code where runs put them: a DPTuner experiment's
    dedicated journal (<storage>/<experiment>/ledger.journal, charged as DPTuner charges its
    plan) and a dataset ledger (<storage>/ledgers/*.journal) under $RAYDP_HPO_STORAGE, one
    under ~/raydp_results, and one under the old default ./raydp_results."""
    home, store, cwd = tmp_path / "home", tmp_path / "store", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAYDP_HPO_HOME", str(home / ".raydp_hpo"))
    monkeypatch.setenv(STORAGE_ENV, str(store))
    monkeypatch.chdir(cwd)
    budget, mech = PrivacyBudget(4.0, 1e-5), SubsampledGaussian(1.0, 0.01, 100)
    dedicated = store / "exp-a" / "ledger.journal"
    charge_before_start(budget, dedicated, adaptivity=Adaptivity.FIXED_PLAN,
                        accountant=Accountant.PROFILE, charge_id="exp-a/plan", mechanism=mech,
                        owner="exp-a")
    journals = [dedicated, store / "ledgers" / "data-mnist1d-abc.journal",
                home / "raydp_results" / "ledgers" / "data-digits-def.journal",
                cwd / "raydp_results" / "old-exp" / "ledger.journal"]
    for journal in journals[1:]:
        journal.parent.mkdir(parents=True)
        with PrivacyLedger(budget, journal) as ledger:
            ledger.charge("x/plan", mech)
    assert main(["ledger", "list"]) == EXIT_OK
    out = capsys.readouterr().out
    for journal in journals:
        assert str(journal.resolve()) in out, out
    assert out.count("4") >= 4 and "unreadable" not in out


def test_dry_run_warns_about_temporary_storage(tmp_path, capsys) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(_raw(storage_path=str(tmp_path / "store"))))
    with warnings.catch_warnings():
        warnings.simplefilter("default", EphemeralStorageWarning)  # shown, not ignored
        assert main(["run", str(exp), "--dry-run"]) == EXIT_OK
    captured = capsys.readouterr()
    out = captured.out
    assert f"[raydp-hpo] WARNING: storage_path {tmp_path / 'store'} may be deleted" in out
    assert f"[raydp-hpo] WARNING: ledger journal {tmp_path / 'store' / 'ledgers'}" in out
    assert (out + captured.err).count("may be deleted") == 2, out + captured.err
    # still a Python warning under the CLI: filters (-W error) apply to it as before
    exp.write_text(yaml.safe_dump(_raw(storage_path=str(tmp_path / "other"))))
    with warnings.catch_warnings(), pytest.raises(EphemeralStorageWarning, match="other"):
        warnings.simplefilter("error", EphemeralStorageWarning)
        main(["run", str(exp), "--dry-run"])


def test_cli_prints_each_warning_once(tmp_path) -> None:
    """The real CLI (a subprocess, Python's default warning filters): each warning is one
    `[raydp-hpo] WARNING:` line, not that line plus a Python warning with its source line."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(_raw(storage_path=str(tmp_path / "store"))))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3]),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "raydp_hpo.cli.main", "run", str(exp),
                           "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == EXIT_OK, proc.stderr
    both = proc.stdout + proc.stderr
    assert both.count("may be deleted") == 2, both  # storage path, ledger journal: once each
    assert both.count("[raydp-hpo] WARNING: ") == 2, both
    assert "EphemeralStorageWarning" not in both and "args.func(args)" not in both, both
