"""The DP-SGD noise draw alone: torch's ``normal_`` against the native Philox kernel.

    .venv/bin/python benchmarks/gaussian_kernel.py                 # MLP and CNN sizes, 1 and 2 threads
    .venv/bin/python benchmarks/gaussian_kernel.py --sizes 78858 --rounds 40

For each size and thread count the variants run interleaved (a block of draws each, the
order rotating every round) into the same preallocated float32 buffer, through the function
DP-SGD calls (:func:`raydp_hpo.trainables.gaussian_kernel.gaussian_`, key draw included) and
through ``Tensor.normal_`` with the same kind of secret generator. Printed: the median µs per
draw with the interquartile range of the per-round medians, and the speed-up. The AVX2 and
AVX-512 widths of the kernel are timed apart where torch reports AVX-512.

Results (2026-11-26, the 2-core CI machine, torch 2.13 reporting AVX-512, 30 rounds of 50
draws; median µs per draw, two runs; 78 858 values = the MLP of the DP-SGD benchmarks):

    threads  torch normal_   native AVX2     native AVX-512   gaussian_ (DP-SGD's call)
    1        187 / 190       131 / 133       95 / 95          97 / 99    (×1.93 / ×1.92)
    2        187 / 190       73 / 71         56 / 54          56 / 54    (×3.32 / ×3.54)

and for 10⁶ values (one run): 2624 → 1168 µs at one thread, 2599 → 594 µs at two.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raydp_hpo.trainables import gaussian_kernel as gk  # noqa: E402
from raydp_hpo.trainables.secret_rng import secret_generator  # noqa: E402


def variants(out: torch.Tensor) -> dict[str, Callable[[], object]]:
    gen = secret_generator("cpu", 1)
    found: dict[str, Callable[[], object]] = {
        "torch normal_": lambda: out.normal_(0.0, 1.0, generator=gen),
    }
    if not gk.native_status().available:
        return found
    kernel = gk._kernel()
    assert kernel is not None
    for wide in sorted({0, gk._wide()}):
        def draw(wide: int = wide) -> None:
            k0, k1, n0, n1 = gk.draw_key(gen)
            kernel.raydp_philox_gaussian(out.data_ptr(), out.numel(), k0, k1, n0, n1, 1.0,
                                         torch.get_num_threads(), wide)
        found[f"native {'AVX-512' if wide else 'AVX2'}"] = draw
    found["gaussian_ (what DP-SGD calls)"] = lambda: gk.gaussian_(out, 1.0, gen)
    return found


def measure(size: int, threads: int, rounds: int, block: int) -> None:
    torch.set_num_threads(threads)
    out = torch.empty(size)
    runs = variants(out)
    names = list(runs)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for fn in runs.values():  # warm-up
        for _ in range(block):
            fn()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = runs[name]
            times = []
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            per_round[name].append(statistics.median(times) * 1e6)
    base = statistics.median(per_round["torch normal_"])
    print(f"{size} values, {threads} thread(s):")
    for name in names:
        q = statistics.quantiles(per_round[name], n=4)
        med = statistics.median(per_round[name])
        print(f"  {name:32s} {med:8.1f} µs (IQR {q[0]:.1f}–{q[2]:.1f})   ×{base / med:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[78_858, 1_000_000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=50)
    args = ap.parse_args()
    status = gk.native_status()
    print(f"native kernel: {'used' if status.available else 'NOT used'} ({status.reason}); "
          f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    for size in args.sizes:
        for threads in args.threads:
            measure(size, threads, args.rounds, args.block)


if __name__ == "__main__":
    main()
