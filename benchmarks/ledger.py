"""Admission latency of the privacy ledger with 10 / 100 / 1000 heterogeneous DP-SGD charges
already composed, per halting accountant. Prints a table (median and p90 in ms).

Each admission is a fresh, never-seen mechanism (no cache hits): the time includes its RDP
curve (and PLD for PLD halting), the halting check and the fsync'd journal append.

    python benchmarks/ledger.py [--sizes 10 100 1000] [--probes 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from raydp_hpo.accounting import Accountant
from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.ledger import Adaptivity, PrivacyLedger
from raydp_hpo.mechanisms import SubsampledGaussian


def _mechanisms(rng: np.random.Generator, n: int) -> list[SubsampledGaussian]:
    return [
        SubsampledGaussian(
            noise_multiplier=float(rng.uniform(5.0, 50.0)),
            sample_rate=float(rng.uniform(0.001, 0.05)),
            steps=int(rng.integers(50, 2000)),
        )
        for _ in range(n)
    ]


MODES = {
    "adaptive RDP filter": (Adaptivity.ADAPTIVE, Accountant.RDP),
    "fixed-plan RDP": (Adaptivity.FIXED_PLAN, Accountant.RDP),
    "fixed-plan PLD": (Adaptivity.FIXED_PLAN, Accountant.PLD),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--skip-pld-above", type=int, default=1000)
    args = parser.parse_args()
    budget = PrivacyBudget(epsilon=1e6, delta=1e-5)  # large: every charge is admitted
    print(f"{'halting rule':<22} {'composed':>8} {'median ms':>10} {'p90 ms':>8}")
    for label, (adaptivity, accountant) in MODES.items():
        for size in args.sizes:
            if accountant is Accountant.PLD and size > args.skip_pld_above:
                continue
            rng = np.random.default_rng(size)
            with tempfile.TemporaryDirectory() as tmp:
                ledger = PrivacyLedger(
                    budget, Path(tmp) / "bench.journal", adaptivity=adaptivity,
                    accountant=accountant,
                )
                for i, mech in enumerate(_mechanisms(rng, size)):
                    ledger.charge(f"pre-{i}", mech)
                times = []
                for j, mech in enumerate(_mechanisms(rng, args.probes)):
                    start = time.perf_counter()
                    ledger.charge(f"probe-{j}", mech)
                    times.append((time.perf_counter() - start) * 1e3)
                ledger.close()
            times.sort()
            p90 = times[int(0.9 * (len(times) - 1))]
            print(f"{label:<22} {size:>8} {statistics.median(times):>10.1f} {p90:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
