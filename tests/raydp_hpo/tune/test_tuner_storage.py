"""Where DPTuner stores an experiment by default, and its warning for temporary storage (no
Ray: the constructor only)."""

from __future__ import annotations

import tempfile
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
from ray import tune

from raydp_hpo._storage import STORAGE_ENV
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import EphemeralStorageWarning
from raydp_hpo.trainables.data import Dataset, split
from raydp_hpo.tune.tuner import DPTuner

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
DURABLE = Path("/srv") / f"raydp-hpo-test-{uuid.uuid4().hex[:8]}"  # never created


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return split(Dataset(rng.normal(size=(200, 4)).astype(np.float32),
                         rng.integers(0, 2, size=200), 2), 0.2, 0.2)


def make(data, **kwargs) -> DPTuner:
    return DPTuner(None, param_space=SPACE, search="random_stopping",
                   budget=PrivacyBudget(4.0, 1e-5), data=data, fresh_budget=True,
                   sizes_public=True, **kwargs)


def test_default_storage_is_home_raydp_results_not_the_working_dir(data, monkeypatch,
                                                                   tmp_path) -> None:
    """Before: ./raydp_results in the working dir — inside a Ray Job, Ray's temporary copy of
    the job's files, deleted later with the results and the ledger journal."""
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(DURABLE))
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EphemeralStorageWarning)  # a durable default: no warning
        tuner = make(data, experiment="e1")
    assert tuner.experiment_path == DURABLE / "raydp_results" / "e1"
    assert tuner._dedicated_journal().is_relative_to(DURABLE / "raydp_results")
    monkeypatch.setenv(STORAGE_ENV, str(DURABLE / "store"))
    assert make(data, experiment="e2").experiment_path == DURABLE / "store" / "e2"
    # an explicit storage_path wins over the variable
    assert make(data, experiment="e3", storage_path=DURABLE / "mine").experiment_path == (
        DURABLE / "mine" / "e3")


def test_temporary_storage_is_warned_about(data) -> None:
    storage = Path(tempfile.gettempdir()) / f"raydp-{uuid.uuid4().hex[:8]}"
    with pytest.warns(EphemeralStorageWarning, match="DPTuner storage_path.*may be deleted"):
        make(data, storage_path=storage)
    ray_job_dir = (DURABLE / "session_x/runtime_resources/working_dir_files/_ray_pkg_1/"
                   "raydp_results")
    with pytest.warns(EphemeralStorageWarning, match="Ray working dir"):
        make(data, storage_path=ray_job_dir)
