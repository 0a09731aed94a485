"""The experiment file's schema: pydantic v2 models that parse and validate it.

:func:`validate_experiment_file` checks a parsed YAML mapping against :class:`ExperimentFile`
(``extra="forbid"`` and frozen everywhere; ``data`` a union discriminated by ``data.source``)
and turns pydantic's :class:`~pydantic.ValidationError` into **one**
:class:`~raydp_hpo.errors.ConfigError` that lists every problem with its dotted path
(``budget.delta``, ``space.lr``, ``data.uri``) and, for an unknown key or value, the closest
valid one ("did you mean"). :mod:`raydp_hpo.cli.experiment` turns the validated model into its
frozen spec dataclasses and runs the checks that need the data, the trainable or the searcher.

:func:`experiment_json_schema` is the same schema as JSON Schema (``raydp-hpo schema``), for
editors that complete and check YAML files (e.g. a ``# yaml-language-server: $schema=FILE``
line at the top of an experiment file).

Messages: a validator raises :func:`_fail` with a message in which ``{path}`` stands for the
dotted path of the value (prefixed when absent), so a message reads the same wherever the
model is nested (``budget`` and ``ledger.budget``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from raydp_hpo._validation import did_you_mean
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import ConfigError
from raydp_hpo.trainables.data import canonical_uri

__all__ = [
    "ExperimentFile",
    "Domain",
    "DATA_SOURCES",
    "DOMAIN_KINDS",
    "POINT_DOMAIN_KINDS",
    "RESERVED_SPACE_KEYS",
    "validate_experiment_file",
    "experiment_json_schema",
    "parse_domain",
    "domain_of",
    "config_error",
    "canonical_uri",
]

DATA_SOURCES = ("mnist1d", "digits", "parquet")
DOMAIN_KINDS = (
    "uniform", "loguniform", "quniform", "qloguniform", "randint", "choice", "grid", "randn",
)
#: Continuous domains a grid / SVT search can discretise with ``points: N``.
POINT_DOMAIN_KINDS = ("uniform", "loguniform")
#: Space keys the experiment file sets elsewhere (``model:``) or that the privacy contract owns.
RESERVED_SPACE_KEYS = ("model", "model_kwargs", "raydp")

_FILE = "the experiment file"
_MESSAGE_TYPE = "raydp_config"


# ------------------------------------------------------------------------------ messages


def _fail(message: str) -> NoReturn:
    """Reject a value; ``{path}`` in ``message`` is replaced by the value's dotted path, and
    without it the path is put in front."""
    raise PydanticCustomError(_MESSAGE_TYPE, "{message}", {"message": message})


def _render(message: str, path: str) -> str:
    where = path or _FILE
    return message.replace("{path}", where) if "{path}" in message else f"{where} {message}"


def config_error(problems: Iterable[tuple[str, str]], what: str) -> ConfigError:
    """One :class:`ConfigError` for every (path, message): the message alone when there is one
    problem, else a numbered list under ``"N errors in <what>:"``."""
    items = tuple(problems)
    if len(items) == 1:
        return ConfigError(items[0][1], items)
    lines = "\n".join(f"  - {path or '(file)'}: {message}" for path, message in items)
    return ConfigError(f"{len(items)} errors in {what}:\n{lines}", items)


# ------------------------------------------------------------------------------ scalar types


def _number(value: Any) -> float:
    # PyYAML reads "1e-5" (no dot) as a string: accept numeric strings.
    if isinstance(value, bool):
        _fail(f"must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            _fail(f"must be a number, got {value!r}")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(f"must be a finite number, got {value!r}")
    return float(value)


def _integer(minimum: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            _fail(f"must be >= {minimum}, got {value!r}")
        return int(value)

    return check


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        _fail(f"must be a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(f"must be true or false, got {value!r}")
    return value


#: A numeric string, as PyYAML reads ``1e-5`` (no dot); a leading sign only where allowed.
_NUMERIC_STRING = r"^{sign}(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"


#: pydantic's numeric constraints and their JSON Schema keywords.
_BOUND_KEYWORDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum",
                   "lt": "exclusiveMaximum"}
_BOUND_WORDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="),
                "less_than": ("lt", "<"), "less_than_equal": ("le", "<=")}


def _bounds_of(schema: Mapping[str, Any]) -> dict[str, float]:
    """The ge/gt/le/lt constraints of a (validator-wrapped) float core schema."""
    while schema.get("type", "").startswith("function-") and "schema" in schema:
        schema = schema["schema"]
    return {key: schema[key] for key in _BOUND_KEYWORDS if key in schema}


def number_json(bounds: Mapping[str, float] | None = None) -> dict[str, Any]:
    """JSON Schema of a number within ``bounds`` (pydantic's ge/gt/le/lt), or a numeric
    string (how PyYAML reads ``1e-5``; its value is checked by the parser only)."""
    bounds = dict(bounds or {})
    number: dict[str, Any] = {"type": "number"}
    number.update({_BOUND_KEYWORDS[key]: value for key, value in bounds.items()})
    low = bounds.get("ge", bounds.get("gt"))
    sign = "[-+]?" if low is None or low < 0 else "[+]?"
    return {"anyOf": [number, {"type": "string", "pattern": _NUMERIC_STRING.format(sign=sign)}]}


class _NumberJson:
    """JSON Schema of a number field: :func:`number_json` with the field's own constraints
    (``Field(gt=0)`` etc. on the float: one bound, enforced by the parser and published)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return number_json(_bounds_of(schema))


# Numbers (numeric strings accepted) within pydantic bounds, which both the parser and the
# JSON Schema carry: the bound is written once, in Field.
Number = Annotated[float, BeforeValidator(_number), _NumberJson]
NonNegative = Annotated[float, Field(ge=0), BeforeValidator(_number), _NumberJson]
Positive = Annotated[float, Field(gt=0), BeforeValidator(_number), _NumberJson]
Fraction = Annotated[float, Field(ge=0, lt=1), BeforeValidator(_number), _NumberJson]
Probability = Annotated[float, Field(gt=0, lt=1), BeforeValidator(_number), _NumberJson]
Int = Annotated[int, BeforeValidator(_integer())]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_integer(0))]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integer(1))]
Text = Annotated[str, Field(min_length=1), BeforeValidator(_string)]
Bool = Annotated[bool, BeforeValidator(_boolean)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _name_shorthand(value: Any) -> Any:
    """``model: mlp`` / ``ledger: shared`` stand for ``{name: ...}``."""
    return {"name": value} if isinstance(value, str) else value


class _OrName:
    """JSON Schema: the model, or a string standing for ``{name: <string>}``."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [handler(schema),
                          {"type": "string", "description": "shorthand for {name: <this>}"}]}


def _lazy_enum(values: Callable[[], Iterable[str]], *, or_pattern: str | None = None
               ) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` listing values known only after a heavy import (searchers, torch
    models): imported when the schema is generated, not when this module is."""

    def extra(schema: dict[str, Any]) -> None:
        options = sorted(values())
        if or_pattern is None:
            schema["enum"] = options
        else:
            schema["anyOf"] = [{"enum": options}, {"type": "string", "pattern": or_pattern}]

    return extra


# ------------------------------------------------------------------------------ budget


class BudgetModel(_Strict):
    """A total (ε, δ) budget."""

    epsilon: Positive = Field(description="ε > 0")
    delta: Probability = Field(description="δ in (0, 1), well below 1/n")

    @model_validator(mode="after")
    def _valid(self) -> BudgetModel:
        self.budget()
        return self

    def budget(self) -> PrivacyBudget:
        try:
            return PrivacyBudget(self.epsilon, self.delta)
        except ValueError as exc:
            _fail(f"{{path}}: {exc}")


# ------------------------------------------------------------------------------ data


_SIZE_HELP = ("PUBLIC size used by the accounting and normalisers; default: from the source's "
              "public size for built-ins; parquet: required unless data.sizes_public: true")


class _DataBase(_Strict):
    val_fraction: Fraction = Field(0.1, description="share of the records for validation")
    test_fraction: Fraction = Field(0.1, description="share of the records for testing")
    declared_train_size: PositiveInt | None = Field(None, description=_SIZE_HELP)
    declared_validation_size: PositiveInt | None = Field(None, description=_SIZE_HELP)
    declared_test_size: PositiveInt | None = Field(
        None, description=_SIZE_HELP + " (read with test_accuracy_epsilon only)")

    @model_validator(mode="after")
    def _fractions(self) -> _DataBase:
        if self.val_fraction + self.test_fraction >= 1.0:
            _fail("{path}.val_fraction + {path}.test_fraction must be < 1, got "
                  f"{self.val_fraction:g} + {self.test_fraction:g}")
        return self


class Mnist1dData(_DataBase):
    """MNIST-1D (Greydanus 2020), generated locally."""

    source: Literal["mnist1d"]
    size: Annotated[int, Field(ge=10), BeforeValidator(_integer(10))] | None = Field(
        None, description="number of samples (default 5000)")
    generator_seed: Int = Field(42, description="seed of the MNIST-1D generator")


class DigitsData(_DataBase):
    """scikit-learn's bundled digits (1,797 records)."""

    source: Literal["digits"]


def _columns(value: Any) -> Any:
    if not isinstance(value, list) or not value or not all(
        isinstance(c, str) and c for c in value
    ):
        _fail(f"must be a non-empty list of column names, got {value!r}")
    return value


#: JSON Schema: ``sizes_public`` is not ``true`` (absent or false).
_NOT_SIZES_PUBLIC: dict[str, Any] = {
    "not": {"properties": {"sizes_public": {"const": True}}, "required": ["sizes_public"]}}


class ParquetData(_DataBase):
    """Parquet from any URI pyarrow reads (local path, file://, s3://, gs://, hdfs://).

    ``val_uri`` / ``test_uri`` name separate files for the validation / test split instead of
    splitting them off ``uri`` (those files are private data too). The budget belongs to
    ``uri`` (its ledger); a validation or test file is accounted as part of that dataset."""

    # the declarations the parser requires (_declared, below), for editors that read the schema
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": _NOT_SIZES_PUBLIC, "then": {"required": ["declared_train_size", "num_classes"]}},
        {"if": {"allOf": [_NOT_SIZES_PUBLIC, {"anyOf": [
            {"required": ["val_uri"]},
            {"not": {"properties": {"val_fraction": {"const": 0}}, "required": ["val_fraction"]}},
        ]}]}, "then": {"required": ["declared_validation_size"]}},
    ]})

    source: Literal["parquet"]
    uri: Text = Field(description="the training data (split unless val_uri/test_uri are given)")
    val_uri: Text | None = Field(None, description="validation split from this file instead "
                                 "of val_fraction of uri (private data too)")
    test_uri: Text | None = Field(None, description="test split from this file instead of "
                                  "test_fraction of uri (private data too)")
    label_column: Text = Field(description="integer class ids")
    feature_columns: Annotated[list[str], BeforeValidator(_columns)] | None = Field(
        None, description="one numeric column per feature; default: every column but the label")
    feature_column: Text | None = Field(
        None, description="one list-valued column holding each row's feature vector")
    num_classes: Annotated[int, Field(ge=2), BeforeValidator(_integer(2))] | None = Field(
        None, description="the number of classes (PUBLIC: the model's output width); required "
                          "unless data.sizes_public: true, which reads max(label) + 1 off the data")
    sizes_public: Bool = Field(
        False, description="accept the realised split sizes and max(label) + 1 of the private "
                           "data as public where none is declared (the certificate lists them "
                           "as treated as public); default: declare them")

    @model_validator(mode="after")
    def _consistent(self) -> ParquetData:
        if self.feature_columns is not None and self.feature_column is not None:
            _fail("{path}: give at most one of data.feature_columns (one numeric column per "
                  "feature) or data.feature_column (a list column); without either, every "
                  "column but the label is a feature")
        for split, name in (("val", "validation"), ("test", "test")):
            if getattr(self, f"{split}_uri") is not None and (
                f"{split}_fraction" in self.model_fields_set
            ):
                _fail(f"{{path}}: data.{split}_uri is the {name} split, so data.{split}_fraction "
                      "(a share of data.uri) does not apply; drop one of them")
        self._disjoint()
        return self

    @model_validator(mode="after")
    def _declared(self) -> ParquetData:
        """A Parquet table's size and label range are private: the public quantities read off
        them (split sizes, number of classes) are declared, or accepted with sizes_public."""
        if self.sizes_public:
            return self
        missing = [name for name, needed in (
            ("declared_train_size", self.declared_train_size is None),
            ("declared_validation_size", self.declared_validation_size is None
             and (self.val_uri is not None or self.val_fraction > 0)),
            ("num_classes", self.num_classes is None),
        ) if needed]
        if missing:
            _fail("{path}: " + ", ".join(f"data.{m}" for m in missing) + " missing: the sizes and "
                  "labels of Parquet data are private (one record added or removed changes "
                  "them), so the normalisers and the model's output width need declared public "
                  "values; declare " + ", ".join(f"data.{m}" for m in missing) + ", or set "
                  "data.sizes_public: true to accept the realised values as public (the "
                  "certificate then lists them as treated as public). `raydp-hpo run --dry-run` "
                  "with sizes_public: true prints the realised values")
        return self
    def _disjoint(self) -> None:
        """Refuse a validation or test file that is the training file (or each other): the
        splits must be disjoint, or the selection and its evaluation see training records."""
        files = {"uri": self.uri, "val_uri": self.val_uri, "test_uri": self.test_uri}
        seen: dict[str, str] = {}
        for key, uri in files.items():
            if uri is None:
                continue
            canonical = canonical_uri(uri)
            if canonical in seen:
                other = seen[canonical]
                _fail(f"{{path}}.{key} {uri!r} is the same file as {{path}}.{other} "
                      f"{files[other]!r} ({canonical}): validation and test data must be "
                      f"disjoint from the training data and from each other. Name a separate "
                      f"file in {{path}}.{key}, or drop it to split "
                      f"{{path}}.{key.replace('_uri', '_fraction')} off {{path}}.uri")
            seen[canonical] = key


DataModel = Annotated[Mnist1dData | DigitsData | ParquetData, Field(discriminator="source")]
_DATA_MODELS: dict[str, type[_DataBase]] = {
    "mnist1d": Mnist1dData, "digits": DigitsData, "parquet": ParquetData,
}


# ------------------------------------------------------------------------------ model, search


def _model_name(name: str) -> str:
    from raydp_hpo.trainables.models import MODEL_NAMES

    if name not in MODEL_NAMES and ":" not in name:
        _fail(f"{{path}} {name!r} is not one of {', '.join(MODEL_NAMES)} and not a "
              f"'package.module:Class' path{did_you_mean(name, MODEL_NAMES)}")
    return name


def _model_names() -> Iterable[str]:
    from raydp_hpo.trainables.models import MODEL_NAMES

    return MODEL_NAMES


class ModelModel(_Strict):
    """The trained model: a built-in name or a torch module class path."""

    name: Annotated[Text, AfterValidator(_model_name)] = Field(
        description="mlp | cnn1d | cnn2d | linear | random_kernels1d | package.module:Class",
        json_schema_extra=_lazy_enum(_model_names, or_pattern=r"^[\w.]+:\w+$"))
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="keyword arguments of the model")


def _algorithm_names() -> list[str]:
    from raydp_hpo.searchers import SearchAlgorithm

    return [a.value for a in SearchAlgorithm]


def _algorithm(name: str) -> str:
    names = _algorithm_names()
    if name not in names:
        _fail(f"{{path}} {name!r} is not one of {', '.join(names)}{did_you_mean(name, names)}")
    return name


def _mode(value: Any) -> Any:
    if value not in ("max", "min"):
        _fail(f"must be 'max' or 'min', got {value!r}")
    return value


class SearchModel(_Strict):
    """The search algorithm and its settings."""

    algorithm: Annotated[Text, AfterValidator(_algorithm)] = Field(
        description="a raydp_hpo.searchers.SearchAlgorithm value",
        json_schema_extra=_lazy_enum(_algorithm_names))
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the searcher (checked when it is built), e.g. "
                    "{distribution: geometric, mean: 3}; also score_epsilon, score_noise "
                    "(laplace | gaussian) and score_delta")
    preset: Text | None = Field(
        None,
        description="named settings of the algorithm (raydp_hpo.searchers.PRESETS): "
                    "linear_scaling refined (its default) | paper, random_stopping tnb20; "
                    "search.settings override the preset's values")
    metric: Text = Field("val_accuracy", description="the trial metric the search optimises")
    mode: Annotated[Literal["max", "min"], BeforeValidator(_mode)] = "max"
    max_concurrent_trials: PositiveInt = 2

    @model_validator(mode="after")
    def _known_preset(self) -> SearchModel:
        if self.preset is None:
            return self
        if "preset" in self.settings:
            _fail("{path}: give the preset once, as search.preset or search.settings.preset")
        from raydp_hpo.searchers import PRESETS, SearchAlgorithm

        presets = PRESETS.get(SearchAlgorithm(self.algorithm))
        names = [str(p.value) for p in presets] if presets is not None else []
        if self.preset not in names:
            _fail(f"{{path}}.preset {self.preset!r}: "
                  + (f"{self.algorithm} has no presets" if not names else
                     f"not a preset of {self.algorithm}; use one of {', '.join(names)}"
                     f"{did_you_mean(self.preset, names)}"))
        return self


# ------------------------------------------------------------------------------ space


@dataclass(frozen=True)
class Domain:
    """One ``{kind: args}`` entry of the space, checked (``points`` only for uniform and
    loguniform: how many points a grid or SVT search takes from it)."""

    kind: str
    args: tuple[Any, ...]
    points: int | None = None

    def grid(self) -> list[float]:
        """``points`` evenly spaced values from low to high, both included (log-spaced for
        loguniform). Public: a function of the file alone."""
        assert self.points is not None and self.kind in POINT_DOMAIN_KINDS
        lo, hi = float(self.args[0]), float(self.args[1])
        n = self.points
        if self.kind == "loguniform":
            values = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (n - 1))
                      for i in range(n)]
        else:
            values = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
        values[0], values[-1] = lo, hi  # exact ends
        return values

    def to_tune(self) -> Any:
        """The ``ray.tune`` domain (continuous; :meth:`grid` for a discretised one)."""
        from ray import tune

        a = self.args
        if self.kind in ("choice", "grid"):
            return tune.choice(list(a)) if self.kind == "choice" else tune.grid_search(list(a))
        return {
            "randint": lambda: tune.randint(a[0], a[1]),
            "randn": lambda: tune.randn(a[0], a[1]),
            "uniform": lambda: tune.uniform(a[0], a[1]),
            "loguniform": lambda: tune.loguniform(a[0], a[1]),
            "quniform": lambda: tune.quniform(a[0], a[1], a[2]),
            "qloguniform": lambda: tune.qloguniform(a[0], a[1], a[2]),
        }[self.kind]()


def parse_domain(value: Any) -> Domain | None:
    """The :class:`Domain` of a space value, ``None`` for a constant (anything but a mapping).
    Raises the schema's error (see :func:`_fail`; paths relative to the space key)."""
    if not isinstance(value, Mapping):
        return None
    kinds = [k for k in value if k != "points"]
    if len(kinds) != 1:
        _fail("{path} must be a constant or a one-key domain mapping like "
              "{loguniform: [1e-3, 1]} (optionally with points: N for grid and SVT search), "
              f"got {dict(value)!r}")
    kind, args = kinds[0], value[kinds[0]]
    if kind not in DOMAIN_KINDS:
        _fail(f"unknown domain {kind!r} in {{path}}{did_you_mean(str(kind), DOMAIN_KINDS)} "
              f"(valid: {', '.join(DOMAIN_KINDS)})")
    points = _points(kind, value["points"]) if "points" in value else None
    where = f"{{path}}.{kind}"
    if kind in ("choice", "grid"):
        if not isinstance(args, list) or not args:
            _fail(f"{where} needs a non-empty list of values, got {args!r}")
        return Domain(kind, tuple(args))
    arity = 3 if kind in ("quniform", "qloguniform") else 2
    if not isinstance(args, list) or len(args) != arity:
        _fail(f"{where} needs a list of {arity} numbers, got {args!r}")
    if kind == "randint":
        ilo, ihi = (_at(where, _integer(), a) for a in args)
        if not ilo < ihi:
            _fail(f"{where} needs low < high, got {args!r}")
        return Domain(kind, (ilo, ihi))
    nums = tuple(_at(where, _number, a) for a in args)
    if kind == "randn":
        if nums[1] <= 0:
            _fail(f"{where} needs a positive standard deviation, got {args!r}")
        return Domain(kind, nums)
    if not nums[0] < nums[1]:
        _fail(f"{where} needs low < high, got {args!r}")
    if kind in ("loguniform", "qloguniform") and nums[0] <= 0:
        _fail(f"{where} needs low > 0, got {args!r}")
    return Domain(kind, nums, points)


def domain_of(key: str, value: Any) -> Domain | None:
    """:func:`parse_domain` for ``space.<key>``, raising :class:`ConfigError` (for specs
    built without the schema)."""
    try:
        return parse_domain(value)
    except PydanticCustomError as exc:
        path = f"space.{key}"
        message = _render(str((exc.context or {}).get("message", exc.message())), path)
        raise ConfigError(message, ((path, message),)) from None


def _at(where: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its message placed under ``where``."""
    try:
        return check(value)
    except PydanticCustomError as exc:
        _fail(f"{where} {exc.context['message'] if exc.context else exc.message()}")


def _points(kind: str, value: Any) -> int:
    if kind not in POINT_DOMAIN_KINDS:
        _fail(f"{{path}}.points discretises a uniform or loguniform domain, not {kind!r}; "
              "list the values with {choice: [...]} instead")
    points: int = _at("{path}.points", _integer(2), value)
    return points


def _space_value(value: Any) -> Any:
    parse_domain(value)
    return value


def _space_key(key: str) -> str:
    if key in RESERVED_SPACE_KEYS:
        _fail("{path} is reserved; set the model under model:")
    return key


def _space(space: dict[str, Any]) -> dict[str, Any]:
    if not space:
        _fail("must set at least one key")
    return space


def _domain_json(kind: str) -> dict[str, Any]:
    """JSON Schema of one ``{kind: args}`` domain: what :func:`parse_domain` checks item by
    item (low > 0 for the log domains, sd > 0 for randn); low < high relates two items and is
    the parser's alone."""
    number = number_json()
    args: dict[str, Any]
    if kind in ("choice", "grid"):
        args = {"type": "array", "minItems": 1}
    elif kind == "randint":
        args = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    else:
        n = 3 if kind in ("quniform", "qloguniform") else 2
        args = {"type": "array", "items": number, "minItems": n, "maxItems": n}
        positive = number_json({"gt": 0})
        if kind in ("loguniform", "qloguniform"):
            args["prefixItems"] = [positive]  # low > 0 (and high > low)
        elif kind == "randn":
            args["prefixItems"] = [number, positive]  # a positive standard deviation
    properties: dict[str, Any] = {kind: args}
    if kind in POINT_DOMAIN_KINDS:
        properties["points"] = {
            "type": "integer", "minimum": 2,
            "description": "grid and SVT search, and every searcher for a privacy key "
                           "(noise, batch size, epochs), take this many points from low to "
                           "high (log-spaced for loguniform); otherwise the range is sampled"}
    return {"type": "object", "properties": properties, "required": [kind],
            "additionalProperties": False}


class _SpaceSchema:
    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        constant = {"type": ["string", "number", "integer", "boolean", "array", "null"]}
        return {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"not": {"enum": list(RESERVED_SPACE_KEYS)}},
            "additionalProperties": {"anyOf": [*map(_domain_json, DOMAIN_KINDS), constant]},
            "description": "flat: constants or one-key domain mappings ({loguniform: [a, b]}, "
                           "{choice: [...]}, ...)",
        }


Space = Annotated[
    dict[Annotated[str, AfterValidator(_space_key)], Annotated[Any, AfterValidator(_space_value)]],
    AfterValidator(_space),
    _SpaceSchema,
]


# ------------------------------------------------------------------------------ the file


class ResourcesModel(_Strict):
    """Per-trial resources."""

    cpu: NonNegative = 1.0
    gpu: NonNegative = 0.0
    memory: NonNegative | None = Field(None, description="bytes")


class LedgerModel(_Strict):
    """A shared dataset-level ledger actor (every experiment on the dataset names it)."""

    name: Text
    budget: BudgetModel | None = Field(None, description="the dataset's total; default: budget")
    journal: Text | None = Field(None, description="default <storage_path>/ledgers/<name>.journal")
    namespace: Text = "raydp_hpo"


#: What :func:`_experiment_name` accepts, as a JSON Schema pattern: no leading '.', no slash.
_EXPERIMENT_NAME = r"^[^./\\][^/\\]*$"


def _experiment_name(name: str) -> str:
    if name.strip(".") == "" or any(c in name for c in "/\\") or name.startswith("."):
        _fail(f"{{path}} {name!r} must be a plain name (no '/', no leading '.'): it names the run "
              "directory inside storage_path")
    return name


def _storage_path(path: str) -> str:
    if "://" in path:
        _fail(f"{{path}} {path!r}: use a mounted shared file system path (NFS, a fuse-mounted "
              "bucket); the ledger journal needs POSIX append + fsync")
    return path


_SEED_MESSAGE = (
    "the key 'seed' is no longer accepted: it made the searcher's secrets public. Use "
    "'split_seed' (public: makes the train/val/test split reproducible) and omit "
    "'secret_seed' so every secret comes from OS entropy (set secret_seed only to "
    "reproduce a run, and keep the file as secret as the data)"
)


class ExperimentFile(_Strict):
    """An experiment file (``raydp-hpo run EXPERIMENT.yaml``)."""

    model_config = ConfigDict(title="raydp-hpo experiment file")

    # the validators give the messages; json_schema_extra publishes the same rules
    experiment: Annotated[Text, AfterValidator(_experiment_name)] = Field(
        description="name: run dir <storage_path>/<experiment>, charge-id prefix",
        json_schema_extra={"pattern": _EXPERIMENT_NAME})
    split_seed: NonNegativeInt = Field(
        0, description="PUBLIC: makes the train/val/test split reproducible")
    secret_seed: NonNegativeInt | None = Field(
        None, repr=False, exclude=True,
        description="SECRET; omit (or null) for OS entropy. Only to reproduce a run: the file "
                    "then must be kept like the data")
    data: DataModel
    model: Annotated[ModelModel, BeforeValidator(_name_shorthand), _OrName]
    search: SearchModel
    space: Space
    budget: BudgetModel
    test_accuracy_epsilon: Positive | None = Field(
        None, description="release a DP test accuracy (Laplace, its own charge, taken from the "
                          "budget); omit: a noiseless one, NOT covered by the certificate")
    resources: ResourcesModel = Field(default_factory=lambda: ResourcesModel.model_validate({}))
    storage_path: Annotated[Text, AfterValidator(_storage_path)] | None = Field(
        None, description="local dir or NFS mount shared by every node; default "
                          "~/raydp_results, or $RAYDP_HPO_STORAGE when set",
        json_schema_extra={"not": {"pattern": "://"}})
    ledger: Annotated[LedgerModel, BeforeValidator(_name_shorthand), _OrName] | None = Field(
        None, description="omit: the dataset's own ledger")
    tensorboard: Bool = Field(False, description="also write Tune's per-trial TensorBoard files")

    @field_validator("test_accuracy_epsilon")
    @classmethod
    def _within_budget(cls, value: float | None, info: ValidationInfo) -> float | None:
        budget = info.data.get("budget")
        if value is not None and budget is not None and not 0 < value < budget.epsilon:
            _fail(f"{{path}}={value:g} must be in (0, budget.epsilon={budget.epsilon:g}): it is "
                  "taken from the experiment's budget")
        data = info.data.get("data")
        if value is not None and data is not None and data.test_fraction == 0 and (
            getattr(data, "test_uri", None) is None
        ):
            _fail(f"{{path}}={value:g} releases a test accuracy, but there is no test split "
                  "(data.test_fraction: 0); set data.test_fraction (or data.test_uri), or drop "
                  "{path}")
        if value is not None and isinstance(data, ParquetData) and not data.sizes_public and (
            data.declared_test_size is None
        ):
            _fail("{path}: a DP test accuracy is the noisy correct count over the test size, "
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
            raise PydanticCustomError(_MESSAGE_TYPE, "{message}", {
                "message": f"{{path}}.budget.delta={ledger.budget.delta:g} differs from "
                           f"budget.delta={budget.delta:g}; a shared ledger states ε at one δ",
                "at": "budget.delta",
            })
        return ledger


# ------------------------------------------------------------------------------ errors


#: The model of each nested mapping, by path (``data`` by its source), for "valid keys".
_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): ExperimentFile,
    ("model",): ModelModel,
    ("search",): SearchModel,
    ("budget",): BudgetModel,
    ("resources",): ResourcesModel,
    ("ledger",): LedgerModel,
    ("ledger", "budget"): BudgetModel,
    **{("data", source): model for source, model in _DATA_MODELS.items()},
}


def _dotted(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(error: Mapping[str, Any]) -> tuple[str, str]:
    """(dotted path, message) of one pydantic error."""
    loc = tuple(error["loc"])
    kind = error["type"]
    tag = None
    if len(loc) >= 2 and loc[0] == "data" and loc[1] in _DATA_MODELS:
        tag = str(loc[1])
        section_loc: tuple[Any, ...] = loc[:2]
        loc = loc[:1] + loc[2:]
    else:
        section_loc = loc[:-1]
    if loc and loc[-1] == "[key]":  # a mapping key, not its value
        loc = loc[:-1]
        if kind == "string_type":
            return _dotted(loc[:-1]), f"{_dotted(loc[:-1])} keys must be strings, got {loc[-1]!r}"
    path = _dotted(loc)
    ctx = error.get("ctx") or {}
    if kind == _MESSAGE_TYPE:
        at = ctx.get("at")
        full = f"{path}.{at}" if at else path
        return full, _render(str(ctx["message"]), path)
    parent = _dotted(loc[:-1])
    key = loc[-1] if loc else ""
    if kind == "missing":
        if tag is not None:
            return path, f"data source {tag!r} needs data.{key}"
        return path, f"{parent or _FILE} needs the key {key!r}"
    if kind in ("extra_forbidden", "invalid_key"):
        if path == "seed":
            return path, _SEED_MESSAGE
        if tag is not None:
            owners = [s for s, m in _DATA_MODELS.items() if key in m.model_fields]
            if owners:
                return path, (f"data.{key} is only for source {' or '.join(map(repr, owners))}, "
                              f"not {tag!r}")
        section = _SECTIONS.get(tuple(section_loc))
        valid = list(section.model_fields) if section is not None else []
        if tag is not None:  # the source, its own keys, then the common ones
            common = list(_DataBase.model_fields)
            valid = [k for k in valid if k not in common] + common
        return path, (f"unknown key {key!r} in {parent or _FILE}{did_you_mean(str(key), valid)}"
                      + (f" (valid keys: {', '.join(valid)})" if valid else ""))
    if kind == "union_tag_invalid":
        source = error["input"].get("source") if isinstance(error["input"], Mapping) else None
        return f"{path}.source", (
            f"{path}.source {source!r} is not one of {', '.join(DATA_SOURCES)}"
            f"{did_you_mean(str(source), DATA_SOURCES)}")
    if kind == "union_tag_not_found":
        return f"{path}.source", f"{path} needs the key 'source' ({', '.join(DATA_SOURCES)})"
    if kind in _BOUND_WORDS:
        key, op = _BOUND_WORDS[kind]
        got = error["input"]
        shown = f"{got:g}" if isinstance(got, float) else repr(got)
        bound = ctx.get(key)
        limit = f"{bound:g}" if isinstance(bound, (int, float)) else repr(bound)
        return path, f"{path or _FILE} must be {op} {limit}, got {shown}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return path, f"{path or _FILE} must be a mapping, got {error['input']!r}"
    return path, f"{path or _FILE}: {error['msg']} (got {error['input']!r})"


def _unknown_data_keys(error: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Without ``data.source`` pydantic cannot pick the data model, so it reports only the
    missing source: name each key no data source has too (``data.sorce`` -> 'source')."""
    given = error.get("input")
    if not isinstance(given, Mapping):
        return []
    known = ["source", *dict.fromkeys(k for m in _DATA_MODELS.values() for k in m.model_fields
                                      if k != "source")]
    path = _dotted(tuple(error["loc"]))
    return [(f"{path}.{key}", f"{path}.{key} is not a key{did_you_mean(str(key), known)} "
                              f"(valid keys: {', '.join(known)})")
            for key in given if key not in known]


def _problems(error: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(dotted path, message) pairs of one pydantic error (an unknown-key hint added to a
    missing data source)."""
    extra = _unknown_data_keys(error) if error["type"] == "union_tag_not_found" else []
    return [*extra, _problem(error)]


def validate_experiment_file(raw: Any, what: str = "the experiment") -> ExperimentFile:
    """``raw`` (a parsed YAML mapping) as a validated :class:`ExperimentFile`; else one
    :class:`ConfigError` naming every problem with its path (``what`` names the file)."""
    try:
        return ExperimentFile.model_validate(raw)
    except ValidationError as exc:
        problems = [p for e in exc.errors(include_url=False) for p in _problems(e)]
        raise config_error(problems, what) from None


def experiment_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an experiment file, for editors."""
    schema = ExperimentFile.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
