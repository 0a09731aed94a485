"""Ray Tune function trainable wrapping :func:`raydp_hpo.trainables.training.train_dp`.

Data travels through the Ray object store (``tune.with_parameters``), never through the
config, and never is logged. Each epoch is reported with
``tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))``; a restored or
retried trial resumes from ``tune.get_checkpoint()`` inside the charge the checkpoint records,
while a retry with no checkpoint starts from scratch and pays again under a new attempt id
(:mod:`raydp_hpo.trainables.privacy_gate`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trainables.data import DataSplits
from raydp_hpo.trainables.training import train_dp
from raydp_hpo.trial.settings import RaydpSettings

__all__ = ["dp_trainable", "make_trainable", "with_data", "check_resources"]


def _device() -> str:
    import torch

    # Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned to this trial (none: empty).
    return "cuda" if torch.cuda.is_available() else "cpu"


def dp_trainable(
    config: dict[str, Any], data: DataSplits | None = None, secret_seed: int | None = None
) -> None:
    """Tune function trainable: one DP training run per trial (see :func:`train_dp`).

    ``secret_seed`` arrives through the object store (``tune.with_parameters``), never through
    the config, which Tune logs."""
    from ray import tune

    if data is None:
        raise InvalidParameterError(
            "dp_trainable needs data; build it with make_trainable(data) or with_data(data)"
        )
    settings = RaydpSettings.from_config(config)
    if not (settings.needs_ledger or settings.nonprivate):
        raise RayDPHPOError(
            "a Tune trial must be accounted: set config['raydp'] with charge=True, covered_by="
            "<plan charge id> or nonprivate=True (oracle baseline)"
        )
    context = tune.get_context()
    trial_id = context.get_trial_id() or "trial"
    restored = tune.get_checkpoint()
    with tempfile.TemporaryDirectory(prefix="raydp-ckpt-") as tmp:
        ckpt_dir = Path(tmp) / "checkpoint"

        def report(metrics: dict[str, Any], path: str | None) -> None:
            checkpoint = tune.Checkpoint.from_directory(path) if path else None
            tune.report(metrics, checkpoint=checkpoint)

        def run(resume: str | None) -> None:
            train_dp(
                config,
                data,
                report=report,
                checkpoint_dir=ckpt_dir,
                resume_from=resume,
                device=_device(),
                owner=f"{settings.experiment}:trial:{trial_id}",
                secret_seed=secret_seed,
            )

        if restored is None:
            run(None)
        else:
            with restored.as_directory() as resume_dir:
                run(str(resume_dir))


def with_data(data: DataSplits, secret_seed: int | None = None) -> Any:
    """``tune.with_parameters(dp_trainable, data=data, secret_seed=...)``: data and the
    optional secret seed via the object store (neither is ever logged)."""
    from ray import tune

    if not isinstance(data, DataSplits):
        raise InvalidParameterError(f"data must be a DataSplits, got {type(data).__name__}")
    return tune.with_parameters(dp_trainable, data=data, secret_seed=secret_seed)


def make_trainable(
    data: DataSplits,
    resources: Mapping[str, float] | None = None,
    *,
    secret_seed: int | None = None,
) -> Any:
    """The Tune trainable with data attached and per-trial ``resources`` (default 1 CPU).

    Fails fast (:func:`check_resources`) when no node of the running Ray cluster can hold one
    trial's request (Tune would otherwise leave the trials pending forever).
    """
    import ray
    from ray import tune

    res = {"cpu": 1.0, "gpu": 0.0, **dict(resources or {})}
    unknown = set(res) - {"cpu", "gpu", "memory"}
    if unknown:
        raise InvalidParameterError(
            f"unknown resource keys {sorted(unknown)}; use cpu, gpu, memory"
        )
    if ray.is_initialized():
        check_resources(res)
    return tune.with_resources(with_data(data, secret_seed), res)


_RAY_RESOURCE = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}


def check_resources(resources: Mapping[str, float]) -> None:
    """Refuse a per-trial request that no live node of the Ray cluster can hold.

    Tune would otherwise leave every trial pending forever — after the plan was charged.
    A trial's resources must fit on one node, so each request is compared with the largest
    node's total (CPU, GPU, memory in bytes). On an autoscaling cluster, start a node of the
    needed size first.
    """
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for key, amount in resources.items():
        if key not in _RAY_RESOURCE or not amount:
            continue
        largest = max((float(n.get(_RAY_RESOURCE[key], 0.0)) for n in nodes), default=0.0)
        if float(amount) > largest:
            raise InvalidParameterError(
                f"trials request {key}={amount:g} but the largest node of the Ray cluster has "
                f"{key}={largest:g} (nodes: {len(nodes)}); Tune would wait forever. Request at "
                f"most {key}={largest:g} per trial or add a node that large. Nothing was charged."
            )
