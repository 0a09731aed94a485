"""DP training for Ray Tune trials: data, models, Opacus-backed DP-SGD / ADADP, the privacy
gate and the Tune trainable. Imports the core (:mod:`raydp_hpo`) only.

Re-exported lazily (PEP 562): ``from raydp_hpo.trainables.privacy_gate import admit`` or
``raydp_hpo.trainables.data`` never pulls in torch unless the name needs it.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "Dataset": "raydp_hpo.trainables.data",
    "DataSplits": "raydp_hpo.trainables.data",
    "PublicSizes": "raydp_hpo.trainables.data",
    "load_parquet": "raydp_hpo.trainables.data",
    "load_digits": "raydp_hpo.trainables.data",
    "load_mnist1d": "raydp_hpo.trainables.data",
    "split": "raydp_hpo.trainables.data",
    "select_view": "raydp_hpo.trainables.data",
    "MODEL_NAMES": "raydp_hpo.trainables.models",
    "build_model": "raydp_hpo.trainables.models",
    "validate_model": "raydp_hpo.trainables.models",
    "RaydpSettings": "raydp_hpo.trainables.privacy_gate",
    "load_released_model": "raydp_hpo.trainables.release",
    "save_released_model": "raydp_hpo.trainables.release",
    "admit": "raydp_hpo.trainables.privacy_gate",
    "TrainResult": "raydp_hpo.trainables.training",
    "ReleaseLog": "raydp_hpo.trainables.training",
    "declared_privacy": "raydp_hpo.trainables.training",
    "load_checkpoint": "raydp_hpo.trainables.training",
    "train_dp": "raydp_hpo.trainables.training",
    "ClientOptimizer": "raydp_hpo.trainables.federated",
    "FedSettings": "raydp_hpo.trainables.federated",
    "FedResult": "raydp_hpo.trainables.federated",
    "fed_avg": "raydp_hpo.trainables.federated",
    "pathological_split": "raydp_hpo.trainables.federated",
    "run_federated": "raydp_hpo.trainables.federated",
    "run_federated_ray": "raydp_hpo.trainables.federated",
    "trial_session": "raydp_hpo.trainables.session",
    "TrialSession": "raydp_hpo.trainables.session",
    "dp_trainable": "raydp_hpo.trainables.tune_trainable",
    "make_trainable": "raydp_hpo.trainables.tune_trainable",
    "with_data": "raydp_hpo.trainables.tune_trainable",
}

__all__ = list(_EXPORTS)

# The real types, for mypy and IDEs: under TYPE_CHECKING only, so at run time every name stays
# lazy (tests/raydp_hpo/test_public_api.py checks that these imports match _EXPORTS).
if TYPE_CHECKING:
    from raydp_hpo.trainables.data import (
        Dataset,
        DataSplits,
        PublicSizes,
        load_digits,
        load_mnist1d,
        load_parquet,
        select_view,
        split,
    )
    from raydp_hpo.trainables.federated import (
        ClientOptimizer,
        FedResult,
        FedSettings,
        fed_avg,
        pathological_split,
        run_federated,
        run_federated_ray,
    )
    from raydp_hpo.trainables.models import MODEL_NAMES, build_model, validate_model
    from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit
    from raydp_hpo.trainables.release import load_released_model, save_released_model
    from raydp_hpo.trainables.session import TrialSession, trial_session
    from raydp_hpo.trainables.training import (
        ReleaseLog,
        TrainResult,
        declared_privacy,
        load_checkpoint,
        train_dp,
    )
    from raydp_hpo.trainables.tune_trainable import dp_trainable, make_trainable, with_data


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
