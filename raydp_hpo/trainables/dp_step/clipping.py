"""What both clipping engines share: the :class:`_Clipper` interface (the clipped sum
Σ_i clip_C(∇ℓ_i), then the privatised gradient) and the per-example helpers (the clip
factor's 10⁻⁶, exact zeroing of non-finite rows, row norms).
"""

from __future__ import annotations

import torch
from torch import nn

from raydp_hpo.trainables.dp_step.noise import GaussianNoise

_EPS = 1e-6  # as Opacus: clip factor C / (‖v‖ + 1e-6)


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
