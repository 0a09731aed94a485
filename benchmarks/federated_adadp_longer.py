"""Diagnostic for ``federated_adadp.py``: longer runs on digits (one seed, 40 rounds) of ADADP
(tol = 0.1, the paper's federated value, and tol = 1.0, its DP value) and SGD at the best
grid rate 10^-0.5, at p = 0 (pathological) and p = 1 (iid). Prints one JSON line per run
(accuracy per round, final client learning rates, share of rejected ADADP steps). One seed:
no spread; a check of whether more rounds close the gap, not a result table.

    PYTHONPATH=. nice python benchmarks/federated_adadp_longer.py
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

from raydp_hpo.trainables.data import load_digits, split
from raydp_hpo.trainables.federated import (
    ClientOptimizer,
    FedSettings,
    pathological_split,
    run_federated,
)

ROUNDS = 40


def _job(args: tuple[float, str, float, float]) -> dict[str, object]:
    p, opt, lr, tol = args
    torch.set_num_threads(1)
    d = split(load_digits(), val_fraction=0.0, test_fraction=0.2, seed=0)
    parts = pathological_split(d.train.labels, 5, p, np.random.default_rng([0, 7]))
    s = FedSettings(optimizer=ClientOptimizer(opt), lr=lr, rounds=ROUNDS, batch_size=10,
                    tol=tol, model_kwargs={"hidden": (64,)})
    r = run_federated([d.train.subset(i) for i in parts], d.test, s, seed=0)
    steps = sum(r.rejected) + sum(r.accepted)
    return {"p": p, "optimizer": opt, "lr": lr, "tol": tol, "accuracy": r.accuracy,
            "final_lr": [float(x) for x in r.client_lr[-1]],
            "rejected_share": sum(r.rejected) / max(1, steps)}


def main() -> int:
    jobs = [(p, o, lr, tol) for p in (0.0, 1.0) for (o, lr, tol) in
            (("adadp", 0.1, 0.1), ("sgd", 10**-0.5, 0.1), ("adadp", 0.1, 1.0))]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
        for rec in ex.map(_job, jobs):
            print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
