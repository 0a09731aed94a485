"""Data loading, validation and views (real Parquet files written by pyarrow)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raydp_hpo.errors import DataValidationError, InvalidParameterError
from raydp_hpo.trainables.data import Dataset, load_mnist1d, load_parquet, select_view, split


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
    # read off the labels vs declared: the certificate lists the former as treated as public
    assert not d.num_classes_declared and d2.num_classes_declared
    assert not split(d, 0.2, 0.2, seed=0).train.num_classes_declared


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


@pytest.mark.parametrize("position", [0, 200, -1])
def test_one_record_changes_exactly_one_partition(digits, position):
    """Ding et al. Lemma 2 in the code as written: add one record anywhere (front, middle,
    end): exactly one partition's training set changes, by that record. (An earlier version
    assigned partitions by position and then trimmed every partition to the smallest size.)"""
    train = digits.train
    extra = train.subset(np.array([5]))
    feats = np.insert(train.features, position if position >= 0 else len(train),
                      extra.features[0] + 0.5, axis=0)
    labels = np.insert(train.labels, position if position >= 0 else len(train), extra.labels[0])
    bigger = Dataset(feats.astype(np.float32), labels, train.num_classes)
    view = {"kind": "partitions", "num_partitions": 20, "seed": 12345}
    a, b = select_view(train, view), select_view(bigger, view)
    changed = [i for i in range(20) if _rows(a[i]) != _rows(b[i])]
    assert len(changed) == 1
    assert len(b[changed[0]]) == len(a[changed[0]]) + 1


def test_empty_partition_is_allowed_not_a_data_dependent_error(digits):
    # An error would make the search's course depend on the private partition sizes.
    parts = select_view(digits.train.subset(np.arange(3)),
                        {"kind": "partitions", "num_partitions": 8, "seed": 0})
    assert len(parts) == 8 and sum(len(p) for p in parts) == 3
    assert any(len(p) == 0 for p in parts)


def test_views_have_no_default_seed(digits):
    for view in ({"kind": "subsample", "rate": 0.3}, {"kind": "partitions", "num_partitions": 3}):
        with pytest.raises(InvalidParameterError, match="secret 'seed'"):
            select_view(digits.train, view)


def test_split_is_disjoint_and_near_the_fractions():
    data = load_mnist1d(2000, seed=0)
    s = split(data, 0.2, 0.1, seed=0)
    assert len(s.train) + len(s.val) + len(s.test) == 2000
    for part, f in ((s.val, 0.2), (s.test, 0.1)):  # multinomial sizes: within 5 std devs
        assert abs(len(part) - f * 2000) < 5 * np.sqrt(2000 * f * (1 - f))
    rows = [set(map(bytes, d.features)) for d in (s.train, s.val, s.test)]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])


def _rows(d: Dataset) -> list[bytes]:
    return sorted(bytes(x) + bytes(y) for x, y in zip(d.features, d.labels))


@pytest.mark.parametrize("position", [0, 357, 999])
def test_split_one_record_changes_one_split(position):
    """Add/remove one record (anywhere in the file): exactly one split changes, by that record.
    A permutation-based split (the earlier version) moved hundreds of records between splits."""
    data = load_mnist1d(1000, seed=1)
    keep = np.delete(np.arange(1000), position)
    smaller = data.subset(keep)
    a, b = split(data, 0.15, 0.15, seed=4), split(smaller, 0.15, 0.15, seed=4)
    changed = [name for name in ("train", "val", "test")
               if _rows(getattr(a, name)) != _rows(getattr(b, name))]
    assert len(changed) == 1
    big, small = _rows(getattr(a, changed[0])), _rows(getattr(b, changed[0]))
    assert len(big) == len(small) + 1 and set(small) <= set(big)
    assert set(big) - set(small) == {bytes(data.features[position]) + bytes(data.labels[position])}


def test_split_seed_is_public_but_changes_the_assignment():
    data = load_mnist1d(500, seed=2)
    a, b = split(data, 0.2, 0.2, seed=0), split(data, 0.2, 0.2, seed=1)
    assert _rows(a.val) != _rows(b.val)
    assert _rows(split(data, 0.2, 0.2, seed=0).val) == _rows(a.val)  # reproducible


def test_parquet_one_class_and_missing_path_are_clear_errors(tmp_path):
    path = _write(tmp_path, {"a": [0.1, 0.2, 0.3], "label": [4, 4, 4]})
    with pytest.raises(DataValidationError, match="'label' holds a single class"):
        load_parquet(path, label_column="label", feature_columns=["a"])
    with pytest.raises(DataValidationError, match="not found"):
        load_parquet(str(tmp_path / "nope.parquet"), label_column="label", feature_columns=["a"])
