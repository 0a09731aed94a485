"""Random stopping: ε under Papernot–Steinke RDP vs privacy profiles, and the time it takes.

Base: Poisson-subsampled Gaussian DP-SGD (default σ = 1, q = 0.01, T = 1000: our reference
setting for the privacy-profile bound of :mod:`raydp_hpo.accounting.profiles`, after Koskela, Redberg &
Wang 2024, arXiv:2402.06701; not a setting taken from the paper), E[K] = 10, δ = 1e-5. For each law of K prints ε (RDP, P&S Thm. 2/6), ε (profile,
:mod:`raydp_hpo.accounting.profiles` alone), the reported minimum, and the time of the profile figure:

* "cold": the base's PLD, its profile on the t-grid and the G envelope (once per base);
  caches are cleared before each repeat;
* "warm": one more law on the same base (envelope cached): the per-law cost.

Timings: median [min, max] over ``--repeats`` runs, in seconds, on this machine's CPU.

    python benchmarks/profiles.py [--sigma 1.0 --q 0.01 --steps 1000 --mean 10 --delta 1e-5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from raydp_hpo.accounting import pld, profiles
from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution, SubsampledGaussian
from raydp_hpo.accounting.rdp import rdp_profile

DIST = StoppingDistribution


def _clear_caches() -> None:
    pld._leaf_pld.cache_clear()
    profiles.base_curve.cache_clear()
    profiles._envelope.cache_clear()
    profiles._prepared.cache_clear()


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--q", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--mean", type=float, default=10.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    base = SubsampledGaussian(args.sigma, args.q, args.steps)
    m = args.mean
    laws: list[tuple[str, RandomStopping | None, profiles.StoppingLaw]] = []
    for name, dist, shape in (
        ("geometric (η=1)", DIST.GEOMETRIC, None),
        ("logarithmic (η=0)", DIST.LOGARITHMIC, None),
        ("TNB η=0.5", DIST.TRUNCATED_NEGATIVE_BINOMIAL, 0.5),
        ("TNB η=2", DIST.TRUNCATED_NEGATIVE_BINOMIAL, 2.0),
        ("Poisson", DIST.POISSON, None),
    ):
        sel = RandomStopping(base, dist, m, shape)
        laws.append((name, sel, profiles.stopping_law(sel)))
    for n_trials in (int(10 * m), int(2 * m)):
        p = m / n_trials
        laws.append((f"binomial ({n_trials}, {p:g})", None, profiles.binomial_law(n_trials, p)))

    one_run = pld.pld_epsilon([base], args.delta)
    print(
        f"base: SubsampledGaussian(σ={args.sigma}, q={args.q}, T={args.steps}); "
        f"one run ε_PLD={one_run:.3f}, ε_RDP={rdp_profile(base).epsilon(args.delta):.3f}; "
        f"E[K]={m:g}, δ={args.delta:g}"
    )
    print(f"{'law of K':22s} {'ε RDP (P&S)':>12s} {'ε profile':>10s} {'reported':>9s} "
          f"{'cold s':>20s} {'warm s':>20s}")
    for name, rs, law in laws:
        cold, warm = [], []
        raw = float("nan")
        for _ in range(args.repeats):
            _clear_caches()
            t0 = time.perf_counter()
            raw = profiles.selection_epsilon(profiles.base_curve(base), law, args.delta)
            cold.append(time.perf_counter() - t0)
            profiles._prepared.cache_clear()  # keep the envelope, recompute the law's part
            t0 = time.perf_counter()
            profiles.selection_epsilon(profiles.base_curve(base), law, args.delta)
            warm.append(time.perf_counter() - t0)
        if rs is not None:
            rdp = rdp_profile(rs).epsilon(args.delta)
            reported = profiles.random_stopping_epsilon(rs, args.delta)
            rdp_s, rep_s = f"{rdp:12.3f}", f"{reported:9.3f}"
        else:
            rdp_s, rep_s = f"{'(none)':>12s}", f"{raw:9.3f}"
        print(f"{name:22s} {rdp_s} {raw:10.3f} {rep_s} {_spread(cold):>20s} {_spread(warm):>20s}")


if __name__ == "__main__":
    main()
