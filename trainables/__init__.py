"""DP training for Ray Tune trials: data, models, Opacus-backed DP-SGD / ADADP, the privacy
gate and the Tune trainable. Imports the core (:mod:`raydp_hpo`) only.

Re-exported lazily (PEP 562): ``from trainables.privacy_gate import admit`` or
``trainables.data`` never pulls in torch unless the name needs it.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "Dataset": "trainables.data",
    "DataSplits": "trainables.data",
    "load_parquet": "trainables.data",
    "load_digits": "trainables.data",
    "load_mnist1d": "trainables.data",
    "split": "trainables.data",
    "select_view": "trainables.data",
    "MODEL_NAMES": "trainables.models",
    "build_model": "trainables.models",
    "validate_model": "trainables.models",
    "RaydpSettings": "trainables.privacy_gate",
    "admit": "trainables.privacy_gate",
    "TrainResult": "trainables.training",
    "ReleaseLog": "trainables.training",
    "declared_privacy": "trainables.training",
    "load_checkpoint": "trainables.training",
    "train_dp": "trainables.training",
    "ClientOptimizer": "trainables.federated",
    "FedSettings": "trainables.federated",
    "FedResult": "trainables.federated",
    "fed_avg": "trainables.federated",
    "pathological_split": "trainables.federated",
    "run_federated": "trainables.federated",
    "run_federated_ray": "trainables.federated",
    "dp_trainable": "trainables.tune_trainable",
    "make_trainable": "trainables.tune_trainable",
    "with_data": "trainables.tune_trainable",
}

__all__ = list(_EXPORTS)

# The real types, for mypy and IDEs: under TYPE_CHECKING only, so at run time every name stays
# lazy (tests/raydp_hpo/test_public_api.py checks that these imports match _EXPORTS).
if TYPE_CHECKING:
    from trainables.data import (
        Dataset,
        DataSplits,
        load_digits,
        load_mnist1d,
        load_parquet,
        select_view,
        split,
    )
    from trainables.federated import (
        ClientOptimizer,
        FedResult,
        FedSettings,
        fed_avg,
        pathological_split,
        run_federated,
        run_federated_ray,
    )
    from trainables.models import MODEL_NAMES, build_model, validate_model
    from trainables.privacy_gate import RaydpSettings, admit
    from trainables.training import (
        ReleaseLog,
        TrainResult,
        declared_privacy,
        load_checkpoint,
        train_dp,
    )
    from trainables.tune_trainable import dp_trainable, make_trainable, with_data


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
