"""Run a DPTuner experiment in its own process and Ray (killed by the test mid-search)."""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray import tune  # noqa: E402

from raydp_hpo.accounting.budget import PrivacyBudget  # noqa: E402
from raydp_hpo.trainables.data import DataSplits, load_mnist1d, split  # noqa: E402
from raydp_hpo.tune.tuner import DPTuner  # noqa: E402

SPACE = {
    "lr": tune.grid_search([0.1, 0.2, 0.4, 0.8]),
    "epochs": 3,
    "sample_rate": 0.1,
    "max_grad_norm": 1.0,
    "model": "mlp",
    "optimizer": "sgd",
    "noise_multiplier": 3.0,
}


def make_data() -> DataSplits:
    return split(load_mnist1d(num_samples=1200, seed=3), 0.2, 0.2, seed=0)


def make_tuner(storage: str, experiment: str) -> DPTuner:
    return DPTuner(None, param_space=SPACE, search="grid_composed",
                   budget=PrivacyBudget(8.0, 1e-5), data=make_data(), storage_path=storage,
                   experiment=experiment, max_concurrent_trials=1, fresh_budget=True)


if __name__ == "__main__":
    storage, experiment = sys.argv[1], sys.argv[2]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rdi", dir="/tmp"))
    make_tuner(storage, experiment).fit()
