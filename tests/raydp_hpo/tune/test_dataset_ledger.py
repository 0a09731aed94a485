"""The budget belongs to the data: DPTuner charges the dataset's ledger by default, the same
one ``raydp-hpo run`` charges (issue #31); a fresh per-experiment budget is explicit."""

from __future__ import annotations

import contextlib
import logging
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.experiment import DataSpec
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.data import (
    Dataset,
    DataSplits,
    dataset_ledger_name,
    load_digits,
    load_mnist1d,
    load_parquet,
    split,
)
from raydp_hpo.tune.dataset_ledger import dataset_ledger_journal
from raydp_hpo.tune.tuner import DPTuner

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(2.0, 1e-5)


def _unnamed() -> DataSplits:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    return split(Dataset(x, (x[:, 0] > 0).astype(np.int64), 2), 0.2, 0.2)


def test_loaders_name_their_data_as_experiment_files_do(tmp_path: Path) -> None:
    """The Python loaders and experiment files name the same data the same way, so DPTuner
    and `raydp-hpo run` on it charge one ledger."""
    mnist = split(load_mnist1d(num_samples=200, seed=3), 0.2, 0.2)
    assert mnist.name == "mnist1d:size=200:generator_seed=3"
    assert dataset_ledger_name(mnist.name) == DataSpec(
        "mnist1d", size=200, generator_seed=3).ledger_name()
    digits = split(load_digits())
    assert digits.name == "digits" == DataSpec("digits").fingerprint()
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [0.1, 0.2, 0.3, 0.4], "y": [0, 1, 0, 1]}), path)
    table = load_parquet(str(path), label_column="y")
    assert table.name == f"parquet:file://{path.resolve()}"
    assert table.name == DataSpec("parquet", uri=str(path), label_column="y").fingerprint()
    # every split and subset keeps the name: the budget is the whole dataset's
    assert {mnist.train.name, mnist.val.name, mnist.test.name} == {mnist.name}


def test_the_default_ledger_is_the_datasets(tmp_path: Path) -> None:
    data = split(load_mnist1d(num_samples=200, seed=3), 0.2, 0.2)
    tuner = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=tmp_path)
    assert tuner.ledger_name == dataset_ledger_name(data.name)
    named = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=_unnamed(), storage_path=tmp_path, dataset="census-2024",
                    sizes_public=True)
    assert named.ledger_name == dataset_ledger_name("census-2024")
    assert named.ledger_name.startswith("data-census-2024-")
    fresh = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=tmp_path, experiment="own", fresh_budget=True)
    assert fresh.ledger_name == "ledger-own"


def test_unnamed_data_needs_a_choice_of_budget() -> None:
    with pytest.raises(InvalidParameterError, match="whose budget") as err:
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed())
    for hint in ("dataset=", "ledger=", "fresh_budget=True"):
        assert hint in str(err.value)
    for clash in ({"dataset": "x", "fresh_budget": True},):
        with pytest.raises(InvalidParameterError, match="give one of them"):
            DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=_unnamed(), **clash)
    with pytest.raises(InvalidParameterError, match="fresh_budget must be"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed(), fresh_budget="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="dataset must be"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed(), dataset="  ")


@pytest.mark.ray
def test_two_experiments_on_one_dataset_spend_one_budget(ray_session, tmp_path: Path,
                                                         caplog) -> None:
    """Two DPTuner runs on the same data with no ledger argument: the first creates the
    dataset's ledger (its budget is the total), the second spends from the same ledger only
    what the first left — where each used to get a fresh ε of its own. A third asks for a fresh
    budget explicitly: it runs, is logged, and leaves the dataset's ledger alone."""
    import ray

    data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
    dataset = f"test-data-{uuid.uuid4().hex[:6]}"  # one ledger actor per test run
    journal = dataset_ledger_journal(tmp_path, dataset)
    lines: list[str] = []
    try:
        runs = []
        for _ in range(2):
            runs.append(DPTuner(None, param_space=SPACE, search="one_shot_random",
                                budget=BUDGET, data=data, dataset=dataset,
                                storage_path=tmp_path, progress=lines.append).fit())
        assert {r.certificate.ledger_name for r in runs} == {dataset_ledger_name(dataset)}
        assert any("new dataset ledger" in line for line in lines)
        assert any("already spent" in line for line in lines)
        report = PrivacyLedger.read_only(journal).report()
        assert len(report.charges) == 2  # both plans on the one journal
        assert report.spent_epsilon <= BUDGET.epsilon + 1e-9  # one ε for both, not 2 × 2
        # the second found little left: far more noise than the first for the same space
        sigmas = [r.hyperparameters["noise_multiplier"] for r in runs]
        assert sigmas[1] > 5 * sigmas[0]
        before = journal.read_bytes()
        with caplog.at_level(logging.WARNING, logger="raydp_hpo.tune.tuner"):
            own = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                          data=data, storage_path=tmp_path, fresh_budget=True).fit()
        assert any("fresh budget of its own" in r.message for r in caplog.records)
        assert own.certificate.ledger_name.startswith("ledger-")
        assert journal.read_bytes() == before
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dataset_ledger_name(dataset), namespace="raydp_hpo"))
