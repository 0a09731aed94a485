"""Cold RDP curve times: one DP-SGD (Poisson-subsampled Gaussian) curve and one random-stopping
curve over it, each for a never-seen (σ, q), so no cache is hit.

Every round draws fresh parameters and times, interleaved (A, B, C, ... then again):

* ``dpsgd curve``: ``rdp_profile(SubsampledGaussian(σ, q, T))`` — the ledger's admission path;
* ``random stopping (<dist>)``: ``rdp_profile(RandomStopping(SubsampledGaussian(...), dist,
  mean=10))`` for geometric, truncated negative binomial (η = 0.5) and Poisson K, base
  curve included;
* ``dp-accounting dpsgd`` / ``dp-accounting geometric``: dp-accounting's own
  ``RdpAccountant`` on the same events and orders, for scale (the implementation our kernels
  are golden-tested against).

Reports the median and the range (min–max) in milliseconds over the rounds. The import of
:mod:`raydp_hpo.accounting.rdp` is timed separately (mostly numpy/scipy; its constant log-binomial tables
take ~6 ms): it is paid once per process.

Results (2-core machine shared with other jobs, load average 3–6 during the runs; two runs,
30 rounds each): DP-SGD curve median 4.3 and 5.7 ms (minimum 3.3 ms), random stopping
geometric 4.1 / 4.7 ms, truncated negative binomial 4.0 / 4.7 ms, Poisson 6.9 / 7.7 ms, base
curve included; dp-accounting on the same events 300–400 ms. Interleaved against the code
before issue 15 (same machine, 15 rounds): subsampled-Gaussian curve 9.3 → 3.2 ms, random
stopping (geometric, with its base curve) 23.8 → 3.5 ms, Poisson 91 → 5.2 ms; values
bit-identical.

    python benchmarks/accounting_kernels.py [--rounds 40] [--no-reference]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np


def _fresh(rng: np.random.Generator) -> tuple[float, float, int]:
    return float(rng.uniform(0.6, 8.0)), float(rng.uniform(1e-3, 0.05)), int(rng.integers(100, 5000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--no-reference", action="store_true", help="skip dp-accounting")
    args = parser.parse_args()

    t0 = time.perf_counter()
    from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, rdp_profile

    import_ms = (time.perf_counter() - t0) * 1e3
    from raydp_hpo.accounting.mechanisms import (
        RandomStopping,
        StoppingDistribution,
        SubsampledGaussian,
    )

    variants: dict[str, Callable[[float, float, int], object]] = {
        "dpsgd curve": lambda s, q, t: rdp_profile(SubsampledGaussian(s, q, t)),
    }
    for label, dist, shape in [
        ("geometric", StoppingDistribution.GEOMETRIC, None),
        ("tnb eta=0.5", StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 0.5),
        ("poisson", StoppingDistribution.POISSON, None),
    ]:
        variants[f"random stopping ({label})"] = (
            lambda s, q, t, dist=dist, shape=shape: rdp_profile(
                RandomStopping(SubsampledGaussian(s, q, t), dist, 10.0, shape)
            )
        )
    if not args.no_reference:
        from dp_accounting import dp_event
        from dp_accounting.rdp import RdpAccountant

        orders = list(DEFAULT_ORDERS)

        def reference(s: float, q: float, t: int, select: bool) -> float:
            event: dp_event.DpEvent = dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t
            )
            if select:
                event = dp_event.RepeatAndSelectDpEvent(event, 10.0, 1.0)
            return RdpAccountant(orders).compose(event).get_epsilon(1e-5)

        variants["dp-accounting dpsgd"] = lambda s, q, t: reference(s, q, t, False)
        variants["dp-accounting geometric"] = lambda s, q, t: reference(s, q, t, True)

    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for label, fn in variants.items():
            params = _fresh(rng)  # never seen: every call is cold
            t = time.perf_counter()
            fn(*params)
            times[label].append((time.perf_counter() - t) * 1e3)
    print(f"import raydp_hpo.accounting.rdp (incl. tables): {import_ms:.0f} ms, once per process")
    print(f"{len(DEFAULT_ORDERS)} orders, {args.rounds} interleaved rounds, cold curves")
    print(f"{'curve':34} {'median ms':>10} {'range ms':>18}")
    for label, ts in times.items():
        print(f"{label:34} {statistics.median(ts):10.2f} {min(ts):8.2f} – {max(ts):7.2f}")


if __name__ == "__main__":
    main()
