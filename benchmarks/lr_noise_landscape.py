"""How the best learning rate moves with the DP-SGD noise: the landscape behind linear scaling.

    .venv/bin/python benchmarks/lr_noise_landscape.py                 # ~14 min on 2 CPUs
    .venv/bin/python benchmarks/lr_noise_landscape.py --replot        # table from the cells

Why. Linear scaling (Panda et al. 2024) tunes at a small ε and transfers the learning rate to
the final run's ε. Its ``line_fit="proportional"`` option transfers by the original linear
scaling rule — at a fixed number of steps T the best learning rate is inversely proportional to
the noise scale, η* ∝ 1/σ (Panda et al. Sec. 2.2 and Prop. 2.1(a), after Malladi et al. 2022).
This script measures how far that holds for the privacy-utility benchmark's trainings.

Method. The settings of ``privacy_utility.py`` (default sizing: MNIST-1D 4000 samples with
``random_kernels1d``, digits with a 64-unit MLP; DP-SGD, sample rate 0.1, 15 epochs = 150
steps, C = 1). For every σ in ``--sigmas`` (default 2, 4, 8, 16: one-shot's σ at ε = 3 is
1.94, linear scaling's sweeps at ε = 0.6 and 0.3 get σ ≈ 8.1 and 15.2), every η of the
19-point log grid over [0.01, 10] that ``rs_ceiling.lr_grid`` builds (6 per decade) and
``--seeds`` seeds, one training (``rs_ceiling.cell``) gives a validation and a test accuracy. Reported: the mean test accuracy by (σ, η), the best η by mean
VALIDATION accuracy, η*·σ (constant under the rule), and the exponent b of a least-squares fit
log η* = a − b·log σ over σ ≥ 4 (b = 1 under the rule). Estimates on 3 seeds per cell, not
bounds: the grid step is 1/6 decade, so η* is known to about ±1/12 decade.

Outputs: ``benchmarks/results/lr_noise_landscape/lr_noise_landscape.md`` and ``_cells.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

# run as a script, this file's folder is on sys.path; privacy_utility adds the repository
import privacy_utility as pu
import rs_ceiling as rc

STEM = "lr_noise_landscape"
RESULTS = pu.HERE / "results" / STEM


def train_cells(datasets: list[str], sigmas: list[float], seeds: int, workers: int,
                path: Any) -> None:
    jobs = [(d, s, lr, seed) for d in datasets for s in sigmas for lr in rc.lr_grid(0.01, 10.0)
            for seed in range(seeds)]
    with ProcessPoolExecutor(workers, initializer=pu._init_worker) as ex, open(path, "w") as f:
        futures = [(j, ex.submit(rc.cell, j[0], "default", j[1], j[2], j[3])) for j in jobs]
        for (dataset, sigma, lr, seed), fut in futures:
            row = {"dataset": dataset, "sigma": sigma, "lr": lr, "seed": seed, **fut.result()}
            f.write(json.dumps(row) + "\n")
            f.flush()


def summarise(rows: list[dict[str, Any]]) -> list[str]:
    lrs = sorted({r["lr"] for r in rows})
    lines = []
    for dataset in sorted({r["dataset"] for r in rows}, reverse=True):
        sub = [r for r in rows if r["dataset"] == dataset]
        sigmas = sorted({r["sigma"] for r in sub})
        nseeds = len({r["seed"] for r in sub})
        lines += [f"## {dataset} ({nseeds} seeds per cell)", "",
                  "Mean test accuracy by noise multiplier σ (rows) and learning rate η "
                  "(columns); **bold**: the best η by mean validation accuracy.", "",
                  "| σ | " + " | ".join(f"{lr:g}" for lr in lrs) + " | best η | η*·σ |",
                  "|---|" + "---|" * (len(lrs) + 2)]
        best: dict[float, float] = {}
        for sigma in sigmas:
            def mean(key: str, lr: float, sigma: float = sigma,
                     sub: list[dict[str, Any]] = sub) -> float:
                return float(np.mean([r[key] for r in sub
                                      if r["sigma"] == sigma and r["lr"] == lr]))
            val = [mean("val", lr) for lr in lrs]
            test = [mean("test", lr) for lr in lrs]
            i = int(np.argmax(val))
            best[sigma] = lrs[i]
            cells = [f"**{t:.3f}**" if j == i else f"{t:.3f}" for j, t in enumerate(test)]
            lines.append(f"| {sigma:g} | " + " | ".join(cells)
                         + f" | {lrs[i]:g} | {lrs[i] * sigma:.2f} |")
        fit = [s for s in sigmas if s >= 4]
        if len(fit) >= 2:
            slope = np.polyfit(np.log(fit), np.log([best[s] for s in fit]), 1)[0]
            lines += ["", f"Fit over σ ∈ {{{', '.join(f'{s:g}' for s in fit)}}}: "
                      f"η* ∝ σ^({slope:.2f}) (the rule η* ∝ 1/σ has exponent −1)."]
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", choices=pu.DATASETS, default=list(pu.DATASETS))
    ap.add_argument("--sigmas", type=float, nargs="+", default=[2.0, 4.0, 8.0, 16.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--replot", action="store_true", help="table from the cells file only")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    cells = RESULTS / f"{STEM}_cells.jsonl"
    t0 = time.perf_counter()
    if not args.replot:
        train_cells(args.datasets, args.sigmas, args.seeds, args.workers, cells)
    rows = [json.loads(line) for line in pu.read_text_or_gz(cells).splitlines() if line.strip()]
    wall = time.perf_counter() - t0
    head = ["# Best learning rate against DP-SGD noise (privacy_utility default settings)", "",
            "Built by `benchmarks/lr_noise_landscape.py` (its docstring: method and caveats). "
            "DP-SGD, sample rate 0.1, 150 steps, C = 1; one training per (σ, η, seed)"
            + ("" if args.replot else f"; {wall / 60:.1f} min on {args.workers} workers")
            + ".", ""]
    out = RESULTS / f"{STEM}.md"
    out.write_text("\n".join(head + summarise(rows)))
    print(f"wrote {out}")
    return 0 if all(math.isfinite(r["test"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
