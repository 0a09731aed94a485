"""One config system: the pydantic models that validate every config file, and are what the
code that runs it consumes.

What is what:

* **The models are the single source of truth.** An experiment file
  (:class:`~.experiment.ExperimentFile`, ``raydp-hpo run``) and a federated experiment file
  (:class:`~.federated.FederatedFile`, ``raydp-hpo federated --config``) are validated by
  these frozen models (``extra="forbid"``: an unknown key is an error with a "did you
  mean"), and the validated model *is* the spec: :mod:`raydp_hpo.cli.experiment` and
  :mod:`raydp_hpo.cli.federated_experiment` run it as it is; there is no second hierarchy of
  spec classes. Validation fills in what the run reads: defaults, an absolute
  ``storage_path``, a Parquet split read from its own file taking fraction 0 of ``uri``, and
  ``search.preset`` put into ``search.settings`` (the searcher's keyword arguments).
* **Where the library has a runtime spec, a field holds it**: a budget is a
  :class:`~raydp_hpo.accounting.budget.PrivacyBudget` (validated as
  :class:`~._base.BudgetModel`, its keys and messages), and
  :meth:`FederatedFile.settings() <.federated.FederatedFile.settings>` is the trainer's own
  :class:`~raydp_hpo.trainables.federated.FedSettings` (the optimizer is a string in the
  file model and the trainer's enum there: the enum's module imports torch, which validating
  a file does not). The search's settings stay a mapping:
  :func:`raydp_hpo.searchers.make_searcher` checks them when the searcher is built (the run's
  preflight), as the data and the trainable are checked against the loaded data.
* **Errors**: :class:`~.errors.FileKind` turns pydantic's errors into one
  :class:`~raydp_hpo.errors.ConfigError` listing every problem with its dotted path.
* **JSON Schema**: :func:`json_schema` (``raydp-hpo schema [--kind ...]``) is generated from
  the same models, so it carries every bound and enum; what JSON Schema cannot express
  (non-finite numbers, one field against another) is listed in the schema tests.

Modules by concern: :mod:`._base` (scalar types, budget, YAML), :mod:`.errors`, :mod:`.data`,
:mod:`.search` (model, search, space), :mod:`.experiment`, :mod:`.federated`. Every file is
read by :func:`load_yaml` (duplicate keys refused).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic.json_schema import models_json_schema

from raydp_hpo.cli.config._base import load_yaml
from raydp_hpo.cli.config.errors import FileKind, config_error
from raydp_hpo.cli.config.experiment import EXPERIMENT, ExperimentFile, run_dir_of
from raydp_hpo.cli.config.federated import FEDERATED, FederatedFile

__all__ = [
    "ExperimentFile",
    "FederatedFile",
    "FileKind",
    "EXPERIMENT",
    "FEDERATED",
    "SCHEMA_KINDS",
    "config_error",
    "json_schema",
    "load_yaml",
    "run_dir_of",
    "validate_experiment_file",
    "validate_federated_file",
]

_DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: ``raydp-hpo schema --kind``: one file kind, or ``any`` (``kind: federated`` picks).
SCHEMA_KINDS = ("experiment", "federated", "any")


def validate_experiment_file(raw: Any, what: str = "the experiment") -> ExperimentFile:
    """``raw`` (a parsed YAML mapping) as a validated :class:`ExperimentFile`, else one
    :class:`~raydp_hpo.errors.ConfigError` naming every problem (``what`` names the file)."""
    return EXPERIMENT.validate(raw, what)


def validate_federated_file(raw: Any, what: str = "the federated experiment") -> FederatedFile:
    """``raw`` as a validated :class:`FederatedFile` (errors as above)."""
    return FEDERATED.validate(raw, what)


def json_schema(kind: Literal["experiment", "federated", "any"] = "experiment"
                ) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one kind of config file, for editors; ``any``: both,
    a union discriminated by ``kind`` (a file with ``kind`` is a federated experiment file,
    one without an experiment file)."""
    if kind == "experiment":
        return {"$schema": _DRAFT, **ExperimentFile.model_json_schema(mode="validation")}
    if kind == "federated":
        return {"$schema": _DRAFT, **FederatedFile.model_json_schema(mode="validation")}
    if kind != "any":
        raise ValueError(f"kind must be one of {', '.join(SCHEMA_KINDS)}, got {kind!r}")
    refs, top = models_json_schema([(ExperimentFile, "validation"),
                                    (FederatedFile, "validation")])
    return {
        "$schema": _DRAFT,
        "title": "raydp-hpo config file (experiment or federated experiment)",
        "if": {"type": "object", "required": ["kind"]},
        "then": refs[(FederatedFile, "validation")],
        "else": refs[(ExperimentFile, "validation")],
        **top,
    }
