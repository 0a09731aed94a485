"""Your own small CNN on images (scikit-learn's 8x8 digits), tuned by random stopping.

    python examples/own_cnn_digits.py            # the whole digits set, ~4 trials expected
    python examples/own_cnn_digits.py --smoke    # 400 images, ~1 trial (under a minute)

Random stopping (Papernot & Steinke 2022) charges the whole search once, up front; every
trial runs inside that plan charge and `trial_session` checks that what it runs is covered.
Prints the certificate.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from ray import tune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import raydp_hpo
from raydp_hpo.trainables import Dataset, load_digits, split


class SmallCNN(nn.Module):
    """Two conv layers with GroupNorm (Opacus has no per-sample gradients for BatchNorm)."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.GroupNorm(2, channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        )
        self.head = nn.Linear(channels * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def tensors(ds) -> TensorDataset:
    return TensorDataset(torch.as_tensor(np.asarray(ds.features, dtype=np.float32)),
                         torch.as_tensor(np.asarray(ds.labels, dtype=np.int64)))


def trainable(config: dict, splits=None) -> None:
    train, val = tensors(splits.train), tensors(splits.val)
    with raydp_hpo.trial_session(config) as trial:
        model = SmallCNN(config["channels"])
        optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
        model, optimizer, loader = trial.make_private(model, optimizer, train)
        for epoch in range(config["epochs"]):
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x.to(trial.device)), y.to(trial.device))
                loss.backward()
                optimizer.step()
            trial.report(epoch=epoch + 1, loss=float(loss))  # intermediate: no score
        trial.save_model(model, model_fn=SmallCNN, model_kwargs={"channels": config["channels"]})
        trial.report_score(trial.count_correct(model, DataLoader(val, batch_size=256)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="400 images, ~1 trial")
    parser.add_argument("--storage", default=None, help="results folder (default: a temp dir)")
    args = parser.parse_args()
    digits = load_digits()
    if args.smoke:  # the first 400 images; 400 is the declared (public) size
        digits = Dataset(digits.features[:400], digits.labels[:400], 10, public_size=400)
    splits = split(digits, 0.2, 0.0, seed=0)
    space = {
        "lr": tune.loguniform(1e-3, 1e-2),
        "channels": tune.choice([4, 8]),
        "max_grad_norm": 1.0,
        "epochs": 1 if args.smoke else 5,
        "batch_size": 64,
        "noise_multiplier": 1.5,
    }
    tuner = raydp_hpo.DPTuner(
        tune.with_parameters(trainable, splits=splits), param_space=space,
        search="random_stopping", budget=raydp_hpo.PrivacyBudget(8.0, 1e-5), data=splits,
        fresh_budget=True, storage_path=args.storage or tempfile.mkdtemp(prefix="raydp-cnn-"),
        search_kwargs={"mean": 1.0 if args.smoke else 4.0, "score_epsilon": 0.5},
    )
    result = tuner.fit()
    print("hyperparameters:", result.hyperparameters, "| reason:", result.extras.get("reason"))
    print(result.certificate.format())
    print("released model:", result.model_path)  # raydp_hpo.load_released_model(path)


if __name__ == "__main__":
    main()
