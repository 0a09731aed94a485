"""A searcher's settings: which keyword settings each algorithm takes, their check, presets,
and the constructor wrapper that defers building until the space arrives.

:func:`searcher_settings` reads the settings from the constructors' signatures along the MRO
(no hand-kept list to go stale); :func:`check_settings` refuses unknown ones all at once, each
with the closest valid name; :func:`resolve_preset` expands ``preset=``; :func:`_deferring_init`
wraps every searcher's ``__init__`` (through ``DPSearcher.__init_subclass__``) so that
``param_space=None`` keeps the arguments for ``set_search_properties``. Re-exported by
:mod:`raydp_hpo.searchers.base`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ray.tune.search import Searcher

from raydp_hpo._validation import closest_match, did_you_mean
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers.plan import TUNER_ASSIGNED, TUNER_DEFAULTS

if TYPE_CHECKING:
    from raydp_hpo.searchers.base import DPSearcher

__all__ = ["searcher_settings", "check_settings", "resolve_preset"]


_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _init_settings(cls: type) -> tuple[str, ...]:
    """The keyword parameters of ``cls``'s constructors along its MRO, read from their
    signatures (so no hand-kept list can go stale): each ``__init__`` that passes ``**kwargs``
    on adds its parent's, down to :class:`DPSearcher`."""
    from raydp_hpo.searchers.base import DPSearcher  # the root (base imports this module)

    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]  # without self
        names += [p.name for p in params if p.kind in _KEYWORD_KINDS]
        if klass is DPSearcher or all(p.kind is not p.VAR_KEYWORD for p in params):
            break
    return tuple(dict.fromkeys(names))


def searcher_settings(cls: type[DPSearcher]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the settings of ``cls``'s algorithm, the settings every searcher takes): every
    keyword its constructor accepts, ``preset`` included where the algorithm has presets."""
    from raydp_hpo.searchers.base import DPSearcher  # the root (base imports this module)

    common = tuple(k for k in _init_settings(DPSearcher) if k != "param_space")
    own = [k for k in _init_settings(cls) if k not in common and k != "param_space"]
    if cls.preset_type is not None:
        own.append("preset")
    return tuple(own), common


def check_settings(cls: type[DPSearcher], settings: Mapping[str, Any]) -> None:
    """Refuse every setting ``cls`` does not take, all at once, each with the closest valid
    one, and list the valid settings (:class:`InvalidParameterError`, before anything is
    built). Used by the constructors, :func:`~raydp_hpo.searchers.make_searcher`, ``DPTuner``
    (``search_kwargs``) and experiment files (``search.settings``)."""
    own, common = searcher_settings(cls)
    valid = (*own, *common)
    unknown = [k for k in settings if k not in (*valid, "param_space")]
    if not unknown:
        return
    named = cls.algorithm or cls.__name__
    listed = ", ".join(_with_guess(k, valid) for k in unknown)
    set_by_tuner = {"metric", "mode", *TUNER_ASSIGNED, *TUNER_DEFAULTS}
    raise InvalidParameterError(
        f"unknown {named} setting{'s' if len(unknown) > 1 else ''}: {listed}. Settings of "
        f"{named}: {', '.join(own) or '(none of its own)'}; of every searcher: "
        f"{', '.join(k for k in common if k not in set_by_tuner)} (and "
        f"{', '.join(k for k in common if k in set_by_tuner)}, which DPTuner and experiment "
        "files set themselves)"
    )


def _with_guess(name: object, valid: tuple[str, ...]) -> str:
    close = closest_match(str(name), valid)
    return f"{name!r} (did you mean {close!r}?)" if close else repr(name)


def resolve_preset(cls: type[DPSearcher], settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with its ``preset`` (a :attr:`DPSearcher.preset_type` member or its value)
    replaced by the preset's settings; settings given explicitly override the preset's, and
    one of a group of alternatives given explicitly drops the others
    (:attr:`DPSearcher._alternative_settings`). Without ``preset``: ``settings`` as they are."""
    if "preset" not in settings:
        return dict(settings)
    explicit = {k: v for k, v in settings.items() if k != "preset"}
    if cls.preset_type is None:
        raise InvalidParameterError(f"{cls.algorithm or cls.__name__} has no presets")
    names = [str(m.value) for m in cls.preset_type]
    value = settings["preset"]
    if not isinstance(value, cls.preset_type) and value not in names:
        raise InvalidParameterError(
            f"unknown {cls.algorithm} preset {value!r}"
            f"{did_you_mean(str(value), names)}; use one of {', '.join(names)}"
        )
    preset = cls.preset_type(getattr(value, "value", value))
    values = dict(cls.presets[preset])
    for group in cls._alternative_settings:
        if group & explicit.keys():
            for key in group:
                values.pop(key, None)
    return {**values, **explicit}


def _deferring_init(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` that refuses unknown settings (:func:`check_settings`), expands a ``preset``
    (:func:`resolve_preset`) and, called with ``param_space=None`` (positional or keyword),
    keeps its arguments for ``set_search_properties`` instead of building the plan now."""

    @functools.wraps(init)
    def __init__(self: DPSearcher, *args: Any, **kwargs: Any) -> None:
        check_settings(type(self), kwargs)
        kwargs = resolve_preset(type(self), kwargs)
        space = args[0] if args else kwargs.get("param_space")
        if space is not None:
            init(self, *args, **kwargs)
            return
        rest = args[1:]
        kept = {k: v for k, v in kwargs.items() if k != "param_space"}
        Searcher.__init__(self, metric=kept.get("metric"), mode=kept.get("mode", "max"))
        self.__dict__["_deferred"] = (rest, kept)

    __init__._defers_space = True  # type: ignore[attr-defined]
    return __init__


