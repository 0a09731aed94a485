"""Issue #38: what a ledger *named* in the experiment file records, against what the
experiment certifies, through the CLI path (`raydp-hpo run`'s ``run_experiment``), on digits at
ε = 3, δ = 1e-5: one search per algorithm on a fresh ledger, a journal file
(``ledger: {name: …}``), a PostgreSQL ledger (``ledger: {name: …, uri: postgresql://…}``, a
throw-away server from ``tests/raydp_hpo/ledger/pg_server.py``) or the dataset's own ledger
(no ``ledger:`` block). Also the first experiment's certified ε at its δ share against the
same plan's tightest figure at the whole δ (issue #38's ≥ 0.97).

    .venv/bin/python benchmarks/named_ledgers.py [--ledger file pg dataset]

Prints one Markdown row per run; the runs go to temporary directories.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataset_ledger as bench  # noqa: E402  (benchmarks/dataset_ledger.py)

ALGORITHMS = {"one_shot_random": {"settings": {}},
              "random_stopping": {"settings": {"distribution": "geometric", "mean": 2}}}


def one(kind: str, algorithm: str, tmp: Path) -> str:
    from raydp_hpo.accounting.accountants import Accountant, epsilon
    from raydp_hpo.ledger.filter import PrivacyLedger

    raw: dict[str, Any] = bench.experiment("digits", algorithm, tmp, f"{algorithm}-1")
    name = f"org-{algorithm.replace('_', '-')}"
    server = None
    if kind == "file":
        raw["ledger"] = {"name": name}
    elif kind == "pg":
        from tests.raydp_hpo.ledger.pg_server import start_server

        server, why = start_server()  # a database of its own: the registry binds digits once
        if server is None:
            return f"| pg | {algorithm} | no server: {why} |"
        raw["ledger"] = {"name": name, "uri": server.uri(name)}
    try:
        outcome = bench.run(raw)
        cert = outcome.result.certificate
        report = PrivacyLedger.read_only(outcome.journal).report()
        whole = epsilon(report.charges[0].mechanism, bench.BUDGET["delta"], Accountant.TIGHTEST)
    finally:
        bench.stop_ledger(raw)
        if server is not None:
            server.cleanup()
    return (f"| {kind} | {algorithm} | {report.adaptivity.value} ({report.delta_split}) | "
            f"{cert.epsilon:.4f} (δ={cert.budget.delta:.3g}) | {report.spent_epsilon:.4f} | "
            f"{cert.epsilon / report.spent_epsilon:.4f} | {whole:.4f} | "
            f"{whole / cert.epsilon:.4f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", nargs="+", choices=["file", "pg", "dataset"],
                        default=["file", "pg", "dataset"])
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PGUSER"] = "ledger_rw"  # the throw-away server's ledger role (before Ray)
    bench.SEARCHES.update(ALGORITHMS)
    import ray

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    print("| ledger | algorithm | rule (δ split) | certified ε | ledger records | certified / "
          "recorded | plan's tightest ε at the whole δ | whole-δ / certified |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        for kind in args.ledger:
            for algorithm in ALGORITHMS:
                with tempfile.TemporaryDirectory(prefix="rdh-bench-", dir=Path.home()) as tmp:
                    print(one(kind, algorithm, Path(tmp)), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
