"""``model:``, ``search:`` and ``space:`` of an experiment file.

``search.algorithm`` and the model name are checked against the library's own registries
(:class:`raydp_hpo.searchers.SearchAlgorithm`, :data:`raydp_hpo.trainables.models.MODEL_NAMES`),
imported when a file is validated or the schema generated, not when this module is. A space
value is a constant or a one-key domain mapping; :func:`parse_domain` checks it and gives its
:class:`Domain`, which :mod:`raydp_hpo.cli.experiment` turns into a ``ray.tune`` domain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from raydp_hpo._validation import did_you_mean
from raydp_hpo.cli.config._base import (
    PositiveInt,
    Strict,
    Text,
    at,
    fail,
    integer,
    lazy_enum,
    number,
    number_json,
    render,
)
from raydp_hpo.errors import ConfigError

__all__ = ["ModelModel", "SearchModel", "Space", "Domain", "parse_domain", "domain_of",
           "model_names", "DOMAIN_KINDS", "POINT_DOMAIN_KINDS", "RESERVED_SPACE_KEYS",
           "MODEL_PATH_PATTERN"]

DOMAIN_KINDS = (
    "uniform", "loguniform", "quniform", "qloguniform", "randint", "choice", "grid", "randn",
)
#: Continuous domains a grid / SVT search can discretise with ``points: N``.
POINT_DOMAIN_KINDS = ("uniform", "loguniform")
#: Space keys the experiment file sets elsewhere (``model:``) or that the privacy contract owns.
RESERVED_SPACE_KEYS = ("model", "model_kwargs", "raydp")
#: A torch module class path, ``package.module:Class``.
MODEL_PATH_PATTERN = r"^[\w.]+:\w+$"

# ------------------------------------------------------------------------------ model, search


def _model_name(name: str) -> str:
    from raydp_hpo.trainables.models import MODEL_NAMES

    if name not in MODEL_NAMES and ":" not in name:
        fail(f"{{path}} {name!r} is not one of {', '.join(MODEL_NAMES)} and not a "
             f"'package.module:Class' path{did_you_mean(name, MODEL_NAMES)}")
    return name


def model_names() -> Iterable[str]:
    """The built-in model names (imported when called: torch)."""
    from raydp_hpo.trainables.models import MODEL_NAMES

    return MODEL_NAMES


class ModelModel(Strict):
    """The trained model: a built-in name or a torch module class path."""

    name: Annotated[Text, AfterValidator(_model_name)] = Field(
        description="mlp | cnn1d | cnn2d | linear | random_kernels1d | package.module:Class",
        json_schema_extra=lazy_enum(model_names, or_pattern=MODEL_PATH_PATTERN))
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="keyword arguments of the model")


def _algorithm_names() -> list[str]:
    from raydp_hpo.searchers import SearchAlgorithm
    from raydp_hpo.searchers.auto import AUTO

    return [a.value for a in SearchAlgorithm] + [AUTO]


def _algorithm(name: str) -> str:
    names = _algorithm_names()
    if name not in names:
        fail(f"{{path}} {name!r} is not one of {', '.join(names)}{did_you_mean(name, names)}")
    return name


def _mode(value: Any) -> Any:
    if value not in ("max", "min"):
        fail(f"must be 'max' or 'min', got {value!r}")
    return value


class SearchModel(Strict):
    """The search algorithm and its settings."""

    algorithm: Annotated[Text, AfterValidator(_algorithm)] = Field(
        "auto",
        description="auto (the default: chosen from the measured table by the budget, the "
                    "space and settings compute_limit — default 25 one-shot runs — / "
                    "max_gradient_evaluations / max_trials), or a "
                    "raydp_hpo.searchers.SearchAlgorithm value",
        json_schema_extra=lazy_enum(_algorithm_names))
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the searcher (checked when it is built), e.g. "
                    "{distribution: geometric, mean: 3}; also score_epsilon, score_noise "
                    "(laplace | gaussian) and score_delta; once validated, with the preset")
    preset: Text | None = Field(
        None,
        description="named settings of the algorithm (raydp_hpo.searchers.PRESETS): "
                    "linear_scaling refined (its default) | paper, random_stopping tnb20; "
                    "search.settings override the preset's values")
    metric: Text = Field("val_accuracy", description="the trial metric the search optimises")
    mode: Annotated[Literal["max", "min"], BeforeValidator(_mode)] = "max"
    max_concurrent_trials: PositiveInt = 2

    @model_validator(mode="before")
    @classmethod
    def _preset_in_settings(cls, data: Any) -> Any:
        """``settings`` are the searcher's keyword arguments: ``preset`` goes in there too
        (the settings given override the preset's values when the searcher is built)."""
        if not isinstance(data, Mapping) or data.get("preset") is None:
            return data
        settings = data.get("settings", {})
        if not isinstance(settings, Mapping):
            return data  # refused as not a mapping
        if "preset" in settings:
            fail("{path}: give the preset once, as search.preset or search.settings.preset")
        return {**data, "settings": {"preset": data["preset"], **settings}}

    @model_validator(mode="after")
    def _known_preset(self) -> SearchModel:
        if self.preset is None:
            return self
        from raydp_hpo.searchers import PRESETS, SearchAlgorithm
        from raydp_hpo.searchers.auto import AUTO

        if self.algorithm == AUTO:
            fail("{path}.preset: auto chooses the searcher and its settings from the measured "
                 "table; name the algorithm to use a preset")
        presets = PRESETS.get(SearchAlgorithm(self.algorithm))
        names = [str(p.value) for p in presets] if presets is not None else []
        if self.preset not in names:
            fail(f"{{path}}.preset {self.preset!r}: "
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
    Raises the schema's error (see :func:`~raydp_hpo.cli.config._base.fail`; paths relative to the space key)."""
    if not isinstance(value, Mapping):
        return None
    kinds = [k for k in value if k != "points"]
    if len(kinds) != 1:
        fail("{path} must be a constant or a one-key domain mapping like "
             "{loguniform: [1e-3, 1]} (optionally with points: N for grid and SVT search), "
             f"got {dict(value)!r}")
    kind, args = kinds[0], value[kinds[0]]
    if kind not in DOMAIN_KINDS:
        fail(f"unknown domain {kind!r} in {{path}}{did_you_mean(str(kind), DOMAIN_KINDS)} "
             f"(valid: {', '.join(DOMAIN_KINDS)})")
    points = _points(kind, value["points"]) if "points" in value else None
    where = f"{{path}}.{kind}"
    if kind in ("choice", "grid"):
        if not isinstance(args, list) or not args:
            fail(f"{where} needs a non-empty list of values, got {args!r}")
        return Domain(kind, tuple(args))
    arity = 3 if kind in ("quniform", "qloguniform") else 2
    if not isinstance(args, list) or len(args) != arity:
        fail(f"{where} needs a list of {arity} numbers, got {args!r}")
    if kind == "randint":
        ilo, ihi = (at(where, integer(), a) for a in args)
        if not ilo < ihi:
            fail(f"{where} needs low < high, got {args!r}")
        return Domain(kind, (ilo, ihi))
    nums = tuple(at(where, number, a) for a in args)
    if kind == "randn":
        if nums[1] <= 0:
            fail(f"{where} needs a positive standard deviation, got {args!r}")
        return Domain(kind, nums)
    if not nums[0] < nums[1]:
        fail(f"{where} needs low < high, got {args!r}")
    if kind in ("loguniform", "qloguniform") and nums[0] <= 0:
        fail(f"{where} needs low > 0, got {args!r}")
    return Domain(kind, nums, points)


def domain_of(key: str, value: Any) -> Domain | None:
    """:func:`parse_domain` for ``space.<key>``, raising :class:`ConfigError` (for specs
    built without the schema)."""
    try:
        return parse_domain(value)
    except PydanticCustomError as exc:
        path = f"space.{key}"
        message = render(str((exc.context or {}).get("message", exc.message())), path, "the experiment file")
        raise ConfigError(message, ((path, message),)) from None


def _points(kind: str, value: Any) -> int:
    if kind not in POINT_DOMAIN_KINDS:
        fail(f"{{path}}.points discretises a uniform or loguniform domain, not {kind!r}; "
             "list the values with {choice: [...]} instead")
    points: int = at("{path}.points", integer(2), value)
    return points


def _space_value(value: Any) -> Any:
    parse_domain(value)
    return value


def _space_key(key: str) -> str:
    if key in RESERVED_SPACE_KEYS:
        fail("{path} is reserved; set the model under model:")
    return key


def _space(space: dict[str, Any]) -> dict[str, Any]:
    if not space:
        fail("must set at least one key")
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


