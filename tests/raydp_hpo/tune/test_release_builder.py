"""Building the release as an object of its own (issue #43): a :class:`ReleaseBuilder` gets a
run's settings as fields and a finished search as arguments, and returns the
:class:`DPResult` (writing ``public/`` and the private evaluation) with no DPTuner anywhere —
on a real ``PrivacyLedger``, a real searcher and a real checkpoint, without Ray."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import tune
from ray.train import Checkpoint

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Laplace, SubsampledGaussian
from raydp_hpo.errors import SearchFailedError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.searchers import OneShotRandomSearch, RandomStoppingSearch
from raydp_hpo.trainables.data import split
from raydp_hpo.trainables.models import build_model
from raydp_hpo.trainables.training import CHECKPOINT_FILE
from raydp_hpo.tune.dataset_points import search_share
from raydp_hpo.tune.release import ReleaseBuilder
from raydp_hpo.tune.sizes import _Size
from tests.raydp_hpo.searchers._results import complete

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(2.0, 1e-5)


class Ledger(PrivacyLedger):  # the ledger actor handle's extras: its name and settings
    name = "ledger-exp"

    def settings(self) -> dict[str, Any]:
        return {"adaptivity": self.adaptivity.value,
                "accountant": self.halting_accountant.value}


@dataclass
class TuneResult:  # the attributes of ray.tune.Result the release reads
    metrics: dict[str, Any]
    config: dict[str, Any]
    checkpoint: Checkpoint | None
    path: str
    error: BaseException | None = None


@pytest.fixture(scope="module")
def data():
    from raydp_hpo.trainables.data import load_digits

    return split(load_digits(), 0.2, 0.2, seed=0)


def _builder(data, tmp_path: Path, **kw: Any) -> ReleaseBuilder:
    sizes = tuple(_Size(v, "declared") for v in (len(data.train), len(data.val),
                                                  len(data.test)))
    return ReleaseBuilder(
        experiment="exp", charge_prefix="exp@0123", budget=BUDGET, metric="val_accuracy",
        storage=tmp_path, data=data, trainable_given=False,
        sizes=sizes, test_epsilon=0.25, secret_seed=7, **kw)  # type: ignore[arg-type]


def _ledger() -> Ledger:
    ledger = Ledger(PrivacyBudget(10.0, 1e-5), adaptivity=Adaptivity.FIXED_PLAN,
                    accountant=Accountant.PROFILE)
    ledger.charge("exp@9999/plan", SubsampledGaussian(1.0, 0.1, 10))  # another run's
    return ledger


def test_the_public_quantities_come_from_the_given_sizes_and_data(data, tmp_path) -> None:
    builder = _builder(data, tmp_path)
    public = dict(builder.public_quantities())
    assert public["training-set size"] == f"{len(data.train)} (declared)"
    assert public["test-set size"] == f"{len(data.test)} (declared)"
    assert public["number of classes"] == f"{data.train.num_classes} (declared)"
    assert "test-set size" not in dict(replace(builder, test_epsilon=None).public_quantities())
    assert "secret_seed" not in repr(builder)  # a secret: never printed


def test_a_selected_release_is_built_from_its_inputs_alone(data, tmp_path) -> None:
    """The selected trial's model from its checkpoint, ``public/`` written, the DP test
    accuracy charged once as ``<charge prefix>/test_accuracy`` (seeded: reproducible), and a
    certificate of exactly this run's charges, with the dataset ledger it is given."""
    searcher = OneShotRandomSearch(SPACE, metric="val_accuracy", mode="max",
                                   dataset_size=len(data.train),
                                   budget=search_share(BUDGET, 0.25), seed=3)
    config = searcher.suggest("t0")
    complete(searcher, "t0", {"val_accuracy": 0.5})
    assert searcher.suggest("t1") == "FINISHED"
    plan = searcher.privacy_plan()
    model = build_model("mlp", data.train.feature_shape, data.train.num_classes)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"runners": [{"model": model.state_dict()}]}, ckpt / CHECKPOINT_FILE)
    grid = [TuneResult({"trial_id": "t0", "val_accuracy": 0.5, "test_accuracy": 0.4}, config,
                       Checkpoint.from_directory(str(ckpt)), str(tmp_path / "t0"))]

    results = []
    for run in ("a", "b"):  # the same inputs, the same secret seed: the same release
        ledger = _ledger()
        ledger.charge("exp@0123/plan", plan.mechanism)
        dataset = Ledger(PrivacyBudget(5.0, 1e-5), adaptivity=Adaptivity.FIXED_PLAN,
                         accountant=Accountant.PROFILE)
        builder = _builder(data, tmp_path, dataset_ledger=dataset)
        exp_dir = tmp_path / run
        out = builder.build(searcher, ledger, grid, plan, str(exp_dir))
        results.append(out)
        cert = out.certificate
        assert [c for c, _ in cert.charges] == ["exp@0123/plan", "exp@0123/test_accuracy"]
        assert cert.charges[1][1] == Laplace(0.25) and cert.budget == BUDGET
        assert cert.ledger_name == "ledger-exp" and cert.dataset_ledger == (
            "ledger-exp", PrivacyBudget(5.0, 1e-5), 0.0)
        assert cert.public == builder.public_quantities()
        assert out.hyperparameters is not None and out.test_accuracy == 0.4
        assert 0.0 <= out.dp_test_accuracy <= 1.0 and out.dp_test_accuracy_epsilon == 0.25
        public = json.loads((exp_dir / "public" / "release.json").read_text())
        assert public["selected"] is True and public["model_file"] == "released_model.pt"
        assert (exp_dir / "public" / "released_model.pt").is_file()
        assert (exp_dir / "evaluation_private.json").is_file()
        again = builder.build(searcher, ledger, grid, plan, str(exp_dir))  # resumed: not twice
        assert again.dp_test_accuracy is None and "already released once" in (
            again.extras["dp_test_accuracy"])
        assert [c.charge_id for c in ledger.charges()].count("exp@0123/test_accuracy") == 1
    assert results[0].dp_test_accuracy == results[1].dp_test_accuracy


def test_a_search_that_selected_nothing_raises_after_its_certificate(data, tmp_path) -> None:
    """K = 0 drawn: ``release.json`` says ``"selected": false`` with the public reason, and
    the error carries the result, whose certificate holds this run's charges only."""
    import numpy as np

    from raydp_hpo.searchers.random_stopping import sample_stopping_k

    seed = next(s for s in range(100)
                if sample_stopping_k(np.random.default_rng(s), "poisson", 1.0, None) == 0)
    searcher = RandomStoppingSearch(SPACE, metric="val_accuracy", mode="max",
                                    dataset_size=len(data.train), validation_size=len(data.val),
                                    budget=BUDGET, seed=seed, distribution="poisson", mean=1.0)
    assert searcher.suggest("t0") == "FINISHED"
    plan = searcher.privacy_plan()
    ledger = _ledger()
    ledger.charge("exp@0123/plan", plan.mechanism)
    with pytest.raises(SearchFailedError, match="the search selected nothing: K = 0") as caught:
        _builder(data, tmp_path).build(searcher, ledger, [], plan, str(tmp_path / "k0"))
    out = caught.value.result
    assert [c for c, _ in out.certificate.charges] == ["exp@0123/plan"]
    assert out.certificate.dataset_ledger is None and out.dp_test_accuracy is None
    public = json.loads((tmp_path / "k0" / "public" / "release.json").read_text())
    assert public["selected"] is False and public["reason"].startswith("K = 0 was drawn")
