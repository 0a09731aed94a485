"""Differentially private Ray Tune searchers, one module per algorithm.

Every searcher states its whole privacy cost as a :class:`PrivacyPlan` before any trial runs
(see :class:`DPSearcher` for the lifecycle). Use :func:`make_searcher` with a
:class:`SearchAlgorithm` to build one by name.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from raydp_hpo._validation import coerce_enum
from raydp_hpo.searchers.base import DPSearcher, PrivacyPlan, Release
from raydp_hpo.searchers.baselines import GridSearchComposed, OneShotRandomSearch
from raydp_hpo.searchers.linear_scaling import (
    FitVariable,
    LinearScalingSearch,
    LineFit,
    SweepDraw,
    SweepEstimate,
)
from raydp_hpo.searchers.random_stopping import RandomStoppingSearch
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
]


class SearchAlgorithm(Enum):
    """The DP search algorithms of this package."""

    RANDOM_STOPPING = "random_stopping"
    SUBSAMPLED_TRANSFER = "subsampled_transfer"
    SVT_THRESHOLD = "svt_threshold"
    LINEAR_SCALING = "linear_scaling"
    ONE_SHOT_RANDOM = "one_shot_random"
    GRID_COMPOSED = "grid_composed"


_CLASSES: dict[SearchAlgorithm, type[DPSearcher]] = {
    SearchAlgorithm.RANDOM_STOPPING: RandomStoppingSearch,
    SearchAlgorithm.SUBSAMPLED_TRANSFER: SubsampledTransferSearch,
    SearchAlgorithm.SVT_THRESHOLD: SVTThresholdSearch,
    SearchAlgorithm.LINEAR_SCALING: LinearScalingSearch,
    SearchAlgorithm.ONE_SHOT_RANDOM: OneShotRandomSearch,
    SearchAlgorithm.GRID_COMPOSED: GridSearchComposed,
}


def make_searcher(algorithm: SearchAlgorithm | str, **kwargs: Any) -> DPSearcher:
    """Build the searcher of ``algorithm`` with ``kwargs`` (unknown keywords raise TypeError).

    >>> from raydp_hpo.accounting.budget import PrivacyBudget
    >>> s = make_searcher("one_shot_random", param_space={"epochs": 1, "sample_rate": 0.1},
    ...                   metric="acc", dataset_size=1000, budget=PrivacyBudget(2.0, 1e-5))
    >>> s.privacy_plan().algorithm
    'one_shot_random'
    """
    algorithm = coerce_enum(SearchAlgorithm, algorithm, "search algorithm")
    return _CLASSES[algorithm](**kwargs)
