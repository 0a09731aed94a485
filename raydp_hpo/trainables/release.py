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

import importlib
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raydp_hpo._atomic_io import atomic_write
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trainables.models import build_model

__all__ = [
    "RELEASED_MODEL_FILE",
    "USER_MODEL_FILE",
    "load_released_model",
    "load_user_model",
    "program_path",
    "save_program",
    "save_released_model",
    "save_user_model",
    "model_fn_reference",
]

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
    """The released model at ``path``, in eval mode, in any Python process: the built-in
    models' :func:`save_released_model` files are rebuilt from raydp-hpo's own model zoo; a
    user model (:func:`save_user_model`, ``trial.save_model``) from its exported program
    beside it (:func:`program_path`, no import of the training script) when its ``model_fn``
    cannot be imported here or lives in ``__main__``, else with its ``model_fn``
    (:func:`load_user_model`). Only tensors and plain values are unpickled
    (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise RayDPHPOError(f"no released model at {path!s}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(payload, dict) and payload.get("format") == _USER_FORMAT:
        return load_user_model(path)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT or set(payload) != _KEYS:
        raise RayDPHPOError(f"{path!s} is not a released model written by raydp-hpo")
    model = build_model(payload["model"], tuple(payload["feature_shape"]),
                        int(payload["num_classes"]), **dict(payload["model_kwargs"]))
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model


# ---- a user's own model (raydp_hpo.trial_session) -------------------------------------------

#: File name of a user model in a trial's checkpoint directory (``TrialSession.save_model``).
USER_MODEL_FILE = "user_model.pt"
_USER_FORMAT = "raydp-hpo user model v1"
_USER_KEYS = frozenset({"format", "model_fn", "model_kwargs", "state_dict"})


def model_fn_reference(model_fn: Any) -> str:
    """``"module:qualname"`` of a module-level callable (a class or a function) that builds
    the model; a string of that form is returned as is. Lambdas and nested functions cannot
    be imported by the driver that releases the model, so they are refused."""
    if isinstance(model_fn, str):
        module, _, qualname = model_fn.partition(":")
        if not module or not qualname:
            raise InvalidParameterError(
                f"model_fn={model_fn!r} must be 'package.module:callable' or a callable"
            )
        return model_fn
    owner = getattr(model_fn, "__module__", None)
    name = getattr(model_fn, "__qualname__", None)
    if not callable(model_fn) or not owner or not name or "<" in name:
        raise InvalidParameterError(
            f"model_fn={model_fn!r} must be a module-level class or function (the driver "
            "imports it by name to rebuild the released model); lambdas and nested functions "
            "cannot be imported"
        )
    return f"{owner}:{name}"


def _resolve(reference: str) -> Any:
    module_name, _, qualname = reference.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def build_user_model(reference: str, model_kwargs: Mapping[str, Any]) -> nn.Module:
    """``model_fn(**model_kwargs)`` for ``reference = "module:qualname"``; a clear error when
    the callable cannot be imported here or does not return a ``torch.nn.Module``."""
    try:
        model_fn = _resolve(reference)
    except (ImportError, AttributeError) as err:
        raise RayDPHPOError(
            f"cannot import the model_fn {reference!r} to rebuild the model ({err}); define "
            "it at module level in a module the driver can import (or in the driver script)"
        ) from err
    model = model_fn(**dict(model_kwargs))
    if not isinstance(model, nn.Module):
        raise RayDPHPOError(
            f"model_fn {reference!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def save_user_model(
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    *,
    model_fn: Any,
    model_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Write a user model atomically to ``path`` in the documented format (a ``torch.save``'d
    dict, readable with ``weights_only=True``)::

        {"format": "raydp-hpo user model v1",
         "model_fn": "package.module:callable",   # builds the module
         "model_kwargs": {...},                    # plain values: model_fn(**model_kwargs)
         "state_dict": {name: tensor, ...}}        # on the CPU

    ``model_fn(**model_kwargs).load_state_dict(state_dict)`` rebuilds the model (checked by
    :meth:`TrialSession.save_model <raydp_hpo.trainables.session.TrialSession.save_model>`
    before a trial reports). No secret is stored: weights and public rebuild information."""
    payload = {
        "format": _USER_FORMAT,
        "model_fn": model_fn_reference(model_fn),
        "model_kwargs": dict(model_kwargs or {}),
        "state_dict": {k: v.detach().cpu().clone() for k, v in state_dict.items()},
    }
    path = Path(path)
    atomic_write(path, lambda fh: torch.save(payload, fh))
    return path


def read_user_model(path: str | Path) -> dict[str, Any]:
    """The payload of a user-model file (:func:`save_user_model`), validated; raises
    :class:`~raydp_hpo.errors.RayDPHPOError` naming the file when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise RayDPHPOError(
            f"no user model at {path!s}: the trial must call trial.save_model(model, "
            "model_fn=...) before trial.report_score(...)"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: say which
        raise RayDPHPOError(f"cannot read the user model {path!s}: {err}") from err
    if (not isinstance(payload, dict) or payload.get("format") != _USER_FORMAT
            or set(payload) != _USER_KEYS):
        raise RayDPHPOError(
            f"{path!s} is not a user model written by trial.save_model (format "
            f"{_USER_FORMAT!r})"
        )
    return payload


def load_user_model(path: str | Path) -> nn.Module:
    """The module saved by :func:`save_user_model`, in eval mode: rebuilt with its
    ``model_fn`` where that imports here (the user's own class), else — and always for a
    ``model_fn`` of ``__main__``, the training script, whose name means another script in
    another process — the exported program beside it (:func:`program_path`), a
    ``torch.fx.GraphModule`` computing the same function with the same weights."""
    payload = read_user_model(path)
    program = program_path(path)
    if payload["model_fn"].startswith("__main__:") and program.is_file():
        return _load_program(program)
    try:
        model = build_user_model(payload["model_fn"], payload["model_kwargs"])
    except RayDPHPOError as err:
        if not program.is_file():
            raise RayDPHPOError(
                f"{err}; and no exported program {program.name} is beside {Path(path).name} "
                "(trial.save_model warned that the model could not be exported)"
            ) from err
        return _load_program(program)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model


# ---- the portable release: an exported program beside the state dict ---------------------

_log = logging.getLogger(__name__)
#: Suffix of the exported program saved beside a user model (``torch.export.save``).
PROGRAM_SUFFIX = ".pt2"


def program_path(model_path: str | Path) -> Path:
    """Where the exported program of the model file ``model_path`` lives: the same name with
    the suffix ``.pt2`` (``user_model.pt2``, ``released_model.pt2``)."""
    return Path(model_path).with_suffix(PROGRAM_SUFFIX)


def _load_program(path: Path) -> nn.Module:
    program = torch.export.load(str(path))
    module = program.module()
    return module  # an exported module has no train/eval switch: it is what eval mode ran


def save_program(path: str | Path, model: nn.Module,
                 inputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]) -> str | None:
    """Export ``model`` (on the CPU, switched to eval mode) with :func:`torch.export.export`
    and save it to ``path`` (:func:`torch.export.save`): a program that loads in a Python
    process which never imported the code defining the model. ``inputs``: the shape (without
    the batch dimension) and dtype of each positional tensor argument of ``forward``; the
    example batch holds zeros (public, no record) and the batch dimension is exported as
    dynamic. Returns ``None`` when saved, else why the model cannot be exported (nothing is
    written then: the release keeps the state dict and its ``model_fn`` only)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    if not inputs:
        return "no forward pass with tensor arguments was seen to take the input shapes from"
    try:
        model = model.cpu().eval()
        examples = tuple(torch.zeros((2, *shape), dtype=dtype) for shape, dtype in inputs)
        batch = torch.export.Dim("batch")
        dynamic = tuple({0: batch} for _ in examples)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, examples, dynamic_shapes=dynamic)
        atomic_write(path, lambda fh: torch.export.save(program, fh))
    except Exception as err:  # any failure of the exporter: the state-dict route remains
        path.unlink(missing_ok=True)
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        _log.debug("torch.export failed for %s: %s", type(model).__name__, err)
        return reason
    return None
