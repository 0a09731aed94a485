"""One layer's share of a book-keeping step (Bu et al. 2023): from the layer's input a and
output gradient g, the per-example squared norms ‖∇_θ ℓ_i‖² (outer product, ghost norm or
materialised per-example gradient) and the clipped sum Σ_i c_i ∇_θ ℓ_i written to a
:class:`_GradSink`; with the convolution helpers (zero padding, im2col, the grouped weight
backward).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.nn.grad import conv1d_weight, conv2d_weight

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trainables.dp_step.clipping import _row_sq_norms, _zero_rows
from raydp_hpo.trainables.dp_step.strategies import (
    NormStrategy,
)

_CONV_TYPES = (nn.Conv1d, nn.Conv2d)
_NORM_TYPES = (nn.GroupNorm, nn.LayerNorm)
_BK_TYPES = (nn.Linear, *_CONV_TYPES, *_NORM_TYPES)


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
