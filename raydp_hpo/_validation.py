"""Eager argument validation helpers: every message names the parameter and its value."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from enum import Enum
from typing import TypeVar

from raydp_hpo.errors import InvalidParameterError

E = TypeVar("E", bound=Enum)


def coerce_enum(enum_cls: type[E], value: object, what: str) -> E:
    """``value`` as a member of ``enum_cls`` (a member or its value); else a clear error."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        names = ", ".join(str(m.value) for m in enum_cls)
        raise InvalidParameterError(f"unknown {what} {value!r}; use one of {names}") from None


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_float(name: str, value: object) -> float:
    """Return ``value`` as a float after checking it is finite and > 0."""
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise InvalidParameterError(f"{name} must be a finite number > 0, got {name}={value!r}")
    return float(value)  # type: ignore[arg-type]


def nonnegative_float(name: str, value: object) -> float:
    """Return ``value`` as a float after checking it is finite and >= 0."""
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
        raise InvalidParameterError(f"{name} must be a finite number >= 0, got {name}={value!r}")
    return float(value)  # type: ignore[arg-type]


def open_unit_float(name: str, value: object) -> float:
    """Return ``value`` as a float after checking 0 < value < 1."""
    if not _is_real(value) or not (0.0 < float(value) < 1.0):  # type: ignore[arg-type]
        raise InvalidParameterError(f"{name} must be in (0, 1), got {name}={value!r}")
    return float(value)  # type: ignore[arg-type]


def unit_interval_float(name: str, value: object, *, include_zero: bool = False) -> float:
    """Return ``value`` as a float in (0, 1] (or [0, 1] with ``include_zero``)."""
    ok = _is_real(value) and math.isfinite(float(value))  # type: ignore[arg-type]
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = (0.0 <= v <= 1.0) if include_zero else (0.0 < v <= 1.0)
    if not ok:
        interval = "[0, 1]" if include_zero else "(0, 1]"
        raise InvalidParameterError(f"{name} must be in {interval}, got {name}={value!r}")
    return float(value)  # type: ignore[arg-type]


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int after checking it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {name}={value!r}")
    return int(value)


def closest_match(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``name`` (difflib ratio ≥ ``cutoff``), or None."""
    import difflib

    close = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""`` when none is close.

    >>> did_you_mean("epsilom", ["epsilon", "delta"])
    "; did you mean 'epsilon'?"
    """
    close = closest_match(name, candidates, cutoff)
    return f"; did you mean {close!r}?" if close else ""
