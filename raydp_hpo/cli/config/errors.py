"""pydantic's :class:`~pydantic.ValidationError` as **one** :class:`~raydp_hpo.errors.ConfigError`
that lists every problem with its dotted path (``budget.delta``, ``space.lr``, ``data.uri``)
and, for an unknown key or value, the closest valid one ("did you mean"), for every kind of
config file (:class:`FileKind`: an experiment file, a federated experiment file)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from raydp_hpo._validation import did_you_mean
from raydp_hpo.cli.config._base import MESSAGE_TYPE, render
from raydp_hpo.errors import ConfigError

__all__ = ["FileKind", "config_error"]

M = TypeVar("M", bound=BaseModel)

_BOUND_WORDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="),
                "less_than": ("lt", "<"), "less_than_equal": ("le", "<=")}


def config_error(problems: Iterable[tuple[str, str]], what: str) -> ConfigError:
    """One :class:`ConfigError` for every (path, message): the message alone when there is one
    problem, else a numbered list under ``"N errors in <what>:"``."""
    items = tuple(problems)
    if len(items) == 1:
        return ConfigError(items[0][1], items)
    lines = "\n".join(f"  - {path or '(file)'}: {message}" for path, message in items)
    return ConfigError(f"{len(items)} errors in {what}:\n{lines}", items)


def _dotted(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class FileKind(Generic[M]):
    """One kind of config file: its root model, how its messages name it (``root``), the
    model of each nested mapping by path (for "valid keys"), the models of ``data`` by
    ``data.source`` when ``data`` is a tagged union, and keys refused with their own
    message (a key that was removed, say)."""

    model: type[M]
    root: str
    sections: Mapping[tuple[str, ...], type[BaseModel]]
    data_models: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    common_data_keys: tuple[str, ...] = ()
    removed_keys: Mapping[str, str] = field(default_factory=dict)

    def validate(self, raw: Any, what: str) -> M:
        """``raw`` (a parsed YAML mapping) as a validated model; else one
        :class:`ConfigError` naming every problem with its path (``what`` names the file)."""
        try:
            return self.model.model_validate(raw)
        except ValidationError as exc:
            problems = [p for e in exc.errors(include_url=False) for p in self._problems(e)]
            raise config_error(problems, what) from None

    def _problems(self, error: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(dotted path, message) pairs of one pydantic error (an unknown-key hint added to a
        missing data source)."""
        extra = self._unknown_data_keys(error) if error["type"] == "union_tag_not_found" else []
        return [*extra, self._problem(error)]

    def _unknown_data_keys(self, error: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Without ``data.source`` pydantic cannot pick the data model, so it reports only the
        missing source: name each key no data source has too (``data.sorce`` -> 'source')."""
        given = error.get("input")
        if not isinstance(given, Mapping):
            return []
        known = ["source", *dict.fromkeys(k for m in self.data_models.values()
                                          for k in m.model_fields if k != "source")]
        path = _dotted(tuple(error["loc"]))
        return [(f"{path}.{key}", f"{path}.{key} is not a key{did_you_mean(str(key), known)} "
                                  f"(valid keys: {', '.join(known)})")
                for key in given if key not in known]

    def _problem(self, error: Mapping[str, Any]) -> tuple[str, str]:
        """(dotted path, message) of one pydantic error."""
        loc = tuple(error["loc"])
        kind = error["type"]
        tag = None
        if len(loc) >= 2 and loc[0] == "data" and loc[1] in self.data_models:
            tag = str(loc[1])
            section_loc: tuple[Any, ...] = loc[:2]
            loc = loc[:1] + loc[2:]
        else:
            section_loc = loc[:-1]
        if loc and loc[-1] == "[key]":  # a mapping key, not its value
            loc = loc[:-1]
            if kind == "string_type":
                return (_dotted(loc[:-1]),
                        f"{_dotted(loc[:-1])} keys must be strings, got {loc[-1]!r}")
        path = _dotted(loc)
        ctx = error.get("ctx") or {}
        if kind == MESSAGE_TYPE:
            at = ctx.get("at")
            full = f"{path}.{at}" if at else path
            return full, render(str(ctx["message"]), path, self.root)
        parent = _dotted(loc[:-1])
        key = loc[-1] if loc else ""
        if kind == "missing":
            if tag is not None:
                return path, f"data source {tag!r} needs data.{key}"
            return path, f"{parent or self.root} needs the key {key!r}"
        if kind in ("extra_forbidden", "invalid_key"):
            if path in self.removed_keys:
                return path, self.removed_keys[path]
            if tag is not None:
                owners = [s for s, m in self.data_models.items() if key in m.model_fields]
                if owners:
                    return path, (f"data.{key} is only for source "
                                  f"{' or '.join(map(repr, owners))}, not {tag!r}")
            section = self.sections.get(tuple(section_loc))
            valid = list(section.model_fields) if section is not None else []
            if tag is not None:  # the source, its own keys, then the common ones
                common = list(self.common_data_keys)
                valid = [k for k in valid if k not in common] + common
            return path, (f"unknown key {key!r} in {parent or self.root}"
                          f"{did_you_mean(str(key), valid)}"
                          + (f" (valid keys: {', '.join(valid)})" if valid else ""))
        sources = tuple(self.data_models)
        if kind == "union_tag_invalid":
            given = error["input"]
            source = given.get("source") if isinstance(given, Mapping) else None
            return f"{path}.source", (
                f"{path}.source {source!r} is not one of {', '.join(sources)}"
                f"{did_you_mean(str(source), sources)}")
        if kind == "union_tag_not_found":
            return f"{path}.source", f"{path} needs the key 'source' ({', '.join(sources)})"
        if kind in _BOUND_WORDS:
            bound_key, op = _BOUND_WORDS[kind]
            got = error["input"]
            shown = f"{got:g}" if isinstance(got, float) else repr(got)
            bound = ctx.get(bound_key)
            limit = f"{bound:g}" if isinstance(bound, (int, float)) else repr(bound)
            return path, f"{path or self.root} must be {op} {limit}, got {shown}"
        if kind in ("model_type", "model_attributes_type", "dict_type"):
            return path, f"{path or self.root} must be a mapping, got {error['input']!r}"
        return path, f"{path or self.root}: {error['msg']} (got {error['input']!r})"
