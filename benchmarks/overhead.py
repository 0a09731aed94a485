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

Tune's own behaviour is bimodal here, on both sides: with ``max_concurrent_trials=2`` it keeps
either one trial process (the usual case: each trial ends before a second trial actor is up,
and Tune then hands the pending trial to the idle first actor and drops the second) or two
(when the second actor happens to start first), and two processes take ~40% less time. Each
trial reports its process id, each run is labelled with its number of trial processes, and
the like-for-like figure compares runs with the same number (``--concurrency 1`` makes it
always one).

What the figure is made of (measured on 2 vCPUs): ~10-30 ms of Tune's own controller work per
trial; the admission round trip to the ledger actor adds ~2.5-3.5 ms to each trial (one Ray
actor call, ~1-1.5 ms bare here, plus the ledger's RDP check and journal fsync); starting the
ledger actor takes ~0.4-1 s while Tune sets up, and costs the run ~0.2 s. With trials that
train for seconds, all of this vanishes. DPTuner writes no per-trial TensorBoard files by
default (plain Tune does: ~4-7 ms of controller time per trial); ``--dp-tensorboard`` turns
them on for DPTuner too, and ``--plain-no-tensorboard`` off for plain Tune: the like-for-like
figures that isolate the ledger's own cost.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def tiny_trainable(config: dict[str, Any]) -> None:
    """Reports once (with its process id). Passes the real privacy gate first, as the real
    trainable does."""
    from ray import tune

    from raydp_hpo.trial_privacy import privacy_from_config
    from trainables.privacy_gate import RaydpSettings, admit, resolve_ledger

    settings = RaydpSettings.from_config(config)
    if settings.needs_ledger:
        mechanism = privacy_from_config(config, 1000).mechanism()
        admit(settings, mechanism, resolve_ledger(settings, None), owner="bench")
    tune.report({"val_accuracy": float(config.get("lr", 0.0)), "pid": os.getpid()})


def _data() -> Any:
    from trainables.data import Dataset, split

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1250, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=1250).astype(np.int64)
    return split(Dataset(x, y, 2), 0.1, 0.1)


def run_plain(n: int, storage: str, concurrency: int, name: str = "plain",
              tensorboard: bool = True) -> tuple[float, int]:
    """Wall time and number of trial processes of plain Tune random search (with Tune's
    default loggers; ``tensorboard=False`` leaves its TensorBoard logger out)."""
    from ray import tune

    from raydp_hpo.tune_hooks import NoTensorBoardLogger

    space = {"lr": tune.uniform(0.0, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 50.0}
    t0 = time.perf_counter()
    grid = tune.Tuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=concurrency,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                  callbacks=None if tensorboard else [NoTensorBoardLogger()]),
    ).fit()
    wall = time.perf_counter() - t0
    return wall, len({(r.metrics or {}).get("pid") for r in grid})


def run_dp(n: int, storage: str, concurrency: int, name: str = "bench",
           tensorboard: bool = False) -> tuple[float, int, float]:
    """Wall time, number of trial processes and certificate ε of DPTuner."""
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
        tensorboard=tensorboard,
    ).fit()
    wall = time.perf_counter() - t0
    processes = len({t["metrics"].get("pid") for t in result.private_trials})
    return wall, processes, result.certificate.epsilon


def like_for_like(plains: list[tuple[float, int]], dps: list[tuple[float, int]]
                  ) -> list[tuple[int, int, int, float, float]]:
    """Per number of trial processes seen on both sides: (processes, plain runs, DPTuner runs,
    plain median, DPTuner median)."""
    by_plain, by_dp = collections.defaultdict(list), collections.defaultdict(list)
    for wall, procs in plains:
        by_plain[procs].append(wall)
    for wall, procs in dps:
        by_dp[procs].append(wall)
    return [
        (k, len(by_plain[k]), len(by_dp[k]), statistics.median(by_plain[k]),
         statistics.median(by_dp[k]))
        for k in sorted(set(by_plain) & set(by_dp))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9,
                        help="plain/DP pairs, run alternately (wall times vary run to run)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--dp-tensorboard", action="store_true",
                        help="DPTuner writes per-trial TensorBoard files too, as plain Tune does")
    parser.add_argument("--plain-no-tensorboard", action="store_true",
                        help="plain Tune without its TensorBoard logger, as DPTuner by default")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    plains: list[tuple[float, int]] = []
    dps: list[tuple[float, int]] = []
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
                        plains.append(run_plain(args.trials, tmp, args.concurrency,
                                                f"plain-{rep}", not args.plain_no_tensorboard))
                    else:
                        wall, procs, eps = run_dp(args.trials, tmp, args.concurrency,
                                                  f"dp-{rep}", args.dp_tensorboard)
                        dps.append((wall, procs))
                (pw, pp), (dw, dpp) = plains[-1], dps[-1]
                print(f"  pair {rep + 1}: plain {pw:6.2f} s ({pp} proc)   DPTuner {dw:6.2f} s "
                      f"({dpp} proc)   ratio {dw / pw:.3f}", flush=True)
        finally:
            ray.shutdown()
    ratios = [d / p for (d, _), (p, _) in zip(dps, plains)]
    plain_median = statistics.median(w for w, _ in plains)
    dp_median = statistics.median(w for w, _ in dps)
    print(f"trials={args.trials} concurrency={args.concurrency} repeats={args.repeats} "
          f"tensorboard: plain={not args.plain_no_tensorboard} DPTuner={args.dp_tensorboard}")
    print(f"plain Ray Tune random search : median {plain_median:8.2f} s")
    print(f"DPTuner (ledger, per-trial)  : median {dp_median:8.2f} s   "
          f"(certificate ε={eps:.3f})")
    print(f"wall-time ratio DP/plain     : median {statistics.median(ratios):8.3f}   "
          f"range {min(ratios):.3f}-{max(ratios):.3f}   (target ≤ 1.15)")
    print(f"ratio of medians             : {dp_median / plain_median:8.3f}")
    for procs, n_plain, n_dp, p_med, d_med in like_for_like(plains, dps):
        print(f"like for like, {procs} trial process(es): plain {p_med:6.2f} s ({n_plain} runs)  "
              f"DPTuner {d_med:6.2f} s ({n_dp} runs)  ratio of medians {d_med / p_med:.3f}")


if __name__ == "__main__":
    main()
