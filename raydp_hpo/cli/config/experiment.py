"""The experiment file (``raydp-hpo run EXPERIMENT.yaml``): :class:`ExperimentFile`, its
``resources:`` and ``ledger:`` blocks, and what the run reads off it (run dir, ledger name and
journal, the JSON kept in ``run.json``). The other blocks are in :mod:`.data` and
:mod:`.search`; the budget is the library's :class:`~raydp_hpo.accounting.budget.PrivacyBudget`.

The file, with what each key means (``?`` = optional)::

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
    search?:                         # default: {algorithm: auto}
      algorithm?: auto               # default auto: chosen from the measured table by the
                                     # budget, the space and settings compute_limit (default
                                     # 25 one-shot runs) / max_gradient_evaluations / max_trials;
                                     # or a raydp_hpo.searchers.SearchAlgorithm value
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
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from raydp_hpo._storage import default_storage_path
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.config._base import (
    MESSAGE_TYPE,
    Bool,
    Budget,
    BudgetModel,
    NonNegative,
    NonNegativeInt,
    OrName,
    Positive,
    Strict,
    Text,
    fail,
    name_shorthand,
)
from raydp_hpo.cli.config.data import COMMON_DATA_KEYS, DATA_MODELS, DataModel, ParquetData
from raydp_hpo.cli.config.errors import FileKind
from raydp_hpo.cli.config.search import ModelModel, SearchModel, Space

__all__ = ["ExperimentFile", "LedgerModel", "ResourcesModel", "EXPERIMENT", "run_dir_of",
           "EXPERIMENT_NAME_PATTERN", "experiment_name", "storage_path", "RunDir",
           "StoragePath"]


class ResourcesModel(Strict):
    """Per-trial resources."""

    cpu: NonNegative = 1.0
    gpu: NonNegative = 0.0
    memory: NonNegative | None = Field(None, description="bytes")

    def as_dict(self) -> dict[str, float]:
        """Tune's per-trial resources (``memory`` only when set)."""
        out = {"cpu": self.cpu, "gpu": self.gpu}
        return out if self.memory is None else {**out, "memory": self.memory}


class LedgerModel(Strict):
    """A shared dataset-level ledger actor (every experiment on the dataset names it)."""

    name: Text
    budget: Budget | None = Field(None, description="the dataset's total; default: budget")
    journal: Text | None = Field(None, description="default <storage_path>/ledgers/<name>.journal")
    uri: Text | None = Field(None, description="a PostgreSQL ledger, postgresql://host:port/db"
                             "?ledger=NAME, instead of a journal file; credentials come from "
                             "libpq (PGUSER, PGPASSWORD, ~/.pgpass, PGSERVICE), never this file")
    namespace: Text = "raydp_hpo"

    @model_validator(mode="after")
    def _one_store(self) -> LedgerModel:
        from raydp_hpo.ledger.pg import is_postgres_uri, parse_uri

        if self.journal is not None and self.uri is not None:
            fail("{path}: give ledger.journal (a file) or ledger.uri (PostgreSQL), not both")
        for key in ("journal", "uri"):
            value = getattr(self, key)
            try:  # a near-miss scheme (postgresql+psycopg://) is an error, never a file path
                pg = value is not None and is_postgres_uri(value)
            except ValueError as exc:
                fail(f"{{path}}.{key}: {exc}")
            if key == "uri" and value is not None and not pg:
                fail(f"{{path}}.uri {value!r} is not a PostgreSQL ledger URI; use "
                     "postgresql://host:port/db?ledger=NAME (or ledger.journal for a file)")
            if pg:
                try:
                    parse_uri(value)
                except ValueError as exc:
                    fail(f"{{path}}.{key}: {exc}")
        return self


#: What :func:`experiment_name` accepts, as a JSON Schema pattern: no leading '.', no slash.
EXPERIMENT_NAME_PATTERN = r"^[^./\\][^/\\]*$"


def experiment_name(name: str) -> str:
    """A run dir name: no '/', no leading '.' (so never '..')."""
    if name.strip(".") == "" or any(c in name for c in "/\\") or name.startswith("."):
        fail(f"{{path}} must be a plain name (no '/', no leading '.'), got {name!r}: it names "
             "the run directory inside storage_path")
    return name


def storage_path(path: str | None) -> str:
    """A storage path, absolute (relative: to the working dir; ``None``: ~/raydp_results or
    $RAYDP_HPO_STORAGE, read when the file is validated)."""
    if path is None:
        return str(default_storage_path())
    if "://" in path:
        fail(f"{{path}} {path!r}: use a mounted shared file system path (NFS, a fuse-mounted "
             "bucket); the ledger journal needs POSIX append + fsync")
    return str(Path(path).expanduser().resolve())


def run_dir_of(storage: str, experiment: str) -> Path:
    """``<storage>/<experiment>``, the experiment's run dir."""
    from raydp_hpo.tune.tuner import _safe_name

    return Path(storage).expanduser().resolve() / _safe_name(experiment)


_SEED_MESSAGE = (
    "the key 'seed' is no longer accepted: it made the searcher's secrets public. Use "
    "'split_seed' (public: makes the train/val/test split reproducible) and omit "
    "'secret_seed' so every secret comes from OS entropy (set secret_seed only to "
    "reproduce a run, and keep the file as secret as the data)"
)

#: A storage path field: absolute once validated; absent or null means the default.
StoragePath = Annotated[Text | None, AfterValidator(storage_path)]


class RunDir:
    """The run dir of a file with ``experiment`` and ``storage_path`` (a mixin of the file
    models, which declare both fields)."""

    if TYPE_CHECKING:
        experiment: str
        storage_path: str | None

    @property
    def storage(self) -> str:
        """The absolute storage path (the validated ``storage_path``)."""
        assert self.storage_path is not None  # filled in by validation
        return self.storage_path

    @property
    def run_dir(self) -> Path:
        """``<storage_path>/<experiment>``."""
        return run_dir_of(self.storage, self.experiment)


class ExperimentFile(RunDir, Strict):
    """An experiment file (``raydp-hpo run EXPERIMENT.yaml``), validated: what the run
    consumes (:func:`raydp_hpo.cli.experiment.run_experiment`)."""

    model_config = ConfigDict(title="raydp-hpo experiment file")

    # the validators give the messages; json_schema_extra publishes the same rules
    experiment: Annotated[Text, AfterValidator(experiment_name)] = Field(
        description="name: run dir <storage_path>/<experiment>, charge-id prefix",
        json_schema_extra={"pattern": EXPERIMENT_NAME_PATTERN})
    split_seed: NonNegativeInt = Field(
        0, description="PUBLIC: makes the train/val/test split reproducible")
    secret_seed: NonNegativeInt | None = Field(
        None, repr=False, exclude=True,
        description="SECRET; omit (or null) for OS entropy. Only to reproduce a run: the file "
                    "then must be kept like the data")
    data: DataModel
    model: Annotated[ModelModel, BeforeValidator(name_shorthand), OrName]
    search: SearchModel = Field(default_factory=lambda: SearchModel.model_validate({}))
    space: Space
    budget: Budget
    test_accuracy_epsilon: Positive | None = Field(
        None, description="release a DP test accuracy (Laplace, its own charge, taken from the "
                          "budget); omit: a noiseless one, NOT covered by the certificate")
    resources: ResourcesModel = Field(default_factory=lambda: ResourcesModel.model_validate({}))
    storage_path: StoragePath = Field(
        None, validate_default=True,
        description="local dir or NFS mount shared by every node; default ~/raydp_results, or "
                    "$RAYDP_HPO_STORAGE when set", json_schema_extra={"not": {"pattern": "://"}})
    ledger: Annotated[LedgerModel, BeforeValidator(name_shorthand), OrName] | None = Field(
        None, description="omit: the dataset's own ledger")
    tensorboard: Bool = Field(False, description="also write Tune's per-trial TensorBoard files")

    @field_validator("test_accuracy_epsilon")
    @classmethod
    def _within_budget(cls, value: float | None, info: ValidationInfo) -> float | None:
        budget = info.data.get("budget")
        if value is not None and budget is not None and not 0 < value < budget.epsilon:
            fail(f"{{path}}={value:g} must be in (0, budget.epsilon={budget.epsilon:g}): it is "
                 "taken from the experiment's budget")
        data = info.data.get("data")
        if value is not None and data is not None and data.test_fraction == 0 and (
            getattr(data, "test_uri", None) is None
        ):
            fail(f"{{path}}={value:g} releases a test accuracy, but there is no test split "
                 "(data.test_fraction: 0); set data.test_fraction (or data.test_uri), or drop "
                 "{path}")
        if value is not None and isinstance(data, ParquetData) and not data.sizes_public and (
            data.declared_test_size is None
        ):
            fail("{path}: a DP test accuracy is the noisy correct count over the test size, "
                 "and a Parquet table's test size is private: declare data.declared_test_size, "
                 "or set data.sizes_public: true to accept the realised size as public")
        return value

    @field_validator("ledger")
    @classmethod
    def _one_delta(cls, ledger: LedgerModel | None, info: ValidationInfo) -> LedgerModel | None:
        budget = info.data.get("budget")
        if ledger is not None and ledger.budget is not None and budget is not None and (
            ledger.budget.delta != budget.delta
        ):
            raise PydanticCustomError(MESSAGE_TYPE, "{message}", {
                "message": f"{{path}}.budget.delta={ledger.budget.delta:g} differs from "
                           f"budget.delta={budget.delta:g}; a shared ledger states ε at one δ",
                "at": "budget.delta",
            })
        return ledger

    # ---- what the run reads off the file (and storage, run_dir: RunDir)

    @property
    def ledger_name(self) -> str:
        """The ledger this experiment charges: the named one, else the dataset's default."""
        return self.ledger.name if self.ledger is not None else self.data.ledger_name()

    @property
    def ledger_budget(self) -> PrivacyBudget:
        """A named ledger's total: its ``budget``, else the experiment's."""
        if self.ledger is not None and self.ledger.budget is not None:
            return self.ledger.budget
        return self.budget

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
        return (Path(self.storage) / "ledgers" / f"{self.ledger_name}.journal").resolve()

    def to_dict(self) -> dict[str, Any]:
        """The file as JSON-able data, for run.json: the secret seed is never included."""
        out = self.model_dump(mode="json")  # secret_seed: exclude=True
        out["secret_seed_given"] = self.secret_seed is not None
        return out


#: How experiment files are validated and their errors named.
EXPERIMENT: FileKind[ExperimentFile] = FileKind(
    model=ExperimentFile,
    root="the experiment file",
    sections={
        (): ExperimentFile,
        ("model",): ModelModel,
        ("search",): SearchModel,
        ("budget",): BudgetModel,
        ("resources",): ResourcesModel,
        ("ledger",): LedgerModel,
        ("ledger", "budget"): BudgetModel,
        **{("data", source): model for source, model in DATA_MODELS.items()},
    },
    data_models=DATA_MODELS,
    common_data_keys=COMMON_DATA_KEYS,
    removed_keys={"seed": _SEED_MESSAGE},
)
