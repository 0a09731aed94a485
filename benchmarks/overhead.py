"""Overhead of DPTuner (ledger actor, plan charge, audit callback, stopper, searcher) against
plain Ray Tune random search, on the same tiny trainable: N trials that report once.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/overhead.py --trials 200

Prints both wall times and their ratio (target ≤ 1.15). Both sides use the same Ray runtime,
``max_concurrent_trials`` and ``reuse_actors=True`` (DPTuner's default). DPTuner runs
``grid_composed`` with N grid points, each trial
*declared* in the config (its mechanism is charged per trial, as in a real naive grid), so the
ledger is on the hot path of every trial. The trainable reports once and never trains.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import numpy as np


def tiny_trainable(config: dict[str, Any]) -> None:
    """Reports once. Charges its declared mechanism like the real trainable's gate does."""
    from ray import tune

    from raydp_hpo.ledger_actor import get_ledger
    from raydp_hpo.trial_privacy import privacy_from_config

    raydp = config.get("raydp") or {}
    if raydp.get("charge"):
        ledger = get_ledger(raydp["ledger"], namespace=raydp["namespace"])
        mech = privacy_from_config(config, 1000).mechanism()
        ledger.charge(raydp["charge_id"], mech, owner="bench")
    tune.report({"val_accuracy": float(config.get("lr", 0.0))})


def _data() -> Any:
    from trainables.data import Dataset, split

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1250, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=1250).astype(np.int64)
    return split(Dataset(x, y, 2), 0.1, 0.1)


def run_plain(n: int, storage: str, concurrency: int) -> float:
    from ray import tune

    space = {"lr": tune.uniform(0.0, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 50.0}
    t0 = time.perf_counter()
    tune.Tuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=concurrency,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name="plain", storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - t0


def run_dp(n: int, storage: str, concurrency: int) -> tuple[float, float]:
    from ray import tune

    from raydp_hpo.budget import PrivacyBudget
    from raydp_hpo.tuner import DPTuner

    lrs = list(np.linspace(0.0, 1.0, n))
    space = {"lr": tune.grid_search(lrs), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 50.0}
    t0 = time.perf_counter()
    result = DPTuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        space,
        "grid_composed",
        PrivacyBudget(50.0, 1e-5),
        data=_data(),
        storage_path=storage,
        experiment=f"bench-{n}",
        max_concurrent_trials=concurrency,
    ).fit()
    wall = time.perf_counter() - t0
    return wall, result.certificate.epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    with tempfile.TemporaryDirectory(prefix="rdh-bench-") as tmp:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="rdhb", dir="/tmp"))
        try:
            run_plain(4, tmp + "/warm", args.concurrency)  # warm up workers / imports
            plain = run_plain(args.trials, tmp, args.concurrency)
            dp, eps = run_dp(args.trials, tmp, args.concurrency)
        finally:
            ray.shutdown()
    print(f"trials={args.trials} concurrency={args.concurrency}")
    print(f"plain Ray Tune random search : {plain:8.2f} s")
    print(f"DPTuner (ledger, per-trial)  : {dp:8.2f} s   (certificate ε={eps:.3f})")
    print(f"wall-time ratio DP/plain     : {dp / plain:8.3f}   (target ≤ 1.15)")


if __name__ == "__main__":
    main()
