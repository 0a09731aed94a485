"""Federated averaging: adaptive (non-private ADADP) client learning rates vs constant-lr SGD
vs Adam, as the client data go from pathological to iid (Koskela & Honkela 2020, Fig. 1).

Setting (the paper's, scaled down): 5 clients, every client in every round (C = 1), one
local epoch per round, the class-pathological split of
:func:`trainables.federated.pathological_split` (client k holds classes {2k, 2k+1}) with a
fraction p ∈ {0, 0.25, 0.5, 0.75, 1} of the records dealt at random instead (p = 1: iid).
Methods: ADADP with η₀ = 0.1, tol = 0.1, α ∈ [0.9, 1.1]; SGD with a constant learning rate
on the grid 10^{-2}, 10^{-1.5}, …, 10^{0} (the table shows the best and the worst grid point
for each dataset and p, chosen by mean final accuracy — the best is an oracle: it tunes on
the test accuracy); Adam with lr 10^{-3}. Datasets: sklearn digits and MNIST-1D (generated
locally), 80/20 train/test, an MLP with one hidden layer. Reported: test accuracy of the
global model after the last round, mean ± standard deviation over seeds (each seed redraws
the client split, the initial model and the minibatch order; the train/test split is fixed).

Not private: this benchmark has no ε. ``--quick`` is a smoke-sized run (10 rounds instead of
30, MNIST-1D with 2,000 instead of 5,000 records) for a shared 2-core machine; its figures are
not the paper's experiment (CIFAR-10, 200 rounds).

    PYTHONPATH=. python benchmarks/federated_adadp.py --quick
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainables.data import DataSplits, load_digits, load_mnist1d, split
from trainables.federated import ClientOptimizer, FedSettings, pathological_split, run_federated

RESULTS = Path(__file__).resolve().parent / "results"
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
DATASETS = ("digits", "mnist1d")
ADAM_LR = 1e-3
ADADP_LR0 = 0.1


def _data(name: str, quick: bool) -> DataSplits:
    raw = load_digits() if name == "digits" else load_mnist1d(2000 if quick else 5000)
    return split(raw, val_fraction=0.0, test_fraction=0.2, seed=0)


def _run(data: DataSplits, p: float, seed: int, settings: FedSettings) -> float:
    parts = pathological_split(data.train.labels, 5, p, np.random.default_rng([seed, 7]))
    shards = [data.train.subset(i) for i in parts]
    return run_federated(shards, data.test, settings, seed=seed).accuracy[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized run (a few minutes)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per cell (>= 3 for a spread)")
    ap.add_argument("--rounds", type=int, default=None, help="default 30; quick 10")
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {a.seeds}")
    torch.set_num_threads(1)
    rounds = a.rounds or (10 if a.quick else 30)
    batch = 10
    exps = (-2.0, -1.5, -1.0, -0.5, 0.0)

    def make(opt: ClientOptimizer, lr: float) -> FedSettings:
        return FedSettings(optimizer=opt, lr=lr, rounds=rounds, batch_size=batch,
                           model_kwargs={"hidden": (64,)})

    methods: dict[str, FedSettings] = {
        "adadp": make(ClientOptimizer.ADADP, ADADP_LR0),
        "adam": make(ClientOptimizer.ADAM, ADAM_LR),
    }
    for e in exps:
        methods[f"sgd@1e{e:+.1f}"] = make(ClientOptimizer.SGD, 10**e)
    seeds = list(range(a.seeds))
    acc: dict[str, dict[float, dict[str, list[float]]]] = {}
    t0 = time.perf_counter()
    for name in a.datasets:
        data = _data(name, a.quick)
        acc[name] = {}
        for p in FRACTIONS:
            acc[name][p] = {m: [_run(data, p, s, st) for s in seeds] for m, st in methods.items()}
            print(f"[{time.perf_counter() - t0:6.0f}s] {name} p={p:.2f} "
                  + " ".join(f"{m}={np.mean(v):.3f}" for m, v in acc[name][p].items()),
                  file=sys.stderr, flush=True)
    rows = _table(acc)
    mode = "quick" if a.quick else "full"
    header = (
        f"Federated averaging, 5 clients, C = 1, {rounds} rounds of 1 local epoch, |B| = "
        f"{batch}, MLP(64); test accuracy after the last round, mean ± sd over {len(seeds)} "
        f"seeds ({mode} mode; {time.perf_counter() - t0:.0f} s). SGD grid: "
        + ", ".join(f"10^{e:g}" for e in exps)
        + f"; best/worst chosen per cell by mean (the best is a test-set oracle). ADADP "
        f"η₀ = {ADADP_LR0}, tol = 0.1; Adam lr = {ADAM_LR:g}. p = fraction of records dealt "
        "at random (0: each client has 2 classes, 1: iid)."
    )
    md = header + "\n\n" + _markdown(rows)
    print(md)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "federated_adadp.md").write_text(md + "\n")
    _plot(rows, a.out / "federated_adadp.png", header.split(";")[0])
    return 0


@dataclass(frozen=True)
class Row:
    """One (dataset, p) cell: final accuracies per seed of each method."""

    dataset: str
    p: float
    adadp: list[float]
    sgd_best: list[float]
    sgd_best_lr: str
    sgd_worst: list[float]
    sgd_worst_lr: str
    adam: list[float]


def _table(acc: dict[str, dict[float, dict[str, list[float]]]]) -> list[Row]:
    rows: list[Row] = []
    for name, cells in acc.items():
        for p, runs in cells.items():
            sgd = {m: v for m, v in runs.items() if m.startswith("sgd@")}
            best = max(sgd, key=lambda m: float(np.mean(sgd[m])))
            worst = min(sgd, key=lambda m: float(np.mean(sgd[m])))
            rows.append(Row(name, p, runs["adadp"], sgd[best], best[4:], sgd[worst], worst[4:],
                            runs["adam"]))
    return rows


def _mean_sd(v: list[float]) -> tuple[float, float]:
    x = np.asarray(v, dtype=float)
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan


def _ms(v: list[float]) -> str:
    m, sd = _mean_sd(v)
    return f"{m:.3f} ± {sd:.3f}"


def _markdown(rows: list[Row]) -> str:
    out = ["| dataset | p | ADADP | SGD best (lr) | SGD worst (lr) | Adam |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.dataset} | {r.p:.2f} | {_ms(r.adadp)} | {_ms(r.sgd_best)} ({r.sgd_best_lr}) "
            f"| {_ms(r.sgd_worst)} ({r.sgd_worst_lr}) | {_ms(r.adam)} |"
        )
    return "\n".join(out)


def _plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r.dataset for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        sub = [r for r in rows if r.dataset == name]
        ps = [r.p for r in sub]
        for key, label in (("adadp", "ADADP (η₀ = 0.1)"), ("sgd_best", "SGD, best lr (oracle)"),
                           ("sgd_worst", "SGD, worst lr"), ("adam", f"Adam (lr {ADAM_LR:g})")):
            stats = [_mean_sd(getattr(r, key)) for r in sub]
            ax.errorbar(ps, [m for m, _ in stats], yerr=[0 if math.isnan(s) else s for _, s in stats],
                        marker="o", capsize=3, label=label)
        ax.set_xlabel("p: fraction of records dealt at random (0 pathological, 1 iid)")
        ax.set_ylabel("test accuracy after last round")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
