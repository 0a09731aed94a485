"""The learning-rate transfer rule of Koskela & Kulkarni (2023), used by
:class:`~raydp_hpo.searchers.subsampled_transfer.SubsampledTransferSearch` to carry a learning
rate tuned on a subsample of size m to the full dataset of size n. Re-exported by
:mod:`raydp_hpo.searchers.base`.
"""

from __future__ import annotations

from raydp_hpo.trial.privacy import Optimizer

__all__ = ["lr_transfer_factor"]


def lr_transfer_factor(optimizer: Optimizer, n: float, m: float) -> float:
    """Koskela & Kulkarni (2023) learning-rate transfer from a dataset of size m to size n:
    × n/m for (momentum) SGD and full-batch GD, × 1 for Adam and ADADP."""
    if optimizer in (Optimizer.ADAM, Optimizer.ADADP):
        return 1.0
    return n / m
