"""Throughput of DP-SGD vs non-private SGD (same model, same batch) on MNIST-1D.

Prints samples/second for: non-private SGD, DP-SGD with the default clipper (book-keeping
for Linear-only models, Opacus per-example gradients otherwise) and DP-SGD with Opacus'
``GradSampleModule`` (hooks), plus the slowdown ratio DP/non-private. One DP step = Poisson
batch of expected size B (fixed size B here, to time equal work), per-example clipping,
Gaussian noise, optimiser update. Uses the GPU when one is available.

Usage: ``python benchmarks/dpsgd_throughput.py [--batch 128] [--steps 200] [--threads N]``
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from trainables.data import load_mnist1d
from trainables.dp_step import GaussianNoise, make_clipper
from trainables.models import build_model


def _time(step, steps: int, device: torch.device) -> float:
    for _ in range(max(5, steps // 10)):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def bench(model_name: str, mode: str | None, batch: int, steps: int, device: torch.device) -> float:
    data = load_mnist1d(4000, seed=0)
    x = torch.as_tensor(data.features[:batch].copy(), device=device)
    y = torch.as_tensor(data.labels[:batch].copy(), device=device)
    torch.manual_seed(0)
    model = build_model(model_name, data.feature_shape, data.num_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    params = list(model.parameters())
    if mode is None:

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    else:
        clipper = make_clipper(model, mode)
        noise = GaussianNoise(1.0, 1.0, batch / 4000, 4000, torch.Generator().manual_seed(0))

        def step() -> None:
            clipper.clipped_sum(x, y, 1.0)
            noise.privatise(params)
            opt.step()

    return batch * steps / _time(step, steps, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device={device} torch_threads={torch.get_num_threads()} batch={args.batch}")
    print(f"{'model':8} {'variant':22} {'samples/s':>12} {'DP/non-private time':>20}")
    for name in ("mlp", "cnn1d"):
        base = bench(name, None, args.batch, args.steps, device)
        print(f"{name:8} {'non-private SGD':22} {base:12.0f} {1.0:20.2f}")
        variants = [("auto", "DP-SGD default")]
        variants.append(("opacus", "DP-SGD Opacus hooks"))
        for mode, label in variants:
            sps = bench(name, mode, args.batch, args.steps, device)
            used = "bk" if mode == "auto" and name == "mlp" else mode
            print(f"{name:8} {label + f' ({used})':22} {sps:12.0f} {base / sps:20.2f}")


if __name__ == "__main__":
    main()
