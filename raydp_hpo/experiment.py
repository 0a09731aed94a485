"""Experiment files: ``raydp-hpo run EXPERIMENT.yaml``.

An experiment file is a YAML mapping, parsed into frozen dataclasses and validated in full
*before* anything runs (no Ray, no ledger, no data loaded): an unknown or misspelled key is an
error that names the key and suggests the closest valid one. Schema (``?`` = optional)::

    experiment: mnist1d-small        # name: run dir <storage_path>/<experiment>, charge-id prefix
    split_seed?: 0                   # PUBLIC: makes the train/val/test split reproducible
    secret_seed?: null               # SECRET; omit (or null) for OS entropy. Only to reproduce
                                     # a run: the file then must be kept like the data
    data:
      source: mnist1d                # mnist1d | digits | parquet
      size?: 2000                    # mnist1d: number of samples (default 5000)
      generator_seed?: 42            # mnist1d: generator seed
      uri?: s3://bucket/data.parquet # parquet: any URI pyarrow can read
      feature_columns?: [f0, f1]     # parquet: one numeric column per feature, or ...
      feature_column?: x             # parquet: ... one list-valued column
      label_column?: y               # parquet (required there)
      num_classes?: 10               # parquet (default max(label) + 1)
      val_fraction?: 0.1
      test_fraction?: 0.1
      declared_train_size?: 1600     # PUBLIC sizes used by the accounting and normalisers;
      declared_validation_size?: 200 # default: from the source's public size for built-ins,
                                     # else the realised sizes, listed as treated as public
      name: mlp                      # mlp | cnn1d | cnn2d | linear | package.module:Class
      kwargs?: {hidden: [32]}
    search:
      algorithm: random_stopping     # a search_algs.SearchAlgorithm value
      settings?: {distribution: geometric, mean: 3}   # -> DPTuner(search_kwargs=...)
      # settings also take the selection score's noise: score_epsilon: 0.1 (default),
      # score_noise: gaussian + score_delta: 1.0e-6 (default score_noise: laplace)
      metric?: val_accuracy
      mode?: max
      max_concurrent_trials?: 2
    space:                           # flat: constants or one-key domain mappings
      lr: {loguniform: [0.05, 2.0]}
      batch_size: {choice: [64, 128]}
      epochs: 1
      noise_multiplier: {uniform: [1.0, 2.0]}
      # also {randint: [a, b]}, {grid: [...]}, {quniform: [a, b, q]}, {qloguniform: ...},
      # {randn: [mean, sd]}
    budget: {epsilon: 8.0, delta: 1.0e-5}
    test_accuracy_epsilon?: 0.1      # release a DP test accuracy (Laplace, its own charge,
                                     # taken from the budget); omit: a noiseless one, NOT covered
    resources?: {cpu: 1, gpu: 0}     # per trial
    storage_path?: ./raydp_results   # local dir or NFS mount shared by every node
    tensorboard?: false              # also write Tune's per-trial TensorBoard files
    ledger?:                         # omit: the dataset's own ledger (see below)
      name: mnist1d-dataset          # shared dataset-level ledger actor (one per dataset)
      budget?: {epsilon: 16, delta: 1.0e-5}   # the dataset's total; default: `budget`
      journal?: /nfs/ledgers/mnist1d.journal  # default <storage_path>/ledgers/<name>.journal
      namespace?: raydp_hpo

**The budget belongs to the data.** Without a ``ledger:`` block an experiment charges the
dataset's default ledger, named from a fingerprint of the data source
(:meth:`DataSpec.fingerprint`: the built-in dataset and its generator settings, or the
canonical Parquet URI) and journaled under ``<storage_path>/ledgers/``. A second experiment
on the same data — a re-run under a new name after a crash, say — spends from the same budget
instead of getting a fresh one. The first experiment on a dataset creates its ledger with its
``budget`` (logged); later ones attach to it, their own ``budget`` being a cap on what they
spend. A fresh budget on the same data is an explicit, logged act: name another ledger in
``ledger:``. A crashed run continues with ``raydp-hpo run --resume`` (same experiment name).

:func:`run_experiment` executes a spec: connects to ``RAY_ADDRESS`` when set (a cluster, or
the cluster a ``ray job submit`` job runs on), else starts a local Ray; runs
:class:`~raydp_hpo.tuner.DPTuner` with a progress monitor; writes ``release.json``,
``certificate.json`` and ``run.json`` into the run dir ``<storage_path>/<experiment>``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._validation import did_you_mean
from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.errors import BudgetTooSmallError, ConfigError, RayDPHPOError
from raydp_hpo.ray_runtime import ensure_ray

__all__ = [
    "DataSpec",
    "ModelSpec",
    "SearchSpec",
    "LedgerSpec",
    "ExperimentSpec",
    "RunOutcome",
    "load_experiment",
    "parse_experiment",
    "build_param_space",
    "load_data",
    "validate_search",
    "run_experiment",
    "run_dir_of",
    "DATA_SOURCES",
    "DOMAIN_KINDS",
]

DATA_SOURCES = ("mnist1d", "digits", "parquet")
DOMAIN_KINDS = (
    "uniform", "loguniform", "quniform", "qloguniform", "randint", "choice", "grid", "randn",
)
_TOP_KEYS = (
    "experiment", "split_seed", "secret_seed", "data", "model", "search", "space", "budget",
    "resources", "storage_path", "ledger", "tensorboard", "test_accuracy_epsilon",
)
_DATA_KEYS = (
    "source", "size", "generator_seed", "uri", "feature_columns", "feature_column",
    "label_column", "num_classes", "val_fraction", "test_fraction", "declared_train_size",
    "declared_validation_size",
)
#: Public sizes of the built-in datasets (records before the split).
_BUILTIN_SIZES = {"digits": 1797}
_MODEL_KEYS = ("name", "kwargs")
_SEARCH_KEYS = ("algorithm", "settings", "metric", "mode", "max_concurrent_trials")
_BUDGET_KEYS = ("epsilon", "delta")
_RESOURCE_KEYS = ("cpu", "gpu", "memory")
_LEDGER_KEYS = ("name", "budget", "journal", "namespace")


# --------------------------------------------------------------------------------- helpers


def _check_keys(where: str, mapping: Mapping[str, Any], allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> None:
    for key in mapping:
        if not isinstance(key, str) or key not in allowed:
            hint = did_you_mean(str(key), allowed)
            raise ConfigError(
                f"unknown key {key!r} in {where}{hint} (valid keys: {', '.join(allowed)})"
            )
    for key in required:
        if key not in mapping:
            raise ConfigError(f"{where} needs the key {key!r}")


def _mapping(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    return value


def _number(where: str, value: Any) -> float:
    # PyYAML reads "1e-5" (no dot) as a string: accept numeric strings.
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _int(where: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where} must be >= {minimum}, got {value!r}")
    return int(value)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _budget(where: str, value: Any) -> PrivacyBudget:
    m = _mapping(where, value)
    _check_keys(where, m, _BUDGET_KEYS, required=_BUDGET_KEYS)
    try:
        return PrivacyBudget(_number(f"{where}.epsilon", m["epsilon"]),
                             _number(f"{where}.delta", m["delta"]))
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class DataSpec:
    """Where the private dataset comes from and how it is split (all splits are private)."""

    source: str
    size: int | None = None
    generator_seed: int = 42
    uri: str | None = None
    feature_columns: tuple[str, ...] | None = None
    feature_column: str | None = None
    label_column: str | None = None
    num_classes: int | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    declared_train_size: int | None = None
    declared_validation_size: int | None = None

    def _public_total(self) -> int | None:
        """Records of a built-in source before the split (public: ``size`` for MNIST-1D,
        1797 for digits); ``None`` for Parquet."""
        if self.source == "mnist1d":
            return self.size or 5000
        return _BUILTIN_SIZES.get(self.source)

    def public_sizes(self) -> tuple[int | None, int | None]:
        """Declared public (training, validation) sizes. Built-in sources have a public total
        N: ``round(N·(1 − f_val − f_test))`` and ``round(N·f_val)`` unless declared. Parquet:
        only what is declared (``None``: the realised sizes, listed in the certificate as
        treated as public)."""
        total = self._public_total()
        train, val = self.declared_train_size, self.declared_validation_size
        if total is not None:
            if train is None:
                train = max(1, round(total * (1.0 - self.val_fraction - self.test_fraction)))
            if val is None and self.val_fraction > 0:
                val = max(1, round(total * self.val_fraction))
        return train, val

    def public_test_size(self) -> int | None:
        """Declared public test size: ``round(N·f_test)`` for built-in sources, else ``None``."""
        total = self._public_total()
        return None if total is None else max(1, round(total * self.test_fraction))

    def fingerprint(self) -> str:
        """The identity of the data source the budget belongs to: the built-in dataset and its
        generator settings, or the canonical URI of the Parquet data. Deliberately not a hash
        of the content: a dataset with one record more is a neighbouring dataset of the same
        people and must spend from the same budget."""
        if self.source == "mnist1d":
            return f"mnist1d:size={self.size or 5000}:generator_seed={self.generator_seed}"
        if self.source == "parquet":
            assert self.uri is not None
            uri = self.uri
            if "://" not in uri:
                uri = "file://" + str(Path(uri).expanduser().resolve())
            return f"parquet:{uri.rstrip('/')}"
        return self.source

    def ledger_name(self) -> str:
        """Name of the dataset's default ledger: ``data-<source>-<12 hex of the fingerprint>``."""
        import hashlib

        digest = hashlib.sha256(self.fingerprint().encode("utf-8")).hexdigest()[:12]
        return f"data-{self.source}-{digest}"

    @classmethod
    def parse(cls, value: Any) -> DataSpec:
        m = _mapping("data", value)
        _check_keys("data", m, _DATA_KEYS, required=("source",))
        source = _str("data.source", m["source"])
        if source not in DATA_SOURCES:
            hint = did_you_mean(source, DATA_SOURCES)
            raise ConfigError(
                f"data.source {source!r} is not one of {', '.join(DATA_SOURCES)}{hint}"
            )
        parquet_only = ("uri", "feature_columns", "feature_column", "label_column", "num_classes")
        if source != "parquet":
            wrong = [k for k in parquet_only if k in m]
            if wrong:
                raise ConfigError(f"data.{wrong[0]} is only for source 'parquet', not {source!r}")
        if source != "mnist1d":
            wrong = [k for k in ("size", "generator_seed") if k in m]
            if wrong:
                raise ConfigError(f"data.{wrong[0]} is only for source 'mnist1d', not {source!r}")
        size = _int("data.size", m["size"], 10) if "size" in m else None
        feature_columns: tuple[str, ...] | None = None
        if source == "parquet":
            for key in ("uri", "label_column"):
                if key not in m:
                    raise ConfigError(f"data source 'parquet' needs data.{key}")
            if ("feature_columns" in m) == ("feature_column" in m):
                raise ConfigError(
                    "data source 'parquet' needs exactly one of data.feature_columns (one "
                    "numeric column per feature) or data.feature_column (a list column)"
                )
            if "feature_columns" in m:
                cols = m["feature_columns"]
                if not isinstance(cols, list) or not cols or not all(
                    isinstance(c, str) and c for c in cols
                ):
                    raise ConfigError(
                        f"data.feature_columns must be a non-empty list of names, got {cols!r}"
                    )
                feature_columns = tuple(cols)
        fractions = {}
        for key in ("val_fraction", "test_fraction"):
            f = _number(f"data.{key}", m.get(key, 0.1))
            if not 0.0 <= f < 1.0:
                raise ConfigError(f"data.{key} must be in [0, 1), got {f!r}")
            fractions[key] = f
        if fractions["val_fraction"] + fractions["test_fraction"] >= 1.0:
            raise ConfigError("data.val_fraction + data.test_fraction must be < 1")
        declared = {
            key: _int(f"data.{key}", m[key], 1) for key in
            ("declared_train_size", "declared_validation_size") if key in m
        }
        return cls(
            source=source,
            size=size,
            generator_seed=_int("data.generator_seed", m.get("generator_seed", 42)),
            uri=_str("data.uri", m["uri"]) if "uri" in m else None,
            feature_columns=feature_columns,
            feature_column=_str("data.feature_column", m["feature_column"])
            if "feature_column" in m else None,
            label_column=_str("data.label_column", m["label_column"])
            if "label_column" in m else None,
            num_classes=_int("data.num_classes", m["num_classes"], 2)
            if "num_classes" in m else None,
            val_fraction=fractions["val_fraction"],
            test_fraction=fractions["test_fraction"],
            declared_train_size=declared.get("declared_train_size"),
            declared_validation_size=declared.get("declared_validation_size"),
        )


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any) -> ModelSpec:
        if isinstance(value, str):
            value = {"name": value}
        m = _mapping("model", value)
        _check_keys("model", m, _MODEL_KEYS, required=("name",))
        kwargs = dict(_mapping("model.kwargs", m.get("kwargs", {})))
        name = _str("model.name", m["name"])
        from trainables.models import MODEL_NAMES

        if name not in MODEL_NAMES and ":" not in name:
            hint = did_you_mean(name, list(MODEL_NAMES))
            raise ConfigError(
                f"model.name {name!r} is not one of {', '.join(MODEL_NAMES)} and not a "
                f"'package.module:Class' path{hint}"
            )
        return cls(name, kwargs)


@dataclass(frozen=True)
class SearchSpec:
    algorithm: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    metric: str = "val_accuracy"
    mode: str = "max"
    max_concurrent_trials: int = 2

    @classmethod
    def parse(cls, value: Any) -> SearchSpec:
        from search_algs import SearchAlgorithm

        m = _mapping("search", value)
        _check_keys("search", m, _SEARCH_KEYS, required=("algorithm",))
        algorithm = _str("search.algorithm", m["algorithm"])
        names = [a.value for a in SearchAlgorithm]
        if algorithm not in names:
            hint = did_you_mean(algorithm, names)
            raise ConfigError(
                f"search.algorithm {algorithm!r} is not one of {', '.join(names)}{hint}"
            )
        mode = m.get("mode", "max")
        if mode not in ("max", "min"):
            raise ConfigError(f"search.mode must be 'max' or 'min', got {mode!r}")
        return cls(
            algorithm=algorithm,
            settings=dict(_mapping("search.settings", m.get("settings", {}))),
            metric=_str("search.metric", m.get("metric", "val_accuracy")),
            mode=mode,
            max_concurrent_trials=_int(
                "search.max_concurrent_trials", m.get("max_concurrent_trials", 2), 1
            ),
        )


@dataclass(frozen=True)
class LedgerSpec:
    """A shared dataset-level ledger actor (every experiment on the dataset names it)."""

    name: str
    budget: PrivacyBudget | None = None
    journal: str | None = None
    namespace: str = "raydp_hpo"

    @classmethod
    def parse(cls, value: Any) -> LedgerSpec:
        if isinstance(value, str):
            value = {"name": value}
        m = _mapping("ledger", value)
        _check_keys("ledger", m, _LEDGER_KEYS, required=("name",))
        return cls(
            name=_str("ledger.name", m["name"]),
            budget=_budget("ledger.budget", m["budget"]) if "budget" in m else None,
            journal=_str("ledger.journal", m["journal"]) if "journal" in m else None,
            namespace=_str("ledger.namespace", m.get("namespace", "raydp_hpo")),
        )


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment file (see the module docstring for the schema)."""

    experiment: str
    data: DataSpec
    model: ModelSpec
    search: SearchSpec
    space: Mapping[str, Any]
    budget: PrivacyBudget
    split_seed: int = 0
    secret_seed: int | None = field(default=None, repr=False)
    resources: Mapping[str, float] = field(default_factory=lambda: {"cpu": 1.0, "gpu": 0.0})
    storage_path: str = "raydp_results"
    ledger: LedgerSpec | None = None
    source_path: str | None = None
    tensorboard: bool = False
    test_accuracy_epsilon: float | None = None

    @property
    def run_dir(self) -> Path:
        return run_dir_of(self.storage_path, self.experiment)

    @property
    def ledger_name(self) -> str:
        """The ledger this experiment charges: the named one, else the dataset's default."""
        return self.ledger.name if self.ledger is not None else self.data.ledger_name()

    def ledger_journal(self) -> Path:
        """Journal of the ledger: ``ledger.journal``, else ``<storage_path>/ledgers/<name>``."""
        if self.ledger is not None and self.ledger.journal:
            return Path(self.ledger.journal).expanduser().resolve()
        return (Path(self.storage_path) / "ledgers" / f"{self.ledger_name}.journal").resolve()

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data, for run.json: the secret seed is never included."""
        out = asdict(self)
        out.pop("secret_seed", None)
        out["secret_seed_given"] = self.secret_seed is not None
        out["budget"] = self.budget.to_dict()
        if self.ledger is not None and self.ledger.budget is not None:
            out["ledger"]["budget"] = self.ledger.budget.to_dict()
        return out


def run_dir_of(storage_path: str | os.PathLike[str], experiment: str) -> Path:
    from raydp_hpo.tuner import _safe_name

    return Path(storage_path).expanduser().resolve() / _safe_name(experiment)


def _parse_domain(key: str, value: Any) -> Any:
    """``{kind: args}`` → a ``ray.tune`` domain; anything else is a constant."""
    if not isinstance(value, Mapping) or len(value) != 1:
        if isinstance(value, Mapping):
            raise ConfigError(
                f"space.{key} must be a constant or a one-key domain mapping like "
                f"{{loguniform: [1e-3, 1]}}, got {dict(value)!r}"
            )
        return value
    ((kind, args),) = value.items()
    if kind not in DOMAIN_KINDS:
        hint = did_you_mean(str(kind), DOMAIN_KINDS)
        raise ConfigError(
            f"unknown domain {kind!r} in space.{key}{hint} (valid: {', '.join(DOMAIN_KINDS)})"
        )
    from ray import tune

    where = f"space.{key}.{kind}"
    if kind in ("choice", "grid"):
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where} needs a non-empty list of values, got {args!r}")
        return tune.choice(args) if kind == "choice" else tune.grid_search(args)
    arity = 3 if kind in ("quniform", "qloguniform") else 2
    if not isinstance(args, list) or len(args) != arity:
        raise ConfigError(f"{where} needs a list of {arity} numbers, got {args!r}")
    if kind == "randint":
        ilo, ihi = (_int(where, a) for a in args)
        if not ilo < ihi:
            raise ConfigError(f"{where} needs low < high, got {args!r}")
        return tune.randint(ilo, ihi)
    nums = [_number(where, a) for a in args]
    if kind == "randn":
        if nums[1] <= 0:
            raise ConfigError(f"{where} needs a positive standard deviation, got {args!r}")
        return tune.randn(nums[0], nums[1])
    lo, hi = nums[0], nums[1]
    if not lo < hi:
        raise ConfigError(f"{where} needs low < high, got {args!r}")
    if kind in ("loguniform", "qloguniform") and lo <= 0:
        raise ConfigError(f"{where} needs low > 0, got {args!r}")
    return {
        "uniform": lambda: tune.uniform(lo, hi),
        "loguniform": lambda: tune.loguniform(lo, hi),
        "quniform": lambda: tune.quniform(lo, hi, nums[2]),
        "qloguniform": lambda: tune.qloguniform(lo, hi, nums[2]),
    }[kind]()


def build_param_space(spec: ExperimentSpec) -> dict[str, Any]:
    """The searcher's flat space: model name/kwargs plus the file's ``space`` as domains."""
    from ray import tune

    space: dict[str, Any] = {"model": spec.model.name}
    if spec.model.kwargs:
        # a one-value Categorical: searchers need a flat space, and a constant dict is "nested"
        space["model_kwargs"] = tune.choice([dict(spec.model.kwargs)])
    for key, value in spec.space.items():
        space[key] = _parse_domain(key, value)
    return space


class _Problems:
    """Collects every error of an experiment file: each check runs under the key it checks,
    and an error there is recorded (path, message) instead of stopping the others."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.too_small: BudgetTooSmallError | None = None

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def run(self, path: str, check: Callable[[], Any]) -> Any:
        """``check()``, or None after recording its error under ``path``."""
        try:
            return check()
        except BudgetTooSmallError as exc:
            self.too_small = exc
            self.add(path, str(exc))
        except ConfigError as exc:
            for sub, message in exc.problems:
                self.add(sub or path, message)
        except (RayDPHPOError, ValueError, TypeError, OSError) as exc:
            self.add(path, f"{type(exc).__name__}: {exc}" if not isinstance(
                exc, RayDPHPOError) else str(exc))
        return None

    def raise_if_any(self, what: str) -> None:
        if not self.items:
            return
        if len(self.items) == 1 and self.too_small is not None:
            raise self.too_small  # alone: keeps its "budget exhausted" exit code
        if len(self.items) == 1:
            path, message = self.items[0]
            raise ConfigError(message, ((path, message),))
        lines = "\n".join(f"  - {path or '(file)'}: {message}" for path, message in self.items)
        raise ConfigError(f"{len(self.items)} errors in {what}:\n{lines}", tuple(self.items))


def parse_experiment(raw: Any, *, source_path: str | None = None) -> ExperimentSpec:
    """Validate a parsed experiment mapping; raises one :class:`ConfigError` listing every
    error found (``problems``: (path, message) pairs), not just the first."""
    what = f"experiment file {source_path!r}" if source_path else "the experiment"
    m = _mapping("the experiment file", raw)
    problems = _Problems()
    if "seed" in m:
        problems.add("seed",
            "the key 'seed' is no longer accepted: it made the searcher's secrets public. Use "
            "'split_seed' (public: makes the train/val/test split reproducible) and omit "
            "'secret_seed' so every secret comes from OS entropy (set secret_seed only to "
            "reproduce a run, and keep the file as secret as the data)"
        )
    for key in m:
        if key != "seed":
            problems.run(str(key), lambda key=key: _check_keys(
                "the experiment file", {key: None}, _TOP_KEYS))
    for key in ("experiment", "data", "model", "search", "space", "budget"):
        if key not in m:
            problems.add(key, f"the experiment file needs the key {key!r}")

    def experiment_name() -> str:
        experiment = _str("experiment", m["experiment"])
        if experiment.strip(".") == "" or any(c in experiment for c in "/\\") or (
            experiment.startswith(".")
        ):
            raise ConfigError(
                f"experiment {experiment!r} must be a plain name (no '/', no leading '.'): it "
                "names the run directory inside storage_path"
            )
        return experiment

    def space_of() -> dict[str, Any]:
        space = dict(_mapping("space", m["space"]))
        if not space:
            raise ConfigError("space must set at least one key")
        return space

    space = problems.run("space", space_of) if "space" in m else None
    for key, value in (space or {}).items():
        if not isinstance(key, str):
            problems.add("space", f"space keys must be strings, got {key!r}")
        elif key in ("model", "model_kwargs", "raydp"):
            problems.add(f"space.{key}", f"space.{key} is reserved; set the model under model:")
        else:
            problems.run(f"space.{key}", lambda key=key, value=value: _parse_domain(key, value))
    resources: dict[str, float] = {"cpu": 1.0, "gpu": 0.0}
    if "resources" in m:
        res = problems.run("resources", lambda: _mapping("resources", m["resources"]))
        for key, value in (res or {}).items():
            where = f"resources.{key}"
            if key not in _RESOURCE_KEYS:
                problems.run(where, lambda key=key: _check_keys("resources", {key: None},
                                                                _RESOURCE_KEYS))
                continue
            number = problems.run(where, lambda where=where, value=value: _number(where, value))
            if number is not None and number < 0:
                problems.add(where, f"{where} must be >= 0, got {value!r}")
            elif number is not None:
                resources[key] = number

    def storage() -> str:
        storage = _str("storage_path", m.get("storage_path", "raydp_results"))
        if "://" in storage:
            raise ConfigError(
                f"storage_path {storage!r}: use a mounted shared file system path (NFS, a "
                "fuse-mounted bucket); the ledger journal needs POSIX append + fsync"
            )
        return str(Path(storage).expanduser().resolve())  # relative: to the working dir

    def optional(key: str, parse: Callable[[Any], Any]) -> Any:
        return problems.run(key, lambda: parse(m[key])) if m.get(key) is not None else None

    parts = {
        "experiment": problems.run("experiment", experiment_name) if "experiment" in m else None,
        "data": problems.run("data", lambda: DataSpec.parse(m["data"])) if "data" in m else None,
        "model": problems.run("model", lambda: ModelSpec.parse(m["model"]))
        if "model" in m else None,
        "search": problems.run("search", lambda: SearchSpec.parse(m["search"]))
        if "search" in m else None,
        "budget": problems.run("budget", lambda: _budget("budget", m["budget"]))
        if "budget" in m else None,
    }
    split_seed = problems.run("split_seed", lambda: _int("split_seed", m.get("split_seed", 0), 0))
    secret_seed = optional("secret_seed", lambda v: _int("secret_seed", v, 0))
    storage_path = problems.run("storage_path", storage)
    ledger = optional("ledger", LedgerSpec.parse)
    tensorboard = problems.run("tensorboard",
                               lambda: _bool("tensorboard", m.get("tensorboard", False)))
    test_eps = optional("test_accuracy_epsilon",
                        lambda v: _number("test_accuracy_epsilon", v))
    budget = parts["budget"]
    if budget is not None and test_eps is not None and not 0 < test_eps < budget.epsilon:
        problems.add(
            "test_accuracy_epsilon",
            f"test_accuracy_epsilon={test_eps:g} must be in (0, budget.epsilon="
            f"{budget.epsilon:g}): it is taken from the experiment's budget",
        )
    if budget is not None and ledger is not None and ledger.budget is not None and (
        ledger.budget.delta != budget.delta
    ):
        problems.add(
            "ledger.budget.delta",
            f"ledger.budget.delta={ledger.budget.delta:g} differs from budget.delta="
            f"{budget.delta:g}; a shared ledger states ε at one δ",
        )
    problems.raise_if_any(what)
    return ExperimentSpec(
        experiment=parts["experiment"],
        data=parts["data"],
        model=parts["model"],
        search=parts["search"],
        space=space or {},
        budget=budget,
        split_seed=split_seed,
        secret_seed=secret_seed,
        resources=resources,
        storage_path=storage_path,
        ledger=ledger,
        source_path=source_path,
        tensorboard=tensorboard,
        test_accuracy_epsilon=test_eps,
    )


def load_experiment(path: str | os.PathLike[str]) -> ExperimentSpec:
    """Read and validate an experiment YAML file (raises :class:`ConfigError`)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a file" if p.is_dir() else "does not exist"
        raise ConfigError(f"experiment file {str(p)!r} {what}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"experiment file {str(p)!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"experiment file {str(p)!r} is not valid YAML: {exc}") from None
    if raw is None:
        raise ConfigError(f"experiment file {str(p)!r} is empty; see the schema in "
                          "raydp_hpo/experiment.py or cluster/examples/")
    return parse_experiment(raw, source_path=str(p.resolve()))


def _strict_loader() -> Any:
    """A YAML SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one, so a
    second ``budget:`` would replace the first without a word)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (first at "
                    f"line {seen[key] + 1}); a YAML mapping takes each key once"
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


_StrictLoader = _strict_loader()


# --------------------------------------------------------------------------------- running


def load_data(spec: DataSpec, split_seed: int) -> Any:
    """Load and split the private dataset (``trainables.DataSplits``); the split is stable per
    record and its seed is public (:func:`trainables.data.split`)."""
    from trainables.data import load_digits, load_mnist1d, load_parquet, split

    if spec.source == "mnist1d":
        dataset = load_mnist1d(spec.size or 5000, seed=spec.generator_seed)
    elif spec.source == "digits":
        dataset = load_digits()
    else:
        assert spec.uri is not None and spec.label_column is not None
        dataset = load_parquet(
            spec.uri,
            label_column=spec.label_column,
            feature_columns=spec.feature_columns,
            feature_column=spec.feature_column,
            num_classes=spec.num_classes,
        )
    return split(dataset, spec.val_fraction, spec.test_fraction, seed=split_seed)


def local_resources() -> dict[str, float]:
    """CPUs, GPUs and memory (bytes) of this machine: what a local Ray started here has."""
    cpus = float(os.cpu_count() or 1)
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = math.inf
    try:
        import torch

        gpus = float(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPU
        gpus = 0.0
    return {"cpu": cpus, "gpu": gpus, "memory": memory}


def check_resources(spec: ExperimentSpec, available: Mapping[str, float], where: str) -> None:
    """Refuse a per-trial request larger than everything ``available`` (the machine, or the
    whole cluster's total): it can never be placed, and Tune would wait forever after the plan
    was charged. A request that fits the total but no single node is not caught here.
    ``available`` uses Ray's keys (CPU, GPU, memory) or ours (cpu, gpu, memory)."""
    problems = _Problems()
    for key, ray_key, unit in (("cpu", "CPU", ""), ("gpu", "GPU", ""), ("memory", "memory",
                                                                        " bytes")):
        asked = float(spec.resources.get(key, 0.0))
        have = float(available.get(ray_key, available.get(key, 0.0)))
        if asked > have:
            problems.add(
                f"resources.{key}",
                f"resources.{key}={asked:g} per trial, but {where} has {have:g}{unit}: no trial "
                "could ever start (Tune would wait forever); lower it, or run on a larger "
                "cluster (RAY_ADDRESS, or --num-cpus for a local one)",
            )
    problems.raise_if_any(f"experiment {spec.experiment!r}")


def validate_search(
    spec: ExperimentSpec, dataset_size: int, validation_size: int | None = None
) -> None:
    """Build the searcher once without Ray or a ledger: a space key the trainable does not
    read, a bad constant, a space the algorithm cannot use, an unknown setting or a budget too
    small for the plan fail here, before anything runs. ``dataset_size`` and
    ``validation_size`` are the declared public sizes. Raises one :class:`ConfigError` with
    every problem found (or :class:`BudgetTooSmallError` when that is the only one)."""
    problems = _Problems()
    _validate_search(spec, dataset_size, validation_size, problems)
    problems.raise_if_any(f"experiment {spec.experiment!r}")


def _validate_search(spec: ExperimentSpec, dataset_size: int, validation_size: int | None,
                     problems: _Problems) -> None:
    from raydp_hpo.errors import SearchSpaceError
    from search_algs import make_searcher
    from trainables.training import validate_trial_space

    space = build_param_space(spec)
    try:
        validate_trial_space(space)
    except ValueError as exc:
        problems.add("space", f"space: {exc}")
    try:
        make_searcher(
            spec.search.algorithm,
            param_space=space,
            metric=spec.search.metric,
            mode=spec.search.mode,
            dataset_size=dataset_size,
            validation_size=validation_size,
            # the search's share: a DP test accuracy takes its ε_t from the budget first
            budget=PrivacyBudget(spec.budget.epsilon - (spec.test_accuracy_epsilon or 0.0),
                                 spec.budget.delta),
            experiment=spec.experiment,
            **dict(spec.search.settings),
        )
    except TypeError as exc:
        problems.add("search.settings", f"search.settings: {exc}")
    except BudgetTooSmallError as exc:
        problems.too_small = exc
        problems.add("budget", str(exc))
    except SearchSpaceError as exc:
        problems.add("space", f"space ({spec.search.algorithm}): {exc}")
    except (RayDPHPOError, ValueError) as exc:
        problems.add("search.settings", str(exc))


@dataclass(frozen=True)
class Preflight:
    """What :func:`preflight` checked: the loaded data and the public sizes used."""

    data: Any
    train_size: int
    validation_size: int | None


def preflight(spec: ExperimentSpec) -> Preflight:
    """Every check ``run`` makes before its first charge, without Ray or a ledger: the data
    (path, columns, labels), then the space against the trainable and the search plan against
    the budget. ``raydp-hpo run --dry-run`` and ``run`` both call it, so they refuse the same
    files; every problem is reported in one :class:`ConfigError` with its path."""
    problems = _Problems()
    if not os.environ.get("RAY_ADDRESS"):  # a cluster's resources are checked once attached
        problems.run("resources", lambda: check_resources(
            spec, local_resources(), "this machine (the local Ray `run` starts)"))
    data = problems.run("data", lambda: load_data(spec.data, spec.split_seed))
    train_size, val_size = spec.data.public_sizes()
    if data is not None:
        if train_size is None:
            train_size = len(data.train)
        if val_size is None:
            val_size = max(1, len(data.val))
    if train_size is not None:
        _validate_search(spec, train_size, val_size, problems)
    problems.raise_if_any(f"experiment {spec.experiment!r}")
    assert data is not None and train_size is not None  # else a problem was raised
    return Preflight(data, train_size, val_size)


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_experiment` produced (``result`` is the :class:`DPResult`)."""

    run_dir: Path
    result: Any
    journal: Path
    trial_errors: int


class ProgressMonitor:
    """Prints progress while a run goes: trials done, best metric so far, ε spent / total.

    Tails the run's ``audit.jsonl`` (written by :class:`LedgerAuditCallback`). What it prints
    (number of trials, per-trial metrics) is a private artefact, like the audit trail itself.
    """

    def __init__(self, audit_path: Path, total_epsilon: float, metric: str, mode: str,
                 interval_s: float = 5.0, out: Callable[[str], None] = print) -> None:
        self._path = audit_path
        self._total = total_epsilon
        self._metric = metric
        self._mode = mode
        self._interval = interval_s
        self._out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="raydp-progress", daemon=True)
        self._last = ""
        self._t0 = time.monotonic()

    def __enter__(self) -> ProgressMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self._interval)
        self.poll()

    def summary(self) -> str:
        started, done, errors, spent = set(), set(), set(), 0.0
        best: float | None = None
        try:
            lines = self._path.read_text(encoding="utf-8").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            tid = rec.get("trial_id")
            event = rec.get("event")
            if isinstance(rec.get("spent_epsilon"), (int, float)) and math.isfinite(
                rec["spent_epsilon"]
            ):
                spent = float(rec["spent_epsilon"])
            if event == "start":
                started.add(tid)
            elif event == "complete":
                done.add(tid)
            elif event == "error":
                errors.add(tid)
            elif event == "result":
                value = (rec.get("result") or {}).get(self._metric)
                if isinstance(value, (int, float)) and math.isfinite(value) and (
                    best is None or (value > best if self._mode == "max" else value < best)
                ):
                    best = float(value)
        best_txt = "-" if best is None else f"{best:.4f}"
        running = len(started - done - errors)
        return (
            f"[raydp-hpo {time.monotonic() - self._t0:6.0f}s] trials done {len(done)}, "
            f"errored {len(errors)}, running {running}; best {self._metric} so far {best_txt}; "
            f"ledger ε spent {spent:.4f} / {self._total:g}"
        )

    def poll(self) -> None:
        line = self.summary()
        key = line.split("]", 1)[1]
        if key != self._last:
            self._last = key
            self._out(line)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception as exc:  # progress must never kill the run
                self._out(f"[raydp-hpo] progress monitor: {exc!r}")


def _dataset_ledger_budget(spec: ExperimentSpec, out: Callable[[str], None]) -> PrivacyBudget:
    """The total budget of the ledger this experiment charges (see the module docstring)."""
    journal = spec.ledger_journal()
    if spec.ledger is not None:
        out(f"[raydp-hpo] ledger {spec.ledger.name!r} named explicitly (journal {journal}); "
            f"the dataset's default ledger is {spec.data.ledger_name()!r}")
        return spec.ledger.budget or spec.budget
    if journal.exists():
        from raydp_hpo.ledger import PrivacyLedger

        report = PrivacyLedger.read_only(journal).report()
        out(f"[raydp-hpo] dataset ledger {spec.ledger_name!r} ({spec.data.fingerprint()}): "
            f"total ε={report.budget.epsilon:g}, δ={report.budget.delta:g}, already spent "
            f"ε={report.spent_epsilon:.4f}; this experiment may spend at most "
            f"ε={spec.budget.epsilon:g}")
        if report.budget.delta != spec.budget.delta:
            raise ConfigError(
                f"budget.delta={spec.budget.delta:g} differs from the dataset ledger's "
                f"δ={report.budget.delta:g} ({journal}); a dataset ledger states ε at one δ"
            )
        return report.budget
    out(f"[raydp-hpo] new dataset ledger {spec.ledger_name!r} for {spec.data.fingerprint()} "
        f"with total budget ε={spec.budget.epsilon:g}, δ={spec.budget.delta:g} (journal "
        f"{journal}); later experiments on this data spend from it")
    return spec.budget


def run_experiment(spec: ExperimentSpec, *, progress_interval_s: float = 5.0,
                   out: Callable[[str], None] = print, resume: bool = False,
                   num_cpus: int | None = None, ray_temp_dir: str | None = None) -> RunOutcome:
    """Run a validated spec end to end (see the module docstring). ``resume=True`` continues
    an interrupted run of the same experiment (its charges are already on the ledger).
    A local Ray started here (``num_cpus``, ``ray_temp_dir``) is shut down before returning."""
    started = False

    def start_ray() -> None:
        nonlocal started
        started = ensure_ray(num_cpus, ray_temp_dir)

    try:
        return _run_experiment(spec, progress_interval_s, out, resume, start_ray)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run_experiment(spec: ExperimentSpec, progress_interval_s: float,
                    out: Callable[[str], None], resume: bool,
                    start_ray: Callable[[], None]) -> RunOutcome:
    from raydp_hpo.accounting import Accountant
    from raydp_hpo.ledger import Adaptivity
    from raydp_hpo.ledger_actor import get_ledger
    from raydp_hpo.tuner import DPTuner

    run_dir = spec.run_dir
    if (run_dir / "release.json").exists():
        raise ConfigError(
            f"experiment {spec.experiment!r} already has a release in {run_dir}; pick a new "
            "experiment name (a finished experiment is never re-run)"
        )
    started = (run_dir / "tune").exists()
    if started and not resume:
        raise ConfigError(
            f"experiment {spec.experiment!r} was started before ({run_dir}); continue it with "
            "'raydp-hpo run --resume' (what it charged stays charged), or pick a new name — a "
            "new experiment spends from the same dataset budget"
        )
    if resume and not started:
        raise ConfigError(
            f"nothing to resume: experiment {spec.experiment!r} has no run in {run_dir}; run "
            "it without --resume"
        )
    checked = preflight(spec)  # every check, all errors at once: before Ray and any ledger
    data = checked.data
    train_size, val_size = spec.data.public_sizes()
    ledger_budget = _dataset_ledger_budget(spec, out)
    start_ray()
    import ray

    check_resources(spec, ray.cluster_resources(), "the Ray cluster")  # before any charge
    ledger = get_ledger(
        spec.ledger_name,
        ledger_budget,
        spec.ledger_journal(),
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        adaptivity=Adaptivity.ADAPTIVE,
        accountant=Accountant.RDP,
    )
    tuner = DPTuner(
        None,
        param_space=build_param_space(spec),
        search=spec.search.algorithm,
        budget=spec.budget,
        metric=spec.search.metric,
        mode=spec.search.mode,
        data=data,
        resources=dict(spec.resources),
        storage_path=spec.storage_path,
        ledger=ledger,
        experiment=spec.experiment,
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        search_kwargs=dict(spec.search.settings),
        max_concurrent_trials=spec.search.max_concurrent_trials,
        secret_seed=spec.secret_seed,
        dataset_size=train_size,
        validation_size=val_size,
        test_accuracy_epsilon=spec.test_accuracy_epsilon,
        test_size=spec.data.public_test_size() if spec.test_accuracy_epsilon else None,
        tensorboard=spec.tensorboard,
        progress=out,
        progress_interval_s=progress_interval_s,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = spec.ledger_journal()
    meta = {
        "experiment": spec.experiment,
        "spec": spec.to_dict(),
        "ledger_name": spec.ledger_name,
        "ledger_journal": str(journal),
        "started": time.time(),
        "status": "running",
    }
    atomic_write_json(run_dir / "run.json", meta)
    out(f"[raydp-hpo] experiment {spec.experiment}: {spec.search.algorithm}, budget "
        f"ε={spec.budget.epsilon:g} δ={spec.budget.delta:g}, run dir {run_dir}")
    try:
        result = tuner.fit(resume=resume)
    except BaseException as exc:
        meta.update(status="failed", error=repr(exc)[:500], finished=time.time())
        atomic_write_json(run_dir / "run.json", meta)
        raise
    atomic_write_json(run_dir / "certificate.json", result.certificate.to_dict())
    errors = sum(1 for t in result.private_trials if t.get("error"))
    meta.update(
        status="budget_exhausted" if result.budget_exhausted else "finished",
        finished=time.time(),
        selected=result.hyperparameters is not None,
    )
    atomic_write_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir=run_dir, result=result, journal=journal, trial_errors=errors)


def format_summary(outcome: RunOutcome) -> str:
    """The final summary: the release (public, covered by the certificate), the certificate,
    and, apart, the noiseless test accuracy (an evaluation NOT covered by the certificate)."""
    r = outcome.result
    lines = ["", "=" * 72, "Released (public, covered by the certificate)"]
    if r.hyperparameters is None:
        reason = (r.extras or {}).get("reason", "no configuration was selected")
        lines.append(f"  nothing is released: {reason}")
        lines.append(f"  privacy spent all the same: ε={r.certificate.epsilon:.4f} "
                     f"(δ={r.certificate.budget.delta:g})")
    else:
        for key, value in sorted(r.hyperparameters.items()):
            lines.append(f"  {key:<18} {value}")
        if r.dp_test_accuracy is not None:
            lines.append(f"  test accuracy      {r.dp_test_accuracy:.4f}  (DP: Laplace, "
                         f"ε={r.dp_test_accuracy_epsilon:g}, in the certificate)")
    lines.append(r.certificate.format())
    if r.hyperparameters is not None:
        acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
        lines.append("Evaluation (NOT covered by the certificate: computed without noise on the "
                     "private test split; publish it only if that split is public)")
        lines.append(f"  test accuracy      {acc}")
    lines.append(f"Run dir: {outcome.run_dir} (release.json, certificate.json)")
    lines.append("Private (never publish): the Tune experiment dir tune/, audit.jsonl, "
                 "the progress lines above.")
    return "\n".join(lines)
