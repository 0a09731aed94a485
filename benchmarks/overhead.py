"""Overhead of DPTuner (ledger actor, admission, audit callback, stopper, searcher) against
plain Ray Tune random search, on the same tiny trainable: N trials that report once.

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/overhead.py --trials 200 --repeats 7 \
        --concurrency 1 --no-loggers

Sides, run interleaved (the order rotates each repeat, so drift in machine load hits every
side alike), each reported as median and range, and the ratio to plain Tune per repeat:

* ``plain`` — plain Ray Tune random search, ``num_samples`` = the DPTuner run's trial count;
* ``dp`` — DPTuner with ``--search`` (default ``random_stopping``: one plan charge admitted
  before Tune starts; every trial is covered by it and checks the plan's receipt against the
  journal locally, :mod:`raydp_hpo.ledger.plan_receipt`, with no ledger round trip);
* ``dp-round-trip`` — the same DPTuner run, but every trial drops its receipt and asks the
  ledger actor (actor look-up + ``has_charge``), as every plan-covered trial did before plan
  receipts: the "before" figure, measured in the same session.

With ``--search grid_composed`` every trial charges the ledger itself (one round trip each,
the worst case: such charges do not exist before the ledger admits them), and the
``dp-round-trip`` side is the same as ``dp``.

Random stopping's number of trials K is secret in real use; here a fixed ``secret_seed`` and
a Poisson K of mean ``--trials`` make it the same in every DPTuner run, and plain Tune runs
exactly K trials (the warm-up DPTuner run tells K). The trainable passes the real privacy gate
(DPTuner sides) and reports once; it never trains. DPTuner's timed region includes starting
its dedicated ledger actor, charging the plan and the certificate.

Like for like: ``--no-loggers`` turns Tune's CSV and TensorBoard loggers off on both sides
(null callbacks in their slots; the JSON logger stays on both, Tune's results are read from
it); without it DPTuner writes no TensorBoard files (its default) and plain Tune does unless
``--plain-no-tensorboard``.
Tune's behaviour is bimodal at ``--concurrency 2`` (it keeps one or, by a start-up race, two
trial processes; two take ~40% less time): each run is labelled with its number of trial
processes; ``--concurrency 1`` makes it always one.

What the figure is made of (measured on 2 vCPUs): ~10-30 ms of Tune's own controller work per
trial; a ledger round trip adds ~2.5-5 ms to a trial (a Ray actor call, ~1.4 ms bare here,
the actor look-up, and for a charge the ledger's RDP check and journal fsync); a receipt check
reads the seal and one journal line (~0.16 ms, a ~3.6 kB record). Starting the ledger actor
takes ~0.5-1.6 s (a new worker process that loads the accountants). Since 2026-11-25 a fresh
dedicated ledger's plan is charged by the driver on the journal before the actor exists, and
the actor starts beside the trials (:func:`raydp_hpo.ledger.actor.charge_before_start`), so
that start is off the critical path: what is left is ~1 ms per trial (the ``raydp`` config
block Tune copies, pickles and logs, ~0.5 ms; the trial's privacy gate, ~0.4 ms). With trials
that train for seconds, all of this vanishes.

Results of this session's runs: ``benchmarks/results/overhead/summary.md`` and ``benchmarks/results/dpsgd_throughput/issue15_cpu.md``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
from ray.tune.logger import CSVLoggerCallback

from raydp_hpo.tune.hooks import SilentLogger


def tiny_trainable(config: dict[str, Any]) -> None:
    """Reports once (with its process id). Passes the real privacy gate first, as the real
    trainable does."""
    from ray import tune

    from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit, resolve_ledger
    from raydp_hpo.trial.privacy import privacy_from_config

    settings = RaydpSettings.from_config(config)
    if config.get("bench_round_trip"):  # the "before" side: ask the ledger actor, as before
        settings = dataclasses.replace(settings, plan_receipt=None)
    if settings.needs_ledger:
        mechanism = privacy_from_config(config, 1000).mechanism()
        admit(settings, mechanism, resolve_ledger(settings, None), owner="bench")
    tune.report({"val_accuracy": float(config.get("lr", 0.0)), "pid": os.getpid()})


def _data() -> Any:
    from raydp_hpo.trainables.data import Dataset, split

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1250, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=1250).astype(np.int64)
    return split(Dataset(x, y, 2, public_size=len(y)), 0.1, 0.1)  # public: synthetic


class NoCSVLogger(SilentLogger, CSVLoggerCallback):
    """Fills the slot of Tune's CSV logger and writes nothing (as ``NoTensorBoardLogger``)."""


def _no_csv() -> NoCSVLogger:
    return NoCSVLogger()


def run_plain(n: int, storage: str, concurrency: int, name: str = "plain",
              tensorboard: bool = True, csv: bool = True) -> tuple[float, int]:
    """Wall time and number of trial processes of plain Tune random search (with Tune's
    default loggers; ``tensorboard=False`` leaves its TensorBoard logger out)."""
    from ray import tune

    from raydp_hpo.tune.hooks import NoTensorBoardLogger

    space = {"lr": tune.uniform(0.0, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 50.0}
    t0 = time.perf_counter()
    grid = tune.Tuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=n, max_concurrent_trials=concurrency,
                                    reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0,
                                  callbacks=([] if tensorboard else [NoTensorBoardLogger()])
                                  + ([] if csv else [_no_csv()])),
    ).fit()
    wall = time.perf_counter() - t0
    return wall, len({(r.metrics or {}).get("pid") for r in grid})


def run_dp(n: int, storage: str, concurrency: int, name: str = "bench",
           tensorboard: bool = False, search: str = "random_stopping",
           round_trip: bool = False, csv: bool = True) -> tuple[float, int, float, int]:
    """Wall time, number of trial processes, certificate ε and number of trials of DPTuner.

    ``random_stopping``: Poisson K of mean ``n`` (fixed secret seed: the same K every run),
    one plan charge. ``grid_composed``: ``n`` grid points, each trial charged by itself."""
    from ray import tune

    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.tune.tuner import DPTuner

    space: dict[str, Any] = {"epochs": 1, "sample_rate": 0.01, "noise_multiplier": 50.0}
    if round_trip:
        space["bench_round_trip"] = True
    kwargs: dict[str, Any] = {}
    if search == "grid_composed":
        space["lr"] = tune.grid_search(list(np.linspace(0.0, 1.0, n)))
    else:
        space["lr"] = tune.uniform(0.0, 1.0)
        kwargs = {"search_kwargs": {"mean": float(n), "distribution": "poisson"},
                  "secret_seed": 12345}
    t0 = time.perf_counter()
    result = DPTuner(
        tune.with_resources(tiny_trainable, {"cpu": 1}),
        param_space=space,
        search=search,
        budget=PrivacyBudget(50.0, 1e-5),
        data=_data(),
        storage_path=storage,
        experiment=name,
        max_concurrent_trials=concurrency,
        tensorboard=tensorboard,
        callbacks=() if csv else (_no_csv(),),
        **kwargs, fresh_budget=True,
    ).fit()
    wall = time.perf_counter() - t0
    trials = result.private_trials
    if any(t["error"] for t in trials):
        raise RuntimeError(f"a benchmark trial failed: {trials[0]['error']}")
    processes = len({t["metrics"].get("pid") for t in trials})
    return wall, processes, result.certificate.epsilon, len(trials)


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


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values):7.3f}  range {min(values):.3f}-{max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7,
                        help="rounds of all sides, run interleaved (wall times vary run to run)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--search", choices=("random_stopping", "grid_composed"),
                        default="random_stopping")
    parser.add_argument("--no-loggers", action="store_true",
                        help="no CSV and TensorBoard loggers on either side (like for like; "
                             "the JSON logger stays: results are read from it)")
    parser.add_argument("--dp-tensorboard", action="store_true",
                        help="DPTuner writes per-trial TensorBoard files too, as plain Tune does")
    parser.add_argument("--plain-no-tensorboard", action="store_true",
                        help="plain Tune without its TensorBoard logger, as DPTuner by default")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    sides = ["plain", "dp"] + (["dp-round-trip"] if args.search == "random_stopping" else [])
    walls: dict[str, list[tuple[float, int]]] = {side: [] for side in sides}
    eps = float("nan")
    with tempfile.TemporaryDirectory(prefix="rdh-bench-") as tmp:
        ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                 log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="rdhb", dir="/tmp"))
        try:
            run_plain(4, tmp, args.concurrency, "warm")  # warm up workers / imports
            *_, n_trials = run_dp(args.trials, tmp, args.concurrency, "warm-dp",
                                  search=args.search)
            for rep in range(args.repeats):
                order = sides[rep % len(sides):] + sides[: rep % len(sides)]
                for side in order:
                    if side == "plain":
                        walls[side].append(run_plain(
                            n_trials, tmp, args.concurrency, f"plain-{rep}",
                            not (args.plain_no_tensorboard or args.no_loggers),
                            not args.no_loggers))
                    else:
                        wall, procs, eps, n = run_dp(
                            args.trials, tmp, args.concurrency, f"{side}-{rep}",
                            args.dp_tensorboard, args.search, side == "dp-round-trip",
                            not args.no_loggers)
                        assert n == n_trials, (n, n_trials)
                        walls[side].append((wall, procs))
                print(f"  round {rep + 1}: " + "   ".join(
                    f"{side} {walls[side][-1][0]:6.2f} s ({walls[side][-1][1]} proc)"
                    for side in sides), flush=True)
        finally:
            ray.shutdown()
    loggers = ("JSON only (both)" if args.no_loggers else
               f"TensorBoard plain={not args.plain_no_tensorboard} DPTuner={args.dp_tensorboard}")
    print(f"search={args.search} trials={n_trials} concurrency={args.concurrency} "
          f"repeats={args.repeats} loggers: {loggers}  (certificate ε={eps:.3f})")
    for side in sides:
        print(f"{side:<14} wall s   : {_summary([w for w, _ in walls[side]])}")
    plain = [w for w, _ in walls["plain"]]
    for side in sides[1:]:
        ratios = [d / p for (d, _), p in zip(walls[side], plain)]
        print(f"{side:<14} / plain : {_summary(ratios)}   (target ≤ 1.10)")
    for side in sides[1:]:
        for procs, n_plain, n_dp, p_med, d_med in like_for_like(walls["plain"], walls[side]):
            print(f"like for like, {procs} trial process(es): plain {p_med:6.2f} s ({n_plain} "
                  f"runs)  {side} {d_med:6.2f} s ({n_dp} runs)  ratio of medians "
                  f"{d_med / p_med:.3f}")


if __name__ == "__main__":
    main()
