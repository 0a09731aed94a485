"""Overhead of DPTuner (ledger actor, per-trial admission, audit callback, stopper, searcher)
against plain Ray Tune random search, on the same tiny trainable: N trials that report once.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/overhead.py --trials 200 --repeats 9

Prints the wall times of each pair, their ratio, the median ratio (target ≤ 1.15) and the
ratio of the medians. Wall times of plain Tune alone vary by tens of percent from run to run
on a small shared machine, so one pair is not a measurement: pairs alternate which side runs
first, and the medians are the figures. Library imports (Ray Tune, raydp-hpo) happen once per
process and are outside the timed region on both sides.

Both sides use the same Ray runtime, ``max_concurrent_trials`` and ``reuse_actors=True``
(DPTuner's default). DPTuner runs ``grid_composed`` with N grid points: every trial is charged
individually, as in a naive composed grid, so the ledger is on the hot path of every trial
(the worst case: plan-charging searchers admit once). The trainable passes the real privacy
gate (one ledger-actor round trip per trial) and reports once; it never trains. DPTuner's
timed region includes starting its dedicated ledger actor and the certificate.

What the figure is made of (measured on 2 vCPUs): Tune runs these trials one at a time (each
ends before a second trial actor is up), at ~25-35 ms of Tune's own work per trial; the
admission round trip to the ledger actor adds ~3 ms to each, and starting the ledger actor
~0.3-0.5 s once. With trials that train for seconds, both vanish.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def tiny_trainable(config: dict[str, Any]) -> None:
    """Reports once. Passes the real privacy gate first, as the real trainable does."""
    from ray import tune

    from raydp_hpo.trial_privacy import privacy_from_config
    from trainables.privacy_gate import RaydpSettings, admit, resolve_ledger

    settings = RaydpSettings.from_config(config)
    if settings.needs_ledger:
        mechanism = privacy_from_config(config, 1000).mechanism()
        admit(settings, mechanism, resolve_ledger(settings, None), owner="bench")
    tune.report({"val_accuracy": float(config.get("lr", 0.0))})


def _data() -> Any:
    from trainables.data import Dataset, split

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1250, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=1250).astype(np.int64)
    return split(Dataset(x, y, 2), 0.1, 0.1)


def run_plain(n: int, storage: str, concurrency: int, name: str = "plain") -> float:
    from ray import tune

    space = {"lr": tune.uniform(0.0, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 50.0}
    t0 = time.perf_counter()
    tune.Tuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=concurrency,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()
    return time.perf_counter() - t0


def run_dp(n: int, storage: str, concurrency: int, name: str = "bench") -> tuple[float, float]:
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
        experiment=name,
        max_concurrent_trials=concurrency,
    ).fit()
    wall = time.perf_counter() - t0
    return wall, result.certificate.epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9,
                        help="plain/DP pairs, run alternately (wall times vary run to run)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    plains: list[float] = []
    dps: list[float] = []
    eps = float("nan")
    with tempfile.TemporaryDirectory(prefix="rdh-bench-") as tmp:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="rdhb", dir="/tmp"))
        try:
            run_plain(4, tmp, args.concurrency, "warm")  # warm up workers / imports
            for rep in range(args.repeats):
                # Alternate which side goes first, so drift in machine load hits both alike.
                order = ("plain", "dp") if rep % 2 == 0 else ("dp", "plain")
                for side in order:
                    if side == "plain":
                        plains.append(run_plain(args.trials, tmp, args.concurrency, f"plain-{rep}"))
                    else:
                        wall, eps = run_dp(args.trials, tmp, args.concurrency, f"dp-{rep}")
                        dps.append(wall)
                print(f"  pair {rep + 1}: plain {plains[-1]:6.2f} s   DPTuner {dps[-1]:6.2f} s   "
                      f"ratio {dps[-1] / plains[-1]:.3f}", flush=True)
        finally:
            ray.shutdown()
    ratios = [d / p for d, p in zip(dps, plains)]
    print(f"trials={args.trials} concurrency={args.concurrency} repeats={args.repeats}")
    print(f"plain Ray Tune random search : median {statistics.median(plains):8.2f} s")
    print(f"DPTuner (ledger, per-trial)  : median {statistics.median(dps):8.2f} s   "
          f"(certificate ε={eps:.3f})")
    print(f"wall-time ratio DP/plain     : median {statistics.median(ratios):8.3f}   "
          f"range {min(ratios):.3f}-{max(ratios):.3f}   (target ≤ 1.15)")
    print(f"ratio of medians             : {statistics.median(dps) / statistics.median(plains):8.3f}")


if __name__ == "__main__":
    main()
