"""Differentially private Ray Tune searchers, one module per algorithm.

Every searcher states its whole privacy cost as a :class:`PrivacyPlan` before any trial runs
(see :class:`DPSearcher` for the lifecycle). Use :func:`make_searcher` with a
:class:`SearchAlgorithm` to build one by name.

``search="auto"`` (:mod:`raydp_hpo.searchers.auto`, :func:`choose_auto`) picks the algorithm
and its settings from the budget, the space and a compute limit, read off the table the
defaults study measured.

Named presets: the setting ``preset`` takes a member (or value) of the algorithm's preset Enum
(:data:`PRESETS`): ``linear_scaling`` ``refined`` (its defaults, the best setup measured by
``benchmarks/privacy_utility.py``) and ``paper`` (Panda et al.'s full-batch rule);
``random_stopping`` ``tnb20``. Settings given explicitly override a preset's values, e.g.
``DPTuner(search="linear_scaling", search_kwargs={"preset": "paper", "runs_per_sweep": 3})``
or in an experiment file ``search: {algorithm: random_stopping, preset: tnb20}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from raydp_hpo._validation import coerce_enum
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers.base import (
    DPSearcher,
    PrivacyPlan,
    Release,
    check_settings,
    resolve_preset,
)
from raydp_hpo.searchers.baselines import GridSearchComposed, OneShotRandomSearch
from raydp_hpo.searchers.linear_scaling import (
    FitVariable,
    LinearScalingPreset,
    LinearScalingSearch,
    LineFit,
    SweepDraw,
    SweepEstimate,
)
from raydp_hpo.searchers.random_stopping import RandomStoppingPreset, RandomStoppingSearch
from raydp_hpo.searchers.subsampled_transfer import SubsampledTransferSearch
from raydp_hpo.searchers.svt_threshold import SVTThresholdSearch

__all__ = [
    "DPSearcher",
    "PrivacyPlan",
    "Release",
    "RandomStoppingSearch",
    "SubsampledTransferSearch",
    "SVTThresholdSearch",
    "LinearScalingSearch",
    "FitVariable",
    "LineFit",
    "SweepDraw",
    "SweepEstimate",
    "OneShotRandomSearch",
    "GridSearchComposed",
    "SearchAlgorithm",
    "make_searcher",
    "check_search_settings",
    "LinearScalingPreset",
    "RandomStoppingPreset",
    "PRESETS",
    "AUTO",
    "AutoChoice",
    "choose_auto",
]


class SearchAlgorithm(Enum):
    """The DP search algorithms of this package."""

    RANDOM_STOPPING = "random_stopping"
    SUBSAMPLED_TRANSFER = "subsampled_transfer"
    SVT_THRESHOLD = "svt_threshold"
    LINEAR_SCALING = "linear_scaling"
    ONE_SHOT_RANDOM = "one_shot_random"
    GRID_COMPOSED = "grid_composed"


#: The named presets of each algorithm that has some (an Enum of preset names each; the
#: settings of a preset are the searcher class's ``presets[member]``).
PRESETS: dict[SearchAlgorithm, type[Enum]] = {
    SearchAlgorithm.LINEAR_SCALING: LinearScalingPreset,
    SearchAlgorithm.RANDOM_STOPPING: RandomStoppingPreset,
}

_CLASSES: dict[SearchAlgorithm, type[DPSearcher]] = {
    SearchAlgorithm.RANDOM_STOPPING: RandomStoppingSearch,
    SearchAlgorithm.SUBSAMPLED_TRANSFER: SubsampledTransferSearch,
    SearchAlgorithm.SVT_THRESHOLD: SVTThresholdSearch,
    SearchAlgorithm.LINEAR_SCALING: LinearScalingSearch,
    SearchAlgorithm.ONE_SHOT_RANDOM: OneShotRandomSearch,
    SearchAlgorithm.GRID_COMPOSED: GridSearchComposed,
}


#: ``make_searcher``'s marker for "no space given" (``None`` is a valid space: given later)
_NO_SPACE: Any = object()


def make_searcher(
    algorithm: SearchAlgorithm | str,
    param_space: Mapping[str, Any] | None = _NO_SPACE,
    /,
    **settings: Any,
) -> DPSearcher:
    """Build the searcher of ``algorithm`` over ``param_space`` with ``settings``.

    The space is the second argument or the keyword ``param_space`` (``None``: given later by
    ``set_search_properties``, as ``DPTuner`` does). ``settings`` are the searcher's
    constructor arguments, ``preset`` included (:data:`PRESETS`); unknown ones are refused all
    at once with the closest valid name each (:class:`~raydp_hpo.errors.InvalidParameterError`,
    :func:`~raydp_hpo.searchers.base.check_settings`).

    >>> from raydp_hpo.accounting.budget import PrivacyBudget
    >>> s = make_searcher("one_shot_random", {"epochs": 1, "sample_rate": 0.1},
    ...                   metric="acc", dataset_size=1000, budget=PrivacyBudget(2.0, 1e-5))
    >>> s.privacy_plan().algorithm
    'one_shot_random'
    """
    algorithm = coerce_enum(SearchAlgorithm, algorithm, "search algorithm")
    cls = _CLASSES[algorithm]
    if param_space is not _NO_SPACE:
        if "param_space" in settings:
            raise InvalidParameterError(
                "make_searcher got the search space twice (second argument and "
                "param_space=); give it once"
            )
        settings["param_space"] = param_space
    elif "param_space" not in settings:
        raise InvalidParameterError(
            f"make_searcher({algorithm.value!r}) needs the search space: the second argument "
            "(or param_space=None to give it later through set_search_properties)"
        )
    return cls(**settings)  # its constructor checks the settings and expands a preset


def check_search_settings(algorithm: SearchAlgorithm | str, settings: Mapping[str, Any]) -> None:
    """Refuse, before anything is built, every setting ``algorithm``'s searcher does not take
    (all at once; :func:`~raydp_hpo.searchers.base.check_settings`), and a preset it does not
    have: what ``DPTuner(search_kwargs=...)`` and experiment files check eagerly."""
    cls = _CLASSES[coerce_enum(SearchAlgorithm, algorithm, "search algorithm")]
    check_settings(cls, settings)
    resolve_preset(cls, settings)


# search="auto" (the measured table; imported last: it reads SearchAlgorithm when called)
from raydp_hpo.searchers.auto import AUTO, AutoChoice, choose_auto  # noqa: E402
