"""A small text model of your own (a bag of word embeddings) on generated text, with Opacus.

    python examples/own_text_model.py            # 4,000 generated reviews
    python examples/own_text_model.py --smoke    # 400 reviews (under a minute)

One configuration is drawn before any data is touched and trained once, with the noise
calibrated by the searcher to the whole budget (ε = 3): the one-shot baseline. The model is
``nn.Embedding`` + mean pooling + a linear layer (Opacus computes per-sample gradients for
both layers). Prints the certificate.
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
from raydp_hpo.trainables import Dataset, split

POSITIVE = ["great", "good", "lovely", "excellent", "fun", "superb", "enjoyed", "nice"]
NEGATIVE = ["bad", "awful", "boring", "poor", "dull", "terrible", "hated", "weak"]
NEUTRAL = ["the", "film", "plot", "actor", "was", "and", "a", "story", "music", "it", "very"]
VOCAB = {w: i + 1 for i, w in enumerate(POSITIVE + NEGATIVE + NEUTRAL)}  # 0 pads
LENGTH = 12


class BagOfEmbeddings(nn.Module):
    def __init__(self, vocab_size: int = len(VOCAB) + 1, dim: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens > 0).unsqueeze(-1).float()
        pooled = (self.embedding(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


def generate(n: int, seed: int = 0) -> Dataset:
    """n reviews of 6-12 words; the label is whether positive words outnumber negative ones
    (with 10% label noise). Token ids padded to LENGTH, stored as float32 features."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, LENGTH), dtype=np.float32)
    labels = rng.integers(0, 2, size=n)
    for i, label in enumerate(labels):
        words = list(rng.choice(NEUTRAL, size=rng.integers(3, 7)))
        words += list(rng.choice(POSITIVE if label else NEGATIVE, size=rng.integers(2, 4)))
        words += list(rng.choice(NEGATIVE if label else POSITIVE, size=rng.integers(0, 2)))
        rng.shuffle(words)
        ids[i, : len(words)] = [VOCAB[w] for w in words[:LENGTH]]
    flip = rng.random(n) < 0.1
    return Dataset(ids, np.where(flip, 1 - labels, labels).astype(np.int64), 2, public_size=n)


def tensors(ds) -> TensorDataset:
    return TensorDataset(torch.as_tensor(np.asarray(ds.features)).long(),
                         torch.as_tensor(np.asarray(ds.labels, dtype=np.int64)))


def trainable(config: dict, splits=None) -> None:
    train, val = tensors(splits.train), tensors(splits.val)
    with raydp_hpo.trial_session(config) as trial:
        model = BagOfEmbeddings(dim=config["dim"])
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
        model, optimizer, loader = trial.make_private(model, optimizer, train)
        for _ in range(config["epochs"]):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
        trial.save_model(model, model_fn=BagOfEmbeddings, model_kwargs={"dim": config["dim"]})
        trial.report_score(trial.count_correct(model, DataLoader(val, batch_size=256)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="400 generated reviews")
    parser.add_argument("--storage", default=None, help="results folder (default: a temp dir)")
    args = parser.parse_args()
    splits = split(generate(400 if args.smoke else 4000), 0.2, 0.0, seed=0)
    space = {  # no noise_multiplier: the searcher calibrates σ to the budget
        "lr": tune.choice([0.5, 1.0]),
        "dim": tune.choice([8, 16]),
        "max_grad_norm": 1.0,
        "epochs": 2 if args.smoke else 5,
        "batch_size": 64,
    }
    tuner = raydp_hpo.DPTuner(
        tune.with_parameters(trainable, splits=splits), param_space=space,
        search="one_shot_random", budget=raydp_hpo.PrivacyBudget(3.0, 1e-5), data=splits,
        fresh_budget=True, storage_path=args.storage or tempfile.mkdtemp(prefix="raydp-text-"),
    )
    result = tuner.fit()
    print("hyperparameters:", result.hyperparameters)
    print(result.certificate.format())
    print("released model:", result.model_path)  # raydp_hpo.load_released_model(path)


if __name__ == "__main__":
    main()
