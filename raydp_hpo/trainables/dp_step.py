"""Per-example clipping and Gaussian noise: the privatised gradient of one DP-SGD step.

For a Poisson batch B (each record in independently with probability q) the privatised
gradient is (Abadi et al. 2016, Alg. 1; Opacus' convention for the normalisation)

    g̃ = ( Σ_{i∈B} clip_C(∇ℓ_i) + N(0, σ²C²·I) ) / (q·n_pub),   clip_C(v) = v · min(1, C/‖v‖),

with n_pub a declared public size (never the realised n, which differs between neighbours),
whose release is one subsampled Gaussian mechanism with noise multiplier σ.

Two implementations of Σ clip_C(∇ℓ_i), both checked against a one-example-at-a-time
reference in ``tests/raydp_hpo/trainables/test_dp_step.py``:

* :class:`BookKeepingClipper` ("book-keeping", Bu et al. 2023, "Differentially private
  optimization on large model at small cost") — models whose trainable parameters all live in
  ``nn.Linear``, ``nn.Conv1d``/``nn.Conv2d`` (groups = 1, zero padding) and
  ``nn.GroupNorm``/``nn.LayerNorm`` layers: every model of :mod:`raydp_hpo.trainables.models`. One
  backward pass to the layer outputs gives each layer's output gradient g; with a the layer's
  input (unfolded into patches a_t for a convolution, t over output positions), the
  per-example weight gradient is Σ_t g_t a_tᵀ, whose squared norm is either
  Σ_{t,t'} (g_t·g_t')(a_t·a_t') (ghost norm; ‖g‖²‖a‖² when T = 1, Goodfellow 2015) or taken
  from the materialised per-example gradient (from the unfolded input and one batched
  matmul, or for a convolution from one grouped-convolution weight backward), chosen per
  layer by :attr:`NormStrategy.AUTO`'s fixed rule (deterministic) or, with
  :attr:`NormStrategy.TUNED`, by timing them on the first batch (public random tensors of the
  same shapes); the methods agree up to floating-point rounding. Affine
  normalisation parameters have per-example gradients Σ g ⊙ x̂ and Σ g. The clipped sum
  Σ_i c_i ∇ℓ_i, c_i = min(1, C/(‖∇ℓ_i‖ + 10⁻⁶)), is then formed from the same g and a.
* :class:`OpacusClipper` — any model Opacus supports: per-example gradients from
  ``opacus.GradSampleModule`` (hooks), then clip and sum. :func:`make_clipper` in ``"auto"``
  mode falls back to it for a layer book-keeping does not cover.

**Non-finite per-example gradients.** An example whose computed squared gradient norm is
inf or NaN (its activations overflowed, e.g. a record with features near the float32 maximum)
contributes exactly 0 to the sum, in both clippers: its rows are zeroed with ``torch.where``
before the sum, because c_i · NaN would stay NaN. Without this, one such record makes the
released gradient NaN if and only if it is present: no noise hides that. Each example's
contribution is then clip_C(∇ℓ_i) or 0, still of norm ≤ C, so the sensitivity C of the sum
under add/remove-one is unchanged (``tests/raydp_hpo/trainables/test_dp_step.py`` checks the
clipped sum with and without such a record).

:class:`GaussianNoise` adds the noise and counts every release so that tests can compare what
actually ran with the declared mechanism. :func:`poisson_batch` draws the Poisson batch in
O(batch) rather than O(n), from geometric gaps between the selected records;
:class:`PoissonBatches` (what training uses) draws the same independent batches a block of
steps at a time, so the few small tensor operations a batch needs run once per block.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

import torch
from torch import nn
from torch.nn.grad import conv1d_weight, conv2d_weight

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

__all__ = [
    "BookKeepingClipper",
    "OpacusClipper",
    "GaussianNoise",
    "make_clipper",
    "NormStrategy",
    "poisson_batch",
    "PoissonBatches",
    "supports_bk",
    "bk_unsupported_reason",
]

_EPS = 1e-6  # as Opacus: clip factor C / (‖v‖ + 1e-6)
_DENSE_POISSON_MAX_N = 4096  # poisson_batch: below this, one uniform per record is cheaper
_MAX_POISSON_N = 2**53  # poisson_batch: its float64 positions are exact integers below this
_POISSON_BLOCK = 32  # PoissonBatches: batches drawn per block
_POISSON_BLOCK_VALUES = 2**20  # PoissonBatches: at most this many gap positions per block


_CONV_TYPES = (nn.Conv1d, nn.Conv2d)
_NORM_TYPES = (nn.GroupNorm, nn.LayerNorm)
_BK_TYPES = (nn.Linear, *_CONV_TYPES, *_NORM_TYPES)


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


def _conv_pad(conv: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` (N, C, L), (N, C, 1, L) for a Conv1d or (N, C, H, W) zero-padded as ``conv`` pads
    it (integer/tuple padding, 'valid', or 'same' with torch's split: left = total // 2)."""
    dims = len(conv.kernel_size)
    if isinstance(conv.padding, str):
        pads = [0] * dims
        if conv.padding == "same":
            pads = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        lr = [(p // 2, p - p // 2) for p in pads]
    else:
        lr = [(p, p) for p in conv.padding]
    flat = [v for pair in reversed(lr) for v in pair]  # F.pad: last dimension first
    return nn.functional.pad(x, flat) if any(flat) else x


def _conv_unfold(conv: nn.Conv1d | nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The unfolded input of ``conv`` in im2col layout: (N, C_in·∏k, T), column t the input
    patch (zero padding included) that output position t sees, rows in the weight's
    (C_in, k…) order, so that the per-example weight gradient is g_i a_iᵀ with g_i (C_out, T).

    One strided view of the padded input, (N, C, k_h, k_w, H', W') with element
    [n, c, i, j, h, w] = x_pad[n, c, h·s_h + i·d_h, w·s_w + j·d_w], copied once into this
    layout (rows of W' elements); on CPU this is faster than ``nn.functional.unfold`` or than a
    copy of ``Tensor.unfold`` window views, whose innermost dimension is the short kernel.
    """
    if isinstance(conv, nn.Conv1d):
        x = x.unsqueeze(-2)  # (N, C, 1, L)
        kernel, stride, dilation = (1, *conv.kernel_size), (1, *conv.stride), (1, *conv.dilation)
    else:
        kernel, stride, dilation = conv.kernel_size, conv.stride, conv.dilation
    padded = _conv_pad(conv, x).contiguous()
    n, c, height, width = padded.shape
    out_h = (height - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    s_n, s_c, s_h, s_w = padded.stride()
    view = padded.as_strided(
        (n, c, kernel[0], kernel[1], out_h, out_w),
        (s_n, s_c, s_h * dilation[0], s_w * dilation[1], s_h * stride[0], s_w * stride[1]),
    )
    # reshape copies the overlapping windows unless they happen to be viewable, as for one
    # input channel with stride 1 (strides (L, 1, 1)): bmm on such a view falls back to a
    # per-example loop (~1 ms at N = 256), so the copy is made in every case.
    return view.reshape(n, c * kernel[0] * kernel[1], out_h * out_w).contiguous()


def _zero_rows(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t`` (N, …) with every row i where ``keep[i]`` is False replaced by exactly 0.

    ``torch.where``, not a product: a row of inf or NaN times a zero coefficient stays NaN.
    """
    mask = keep.view(-1, *([1] * (t.dim() - 1)))
    return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _row_sq_norms(t: torch.Tensor) -> torch.Tensor:
    """‖t_i‖² for each row i of ``t`` (N, …), in one fused reduction (no t² temporary;
    ``torch.linalg.vecdot(t, t)`` is a product and a sum on CPU)."""
    return torch.linalg.vector_norm(t, dim=tuple(range(1, t.dim()))).square_()


class _GradSink:
    """Where a layer's share writes Σ_i c_i ∇_θ ℓ_i for each of its parameters θ.

    Without ``into``: a fresh tensor becomes ``θ.grad`` (the clipped sum). With ``into``
    (parameter id → a tensor of its shape holding the Gaussian noise already drawn):
    ``θ.grad`` = that tensor + ``alpha``·Σ_i c_i ∇_θ ℓ_i, accumulated in place by the same
    matrix product (``addmm_``/``addmv_``), so the privatised gradient
    (Σ clip + N(0, σ²C²I))/normaliser costs no separate product, copy or add
    (:meth:`BookKeepingClipper.privatised_gradient`).
    """

    def __init__(self, into: dict[int, torch.Tensor] | None = None, alpha: float = 1.0) -> None:
        self.into, self.alpha = into, alpha

    def _target(self, param: torch.Tensor) -> torch.Tensor | None:
        return None if self.into is None else self.into.get(id(param))

    def mm(self, param: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """``param``'s share is the matrix product a @ b (viewed in ``param``'s shape)."""
        target = self._target(param)
        if target is None:
            param.grad = torch.mm(a, b).view(param.shape)
        else:
            matrix = target if target.dim() == 2 else target.view(a.shape[0], b.shape[1])
            matrix.addmm_(a, b, alpha=self.alpha)
            param.grad = target

    def mv(self, param: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
        """``param``'s share is the matrix-vector product m @ v (viewed in ``param``'s shape)."""
        target = self._target(param)
        if target is None:
            param.grad = torch.mv(m, v).view(param.shape)
        else:
            (target if target.dim() == 1 else target.view(-1)).addmv_(m, v, alpha=self.alpha)
            param.grad = target

    def add(self, param: torch.Tensor, t: torch.Tensor) -> None:
        """``param``'s share is ``t`` (of ``param``'s number of elements)."""
        target = self._target(param)
        if target is None:
            param.grad = t.reshape(param.shape)
        else:
            target.add_(t.view(param.shape), alpha=self.alpha)
            param.grad = target


class _LayerGrad:
    """One layer's share of a book-keeping step: per-example ‖∇_θ ℓ_i‖² and Σ c_i ∇_θ ℓ_i.

    Built from the layer's input a and output gradient g (of the summed loss, so row i of g
    is ∂ℓ_i/∂out_i). Subclasses hold only what the clipped sum needs;
    ``per_example_fields`` names the attributes that hold one row per example (None for a
    frozen parameter).
    """

    per_example_fields: tuple[str, ...] = ()

    def sq_norms(self) -> torch.Tensor:
        raise NotImplementedError

    def write_clipped_sum(self, coef: torch.Tensor, sink: _GradSink) -> None:
        """Write Σ_i c_i ∇_θ ℓ_i, c = ``coef`` (N,), for each trainable parameter θ to ``sink``."""
        raise NotImplementedError

    def drop_examples(self, keep: torch.Tensor) -> None:
        """Zero every per-example row where ``keep`` (N,) is False (:func:`_zero_rows`)."""
        for name in self.per_example_fields:
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, _zero_rows(t, keep))


class NormStrategy(Enum):
    """How :class:`BookKeepingClipper` gets per-example weight-gradient norms of layers with
    T > 1 positions (convolutions, Linear on sequences). Every strategy computes the same
    clipped sum; they differ in cost and in floating-point rounding only."""

    #: per layer, a fixed rule (:func:`_auto_strategy`): deterministic, so a run with the same
    #: secret seed gives the same model bit for bit
    AUTO = "auto"
    #: per layer, the fastest of GHOST, MATERIALISE and GROUPED whose operation count is within
    #: a factor 4 of the cheapest, timed once on data-independent tensors of the layer's shapes
    #: (as ``torch.backends.cudnn.benchmark``: faster on unknown hardware, but the choice, and
    #: so the rounding of the result, can change from run to run)
    TUNED = "tuned"
    GHOST = "ghost"  #: Σ_{t,t'} (g_t·g_t')(a_t·a_t'), ~N·T²·(p + d) operations
    #: G_i = g_i a_iᵀ per example from the unfolded input (im2col + one batched matmul),
    #: ~N·T·p·d operations
    MATERIALISE = "materialise"
    #: convolutions: every G_i from one grouped-convolution weight backward (groups = N), the
    #: same operations without an unfolded copy of the input; Linear: as MATERIALISE
    GROUPED = "grouped"


_TUNED_CANDIDATE_FACTOR = 4.0  # TUNED times only strategies within this factor of the fewest ops


def _operation_counts(t: int, p: int, d: int) -> tuple[int, int]:
    """Per-example operations of the ghost norm, T²(p + d), and of the materialised gradient,
    T·p·d (GROUPED does the materialised count), for T positions, p outputs, d inputs."""
    return t * t * (p + d), t * p * d


def _auto_strategy(module: nn.Module, t: int, p: int, d: int) -> NormStrategy:
    """AUTO's rule for a layer with T > 1 positions, p outputs and d inputs per position.

    * Linear on sequences: GHOST when its ~T²(p + d) operations are fewer than the ~T·p·d of
      the per-example gradient, else MATERIALISE.
    * Convolutions: GROUPED for a Conv2d with a stride > 1, else MATERIALISE, unless the ghost
      norm needs under half the operations of MATERIALISE.

    Why (CPU, torch 2.13, the clipping pipeline of ``benchmarks/dpsgd_throughput.py``): im2col
    of a strided 2-D convolution gathers with a stride along both spatial dimensions and cost
    more than the grouped convolution backward (cnn2d's second layer, B = 128: 5.5 ms against
    2.5 ms); for stride-1 2-D and all 1-D convolutions im2col + bmm was 2-4x faster than the
    grouped backward (0.07 against 0.17 ms, 0.54 against 2.2 ms, 0.9 against 1.8 ms), and it
    beat the ghost norm even with 1.3x its operation count (cnn1d's second layer: 0.54 against
    0.88 ms). :attr:`NormStrategy.TUNED` times the candidates instead, for other hardware.
    """
    ghost, materialise = _operation_counts(t, p, d)
    if isinstance(module, nn.Linear):
        return NormStrategy.GHOST if ghost < materialise else NormStrategy.MATERIALISE
    if 2 * ghost < materialise:
        return NormStrategy.GHOST
    strided = any(s > 1 for s in cast("nn.Conv1d | nn.Conv2d", module).stride)
    return NormStrategy.GROUPED if isinstance(module, nn.Conv2d) and strided else (
        NormStrategy.MATERIALISE)


def _candidate_strategies(t: int, p: int, d: int, conv: bool) -> list[NormStrategy]:
    """The strategies TUNED times for a layer with T positions, p outputs and d inputs per
    position: those whose operation count is within a factor 4 of the cheapest."""
    ghost, materialise = _operation_counts(t, p, d)
    ops = {NormStrategy.GHOST: ghost, NormStrategy.MATERIALISE: materialise}
    if conv:
        ops[NormStrategy.GROUPED] = materialise
    cheapest = min(ops.values())
    return [s for s, c in ops.items() if c <= _TUNED_CANDIDATE_FACTOR * cheapest]


def _matrix_layer_grad(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    a: torch.Tensor,
    g: torch.Tensor,
    strategy: NormStrategy,
) -> _LayerGrad:
    """Layers whose per-example weight gradient is Σ_t g_t a_tᵀ: a (N, T, d), g (N, T, p);
    ``strategy`` is GHOST or a materialising one (T > 1), anything when T = 1."""
    if a.shape[1] == 1:
        return _OuterProductGrad(weight, bias, a[:, 0], g[:, 0])
    if strategy is NormStrategy.GHOST:
        return _GhostGrad(weight, bias, a, g)
    return _MaterialisedGrad(
        weight,
        bias,
        torch.bmm(g.transpose(1, 2), a) if weight.requires_grad else None,
        g.sum(1) if bias is not None and bias.requires_grad else None,
    )


def _conv_per_example_weight_grad(
    conv: nn.Conv1d | nn.Conv2d, x: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """Per-example weight gradients of a convolution (groups = 1), (N, C_out, C_in·∏k).

    G_i = Σ_t g_{i,t} a_{i,t}ᵀ is the weight gradient of example i alone. Stacking the batch
    along channels, x → (1, N·C_in, …) and g → (1, N·C_out, …), turns the N per-example
    convolutions into one convolution with groups = N, whose weight gradient (N·C_out, C_in,
    k…) is every G_i at once: one call to the convolution backward kernel instead of an
    unfolded input. Padding is applied first (:func:`_conv_pad`) so 'same' with asymmetric
    padding is exact.
    """
    n, c = x.shape[:2]
    o = g.shape[1]
    x = _conv_pad(conv, x)
    size = (n * o, c, *conv.kernel_size)
    backward_weight = conv1d_weight if isinstance(conv, nn.Conv1d) else conv2d_weight
    per_example = backward_weight(
        x.reshape(1, n * c, *x.shape[2:]),
        size,
        g.reshape(1, n * o, *g.shape[2:]),
        stride=conv.stride,
        padding=0,
        dilation=conv.dilation,
        groups=n,
    )
    return per_example.reshape(n, o, -1)


class _OuterProductGrad(_LayerGrad):
    """T = 1 (Linear on (N, d)): ∇_W ℓ_i = g_i a_iᵀ, so ‖∇_W ℓ_i‖² = ‖g_i‖²‖a_i‖² (Goodfellow
    2015) and Σ c_i ∇_W ℓ_i = (c ⊙ g)ᵀ a."""

    per_example_fields = ("a", "g")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor,
                 g: torch.Tensor) -> None:
        self.weight, self.bias, self.a, self.g = weight, bias, a, g

    def sq_norms(self) -> torch.Tensor:
        g_sq = _row_sq_norms(self.g)
        has_bias = self.bias is not None and self.bias.requires_grad
        if not self.weight.requires_grad:
            return g_sq if has_bias else torch.zeros_like(g_sq)
        a_sq = _row_sq_norms(self.a)
        return g_sq.addcmul_(g_sq, a_sq) if has_bias else g_sq.mul_(a_sq)  # ‖g‖²(1 + ‖a‖²)

    def write_clipped_sum(self, coef: torch.Tensor, sink: _GradSink) -> None:
        g, a = self.g, self.a
        if self.weight.requires_grad:
            # (c ⊙ g)ᵀ a = gᵀ (c ⊙ a): scale whichever of g (N × p) and a (N × d) is smaller;
            # (p, d) is the weight's own shape
            if g.shape[1] <= a.shape[1]:
                sink.mm(self.weight, (g * coef.unsqueeze(1)).t(), a)
            else:
                sink.mm(self.weight, g.t(), a * coef.unsqueeze(1))
        if self.bias is not None and self.bias.requires_grad:
            sink.mv(self.bias, g.t(), coef)  # Σ c_i g_i, one matrix-vector product


class _GhostGrad(_LayerGrad):
    """Ghost norm (Li et al. 2022; Bu et al. 2023): ‖Σ_t g_t a_tᵀ‖²_F = Σ_{t,t'} (g_t·g_t')(a_t·a_t'),
    from two (T × T) Gram matrices per example; the clipped sum is Σ_{i,t} c_i g_{it} a_{it}ᵀ."""

    per_example_fields = ("a", "g")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor,
                 g: torch.Tensor) -> None:
        self.weight, self.bias, self.a, self.g = weight, bias, a, g

    def sq_norms(self) -> torch.Tensor:
        sq = torch.zeros(self.g.shape[0], device=self.g.device, dtype=self.g.dtype)
        if self.weight.requires_grad:
            gram_g = torch.bmm(self.g, self.g.transpose(1, 2))
            gram_a = torch.bmm(self.a, self.a.transpose(1, 2))
            sq = (gram_g * gram_a).sum((1, 2)).clamp(min=0)  # ≥ 0 up to rounding
        if self.bias is not None and self.bias.requires_grad:
            sq = sq + _row_sq_norms(self.g.sum(1))
        return sq

    def write_clipped_sum(self, coef: torch.Tensor, sink: _GradSink) -> None:
        cg = self.g * coef[:, None, None]
        if self.weight.requires_grad:
            p, d = cg.shape[-1], self.a.shape[-1]
            sink.mm(self.weight, cg.reshape(-1, p).t(), self.a.reshape(-1, d))
        if self.bias is not None and self.bias.requires_grad:
            sink.add(self.bias, cg.sum((0, 1)))


class _MaterialisedGrad(_LayerGrad):
    """Per-example weight gradients G_i = Σ_t g_t a_tᵀ (N × p × d), their norms, and Σ c_i G_i
    from them (:class:`NormStrategy` MATERIALISE or GROUPED). ``per_example`` and
    ``bias_per_example`` are None for frozen parameters."""

    per_example_fields = ("per_example", "bias_per_example")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 per_example: torch.Tensor | None, bias_per_example: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.per_example, self.bias_per_example = per_example, bias_per_example

    def sq_norms(self) -> torch.Tensor:
        parts = [_row_sq_norms(t) for t in (self.per_example, self.bias_per_example)
                 if t is not None]
        return torch.stack(parts).sum(0)

    def write_clipped_sum(self, coef: torch.Tensor, sink: _GradSink) -> None:
        if self.per_example is not None:  # Σ_i c_i G_i: one matrix-vector product
            sink.mv(self.weight, self.per_example.reshape(self.per_example.shape[0], -1).t(), coef)
        if self.bias is not None and self.bias_per_example is not None:
            sink.mv(self.bias, self.bias_per_example.t(), coef)


class _AffineNormGrad(_LayerGrad):
    """GroupNorm/LayerNorm affine parameters, y = x̂ ⊙ γ + β: per example ∇_γ ℓ_i = Σ g_i ⊙ x̂_i
    and ∇_β ℓ_i = Σ g_i, summed over the dimensions γ is broadcast along (spatial positions
    for GroupNorm, leading non-normalised dimensions for LayerNorm). Cheap: N × |γ| values."""

    per_example_fields = ("gamma", "beta")

    def __init__(self, module: nn.GroupNorm | nn.LayerNorm, x: torch.Tensor,
                 g: torch.Tensor) -> None:
        self.weight, self.bias = module.weight, module.bias
        if isinstance(module, nn.GroupNorm):
            xhat = nn.functional.group_norm(x, module.num_groups, eps=module.eps)
            dims = tuple(range(2, x.dim()))  # (N, C, *spatial): γ per channel
        else:
            shape = tuple(module.normalized_shape)
            xhat = nn.functional.layer_norm(x, shape, eps=module.eps)
            dims = tuple(range(1, x.dim() - len(shape)))  # (N, *lead, *normalized_shape)
        self.gamma = None
        if self.weight is not None and self.weight.requires_grad:
            self.gamma = xhat.mul_(g).sum(dims) if dims else xhat.mul_(g)  # x̂ is ours: in place
        self.beta = None
        if self.bias is not None and self.bias.requires_grad:
            self.beta = g.sum(dims) if dims else g

    def sq_norms(self) -> torch.Tensor:
        parts = [_row_sq_norms(t) for t in (self.gamma, self.beta) if t is not None]
        return torch.stack(parts).sum(0)

    def write_clipped_sum(self, coef: torch.Tensor, sink: _GradSink) -> None:
        for param, per in ((self.weight, self.gamma), (self.bias, self.beta)):
            if param is not None and per is not None:
                sink.mv(param, per.reshape(per.shape[0], -1).t(), coef)


def _layer_shape(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[int, int, int]:
    """(T, p, d) of a Linear or convolution: output positions, outputs and inputs per position."""
    if isinstance(module, nn.Linear):
        return g[0].numel() // g.shape[-1], g.shape[-1], x.shape[-1]
    weight = cast("nn.Conv1d | nn.Conv2d", module).weight
    return g[0, 0].numel(), g.shape[1], weight[0].numel()


def _layer_grad(
    module: nn.Module, x: torch.Tensor, g: torch.Tensor, strategy: NormStrategy
) -> _LayerGrad:
    """The :class:`_LayerGrad` of one covered layer from its input ``x`` and output grad ``g``;
    ``strategy`` is neither AUTO nor TUNED (the clipper resolves them per layer first)."""
    n = x.shape[0]
    if isinstance(module, nn.Linear):
        if x.dim() == 2:  # (N, d): T = 1
            return _OuterProductGrad(module.weight, module.bias, x, g)
        a = x.reshape(n, -1, x.shape[-1])
        g_t = g.reshape(n, -1, g.shape[-1])
        return _matrix_layer_grad(module.weight, module.bias, a, g_t, strategy)
    if isinstance(module, _CONV_TYPES):
        conv = cast("nn.Conv1d | nn.Conv2d", module)
        weight, bias = conv.weight, conv.bias
        g_t = g.reshape(n, g.shape[1], -1)  # (N, C_out, T)
        per_bias = g_t.sum(2) if bias is not None and bias.requires_grad else None
        if strategy is NormStrategy.GHOST:
            a = _conv_unfold(conv, x)  # (N, C_in·∏k, T)
            return _GhostGrad(weight, bias, a.transpose(1, 2), g_t.transpose(1, 2))
        if not weight.requires_grad:
            return _MaterialisedGrad(weight, bias, None, per_bias)
        if strategy is NormStrategy.GROUPED:
            return _MaterialisedGrad(weight, bias, _conv_per_example_weight_grad(conv, x, g),
                                     per_bias)
        per_example = torch.bmm(g_t, _conv_unfold(conv, x).transpose(1, 2))  # (N, C_out, d)
        return _MaterialisedGrad(weight, bias, per_example, per_bias)
    if isinstance(module, _NORM_TYPES):
        return _AffineNormGrad(module, x, g)
    raise RayDPHPOError(f"book-keeping clipping does not cover {type(module).__name__}")


_MISSING = object()


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
    saved = []
    try:
        for m in unique:
            own = m.__dict__.get("forward", _MISSING)
            saved.append((m, own))
            original = m.forward

            def recording(
                *args: Any, _m: nn.Module = m,
                _original: Callable[..., torch.Tensor] = original, **kwargs: Any,
            ) -> torch.Tensor:
                inp = args[0] if args else kwargs.get("input")
                if not isinstance(inp, torch.Tensor):
                    raise RayDPHPOError(
                        f"book-keeping clipping needs each {type(_m).__name__} layer's input "
                        "as its first positional argument (or input=...): use "
                        "grad_sample_mode='opacus'"
                    )
                out = _original(*args, **kwargs)
                records[_m].append((inp.detach(), out))
                return out

            m.__dict__["forward"] = recording
        logits = model(x)
    finally:
        for m, own in reversed(saved):
            if own is _MISSING:
                m.__dict__.pop("forward", None)
            else:
                m.__dict__["forward"] = own
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


class _Clipper:
    """What both clippers offer: :meth:`clipped_sum`, and :meth:`privatised_gradient`, here
    the clipped sum followed by ``noise.privatise`` (:class:`BookKeepingClipper` fuses the
    two)."""

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int]:
        """Set ``p.grad`` to Σ_i clip_C(∇ℓ_i); return (loss sum, |B|)."""
        raise NotImplementedError

    def privatised_gradient(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        max_grad_norm: float,
        noise: GaussianNoise,
        params: list[nn.Parameter],
    ) -> tuple[float, int]:
        """:meth:`clipped_sum`, then ``noise.privatise(params)``: every ``p.grad`` becomes
        (Σ_i clip_C(∇ℓ_i) + N(0, σ²C²·I)) / normaliser; returns (loss sum, |B|)."""
        loss, n = self.clipped_sum(x, y, max_grad_norm)
        noise.privatise(params)
        return loss, n


class BookKeepingClipper(_Clipper):
    """Σᵢ clip_C(∇ℓᵢ) in one backward pass, for models whose trainable parameters all live in
    Linear, Conv1d/Conv2d (groups = 1) and GroupNorm/LayerNorm layers (see module docstring).

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


class OpacusClipper(_Clipper):
    """Σᵢ clip_C(∇ℓᵢ) from Opacus per-example gradients (``GradSampleModule``, hooks mode)."""

    def __init__(self, model: nn.Module) -> None:
        from opacus import GradSampleModule

        self.model = model
        self.gsm = GradSampleModule(model, loss_reduction="sum")

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int]:
        n = int(x.shape[0])
        params = [p for p in self.model.parameters() if p.requires_grad]
        if n == 0:
            for p in params:
                p.grad = torch.zeros_like(p)
            return 0.0, 0
        for p in params:
            p.grad_sample = None  # type: ignore[attr-defined]
            p.grad = None
        loss = nn.functional.cross_entropy(self.gsm(x), y, reduction="sum")
        with warnings.catch_warnings():  # inputs need no grad: Opacus' hooks still fire
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        samples = [p.grad_sample for p in params]  # type: ignore[attr-defined]
        norms = torch.stack([s.reshape(n, -1).norm(dim=1) for s in samples], dim=1).norm(dim=1)
        finite = torch.isfinite(norms)
        if not bool(finite.all()):  # an inf/NaN per-example gradient: that example adds 0
            samples = [_zero_rows(s, finite) for s in samples]
            norms = _zero_rows(norms, finite)
        coef = (max_grad_norm / (norms + _EPS)).clamp(max=1.0)
        for p, s in zip(params, samples):
            p.grad = torch.einsum("i,i...->...", coef, s)
            p.grad_sample = None  # type: ignore[attr-defined]
        return float(loss.detach()), n


def poisson_batch(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """A Poisson sample of {0, …, n−1} with rate q, as sorted int64 indices, in O(|B|) work.

    Poisson sampling puts each record in the batch independently with probability q: the
    indicators X_0, …, X_{n−1} are i.i.d. Bernoulli(q). This draws the same law from the gaps
    between selected records instead of one uniform per record.

    Proof that the laws agree: extend the indicators to an infinite i.i.d. Bernoulli(q)
    sequence X_0, X_1, … (those past n − 1 are never looked at). Let P_1 < P_2 < … be the
    positions of its ones, counted from 1, and G_j = P_j − P_{j−1} (P_0 = 0). For every
    k_1, …, k_m ≥ 1 the event {G_1 = k_1, …, G_m = k_m} fixes the first P_m = Σ k_j
    indicators (k_j − 1 zeros, then a one, m times), so it has probability
    Π_j (1 − q)^{k_j − 1} q: the gaps are i.i.d. Geometric(q) on {1, 2, …}. Conversely, i.i.d.
    Geometric(q) gaps G_j define positions P_m = G_1 + … + G_m whose indicator sequence has, for
    every finite prefix x_0 … x_{L−1}, the probability q^{#ones}(1 − q)^{#zeros} (sum the gap
    law over the gap sequences consistent with the prefix), i.e. it is i.i.d. Bernoulli(q).
    The batch {P_j − 1 : P_j ≤ n} is therefore exactly a Poisson sample of {0, …, n−1}. It is
    sorted and duplicate-free by construction, with no rejection step.

    The gaps are drawn in chunks of ⌈nq + 6√(nq(1−q))⌉ + 16 (one ``geometric_`` call; a second
    chunk, continuing from the last position, is needed only when the first ends at or before
    n, i.e. more than that many records were selected: probability below 1e-9). Expected work
    O(nq). q = 1 gives every index without drawing; n ≤ 4096 or q > 1/4 uses one uniform per
    record (the definition of Poisson sampling; cheaper there).

    The law is exact up to the floating-point arithmetic of ``torch``'s geometric sampler,
    ⌈log U / log(1 − q)⌉ with U a 53-bit uniform. On CPU U ∈ [0, 1): every U > 0 gives a gap
    ≥ 1 (the ratio of two negative numbers, rounded up) and U = 0 an infinite one, so every
    later position is inf > n and the batch ends there. CUDA's uniforms may lie in (0, 1],
    where U = 1 would give a gap of 0 and repeat a record (its weight doubled in the sum:
    sensitivity 2C), so every gap is clamped to ≥ 1, which changes nothing for any other U.
    Each of these events has probability 2⁻⁵³ per gap drawn (about 1e-14 per step at
    B = 128), far below any δ. Positions are float64 integers, exact below 2⁵³ (n ≥ 2⁵³ is
    refused). ``tests/raydp_hpo/trainables/test_dp_step.py`` tests the size distribution, the
    per-index inclusion frequencies, the joint law of the gap sampler over all subsets of a
    small set, and both edge events (forced). All draws use ``generator`` and happen on its
    device, where the indices are returned.
    """
    n, q = _poisson_args(n, q)
    device = torch.device(generator.device)
    if q == 1.0 or n == 0:
        return torch.arange(n, dtype=torch.int64, device=device)
    if _dense_poisson(n, q):
        mask = torch.rand(n, generator=generator, device=device) < q
        return torch.nonzero(mask).flatten()
    return _bernoulli_by_gaps(n, q, generator)


def _poisson_args(n: int, q: float) -> tuple[int, float]:
    """``(n, q)`` as (int, float) after the checks every Poisson sampler makes: n an int in
    [0, 2⁵³) (float64 positions are exact below 2⁵³), q in (0, 1]."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
    if isinstance(q, bool) or not (isinstance(q, numbers.Real) and 0.0 < q <= 1.0):
        raise InvalidParameterError(f"sample rate q must be in (0, 1], got {q!r}")
    if n >= _MAX_POISSON_N:
        raise InvalidParameterError(f"n must be below 2**53 for exact positions, got {n}")
    return int(n), float(q)


def _dense_poisson(n: int, q: float) -> bool:
    """Whether one uniform per record is cheaper than geometric gaps (small n or large q)."""
    return n <= _DENSE_POISSON_MAX_N or q > 0.25


def _gap_chunk(n: int, q: float) -> int:
    """Gaps drawn per call: ⌈nq + 6√(nq(1−q))⌉ + 16, more than the batch size except with
    probability below 1e-9."""
    mean = n * q
    return math.ceil(mean + 6.0 * math.sqrt(mean * (1.0 - q))) + 16


def _geometric_gaps(shape: tuple[int, ...], q: float, generator: torch.Generator) -> torch.Tensor:
    """i.i.d. Geometric(q) gaps on {1, 2, …} (float64, on the generator's device). Clamped to
    ≥ 1: a gap of 0 would repeat a record (sensitivity 2C); inf (U = 0) ends the batch."""
    gaps = torch.empty(shape, dtype=torch.float64, device=torch.device(generator.device))
    return gaps.geometric_(q, generator=generator).clamp_(min=1.0)


def _bernoulli_by_gaps(
    n: int, q: float, generator: torch.Generator, chunk: int | None = None, start: float = 0.0
) -> torch.Tensor:
    """{P_j − 1 : P_j ≤ n} for P_j the partial sums of i.i.d. Geometric(q) gaps on {1, 2, …}:
    a Poisson sample of {0, …, n−1} with rate q, sorted (proof in :func:`poisson_batch`).
    ``chunk``: gaps drawn per call (default :func:`_gap_chunk`; tests pass a small one to
    exercise the continuation). ``start``: positions continue from this one (the records
    0, …, start − 1 were decided elsewhere; :func:`_bernoulli_by_gaps_block`'s continuation)."""
    if chunk is None:
        chunk = _gap_chunk(n, q)
    parts: list[torch.Tensor] = []
    last = float(start)  # position of the last selected record so far (0: none yet)
    while True:
        positions = _geometric_gaps((chunk,), q, generator).cumsum_(0)
        if last:
            positions.add_(last)
        inside = int(torch.searchsorted(positions, float(n), right=True))  # #{P_j ≤ n}
        parts.append(positions[:inside])
        if inside < chunk:
            break
        last = float(positions[-1])
    selected = parts[0] if len(parts) == 1 else torch.cat(parts)
    return selected.to(torch.int64).sub_(1)


def _bernoulli_by_gaps_block(
    n: int, q: float, generator: torch.Generator, steps: int, chunk: int | None = None
) -> list[torch.Tensor]:
    """``steps`` independent Poisson samples of {0, …, n−1} with rate q, each sorted: row s of
    one (steps × chunk) draw of i.i.d. Geometric(q) gaps gives batch s exactly as
    :func:`_bernoulli_by_gaps` would from its own first chunk (cumulative sums along the row,
    the positions ≤ n kept). A row whose chunk ends at or before n (at least ``chunk``
    records selected; probability below 1e-9 with the default chunk) is continued by
    :func:`_bernoulli_by_gaps` from its last position, with fresh gaps drawn after the block.

    The law is the one :func:`poisson_batch` proves for a single batch, for every row: each
    row's gaps are i.i.d. Geometric(q) (the rows of one i.i.d. draw, then fresh draws for a
    continuation), and no row's gaps are used by another, so the batches are independent.
    Only the order in which the generator's values are consumed changes. The point is cost:
    the handful of small tensor operations a batch needs (draw, clamp, cumulative sum,
    search, conversion) run once per block, not once per step (in a DP-SGD step each small
    operation costs several µs: issue 15). Returns views into one int64 block (a continued
    row is a separate tensor).
    """
    if chunk is None:
        chunk = _gap_chunk(n, q)
    device = torch.device(generator.device)
    positions = _geometric_gaps((steps, chunk), q, generator).cumsum_(1)
    bound = torch.full((steps, 1), float(n), dtype=torch.float64, device=device)
    inside = torch.searchsorted(positions, bound, right=True).view(-1).tolist()  # #{P_j ≤ n}
    last = positions[:, -1].tolist()
    # inf and every position past n are never read; bounded so the integer conversion is defined
    selected = positions.clamp_(max=float(n) + 1.0).to(torch.int64).sub_(1)
    batches = []
    for row, (count, end) in enumerate(zip(inside, last)):
        batch = selected[row, :count]
        if count == chunk:  # every gap of the row fell inside: continue after its last record
            batch = torch.cat([batch, _bernoulli_by_gaps(n, q, generator, chunk, start=end)])
        batches.append(batch)
    return batches


class PoissonBatches:
    """Poisson batches of {0, …, n−1} with rate q for DP-SGD, one per :meth:`next` call, drawn
    ``block`` steps ahead (:func:`_bernoulli_by_gaps_block`): the law of
    :func:`poisson_batch` for every batch, independent batches, at a fraction of the
    per-step cost. Where :func:`poisson_batch` uses one uniform per record (n ≤ 4096 or
    q > 1/4) each batch is drawn when asked for.

    The batches drawn but not yet used are part of the sampler's state (:meth:`state`,
    :meth:`load`): a trial restored from a checkpoint uses them, so a resumed run takes
    exactly the batches an uninterrupted one would. :meth:`reset` drops them (after the
    generator was reseeded). ``generator`` is secret: the batches are the subsampling of the
    subsampled Gaussian mechanism.
    """

    def __init__(
        self, n: int, q: float, generator: torch.Generator, block: int = _POISSON_BLOCK
    ) -> None:
        n, q = _poisson_args(n, q)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise InvalidParameterError(f"block must be an int >= 1, got {block!r}")
        self.n, self.q = n, q
        self.generator: torch.Generator = generator
        self.block: int = block
        # where poisson_batch draws without gaps (every record, or one uniform per record)
        self._ahead: bool = not (q == 1.0 or _dense_poisson(n, q))
        self._pending: deque[torch.Tensor] = deque()

    def next(self) -> torch.Tensor:
        """The next batch: sorted int64 indices on the generator's device."""
        if not self._ahead:
            return poisson_batch(self.n, self.q, self.generator)
        if not self._pending:
            # at most ~2^20 positions per block (8 MiB of float64), whatever n·q
            steps = max(1, min(self.block, _POISSON_BLOCK_VALUES // _gap_chunk(self.n, self.q)))
            self._pending.extend(_bernoulli_by_gaps_block(self.n, self.q, self.generator, steps))
        return self._pending.popleft()

    def reset(self) -> None:
        """Drop the batches drawn ahead (the next call draws a new block)."""
        self._pending.clear()

    def state(self) -> dict[str, Any]:
        """The batches drawn ahead and not yet used, as compact copies, with the (n, q) they
        were drawn for (the generator's own state is saved by its owner)."""
        return {"n": self.n, "q": self.q, "pending": [b.clone() for b in self._pending]}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`'s batches (moved to the generator's device). Batches drawn for
        another n or q, or none at all (``{}``), leave nothing pending (the next call draws a
        new block): stale ones would index records that do not exist or leave new ones out."""
        self._pending.clear()
        if int(state.get("n", -1)) != self.n or float(state.get("q", -1.0)) != self.q:
            return
        device = torch.device(self.generator.device)
        self._pending.extend(
            torch.as_tensor(b, dtype=torch.int64).to(device) for b in state.get("pending", [])
        )


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


@dataclass
class GaussianNoise:
    """Adds N(0, σ²C²·I) to the clipped sum and divides by a public normaliser.

    ``normaliser`` is the expected batch size q·n_public, computed from declared public
    sizes, never from the data. Dividing by the realised training-set size n would leak n:
    under add/remove adjacency neighbouring datasets have sizes n and n ± 1, so the scale of
    the released gradient would differ between them by a factor no noise accounts for
    (DESIGN.md, "Public vs private"). With a data-independent normaliser the release is
    (Σ clip + noise)/const, post-processing of the subsampled Gaussian mechanism.

    Computed as N(0, (σC/normaliser)²·I) + g/normaliser, the same law: the noise for every
    parameter is one flat draw of Σ|p| values with ``generator`` (split in parameter order;
    one RNG call and one allocation per step instead of one per parameter; ``normal_`` with
    ``generator``), and the scaled
    clipped sum is added in one fused pass (``torch._foreach_add_``), instead of a draw, an
    add and a divide per parameter (:meth:`privatise`), or accumulated into the noise by the
    clipper's own matrix products (:meth:`privatise_with`, used by
    :meth:`BookKeepingClipper.privatised_gradient`; same noise values). The generator must
    live on the parameters' device (``torch.Generator(device=...)``), where the noise is
    drawn. Parameters of different dtypes get one draw each, in order.

    The flat buffer and its per-parameter views are kept and drawn into again at the next
    release for the same parameters: as with PyTorch's own ``.grad`` tensors (accumulated in
    place unless set to None), each ``p.grad`` it sets is overwritten by the next release, so
    copy a gradient that must outlive the step. This saves an allocation, a split and a view
    per parameter every step (issue 15: 55-85 µs of a 1.5 ms MLP step); the values drawn are
    the same.
    """

    noise_multiplier: float
    max_grad_norm: float
    normaliser: float
    generator: torch.Generator
    releases: int = field(default=0)
    #: (parameter ids and shapes, dtype, device) → the flat noise buffer and its per-parameter
    #: views, reused from release to release (see the class docstring)
    _buffer: tuple[Any, torch.Tensor, list[torch.Tensor]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise InvalidParameterError(
                f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}"
            )
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InvalidParameterError(
                f"max_grad_norm must be finite and > 0, got {self.max_grad_norm!r}"
            )
        if isinstance(self.normaliser, bool) or not (
            isinstance(self.normaliser, (int, float))
            and math.isfinite(self.normaliser)
            and self.normaliser > 0
        ):
            raise InvalidParameterError(
                f"normaliser must be a finite number > 0 (the expected batch size q·n from "
                f"declared public sizes), got {self.normaliser!r}"
            )

    def privatise(self, params: list[nn.Parameter]) -> None:
        """Replace each ``p.grad`` by (p.grad + N(0, σ²C²·I)) / normaliser; count the release.

        Checks every parameter first (gradient present, generator on its device), so a
        refused call changes no gradient, draws no noise and counts no release.
        """
        for p in params:
            if p.grad is None:
                raise RayDPHPOError(
                    "privatise needs p.grad on every parameter (run the clipper first); "
                    f"a parameter of shape {tuple(p.shape)} has none"
                )
        grads = [cast(torch.Tensor, p.grad) for p in params]  # all present: checked above
        # a gradient that is still the last release's view of the noise buffer would be
        # overwritten by this release's draw: copy it first
        grads = [g.clone() if self._aliases_buffer(g) else g for g in grads]

        def add_grads(views: list[torch.Tensor], alpha: float) -> None:
            if views:  # noise + scale·g in one fused pass (foreach)
                torch._foreach_add_(views, grads, alpha=alpha)

        self._release(params, add_grads)

    def privatise_with(
        self,
        params: list[nn.Parameter],
        write: Callable[[dict[int, torch.Tensor], float], None],
    ) -> None:
        """Set each ``p.grad`` to N(0, (σC/normaliser)²·I) + what ``write`` adds; count the
        release.

        ``write(into, alpha)`` receives the noise drawn for each parameter (parameter id → a
        tensor of its shape, the same values :meth:`privatise` would draw) and must add
        alpha·S_p in place, S_p the parameter's clipped sum, alpha = 1/normaliser, so that
        p.grad = (S_p + N(0, σ²C²·I))/normaliser (:meth:`BookKeepingClipper.privatised_gradient`).
        The devices are checked before the draw.
        """
        self._release(
            params, lambda views, alpha: write({id(p): v for p, v in zip(params, views)}, alpha)
        )

    def _release(
        self, params: list[nn.Parameter], add: Callable[[list[torch.Tensor], float], None]
    ) -> None:
        """The one release path of both entry points: check the devices, draw the noise
        (:meth:`_noise`), let ``add(views, 1/normaliser)`` add the scaled clipped sum into the
        views in parameter order, make each view its parameter's ``grad``, count the release."""
        self._check_devices(params)
        views = self._noise(params)
        try:
            add(views, 1.0 / self.normaliser)
        except BaseException:
            # the buffer (each p.grad of the last release) now holds fresh noise and part of
            # a sum: no gradient is left that looks like a release, and the buffer is dropped
            for p in params:
                p.grad = None
            self._buffer = None
            raise
        for p, v in zip(params, views):
            p.grad = v
        self.releases += 1

    def _check_devices(self, params: list[nn.Parameter]) -> None:
        gen_device = torch.device(self.generator.device)
        if gen_device.type == "cpu" and all(p.device.type == "cpu" for p in params):
            return  # the common case, without a device comparison per parameter
        for p in params:
            if not _same_device(p.device, gen_device):
                raise RayDPHPOError(
                    f"noise generator is on {gen_device}, parameter on {p.device}: create it "
                    f"with torch.Generator(device={str(p.device)!r}) so the noise is drawn "
                    "where the parameters live"
                )

    def _noise(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """N(0, (σC/normaliser)²·I) for each parameter, in its shape, with ``generator``: one
        flat draw of Σ|p| values (``normal_``, one allocation) split in parameter order;
        parameters of different dtypes (mixed precision) get one draw each, in order."""
        std = self.noise_multiplier * self.max_grad_norm / self.normaliser
        if not params:
            return []
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            return [
                torch.empty(p.shape, device=p.device, dtype=p.dtype).normal_(
                    0.0, std, generator=self.generator)
                for p in params
            ]
        key = (tuple((id(p), p.shape) for p in params), dtype, params[0].device)
        if self._buffer is None or self._buffer[0] != key:
            sizes = [p.numel() for p in params]
            flat = torch.empty(sum(sizes), device=params[0].device, dtype=dtype)
            self._buffer = (key, flat, [v.view(p.shape) for v, p in zip(flat.split(sizes), params)])
        _, flat, views = self._buffer
        flat.normal_(0.0, std, generator=self.generator)
        return views

    def _aliases_buffer(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in the reused noise buffer (a ``p.grad`` from the last release)."""
        return self._buffer is not None and (
            t.untyped_storage().data_ptr() == self._buffer[1].untyped_storage().data_ptr()
        )


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats ``cuda`` and ``cuda:<current>`` as the same device."""
    if a.type != b.type:
        return False
    if a.type == "cpu":
        return True
    ia = a.index if a.index is not None else torch.cuda.current_device()
    ib = b.index if b.index is not None else torch.cuda.current_device()
    return ia == ib
