"""Training data for DP trials: a frozen container, loaders, validation, splits and views.

Records are the privacy unit. Every loader validates eagerly and raises
:class:`~raydp_hpo.errors.DataValidationError` naming the offending column / value.

Views (``data_view`` dicts) select which records a trial trains on; the search algorithms
use them to implement their data-splitting schemes:

* ``{"kind": "full"}`` — the whole training split.
* ``{"kind": "subsample", "rate": q, "seed": s}`` — Poisson subsample X₁ of the training split:
  each record kept independently with probability q (Koskela & Kulkarni 2023, Sec. 3: tuning on
  a random subset amplifies privacy by subsampling).
* ``{"kind": "complement", "rate": q, "seed": s}`` — X \\ X₁ for the *same* draw (the final
  run of Koskela & Kulkarni trains on the rest).
* ``{"kind": "partition", "index": i, "num_partitions": k, "seed": s}`` — the i-th of k
  disjoint random partitions (each record independently and uniformly; sizes are random).
* ``{"kind": "partitions", "num_partitions": k, "seed": s}`` — all k partitions; the trainable
  trains one model per partition and reports the mean validation accuracy (Ding et al.:
  each record affects one model only, so by parallel composition the round costs one
  model's mechanism).

The realised sizes of splits, subsamples and partitions are private, like the records: the
privacy accounting and every normaliser use declared public sizes instead (DESIGN.md,
"Secrets and neighbouring datasets"). The secret ``seed`` of a view has no default.

Longer than ~600 lines because the loaders, splits and views share one validated container and
its checks; the views are the data side of the searchers' splitting schemes, kept beside the
records they select.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydp_hpo.errors import DataValidationError, InvalidParameterError

__all__ = [
    "canonical_uri",
    "dataset_fingerprint",
    "dataset_ledger_name",
    "Dataset",
    "DataSplits",
    "PublicSizes",
    "public_split_sizes",
    "load_parquet",
    "parquet_feature_columns",
    "load_digits",
    "load_mnist1d",
    "split",
    "record_uniforms",
    "select_view",
    "view_kind",
]

_VIEW_KINDS = ("full", "subsample", "complement", "partition", "partitions")


@dataclass(frozen=True, eq=False)
class Dataset:
    """Immutable labelled data: ``features`` float32 (n, *feature_shape), ``labels`` int64 (n,).

    The arrays are made read-only, so a trial cannot modify shared data in place (Ray's object
    store hands out read-only buffers anyway).
    """

    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    #: False when ``num_classes`` was read off the labels (``max(label) + 1``): the model's
    #: output width then depends on the data, and certificates list it as treated as public.
    num_classes_declared: bool = True
    #: The identity of the data source whose privacy budget this data spends (public: the
    #: built-in dataset and its generator settings, or the canonical URI of a Parquet source;
    #: see :func:`dataset_fingerprint`). ``None``: unnamed (then ``DPTuner`` asks for one).
    name: str | None = None
    #: The declared **public** number of records N (``None``: the size is private, as a
    #: Parquet table's is). Set by loaders whose size is a function of their arguments alone
    #: (:func:`load_digits`, :func:`load_mnist1d`); :func:`split` derives public split sizes
    #: from it. It is a declaration, not checked against ``len``: a neighbouring dataset has
    #: N ± 1 records and the same declared N (a check would refuse on private data).
    public_size: int | None = None

    def __post_init__(self) -> None:
        x = np.ascontiguousarray(self.features)
        y = np.ascontiguousarray(self.labels)
        if x.dtype != np.float32:
            raise DataValidationError(f"features must be float32, got dtype {x.dtype}")
        if y.dtype != np.int64:
            raise DataValidationError(f"labels must be int64, got dtype {y.dtype}")
        if y.ndim != 1:
            raise DataValidationError(f"labels must be 1-D, got shape {y.shape}")
        if x.ndim < 2 or x.shape[0] != y.shape[0]:
            raise DataValidationError(
                f"features must have shape (n, ...) matching {y.shape[0]} labels, got {x.shape}"
            )
        if isinstance(self.num_classes, bool) or not isinstance(
            self.num_classes, (int, np.integer)
        ) or self.num_classes < 2:
            raise DataValidationError(f"num_classes must be an int >= 2, got {self.num_classes!r}")
        if not np.all(np.isfinite(x)):
            bad = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
            raise DataValidationError(f"features contain NaN or inf (first at row {bad})")
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            bad_value = int(y.min()) if y.min() < 0 else int(y.max())
            raise DataValidationError(
                f"label {bad_value} outside [0, {self.num_classes}); set num_classes or fix the "
                "labels"
            )
        if self.public_size is not None and (
            isinstance(self.public_size, bool)
            or not isinstance(self.public_size, (int, np.integer)) or self.public_size < 1
        ):
            raise InvalidParameterError(
                f"public_size must be an int >= 1 or None, got {self.public_size!r}"
            )
        x.setflags(write=False)
        y.setflags(write=False)
        object.__setattr__(self, "features", x)
        object.__setattr__(self, "labels", y)
        object.__setattr__(self, "num_classes", int(self.num_classes))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.features.shape[1:])

    def subset(self, index: np.ndarray) -> Dataset:
        """The records at ``index`` (a copy), with the same ``num_classes``; its size is
        private (``public_size=None``): which records a subset holds depends on the data."""
        return Dataset(self.features[index], self.labels[index], self.num_classes,
                       self.num_classes_declared, self.name)


@dataclass(frozen=True)
class PublicSizes:
    """Declared **public** record counts of the splits (``None``: not declared)."""

    train: int
    validation: int | None = None
    test: int | None = None

    def __post_init__(self) -> None:
        for name in ("train", "validation", "test"):
            value = getattr(self, name)
            if value is None and name != "train":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InvalidParameterError(f"PublicSizes.{name} must be an int >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))


def public_split_sizes(total: int, val_fraction: float, test_fraction: float) -> PublicSizes:
    """The public split sizes of a dataset of public size ``total`` = N split with the given
    fractions: ``round(N·(1 − f_val − f_test))``, ``round(N·f_val)`` (``None`` when
    ``f_val = 0``: no validation split) and ``round(N·f_test)``, each at least 1.

    The one formula for them: :func:`split` and the experiment files' built-in sources
    (:meth:`raydp_hpo.cli.config.data.Mnist1dData.public_sizes`) both use it. A function of
    public numbers alone, so every normaliser computed from it is independent of the data (the
    realised split sizes are multinomial and private)."""
    return PublicSizes(
        train=max(1, round(total * (1.0 - val_fraction - test_fraction))),
        validation=max(1, round(total * val_fraction)) if val_fraction > 0 else None,
        test=max(1, round(total * test_fraction)),
    )


@dataclass(frozen=True, eq=False)
class DataSplits:
    """Train / validation / test splits of one private dataset (all three are private).

    ``name``: the dataset's identity, whose budget a search on these splits spends (default:
    the training split's :attr:`Dataset.name`, which the loaders set).
    ``declared_sizes``: the splits' declared public sizes, when they are public — set by
    :func:`split` from a dataset with a public size (built-in loaders); ``None`` (a Parquet
    table, hand-built splits): the realised sizes are private, and
    :class:`~raydp_hpo.tune.tuner.DPTuner` needs them declared or ``sizes_public=True``.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    name: str | None = None
    declared_sizes: PublicSizes | None = None

    def __post_init__(self) -> None:
        for name in ("train", "val", "test"):
            if not isinstance(getattr(self, name), Dataset):
                raise InvalidParameterError(f"{name} must be a Dataset")
        if self.declared_sizes is not None and not isinstance(self.declared_sizes, PublicSizes):
            raise InvalidParameterError(
                f"declared_sizes must be a PublicSizes or None, got {self.declared_sizes!r}"
            )
        if len(self.train) == 0:
            raise DataValidationError("the training split is empty")
        shapes = {self.train.feature_shape, self.val.feature_shape, self.test.feature_shape}
        if len(shapes) != 1:
            raise DataValidationError(f"splits have different feature shapes: {sorted(shapes)}")
        if self.name is None:
            object.__setattr__(self, "name", self.train.name)
        elif not isinstance(self.name, str) or not self.name.strip():
            raise InvalidParameterError(
                f"name must be a non-empty string naming the dataset, got {self.name!r}"
            )


# -- dataset identity (whose budget) -------------------------------------------------------


def dataset_fingerprint(source: str, *, uri: str | None = None, size: int | None = None,
                        generator_seed: int | None = None) -> str:
    """The identity of a data source, which its privacy budget belongs to: the built-in
    dataset and its generator settings (``mnist1d:size=5000:generator_seed=42``,
    ``digits``), or the canonical URI of Parquet data (``parquet:file:///abs/path``).

    Deliberately not a hash of the content: a dataset with one record more is a neighbouring
    dataset of the same people and must spend from the same budget. The Python loaders and
    the experiment files name the same data the same way, so both charge one ledger.
    """
    if source == "mnist1d":
        return f"mnist1d:size={size}:generator_seed={generator_seed}"
    if source == "parquet":
        if not uri:
            raise InvalidParameterError("a Parquet dataset's fingerprint needs its uri")
        return f"parquet:{canonical_uri(uri)}"
    return source


def canonical_uri(uri: str) -> str:
    """The identity of a Parquet location: a local path as an absolute ``file://`` URI
    (``~`` expanded, symlinks and ``..`` resolved), any URI without its trailing ``/``."""
    if "://" not in uri:
        uri = "file://" + str(Path(uri).expanduser().resolve())
    return uri.rstrip("/")


def dataset_ledger_name(fingerprint: str) -> str:
    """Name of a dataset's ledger: ``data-<source>-<12 hex of the fingerprint>`` (``source``:
    the fingerprint up to its first ``:``, reduced to ``[A-Za-z0-9_.-]``)."""
    import re

    digest = hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:12]
    source = re.sub(r"[^A-Za-z0-9_.-]+", "-", fingerprint.split(":", 1)[0]).strip("-") or "data"
    return f"data-{source[:40]}-{digest}"


# -- loaders -----------------------------------------------------------------------------


def _numeric_column(table: Any, name: str) -> np.ndarray:
    import pyarrow as pa

    column = table.column(name)
    typ = column.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        if column.null_count:
            raise DataValidationError(f"column {name!r} has {column.null_count} null rows")
        combined = column.combine_chunks()
        lengths = np.asarray(combined.value_lengths())
        if len(lengths) and lengths.min() != lengths.max():
            raise DataValidationError(
                f"list column {name!r} has rows of different lengths "
                f"({lengths.min()}..{lengths.max()}); every row needs the same feature count"
            )
        values = combined.flatten()
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
            raise DataValidationError(
                f"list column {name!r} must hold numbers, got element type {values.type}"
            )
        if values.null_count:
            raise DataValidationError(f"list column {name!r} has null elements")
        width = int(lengths[0]) if len(lengths) else 0
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64).reshape(
            len(combined), width
        )
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise DataValidationError(f"feature column {name!r} must be numeric, got type {typ}")
    if column.null_count:
        raise DataValidationError(f"feature column {name!r} has {column.null_count} null values")
    return np.asarray(column.to_numpy(), dtype=np.float64)


def _is_list(table: Any, name: str) -> bool:
    import pyarrow as pa

    typ = table.schema.field(name).type
    return bool(pa.types.is_list(typ) or pa.types.is_large_list(typ)
                or pa.types.is_fixed_size_list(typ))


def _check_finite(values: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.argwhere(bad.reshape(len(values), -1).any(axis=1))[0][0])
        kind = "NaN" if np.isnan(values.reshape(len(values), -1)[row]).any() else "inf"
        raise DataValidationError(f"column {name!r} contains {kind} (first at row {row})")


def _labels(table: Any, name: str) -> np.ndarray:
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        raise DataValidationError(f"label column {name!r} has {column.null_count} null values")
    if pa.types.is_integer(column.type):
        return np.asarray(column.to_numpy(), dtype=np.int64)
    if pa.types.is_floating(column.type):
        values = np.asarray(column.to_numpy(), dtype=np.float64)
        _check_finite(values, name)
        if np.any(values != np.round(values)):
            bad = values[values != np.round(values)][0]
            raise DataValidationError(
                f"label column {name!r} must hold integers, found {bad!r}"
            )
        return values.astype(np.int64)
    raise DataValidationError(
        f"label column {name!r} must be integer class ids, got type {column.type}"
    )


def _read_parquet(uri: str, key: str, *, schema_only: bool = False) -> Any:
    """The table (or only its schema) of a Parquet file or directory at ``uri``; errors name
    ``uri`` and the setting ``key`` that gave it."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, TypeError):  # a plain relative path
        filesystem, path = pafs.LocalFileSystem(), str(uri)
    try:
        info = filesystem.get_file_info(path)
    except (OSError, ValueError) as exc:
        raise DataValidationError(f"cannot reach Parquet data at {uri!r}: {exc}") from None
    if info.type == pafs.FileType.NotFound:
        raise DataValidationError(
            f"Parquet data not found at {uri!r} (resolved to {path!r}); check {key}"
        )
    try:
        data = pads.dataset(path, filesystem=filesystem, format="parquet")
        return data.schema if schema_only else data.to_table()
    except (OSError, ValueError) as exc:
        raise DataValidationError(f"cannot read Parquet data at {uri!r}: {exc}") from None


def parquet_feature_columns(uri: str, label_column: str, key: str = "data.uri") -> list[str]:
    """The default feature columns of a Parquet dataset: every column but the label, in the
    file's order (read from the schema only; column names are not records)."""
    return _all_but(_read_parquet(uri, key, schema_only=True).names, label_column)


def _all_but(columns: Sequence[str], label_column: str) -> list[str]:
    """The default features: every column but the label, in the file's order."""
    return [c for c in columns if c != label_column]


def load_parquet(
    uri: str,
    *,
    label_column: str,
    feature_columns: Sequence[str] | None = None,
    feature_column: str | None = None,
    num_classes: int | None = None,
    key: str = "data.uri",
    public_size: int | None = None,
) -> Dataset:
    """Load a Parquet file or directory from any URI pyarrow can read (local path, ``file://``,
    ``s3://``, ``gs://``, ``hdfs://`` ...).

    Give at most one of ``feature_columns`` (one numeric column per feature) or
    ``feature_column`` (one list-valued column holding every row's feature vector); with
    neither, every column but the label is a feature (a single list-valued one is taken as
    ``feature_column``). ``num_classes`` defaults to ``max(label) + 1``, read off the private
    labels: the result says so (``num_classes_declared=False``), and :class:`~raydp_hpo.tune.
    tuner.DPTuner` refuses it unless ``sizes_public=True`` (the certificate then lists it as
    treated as public); declare it to keep the model's shape independent of the data. ``key`` names the
    setting that gave ``uri`` in error messages. The table's number of rows is private:
    ``public_size`` declares a public one N (``Dataset.public_size``; :func:`split` then
    derives public split sizes from it), else the sizes must be declared to
    :class:`~raydp_hpo.tune.tuner.DPTuner`.
    """
    if feature_columns is not None and feature_column is not None:
        raise InvalidParameterError("give at most one of feature_columns or feature_column")
    table = _read_parquet(uri, key)
    default = feature_columns is None and feature_column is None
    if default:
        feature_columns = _all_but(table.column_names, label_column)
        if not feature_columns:
            raise DataValidationError(
                f"{uri!r} has no column but the label {label_column!r}: no features"
            )
        if len(feature_columns) == 1 and _is_list(table, feature_columns[0]):
            feature_column, feature_columns = feature_columns[0], None
    wanted = [*(feature_columns or [feature_column]), label_column]  # type: ignore[list-item]
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise DataValidationError(
            f"column(s) {missing} missing from {uri!r}; available: {table.column_names}"
        )
    if table.num_rows == 0:
        raise DataValidationError(f"{uri!r} has no rows")
    if feature_column is not None:
        x = _numeric_column(table, feature_column)
        _check_finite(x, feature_column)
    else:
        cols = []
        for name in feature_columns or ():
            try:
                col = _numeric_column(table, name)
            except DataValidationError as exc:
                if not default:
                    raise
                raise DataValidationError(
                    f"{exc}; by default every column but the label is a feature: list the "
                    "features (feature_columns, data.feature_columns in an experiment file)"
                ) from None
            if col.ndim != 1:
                raise DataValidationError(
                    f"column {name!r} is list-valued; pass it as feature_column={name!r}"
                )
            _check_finite(col, name)
            cols.append(col)
        if not cols:
            raise InvalidParameterError("feature_columns must name at least one column")
        x = np.stack(cols, axis=1)
    y = _labels(table, label_column)
    if y.min() < 0:
        raise DataValidationError(f"label column {label_column!r} has negative label {y.min()}")
    present = np.unique(y)
    if len(present) < 2:
        raise DataValidationError(
            f"label column {label_column!r} holds a single class ({int(present[0])}) in "
            f"{uri!r}: a classifier trained on it reports accuracy 1.0 and learns nothing; "
            "check the label column or the file"
        )
    k = int(y.max()) + 1 if num_classes is None else int(num_classes)
    if y.max() >= k:
        raise DataValidationError(
            f"label column {label_column!r} has label {int(y.max())} outside [0, {k}); "
            "raise num_classes or fix the labels"
        )
    return Dataset(x.astype(np.float32), y, max(k, 2), num_classes_declared=num_classes is not None,
                   name=dataset_fingerprint("parquet", uri=uri), public_size=public_size)


def load_digits() -> Dataset:
    """scikit-learn's bundled digits (1,797 8×8 greyscale images, 10 classes), no network.

    Pixels are scaled from [0, 16] to [0, 1]; features have shape (1, 8, 8) for 2-D CNNs.
    """
    from sklearn.datasets import load_digits as _sk_digits

    bunch = _sk_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None, :, :]
    # the bundled file's size is public (1,797: the same for everyone who installs sklearn)
    return Dataset(x, np.asarray(bunch.target, dtype=np.int64), 10, name="digits",
                   public_size=len(x))


def load_mnist1d(num_samples: int = 5000, seed: int = 42) -> Dataset:
    """MNIST-1D (Greydanus 2020) generated locally with ``mnist1d.data.make_dataset``.

    Never downloads: the generator is called directly with the package's default arguments
    except ``num_samples`` and ``seed``. Both of the generator's splits are returned as one
    dataset (use :func:`split`). Features have shape (40,). The global ``random``/numpy RNG
    state, which the generator reseeds, is restored afterwards.
    """
    import random

    from mnist1d.data import get_dataset_args, make_dataset

    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 10:
        raise InvalidParameterError(f"num_samples must be an int >= 10, got {num_samples!r}")
    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = int(seed)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        raw = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([raw["x"], raw["x_test"]]).astype(np.float32)
    y = np.concatenate([raw["y"], raw["y_test"]]).astype(np.int64)
    # public size: the generator's num_samples, a function of the arguments alone
    return Dataset(x, y, 10, name=dataset_fingerprint("mnist1d", size=num_samples,
                                                      generator_seed=int(seed)),
                   public_size=num_samples)


# -- splits and views --------------------------------------------------------------------


def record_uniforms(dataset: Dataset, seed: int, purpose: bytes = b"split") -> np.ndarray:
    """u_i ∈ [0, 1) for every record: a keyed hash (BLAKE2b, key = ``seed``, personalised by
    ``purpose`` so that splits and partitions are independent) of the record's own bytes
    (features and label), so u_i depends on record i alone — not on its position or on the
    other records."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidParameterError(f"split seed must be an integer >= 0, got {seed!r}")
    key = int(seed).to_bytes(16, "little") if seed < 2**128 else None
    if key is None:
        raise InvalidParameterError(f"split seed must be < 2**128, got {seed!r}")
    x = dataset.features.reshape(len(dataset), -1)
    y = dataset.labels
    out = np.empty(len(dataset), dtype=np.float64)
    for i in range(len(dataset)):
        digest = hashlib.blake2b(
            x[i].tobytes() + y[i].tobytes(), digest_size=8, key=key, person=purpose
        ).digest()
        out[i] = int.from_bytes(digest, "little") / 2.0**64
    return out


def split(
    dataset: Dataset, val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0
) -> DataSplits:
    """Stable train / validation / test split: record i goes to validation if u_i < f_val, to
    test if f_val ≤ u_i < f_val + f_test, else to training, with u_i = :func:`record_uniforms`.

    Each record's split is a function of that record (and the public split ``seed``) alone,
    so adding or removing one record changes exactly one split, by that record — what every
    bound of this project assumes for add/remove-one neighbours (DESIGN.md, "Secrets and
    neighbouring datasets"). A permutation-based split would move many records between splits
    when one record is added. The split sizes are therefore random (multinomial) and, like the
    records, private: code that needs a size uses a declared public one. The ``seed`` is
    public (it makes the split reproducible; no guarantee relies on it being secret). Records
    keep their original order within each split.

    A ``dataset`` with a public size N (``Dataset.public_size``: the built-in loaders) gives
    splits with ``declared_sizes`` = :func:`public_split_sizes` (N, f_val, f_test), the
    expected sizes, which :class:`~raydp_hpo.tune.tuner.DPTuner` then uses as every
    normaliser; otherwise ``declared_sizes`` is ``None``.
    """
    for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise InvalidParameterError(f"{name} must be in [0, 1), got {name}={f!r}")
    if val_fraction + test_fraction >= 1.0:
        raise InvalidParameterError(
            f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}"
        )
    n = len(dataset)
    if n == 0:
        raise DataValidationError("cannot split an empty dataset")
    u = record_uniforms(dataset, seed)
    is_val = u < val_fraction
    is_test = ~is_val & (u < val_fraction + test_fraction)
    is_train = ~(is_val | is_test)
    return DataSplits(
        train=dataset.subset(np.flatnonzero(is_train)),
        val=dataset.subset(np.flatnonzero(is_val)),
        test=dataset.subset(np.flatnonzero(is_test)),
        name=dataset.name,
        declared_sizes=None if dataset.public_size is None
        else public_split_sizes(dataset.public_size, val_fraction, test_fraction),
    )


def view_kind(view: Mapping[str, Any] | None) -> str:
    """The validated ``kind`` of a ``data_view`` dict (``None`` means ``"full"``)."""
    if view is None:
        return "full"
    kind = view.get("kind")
    if kind not in _VIEW_KINDS:
        raise InvalidParameterError(f"data_view kind must be one of {_VIEW_KINDS}, got {kind!r}")
    allowed = {
        "full": {"kind"},
        "subsample": {"kind", "rate", "seed"},
        "complement": {"kind", "rate", "seed"},
        "partition": {"kind", "index", "num_partitions", "seed"},
        "partitions": {"kind", "num_partitions", "seed"},
    }[kind]
    unknown = set(view) - allowed
    if unknown:
        raise InvalidParameterError(f"unknown data_view keys {sorted(unknown)} for kind {kind!r}")
    return str(kind)


def _partition_ids(train: Dataset, k: int, seed: int) -> np.ndarray:
    """Partition of each record: ⌊k·u_i⌋ with u_i = :func:`record_uniforms` keyed by the
    view's secret ``seed`` — a function of the record's own content alone.

    So in the code as written, adding or removing one record anywhere in the dataset changes
    exactly one partition, by that record (the 1/k sensitivity of the partition-averaged
    utility, Ding et al. Lemma 2); no other record moves, whatever its position. (Parallel
    composition needs only this; the seed is secret anyway.) Partition sizes are random and
    private. An empty partition is allowed (its model trains on no records): an error would
    make the search's course depend on the private partition sizes.
    """
    u = record_uniforms(train, seed, purpose=b"partition")
    return np.minimum((u * k).astype(np.int64), k - 1)


def select_view(train: Dataset, view: Mapping[str, Any] | None) -> list[Dataset]:
    """The training set(s) a ``data_view`` selects: one dataset, or k for ``"partitions"``."""
    kind = view_kind(view)
    if kind == "full":
        return [train]
    assert view is not None
    n = len(train)
    if "seed" not in view:
        raise InvalidParameterError(
            f"data_view {dict(view)} needs its secret 'seed' (searchers draw it from OS "
            "entropy); there is no default seed"
        )
    seed = int(view["seed"])
    if kind in ("subsample", "complement"):
        rate = float(view["rate"])
        if not 0.0 < rate < 1.0:
            raise InvalidParameterError(f"data_view rate must be in (0, 1), got rate={rate!r}")
        # Poisson subsample X1: each record independently with probability `rate`, from the
        # secret seed (Koskela & Kulkarni's amplification needs independent inclusion, as
        # DP-SGD's batches do; a content hash would tie duplicate records together). The
        # draws are indexed by position; since they are i.i.d. and secret, the neighbouring
        # dataset's draws are equal in law to the coupling that keeps every other record's
        # inclusion, which is what the amplification theorem uses.
        keep = np.random.default_rng([seed, 1]).random(n) < rate
        return [train.subset(np.flatnonzero(keep if kind == "subsample" else ~keep))]
    k = int(view["num_partitions"])
    if k < 1:
        raise InvalidParameterError(f"num_partitions must be >= 1, got {k}")
    ids = _partition_ids(train, k, seed)
    if kind == "partition":
        i = int(view["index"])
        if not 0 <= i < k:
            raise InvalidParameterError(f"partition index must be in [0, {k}), got index={i}")
        return [train.subset(np.flatnonzero(ids == i))]
    return [train.subset(np.flatnonzero(ids == i)) for i in range(k)]
