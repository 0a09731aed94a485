"""``raydp-hpo run`` and charge identity (issue #41, item 1): running an experiment file again
under the same name — its run directory deleted, or another storage path — is a new run that
pays again (on the old main: one charge, two releases); ``--resume`` attaches only to the
charges of the run its own run directory records."""

from __future__ import annotations

import contextlib
import json
import pickle
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.data import dataset_ledger_name
from raydp_hpo.tune.dataset_ledger import create_dataset_ledger

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # five small runs


def _file(tmp_path: Path, storage: Path, ledger: dict[str, Any] | None = None) -> Path:
    raw: dict[str, Any] = {
        "experiment": "again", "storage_path": str(storage),
        "data": {"source": "digits", "val_fraction": 0.2, "test_fraction": 0.2},
        "model": {"name": "mlp"},
        "search": {"algorithm": "one_shot_random"},
        "space": {"lr": {"loguniform": [0.05, 1.0]}, "epochs": 1, "batch_size": 64,
                  "max_grad_norm": 1.0, "optimizer": "sgd"},
        "budget": {"epsilon": 1.0, "delta": 1e-5},
    }
    if ledger is not None:
        raw["ledger"] = ledger
    path = tmp_path / f"e-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _kill(name: str) -> None:
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name, namespace="raydp_hpo"))


def _run(*argv: str) -> int:
    return main(["run", *argv, "--num-cpus", "2", "--progress-interval", "30"])


def test_rerun_after_deleting_the_run_dir_pays_again_and_resume_proves_its_run(
        ray_session, tmp_path: Path, capsys) -> None:
    storage = tmp_path / "store"
    journal = create_dataset_ledger("digits", PrivacyBudget(3.0, 1e-5), storage)
    path = _file(tmp_path, storage)
    run_dir = storage / "again"
    try:
        assert _run(str(path)) == EXIT_OK
        first = json.loads((run_dir / "run.json").read_text())
        shutil.rmtree(run_dir)  # the run directory is gone: the file is run again
        assert _run(str(path)) == EXIT_OK
        second = json.loads((run_dir / "run.json").read_text())
        ids = [c.charge_id for c in PrivacyLedger.read_only(journal).charges()]
        assert len(ids) == 2, f"two releases, {len(ids)} charge(s): {ids}"
        assert first["run_id"] != second["run_id"]
        assert ids == [f"again@{first['run_id']}/point", f"again@{second['run_id']}/point"]
        assert second["charge_prefix"] == f"again@{second['run_id']}/"
        assert "was already run on the ledger" in capsys.readouterr().out

        # --resume of the second run, its release removed: the run proves itself, but its
        # release is on the ledger: refused before Ray starts (one release per run)
        shutil.rmtree(run_dir / "public")
        capsys.readouterr()
        assert _run(str(path), "--resume") == EXIT_BAD_INPUT
        assert "the release of this run is already published" in capsys.readouterr().err
        assert len(PrivacyLedger.read_only(journal).charges()) == 2
        assert not (run_dir / "public").exists()

        # a run directory whose recorded run id is on no charge of the ledger: refused
        saved = pickle.loads((run_dir / "dptuner.pkl").read_bytes())
        (run_dir / "dptuner.pkl").write_bytes(pickle.dumps({**saved, "run_id": "0" * 16}))
        capsys.readouterr()
        assert _run(str(path), "--resume") == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "holds no charge of this run" in err and "'again@0000000000000000/'" in err
        assert "resume it with the ledger" in err and "which pays again" in err
        assert len(PrivacyLedger.read_only(journal).charges()) == 2
    finally:
        _kill(dataset_ledger_name("digits"))


def test_rerun_on_another_storage_path_pays_again_on_a_named_ledger(ray_session,
                                                                   tmp_path: Path) -> None:
    name = f"identity-{uuid.uuid4().hex[:6]}"
    journal = tmp_path / "named.journal"
    ledger = {"name": name, "journal": str(journal), "budget": {"epsilon": 4.0, "delta": 1e-5}}
    try:
        for storage in ("a", "b"):
            path = _file(tmp_path, tmp_path / storage, ledger)
            assert _run(str(path)) == EXIT_OK
        ids = [c.charge_id for c in PrivacyLedger.read_only(journal).charges()]
        assert len(ids) == 2, f"two releases, {len(ids)} charge(s): {ids}"
        runs = [json.loads((tmp_path / s / "again" / "run.json").read_text())
                for s in ("a", "b")]
        # a named ledger composes whole experiments (issue #38): one point per run
        assert ids == [f"again@{r['run_id']}/point" for r in runs]
    finally:
        _kill(name)
