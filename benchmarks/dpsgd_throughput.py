"""Cost of a DP-SGD step relative to a non-private step (same model, same expected batch).

Variants, per (torch threads, batch size B, model):

* ``non-private`` — a batch of exactly B records (next B of a shuffled order), forward,
  backward, SGD update;
* ``DP book-keeping`` — ``make_clipper(model, "auto")`` (book-keeping for every built-in
  model): Poisson batch of expected size B from ``PoissonBatches`` (q = B/n), per-example
  clipping, Gaussian noise, SGD update;
* ``DP Opacus hooks`` — the same with ``OpacusClipper`` (per-example gradients from
  ``opacus.GradSampleModule``), for reference.
* ``(noise alone)`` — only the Gaussian noise of one step: one flat draw of N(0, 1) for every
  parameter, as ``GaussianNoise`` draws it (``normal_`` with a generator on the device). Its
  ratio is the part of the DP step's ratio that no clipping method can remove.

Timing is interleaved: each round runs a block of steps of every variant in turn (the order
rotates from round to round), so a change in machine load hits all variants alike; the
DP/non-private ratio is taken within each round. Reported: the median per-step time and the
median ratio with their ranges (min–max) over rounds. Data are random tensors of the right
shape (speed does not depend on the values): MNIST-1D-shaped (40,) for ``mlp``/``cnn1d``,
MNIST-shaped (1, 28, 28) for ``cnn2d``; n = 60 000 records.

A second table times Poisson sampling alone, interleaved: ``PoissonBatches`` (what training
uses: 32 batches drawn at once, O(B) per batch), ``poisson_batch`` (one batch, O(B)) and one
uniform per record (``torch.rand(n) < q``, O(n)).

Results (CPU, torch 2.13, 2 cores, quiet machine, 2026-11-26, second session: layers recorded
by shadowing their forward instead of forward hooks, Poisson batches drawn 32 steps ahead
(``PoissonBatches``), the noise buffer reused; two runs of 200 warm-up + 7 rounds × 5 steps;
DP book-keeping / non-private, median ratio run 1 / run 2; targets CNN ≤ 2.0, MLP ≤ 1.5):

    threads  B    mlp          cnn1d        cnn2d
    1        128  1.48 / 1.45  1.57 / 1.63  1.88 / 1.66
    1        256  1.42 / 1.37  1.80 / 1.84  1.72 / 1.66
    2        128  1.45 / 1.58  1.58 / 1.56  1.58 / 1.62
    2        256  1.47 / 1.49  1.72 / 1.70  1.66 / 1.53

Earlier the same day (hooks, one ``poisson_batch`` per step, a fresh noise buffer) the MLP
measured 1.71 / 1.68, 1.48 / 1.56, 1.81 / 1.78 and 1.67 / 1.65. ``benchmarks/dpsgd_ab.py``
(both versions of the step in one process, interleaved; three runs) gave for the MLP
1.70-1.76 → 1.49-1.54 (1 thread, B = 128), 1.51-1.54 → 1.37-1.41 (1, 256), 1.84-1.85 →
1.58-1.60 (2, 128) and 1.71-1.76 → 1.52-1.56 (2, 256). So the MLP target holds at one thread
and B = 256, is at the edge at B = 128 (1.45-1.54 over all runs) and is missed at two
threads (1.45-1.60): there the non-private step
gains from the second core (0.97 → 0.77 ms) while the Gaussian noise (~0.19 ms for 79k
parameters, one MT19937 stream) and the clipper's ~40 small operations (5-10 µs each inside
a step, against ~1.5 µs in a tight loop) do not. What a DP step adds, measured in place at
one thread and B = 128 (non-private 0.96 ms): noise 0.21 ms, per-example norms 0.08 ms,
clip factors 0.06 ms, backward to the layer outputs plus the clipped-sum products 0.04 ms
more than the non-private backward; forward, loss, sampling and the SGD update cost the
same. (Doing the per-example vectors' arithmetic in numpy, or drawing the noise on a
second thread during the backward pass, measured no better and was not kept.) The
breakdown before this session is in ``benchmarks/results/dpsgd_throughput/issue15_cpu.md``.
A native Philox noise kernel (2026-11-26, third session) brought the MLP to 1.31-1.46 in
every cell; it saved no measurable wall time on whole searches and was removed (issue 33,
``benchmarks/results/native_kernel/summary.md``).

Warm-up matters for the CNNs: the first few hundred steps of a run are dearer, apparently
because every new Poisson batch size is a new shape for oneDNN's convolution kernels. With 2
warm-up steps instead of 200 the same code measured cnn1d 2.01-2.67 and cnn2d 1.81-2.05 (one
run); the default figure is the steady state.

``--make-private`` times instead a user's own loop under :func:`raydp_hpo.trial_session`
(issue 29): the MLP of ``examples/own_mlp_parquet.py`` (8 → 32 → 2, ReLU) made private by
``trial.make_private`` with ``engine=DPEngine.NATIVE`` (the book-keeping step) and
``engine=DPEngine.OPACUS``, each step the example's loop (next Poisson batch from the returned
loader, ``zero_grad``, forward, mean cross-entropy, ``backward``, ``step`` with the session's
checks), interleaved with a non-private step of the same loop (a shuffled ``DataLoader`` of
exactly B). Reported as steps/s, median (min–max) over rounds.

Results (CPU, torch 2.13, 1 thread, 2026-11-27, a machine loaded by ~6 other jobs: figures
noisy; two runs of ``--make-private --rounds 7 --warmup 50 --block 10 --batches 128 256
--threads 1``; steps/s median (min–max), run 1 / run 2):

    B    native               Opacus            non-private        native / Opacus
    128  146 (129–173) / 109  54 (50–59) / 40   132 (127–148) / 86 2.90 (2.20–3.22) / 2.71 (2.55–3.25)
    256  91 (64–107) / 115    24 (15–31) / 35   43 (32–54) / 78    3.48 (2.63–6.15) / 3.13 (2.50–3.63)

The native step is 2.7-3.5× Opacus's (median per run). It even beats the non-private loop: for
so small a model the step is dominated by batch assembly, and the native loader indexes a
``TensorDataset`` once per batch where ``DataLoader`` (and Opacus's ``DPDataLoader``) fetch and
collate record by record.

``--noise-ab`` (issue 40) times the DP book-keeping step with the float32 ``normal_`` noise of
before (``_Float32Noise``), the float64 noise on a grid now drawn (``NoiseSource.SEEDED``) and
``NoiseSource.SECURE``, interleaved, in this thread's CPU time; results in
``benchmarks/results/dpsgd_throughput/issue40_noise.md`` (the float64 draw is ~3× the float32
one: +22–37% on the 79k-parameter MLP's step, +12 µs a release on the example MLP).

Usage: ``python benchmarks/dpsgd_throughput.py [--models mlp cnn1d cnn2d] [--batches 128 256]
[--threads 1 2] [--warmup 200] [--rounds 7] [--block 5] [--no-opacus] [--make-private]
[--noise-ab]``. Uses the GPU when one is available.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from raydp_hpo.trainables.dp_step import (
    GaussianNoise,
    OpacusClipper,
    PoissonBatches,
    make_clipper,
    poisson_batch,
)
from raydp_hpo.trainables.models import build_model

SHAPES = {"mlp": (40,), "cnn1d": (40,), "cnn2d": (1, 28, 28), "linear": (40,)}
NONPRIVATE = "non-private"
NOISE_ONLY = "(noise alone)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _variants(
    name: str, batch: int, n: int, device: torch.device, opacus: bool
) -> dict[str, Callable[[], None]]:
    shape = SHAPES[name]
    gen = torch.Generator().manual_seed(0)
    x_all = torch.randn(n, *shape, generator=gen).to(device)
    y_all = torch.randint(0, 10, (n,), generator=gen).to(device)
    torch.manual_seed(0)
    template = build_model(name, shape, 10).to(device)
    q = batch / n

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = build_model(name, shape, 10).to(device)
        model.load_state_dict(template.state_dict())
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    model0, opt0 = fresh()
    order = torch.randperm(n, generator=gen).to(device)
    cursor = [0]

    def nonprivate() -> None:
        start = cursor[0] % (n - batch)
        cursor[0] += batch
        idx = order[start : start + batch]
        opt0.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model0(x_all[idx]), y_all[idx]).backward()
        opt0.step()

    out: dict[str, Callable[[], None]] = {NONPRIVATE: nonprivate}
    kinds = [("DP book-keeping", "auto")] + ([("DP Opacus hooks", "opacus")] if opacus else [])
    for label, mode in kinds:
        model, opt = fresh()
        clipper = make_clipper(model, mode)
        if mode == "opacus":
            assert isinstance(clipper, OpacusClipper)
        params = [p for p in model.parameters() if p.requires_grad]
        noise = GaussianNoise(1.0, 1.0, q * n, torch.Generator(device=device).manual_seed(1))
        sampler = PoissonBatches(n, q, torch.Generator(device=device).manual_seed(2))

        def dp_step(clipper=clipper, params=params, noise=noise, opt=opt, sampler=sampler) -> None:
            idx = sampler.next()
            clipper.privatised_gradient(x_all[idx], y_all[idx], 1.0, noise, params)
            opt.step()

        out[label] = dp_step
    # The floor no clipping method removes: N(0, σ²C²) for every parameter, one flat draw
    # with a generator on the device, as GaussianNoise draws it each step.
    numel = sum(p.numel() for p in model0.parameters())
    noise_gen = torch.Generator(device=device).manual_seed(3)
    flat = torch.empty(numel, device=device)
    out[NOISE_ONLY] = lambda: flat.normal_(0.0, 1.0, generator=noise_gen)
    return out


def _interleaved(
    variants: dict[str, Callable[[], None]],
    rounds: int,
    block: int,
    device: torch.device,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Per-step seconds of each variant in each round, variants rotated round by round, after
    ``warmup`` untimed steps of each (allocator, thread pools, the clipper's one-off choice of
    per-layer method, oneDNN kernels for the batch sizes Poisson sampling draws most).
    ``clock``: wall time by default; ``time.thread_time`` (this thread's CPU time, one torch
    thread) is what ``--noise-ab`` uses, less disturbed by other jobs on a loaded machine."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    labels = list(variants)
    times: dict[str, list[float]] = {k: [0.0] * rounds for k in labels}
    for r in range(rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            fn = variants[label]
            _sync(device)
            t = clock()
            for _ in range(block):
                fn()
            _sync(device)
            times[label][r] = (clock() - t) / block
    return times


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def _sampling_table(n: int, batches: list[int], rounds: int) -> None:
    print(f"\nPoisson sampling alone, n={n}, µs per batch, median (range) over {rounds} rounds")
    gen = torch.Generator().manual_seed(0)
    for batch in batches:
        q = batch / n
        blocks = PoissonBatches(n, q, gen)
        variants = {
            "PoissonBatches": blocks.next,
            "poisson_batch": lambda q=q: poisson_batch(n, q, gen),
            "rand(n) < q": lambda q=q: torch.nonzero(torch.rand(n, generator=gen) < q).flatten(),
        }
        times = _interleaved(variants, rounds, 200, torch.device("cpu"))
        cells = "   ".join(
            f"{k}: {_spread([t * 1e6 for t in v], '.0f')}" for k, v in times.items()
        )
        print(f"  B={batch:<4} {cells}")


class _ExampleMLP(nn.Module):
    """The model of examples/own_mlp_parquet.py (8 features, width 32, 2 classes)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _cycle(loader: object) -> Callable[[], object]:
    """The next batch of ``loader``, starting a new pass when one ends."""
    state: dict[str, object] = {}

    def next_batch() -> object:
        try:
            return next(state["it"])  # type: ignore[call-overload]
        except (KeyError, StopIteration):
            state["it"] = iter(loader)  # type: ignore[call-overload]
            return next(state["it"])  # type: ignore[call-overload]

    return next_batch


def _loop_step(model: nn.Module, opt: torch.optim.Optimizer, loader: object
               ) -> Callable[[], None]:
    """One step of the example's own loop over ``loader``."""
    next_batch = _cycle(loader)

    def step() -> None:
        x, y = next_batch()  # type: ignore[misc]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _make_private_table(batches: list[int], n: int, rounds: int, block: int,
                        warmup: int) -> None:
    """steps/s of the example MLP's own loop: make_private NATIVE vs OPACUS vs non-private."""
    import contextlib

    from torch.utils.data import DataLoader, TensorDataset

    import raydp_hpo
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.ledger.filter import PrivacyLedger

    # Opacus's hooks warn on every step that the inputs need no gradient (they still fire)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 8, generator=gen), torch.randint(0, 2, (n,), generator=gen))
    print(f"\nmake_private on the example MLP, n={n}: steps/s, median (min–max) over {rounds} "
          "rounds; native/Opacus speed-up per round")
    for batch in batches:
        steps_needed = warmup + rounds * block + 10
        epochs = math.ceil(steps_needed * batch / n) + 1
        ledger = PrivacyLedger(PrivacyBudget(1e9, 1e-5))
        variants: dict[str, Callable[[], None]] = {}
        with contextlib.ExitStack() as stack:
            for engine in (raydp_hpo.DPEngine.NATIVE, raydp_hpo.DPEngine.OPACUS):
                config = {"lr": 0.1, "epochs": epochs, "batch_size": batch,
                          "noise_multiplier": 1.0, "max_grad_norm": 1.0,
                          "raydp": {"charge": True, "charge_id": f"bench/{engine.value}",
                                    "experiment": "bench", "score_epsilon": None,
                                    "dataset_size": n}}
                trial = stack.enter_context(raydp_hpo.trial_session(
                    config, ledger=ledger, secret_seed=1, device="cpu"))
                stack.callback(setattr, trial, "_scored", True)  # a benchmark: no score
                torch.manual_seed(0)
                model = _ExampleMLP()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                model, opt, loader = trial.make_private(model, opt, data, engine=engine)
                assert trial.engine is engine
                variants[f"make_private {engine.value}"] = _loop_step(model, opt, loader)
            torch.manual_seed(0)
            plain = _ExampleMLP()
            variants[NONPRIVATE] = _loop_step(
                plain, torch.optim.SGD(plain.parameters(), lr=0.1),
                DataLoader(data, batch_size=batch, shuffle=True))
            times = _interleaved(variants, rounds, block, torch.device("cpu"), warmup)
        for label, ts in times.items():
            print(f"  B={batch:<4} {label:22} {_spread([1 / t for t in ts], '.0f'):>22} steps/s")
        speedup = [o / nat for nat, o in zip(times["make_private native"],
                                             times["make_private opacus"])]
        print(f"  B={batch:<4} {'native / Opacus':22} {_spread(speedup, '.2f'):>22} ×")


class _Float32Noise(GaussianNoise):
    """The noise before issue 40, for ``--noise-ab``: torch's float32 ``normal_`` (Box–Muller
    on 24-bit uniforms) drawn into the buffer, the scaled clipped sum added to it in float32,
    no grid. (It zeroes the buffer first as the new path does, ~3 µs for 79k values, so the
    difference measured is the draw, the float64 sum and the rounding.)"""

    def _release(self, params, add):  # type: ignore[no-untyped-def]
        self._check_devices(params)
        views = self._sum_views(params)
        assert self._buffer is not None
        self._buffer[1].normal_(0.0, self.noise_multiplier * self.max_grad_norm / self.normaliser,
                                generator=self.generator)
        add(views, 1.0 / self.normaliser)
        for p, v in zip(params, views):
            p.grad = v
        self.releases += 1


def _noise_ab_table(models: list[str], batches: list[int], n: int, rounds: int, block: int,
                    warmup: int) -> None:
    """Issue 40: the DP book-keeping step with the float32 noise before it, with the float64
    noise (SEEDED) and with SECURE noise, interleaved in one process; per-round ratio to the
    float32 step."""
    from raydp_hpo.trainables.dp_step import NoiseSource

    print(f"\nnoise A/B (issue 40), n={n}: ms of this thread's CPU time per DP book-keeping "
          f"step, median (min–max) over {rounds} rounds; ratio to the float32-noise step in "
          "the same round")
    device = torch.device("cpu")
    for batch in batches:
        for name in models:
            shape = (8,) if name == "example" else SHAPES[name]
            classes = 2 if name == "example" else 10
            gen = torch.Generator().manual_seed(0)
            x_all = torch.randn(n, *shape, generator=gen)
            y_all = torch.randint(0, classes, (n,), generator=gen)
            torch.manual_seed(0)
            template = _ExampleMLP() if name == "example" else build_model(name, shape, classes)
            variants: dict[str, Callable[[], None]] = {}
            kinds = [("float32 (before)", None), ("float64 seeded", NoiseSource.SEEDED),
                     ("secure", NoiseSource.SECURE)]
            for label, source in kinds:
                model = copy.deepcopy(template)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                clipper = make_clipper(model, "auto")
                params = [p for p in model.parameters() if p.requires_grad]
                noise_gen = torch.Generator().manual_seed(1)
                noise = (_Float32Noise(1.0, 1.0, batch, noise_gen) if source is None
                         else GaussianNoise(1.0, 1.0, batch, noise_gen, source))
                sampler = PoissonBatches(n, batch / n, torch.Generator().manual_seed(2))

                def dp_step(clipper=clipper, params=params, noise=noise, opt=opt,
                            sampler=sampler, x_all=x_all, y_all=y_all) -> None:
                    idx = sampler.next()
                    clipper.privatised_gradient(x_all[idx], y_all[idx], 1.0, noise, params)
                    opt.step()

                variants[label] = dp_step
            times = _interleaved(variants, rounds, block, device, warmup,
                                 clock=time.thread_time)
            base = times["float32 (before)"]
            size = sum(p.numel() for p in template.parameters())
            for label, ts in times.items():
                ratio = "" if ts is base else _spread([t / b for t, b in zip(ts, base)], ".3f")
                print(f"  B={batch:<4} {name:7} ({size} params) {label:17} "
                      f"{_spread([t * 1e3 for t in ts], '.3f'):>26} {ratio:>24}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn1d", "cnn2d"])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block", type=int, default=5, help="steps per variant per round")
    parser.add_argument(
        "--warmup", type=int, default=200,
        help="untimed steps per variant first: a training run takes thousands of steps, so the "
        "figure is the steady-state cost, not the first steps' one-off work",
    )
    parser.add_argument("--n", type=int, default=60_000, help="records to sample from")
    parser.add_argument("--no-opacus", action="store_true")
    parser.add_argument("--make-private", action="store_true",
                        help="only the table of trial.make_private's engines on the example MLP")
    parser.add_argument("--noise-ab", action="store_true",
                        help="only the A/B of the DP step's noise before/after issue 40")
    args = parser.parse_args()
    if args.noise_ab:
        torch.set_num_threads(min(args.threads))
        print(f"torch={torch.__version__} threads={min(args.threads)} warmup={args.warmup} "
              f"block={args.block}")
        _noise_ab_table([m for m in args.models if m != "cnn2d"] + ["example"], args.batches,
                        args.n, args.rounds, args.block, args.warmup)
        return
    if args.make_private:
        torch.set_num_threads(min(args.threads))
        print(f"torch={torch.__version__} threads={min(args.threads)} warmup={args.warmup} "
              f"block={args.block}")
        _make_private_table(args.batches, args.n, args.rounds, args.block, args.warmup)
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"device={device} torch={torch.__version__} n={args.n} warmup={args.warmup} "
        f"rounds={args.rounds} block={args.block} steps; per-step ms and DP/non-private ratio: "
        "median (min–max)"
    )
    print(f"{'thr':>3} {'B':>4} {'model':6} {'variant':16} {'ms/step':>24} {'ratio':>20}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            for name in args.models:
                variants = _variants(name, batch, args.n, device, not args.no_opacus)
                times = _interleaved(variants, args.rounds, args.block, device, args.warmup)
                base = times[NONPRIVATE]
                for label, ts in times.items():
                    ratios = [t / b for t, b in zip(ts, base)]
                    ms = _spread([t * 1e3 for t in ts], ".2f")
                    ratio = "" if label == NONPRIVATE else _spread(ratios, ".2f")
                    print(f"{threads:>3} {batch:>4} {name:6} {label:16} {ms:>24} {ratio:>20}")
    torch.set_num_threads(min(args.threads))
    _sampling_table(args.n, args.batches, args.rounds)


if __name__ == "__main__":
    main()
