"""Book-keeping clipping (Bu et al. 2023, "Differentially private optimization on large
model at small cost"): which models it covers (:func:`supports_bk`), the forward pass that
records each covered layer, TUNED's timing of the norm strategies,
:class:`BookKeepingClipper`, and :func:`make_clipper`, which picks it or Opacus.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trainables.dp_step.clipping import _EPS, _Clipper, _zero_rows
from raydp_hpo.trainables.dp_step.layers import (
    _BK_TYPES,
    _CONV_TYPES,
    _NORM_TYPES,
    _GradSink,
    _layer_grad,
    _layer_shape,
    _LayerGrad,
)
from raydp_hpo.trainables.dp_step.noise import GaussianNoise
from raydp_hpo.trainables.dp_step.opacus_clipper import OpacusClipper
from raydp_hpo.trainables.dp_step.strategies import (
    NormStrategy,
    _auto_strategy,
    _candidate_strategies,
)


def bk_unsupported_reason(module: nn.Module) -> str | None:
    """Why book-keeping clipping cannot handle ``module``'s own parameters (None if it can).

    Covered: ``nn.Linear`` (inputs (N, d) or (N, …, d)); ``nn.Conv1d``/``nn.Conv2d`` with any
    stride, dilation and integer/tuple/'valid'/'same' zero padding, groups = 1;
    ``nn.GroupNorm``/``nn.LayerNorm`` affine parameters. A module type outside this list that
    owns a trainable parameter is refused, as is a convolution with groups > 1 or a padding
    mode other than 'zeros'.
    """
    own = [p for p in module.parameters(recurse=False) if p.requires_grad]
    if not own:
        return None
    if type(module) in _CONV_TYPES:
        conv = cast("nn.Conv1d | nn.Conv2d", module)
        if conv.groups != 1:
            return f"{type(module).__name__} with groups={conv.groups} (only groups=1)"
        if conv.padding_mode != "zeros":
            return f"{type(module).__name__} with padding_mode={conv.padding_mode!r}"
        return None
    if type(module) in (nn.Linear, *_NORM_TYPES):
        return None
    return f"{type(module).__name__} (book-keeping covers Linear, Conv1d/2d, GroupNorm, LayerNorm)"


def _bk_refusals(model: nn.Module) -> list[str]:
    """Every reason book-keeping cannot clip ``model`` (empty if it can)."""
    reasons = [
        f"{name or type(model).__name__}: {why}"
        for name, m in model.named_modules()
        if (why := bk_unsupported_reason(m)) is not None
    ]
    owners: dict[int, str] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        for p in m.parameters(recurse=False):
            if p.requires_grad and owners.setdefault(id(p), name) != name:
                reasons.append(f"parameter shared by {owners[id(p)]!r} and {name!r}")
    if not any(p.requires_grad for p in model.parameters()):
        reasons.append("no trainable parameter")
    return reasons


def supports_bk(model: nn.Module) -> bool:
    """True iff every trainable parameter belongs to exactly one layer that
    :class:`BookKeepingClipper` covers."""
    return not _bk_refusals(model)


_MISSING = object()


@contextmanager
def shadowed_forwards(
    layers: Sequence[nn.Module],
    wrap: Callable[[nn.Module, Callable[..., Any]], Callable[..., Any]],
) -> Iterator[None]:
    """Inside the block each of ``layers`` runs ``wrap(layer, layer.forward)`` as its
    ``forward``: an instance attribute, which ``nn.Module.__call__`` looks up first, so
    pre-hooks and hooks run as usual and ``__call__`` keeps its fast path (no forward hook).
    The originals (an instance ``forward`` of the user's own, or none) are restored in
    reverse order on the way out, also when the block raises."""
    saved: list[tuple[nn.Module, Any]] = []
    try:
        for m in layers:
            saved.append((m, m.__dict__.get("forward", _MISSING)))
            m.__dict__["forward"] = wrap(m, m.forward)
        yield
    finally:
        for m, own in reversed(saved):
            if own is _MISSING:
                m.__dict__.pop("forward", None)
            else:
                m.__dict__["forward"] = own


def _record_layers(
    model: nn.Module, layers: Sequence[nn.Module], x: torch.Tensor
) -> dict[nn.Module | None, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Run ``model(x)`` once, recording every call of each of ``layers``: layer → [(its input,
    detached; its output)], one entry per call, and None → [(x, the model's output)].

    Each layer's ``forward`` is shadowed for the duration of the call by an instance
    attribute that calls the original and records; ``nn.Module.__call__`` looks ``forward``
    up on the instance, so pre-hooks, hooks and everything else run as usual, and the
    originals are restored (in reverse order) even if the forward pass raises. This records
    what a forward hook on each layer would see (the input after any pre-hooks, the output
    before any hook), and also a direct ``layer.forward(...)`` call, which a hook misses, at
    a fraction of the cost: a module with a forward hook takes ``__call__``'s slow path on
    every call (``benchmarks/dpsgd_throughput.py``, issue 15). A layer whose input is
    neither its first positional argument nor ``input=`` is refused with
    :class:`RayDPHPOError`.
    """
    unique = list(dict.fromkeys(layers))  # a layer listed twice is shadowed once
    records: dict[nn.Module | None, list[tuple[torch.Tensor, torch.Tensor]]] = {
        m: [] for m in unique
    }

    def recording_for(m: nn.Module, original: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        def recording(*args: Any, **kwargs: Any) -> torch.Tensor:
            inp = args[0] if args else kwargs.get("input")
            if not isinstance(inp, torch.Tensor):
                raise RayDPHPOError(
                    f"book-keeping clipping needs each {type(m).__name__} layer's input "
                    "as its first positional argument (or input=...): use "
                    "grad_sample_mode='opacus'"
                )
            out = original(*args, **kwargs)
            records[m].append((inp.detach(), out))
            return out

        return recording

    with shadowed_forwards(unique, recording_for):
        logits = model(x)
    records[None] = [(x, logits)]
    return records


_TUNING_WARMUP, _TUNING_ROUNDS = 2, 5


def _fastest_strategy(
    module: nn.Module, x: torch.Tensor, g: torch.Tensor, candidates: list[NormStrategy]
) -> NormStrategy:
    """The candidate with the shortest time to build the layer's share, its norms and its
    clipped sum: each candidate runs twice untimed, then the candidates are timed in turn over
    5 rounds and each keeps its fastest round (the minimum estimates the intrinsic cost; the
    first calls of a kernel and bursts of load only ever add time). Inputs are standard-normal
    tensors of the shapes of ``x`` and ``g`` drawn from a fixed public seed: the choice depends
    on the data only through the shapes, and changes the clipped sum only by floating-point
    rounding. The parameter gradients it writes are overwritten by the real step."""
    gen = torch.Generator(device=x.device).manual_seed(0)
    x_pub = torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)
    g_pub = torch.randn(g.shape, generator=gen, device=g.device, dtype=g.dtype)
    coef = torch.ones(x.shape[0], device=x.device, dtype=g.dtype)
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)

    def run(strategy: NormStrategy) -> float:
        sync()
        start = time.perf_counter()
        share = _layer_grad(module, x_pub, g_pub, strategy)
        share.sq_norms()
        share.write_clipped_sum(coef, _GradSink())
        sync()
        return time.perf_counter() - start

    for strategy in candidates:
        for _ in range(_TUNING_WARMUP):
            run(strategy)
    best = {strategy: math.inf for strategy in candidates}
    for _ in range(_TUNING_ROUNDS):
        for strategy in candidates:
            best[strategy] = min(best[strategy], run(strategy))
    return min(candidates, key=best.__getitem__)


class BookKeepingClipper(_Clipper):
    """Σᵢ clip_C(∇ℓᵢ) in one backward pass, for models whose trainable parameters all live in
    Linear, Conv1d/Conv2d (groups = 1) and GroupNorm/LayerNorm layers (see the package docstring).

    Each covered layer's input and output are recorded in the forward pass; one
    ``autograd.grad`` of the summed loss gives every output gradient g (no parameter gradient
    is computed); per-example squared norms are summed over layers, c_i = min(1, C/(‖∇ℓ_i‖ +
    1e-6)), and each layer writes Σ c_i ∇_θ ℓ_i from the same g (Bu et al. 2023, "Differentially
    private optimization on large model at small cost", book-keeping). Per layer the norm is
    the ghost norm or the materialised per-example gradient (:class:`NormStrategy`): AUTO by a
    fixed rule, TUNED by timing the candidates once per layer; the choice per layer is kept in
    ``self.strategies``.
    """

    def __init__(self, model: nn.Module, strategy: NormStrategy = NormStrategy.AUTO) -> None:
        reasons = _bk_refusals(model)
        if reasons:
            raise RayDPHPOError(
                f"book-keeping clipping cannot handle this model ({'; '.join(reasons)}); "
                "use grad_sample_mode='opacus' or 'auto'"
            )
        self.model, self.strategy = model, NormStrategy(strategy)
        self.strategies: dict[nn.Module, NormStrategy] = {}  # AUTO's/TUNED's choice per layer
        self.layers = [
            m for m in model.modules()
            if isinstance(m, _BK_TYPES) and any(p.requires_grad for p in m.parameters(False))
        ]
        # every parameter of the covered layers, and the parameter lists already found to be
        # exactly the trainable ones among them (privatised_gradient's fusion test, per step
        # otherwise; the key holds the requires_grad flags, so freezing a layer re-tests)
        self._layer_params = [p for m in self.layers for p in m.parameters(recurse=False)]
        self._fusable: dict[tuple[tuple[int, ...], tuple[bool, ...]], bool] = {}

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int]:
        """Set ``p.grad`` to the clipped per-example gradient sum; return (loss sum, |B|).

        Raises (changing no gradient) if a covered layer did not run exactly once in the
        forward pass (a shared or bypassed layer: its per-example gradient would be wrong).
        """
        loss, n, shares, coef = self._shares(x, y, max_grad_norm)
        if n == 0:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
            return 0.0, 0
        sink = _GradSink()
        for share in shares:
            share.write_clipped_sum(coef, sink)
        return loss, n

    def privatised_gradient(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        max_grad_norm: float,
        noise: GaussianNoise,
        params: list[nn.Parameter],
    ) -> tuple[float, int]:
        """Set every ``p.grad`` (``params``) to the privatised gradient
        (Σ_i clip_C(∇ℓ_i) + N(0, σ²C²·I)) / normaliser; return (loss sum, |B|).

        The same release as :meth:`clipped_sum` followed by ``noise.privatise(params)``, with
        the same noise values (one flat draw in ``params`` order), fused: the noise is drawn
        after the forward and backward passes and the per-example norms (so a refused batch
        draws nothing), and each layer accumulates normaliser⁻¹·Σ_i c_i ∇_θ ℓ_i into its
        parameters' noise with one ``addmm_``/``addmv_`` (:class:`_GradSink`). The results
        differ from the unfused pair by floating-point rounding only. Falls back to the unfused
        pair when ``params`` are not exactly the parameters this clipper writes or have mixed
        dtypes.
        """
        if not self._fuses(params):
            return super().privatised_gradient(x, y, max_grad_norm, noise, params)
        loss, n, shares, coef = self._shares(x, y, max_grad_norm)

        def write(into: dict[int, torch.Tensor], alpha: float) -> None:
            sink = _GradSink(into, alpha)
            for share in shares:  # none for an empty batch: the gradient is the noise alone
                share.write_clipped_sum(coef, sink)

        noise.privatise_with(params, write)
        return loss, n

    def _fuses(self, params: list[nn.Parameter]) -> bool:
        """Whether ``params`` are exactly the trainable parameters of the covered layers (in
        any order) with one dtype: the condition for the fused path. The set comparison is
        cached per list of parameter ids and requires_grad flags of the covered layers'
        parameters; the dtypes are compared every step."""
        key = (
            tuple(map(id, params)),
            tuple(p.requires_grad for p in self._layer_params),
        )
        fuses = self._fusable.get(key)
        if fuses is None:
            written = [p for p in self._layer_params if p.requires_grad]
            fuses = len(params) == len(written) and {id(p) for p in params} == {
                id(p) for p in written
            }
            self._fusable[key] = fuses
        return fuses and all(p.dtype == params[0].dtype for p in params)

    def _shares(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int, list[_LayerGrad], torch.Tensor]:
        """(loss sum, |B|, each layer's share, clip factors c_i): one forward pass recording
        each covered layer's input and output, one ``autograd.grad`` to the outputs, the
        per-example squared norms summed over layers, c_i = min(1, C/(‖∇ℓ_i‖ + 1e-6)). An
        example whose squared norm is inf or NaN is dropped from every share (c_i = 0, rows
        zeroed). Writes no gradient; raises if a covered layer did not run exactly once."""
        n = int(x.shape[0])
        if n == 0:
            return 0.0, 0, [], torch.zeros(0, device=x.device)
        records = _record_layers(self.model, self.layers, x)
        logits = records.pop(None)[0][1]
        bad = [type(m).__name__ for m, r in records.items() if len(r) != 1]
        if bad:
            raise RayDPHPOError(
                f"book-keeping clipping needs every layer to run once per forward pass; "
                f"{', '.join(bad)} ran 0 or several times: use grad_sample_mode='opacus'"
            )
        loss = nn.functional.cross_entropy(logits, y, reduction="sum")
        outputs = [records[m][0][1] for m in self.layers]
        grads = torch.autograd.grad(loss, outputs)
        shares = [
            _layer_grad(m, x_m, g, self._strategy_for(m, x_m, g))
            for m, g in zip(self.layers, grads)
            for x_m in (records[m][0][0],)
        ]
        sq = shares[0].sq_norms()  # a fresh tensor: the other layers add into it
        for share in shares[1:]:
            sq.add_(share.sq_norms())
        # One reduction tells whether every norm is finite (a finite sum can still overflow to
        # inf; then the row-wise test below finds nothing to drop).
        if not math.isfinite(float(sq.sum())):
            finite = torch.isfinite(sq)
            for share in shares:
                share.drop_examples(finite)
            sq = _zero_rows(sq, finite)
        coef = sq.sqrt_().add_(_EPS).reciprocal_()
        if max_grad_norm != 1.0:
            coef.mul_(max_grad_norm)
        return loss.item(), n, shares, coef.clamp_(max=1.0)

    def _strategy_for(self, module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> NormStrategy:
        """The strategy for ``module``: the clipper's own unless AUTO or TUNED; AUTO applies
        :func:`_auto_strategy`, TUNED times the candidates on the layer's first batch
        (:func:`_fastest_strategy`); either choice is kept for later steps."""
        if self.strategy not in (NormStrategy.AUTO, NormStrategy.TUNED):
            return self.strategy
        chosen = self.strategies.get(module)
        if chosen is None:
            chosen = NormStrategy.MATERIALISE  # T = 1 or a normalisation layer: no choice
            if isinstance(module, (nn.Linear, *_CONV_TYPES)):
                t, p, d = _layer_shape(module, x, g)
                if t > 1 and self.strategy is NormStrategy.AUTO:
                    chosen = _auto_strategy(module, t, p, d)
                elif t > 1:
                    candidates = _candidate_strategies(t, p, d, isinstance(module, _CONV_TYPES))
                    chosen = (_fastest_strategy(module, x, g, candidates) if len(candidates) > 1
                              else candidates[0])
            self.strategies[module] = chosen
        return chosen


def make_clipper(model: nn.Module, mode: str = "auto") -> BookKeepingClipper | OpacusClipper:
    """``mode``: ``"auto"`` (book-keeping when :func:`supports_bk`, else Opacus), ``"bk"`` (raises
    for a model book-keeping does not cover) or ``"opacus"``."""
    if mode == "auto":
        mode = "bk" if supports_bk(model) else "opacus"
    if mode == "bk":
        return BookKeepingClipper(model)
    if mode == "opacus":
        return OpacusClipper(model)
    raise RayDPHPOError(f"grad_sample_mode must be 'auto', 'bk' or 'opacus', got {mode!r}")
