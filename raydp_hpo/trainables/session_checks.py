"""The checks a :class:`~raydp_hpo.trainables.session.TrialSession` runs on your training loop.

One concern: telling whether the DP steps are what trained the model and whether they clipped
the batches the returned loader drew (issue #37: the slips of an honest loop, not only
deliberate changes). The session runs them before every optimiser step, at every report, at
``save_model`` and at the end of the block:

* *only DP steps change the weights*: a fingerprint of the trainable weights (each
  parameter's ℓ1 and ℓ2 norm, :func:`_fingerprint`) is taken at ``make_private`` and after
  every DP step, and compared before the next step, at every report, at ``save_model`` and at
  the end of the block; weights moved in between (the optimiser passed in stepped instead of
  the returned one, a hand-written update, weights loaded after ``make_private``) fail the
  trial. ``save_model`` accepts only weights some DP step (or ``make_private``) left, and a
  trial with no DP step releases no score;
* *each step clips the batch the returned loader drew last*: the loader must have drawn a
  batch since the previous step (a loop over another loader, the full dataset or the
  original loader never draws from it), and the rows clipped must be that batch's (Opacus:
  the per-sample gradients' first dimension; native: the rows its layers saw).

Each failure raises :class:`~raydp_hpo.errors.TrialContractError` (accident-proofing, not a
sandbox: see :mod:`raydp_hpo.trainables.session`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from raydp_hpo.errors import TrialContractError
from raydp_hpo.trainables.native_private import DPEngine

if TYPE_CHECKING:
    from raydp_hpo.trainables.session import TrialSession


_FAILS = "The trial fails and nothing from it is released; its charge stays spent."


def _fingerprint(params: list[torch.Tensor]) -> torch.Tensor:
    """A cheap fingerprint of the weights: each parameter's ℓ1 and ℓ2 norms (two fused
    ``_foreach_norm`` passes, left on the device: no synchronisation), compared bit for bit. It tells
    a model moved by any optimiser step (every entry with a gradient moves) from one left
    alone; it is not a hash an adversary could not collide (module docstring: accident-proofing,
    not a sandbox). The same tensors on the same device reduce to the same bits."""
    if not params:
        return torch.zeros(0)
    with torch.no_grad():
        detached = [p.detach() for p in params]
        norms = [*torch._foreach_norm(detached, 1), *torch._foreach_norm(detached, 2)]
        return torch.stack([n.float() for n in norms])


def _same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _grad_sample_rows(private_module: nn.Module) -> int | None:
    """Rows of the per-sample gradients Opacus's GradSampleModule computed (None: none)."""
    for p in private_module.parameters():
        grad_sample = getattr(p, "grad_sample", None)
        if isinstance(grad_sample, list):  # accumulation (forbidden): the last one
            grad_sample = grad_sample[-1] if grad_sample else None
        if isinstance(grad_sample, torch.Tensor):
            return int(grad_sample.shape[0])
    return None


def _batch_rows(batch: Any) -> int | None:
    """Records in a collated batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            rows = _batch_rows(item)
            if rows is not None:
                return rows
    return None


@functools.cache
def _tracked_dp_loader_type() -> type:
    """Opacus's ``DPDataLoader``, counting the batches it yields and the last one's rows (what
    the session's step check compares with the per-sample gradients)."""
    from opacus.data_loader import DPDataLoader

    class TrackedDPDataLoader(DPDataLoader):  # type: ignore[misc]
        batches_yielded = 0
        last_batch_size: int | None = None

        def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
            for batch in super().__iter__():
                self.batches_yielded += 1
                self.last_batch_size = _batch_rows(batch)
                yield batch

    return TrackedDPDataLoader


def check_batch(session: TrialSession, private_module: nn.Module) -> None:
    """Raise unless the step clips the batch the returned loader drew last: the loader has
    drawn a batch since the previous step, and (Opacus) the per-sample gradients have its
    row count (the native engine compares the rows its layers saw in its own step)."""
    step = session._steps_taken + 1
    if session._loader.batches_yielded <= session._batches_at_step:
        raise TrialContractError(
            f"step {step} refused: the loader make_private returned has drawn no batch "
            "since the previous step, so this step trains on a batch from somewhere else "
            "(your own DataLoader, the full dataset, a batch kept from before). The charge "
            "covers Poisson batches at q only: iterate the returned loader, "
            "`for x, y in loader:` with one optimizer.step() per batch. "
            + _FAILS
        )
    if session.engine is DPEngine.NATIVE:
        return
    drawn = session._loader.last_batch_size
    rows = _grad_sample_rows(private_module)
    if rows is None:
        raise TrialContractError(
            f"step {step} refused: optimizer.step() without a forward and backward pass of "
            "the module make_private returned (no per-sample gradients). " + _FAILS
        )
    if rows != drawn:
        raise TrialContractError(
            f"step {step} refused: the per-sample gradients are of {rows} examples but the "
            f"loader's last Poisson batch has {drawn}: train each step on the batch the "
            "loader make_private returned yielded last, whole (not a batch of another "
            "loader, not the full dataset, no records reshaped into rows). " + _FAILS
        )
