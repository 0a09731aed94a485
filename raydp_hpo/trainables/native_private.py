"""The project's own DP-SGD step behind :meth:`TrialSession.make_private` (issue 29).

:meth:`~raydp_hpo.trainables.session.TrialSession.make_private` returns a private
``(module, optimizer, loader)`` from one of two engines (:class:`DPEngine`):

* :attr:`DPEngine.OPACUS` — Opacus's ``GradSampleModule`` + ``DPOptimizer`` + ``DPDataLoader``:
  any layer Opacus supports; per-example gradients are materialised by hooks.
* :attr:`DPEngine.NATIVE` — the book-keeping clipping of
  :class:`~raydp_hpo.trainables.dp_step.BookKeepingClipper` (Bu et al. 2023, "Differentially
  private optimization on large model at small cost"), the step the built-in trainable uses,
  driven by the user's own loop: :class:`NativePrivateModule` records each covered layer's
  input a and, through a tensor hook, the gradient g of the user's loss with respect to the
  layer's output; :class:`NativeDPOptimizer` forms the per-example norms from (a, g) (ghost
  norm or materialised per layer, as the clipper chooses), the clipped sum, and the Gaussian
  noise of :class:`~raydp_hpo.trainables.dp_step.GaussianNoise` (drawn from the trial's secret
  noise generator), and only then steps the user's optimiser. Available when every trainable
  parameter of the module lives in a layer book-keeping covers (``nn.Linear``,
  ``nn.Conv1d``/``nn.Conv2d`` with groups = 1, ``nn.GroupNorm``/``nn.LayerNorm``;
  :func:`~raydp_hpo.trainables.dp_step.supports_bk`).

:attr:`DPEngine.AUTO` (the default) picks NATIVE where the layers allow, else OPACUS.

**Both engines release the same thing.** For a Poisson batch B drawn at the charged q over the
dataset (:class:`~raydp_hpo.trainables.dp_step.PoissonBatches` here, Opacus's
``UniformWithReplacementSampler`` there, each from the trial's secret sampling generator), the
gradient set before the user's optimiser steps is

    g̃ = ( Σ_{i∈B} clip_C(∇ℓ_i) + N(0, σ²C²·I) ) / (q·n),   clip_C(v) = v·min(1, C/(‖v‖ + 10⁻⁶)),

n the *declared* training-set size (Abadi et al. 2016, Alg. 1; Opacus's normalisation for a
``"mean"`` loss): one subsampled Gaussian mechanism SG(σ, q) per step, the mechanism charged.
With a mean loss over the batch, the gradient the hook sees is ∂ℓ_i/∂out_i / |B|, so the
per-example gradient is |B| times what (a, g) give, as Opacus's ``loss_reduction="mean"``
scales it (``tests/raydp_hpo/trainables/test_session_engines.py`` checks the clipped sum
against Opacus's per-sample clipped gradients). As with Opacus, the per-example gradients are
those of a loss that is a mean (or sum) of per-example terms: a loss that mixes examples
(batch statistics, contrastive pairs) breaks the sensitivity bound under either engine.

Both engines expose what the session checks at every step and report: the optimiser's
``noise_multiplier``, ``max_grad_norm`` and ``expected_batch_size``, the loader's sample rate,
and Opacus's ``RDPAccountant`` history (attached to either optimiser by its step hook).

The native engine refuses (:class:`~raydp_hpo.errors.TrialContractError`, naming
``engine=DPEngine.OPACUS`` as the fix) a step whose forward pass ran a covered layer other than
exactly once with gradients enabled, whose layers got no or several gradients (gradient
accumulation, a layer called twice), or whose layers saw another number of rows than the
loader's last batch has records (records reshaped into several rows, micro-batches): its
per-example gradients would be wrong. As with Opacus's ``batch_first=True``, the records are
the first dimension of every covered layer's input.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from typing import Any

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError, TrialContractError
from raydp_hpo.trainables.dp_step import (
    _EPS,
    BookKeepingClipper,
    GaussianNoise,
    NoiseSource,
    PoissonBatches,
    _GradSink,
    _layer_grad,
    _zero_rows,
    bk_unsupported_reason,
    shadowed_forwards,
)

__all__ = [
    "DPEngine",
    "NativeDPOptimizer",
    "NativePoissonLoader",
    "NativePrivateModule",
    "choose_engine",
]

_log = logging.getLogger(__name__)
_FIX = "pass trial.make_private(..., engine=raydp_hpo.DPEngine.OPACUS)"


class DPEngine(Enum):
    """Which DP-SGD engine :meth:`TrialSession.make_private` uses (module docstring)."""

    #: NATIVE where every trainable layer is one book-keeping covers, else OPACUS
    AUTO = "auto"
    #: Opacus's GradSampleModule, DPOptimizer and DPDataLoader (any layer Opacus supports)
    OPACUS = "opacus"
    #: the project's book-keeping DP-SGD step (Linear, Conv1d/2d, GroupNorm, LayerNorm only)
    NATIVE = "native"


def choose_engine(module: nn.Module, engine: DPEngine | str = DPEngine.AUTO
                  ) -> tuple[DPEngine, str]:
    """``(engine, why)``: the engine for ``module`` and the reason, for the log line.

    AUTO gives NATIVE when book-keeping covers every trainable parameter, else OPACUS with the
    layers it does not cover; NATIVE on such a module raises
    :class:`~raydp_hpo.errors.InvalidParameterError` naming them.
    """
    try:
        engine = DPEngine(engine)
    except ValueError:
        raise InvalidParameterError(
            f"engine must be a raydp_hpo.DPEngine (auto, opacus, native), got {engine!r}"
        ) from None
    if engine is DPEngine.OPACUS:
        return engine, "engine=OPACUS asked for"
    reasons = [f"{name or type(module).__name__}: {why}"
               for name, m in module.named_modules()
               if (why := bk_unsupported_reason(m)) is not None]
    try:
        if reasons:
            raise RayDPHPOError("; ".join(reasons))
        BookKeepingClipper(module)  # also refuses shared parameters and frozen models
    except RayDPHPOError as err:
        reason = str(err)
        if engine is DPEngine.NATIVE:
            raise InvalidParameterError(
                f"engine=NATIVE cannot make this module private: {reason}. Use "
                "engine=DPEngine.AUTO or DPEngine.OPACUS"
            ) from None
        return DPEngine.OPACUS, f"the native engine does not cover: {reason}"
    if engine is DPEngine.NATIVE:
        return engine, "engine=NATIVE asked for"
    return DPEngine.NATIVE, "every trainable layer is covered by book-keeping clipping"


class NativePrivateModule(nn.Module):
    """The user's module, recording what the native step needs: for each layer with
    trainable parameters, its input (detached) and the gradient of the loss with respect to
    its output (a tensor hook), when called with gradients enabled. Under ``torch.no_grad()``
    (evaluation) it is the user's module unchanged. The wrapped module is ``_module`` (as in
    Opacus's ``GradSampleModule``): its ``state_dict`` is the user's."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module
        self._clipper = BookKeepingClipper(module)  # raises for an uncovered layer
        self._inputs: dict[nn.Module, list[torch.Tensor]] = {}
        self._grads: dict[nn.Module, list[torch.Tensor]] = {}

    @property
    def layers(self) -> Sequence[nn.Module]:
        """The covered layers with trainable parameters, in module order."""
        return self._clipper.layers

    def clear(self) -> None:
        """Forget the recorded inputs and gradients (every zero_grad and every step)."""
        self._inputs, self._grads = {}, {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self._module(*args, **kwargs)
        with shadowed_forwards(self.layers, self._recording):
            return self._module(*args, **kwargs)

    def _recording(self, m: nn.Module, original: Callable[..., Any]) -> Callable[..., Any]:
        """``m.forward`` shadowed for one call of the module (:func:`shadowed_forwards`, as
        ``dp_step._record_layers`` does: no forward hook, so ``__call__`` keeps its fast path)."""

        def recording(*args: Any, **kwargs: Any) -> Any:
            inp = args[0] if args else kwargs.get("input")
            if not isinstance(inp, torch.Tensor):
                raise TrialContractError(
                    f"the native DP-SGD engine needs each {type(m).__name__} layer's input as "
                    f"its first positional argument: {_FIX}"
                )
            out = original(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                self._inputs.setdefault(m, []).append(inp.detach())
                grads = self._grads.setdefault(m, [])
                out.register_hook(lambda g: grads.append(g.detach()))
            return out

        return recording

    def recorded(self) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor]]:
        """``(layer, input, output gradient)`` of the one forward and backward pass since the
        last step; raises :class:`TrialContractError` if there was not exactly one."""
        if not self._inputs:
            raise TrialContractError(
                "optimizer.step() without a forward and backward pass of the private module "
                "since the last step (or zero_grad): call loss.backward() on the output of the "
                "module make_private returned"
            )
        out, problems = [], []
        for m in self.layers:
            xs, gs = self._inputs.get(m, []), self._grads.get(m, [])
            if len(xs) != 1 or len(gs) != 1:
                problems.append(f"{type(m).__name__} ran {len(xs)}x, got {len(gs)} gradient(s)")
            else:
                out.append((m, xs[0], gs[0]))
        if problems:
            raise TrialContractError(
                "the native DP-SGD engine needs one forward pass (with gradients) and one "
                "backward pass per step, each layer used once: " + "; ".join(problems)
                + f". Run other forward passes under torch.no_grad(), or {_FIX}"
            )
        sizes = {int(x.shape[0]) for _, x, _ in out}
        if len(sizes) != 1:
            raise TrialContractError(
                f"the layers saw different batch sizes {sorted(sizes)} in one step: the "
                f"native engine needs the batch on the first dimension; {_FIX}"
            )
        return out


class NativeDPOptimizer(torch.optim.Optimizer):
    """The user's optimiser, stepping on the privatised gradient (module docstring).

    ``noise_multiplier``, ``max_grad_norm`` and ``expected_batch_size`` are read at every step
    (as Opacus's ``DPOptimizer`` reads its own), so a change after ``make_private`` changes
    what is released — and the session refuses that step. Step hooks (``attach_step_hook``)
    receive the optimiser after each step: Opacus's ``RDPAccountant`` hook counts the steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, module: NativePrivateModule, *,
                 noise_multiplier: float, max_grad_norm: float, expected_batch_size: int,
                 generator: torch.Generator,
                 noise_source: NoiseSource = NoiseSource.SEEDED) -> None:
        # no super().__init__: the state lives in the user's optimiser (as in Opacus)
        self.original_optimizer = optimizer
        self.module = module
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = int(expected_batch_size)
        self.loss_reduction = "mean"
        self.accumulated_iterations = 1  # read by Opacus's accountant hook: no accumulation
        self.step_hooks: list[Callable[[Any], None]] = []
        self.noise = GaussianNoise(self.noise_multiplier, self.max_grad_norm,
                                   self.expected_batch_size, generator, noise_source)
        #: the loader whose last batch each step must be (set by make_private; None: unchecked)
        self.loader: NativePoissonLoader | None = None

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.original_optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.original_optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.original_optimizer.defaults

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.original_optimizer.load_state_dict(state_dict)

    def attach_step_hook(self, fn: Callable[[Any], None]) -> None:
        self.step_hooks.append(fn)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none)
        self.module.clear()

    def _params(self) -> list[nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def privatise(self) -> None:
        """Replace each parameter's gradient by the privatised one: (Σ_{i∈B} clip_C(∇ℓ_i) +
        N(0, σ²C²·I)) / (q·n), from the recorded (input, output gradient) of each layer."""
        recorded = self.module.recorded()
        batch = int(recorded[0][1].shape[0])
        drawn = None if self.loader is None else self.loader.last_batch_size
        if drawn is not None and batch != drawn:
            raise TrialContractError(
                f"the layers saw {batch} examples but the loader's last Poisson batch has "
                f"{drawn}: train each step on the batch the loader make_private returned "
                f"yielded last, whole (not a batch of another loader, not the full dataset); "
                f"the native engine clips per row of the first dimension, which must be the "
                f"batch's records (no reshaping records into rows, no micro-batches); {_FIX}"
            )
        clipper, c = self.module._clipper, self.max_grad_norm
        noise = self.noise
        noise.noise_multiplier, noise.max_grad_norm = self.noise_multiplier, c
        noise.normaliser = self.expected_batch_size
        params = self._params()
        if batch == 0:
            shares, coef = [], torch.zeros(0)
        else:
            shares = [_layer_grad(m, x, g, clipper._strategy_for(m, x, g))
                      for m, x, g in recorded]
            # the hook saw ∂(mean loss)/∂out = ∂ℓ_i/∂out_i / |B|: per-example norms are |B|·‖·‖
            sq = shares[0].sq_norms()
            for share in shares[1:]:
                sq.add_(share.sq_norms())
            sq.mul_(float(batch) ** 2)
            if not math.isfinite(float(sq.sum())):  # an inf/NaN example contributes 0
                finite = torch.isfinite(sq)
                for share in shares:
                    share.drop_examples(finite)
                sq = _zero_rows(sq, finite)
            coef = (c / (sq.sqrt_() + _EPS)).clamp_(max=1.0).mul_(float(batch))
        if clipper._fuses(params):
            def write(into: dict[int, torch.Tensor], alpha: float) -> None:
                sink = _GradSink(into, alpha)
                for share in shares:
                    share.write_clipped_sum(coef, sink)

            noise.privatise_with(params, write)
        else:
            for p in params:
                p.grad = torch.zeros_like(p)
            sink = _GradSink()
            for share in shares:
                share.write_clipped_sum(coef, sink)
            noise.privatise(params)
        self.module.clear()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.privatise()
        self.original_optimizer.step()
        for hook in self.step_hooks:
            hook(self)
        return loss


class NativePoissonLoader:
    """Poisson batches of ``dataset`` at rate q (each record independently, from the trial's
    secret sampling generator; :class:`~raydp_hpo.trainables.dp_step.PoissonBatches`),
    ``int(1/q)`` batches per pass as Opacus's ``DPDataLoader``. A ``TensorDataset`` is indexed
    directly; another dataset's items are collated with ``collate_fn`` (default: torch's
    ``default_collate``). An empty batch keeps the shapes of a record, with 0 rows."""

    def __init__(self, dataset: Any, sample_rate: float, generator: torch.Generator,
                 collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        from torch.utils.data import TensorDataset
        from torch.utils.data._utils.collate import default_collate

        self.dataset = dataset
        self.batches = PoissonBatches(len(dataset), float(sample_rate), generator)
        self.collate_fn = collate_fn or default_collate
        self._tensors = (dataset.tensors if isinstance(dataset, TensorDataset)
                         and collate_fn is None else None)
        #: the size of the last batch drawn (what the optimiser's next step must have seen)
        self.last_batch_size: int | None = None
        #: batches drawn so far (the session refuses a step with no batch drawn since the last)
        self.batches_yielded = 0

    @property
    def sample_rate(self) -> float:
        """q of the batches drawn (what the session checks)."""
        return float(self.batches.q)

    def __len__(self) -> int:
        return max(1, int(1 / self.sample_rate))

    def __iter__(self) -> Iterator[Any]:
        for _ in range(len(self)):
            yield self._batch(self.batches.next())

    def _batch(self, idx: torch.Tensor) -> Any:
        self.last_batch_size = len(idx)
        self.batches_yielded += 1
        if self._tensors is not None:
            return [t[idx] for t in self._tensors]
        if len(idx) == 0:
            return _empty(self.collate_fn([self.dataset[0]]))
        return self.collate_fn([self.dataset[int(i)] for i in idx])


def _empty(batch: Any) -> Any:
    """``batch`` (of one record) with 0 rows, in the same structure."""
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_empty(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _empty(v) for k, v in batch.items()}
    return batch


def log_choice(engine: DPEngine, why: str, module: nn.Module) -> None:
    """The observable choice: one INFO line per trial."""
    _log.info("make_private: %s engine for %s (%s)", engine.value, type(module).__name__, why)
