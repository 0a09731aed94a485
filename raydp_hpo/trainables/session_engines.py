"""The DP-SGD engines a :class:`~raydp_hpo.trainables.session.TrialSession` sets up.

One concern: what :meth:`~raydp_hpo.trainables.session.TrialSession.make_private` returns,
built at exactly the session's charge (σ, C, the normaliser q·n over the declared public
size n, Poisson sampling at q from the trial's secret generators):

* :func:`native_engine` — the project's own book-keeping DP-SGD step
  (:mod:`raydp_hpo.trainables.native_private`);
* :func:`opacus_engine` — Opacus's ``GradSampleModule``, a ``DPOptimizer`` drawing the
  project's noise and a tracked ``DPDataLoader``;
* :func:`dataset_of` — the dataset behind what the caller passed, refusing a loader whose q
  is not the charged one.

Each reads the session's public settings only. Which engine runs, and the checks of what it
ran, stay in :mod:`raydp_hpo.trainables.session` and :mod:`raydp_hpo.trainables.session_checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, TrialContractError
from raydp_hpo.trainables.dp_step.noise import NoiseSource
from raydp_hpo.trainables.native_private import (
    NativeDPOptimizer,
    NativePoissonLoader,
    NativePrivateModule,
)
from raydp_hpo.trainables.session_checks import _tracked_dp_loader_type

if TYPE_CHECKING:
    from raydp_hpo.trainables.session import TrialSession

__all__ = ["native_engine", "opacus_engine", "dataset_of"]

#: Relative tolerance of the float comparisons between the engine and the charge.
_RTOL = 1e-12


def native_engine(session: TrialSession, module: nn.Module, optimizer: torch.optim.Optimizer,
                  dataset: Any, collate_fn: Callable[..., Any] | None,
                  noise_source: NoiseSource = NoiseSource.SEEDED) -> tuple[nn.Module, Any, Any]:
    """The project's own engine (:mod:`raydp_hpo.trainables.native_private`): its private
    module, DP optimiser and Poisson loader at the charge."""
    private_module = NativePrivateModule(module)
    dp_optimizer = NativeDPOptimizer(
        optimizer, private_module, noise_multiplier=session.noise_multiplier,
        max_grad_norm=session.max_grad_norm, expected_batch_size=session.expected_batch_size,
        generator=session.noise_generator, noise_source=noise_source,
    )
    loader = NativePoissonLoader(dataset, session.sample_rate, session.sampling_generator,
                                 collate_fn)
    dp_optimizer.loader = loader
    return private_module, dp_optimizer, loader


def opacus_engine(session: TrialSession, module: nn.Module, optimizer: torch.optim.Optimizer,
                  dataset: Any, collate_fn: Callable[..., Any] | None,
                  noise_source: NoiseSource = NoiseSource.SEEDED) -> tuple[nn.Module, Any, Any]:
    """Opacus's GradSampleModule, DPOptimizer (drawing the project's noise:
    :class:`~raydp_hpo.trainables.dp_step.opacus_noise.ExactNoiseDPOptimizer`) and
    DPDataLoader at the charge."""
    from opacus import GradSampleModule

    from raydp_hpo.trainables.dp_step.opacus_noise import ExactNoiseDPOptimizer

    private_module = GradSampleModule(module, batch_first=True, loss_reduction="mean")
    private_module.forbid_grad_accumulation()  # Poisson sampling: one batch per step
    dp_optimizer = ExactNoiseDPOptimizer(
        optimizer,
        noise_multiplier=session.noise_multiplier,
        max_grad_norm=session.max_grad_norm,
        expected_batch_size=session.expected_batch_size,
        loss_reduction="mean",
        generator=session.noise_generator,
        noise_source=noise_source,
    )
    loader_kwargs: dict[str, Any] = {}
    if collate_fn is not None:
        loader_kwargs["collate_fn"] = collate_fn
    loader = _tracked_dp_loader_type()(dataset, sample_rate=session.sample_rate,
                                       generator=session.sampling_generator, **loader_kwargs)
    return private_module, dp_optimizer, loader


def dataset_of(session: TrialSession, data: Any, loader_type: Any, dp_loader_type: Any) -> Any:
    """The dataset ``make_private`` draws Poisson batches from: ``data`` itself, or the dataset
    of a loader whose q is the charged one (else refused, naming both)."""
    if isinstance(data, dp_loader_type):
        rate = float(data.sample_rate)
        if not math.isclose(rate, session.sample_rate, rel_tol=_RTOL):
            raise TrialContractError(
                f"the DPDataLoader samples at q={rate!r} but the trial was charged "
                f"q={session.sample_rate!r}: pass the dataset to make_private instead"
            )
        return data.dataset
    if isinstance(data, loader_type):
        batch = getattr(data, "batch_size", None)
        if batch is None or batch != session.expected_batch_size:
            raise TrialContractError(
                f"the DataLoader's batch_size={batch!r} means q={batch}/{session.dataset_size}"
                f" but the trial was charged q={session.sample_rate!r} (expected batch "
                f"{session.expected_batch_size}): pass the dataset (loader.dataset) to "
                "make_private, or a loader with batch_size=trial.expected_batch_size"
            )
        return data.dataset
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise InvalidParameterError(
            f"make_private needs a torch Dataset or DataLoader, got {type(data).__name__}"
        )
    return data
