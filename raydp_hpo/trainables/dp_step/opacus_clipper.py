""":class:`OpacusClipper`: Σ_i clip_C(∇ℓ_i) from Opacus per-example gradients, for the
models book-keeping does not cover.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from raydp_hpo.trainables.dp_step.clipping import _EPS, _Clipper, _zero_rows


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
