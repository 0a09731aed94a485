"""Search-space checks shared by every searcher: what a space may hold and its finite grids.

A space is a flat dict of ``ray.tune`` Domains, ``tune.grid_search`` dicts or constants.
:func:`finite_values` reads the finite values of one entry (``None`` for a continuous
domain), :func:`finite_grid` every configuration of a finite space, and :func:`_check_space`
refuses what no DP searcher can use (the reserved key, a ``seed``, ``tune.sample_from``,
nested domains, the noise or the batch set twice, no ``epochs``) with a
:class:`~raydp_hpo.errors.SearchSpaceError` naming the key and the fix. Re-exported by
:mod:`raydp_hpo.searchers.base`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ray.tune.search.sample import Categorical, Domain, Function

from raydp_hpo.errors import SearchSpaceError
from raydp_hpo.searchers.plan import NOISE_KEYS, PRIVACY_KEYS, RESERVED_KEY

__all__ = ["is_grid", "finite_values", "finite_grid"]


def is_grid(value: object) -> bool:
    """``tune.grid_search([...])`` is the dict ``{"grid_search": [...]}``."""
    return isinstance(value, dict) and set(value) == {"grid_search"}


def finite_values(key: str, value: object) -> list[Any] | None:
    """The finite list of values of a constant / choice / grid entry, or ``None`` otherwise."""
    if is_grid(value):
        values = list(value["grid_search"])  # type: ignore[index]
        if not values:
            raise SearchSpaceError(f"search space key {key!r}: grid_search needs >= 1 value")
        return values
    if isinstance(value, Categorical):
        if any(isinstance(c, Domain) for c in value.categories):
            return None
        return list(value.categories)
    if isinstance(value, Domain):
        return None
    if isinstance(value, dict):
        if key in PRIVACY_KEYS or _contains_domain(value):
            raise SearchSpaceError(
                f"search space key {key!r} is a nested dict with search domains; DP searchers "
                "need a flat space (flatten it, e.g. 'model_width' instead of "
                "{'model': {'width': ...}}). Constant dicts (e.g. model_kwargs) are fine."
            )
        return [value]  # a constant dict, e.g. model_kwargs={"hidden": [64]}
    return [value]


def finite_grid(space: Mapping[str, Any], needs: str) -> list[dict[str, Any]]:
    """Every configuration of a finite ``space`` (the Cartesian product of each key's values,
    :func:`finite_values`), in key order. A continuous domain raises a
    :class:`SearchSpaceError` naming the key and ``needs`` (what the searcher requires)."""
    keys, values = [], []
    for key, value in space.items():
        vals = finite_values(key, value)
        if vals is None:
            raise SearchSpaceError(f"search space key {key!r} is a continuous domain; {needs}")
        keys.append(key)
        values.append(vals)
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def _contains_domain(value: object) -> bool:
    if isinstance(value, Domain) or is_grid(value):
        return True
    if isinstance(value, dict):
        return any(_contains_domain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_domain(v) for v in value)
    return False


def _check_space(param_space: Mapping[str, Any], *, requires_epochs: bool = True) -> dict[str, Any]:
    if not isinstance(param_space, Mapping):
        raise SearchSpaceError(f"param_space must be a dict, got {param_space!r}")
    space = dict(param_space)
    if RESERVED_KEY in space:
        raise SearchSpaceError(
            f"search space key {RESERVED_KEY!r} is reserved for the privacy contract; rename it"
        )
    if "seed" in space:
        raise SearchSpaceError(
            "search space key 'seed': a trial's seed drives its DP noise, and the space is "
            "public configuration (logged by Ray Tune); remove it and pass "
            "DPTuner(secret_seed=...) for reproducible runs, or nothing for OS entropy"
        )
    for key, value in space.items():
        if not isinstance(key, str):
            raise SearchSpaceError(f"search space keys must be strings, got {key!r}")
        if isinstance(value, Function):
            raise SearchSpaceError(
                f"search space key {key!r} uses tune.sample_from, which depends on other keys; "
                "DP searchers sample every key independently: use a Domain or a constant"
            )
        if isinstance(value, dict) and not is_grid(value):
            finite_values(key, value)  # raises for nested dicts
    noise = [k for k in NOISE_KEYS if k in space]
    if len(noise) > 1:
        raise SearchSpaceError(
            f"search space sets the noise twice ({', '.join(noise)}); keep exactly one"
        )
    if "sample_rate" in space and "batch_size" in space:
        raise SearchSpaceError("search space sets both 'sample_rate' and 'batch_size'; keep one")
    if requires_epochs and "epochs" not in space:
        raise SearchSpaceError(
            "search space needs 'epochs' (a constant or tune.choice): the privacy cost of a "
            "trial depends on it"
        )
    return space

