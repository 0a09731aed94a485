"""Your own Opacus MLP on a Parquet table, tuned by DPTuner with the guarantee enforced.

    python examples/own_mlp_parquet.py            # 2,000 rows, a 3 x 2 grid of lr x clipping norm
    python examples/own_mlp_parquet.py --smoke    # 300 rows, 2 trials (about a minute on 2 CPUs)

The table is generated (a synthetic credit-scoring-like table with 8 numeric columns). The
training loop is an ordinary Opacus loop; the lines marked ``# raydp`` are all it takes to run
it under raydp-hpo: the trial is admitted by the privacy ledger before it touches data, runs
at exactly the charged noise, clipping norm, sample rate and steps, and releases a noisy score.
Prints the certificate, and a ``PLAN`` line the test suite checks against an independent
dp-accounting computation.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from ray import tune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import raydp_hpo
from raydp_hpo.trainables import load_parquet, split

FEATURES = [f"x{i}" for i in range(8)]


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(len(FEATURES), width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_table(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, len(FEATURES)))
    y = (x @ rng.normal(size=len(FEATURES)) + 0.5 * rng.normal(size=rows) > 0).astype(np.int64)
    pd.DataFrame({**{c: x[:, i] for i, c in enumerate(FEATURES)}, "label": y}).to_parquet(path)


def tensors(ds) -> TensorDataset:
    return TensorDataset(torch.as_tensor(np.asarray(ds.features, dtype=np.float32)),
                         torch.as_tensor(np.asarray(ds.labels, dtype=np.int64)))


def trainable(config: dict, splits=None) -> None:
    train, val = tensors(splits.train), tensors(splits.val)
    with raydp_hpo.trial_session(config) as trial:  # raydp: admitted here
        model = MLP(32)
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
        model, optimizer, loader = trial.make_private(model, optimizer, train)  # raydp
        for _ in range(config["epochs"]):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
        trial.save_model(model, model_fn=MLP, model_kwargs={"width": 32})  # raydp
        trial.report_score(trial.count_correct(model, DataLoader(val, batch_size=256)))  # raydp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data, 2 trials")
    parser.add_argument("--storage", default=None, help="results folder (default: a temp dir)")
    args = parser.parse_args()
    rows = 300 if args.smoke else 2000
    workdir = Path(args.storage or tempfile.mkdtemp(prefix="raydp-example-"))
    workdir.mkdir(parents=True, exist_ok=True)
    table = workdir / "table.parquet"
    make_table(table, rows)
    data = load_parquet(str(table), label_column="label", feature_columns=FEATURES,
                        num_classes=2, public_size=rows)  # the row count is public
    splits = split(data, 0.2, 0.0, seed=0)
    space = {
        "lr": tune.grid_search([0.1] if args.smoke else [0.05, 0.1, 0.2]),
        "max_grad_norm": tune.grid_search([0.5, 1.0]),
        "epochs": 1 if args.smoke else 3,
        "batch_size": 32,
        "noise_multiplier": 2.0,
    }
    budget = raydp_hpo.PrivacyBudget(8.0, 1e-5)
    tuner = raydp_hpo.DPTuner(
        tune.with_parameters(trainable, splits=splits), param_space=space,
        search="grid_composed", budget=budget, data=splits, fresh_budget=True,
        storage_path=workdir, search_kwargs={"score_epsilon": 0.5},
    )
    result = tuner.fit()
    print("hyperparameters:", result.hyperparameters)
    print(result.certificate.format())
    print("released model:", result.model_path)  # raydp_hpo.load_released_model(path)
    n_train = splits.declared_sizes.train
    print("PLAN " + json.dumps({
        "trials": len(result.certificate.charges), "sigma": space["noise_multiplier"],
        "sample_rate": space["batch_size"] / n_train,
        "steps": raydp_hpo.privacy_from_config(
            {k: space[k] for k in ("epochs", "batch_size", "noise_multiplier")}, n_train).steps,
        "score_epsilon": 0.5, "delta": budget.delta,
        "epsilon_rdp": result.certificate.epsilon_rdp,
        "epsilon_certified": result.certificate.epsilon,
    }))


if __name__ == "__main__":
    main()
