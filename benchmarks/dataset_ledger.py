"""How tightly a dataset's ledger accounts, measured through the CLI path (`raydp-hpo run`'s
``run_experiment``, the same code ``ray job submit`` runs), on the built-in datasets.

For each dataset (MNIST-1D, digits) and each of the six algorithms, one search on a *fresh*
dataset ledger at ε = 3, δ = 1e-5: the certificate's ε (the experiment's tightest valid figure
at its δ share) against what the dataset ledger records as spent, and what the previous rule
(the adaptive RDP filter over 24 orders at δ) would have recorded for the very same plan.
Then 2 and 5 experiments on one dataset ledger of ε = 3 (``create_dataset_ledger``): the
total of what they certify against the ledger's recorded spend (min of the RDP filter at δ_A
and basic composition of their points; :mod:`raydp_hpo.ledger.experiments`).

    .venv/bin/python benchmarks/dataset_ledger.py [--datasets mnist1d digits] [--quick]

Prints a Markdown table per part; writes nothing else (the runs go to a temporary directory).
Issue #30's targets: single search certified ≥ 0.98 × recorded; several experiments
certified ≥ 0.9 × recorded, recorded ≤ budget.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

BUDGET = {"epsilon": 3.0, "delta": 1.0e-5}

#: one small, calibrated (no noise_multiplier in the space) experiment per algorithm
SEARCHES: dict[str, dict[str, Any]] = {
    "one_shot_random": {"settings": {}},
    "random_stopping": {"settings": {"distribution": "geometric", "mean": 3}},
    "subsampled_transfer": {"settings": {"mean": 3, "subsample_rate": 0.2}},
    "svt_threshold": {"settings": {"num_partitions": 5, "max_rounds": 3}},
    "linear_scaling": {"settings": {"runs_per_sweep": 2}},
    "grid_composed": {"settings": {}},
}


def experiment(dataset: str, algorithm: str, storage: Path, name: str,
               budget: dict[str, float] | None = None, quick: bool = False) -> dict[str, Any]:
    """The experiment file (as a dict) of one run."""
    data: dict[str, Any] = {"source": dataset, "val_fraction": 0.15, "test_fraction": 0.15}
    if dataset == "mnist1d":
        data.update(size=1000 if quick else 2000, generator_seed=42)
    lr = {"loguniform": [0.1, 2.0], "points": 3}
    space: dict[str, Any] = {"lr": lr, "sample_rate": 0.05, "epochs": 1, "max_grad_norm": 1.0,
                             "optimizer": "sgd"}
    if algorithm == "grid_composed":
        space["lr"] = {"loguniform": [0.1, 2.0], "points": 2}
        space["noise_multiplier"] = 2.0  # a grid composes fixed trials
    return {
        "experiment": name,
        "data": data,
        "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
        "search": {"algorithm": algorithm, **copy.deepcopy(SEARCHES[algorithm]),
                   "max_concurrent_trials": 2},
        "space": space,
        "budget": dict(budget or BUDGET),
        "resources": {"cpu": 1, "gpu": 0},
        "storage_path": str(storage),
    }


def run(raw: dict[str, Any]) -> Any:
    from raydp_hpo.cli.experiment import parse_experiment, run_experiment

    spec = parse_experiment(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_experiment(spec, out=lambda _line: None)


def stop_ledger(raw: dict[str, Any]) -> None:
    """Stop the dataset ledger's actor (its journal stays): the next part uses another
    storage path, hence another journal, for the same dataset."""
    import contextlib

    import ray

    from raydp_hpo.cli.experiment import parse_experiment

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(parse_experiment(raw).ledger_name, namespace="raydp_hpo"))


def old_rule(plan: Any, delta: float) -> float:
    """What the previous dataset-ledger rule (adaptive RDP filter at δ) records for ``plan``."""
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.ledger.filter import PrivacyLedger

    ledger = PrivacyLedger(PrivacyBudget(1e6, delta))
    ledger.charge("plan", plan)
    return ledger.spent()


def single_searches(datasets: list[str], quick: bool,
                    algorithms: list[str] | None = None) -> list[str]:
    from raydp_hpo.ledger.filter import PrivacyLedger

    rows = ["| dataset | algorithm | certified ε (at its δ) | ledger recorded | certified / "
            "recorded | previous rule would record | wall |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for dataset in datasets:
        for algorithm in algorithms or list(SEARCHES):
            with tempfile.TemporaryDirectory(prefix="rdh-bench-", dir=Path.home()) as tmp:
                t0 = time.perf_counter()
                raw = experiment(dataset, algorithm, Path(tmp), f"{algorithm}-1", quick=quick)
                try:
                    outcome = run(raw)
                finally:
                    stop_ledger(raw)
                cert = outcome.result.certificate
                report = PrivacyLedger.read_only(outcome.journal).report()
                point = report.charges[0].mechanism
                previous = old_rule(point, BUDGET["delta"]) if not hasattr(point, "count") \
                    else math.nan
                rows.append(
                    f"| {dataset} | {algorithm} | {cert.epsilon:.4f} (δ={cert.budget.delta:.2g}) "
                    f"| {report.spent_epsilon:.4f} | {cert.epsilon / report.spent_epsilon:.4f} "
                    f"| {previous:.4f} | {time.perf_counter() - t0:.0f} s |")
                print(rows[-1], flush=True)
    return rows


def several(dataset: str, count: int, algorithms: list[str], quick: bool) -> str:
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.cli.experiment import parse_experiment
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.tune.dataset_ledger import create_dataset_ledger

    per = round(BUDGET["epsilon"] / count, 6)
    with tempfile.TemporaryDirectory(prefix="rdh-bench-", dir=Path.home()) as tmp:
        storage = Path(tmp)
        first = parse_experiment(experiment(dataset, algorithms[0], storage, "e0", quick=quick))
        journal = create_dataset_ledger(first.data.fingerprint(),
                                        PrivacyBudget(BUDGET["epsilon"], BUDGET["delta"]),
                                        storage)
        certified, refused = [], 0
        for i in range(count):
            algorithm = algorithms[i % len(algorithms)]
            try:
                outcome = run(experiment(dataset, algorithm, storage, f"e{i}",
                                         budget={"epsilon": per, "delta": BUDGET["delta"]},
                                         quick=quick))
            except Exception as exc:  # noqa: BLE001 - a refusal is a result here
                refused += 1
                print(f"  experiment {i} ({algorithm}) refused: {type(exc).__name__}: "
                      f"{str(exc)[:160]}", flush=True)
                continue
            certified.append(outcome.result.certificate.epsilon)
        stop_ledger(experiment(dataset, algorithms[0], storage, "e0", quick=quick))
        report = PrivacyLedger.read_only(journal).report()
        by = report.epsilon_by_accountant
        return (f"| {dataset} | {count} × ε={per:g} ({', '.join(sorted(set(algorithms)))}) | "
                f"{len(certified)} admitted, {refused} refused | {sum(certified):.4f} | "
                f"{report.spent_epsilon:.4f} (A {by.get('rdp_filter_split_delta', math.nan):.4f}"
                f", B {by.get('basic_composition', math.nan):.4f}) | "
                f"{sum(certified) / report.spent_epsilon:.3f} | "
                f"{report.spent_epsilon <= BUDGET['epsilon']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mnist1d", "digits"])
    parser.add_argument("--quick", action="store_true", help="smaller MNIST-1D")
    parser.add_argument("--part", choices=["single", "several", "both"], default="both")
    parser.add_argument("--algorithms", nargs="+", choices=list(SEARCHES), default=None,
                        help="single part: these algorithms only")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        if args.part in ("single", "both"):
            print("\n".join(single_searches(args.datasets, args.quick, args.algorithms)))
        if args.part in ("several", "both"):
            rows = ["| dataset | experiments | admitted | Σ certified ε | ledger recorded "
                    "(A: RDP filter at δ_A, B: basic composition) | certified / recorded | "
                    "recorded ≤ 3 |", "| --- | --- | --- | --- | --- | --- | --- |"]
            for dataset in args.datasets:
                rows.append(several(dataset, 2, ["random_stopping", "one_shot_random"],
                                    args.quick))
                print(rows[-1], flush=True)
                rows.append(several(dataset, 5, ["one_shot_random", "random_stopping"],
                                    args.quick))
                print(rows[-1], flush=True)
            print("\n".join(rows))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
