"""Experiment files: ``raydp-hpo run EXPERIMENT.yaml``.

An experiment file is a YAML mapping, validated in full *before* anything runs (no Ray, no
ledger, no data loaded) against the pydantic models of :mod:`raydp_hpo.cli.experiment_schema`,
then turned into the frozen spec dataclasses below. An unknown or misspelled key or value is
an error that names its path and suggests the closest valid one, and every error of a file is
reported at once. ``raydp-hpo schema`` prints the JSON Schema, for editors that complete
experiment files. Schema (``?`` = optional)::

    experiment: mnist1d-small        # name: run dir <storage_path>/<experiment>, charge-id prefix
    split_seed?: 0                   # PUBLIC: makes the train/val/test split reproducible
    secret_seed?: null               # SECRET; omit (or null) for OS entropy. Only to reproduce
                                     # a run: the file then must be kept like the data
    data:
      source: mnist1d                # mnist1d | digits | parquet
      size?: 2000                    # mnist1d: number of samples (default 5000)
      generator_seed?: 42            # mnist1d: generator seed
      uri?: s3://bucket/data.parquet # parquet: any URI pyarrow can read
      val_uri?: s3://bucket/val.parquet   # parquet: the validation split from its own file
      test_uri?: s3://bucket/test.parquet # parquet: the test split from its own file
      label_column?: y               # parquet (required there)
      feature_columns?: [f0, f1]     # parquet: one numeric column per feature, or ...
      feature_column?: x             # parquet: ... one list-valued column; neither: every
                                     # column but the label is a feature
      num_classes?: 10               # parquet: PUBLIC number of classes (required, or
                                     # sizes_public: true for max(label) + 1 of the data)
      val_fraction?: 0.1             # (not with val_uri)
      test_fraction?: 0.1            # (not with test_uri)
      declared_train_size?: 1600     # PUBLIC sizes used by the accounting and normalisers;
      declared_validation_size?: 200 # default: from the source's public size for built-ins;
      declared_test_size?: 200       # parquet: required (test size: with test_accuracy_epsilon)
      sizes_public?: false           # parquet: true accepts the realised (private) sizes and
                                     # max(label) + 1 as public where none is declared; the
                                     # certificate lists them (`run --dry-run` prints them)
    model:                           # or just `model: mlp`
      name: mlp                      # mlp | cnn1d | cnn2d | linear | random_kernels1d | package.module:Class
      kwargs?: {hidden: [32]}
    search:
      algorithm: random_stopping     # a raydp_hpo.searchers.SearchAlgorithm value
      settings?: {distribution: geometric, mean: 3}   # -> DPTuner(search_kwargs=...)
      preset?: tnb20                 # named settings (raydp_hpo.searchers.PRESETS), which
                                     # settings override: linear_scaling refined | paper
      # settings also take the selection score's noise: score_epsilon: 0.1 (default),
      # score_noise: gaussian + score_delta: 1.0e-6 (default score_noise: laplace)
      metric?: val_accuracy
      mode?: max
      max_concurrent_trials?: 2
    space:                           # flat: constants or one-key domain mappings
      lr: {loguniform: [0.05, 2.0], points: 4}   # points: grid and SVT search take 4
                                     # log-spaced values; other searchers sample the range
      batch_size: {choice: [64, 128]}
      epochs: 1
      noise_multiplier: {uniform: [1.0, 2.0], points: 3}
      # also {randint: [a, b]}, {grid: [...]}, {quniform: [a, b, q]}, {qloguniform: ...},
      # {randn: [mean, sd]}
    budget: {epsilon: 8.0, delta: 1.0e-5}
    test_accuracy_epsilon?: 0.1      # release a DP test accuracy (Laplace, its own charge,
                                     # taken from the budget); omit: a noiseless one, NOT covered
    resources?: {cpu: 1, gpu: 0}     # per trial
    storage_path?: ~/raydp_results   # local dir or NFS mount shared by every node; default
                                     # ~/raydp_results, or $RAYDP_HPO_STORAGE when set
    tensorboard?: false              # also write Tune's per-trial TensorBoard files
    ledger?:                         # omit: the dataset's own ledger (see below)
      name: mnist1d-dataset          # shared dataset-level ledger actor (one per dataset)
      budget?: {epsilon: 16, delta: 1.0e-5}   # the dataset's total; default: `budget`
      journal?: /nfs/ledgers/mnist1d.journal  # default <storage_path>/ledgers/<name>.journal
      uri?: postgresql://db/dp?ledger=mnist1d  # or a PostgreSQL ledger (credentials: libpq)
      namespace?: raydp_hpo

**One space for every searcher.** A continuous ``uniform`` / ``loguniform`` domain with
``points: N`` becomes a grid of N values from low to high (log-spaced for loguniform) where a
finite set is needed: for every key under grid and SVT search, which enumerate the space, and
for the privacy keys (noise, batch size, epochs, ...) under every searcher, which charge the
worst case over their values; elsewhere it is sampled as usual. The points are a function of
the file alone (public). Linear scaling sets ``lr``, the steps and the noise itself and
ignores those keys with a warning. A ``grid_composed`` search whose whole grid the budget
cannot pay is refused before any charge (``--dry-run`` too, exit 3).

**The budget belongs to the data.** Without a ``ledger:`` block an experiment charges the
dataset's default ledger, named from a fingerprint of the data source
(:meth:`DataSpec.fingerprint`: the built-in dataset and its generator settings, or the
canonical Parquet URI) and journaled under ``<storage_path>/ledgers/``. A second experiment
on the same data — a re-run under a new name after a crash, say — spends from the same budget
instead of getting a fresh one. The first experiment on a dataset creates its ledger with its
``budget`` (logged); later ones attach to it, their own ``budget`` being a cap on what they
spend. A fresh budget on the same data is an explicit, logged act: name another ledger in
``ledger:``. A crashed run continues with ``raydp-hpo run --resume`` (same experiment name), which first
checks that the ledger journal it attaches to holds the experiment's earlier charges (a moved
or replaced journal is refused, never silently a fresh budget).
Parquet ``val_uri`` / ``test_uri`` files are private data of the same dataset: they are
accounted on the ledger of ``uri``. Use a validation or test file with one training file only,
or name one shared ``ledger:`` for every experiment that reads it.

:func:`run_experiment` executes a spec: connects to ``RAY_ADDRESS`` when set (a cluster, or
the cluster a ``ray job submit`` job runs on), else starts a local Ray; runs
:class:`~raydp_hpo.tune.tuner.DPTuner` with a progress monitor. The run dir
``<storage_path>/<experiment>`` is private except its ``public/`` folder, which DPTuner fills
with exactly what may be published (``release.json``, ``certificate.json``,
``released_model.pt``; :mod:`raydp_hpo.tune.publish`); ``run.json`` and the rest stay private.
A storage path or ledger journal in a temporary directory or a Ray working dir is warned
about (a deleted journal resets the budget).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import default_storage_path, warn_if_ephemeral
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.experiment_schema import (
    DATA_SOURCES,
    DOMAIN_KINDS,
    ExperimentFile,
    config_error,
    domain_of,
    validate_experiment_file,
)
from raydp_hpo.errors import BudgetTooSmallError, ConfigError, RayDPHPOError

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

#: Public sizes of the built-in datasets (records before the split).
_BUILTIN_SIZES = {"digits": 1797}
#: Searchers that enumerate their space: a domain with ``points`` becomes a grid for every key.
_ENUMERATING = ("grid_composed", "svt_threshold")


# ---------------------------------------------- helpers of the federated experiment files
# (raydp_hpo.cli.federated_experiment still validates by hand; experiment files use the schema)


def _check_keys(where: str, mapping: Mapping[str, Any], allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> None:
    from raydp_hpo._validation import did_you_mean

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


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _budget(where: str, value: Any) -> PrivacyBudget:
    m = _mapping(where, value)
    _check_keys(where, m, ("epsilon", "delta"), required=("epsilon", "delta"))
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
    """Where the private dataset comes from and how it is split (all splits are private).

    ``val_fraction`` / ``test_fraction`` are the shares split off ``uri`` (0 for a split read
    from ``val_uri`` / ``test_uri``)."""

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
    val_uri: str | None = None
    test_uri: str | None = None
    declared_test_size: int | None = None
    sizes_public: bool = False

    def _public_total(self) -> int | None:
        """Records of a built-in source before the split (public: ``size`` for MNIST-1D,
        1797 for digits); ``None`` for Parquet."""
        if self.source == "mnist1d":
            return self.size or 5000
        return _BUILTIN_SIZES.get(self.source)

    def _split_sizes(self) -> Any:
        """:func:`raydp_hpo.trainables.data.public_split_sizes` of the public total, or
        ``None`` (Parquet: its size is private)."""
        from raydp_hpo.trainables.data import public_split_sizes

        total = self._public_total()
        return None if total is None else public_split_sizes(
            total, self.val_fraction, self.test_fraction)

    def public_sizes(self) -> tuple[int | None, int | None]:
        """Declared public (training, validation) sizes. Built-in sources have a public total
        N: ``round(N·(1 − f_val − f_test))`` and ``round(N·f_val)`` unless declared
        (:func:`~raydp_hpo.trainables.data.public_split_sizes`, as ``split()`` declares them).
        Parquet: only what is declared (``None``: refused at validation unless
        ``sizes_public``, when the realised sizes are listed as treated as public)."""
        sizes = self._split_sizes()
        train, val = self.declared_train_size, self.declared_validation_size
        if sizes is not None:
            train = sizes.train if train is None else train
            val = sizes.validation if val is None else val
        return train, val

    def public_test_size(self) -> int | None:
        """Declared public test size: ``declared_test_size``, else ``round(N·f_test)`` for
        built-in sources, else ``None``."""
        if self.declared_test_size is not None:
            return self.declared_test_size
        sizes = self._split_sizes()
        return None if sizes is None else sizes.test

    def fingerprint(self) -> str:
        """The identity of the data source the budget belongs to: the built-in dataset and its
        generator settings, or the canonical URI of the Parquet data. Deliberately not a hash
        of the content: a dataset with one record more is a neighbouring dataset of the same
        people and must spend from the same budget. The same string the Python loaders put
        on the data (:func:`raydp_hpo.trainables.data.dataset_fingerprint`), so ``DPTuner`` on
        the same data charges the same ledger."""
        from raydp_hpo.trainables.data import dataset_fingerprint

        return dataset_fingerprint(self.source, uri=self.uri, size=self.size or 5000,
                                   generator_seed=self.generator_seed)

    def ledger_name(self) -> str:
        """Name of the dataset's default ledger: ``data-<source>-<12 hex of the fingerprint>``."""
        from raydp_hpo.trainables.data import dataset_ledger_name

        return dataset_ledger_name(self.fingerprint())


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSpec:
    algorithm: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    metric: str = "val_accuracy"
    mode: str = "max"
    max_concurrent_trials: int = 2


@dataclass(frozen=True)
class LedgerSpec:
    """A shared dataset-level ledger actor (every experiment on the dataset names it)."""

    name: str
    budget: PrivacyBudget | None = None
    journal: str | None = None
    namespace: str = "raydp_hpo"
    uri: str | None = None  # a PostgreSQL ledger instead of a journal file


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
    storage_path: str = field(default_factory=lambda: str(default_storage_path()))
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

    def ledger_journal(self) -> Path | str:
        """Where the ledger's charges live: ``ledger.uri`` (or a PostgreSQL URI given as
        ``ledger.journal``), ``ledger.journal``, else ``<storage_path>/ledgers/<name>``."""
        from raydp_hpo.ledger.pg import is_postgres_uri

        if self.ledger is not None and self.ledger.uri:
            return self.ledger.uri
        if self.ledger is not None and is_postgres_uri(self.ledger.journal):
            return str(self.ledger.journal)
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
    from raydp_hpo.tune.tuner import _safe_name

    return Path(storage_path).expanduser().resolve() / _safe_name(experiment)


def build_param_space(spec: ExperimentSpec) -> dict[str, Any]:
    """The searcher's flat space: model name/kwargs plus the file's ``space`` as domains.

    A ``uniform`` / ``loguniform`` domain with ``points: N`` becomes a grid of N values for
    every key under a searcher that enumerates its space (grid, SVT) and, under any searcher,
    for a privacy key (which must take finitely many values so their worst case is charged);
    elsewhere it stays continuous."""
    from ray import tune

    from raydp_hpo.searchers.base import PRIVACY_KEYS

    enumerating = spec.search.algorithm in _ENUMERATING
    space: dict[str, Any] = {"model": spec.model.name}
    if spec.model.kwargs:
        # a one-value Categorical: searchers need a flat space, and a constant dict is "nested"
        space["model_kwargs"] = tune.choice([dict(spec.model.kwargs)])
    for key, value in spec.space.items():
        domain = domain_of(key, value)
        if domain is None:
            space[key] = value
        elif domain.points is not None and enumerating:
            space[key] = tune.grid_search(domain.grid())
        elif domain.points is not None and key in PRIVACY_KEYS:
            space[key] = tune.choice(domain.grid())
        else:
            space[key] = domain.to_tune()
    return space


def _continuous_without_points(spec: ExperimentSpec) -> list[str]:
    """Space keys with a continuous domain and no ``points`` (a grid / SVT search refuses
    them)."""
    out = []
    for key, value in spec.space.items():
        domain = domain_of(key, value)
        if domain is not None and domain.kind not in ("choice", "grid") and domain.points is None:
            out.append(key)
    return out


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
        raise config_error(self.items, what)


def _spec_of(file: ExperimentFile, source_path: str | None) -> ExperimentSpec:
    """The frozen spec of a validated experiment file (defaults filled in, paths resolved)."""
    d = file.data
    val_uri = getattr(d, "val_uri", None)
    test_uri = getattr(d, "test_uri", None)
    columns = getattr(d, "feature_columns", None)
    data = DataSpec(
        source=d.source,
        size=getattr(d, "size", None),
        generator_seed=getattr(d, "generator_seed", 42),
        uri=getattr(d, "uri", None),
        feature_columns=tuple(columns) if columns is not None else None,
        feature_column=getattr(d, "feature_column", None),
        label_column=getattr(d, "label_column", None),
        num_classes=getattr(d, "num_classes", None),
        val_fraction=0.0 if val_uri else d.val_fraction,  # the split is its own file
        test_fraction=0.0 if test_uri else d.test_fraction,
        declared_train_size=d.declared_train_size,
        declared_validation_size=d.declared_validation_size,
        val_uri=val_uri,
        test_uri=test_uri,
        declared_test_size=d.declared_test_size,
        sizes_public=bool(getattr(d, "sizes_public", False)),
    )
    resources = {"cpu": file.resources.cpu, "gpu": file.resources.gpu}
    if file.resources.memory is not None:
        resources["memory"] = file.resources.memory
    ledger = None
    if file.ledger is not None:
        ledger = LedgerSpec(
            name=file.ledger.name,
            budget=file.ledger.budget.budget() if file.ledger.budget is not None else None,
            journal=file.ledger.journal,
            namespace=file.ledger.namespace,
            uri=file.ledger.uri,
        )
    return ExperimentSpec(
        experiment=file.experiment,
        data=data,
        model=ModelSpec(file.model.name, dict(file.model.kwargs)),
        search=SearchSpec(
            algorithm=file.search.algorithm,
            settings={**({"preset": file.search.preset} if file.search.preset else {}),
                      **file.search.settings},
            metric=file.search.metric,
            mode=file.search.mode,
            max_concurrent_trials=file.search.max_concurrent_trials,
        ),
        space=dict(file.space),
        budget=file.budget.budget(),
        split_seed=file.split_seed,
        secret_seed=file.secret_seed,
        resources=resources,
        # relative: to the working dir; none: ~/raydp_results or $RAYDP_HPO_STORAGE
        storage_path=str(Path(file.storage_path).expanduser().resolve()
                         if file.storage_path is not None else default_storage_path()),
        ledger=ledger,
        source_path=source_path,
        tensorboard=file.tensorboard,
        test_accuracy_epsilon=file.test_accuracy_epsilon,
    )


def parse_experiment(raw: Any, *, source_path: str | None = None) -> ExperimentSpec:
    """Validate a parsed experiment mapping; raises one :class:`ConfigError` listing every
    error found (``problems``: (path, message) pairs), not just the first."""
    what = f"experiment file {source_path!r}" if source_path else "the experiment"
    return _spec_of(validate_experiment_file(raw, what), source_path)


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
                          "raydp_hpo/cli/experiment.py ('raydp-hpo schema' prints it as JSON "
                          "Schema) or cluster/examples/")
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
    """Load and split the private dataset (``raydp_hpo.trainables.DataSplits``); the split is
    stable per record and its seed is public (:func:`raydp_hpo.trainables.data.split`). A
    Parquet ``val_uri`` / ``test_uri`` file is that split as is (``uri`` then gives none of its
    records to it)."""
    from raydp_hpo.errors import DataValidationError
    from raydp_hpo.trainables.data import (
        Dataset,
        DataSplits,
        load_digits,
        load_mnist1d,
        load_parquet,
        parquet_feature_columns,
        split,
    )

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
        if spec.val_uri or spec.test_uri:
            default = spec.feature_columns is None and spec.feature_column is None
            files = {}
            for name, uri in (("val", spec.val_uri), ("test", spec.test_uri)):
                if not uri:
                    continue
                if default:  # the same features in every file
                    here = parquet_feature_columns(uri, spec.label_column, f"data.{name}_uri")
                    there = parquet_feature_columns(spec.uri, spec.label_column)
                    if here != there:
                        raise DataValidationError(
                            f"data.{name}_uri {uri!r} has the feature columns {here}, data.uri "
                            f"{there}: list the features in data.feature_columns"
                        )
                files[name] = load_parquet(
                    uri, label_column=spec.label_column, feature_columns=spec.feature_columns,
                    feature_column=spec.feature_column, num_classes=spec.num_classes,
                    key=f"data.{name}_uri")
            splits = split(dataset, spec.val_fraction, spec.test_fraction, seed=split_seed)
            parts = {"train": splits.train, "val": files.get("val", splits.val),
                     "test": files.get("test", splits.test)}
            # one label set: num_classes (default max(label) + 1) over every file
            k = max(part.num_classes for part in parts.values())
            train, val, test = (Dataset(part.features, part.labels, k,
                                        num_classes_declared=spec.num_classes is not None,
                                        name=dataset.name)
                                for part in parts.values())
            return DataSplits(train, val, test)  # sizes private: the spec declares them
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
    from raydp_hpo.searchers import make_searcher
    from raydp_hpo.trainables.training import validate_trial_space

    space = build_param_space(spec)
    try:
        validate_trial_space(space)
    except ValueError as exc:
        problems.add("space", f"space: {exc}")
    search_budget = PrivacyBudget(spec.budget.epsilon - (spec.test_accuracy_epsilon or 0.0),
                                  spec.budget.delta)
    try:
        searcher = make_searcher(
            spec.search.algorithm,
            param_space=space,
            metric=spec.search.metric,
            mode=spec.search.mode,
            dataset_size=dataset_size,
            validation_size=validation_size,
            # the search's share: a DP test accuracy takes its ε_t from the budget first
            budget=search_budget,
            experiment=spec.experiment,
            **dict(spec.search.settings),
        )
        _check_whole_grid(searcher, search_budget, problems)
    except TypeError as exc:
        problems.add("search.settings", f"search.settings: {exc}")
    except BudgetTooSmallError as exc:
        problems.too_small = exc
        problems.add("budget", str(exc))
    except SearchSpaceError as exc:
        hint = ""
        continuous = _continuous_without_points(spec)
        if spec.search.algorithm in _ENUMERATING and continuous:
            hint = (f"; in the experiment file, give space.{continuous[0]} a number of points "
                    "to take from its range (e.g. {loguniform: [0.01, 1], points: 5}: a grid "
                    "of 5 log-spaced values)")
        problems.add("space", f"space ({spec.search.algorithm}): {exc}{hint}")
    except (RayDPHPOError, ValueError) as exc:
        problems.add("search.settings", str(exc))


def _check_whole_grid(searcher: Any, budget: PrivacyBudget, problems: _Problems) -> None:
    """A composed grid's whole cost is known before any charge: refuse a grid whose
    composition the budget cannot pay (the ledger would stop it after a few trials, having
    spent the budget on an arbitrary prefix of the grid)."""
    from raydp_hpo.searchers.base import plan_epsilon

    composed = getattr(searcher, "composed_mechanism", None)
    if composed is None:
        return
    eps = plan_epsilon(composed(), budget.delta)
    if eps <= budget.epsilon:
        return
    exc = BudgetTooSmallError(
        f"the budget cannot pay for the whole grid: grid_composed trains all "
        f"{searcher.grid_size} grid points and their composition needs ε={eps:.4g} at "
        f"δ={budget.delta:g} (RDP accountant), but the search's budget is ε={budget.epsilon:g}. "
        "Take fewer points (space.<key>.points, shorter choice lists), more noise "
        f"(space.noise_multiplier), or a budget of at least ε={eps:.4g}; nothing was charged"
    )
    problems.too_small = exc
    problems.add("budget", str(exc))


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


def describe_sizes(spec: ExperimentSpec, checked: Preflight) -> list[str]:
    """Lines for ``run --dry-run``: the public sizes the run will use, and the realised split
    sizes and number of classes of the loaded data — private, shown to the data's owner so
    that they can declare public values (never written to a release, certificate or log)."""
    data = checked.data
    train, val = spec.data.public_sizes()
    test = spec.data.public_test_size()
    declared_k = data.train.num_classes if data.train.num_classes_declared else None

    def shown(value: int | None) -> str:
        if value is not None:
            return str(value)
        return "realised (sizes_public: true)" if spec.data.sizes_public else "undeclared"

    return [
        f"public sizes the run uses: train={shown(train)}, validation={shown(val)}, "
        f"test={shown(test)} (read with test_accuracy_epsilon only), classes={shown(declared_k)}",
        "realised sizes (private; declare public values: data.declared_train_size, "
        "data.declared_validation_size, data.declared_test_size, data.num_classes): "
        f"train={len(data.train)}, validation={len(data.val)}, test={len(data.test)}, "
        f"classes={_label_classes(data)} (max label + 1)",
    ]


def _label_classes(data: Any) -> int:
    """max(label) + 1 over every split (what ``num_classes`` defaults to)."""
    return 1 + max(int(part.labels.max()) for part in (data.train, data.val, data.test)
                   if len(part))


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_experiment` produced (``result`` is the :class:`DPResult`)."""

    run_dir: Path
    result: Any
    journal: Path | str
    trial_errors: int
    test_split: bool = True  # False: no test records (test_fraction 0), nothing evaluated


def _dataset_ledger_budget(spec: ExperimentSpec, out: Callable[[str], None]) -> PrivacyBudget:
    """The total budget of the ledger this experiment charges (see the module docstring)."""
    journal = spec.ledger_journal()
    if spec.ledger is not None:
        out(f"[raydp-hpo] ledger {spec.ledger.name!r} named explicitly (journal {journal}); "
            f"the dataset's default ledger is {spec.data.ledger_name()!r}")
        return spec.ledger.budget or spec.budget
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_budget

    return dataset_ledger_budget(Path(journal), spec.budget, spec.data.fingerprint(), out)


def bind_data_to_postgres_ledger(spec: ExperimentSpec, budget: PrivacyBudget,
                                 out: Callable[[str], None] = print) -> None:
    """For a PostgreSQL ledger: create it (the settings the ledger actor uses) and bind the
    data source's fingerprint to it in the registry (:func:`raydp_hpo.ledger.pg.register_dataset`).
    Data already bound to another ledger is refused (:class:`LedgerMismatchError`) before
    anything is charged: a second budget for registered data is an administrator's act.
    Nothing to do for a journal file."""
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.ledger.filter import Adaptivity, CurveCheck, PrivacyLedger
    from raydp_hpo.ledger.pg import is_postgres_uri, register_dataset

    uri = spec.ledger_journal()
    if not isinstance(uri, str) or not is_postgres_uri(uri):
        return
    PrivacyLedger(budget, uri, adaptivity=Adaptivity.ADAPTIVE, accountant=Accountant.RDP,
                  curve_check=CurveCheck.ON_DEMAND).close()
    register_dataset(uri, spec.data.fingerprint())
    out(f"[raydp-hpo] data {spec.data.fingerprint()} is bound to ledger {uri}")


def _require_earlier_charges(spec: ExperimentSpec, run_dir: Path) -> None:
    """A resume attaches to ``spec.ledger_journal()``: refuse unless that journal holds the
    experiment's earlier charges (:func:`raydp_hpo.tune.tuner.require_earlier_charges`);
    the message also names the journal ``run.json`` recorded, when it is another."""
    import json

    from raydp_hpo.errors import LedgerMismatchError
    from raydp_hpo.tune.tuner import require_earlier_charges

    journal = spec.ledger_journal()
    try:
        require_earlier_charges(journal, spec.experiment)
    except LedgerMismatchError as exc:
        try:
            recorded = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get(
                "ledger_journal")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded and str(recorded) != str(journal) and (
                isinstance(journal, str) or Path(recorded) != journal):
            raise LedgerMismatchError(
                f"{exc} (its run.json records that it charged the journal {recorded}: "
                "resume with the storage_path / ledger it started with)") from None
        raise


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
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.ledger.actor import get_ledger
    from raydp_hpo.ledger.filter import Adaptivity
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_rule
    from raydp_hpo.tune.publish import find_release
    from raydp_hpo.tune.tuner import DPTuner

    run_dir = spec.run_dir
    if find_release(run_dir) is not None:
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
    if resume:  # before Ray and the ledger actor, which would create a fresh journal
        _require_earlier_charges(spec, run_dir)
    checked = preflight(spec)  # every check, all errors at once: before Ray and any ledger
    data = checked.data
    train_size, val_size = spec.data.public_sizes()
    ledger_budget = _dataset_ledger_budget(spec, out)
    warn_if_ephemeral(spec.storage_path, "storage_path", out)
    bind_data_to_postgres_ledger(spec, ledger_budget, out)  # before Ray and any charge
    if isinstance(spec.ledger_journal(), Path):  # a PostgreSQL ledger is no local file
        warn_if_ephemeral(spec.ledger_journal(), "ledger journal", out)
    start_ray()
    import ray

    check_resources(spec, ray.cluster_resources(), "the Ray cluster")  # before any charge
    # a named ledger halts on the adaptive RDP filter (any charge may meet it); the dataset's
    # own composes whole experiments (raydp_hpo.tune.dataset_ledger), or keeps its rule
    adaptivity, accountant = (
        (Adaptivity.ADAPTIVE, Accountant.RDP) if spec.ledger is not None
        else dataset_ledger_rule(Path(spec.ledger_journal()))  # a dataset's own: a file
    )
    ledger = get_ledger(
        spec.ledger_name,
        ledger_budget,
        spec.ledger_journal(),
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        adaptivity=adaptivity,
        accountant=accountant,
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
        sizes_public=spec.data.sizes_public,
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
        "ledger_journal": str(journal),  # a resume proves its charges are there
        "charge_prefix": f"{spec.experiment}/",
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
    # DPTuner wrote the release into run_dir/public/ (release.json, certificate.json, model)
    errors = sum(1 for t in result.private_trials if t.get("error"))
    meta.update(
        status="budget_exhausted" if result.budget_exhausted else "finished",
        finished=time.time(),
        selected=result.hyperparameters is not None,
    )
    atomic_write_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir=run_dir, result=result, journal=journal, trial_errors=errors,
                      test_split=len(data.test) > 0)


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
    if r.hyperparameters is not None and not outcome.test_split:
        lines.append("Evaluation: there is no test split (data.test_fraction: 0), so the "
                     "released model was not evaluated; set data.test_fraction (or "
                     "data.test_uri) for a test accuracy")
    elif r.hyperparameters is not None:
        acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
        lines.append("Evaluation (NOT covered by the certificate: computed without noise on the "
                     "private test split; publish it only if that split is public)")
        lines.append(f"  test accuracy      {acc}")
    lines.append(f"Publish: {outcome.run_dir / 'public'} (release.json, certificate.json"
                 + (", released_model.pt" if r.model_path is not None else "")
                 + f"), as it is, or: raydp-hpo publish {outcome.run_dir} OUT_DIR")
    lines.append(f"Run dir: {outcome.run_dir} — PRIVATE except public/ (never publish the Tune "
                 "dir tune/, the ledger journal, audit.jsonl, evaluation_private.json, run.json, "
                 "the progress lines above)")
    return "\n".join(lines)
