"""Compute saved by Koskela & Kulkarni's subsampled tuning: the formula and the wall time.

Random stopping on all the data trains E[K] = μ trials on the n training records. Subsampled
transfer (:mod:`raydp_hpo.searchers.subsampled_transfer`) trains the μ tuning trials on a Poisson
subsample X₁ of rate q and one final run on the complement X ∖ X₁. Every trial keeps the
sampling ratio γ and runs the same ⌈epochs/γ⌉ steps, so a trial on X₁ has a q-times smaller
*expected batch*, not fewer steps. Two figures:

* the **formula** (gradient evaluations, Koskela & Kulkarni 2023): μ·n / (μ·q·n + n) =
  μ/(μq + 1) (their bound; the exact expectation counts (1 − q)·n for the final run:
  μ/(μq + 1 − q)); 10/(10·0.1 + 1) = 5× at μ = 10, q = 0.1;
* the **measured wall time**: μ·T(all data) / (μ·T(subsample) + T(complement)), with T the
  wall time of one real trial (:func:`raydp_hpo.trainables.training.train_dp`: Poisson sampling,
  book-keeping clipping, noise, optimiser, per-epoch validation) on the subsample's,
  complement's and whole data view. Per-step costs that do not shrink with the batch (noise
  over every parameter, the optimiser step, sampling, hooks, Python) keep it well below the
  formula, the more so the cheaper a gradient evaluation is relative to those costs (MLP).

Interleaved: each round times one trial of each view, in an order that rotates from round to
round; the ratio is taken within a round. Printed: median and range (min–max) over rounds.

    PYTHONPATH=. .venv/bin/python benchmarks/subsampled_transfer_cost.py --rounds 5

The trials here are unaccounted (no ledger: this measures compute only).

Measured (CPU, 1 thread, 2 cores shared with other jobs at load average ~15; n_train = 20 001,
μ = 10, q = 0.1, γ = 0.02, 2 epochs = 100 steps per trial; 3 rounds, median (range)):

    formula μ/(μq + 1) = 5.00× (exact expectation 5.26×)
    mlp    measured wall-time saving 1.73× (1.30–1.79)
    cnn1d  measured wall-time saving 2.88× (2.20–5.62)

At n_train = 4 766 (expected batch 95 on all data, 9.5 on the subsample) the saving was only
1.07× (MLP) and 1.26× (CNN): the smaller the batch, the more of a step is per-step cost.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from raydp_hpo.trainables.data import load_mnist1d, split
from raydp_hpo.trainables.training import train_dp

VIEWS = ("all", "subsample", "complement")


def _config(model: str, view: str, q: float, args: argparse.Namespace) -> dict[str, Any]:
    data_view: dict[str, Any] = (
        {"kind": "full"} if view == "all" else {"kind": view, "rate": q, "seed": 1234}
    )
    return {
        "model": model,
        "optimizer": "momentum",
        "lr": 0.1,
        "epochs": args.epochs,
        "sample_rate": args.sample_rate,
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
        "raydp": {"data_view": data_view},
    }


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn1d"])
    parser.add_argument("--mean", type=float, default=10.0, help="E[K] = μ tuning trials")
    parser.add_argument("--q", type=float, default=0.1, help="subsampling rate of X₁")
    parser.add_argument("--samples", type=int, default=25_000, help="MNIST-1D records")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sample-rate", type=float, default=0.02, help="γ of every trial")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = split(load_mnist1d(num_samples=args.samples, seed=0), 0.1, 0.1, seed=0)
    mu, q = args.mean, args.q
    print(f"n_train={len(data.train)} μ={mu:g} q={q:g} γ={args.sample_rate:g} "
          f"epochs={args.epochs} threads={args.threads} rounds={args.rounds}")
    print(f"formula (K&K 2023 bound) μ/(μq + 1)       : {mu / (mu * q + 1):.2f}×")
    print(f"formula (exact expectation) μ/(μq + 1 − q) : {mu / (mu * q + 1 - q):.2f}×")
    for model in args.models:
        for view in VIEWS:  # warm-up: imports, allocator, thread pools
            train_dp(_config(model, view, q, args), data, device="cpu", secret_seed=0)
        times: dict[str, list[float]] = {v: [] for v in VIEWS}
        for r in range(args.rounds):
            for view in VIEWS[r % 3:] + VIEWS[: r % 3]:
                t0 = time.perf_counter()
                train_dp(_config(model, view, q, args), data, device="cpu", secret_seed=r)
                times[view].append(time.perf_counter() - t0)
        ratios = [mu * a / (mu * s + c) for a, s, c in
                  zip(times["all"], times["subsample"], times["complement"])]
        cells = "  ".join(f"{v} {_spread(times[v])} s" for v in VIEWS)
        print(f"{model:6} trial wall time: {cells}")
        print(f"{model:6} measured wall-time saving μ·T_all/(μ·T_sub + T_comp): "
              f"{_spread(ratios)}×   (formula {mu / (mu * q + 1):.2f}×)")


if __name__ == "__main__":
    main()
