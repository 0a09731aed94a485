"""How far random stopping's RERR can go: the price of K runs, measured apart from the search.

    .venv/bin/python benchmarks/rs_ceiling.py --datasets mnist1d digits --tag 4000
    .venv/bin/python benchmarks/rs_ceiling.py --mnist1d-10k --datasets mnist1d --tag 10k
    .venv/bin/python benchmarks/rs_ceiling.py --datasets mnist1d digits --tag 4000b --seed-offset 100
    .venv/bin/python benchmarks/rs_ceiling.py --tag 4000 --replot        # no training

Why. On MNIST-1D, random stopping's RERR at total ε = 3 stayed at 51–61% in every run of
``privacy_utility.py`` (issue 12 asks ≥ 60% on two runs), whatever the law of K or E[K]. Two
things can cost it, and this script separates them:

(a) **the price of K runs**: every one of the K trainings gets the noise σ_K calibrated so
    that the WHOLE search costs (ε, δ) (privacy profiles, Koskela, Redberg & Wang 2024), so
    each run is noisier than the one run of one-shot random and of the oracle (σ₁);
(b) **the search**: K random learning rates may all miss the good region, and the noisy
    selection score (Laplace, ε_s per trial) may pick a worse run than the best of K.

Method. For each dataset, σ₁ is one DP-SGD run at (ε, δ) (:func:`privacy_utility.oracle_sigma`,
as one-shot random and the oracle are calibrated) and σ_K is the random-stopping searcher's
own calibration for each E[K] (the law of the benchmark, tightest accounting). On a grid G of
log-spaced learning rates over the benchmark's range (4 decades, 6 points per decade: it
contains the benchmark's 7-point oracle grid), S seeds are trained at every (σ, lr) cell with
the benchmark's model, epochs, sample rate and C; each gives a validation and a test accuracy.
From these cells, with the lr distribution ``loguniform`` discretised to uniform over G:

* **one-shot random** = mean test accuracy over G and the seeds at σ₁;
* **oracle** = the benchmark's oracle: on its 7-point grid, one seed per point, best CLEAN
  validation accuracy, its test accuracy (Monte Carlo over the seed draws);
* **random stopping (simulated)** = draw K from the searcher's own law
  (:func:`~raydp_hpo.searchers.random_stopping.sample_stopping_k`), K lrs uniform over G and a
  seed for each, score = validation accuracy + Laplace(1/(ε_s·n_val)) (the searcher's noisy
  score at sensitivity 1 on the count of correct answers), release the best score's test
  accuracy (K = 0 releases nothing: such draws are left out of the mean and counted);
* **random stopping, perfect search** = E[max over the K draws of the MEAN test accuracy
  at σ_K]: the K runs' noise (a) alone, as if the best of the K learning rates were always
  found and a run's luck did not matter — no selection rule inside random stopping can do
  better in expectation than this (up to the seed-to-seed luck a selection on validation can
  pick up, which the simulated column includes);
* **one run at a fraction f of ε, best lr for free** (``--final-fractions``): the mean test
  accuracy of the best lr of the oracle's 7-point grid at the σ of ONE run at f·ε — what a two-stage method (tune,
  then one final run) could at best reach if it spent (1 − f) of ε on tuning and its tuning
  were perfect. It is indicative only: tuning and final run compose, they do not add in ε.

RERR = (acc − one-shot random) / (oracle − one-shot random) as in ``privacy_utility.py``; the
95% interval is a percentile bootstrap over the seeds (one resample shared by every cell: a
seed fixes the initial weights of all its cells, which makes them correlated — resampling
cells independently gave intervals that two runs on disjoint seeds did not overlap), the Monte
Carlo redone in each replicate. The figures are estimates on a discretised lr
distribution, not bounds: they say where the benchmark's random stopping SHOULD land and how
much of its gap to the oracle no selection can close.

Outputs: ``benchmarks/results/rs_ceiling/rs_ceiling[_TAG].md`` and ``_cells.jsonl`` (one line per
trained cell, so ``--replot`` rebuilds the table without training).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

# run as a script, this file's folder is on sys.path; privacy_utility adds the repository
import privacy_utility as pu

RESULTS = Path(__file__).resolve().parent / "results" / "rs_ceiling"
#: E[K] values simulated by default (the benchmark's is 10)
MEAN_KS = (2.0, 3.0, 5.0, 10.0, 20.0)
#: points per decade of the lr grid: 6 contains the benchmark's 7-point grid over 4 decades
PER_DECADE = 6
BOOTSTRAP, MONTE_CARLO = 300, 4000


def lr_grid(lo: float, hi: float) -> list[float]:
    """Log-spaced lrs from lo to hi, PER_DECADE per decade (3 significant digits, as the
    benchmark's grid is rounded, so its points are members)."""
    num = round(math.log10(hi / lo) * PER_DECADE) + 1
    return pu._logspace(lo, hi, num)


def random_stopping_sigma(size: dict[str, Any], dataset: str, n_train: int, epsilon: float,
                          mean_k: float, distribution: str) -> float:
    """σ the random-stopping searcher calibrates for E[K] = ``mean_k`` at total (ε, δ): the
    searcher itself, as the benchmark builds it, on an empty ledger of the tightest
    fixed-plan accountant."""
    from _driver import EmptyLedgerAdmission, tightest_halting_accountant

    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.ledger import Adaptivity, PrivacyLedger
    from raydp_hpo.searchers import make_searcher

    space, kwargs = pu.method_setup("random_stopping", {**size, "mean_k": mean_k}, dataset,
                                    epsilon)
    kwargs = {**kwargs, "distribution": distribution}
    budget = PrivacyBudget(float(epsilon), pu.DELTA)
    ledger = PrivacyLedger(budget, adaptivity=Adaptivity.FIXED_PLAN,
                           accountant=tightest_halting_accountant(Adaptivity.FIXED_PLAN))
    searcher = make_searcher("random_stopping", param_space=dict(space), metric="val_accuracy",
                             mode="max", dataset_size=n_train, budget=budget, seed=0,
                             experiment="rs-ceiling", admissible=EmptyLedgerAdmission(ledger),
                             **kwargs)
    sigma = searcher._calibrated_sigma  # the σ its trials get (benchmark: private is fine)
    assert sigma is not None, "the benchmark's space has no noise key: σ is calibrated"
    return float(sigma)


def cell(dataset: str, mode: str, sigma: float, lr: float, seed: int) -> dict[str, Any]:
    """Train one (σ, lr, seed) cell with the benchmark's shared settings."""
    from raydp_hpo.trainables.training import train_dp

    size = pu.sizing(mode)
    data = pu.load(dataset, size["mnist1d_samples"])
    cfg = {**pu.base_space(size, dataset), "noise_multiplier": sigma, "lr": lr}
    result = train_dp(cfg, data, secret_seed=7_000_000 + seed)
    return {"val": float(result.metrics["val_accuracy"]),
            "test": float(result.metrics["test_accuracy"])}


# ------------------------------------------------------------------------------------ model

def _k_table(distribution: str, mean_k: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the searcher's law of K, cut where the tail is below 1e-9."""
    from raydp_hpo.searchers.random_stopping import stopping_pmf

    ks, ps, total, k = [], [], 0.0, 0
    while total < 1.0 - 1e-9 and k < 100_000:
        p = stopping_pmf(k, distribution, mean_k)
        ks.append(k)
        ps.append(p)
        total += p
        k += 1
    pmf = np.asarray(ps)
    return np.asarray(ks), pmf / pmf.sum()


def simulate(val: np.ndarray, test: np.ndarray, ks: np.ndarray, pmf: np.ndarray,
             score_scale: float, rng: np.random.Generator, draws: int) -> tuple[float, float,
                                                                               float]:
    """Random stopping on cells ``val``/``test`` (lr × seed) of one σ: (mean released test
    accuracy over draws with K ≥ 1, the perfect-search figure, P[K = 0])."""
    n_lr, n_seed = val.shape
    k = rng.choice(ks, size=draws, p=pmf)
    kmax = max(int(k.max()), 1)
    lr_i = rng.integers(n_lr, size=(draws, kmax))
    seed_i = rng.integers(n_seed, size=(draws, kmax))
    live = np.arange(kmax)[None, :] < k[:, None]
    score = val[lr_i, seed_i] + rng.laplace(0.0, score_scale, size=(draws, kmax))
    score = np.where(live, score, -np.inf)
    pick = np.argmax(score, axis=1)
    released = k >= 1
    acc = test[lr_i[np.arange(draws), pick], seed_i[np.arange(draws), pick]]
    mean_curve = test.mean(axis=1)
    perfect = np.where(live, mean_curve[lr_i], -np.inf).max(axis=1)
    return (float(acc[released].mean()), float(perfect[released].mean()),
            float(1.0 - released.mean()))


def oracle(val: np.ndarray, test: np.ndarray, grid_idx: list[int], rng: np.random.Generator,
           draws: int) -> float:
    """The benchmark's oracle: one seed per grid point, best clean validation, its test."""
    seed_i = rng.integers(val.shape[1], size=(draws, len(grid_idx)))
    g = np.asarray(grid_idx)[None, :]
    pick = np.argmax(val[g, seed_i], axis=1)
    rows = np.arange(draws)
    return float(test[g[0, pick], seed_i[rows, pick]].mean())


def estimates(cells: dict[str, tuple[np.ndarray, np.ndarray]], meta: dict[str, Any],
              rng: np.random.Generator, draws: int) -> dict[str, float]:
    """Every figure of one dataset from cells[σ label] = (val, test) arrays (lr × seed)."""
    val1, test1 = cells["one"]
    out = {"one_shot_random": float(test1.mean()),
           "oracle": oracle(val1, test1, meta["grid_idx"], rng, draws)}
    for mk in meta["mean_ks"]:
        ks, pmf = _k_table(meta["distribution"], mk)
        v, t = cells[f"k={mk:g}"]
        out[f"rs@{mk:g}"], out[f"perfect@{mk:g}"], out[f"p0@{mk:g}"] = simulate(
            v, t, ks, pmf, meta["score_scale"], rng, draws)
    for f in meta["final_fractions"]:
        curve = cells[f"f={f:g}"][1].mean(axis=1)
        out[f"final@{f:g}"] = float(curve[meta["grid_idx"]].max())
    return out


def _rerr(acc: float, base: float, top: float) -> float:
    return (acc - base) / (top - base) if top - base > 1e-12 else math.nan


# ------------------------------------------------------------------------------------ report

def report(rows: list[dict[str, Any]], meta_by: dict[str, dict[str, Any]], tag: str,
           header: str) -> str:
    """The markdown page: one table per dataset."""
    lines = [f"# Random stopping: the price of K runs, apart from the search ({tag})", "",
             header, ""]
    for dataset, meta in meta_by.items():
        lines += dataset_section([r for r in rows if r["dataset"] == dataset], dataset, meta)
    return "\n".join(lines) + "\n"


def cell_arrays(rows: list[dict[str, Any]], meta: dict[str, Any]
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """σ label → (val, test) arrays of shape (lr, seed)."""
    by: dict[str, dict[int, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        by[r["sigma_label"]][r["lr_index"]][r["seed"]] = r
    seeds = sorted({r["seed"] for r in rows})
    out = {}
    for label in meta["sigmas"]:
        cells = [[by[label][i][s] for s in seeds] for i in range(len(meta["lrs"]))]
        out[label] = (np.array([[c["val"] for c in row] for row in cells]),
                      np.array([[c["test"] for c in row] for row in cells]))
    return out


def dataset_section(rows: list[dict[str, Any]], dataset: str, meta: dict[str, Any]) -> list[str]:
    """Point estimates on all seeds and 95% percentile-bootstrap intervals (the seeds
    resampled with replacement, the same resample for every cell; the Monte Carlo redone per
    replicate)."""
    full = cell_arrays(rows, meta)
    point = estimates(full, meta, np.random.default_rng(2024), MONTE_CARLO)
    boot: dict[str, list[float]] = defaultdict(list)
    rng = np.random.default_rng(777)
    n_seeds = next(iter(full.values()))[0].shape[1]
    for _ in range(BOOTSTRAP):
        # one resample of the SEEDS for every cell: a seed fixes the initial weights (and
        # batches, noise) of all its cells, so cells of one seed are not independent
        j = rng.integers(n_seeds, size=n_seeds)
        cells = {label: (v[:, j], t[:, j]) for label, (v, t) in full.items()}
        e = estimates(cells, meta, rng, MONTE_CARLO // 4)
        for key, value in e.items():
            boot[key].append(value)
            if key not in ("one_shot_random", "oracle") and not key.startswith("p0@"):
                boot["rerr:" + key].append(_rerr(value, e["one_shot_random"], e["oracle"]))

    def ci(key: str) -> str:
        b = np.asarray(boot[key])
        lo, hi = np.percentile(b[np.isfinite(b)], [2.5, 97.5])
        if key.startswith("rerr:"):
            return f"[{100 * lo:.0f}%, {100 * hi:.0f}%]"
        return f"[{lo:.3f}, {hi:.3f}]"

    base, top = point["one_shot_random"], point["oracle"]
    sig = meta["sigmas"]
    lines = [f"## {dataset} ({meta['samples']} samples; n_train = {meta['n_train']}, "
             f"n_val = {meta['n_val']}; {n_seeds} seeds per cell, {len(meta['lrs'])} lrs)", "",
             f"Score noise: Laplace scale {meta['score_scale']:.4f} in accuracy units; law of "
             f"K: {meta['distribution']}.", "",
             "| figure | σ | test accuracy [95% CI] | RERR [95% CI] | P[K = 0] |",
             "|---|---|---|---|---|",
             f"| one-shot random | {sig['one']:.3f} | {base:.3f} {ci('one_shot_random')} | "
             "0% | — |",
             f"| oracle (7-point grid, clean selection) | {sig['one']:.3f} | {top:.3f} "
             f"{ci('oracle')} | 100% | — |"]
    for mk in meta["mean_ks"]:
        for kind, name in (("rs", "random stopping, simulated"),
                           ("perfect", "random stopping, perfect search")):
            key = f"{kind}@{mk:g}"
            lines.append(f"| {name}, E[K] = {mk:g} | {sig[f'k={mk:g}']:.3f} | {point[key]:.3f} "
                         f"{ci(key)} | {100 * _rerr(point[key], base, top):.0f}% "
                         f"{ci('rerr:' + key)} | {point[f'p0@{mk:g}']:.3f} |")
    for f in meta["final_fractions"]:
        key = f"final@{f:g}"
        lines.append(f"| one run at {f:g}·ε, best grid lr for free | {sig[f'f={f:g}']:.3f} | "
                     f"{point[key]:.3f} {ci(key)} | {100 * _rerr(point[key], base, top):.0f}% "
                     f"{ci('rerr:' + key)} | — |")
    lines += ["", "Mean test accuracy by lr (all seeds):", "",
              "| σ | " + " | ".join(f"{lr:g}" for lr in meta["lrs"]) + " |",
              "|---|" + "---|" * len(meta["lrs"])]
    for label, (_, t) in full.items():
        lines.append(f"| {label}: {sig[label]:.3f} | "
                     + " | ".join(f"{x:.3f}" for x in t.mean(axis=1)) + " |")
    return lines + [""]


# ------------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    ap.add_argument("--mnist1d-10k", action="store_true",
                    help="10000 MNIST-1D samples (privacy_utility.py --mnist1d-10k)")
    ap.add_argument("--datasets", nargs="+", choices=pu.DATASETS, default=list(pu.DATASETS))
    ap.add_argument("--epsilon", type=float, default=pu.TARGET_EPSILON)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per (σ, lr) cell")
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="first seed (an independent run uses a disjoint seed set)")
    ap.add_argument("--mean-ks", type=float, nargs="+", default=list(MEAN_KS))
    ap.add_argument("--distribution", default="geometric")
    ap.add_argument("--final-fractions", type=float, nargs="*", default=[0.9, 0.75])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ema-decay", type=float, default=0.0,
                    help="every cell releases the moving average of its weights "
                    "(privacy_utility.py --ema-decay)")
    ap.add_argument("--mnist1d-model", default=None,
                    help="model of the MNIST-1D cells (privacy_utility.py --mnist1d-model)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--replot", action="store_true", help="table from the cells file only")
    args = ap.parse_args(argv)

    try:
        mode = pu.with_ema(pu.with_mnist1d_model(
            "mnist1d_10k" if args.mnist1d_10k else "default", args.mnist1d_model), args.ema_decay)
    except ValueError as exc:
        ap.error(str(exc))
    size = pu.sizing(mode)
    suffix = f"_{args.tag}" if args.tag else ""
    cells_path = RESULTS / f"rs_ceiling{suffix}_cells.jsonl"
    meta_path = RESULTS / f"rs_ceiling{suffix}_meta.json"
    t0 = time.perf_counter()
    if args.replot:
        meta_by = json.loads(meta_path.read_text())
        rows = [json.loads(line) for line in pu.read_text_or_gz(cells_path).splitlines() if line]
    else:
        from raydp_hpo.accounting.accountants import Accountant, calibrate_noise
        from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON, dpsgd_steps

        lrs = lr_grid(*size["lr_range"])
        meta_by = {}
        for dataset in args.datasets:
            data = pu.load(dataset, size["mnist1d_samples"])
            n_train, n_val = len(data.train), len(data.val)
            sigmas = {"one": pu.oracle_sigma(size, args.epsilon, "profile")}
            for mk in args.mean_ks:
                sigmas[f"k={mk:g}"] = random_stopping_sigma(size, dataset, n_train, args.epsilon,
                                                            mk, args.distribution)
            q = float(size["sample_rate"])
            for f in args.final_fractions:
                sigmas[f"f={f:g}"] = calibrate_noise(f * args.epsilon, pu.DELTA, q,
                                                     dpsgd_steps(float(size["epochs"]), q),
                                                     Accountant.TIGHTEST)
            missing = [g for g in size["grid"] if g not in lrs]
            if missing:
                raise SystemExit(f"the oracle grid points {missing} are not on the lr grid")
            meta_by[dataset] = {
                "samples": size["mnist1d_samples"] if dataset == "mnist1d" else len(data.train)
                + len(data.val) + len(data.test),
                "n_train": n_train, "n_val": n_val, "lrs": lrs, "sigmas": sigmas,
                "grid_idx": [lrs.index(g) for g in size["grid"]],
                "mean_ks": list(args.mean_ks), "final_fractions": list(args.final_fractions),
                "distribution": args.distribution,
                "score_scale": 1.0 / (n_val * DEFAULT_SCORE_EPSILON),
            }
            print(dataset, {k: round(v, 3) for k, v in sigmas.items()}, flush=True)
        jobs = [(d, label, s, i, lr, seed)
                for d, meta in meta_by.items() for label, s in meta["sigmas"].items()
                for i, lr in enumerate(meta["lrs"])
                for seed in range(args.seed_offset, args.seed_offset + args.seeds)]
        rows = []
        with ProcessPoolExecutor(args.workers, initializer=pu._init_worker) as pool:
            futs = {pool.submit(cell, d, mode, s, lr, seed): (d, label, s, i, lr, seed)
                    for d, label, s, i, lr, seed in jobs}
            for n, fut in enumerate(as_completed(futs), 1):
                d, label, s, i, lr, seed = futs[fut]
                rows.append({"dataset": d, "sigma_label": label, "sigma": s, "lr_index": i,
                             "lr": lr, "seed": seed, **fut.result()})
                if n % 200 == 0:
                    print(f"  {n}/{len(jobs)} cells, {time.perf_counter() - t0:.0f} s",
                          flush=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        cells_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        meta_path.write_text(json.dumps(meta_by, indent=1))
    seeds = sorted({r["seed"] for r in rows})
    header = (f"Cell seeds {seeds[0]}–{seeds[-1]}. Total ε = {args.epsilon:g}, δ = {pu.DELTA:g}; mode `{mode}`; "
              f"settings of `privacy_utility.py` (model, {size['epochs']} epochs, sample rate "
              f"{size['sample_rate']}, C = 1, lr ∈ loguniform{tuple(size['lr_range'])}); "
              f"score ε_s = 0.1 per trial. Built by `benchmarks/rs_ceiling.py` "
              f"(see its docstring for every estimator). {BOOTSTRAP} bootstrap replicates, "
              f"{MONTE_CARLO} Monte Carlo draws for the point estimates.")
    text = report(rows, meta_by, args.tag or mode, header)
    out = RESULTS / f"rs_ceiling{suffix}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
