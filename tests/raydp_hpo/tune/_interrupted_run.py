"""Run a DPTuner experiment in its own process and Ray (killed by the test mid-search)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from typing import Any

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


class KillWhenTheSecondTrialStarts(tune.Callback):
    """SIGKILLs this driver and its whole Ray (its process group) as the second trial starts:
    the first trial has completed, the others have not run (a reused trial actor runs the
    remaining three in well under a second, so a kill from outside after the first trial
    completed came after the release)."""

    def __init__(self) -> None:
        self.started = 0

    def on_trial_start(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
        self.started += 1
        if self.started == 2:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def make_tuner(storage: str, experiment: str, callbacks: tuple[Any, ...] = ()) -> DPTuner:
    return DPTuner(None, param_space=SPACE, search="grid_composed",
                   budget=PrivacyBudget(8.0, 1e-5), data=make_data(), storage_path=storage,
                   experiment=experiment, max_concurrent_trials=1, fresh_budget=True,
                   callbacks=callbacks)


if __name__ == "__main__":
    storage, experiment = sys.argv[1], sys.argv[2]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rdi", dir="/tmp"))
    make_tuner(storage, experiment, (KillWhenTheSecondTrialStarts(),)).fit()
