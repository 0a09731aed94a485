"""Building blocks of the config models: messages, scalar types with their JSON Schema, the
budget, and the YAML loader every config file goes through.

Messages: a validator raises :func:`fail` with a message in which ``{path}`` stands for the
dotted path of the value (prefixed when absent), so a message reads the same wherever the
model is nested (``budget`` and ``ledger.budget``). :mod:`.errors` renders them.

Numbers accept numeric strings (PyYAML reads ``1e-5``, without a dot, as a string); their
bounds are written once, in ``Field(ge=..., gt=...)``, which both the parser and the
published JSON Schema carry (:class:`NumberJson`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import ConfigError

__all__ = [
    "MESSAGE_TYPE",
    "fail",
    "at",
    "render",
    "Number",
    "NonNegative",
    "Positive",
    "Fraction",
    "Probability",
    "Int",
    "NonNegativeInt",
    "PositiveInt",
    "Text",
    "Bool",
    "Budget",
    "BudgetModel",
    "Strict",
    "number",
    "integer",
    "interval",
    "number_json",
    "NumberJson",
    "name_shorthand",
    "OrName",
    "lazy_enum",
    "load_yaml",
]

MESSAGE_TYPE = "raydp_config"


# ------------------------------------------------------------------------------ messages


def fail(message: str) -> NoReturn:
    """Reject a value; ``{path}`` in ``message`` is replaced by the value's dotted path, and
    without it the path is put in front (see :func:`render`)."""
    raise PydanticCustomError(MESSAGE_TYPE, "{message}", {"message": message})


def render(message: str, path: str, root: str) -> str:
    """``message`` of the value at ``path``: ``{path}`` replaced by it, else the path put in
    front. ``root`` (e.g. "the experiment file") stands for the empty path; a message about
    the whole file that names no ``{path}`` reads as it is."""
    if "{path}" in message:
        return message.replace("{path}", path or root)
    return f"{path} {message}" if path else message


def at(where: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its message placed under ``where``."""
    try:
        return check(value)
    except PydanticCustomError as exc:
        fail(f"{where} {exc.context['message'] if exc.context else exc.message()}")


# ------------------------------------------------------------------------------ scalar types


def number(value: Any) -> float:
    """A finite number (numeric strings accepted: PyYAML reads "1e-5" as a string)."""
    if isinstance(value, bool):
        fail(f"must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            fail(f"must be a number, got {value!r}")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(f"must be a finite number, got {value!r}")
    return float(value)


def integer(minimum: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            fail(f"must be >= {minimum}, got {value!r}")
        return int(value)

    return check


def interval(*, open_ends: bool) -> Callable[[Any], float]:
    """A number in (0, 1) (``open_ends``) or [0, 1], refused as "must be in (0, 1)"."""

    def check(value: Any) -> float:
        x = number(value)
        if not (0.0 < x < 1.0 if open_ends else 0.0 <= x <= 1.0):
            fail(f"must be in {'(0, 1)' if open_ends else '[0, 1]'}, got {value!r}")
        return x

    return check


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        fail(f"must be a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        fail(f"must be true or false, got {value!r}")
    return value


#: A numeric string, as PyYAML reads ``1e-5`` (no dot); a leading sign only where allowed.
_NUMERIC_STRING = r"^{sign}(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"

#: pydantic's numeric constraints and their JSON Schema keywords.
_BOUND_KEYWORDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum",
                   "lt": "exclusiveMaximum"}


def _bounds_of(schema: Mapping[str, Any]) -> dict[str, float]:
    """The ge/gt/le/lt constraints of a (validator-wrapped) float core schema."""
    while schema.get("type", "").startswith("function-") and "schema" in schema:
        schema = schema["schema"]
    return {key: schema[key] for key in _BOUND_KEYWORDS if key in schema}


def number_json(bounds: Mapping[str, float] | None = None) -> dict[str, Any]:
    """JSON Schema of a number within ``bounds`` (pydantic's ge/gt/le/lt), or a numeric
    string (how PyYAML reads ``1e-5``; its value is checked by the parser only)."""
    bounds = dict(bounds or {})
    out: dict[str, Any] = {"type": "number"}
    out.update({_BOUND_KEYWORDS[key]: value for key, value in bounds.items()})
    low = bounds.get("ge", bounds.get("gt"))
    sign = "[-+]?" if low is None or low < 0 else "[+]?"
    return {"anyOf": [out, {"type": "string", "pattern": _NUMERIC_STRING.format(sign=sign)}]}


class NumberJson:
    """JSON Schema of a number field: :func:`number_json` with the field's own constraints
    (``Field(gt=0)`` etc. on the float: one bound, enforced by the parser and published)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return number_json(_bounds_of(schema))


# Numbers (numeric strings accepted) within pydantic bounds, which both the parser and the
# JSON Schema carry: the bound is written once, in Field.
Number = Annotated[float, BeforeValidator(number), NumberJson]
NonNegative = Annotated[float, Field(ge=0), BeforeValidator(number), NumberJson]
Positive = Annotated[float, Field(gt=0), BeforeValidator(number), NumberJson]
Fraction = Annotated[float, Field(ge=0, lt=1), BeforeValidator(number), NumberJson]
Probability = Annotated[float, Field(gt=0, lt=1), BeforeValidator(number), NumberJson]
Int = Annotated[int, BeforeValidator(integer())]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(integer(0))]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(integer(1))]
Text = Annotated[str, Field(min_length=1), BeforeValidator(_string)]
Bool = Annotated[bool, BeforeValidator(_boolean)]


class Strict(BaseModel):
    """Every config model: unknown keys refused, frozen (assignment raises AttributeError,
    as on a frozen dataclass)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def name_shorthand(value: Any) -> Any:
    """``model: mlp`` / ``ledger: shared`` stand for ``{name: ...}``."""
    return {"name": value} if isinstance(value, str) else value


class OrName:
    """JSON Schema: the model, or a string standing for ``{name: <string>}``."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [handler(schema),
                          {"type": "string", "description": "shorthand for {name: <this>}"}]}


def lazy_enum(values: Callable[[], Iterable[str]], *, or_pattern: str | None = None
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


class BudgetModel(Strict):
    """A total (ε, δ) budget, as a file writes it; a validated field holds the library's
    :class:`~raydp_hpo.accounting.budget.PrivacyBudget` (:data:`Budget`)."""

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
            fail(f"{{path}}: {exc}")


class _AsPrivacyBudget:
    """A :class:`PrivacyBudget` field: validated as :class:`BudgetModel` (its keys, bounds and
    messages, its JSON Schema), held as the library's own budget, dumped as ``to_dict()``."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            lambda model: model.budget(), handler.generate_schema(BudgetModel),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda budget: budget.to_dict()))


Budget = Annotated[PrivacyBudget, _AsPrivacyBudget]


# ------------------------------------------------------------------------------ YAML


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


def load_yaml(path: Path, what: str, empty_hint: str) -> Any:
    """The parsed YAML of the file ``path`` (``what``: "experiment file", ...), duplicate keys
    refused; a missing, non-UTF-8, malformed or empty file is a :class:`ConfigError`."""
    import yaml

    if not path.is_file():
        why = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"{what} {str(path)!r} {why}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid YAML: {exc}") from None
    if raw is None:
        raise ConfigError(f"{what} {str(path)!r} is empty; {empty_hint}")
    return raw
