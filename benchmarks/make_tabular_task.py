"""The defaults study's tabular task (issue #42): a synthetic classification table written as
Parquet train / validation / test files, generated from fixed PUBLIC parameters.

    .venv/bin/python benchmarks/make_tabular_task.py [--out DIR]

``sklearn.datasets.make_classification`` (Guyon 2003's Madelon design: Gaussian clusters on
the vertices of a hypercube in ``n_informative`` dimensions, ``n_redundant`` random linear
combinations of them, the rest noise, ``flip_y`` of the labels re-drawn at random) with the
parameters in :data:`PARAMETERS`, fixed on 2026-12-02 in the study's pre-registration
(``benchmarks/results/defaults_study/preregistration.md``) before any run, and not tuned on
anything: not on the held-out task of issue #42 (which the project never saw), not on a
searcher. The rows come shuffled from the generator; rows ``[0, 4200)`` are the training
split, ``[4200, 5100)`` validation and ``[5100, 6000)`` test (70 / 15 / 15 %, the splits of the
other two datasets). The split sizes are public (they are the generator's parameters), so an
experiment file declares them (``declared_train_size: 4200`` ...).

Files (``DIR`` defaults to ``benchmarks/results/defaults_study/tabular_task/``, whose
``*.parquet`` are not committed: the generator is deterministic): ``train.parquet``,
``val.parquet``, ``test.parquet`` (float32 columns ``f00`` … ``f19`` and the int64 label ``y``)
and ``manifest.json`` (the parameters, the split sizes and the SHA-256 of each split's
feature and label arrays, committed so a later session can check it regenerated the same
table).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "defaults_study" / "tabular_task"

#: make_classification's parameters, fixed before any run (pre-registration, 2026-12-02)
PARAMETERS: dict[str, Any] = {
    "n_samples": 6000, "n_features": 20, "n_informative": 10, "n_redundant": 5,
    "n_repeated": 0, "n_classes": 5, "n_clusters_per_class": 2, "weights": None,
    "flip_y": 0.03, "class_sep": 1.0, "hypercube": True, "shift": 0.0, "scale": 1.0,
    "shuffle": True, "random_state": 20261202,
}
#: (name, first row, end row) of each split: 70 / 15 / 15 %
SPLITS = (("train", 0, 4200), ("val", 4200, 5100), ("test", 5100, 6000))
LABEL = "y"
NUM_CLASSES = int(PARAMETERS["n_classes"])


def generate() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (features float32 (n, 20), labels int64 (n,))}; the same arrays on every call."""
    from sklearn.datasets import make_classification

    x, y = make_classification(**PARAMETERS)
    x = x.astype(np.float32)
    y = y.astype(np.int64)
    return {name: (x[lo:hi], y[lo:hi]) for name, lo, hi in SPLITS}


def digest(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of a split's arrays (C order, fixed dtypes): independent of Parquet's bytes."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    return h.hexdigest()


def feature_names() -> list[str]:
    return [f"f{i:02d}" for i in range(int(PARAMETERS["n_features"]))]


def write(out: Path = DEFAULT_OUT) -> dict[str, Any]:
    """Write the three Parquet files and ``manifest.json`` to ``out``; return the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"generator": "sklearn.datasets.make_classification",
                                "parameters": PARAMETERS, "label_column": LABEL,
                                "num_classes": NUM_CLASSES, "splits": {}}
    for name, (x, y) in generate().items():
        columns = {c: pa.array(x[:, i]) for i, c in enumerate(feature_names())}
        columns[LABEL] = pa.array(y)
        pq.write_table(pa.table(columns), out / f"{name}.parquet")
        manifest["splits"][name] = {"rows": int(len(y)), "sha256": digest(x, y),
                                    "class_counts": np.bincount(y, minlength=NUM_CLASSES)
                                    .tolist()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def ensure(out: Path = DEFAULT_OUT) -> Path:
    """``out`` with the three files present (written when one is missing)."""
    if not all((out / f"{name}.parquet").exists() for name, _, _ in SPLITS):
        write(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    manifest = write(args.out)
    for name, info in manifest["splits"].items():
        print(f"{args.out / (name + '.parquet')}: {info['rows']} rows, classes "
              f"{info['class_counts']}, sha256 {info['sha256'][:16]}…")
    return 0


if __name__ == "__main__":
    sys.exit(main())
