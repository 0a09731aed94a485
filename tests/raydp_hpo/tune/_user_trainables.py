"""Trainables of a user's own (tiny MLP, own Opacus loop) for the DPTuner tests: importable
by Ray's workers and by the driver that rebuilds the released model."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import raydp_hpo

N, N_VAL = 200, 50


class TinyMLP(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def tensors(n: int, seed: int) -> TensorDataset:
    x, y = arrays(n, seed)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def trainable(config: dict) -> None:
    """One trial; ``config["variant"]`` picks an honest run or a contract break."""
    from ray import tune

    variant = config.get("variant", "good")
    train, val = tensors(N, 0), tensors(N_VAL, 1)
    if variant == "no_session":  # reports a made-up "noisy" score with no admission
        tune.report({"val_accuracy": 1.0, "score_epsilon": config["raydp"].score_epsilon})
        return
    with raydp_hpo.trial_session(config) as trial:
        model = TinyMLP(8).to(trial.device)
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
        data = DataLoader(train, batch_size=33) if variant == "loader_q" else train
        model, opt, loader = trial.make_private(model, opt, data)
        if variant == "sigma_low":
            opt.noise_multiplier = trial.noise_multiplier / 4
        budget = trial.steps + (3 if variant == "extra_steps" else 0)
        steps = 0
        while steps < budget:
            for x, y in loader:
                if steps == budget:
                    break
                opt.zero_grad()
                nn.functional.cross_entropy(model(x.to(trial.device)), y.to(trial.device)).backward()
                opt.step()
                steps += 1
            trial.report(steps=steps)  # intermediate: no score, no metric
        if variant == "no_score":
            return
        trial.save_model(model, model_fn=TinyMLP, model_kwargs={"width": 8})
        if variant == "corrupt_checkpoint":
            (trial.checkpoint_dir / "user_model.pt").write_bytes(b"not a model")
        metric = "accuracy" if variant == "wrong_metric" else "val_accuracy"
        trial.report_score(trial.count_correct(model, DataLoader(val, batch_size=50)),
                           metric=metric)
