"""DP training for Ray Tune trials: data, models, Opacus-backed DP-SGD / ADADP, the privacy
gate and the Tune trainable. Imports the core (:mod:`raydp_hpo`) only."""

from __future__ import annotations

from trainables.data import (
    Dataset,
    DataSplits,
    load_digits,
    load_mnist1d,
    load_parquet,
    select_view,
    split,
)
from trainables.models import MODEL_NAMES, build_model, validate_model
from trainables.privacy_gate import RaydpSettings, admit
from trainables.training import ReleaseLog, TrainResult, declared_privacy, load_checkpoint, train_dp
from trainables.tune_trainable import dp_trainable, make_trainable, with_data

__all__ = [
    "Dataset",
    "DataSplits",
    "load_parquet",
    "load_digits",
    "load_mnist1d",
    "split",
    "select_view",
    "MODEL_NAMES",
    "build_model",
    "validate_model",
    "RaydpSettings",
    "admit",
    "TrainResult",
    "ReleaseLog",
    "declared_privacy",
    "load_checkpoint",
    "train_dp",
    "dp_trainable",
    "make_trainable",
    "with_data",
]
