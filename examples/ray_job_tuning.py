"""DPTuner inside a Ray Job, with its results and privacy ledger on a durable path.

Submit it to a running cluster (raydp-hpo installed on every node)::

    ray job submit --working-dir examples -- \\
        python ray_job_tuning.py --storage /mnt/durable/raydp_results

The job's ``python`` is the one on the ``PATH`` of ``ray start``: start the cluster with the
virtualenv that has raydp-hpo first on ``PATH``. ``tests/cluster/test_job_submit.py`` submits
exactly this command (with ``--smoke``) to a real ``ray start --head`` and checks the
certificate in the job's log and the release and ledgers on ``--storage`` after the job ends.

Inside the job ``RAY_ADDRESS`` is set, so DPTuner joins the cluster instead of starting Ray.
``--storage`` must outlive the job: a job's working directory is deleted when it ends, and the
ledger journal kept there would go with it — and with it the record of the budget spent
(DPTuner warns about such paths). Run it again with the same ``--storage`` and
``--dataset``: the second run spends from what is left of the dataset's budget.

    python examples/ray_job_tuning.py --smoke    # runs the script directly (local Ray)

Prints the certificate and where the publishable release lies.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from ray import tune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import raydp_hpo
from raydp_hpo.trainables import Dataset, split


class MLP(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def tensors(ds) -> TensorDataset:
    return TensorDataset(torch.as_tensor(np.asarray(ds.features, dtype=np.float32)),
                         torch.as_tensor(np.asarray(ds.labels, dtype=np.int64)))


def trainable(config: dict, splits=None) -> None:
    train, val = tensors(splits.train), tensors(splits.val)
    with raydp_hpo.trial_session(config) as trial:
        model = MLP(config["width"])
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        model, optimizer, loader = trial.make_private(model, optimizer, train)
        for _ in range(config["epochs"]):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
        trial.save_model(model, model_fn=MLP, model_kwargs={"width": config["width"]})
        trial.report_score(trial.count_correct(model, DataLoader(val, batch_size=512)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data, run directly")
    parser.add_argument("--storage", default=None,
                        help="durable results folder (default ~/raydp_results; a temp dir "
                             "with --smoke)")
    parser.add_argument("--dataset", default="synthetic-3-class",
                        help="the dataset's ledger name: runs on the same data share one budget")
    args = parser.parse_args()
    storage = args.storage or (tempfile.mkdtemp(prefix="raydp-job-") if args.smoke
                               else os.path.expanduser("~/raydp_results"))
    n = 300 if args.smoke else 5000
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = np.argmax(x[:, :3] + 0.3 * rng.normal(size=(n, 3)), axis=1).astype(np.int64)
    splits = split(Dataset(x, y, 3, public_size=n), 0.2, 0.0, seed=0)
    space = {"lr": tune.loguniform(0.05, 0.5), "width": tune.choice([8, 16]),
             "max_grad_norm": 1.0, "epochs": 1 if args.smoke else 3, "batch_size": 32,
             "noise_multiplier": 1.5}
    tuner = raydp_hpo.DPTuner(
        tune.with_parameters(trainable, splits=splits), param_space=space,
        search="random_stopping", budget=raydp_hpo.PrivacyBudget(6.0, 1e-5), data=splits,
        dataset=args.dataset, storage_path=storage,
        search_kwargs={"mean": 1.0 if args.smoke else 4.0, "score_epsilon": 0.5},
    )
    result = tuner.fit()
    print("hyperparameters:", result.hyperparameters, "| reason:", result.extras.get("reason"))
    print(result.certificate.format())
    print("released model:", result.model_path)  # raydp_hpo.load_released_model(path)
    print("publishable release:", Path(result.experiment_path) / "public")


if __name__ == "__main__":
    main()
