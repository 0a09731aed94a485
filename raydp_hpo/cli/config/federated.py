"""The federated experiment file (``raydp-hpo federated --config FEDERATED.yaml``):
:class:`FederatedFile` and its blocks. What it runs with is the library's own:
:meth:`FederatedFile.settings` is a :class:`raydp_hpo.trainables.federated.FedSettings`
(with its :class:`~raydp_hpo.trainables.federated.ClientDP`), the optimizer a
:class:`~raydp_hpo.trainables.federated.ClientOptimizer`, the client-level budget a
:class:`~raydp_hpo.accounting.budget.PrivacyBudget`. The file is checked in full before any
data is loaded, the model name and kwargs included (the trainer builds the model once).

The file, with what each key means (``?`` = optional)::

    kind: federated                  # marks the file as a federated experiment
    experiment: fed-digits           # name of the run dir
    seed?: 0                         # reproducibility seed: initial model, client batches
    data:
      source: digits                 # digits | mnist1d
      size?: 2000                    # mnist1d: number of samples (default 5000)
      generator_seed?: 42            # mnist1d: generator seed
      test_fraction?: 0.2
      split_seed?: 0                 # the train/test split
    clients:
      count: 5                       # every client takes part in every round (C = 1)
      random_fraction?: 0.0          # p: share of records dealt at random (0 pathological,
                                     # 1 iid); see raydp_hpo.trainables.federated.pathological_split
      partition_seed?: 0
    model:
      name: mlp
      kwargs?: {hidden: [64]}
    training:
      optimizer: adadp               # adadp | sgd | adam
      lr?: 0.1                       # SGD/Adam rate, ADADP's initial η₀
      rounds?: 10
      local_epochs?: 1
      batch_size?: 10
      tol?: 0.1                      # ADADP only (the paper's non-private value)
      alpha_min?: 0.9
      alpha_max?: 1.1
    ray?: true                       # clients as Ray actors (RAY_ADDRESS or a local Ray)
    cpus_per_client?: 1
    storage_path?: ~/raydp_results   # default ~/raydp_results, or $RAYDP_HPO_STORAGE
    privacy?:                        # client-level DP (omit: not private)
      clip_norm: 1.0                 # C: each client's model update is clipped to ℓ₂ norm C
      noise_multiplier: 1.0          # σ: N(0, σ²C²) on the sum of the clipped updates
      budget: {epsilon: 8.0, delta: 1.0e-5}   # the client-level ledger's budget
      journal?: path                 # default <run dir>/client_ledger.journal
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raydp_hpo._validation import did_you_mean
from raydp_hpo.cli.config._base import (
    Bool,
    Budget,
    BudgetModel,
    Int,
    NonNegativeInt,
    NumberJson,
    Positive,
    PositiveInt,
    Strict,
    Text,
    fail,
    integer,
    interval,
    lazy_enum,
    number,
)
from raydp_hpo.cli.config.errors import FileKind
from raydp_hpo.cli.config.experiment import (
    EXPERIMENT_NAME_PATTERN,
    RunDir,
    StoragePath,
    experiment_name,
)
from raydp_hpo.cli.config.search import MODEL_PATH_PATTERN, model_names
from raydp_hpo.errors import ConfigError, RayDPHPOError

__all__ = ["FederatedFile", "FedDataModel", "ClientsModel", "FedModelModel",
           "FedTrainingModel", "FedPrivacyModel", "FEDERATED", "FED_SOURCES"]

FED_SOURCES = ("digits", "mnist1d")
_FEATURE_SHAPES = {"digits": (1, 8, 8), "mnist1d": (40,)}  # raydp_hpo.trainables.data's loaders
_NUM_CLASSES = 10
_OPTIMIZERS = ("adadp", "sgd", "adam")


def _one_of(options: tuple[str, ...]) -> Any:
    def check(value: Any) -> Any:
        if value not in options:
            fail(f"must be one of {', '.join(options)}, got {value!r}"
                 f"{did_you_mean(str(value), options)}")
        return value

    return BeforeValidator(check)


# numbers in (0, 1) / [0, 1] with their own message ("must be in (0, 1)"); the bounds in
# Field are the JSON Schema's (the before-validator has already refused what they refuse)
OpenFraction = Annotated[float, Field(gt=0, lt=1), BeforeValidator(interval(open_ends=True)),
                         NumberJson]
ClosedFraction = Annotated[float, Field(ge=0, le=1),
                           BeforeValidator(interval(open_ends=False)), NumberJson]


class FedDataModel(Strict):
    """A built-in dataset, split once into the clients' training data and the server's test
    split."""

    # size and generator_seed are MNIST-1D's (the parser's _mnist1d_only, for editors)
    model_config = ConfigDict(json_schema_extra={"if": {
        "properties": {"source": {"const": "digits"}}, "required": ["source"]},
        "then": {"not": {"anyOf": [{"required": ["size"]}, {"required": ["generator_seed"]}]}}})

    source: Annotated[Literal["digits", "mnist1d"], _one_of(FED_SOURCES)]
    size: Annotated[int, Field(ge=10), BeforeValidator(integer(10))] = Field(
        5000, description="mnist1d: number of samples")
    generator_seed: Int = Field(
        42, description="mnist1d: generator seed")
    test_fraction: OpenFraction = Field(0.2, description="the server's held-out test split")
    split_seed: NonNegativeInt = Field(0, description="the train/test split")

    @model_validator(mode="after")
    def _mnist1d_only(self) -> FedDataModel:
        if self.source != "mnist1d":
            for key in ("size", "generator_seed"):
                if key in self.model_fields_set:
                    fail(f"{{path}}.{key} only applies to data.source: mnist1d")
        return self


class ClientsModel(Strict):
    """Every client takes part in every round (C = 1)."""

    # at most _NUM_CLASSES: FederatedFile._clients_have_classes says why; the bound published
    count: PositiveInt = Field(description=f"number of clients (at most {_NUM_CLASSES}: the "
                               "pathological split gives each client its own classes)",
                               json_schema_extra={"maximum": _NUM_CLASSES})
    random_fraction: ClosedFraction = Field(
        0.0, description="share of records dealt at random (0 pathological, 1 iid)")
    partition_seed: NonNegativeInt = 0


class FedModelModel(Strict):
    """The model every client trains (:func:`raydp_hpo.trainables.models.build_model`)."""

    # refused by the trainer's own build_model (FederatedFile._trainer_accepts); the names
    # published for editors
    name: Text = Field(description="a built-in model name or package.module:Class",
                       json_schema_extra=lazy_enum(model_names, or_pattern=MODEL_PATH_PATTERN))
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="keyword arguments of the model")


class FedTrainingModel(Strict):
    """Keyword arguments of :class:`raydp_hpo.trainables.federated.FedSettings`."""

    optimizer: Annotated[Literal["adadp", "sgd", "adam"], _one_of(_OPTIMIZERS)]
    lr: Positive = Field(0.1, description="SGD/Adam rate, ADADP's initial η₀")
    rounds: PositiveInt = 10
    local_epochs: PositiveInt = 1
    batch_size: PositiveInt = 10
    tol: Positive = Field(0.1, description="ADADP only (the paper's non-private value)")
    alpha_min: OpenFraction = 0.9
    alpha_max: Annotated[float, Field(gt=1), BeforeValidator(number), NumberJson] = 1.1


class FedPrivacyModel(Strict):
    """Client-level DP: clip norm C, noise multiplier σ, the client-level ledger's budget."""

    clip_norm: Positive = Field(description="C: each client's update is clipped to ℓ₂ norm C")
    noise_multiplier: Positive = Field(description="σ: N(0, σ²C²) on the sum of the clipped "
                                       "updates")
    budget: Budget = Field(description="the client-level ledger's budget")
    journal: Text | None = Field(None, description="default <run dir>/client_ledger.journal")


def _kind(value: Any) -> Any:
    if value != "federated":
        fail(f"must be 'federated', got {value!r} (experiment files without kind run with "
             "`raydp-hpo run`)")
    return value


class FederatedFile(RunDir, Strict):
    """A federated experiment file, validated: what
    :func:`raydp_hpo.cli.federated_experiment.run_federated_experiment` consumes."""

    model_config = ConfigDict(title="raydp-hpo federated experiment file")

    kind: Annotated[Literal["federated"], BeforeValidator(_kind)] = Field(
        description="marks the file as a federated experiment")
    experiment: Annotated[Text, AfterValidator(experiment_name)] = Field(
        description="name of the run dir", json_schema_extra={"pattern": EXPERIMENT_NAME_PATTERN})
    seed: NonNegativeInt = Field(0, description="reproducibility seed: initial model, client "
                                 "batches (not a secret; DP noise comes from OS entropy)")
    data: FedDataModel
    clients: ClientsModel
    model: FedModelModel
    training: FedTrainingModel
    ray: Bool = Field(True, description="clients as Ray actors (RAY_ADDRESS or a local Ray)")
    cpus_per_client: Positive = 1.0
    storage_path: StoragePath = Field(
        None, validate_default=True, description="default ~/raydp_results, or "
        "$RAYDP_HPO_STORAGE", json_schema_extra={"not": {"pattern": "://"}})
    privacy: FedPrivacyModel | None = Field(None, description="client-level DP (omit: not "
                                            "private)")

    @field_validator("clients")
    @classmethod
    def _clients_have_classes(cls, clients: ClientsModel, info: ValidationInfo) -> ClientsModel:
        data = info.data.get("data")
        if clients.count > _NUM_CLASSES and data is not None:
            fail(f"{{path}}.count={clients.count} exceeds the {_NUM_CLASSES} classes of "
                 f"{data.source}: the pathological split gives each client its own classes; "
                 f"use at most {_NUM_CLASSES} clients")
        return clients

    @model_validator(mode="after")
    def _trainer_accepts(self) -> FederatedFile:
        """The trainer's own checks (model name and kwargs, settings), still before any data."""
        from raydp_hpo.trainables.models import build_model

        try:
            self.settings()
            build_model(self.model.name, _FEATURE_SHAPES[self.data.source], _NUM_CLASSES,
                        **self.model.kwargs)
        except (RayDPHPOError, TypeError, ValueError) as exc:
            fail(str(exc) if isinstance(exc, ConfigError) else f"model / training: {exc}")
        return self

    # ---- what the run reads off the file (and storage, run_dir: RunDir)

    @property
    def charge_id(self) -> str:
        return f"{self.experiment}/federated"

    @property
    def journal(self) -> Path:
        if self.privacy is not None and self.privacy.journal is not None:
            return Path(self.privacy.journal)
        return self.run_dir / "client_ledger.journal"

    def settings(self) -> Any:
        """The run's :class:`raydp_hpo.trainables.federated.FedSettings`."""
        from raydp_hpo.trainables.federated import ClientDP, ClientOptimizer, FedSettings

        t = self.training
        dp = None if self.privacy is None else ClientDP(self.privacy.clip_norm,
                                                        self.privacy.noise_multiplier,
                                                        num_clients=self.clients.count)
        return FedSettings(
            optimizer=ClientOptimizer(t.optimizer), lr=t.lr, rounds=t.rounds,
            local_epochs=t.local_epochs, batch_size=t.batch_size, tol=t.tol,
            alpha_min=t.alpha_min, alpha_max=t.alpha_max, model=self.model.name,
            model_kwargs=dict(self.model.kwargs), client_dp=dp,
        )


#: How federated experiment files are validated and their errors named.
FEDERATED: FileKind[FederatedFile] = FileKind(
    model=FederatedFile,
    root="the federated experiment file",
    sections={
        (): FederatedFile,
        ("data",): FedDataModel,
        ("clients",): ClientsModel,
        ("model",): FedModelModel,
        ("training",): FedTrainingModel,
        ("privacy",): FedPrivacyModel,
        ("privacy", "budget"): BudgetModel,
    },
)
