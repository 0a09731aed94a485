"""The released model as a file of its own: weights and architecture, nothing else.

A trial's checkpoint (``train_dp``'s ``CHECKPOINT_FILE``) is a **private artefact**: to resume
a run without drawing new noise it keeps the state of the run's secret generators (Poisson
batches, DP noise), and it keeps the run's history of unnoised per-epoch metrics. Anyone who
holds the noise generator's state can regenerate every noise draw and subtract it from the
released weights, which gives back the exact clipped gradient sums: the release would have no
privacy left. So the checkpoint is never the release; :func:`save_released_model` writes the
weights the certificate covers (post-processing of the charged mechanism) with the public
facts needed to rebuild the module, and :func:`load_released_model` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raydp_hpo._atomic_io import atomic_write
from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trainables.models import build_model

__all__ = ["RELEASED_MODEL_FILE", "load_released_model", "save_released_model"]

#: File name of the released model in an experiment directory.
RELEASED_MODEL_FILE = "released_model.pt"
#: The only keys a released-model file holds.
_KEYS = frozenset({"format", "model", "model_kwargs", "feature_shape", "num_classes",
                   "state_dict"})
_FORMAT = "raydp-hpo released model v1"


def save_released_model(
    path: str | Path,
    model: nn.Module,
    *,
    model_name: str,
    model_kwargs: Mapping[str, Any],
    feature_shape: tuple[int, ...],
    num_classes: int,
) -> Path:
    """Write ``model``'s parameters and buffers (on the CPU) with what rebuilds it — the
    model's name and keyword arguments, the feature shape and the number of classes, all
    public configuration — atomically to ``path``; return ``path``."""
    payload = {
        "format": _FORMAT,
        "model": str(model_name),
        "model_kwargs": dict(model_kwargs),
        "feature_shape": tuple(int(d) for d in feature_shape),
        "num_classes": int(num_classes),
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
    }
    path = Path(path)
    atomic_write(path, lambda fh: torch.save(payload, fh))
    return path


def load_released_model(path: str | Path) -> nn.Module:
    """The module saved by :func:`save_released_model`, in eval mode. Only tensors and plain
    values are unpickled (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise RayDPHPOError(f"no released model at {path!s}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT or set(payload) != _KEYS:
        raise RayDPHPOError(f"{path!s} is not a released model written by raydp-hpo")
    model = build_model(payload["model"], tuple(payload["feature_shape"]),
                        int(payload["num_classes"]), **dict(payload["model_kwargs"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model
