"""Federated averaging: adaptive (non-private ADADP) client learning rates vs constant-lr SGD
vs Adam, as the client data go from pathological to iid (Koskela & Honkela 2020, Fig. 1–3).

Setting (the paper's, scaled down): 5 clients, every client in every round (C = 1), one
local epoch per round (the paper: |B|·E = 10,000 = one epoch of a client's data), |B| = 10,
the class-pathological split of :func:`raydp_hpo.trainables.federated.pathological_split` (client k
holds classes {2k, 2k+1}) with a fraction p of the records dealt at random instead
(p = 1: iid). Methods, as in the paper:

* ADADP (non-private, tol = 0.1, α ∈ [0.9, 1.1]) with η₀ = 0.1 — no tuning;
* SGD with a constant learning rate on a half-decade grid; reported twice: the best grid
  point **per cell** (dataset, p) by mean final test accuracy — the paper's "optimally tuned
  SGD", an oracle that tunes on the test set — and the grid point that is best on the iid
  split (p = 1) kept for every p (what one would tune without knowing the split);
* Adam with the best initial learning rate of a half-decade grid per cell (the paper, Fig. 3).

Learning rates here multiply the gradient of the *mean* loss over a minibatch; the paper's
(and its authors' code's) gradients are *sums* over the minibatch, so a rate η here is
η/|B| = η/10 in the paper's units (Adam is invariant to that scale). ADADP's η adapts
multiplicatively, so its η₀ only matters for the first steps.

Datasets: sklearn digits (1,797 records) and MNIST-1D (2,000 records, generated locally),
80/20 train/test, an MLP with one hidden layer of 64 units. Reported: test accuracy of the global model after
the last round, mean ± sd and a 95 % t-interval half-width over seeds (each seed redraws the
client split, the initial model and the minibatch order; the train/test split is fixed).
The per-run accuracy curves go to ``federated_adadp_runs.jsonl`` (written as runs finish,
so a cut-short run keeps what it did; ``--from-runs`` redraws the table and figure from it).

Not private: this benchmark has no ε. The full mode (10 rounds, 3 seeds, 216 runs) took
24 min on two heavily shared cores with ``--workers 2``; ``--quick`` is a smoke-sized run
(5 rounds, 2 seeds). ``federated_adadp_longer.py`` checks 40 rounds on one seed. Neither is the paper's experiment (CIFAR-10, a CNN, 200 rounds).

    PYTHONPATH=. nice python benchmarks/federated_adadp.py --workers 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from raydp_hpo.trainables.data import DataSplits, load_digits, load_mnist1d, split
from raydp_hpo.trainables.federated import (
    ClientOptimizer,
    FedSettings,
    pathological_split,
    run_federated,
)

RESULTS = Path(__file__).resolve().parent / "results" / "federated_adadp"
FRACTIONS = (0.0, 1 / 3, 2 / 3, 1.0)  # the paper's Fig. 3 uses 33 %
DATASETS = ("digits", "mnist1d")
ADADP_LR0 = 0.1
SGD_EXPS = (-1.5, -1.0, -0.5, 0.0, 0.5)
ADAM_EXPS = (-3.0, -2.5, -2.0)
BATCH = 10
HIDDEN = (64,)
#: MNIST-1D records generated (80 % train); 2,000 keeps the full run near 30 min on 2 cores
MNIST1D_SIZE = 2000


@lru_cache(maxsize=4)
def _data(name: str) -> DataSplits:
    raw = load_digits() if name == "digits" else load_mnist1d(MNIST1D_SIZE)
    return split(raw, val_fraction=0.0, test_fraction=0.2, seed=0)


def _methods(rounds: int) -> dict[str, FedSettings]:
    def make(opt: ClientOptimizer, lr: float) -> FedSettings:
        return FedSettings(optimizer=opt, lr=lr, rounds=rounds, batch_size=BATCH,
                           model_kwargs={"hidden": HIDDEN})

    out = {"adadp": make(ClientOptimizer.ADADP, ADADP_LR0)}
    out.update({f"sgd@1e{e:+.1f}": make(ClientOptimizer.SGD, 10**e) for e in SGD_EXPS})
    out.update({f"adam@1e{e:+.1f}": make(ClientOptimizer.ADAM, 10**e) for e in ADAM_EXPS})
    return out


def _run(job: tuple[str, bool, float, int, str, int]) -> dict[str, object]:
    """One federated run (a worker process): the accuracy after each round."""
    name, quick, p, seed, method, rounds = job
    torch.set_num_threads(1)
    data = _data(name)
    settings = _methods(rounds)[method]
    parts = pathological_split(data.train.labels, 5, p, np.random.default_rng([seed, 7]))
    shards = [data.train.subset(i) for i in parts]
    t = time.perf_counter()
    res = run_federated(shards, data.test, settings, seed=seed)
    return {"dataset": name, "p": p, "seed": seed, "method": method, "rounds": rounds,
            "quick": quick, "accuracy": res.accuracy, "seconds": time.perf_counter() - t,
            "accepted": sum(res.accepted), "rejected": sum(res.rejected),
            "final_lr": [float(v) for v in res.client_lr[-1]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized run (a few minutes)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per cell; default 3, quick 2")
    ap.add_argument("--seed-offset", type=int, default=0,
                    help="first seed (an independent second run: --seed-offset 3)")
    ap.add_argument("--rounds", type=int, default=None, help="default 10; quick 5")
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    ap.add_argument("--workers", type=int, default=1, help="worker processes (1 thread each)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--from-runs", action="store_true",
                    help="only redraw the table and figure from federated_adadp_runs.jsonl[.gz]")
    a = ap.parse_args(argv)
    runs_path = a.out / "federated_adadp_runs.jsonl"
    rounds = a.rounds or (5 if a.quick else 10)
    seeds = a.seeds or (2 if a.quick else 3)
    if seeds < 1 or rounds < 1 or a.workers < 1:
        ap.error(f"--seeds, --rounds and --workers must be >= 1, got {seeds}, {rounds}, "
                 f"{a.workers}")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not a.from_runs:
        jobs = [(name, a.quick, p, s, m, rounds)
                for s in range(a.seed_offset, a.seed_offset + seeds) for name in a.datasets
                for p in FRACTIONS for m in _methods(rounds)]  # seed-major: a cut run is whole
        runs_path.write_text("")
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(a.workers, mp_context=ctx) as pool, runs_path.open("a") as fh:
            futures = [pool.submit(_run, j) for j in jobs]
            for k, fut in enumerate(as_completed(futures), 1):
                rec = fut.result()
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                print(f"[{time.perf_counter() - t0:6.0f}s] {k}/{len(jobs)} {rec['dataset']} "
                      f"p={rec['p']:.2f} seed={rec['seed']} {rec['method']}: "
                      f"{rec['accuracy'][-1]:.3f}", file=sys.stderr, flush=True)
    packed = runs_path.with_name(runs_path.name + ".gz")  # stored results keep runs gzipped
    text = (gzip.decompress(packed.read_bytes()).decode()
            if not runs_path.exists() and packed.exists() else runs_path.read_text())
    records = [json.loads(line) for line in text.splitlines() if line]
    if not records:
        print(f"no runs in {runs_path}", file=sys.stderr)
        return 1
    rounds = records[0]["rounds"]
    nseeds = len({r["seed"] for r in records})
    rows = _table(records)
    elapsed = sum(r["seconds"] for r in records)
    mode = "quick" if records[0]["quick"] else "full"
    header = (
        f"Federated averaging, 5 clients, C = 1, {rounds} rounds of 1 local epoch, |B| = "
        f"{BATCH}, MLP{HIDDEN}; test accuracy after the last round, mean ± sd [95 % t-interval "
        f"half-width] over {nseeds} seeds ({mode} mode; {elapsed:.0f} s of single-thread run "
        f"time). ADADP η₀ = {ADADP_LR0}, tol = 0.1, α ∈ [0.9, 1.1]. SGD grid 10^e, e ∈ "
        f"{{{', '.join(f'{e:g}' for e in SGD_EXPS)}}}: 'SGD oracle' = best grid point per "
        "row (tuned on the test set), 'SGD tuned at p=1' = the grid point best on the iid "
        f"split, kept for every p. Adam: best of 10^e, e ∈ "
        f"{{{', '.join(f'{e:g}' for e in ADAM_EXPS)}}} per row. Rates multiply the mean-loss "
        "gradient (the paper's sum-gradient rates are these / |B|). p = fraction of records "
        "dealt at random (0: each client has 2 classes, 1: iid)."
    )
    md = header + "\n\n" + _markdown(rows)
    print(md)
    (a.out / "federated_adadp.md").write_text(md + "\n")
    _plot(rows, records, a.out / "federated_adadp.png",
          f"FedAvg, 5 clients, {rounds} rounds, |B|={BATCH}, {nseeds} seeds (mean ± sd)")
    return 0


@dataclass(frozen=True)
class Row:
    """One (dataset, p) cell: final accuracies per seed of each reported method."""

    dataset: str
    p: float
    adadp: list[float]
    sgd_best: list[float]
    sgd_best_lr: str
    sgd_iid: list[float]
    sgd_iid_lr: str
    adam: list[float]
    adam_lr: str
    reject_share: float


def _final(records: list[dict], name: str, p: float, method: str) -> list[float]:
    return [r["accuracy"][-1] for r in sorted(records, key=lambda r: r["seed"])
            if r["dataset"] == name and r["p"] == p and r["method"] == method]


def _best(records: list[dict], name: str, p: float, prefix: str) -> str:
    methods = sorted({r["method"] for r in records if r["method"].startswith(prefix)})
    return max(methods, key=lambda m: float(np.mean(_final(records, name, p, m) or [-1.0])))


def _table(records: list[dict]) -> list[Row]:
    rows: list[Row] = []
    for name in sorted({r["dataset"] for r in records}):
        ps = sorted({r["p"] for r in records if r["dataset"] == name})
        iid = _best(records, name, max(ps), "sgd@")
        for p in ps:
            best, adam = _best(records, name, p, "sgd@"), _best(records, name, p, "adam@")
            ad = [r for r in records if r["dataset"] == name and r["p"] == p
                  and r["method"] == "adadp"]
            acc, rej = sum(r["accepted"] for r in ad), sum(r["rejected"] for r in ad)
            rows.append(Row(name, p, _final(records, name, p, "adadp"),
                            _final(records, name, p, best), best[4:],
                            _final(records, name, p, iid), iid[4:],
                            _final(records, name, p, adam), adam[5:],
                            rej / max(acc + rej, 1)))
    return rows


def _stats(v: list[float]) -> tuple[float, float, float]:
    """Mean, sample sd and the 95 % Student-t interval half-width (nan for one value)."""
    from scipy import stats

    x = np.asarray(v, dtype=float)
    if len(x) < 2:
        return float(x.mean()), math.nan, math.nan
    sd = float(x.std(ddof=1))
    return float(x.mean()), sd, float(stats.t.ppf(0.975, len(x) - 1) * sd / math.sqrt(len(x)))


def _ms(v: list[float]) -> str:
    m, sd, hw = _stats(v)
    return f"{m:.3f} ± {sd:.3f} [{hw:.3f}]"


def _markdown(rows: list[Row]) -> str:
    out = ["| dataset | p | ADADP | SGD oracle (lr) | SGD tuned at p=1 (lr) | Adam best (lr) "
           "| ADADP steps rejected |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.dataset} | {r.p:.2f} | {_ms(r.adadp)} | {_ms(r.sgd_best)} ({r.sgd_best_lr}) "
            f"| {_ms(r.sgd_iid)} ({r.sgd_iid_lr}) | {_ms(r.adam)} ({r.adam_lr}) "
            f"| {100 * r.reject_share:.0f} % |"
        )
    return "\n".join(out)


def _plot(rows: list[Row], records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r.dataset for r in rows})
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 8), squeeze=False)
    for col, name in enumerate(names):
        ax = axes[0][col]
        sub = [r for r in rows if r.dataset == name]
        ps = [100 * r.p for r in sub]
        for key, label in (("adadp", f"ADADP (η₀ = {ADADP_LR0}, no tuning)"),
                           ("sgd_best", "SGD, best lr per p (oracle)"),
                           ("sgd_iid", "SGD, lr tuned at p = 100 %"),
                           ("adam", "Adam, best lr per p")):
            st = [_stats(getattr(r, key)) for r in sub]
            ax.errorbar(ps, [m for m, _, _ in st], yerr=[0 if math.isnan(s) else s for _, s, _ in st],
                        marker="o", capsize=3, label=label)
        ax.set_xlabel("% of data assigned at random (0 pathological, 100 iid)")
        ax.set_ylabel("test accuracy after the last round")
        ax.set_title(f"{name}: (a) interpolated case")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1][col]
        p0 = min(r.p for r in sub)
        row0 = next(r for r in sub if r.p == p0)
        for method, label in (("adadp", "ADADP"), (f"sgd@{row0.sgd_best_lr}",
                                                    f"SGD lr {row0.sgd_best_lr} (oracle)"),
                              (f"adam@{row0.adam_lr}", f"Adam lr {row0.adam_lr}")):
            curves = np.array([r["accuracy"] for r in records if r["dataset"] == name
                               and r["p"] == p0 and r["method"] == method])
            if len(curves) == 0:
                continue
            x = np.arange(curves.shape[1])
            m, s = curves.mean(axis=0), curves.std(axis=0)
            ax.plot(x, m, label=label)
            ax.fill_between(x, m - s, m + s, alpha=0.2)
        ax.set_xlabel("communication round")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{name}: (b) {100 * p0:.0f} % random case")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
