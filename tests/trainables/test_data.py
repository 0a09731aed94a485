"""Data loading, validation and views (real Parquet files written by pyarrow)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydp_hpo.errors import DataValidationError, InvalidParameterError
from trainables.data import Dataset, load_mnist1d, load_parquet, select_view, split


def _write(tmp_path, columns: dict) -> str:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def test_parquet_roundtrip_columns_and_list_column(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    y = np.arange(20) % 4
    uri = _write(tmp_path, {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y})
    d = load_parquet(uri, feature_columns=["a", "b", "c"], label_column="y")
    assert d.features.shape == (20, 3) and d.features.dtype == np.float32
    assert d.num_classes == 4 and d.labels.dtype == np.int64
    np.testing.assert_allclose(d.features, x.astype(np.float32))
    uri2 = _write(tmp_path, {"x": pa.array(list(x)), "y": y})
    d2 = load_parquet("file://" + uri2, feature_column="x", label_column="y", num_classes=5)
    np.testing.assert_array_equal(d2.features, d.features)
    assert d2.num_classes == 5


@pytest.mark.parametrize(
    ("columns", "kwargs", "match"),
    [
        ({"a": [1.0, 2.0], "y": [0, 1]}, {"feature_columns": ["a", "zz"]}, "zz"),
        ({"a": [1.0, float("nan")], "y": [0, 1]}, {"feature_columns": ["a"]}, "NaN"),
        ({"a": [1.0, float("inf")], "y": [0, 1]}, {"feature_columns": ["a"]}, "inf"),
        ({"a": ["u", "v"], "y": [0, 1]}, {"feature_columns": ["a"]}, "numeric"),
        ({"a": [1.0, 2.0], "y": [0.5, 1.0]}, {"feature_columns": ["a"]}, "integers"),
        ({"a": [1.0, 2.0], "y": ["p", "q"]}, {"feature_columns": ["a"]}, "integer class ids"),
        ({"a": [1.0, 2.0], "y": [0, 7]}, {"feature_columns": ["a"], "num_classes": 3}, "7"),
        ({"a": [1.0, 2.0], "y": [0, -1]}, {"feature_columns": ["a"]}, "negative"),
        (
            {"a": pa.array([], pa.float64()), "y": pa.array([], pa.int64())},
            {"feature_columns": ["a"]},
            "no rows",
        ),
    ],
    ids=["missing", "nan", "inf", "str-feature", "frac-label", "str-label", "label-range",
         "neg-label", "empty"],
)
def test_bad_parquet_data_is_rejected_with_the_column_named(tmp_path, columns, kwargs, match):
    uri = _write(tmp_path, columns)
    with pytest.raises(DataValidationError, match=match):
        load_parquet(uri, label_column="y", **kwargs)


def test_dataset_rejects_bad_arrays():
    with pytest.raises(DataValidationError, match="float32"):
        Dataset(np.zeros((2, 2)), np.zeros(2, np.int64), 2)
    with pytest.raises(DataValidationError, match="outside"):
        Dataset(np.zeros((2, 2), np.float32), np.array([0, 2]), 2)


def test_mnist1d_generated_locally_and_deterministic():
    state = np.random.get_state()
    a, b = load_mnist1d(200, seed=3), load_mnist1d(200, seed=3)
    assert a.features.shape == (200, 40) and a.num_classes == 10
    np.testing.assert_array_equal(a.features, b.features)
    assert np.array_equal(np.random.get_state()[1], state[1])  # global RNG untouched


def test_views_partition_the_training_split(digits):
    train = digits.train
    n = len(train)
    sub = select_view(train, {"kind": "subsample", "rate": 0.3, "seed": 5})[0]
    comp = select_view(train, {"kind": "complement", "rate": 0.3, "seed": 5})[0]
    assert len(sub) + len(comp) == n
    # Poisson(0.3) subsample size: within 5 binomial standard deviations
    assert abs(len(sub) - 0.3 * n) < 5 * np.sqrt(n * 0.3 * 0.7)
    parts = select_view(train, {"kind": "partitions", "num_partitions": 3, "seed": 1})
    assert sum(len(p) for p in parts) == n
    # i.i.d. assignment: sizes Binomial(n, 1/3), within 5 standard deviations of n/3
    assert all(abs(len(p) - n / 3) < 5 * np.sqrt(n * (1 / 3) * (2 / 3)) for p in parts)
    # disjoint: every record lands in exactly one partition
    keys = [tuple(map(bytes, p.features)) for p in parts]
    assert sum(len(set(k)) for k in keys) == len(set().union(*map(set, keys)))
    one = select_view(train, {"kind": "partition", "index": 2, "num_partitions": 3, "seed": 1})
    np.testing.assert_array_equal(one[0].features, parts[2].features)
    with pytest.raises(InvalidParameterError, match="unknown data_view keys"):
        select_view(train, {"kind": "subsample", "rate": 0.3, "sed": 1})


def test_partition_assignment_is_per_record(digits):
    # Adding one record at the end must not move any other record between partitions.
    train = digits.train
    from trainables.data import _partition_ids

    ids_n = _partition_ids(len(train), 5, seed=3)
    ids_n1 = _partition_ids(len(train) + 1, 5, seed=3)
    np.testing.assert_array_equal(ids_n, ids_n1[:-1])
    with pytest.raises(DataValidationError, match="empty"):
        select_view(train.subset(np.arange(3)), {"kind": "partitions", "num_partitions": 3,
                                                 "seed": 0})


def test_split_sizes_and_disjointness(digits):
    s = split(load_mnist1d(100, seed=0), 0.2, 0.1, seed=0)
    assert (len(s.train), len(s.val), len(s.test)) == (70, 20, 10)
