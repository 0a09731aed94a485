"""How :class:`~raydp_hpo.trainables.dp_step.bookkeeping.BookKeepingClipper` gets the
per-example weight-gradient norms of layers with T > 1 positions: :class:`NormStrategy`,
AUTO's fixed rule and the candidates TUNED times.
"""

from __future__ import annotations

from enum import Enum
from typing import cast

from torch import nn


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
