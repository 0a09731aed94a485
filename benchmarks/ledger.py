"""Privacy ledger timings: reopening a journal, and admission per halting mode, vs the number
of charges already in the ledger (10 / 1,000 / 10,000 distinct DP-SGD charges by default).

1. **Open** (a restart): ``PrivacyLedger.open`` on a journal of N distinct charges plus the
   first spend figure, with the RDP and PLD caches cleared first (a fresh process has none),
   per halting mode. RDP modes sum the stored curves (a few spot-checked, the rest checked by
   a background thread, stopped by ``close`` right after); the eager variant recomputes every
   curve (what every open cost before journal version 2), only up to ``--eager-max``. PLD and
   best halting load the PLD snapshot beside the journal (``<journal>.pld``, bound to the
   journal's chain hash) and fold in the charges after it; the build step writes that
   snapshot once, as a ledger that ran in that mode would have at ``close``.
   Wall clock and the opening thread's CPU time are both reported: on a shared machine the
   wall clock also counts time spent waiting for a core.
2. **Admission** per halting mode (adaptive RDP filter, fixed-plan RDP / PLD / best), on a
   reopened ledger holding N charges, each an fsync'd append. Two probe kinds: ``fresh`` — a
   never-seen mechanism, with every RDP and PLD cache cleared before each mode's block (no
   cache hits: the time includes computing its curve and its PLD); ``known`` — a mechanism
   already charged, under a new id (its curve and PLD are cached: the ledger's own cost).

Each figure: median over all probes of all repeats, and the range (min–max) of the per-repeat
medians. Variants and modes are interleaved within each repeat so that a slow patch of a
shared machine hits all of them.

The journals for the fixed-plan modes are copies of the adaptive one with another header
(the records, stored curves included, are the same; their ``epsilon_after`` figures are the
adaptive ones): timing only. Journals are built once into ``--workdir`` and reused.

    python benchmarks/ledger.py [--sizes 10 1000 10000] [--repeats 3] [--probes 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from raydp_hpo.accounting import pld as pld_module
from raydp_hpo.accounting import rdp as rdp_module
from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian, mechanism_from_dict
from raydp_hpo.accounting.pld import PldComposer
from raydp_hpo.ledger.filter import (
    ORDERS_FINGERPRINT,
    Adaptivity,
    CurveCheck,
    PrivacyLedger,
    pld_snapshot_path,
)
from raydp_hpo.ledger.journal import Journal, scan_journal, seal_path

BUDGET = PrivacyBudget(epsilon=1e6, delta=1e-5)  # large: every charge is admitted
MODES = {
    "adaptive RDP filter": (Adaptivity.ADAPTIVE, Accountant.RDP),
    "fixed-plan RDP": (Adaptivity.FIXED_PLAN, Accountant.RDP),
    "fixed-plan PLD": (Adaptivity.FIXED_PLAN, Accountant.PLD),
    "fixed-plan best": (Adaptivity.FIXED_PLAN, Accountant.BEST),
}
PLD_MODES = {Accountant.PLD, Accountant.BEST}


def clear_caches() -> None:
    """Forget every cached RDP curve and PLD (what a fresh process has)."""
    rdp_module._rdp_cached.cache_clear()  # noqa: SLF001
    rdp_module._subsampled_gaussian_rdp_cached.cache_clear()  # noqa: SLF001
    pld_module._leaf_pld.cache_clear()  # noqa: SLF001


def _mechanisms(rng: np.random.Generator, n: int, distinct: int | None = None
                ) -> list[SubsampledGaussian]:
    """``n`` DP-SGD mechanisms, cycling over ``distinct`` different ones (all distinct: None)."""
    k = n if distinct is None else min(n, distinct)
    unique = [
        SubsampledGaussian(
            noise_multiplier=float(rng.uniform(5.0, 50.0)),
            sample_rate=float(rng.uniform(0.001, 0.05)),
            steps=int(rng.integers(50, 2000)),
        )
        for _ in range(k)
    ]
    return [unique[i % k] for i in range(n)]


def _journal(workdir: Path, size: int, label: str) -> Path:
    return workdir / f"n{size}-{label.replace(' ', '_')}.journal"


def build(workdir: Path, size: int, pld_max: int, distinct: int | None = None) -> None:
    """The adaptive journal of ``size`` distinct charges, its copies for the other modes, and
    the PLD snapshot of each PLD/best copy (what a ledger that ran in that mode leaves)."""
    base = _journal(workdir, size, "adaptive RDP filter")
    if not base.exists():
        start = time.perf_counter()
        with PrivacyLedger(BUDGET, base) as ledger:
            for i, mech in enumerate(_mechanisms(np.random.default_rng(size), size, distinct)):
                ledger.charge(f"pre-{i}", mech)
        print(f"built {base.name}: {size} charges in {time.perf_counter() - start:.1f} s",
              flush=True)
    scan = scan_journal(base)
    composer: PldComposer | None = None
    for label, (adaptivity, accountant) in MODES.items():
        path = _journal(workdir, size, label)
        if accountant in PLD_MODES and size > pld_max:
            continue
        if not path.exists():
            header = {"budget": BUDGET.to_dict(), "adaptivity": adaptivity.value,
                      "accountant": accountant.value, "created": time.time(),
                      "rdp_orders": ORDERS_FINGERPRINT}
            journal = Journal.open(path, create_header=header)
            for rec in scan.records:
                journal.append_charge({k: v for k, v in rec.items() if k not in ("kind", "seq")})
            journal.close()
        if accountant in PLD_MODES and not pld_snapshot_path(path).exists():
            start = time.perf_counter()
            if composer is None:  # one PLD for both copies: same charges
                composer = PldComposer()
                for rec in scan.records:
                    composer.add(mechanism_from_dict(rec["mechanism"]))
                composer.fold()
            ledger = PrivacyLedger.open(path, curve_check=CurveCheck.ON_DEMAND)
            ledger._pld_composer = composer.copy()  # noqa: SLF001 - as if it had run
            ledger.close()  # writes the snapshot
            print(f"PLD snapshot for {path.name}: {time.perf_counter() - start:.1f} s",
                  flush=True)


def _fmt(samples: list[float], per_repeat: list[float]) -> str:
    if not samples:
        return f"{'-':>9} {'':>17}"
    return (f"{statistics.median(samples):>9.2f} "
            f"{f'[{min(per_repeat):.2f}, {max(per_repeat):.2f}]':>17}")


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _copy_ledger(src: Path, dst: Path) -> None:
    """Copy a journal with its seal and PLD snapshot (probes charge the copy)."""
    for a, b in ((src, dst), (seal_path(src), seal_path(dst)),
                 (pld_snapshot_path(src), pld_snapshot_path(dst))):
        if a.exists():
            shutil.copyfile(a, b)
        elif b.exists():
            b.unlink()


def _remove_ledger(path: Path) -> None:
    for p in (path, seal_path(path), pld_snapshot_path(path)):
        p.unlink(missing_ok=True)


def _run_modes(size: int, pld_max: int) -> list[tuple[int, str, Accountant]]:
    return [(m, label, acc) for m, (label, (_, acc)) in enumerate(MODES.items())
            if not (acc in PLD_MODES and size > pld_max)]


def bench_open(workdir: Path, sizes: list[int], repeats: int, eager_max: int,
               pld_max: int) -> None:
    """Open = constructor + the first spend figure (PLD/best: builds or loads the PLD)."""
    times: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for size in sizes:
            runs = [(label, CurveCheck.BACKGROUND) for _, label, _ in _run_modes(size, pld_max)]
            if size <= eager_max:
                runs.append(("adaptive RDP filter", CurveCheck.EAGER))
            for label, check in runs:
                name = label + (" (eager)" if check is CurveCheck.EAGER else "")
                clear_caches()
                path = _journal(workdir, size, label)
                start, start_cpu = time.perf_counter(), time.thread_time()
                ledger = PrivacyLedger.open(path, curve_check=check)
                ledger.spent()
                cpu.setdefault((name, size), []).append((time.thread_time() - start_cpu) * 1e3)
                times.setdefault((name, size), []).append((time.perf_counter() - start) * 1e3)
                ledger.close()
    print(f"\nopen (restart: constructor + first spend figure) — ms, median and range over "
          f"{repeats} repeats; wall clock, and CPU time of the opening thread")
    print(f"{'halting rule':<28} {'charges':>8} {'wall':>9} {'range':>17} {'CPU':>9} "
          f"{'range':>17}")
    for (name, size), values in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        c = cpu[(name, size)]
        print(f"{name:<28} {size:>8} {_fmt(values, values)} {_fmt(c, c)}")


def bench_admission(workdir: Path, sizes: list[int], repeats: int, probes: int,
                    pld_max: int) -> None:
    fresh: dict[tuple[str, int], list[float]] = {}
    known: dict[tuple[str, int], list[float]] = {}
    fresh_rep: dict[tuple[str, int], list[float]] = {}
    known_rep: dict[tuple[str, int], list[float]] = {}
    for rep in range(repeats):
        for size in sizes:
            for m, label, _ in _run_modes(size, pld_max):
                copy = workdir / "probe.journal"  # probes charge a copy: the built one stays
                _copy_ledger(_journal(workdir, size, label), copy)
                clear_caches()
                led = PrivacyLedger.open(copy, curve_check=CurveCheck.ON_DEMAND)
                led.spent()  # restart done (PLD loaded): time admission only
                rng = np.random.default_rng([size, m, rep, 1])  # distinct across modes/repeats
                key = (label, size)
                f_times = [_timed(lambda j=j, mech=mech, led=led: led.charge(f"fresh-{j}", mech))
                           for j, mech in enumerate(_mechanisms(rng, probes))]
                cached = [c.mechanism for c in led.charges()[-probes:]]  # the fresh probes
                k_times = [_timed(lambda j=j, mech=mech, led=led: led.charge(f"known-{j}", mech))
                           for j, mech in enumerate(cached)]
                led.close()
                _remove_ledger(copy)
                fresh.setdefault(key, []).extend(f_times)
                known.setdefault(key, []).extend(k_times)
                fresh_rep.setdefault(key, []).append(statistics.median(f_times))
                known_rep.setdefault(key, []).append(statistics.median(k_times))
    print(f"\nadmission — ms per charge, median and range of per-repeat medians "
          f"({repeats} repeats × {probes} probes)")
    print(f"{'halting rule':<20} {'charges':>8} {'fresh':>9} {'range':>17} "
          f"{'known':>9} {'range':>17}")
    for label in MODES:
        for size in sizes:
            key = (label, size)
            if key not in fresh:
                print(f"{label:<20} {size:>8}   not run (PLD above --pld-max)")
                continue
            print(f"{label:<20} {size:>8} {_fmt(fresh[key], fresh_rep[key])} "
                  f"{_fmt(known[key], known_rep[key])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--eager-max", type=int, default=1000,
                        help="largest size at which to time the eager (recompute-all) open")
    parser.add_argument("--pld-max", type=int, default=10000,
                        help="largest size at which to time PLD and best halting")
    parser.add_argument("--distinct", type=int, default=None,
                        help="charges in built journals cycle over this many distinct "
                             "mechanisms (default: all distinct; building the PLD of 10,000 "
                             "distinct ones takes ~10 min of one core)")
    parser.add_argument("--workdir", default=None, help="keep (and reuse) built journals here")
    parser.add_argument("--skip-open", action="store_true")
    parser.add_argument("--skip-admission", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            build(workdir, size, args.pld_max, args.distinct)
        if not args.skip_open:
            bench_open(workdir, args.sizes, args.repeats, args.eager_max, args.pld_max)
        if not args.skip_admission:
            bench_admission(workdir, args.sizes, args.repeats, args.probes, args.pld_max)


if __name__ == "__main__":
    main()
