"""A/B of the DP-SGD step: this checkout's ``dp_step`` against the one of another git revision.

    .venv/bin/python benchmarks/dpsgd_ab.py --base ffd8ce6            # MLP, B = 128, 1 thread
    .venv/bin/python benchmarks/dpsgd_ab.py --base ffd8ce6 --batch 256 --threads 2 --rounds 30

``benchmarks/dpsgd_throughput.py`` measures the DP / non-private ratio of the current code;
its medians move by about ±0.05 from run to run, as much as one change to the step is worth.
This script compares two versions of ``raydp_hpo/trainables/dp_step.py`` in ONE process: the
base revision's file is loaded from git as a separate module, both build the same model from
the same weights and run the same step (Poisson batch, ``privatised_gradient``, SGD update),
interleaved with a non-private step on a batch of exactly B (the throughput benchmark's
baseline) in rounds of ``--block`` steps, the order rotating each round. Printed: median
per-step time and the median and interquartile range of the per-round ratio to the
non-private step. Only ``dp_step`` differs between A and B (models, data and the rest of the
package are this checkout's).

Results (2026-11-26, quiet 2-core machine, MLP, ratio to the non-private step, base ffd8ce6
(the start of the session) → that session's step; three runs, the first of an earlier
version of this script with 20-30 rounds, then ``--rounds 30`` twice, the last after the
session's review fixes):

    threads  B    run 1         run 2         run 3
    1        128  1.70 → 1.49   1.71 → 1.49   1.76 → 1.54
    1        256  1.51 → 1.37   1.53 → 1.41   1.54 → 1.40
    2        128  1.85 → 1.58   1.85 → 1.59   1.84 → 1.60
    2        256  1.71 → 1.52   1.76 → 1.55   1.74 → 1.56

The step is ~0.2 faster relative to the non-private one in every cell; the absolute ratio
moves by ±0.03 with the non-private step's speed between runs.

The native noise kernel (third session, ``--base cb22c6c``: the step before it, drawing with
``normal_``; ``--rounds 30``, two runs, median ratio (IQR) of the second run; the kernel was
removed in issue 33: no measurable saving on whole searches,
``benchmarks/results/native_kernel/summary.md``):

    threads  B    run 1         run 2
    1        128  1.50 → 1.40   1.45 → 1.38 (1.36–1.42)
    1        256  1.38 → 1.33   1.37 → 1.33 (1.31–1.35)
    2        128  1.56 → 1.41   1.52 → 1.36 (1.33–1.41)
    2        256  1.51 → 1.38   1.51 → 1.39 (1.35–1.42)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from raydp_hpo.trainables import dp_step as current  # noqa: E402
from raydp_hpo.trainables.models import build_model  # noqa: E402

DP_STEP = "raydp_hpo/trainables/dp_step.py"
SHAPES = {"mlp": (40,), "cnn1d": (40,), "cnn2d": (1, 28, 28)}


def load_revision(revision: str, into: Path) -> ModuleType:
    """``dp_step.py`` as it was at ``revision``, imported as module ``dp_step_<revision>``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{DP_STEP}"],
        check=True, capture_output=True, text=True,
    ).stdout
    name = f"dp_step_{revision.replace('-', '_').replace('.', '_')}"
    path = into / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def dp_variant(
    module: ModuleType, template: nn.Module, name: str, x: torch.Tensor, y: torch.Tensor,
    batch: int,
) -> Callable[[], None]:
    """One DP step of ``module``'s clipper, noise and Poisson sampling on a copy of
    ``template`` (``PoissonBatches`` where the revision has it, else ``poisson_batch``)."""
    n = x.shape[0]
    model = build_model(name, SHAPES[name], 10)
    model.load_state_dict(template.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clipper = module.make_clipper(model)
    params = list(model.parameters())
    noise = module.GaussianNoise(1.0, 1.0, float(batch), torch.Generator().manual_seed(1))
    sampler = torch.Generator().manual_seed(2)
    if hasattr(module, "PoissonBatches"):
        next_batch = module.PoissonBatches(n, batch / n, sampler).next
    else:
        def next_batch() -> torch.Tensor:
            return module.poisson_batch(n, batch / n, sampler)

    def step() -> None:
        idx = next_batch()
        clipper.privatised_gradient(x[idx], y[idx], 1.0, noise, params)
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git revision whose dp_step.py is A")
    ap.add_argument("--model", choices=sorted(SHAPES), default="mlp")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=50, help="steps per variant per round")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--n", type=int, default=60_000)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, *SHAPES[args.model], generator=gen)
    y = torch.randint(0, 10, (args.n,), generator=gen)
    torch.manual_seed(0)
    template = build_model(args.model, SHAPES[args.model], 10)
    base_model = build_model(args.model, SHAPES[args.model], 10)
    base_model.load_state_dict(template.state_dict())
    base_opt = torch.optim.SGD(base_model.parameters(), lr=0.01)
    order = torch.randperm(args.n, generator=gen)
    cursor = [0]

    def nonprivate() -> None:
        start = cursor[0] % (args.n - args.batch)
        cursor[0] += args.batch
        idx = order[start : start + args.batch]
        base_opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(base_model(x[idx]), y[idx]).backward()
        base_opt.step()

    with tempfile.TemporaryDirectory() as tmp:
        base = load_revision(args.base, Path(tmp))
        variants = {
            "non-private": nonprivate,
            f"DP at {args.base}": dp_variant(base, template, args.model, x, y, args.batch),
            "DP here": dp_variant(current, template, args.model, x, y, args.batch),
        }
        for fn in variants.values():
            for _ in range(args.warmup):
                fn()
        times: dict[str, list[float]] = {k: [] for k in variants}
        labels = list(variants)
        for r in range(args.rounds):
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                t = time.perf_counter()
                for _ in range(args.block):
                    variants[label]()
                times[label].append((time.perf_counter() - t) / args.block)
    print(f"model={args.model} B={args.batch} threads={args.threads} rounds={args.rounds} "
          f"block={args.block} torch={torch.__version__}")
    for label, values in times.items():
        ratios = [a / b for a, b in zip(values, times["non-private"])]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(f"  {label:24s} {statistics.median(values) * 1e3:7.3f} ms/step   ratio "
              f"{statistics.median(ratios):.3f} (IQR {q1:.3f}–{q3:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
