"""The public sizes a DPTuner search is planned on: declared with the data, or taken from it
only when ``sizes_public=True`` (:func:`_resolve_sizes`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raydp_hpo.errors import InvalidParameterError


@dataclass(frozen=True)
class _Size:
    """One public size a run uses: its value and where it came from (the certificate says)."""

    value: int
    how: str


#: (DPTuner keyword, what the size normalises, the realised size of ``DataSplits``)
_SIZE_ROLES = (
    ("dataset_size", "training", "train", "q from batch_size and the DP-SGD normaliser q·n"),
    ("validation_size", "validation", "val", "the normaliser of the noisy selection scores"),
    ("test_size", "test", "test", "the normaliser of the DP test accuracy"),
)
_TAKEN = "taken from the data and treated as public: sizes_public=True"


def _searcher_setting(search: Any, name: str) -> Any:
    """The ``dataset_size`` / ``validation_size`` a constructed searcher was given (it reaches
    its trials' configs), or ``None``."""
    from raydp_hpo.searchers import DPSearcher

    if not isinstance(search, DPSearcher):
        return None
    if search.has_space:
        return getattr(search, f"_{name}", None)
    _, kwargs = search.__dict__["_deferred"]
    return kwargs.get(name)


def _reads_private_scores(search: Any, search_kwargs: Mapping[str, Any]) -> bool:
    """Whether a selection reads validation scores normalised by n_val that are not public:
    Laplace/Gaussian-noised scores (``score_epsilon`` not ``None``) or SVT's partition utility
    (sensitivity 1/k needs n_val >= k). One-shot random search reads no score."""
    from raydp_hpo.searchers import (
        DPSearcher,
        OneShotRandomSearch,
        SearchAlgorithm,
        SVTThresholdSearch,
    )
    from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON

    if isinstance(search, DPSearcher):
        if isinstance(search, (SVTThresholdSearch, OneShotRandomSearch)):
            return isinstance(search, SVTThresholdSearch)
        if search.has_space:
            return search.score_epsilon is not None
        kwargs = search.__dict__["_deferred"][1]
        return kwargs.get("score_epsilon", DEFAULT_SCORE_EPSILON) is not None
    if search in (SearchAlgorithm.SVT_THRESHOLD, SearchAlgorithm.ONE_SHOT_RANDOM):
        return search is SearchAlgorithm.SVT_THRESHOLD
    return search_kwargs.get("score_epsilon", DEFAULT_SCORE_EPSILON) is not None


def _resolve_sizes(data: Any, search: Any, search_kwargs: Mapping[str, Any], *,
                   sizes_public: bool, declared: tuple[int | None, int | None, int | None],
                   test_release: bool) -> tuple[_Size, _Size, _Size]:
    """The (training, validation, test) sizes of a run, each from the first of: the
    ``DPTuner`` keyword, a constructed searcher's own setting (training, validation), the
    ``DataSplits``' ``declared_sizes`` (public), or — only with ``sizes_public=True``, or where
    the run needs no such size — the realised size of ``data``.

    A size the run needs (the training size always; the validation size when a selection
    reads private scores; the test size for a DP test accuracy) that is none of these is
    refused, naming each missing keyword but not its realised value (that value is private).
    """
    from raydp_hpo.searchers import DPSearcher

    needed = (
        not (isinstance(search, DPSearcher) and _searcher_setting(search, "dataset_size")),
        _reads_private_scores(search, search_kwargs),
        test_release,
    )
    public = data.declared_sizes
    from_split = (None,) * 3 if public is None else (public.train, public.validation, public.test)
    out: list[_Size] = []
    missing: list[str] = []
    taken: list[str] = []
    for (name, what, attr, role), given, need, split_size in zip(_SIZE_ROLES, declared, needed,
                                                                 from_split):
        own = _searcher_setting(search, name) if name != "test_size" else None
        if given is not None and own is not None and given != own:
            raise InvalidParameterError(
                f"{name}={given} conflicts with the searcher's own {name}={own} "
                f"({type(search).__name__}); declare the {what}-set size once"
            )
        realised = max(1, len(getattr(data, attr)))
        if given is not None:
            out.append(_Size(given, "declared"))
        elif own is not None:
            out.append(_Size(int(own), f"declared by the searcher's {name}"))
        elif split_size is not None:
            out.append(_Size(split_size, "declared: the split's public size, "
                             "DataSplits.declared_sizes"))
        elif need and sizes_public:
            out.append(_Size(realised, _TAKEN))
            taken.append(f"{what}-set")
        elif need:
            missing.append(f"{name} ({what} set: {role})")
            out.append(_Size(realised, ""))
        else:
            out.append(_Size(realised, "taken from the data; no released quantity of this run "
                             "is normalised by it"))
    if not data.train.num_classes_declared:
        if sizes_public:
            taken.append("number-of-classes")
        else:
            missing.append("num_classes (read off the private labels as max(label) + 1; it "
                           "fixes the model's output width: load_parquet(num_classes=...))")
    if missing:
        raise InvalidParameterError(
            f"DPTuner needs a declared public size for: {'; '.join(missing)}. The realised "
            "sizes of `data` are private (one record added or removed changes them, and a "
            "normaliser read off them moves what is released by more than its noise covers), "
            "so they are not used silently. Declare the sizes as DPTuner keywords, or split() a "
            "dataset whose size is public (load_mnist1d, load_digits, or "
            "load_parquet(public_size=N)), or pass sizes_public=True to accept the realised "
            "sizes as public (the certificate then lists them as treated as public)"
        )
    if taken:
        warnings.warn(
            f"sizes_public=True: the realised {', '.join(taken)} size(s) of the data are "
            "treated as public (normalisers read off private data; the certificate lists "
            "them). Declare public sizes to make every normaliser independent of the data.",
            UserWarning, stacklevel=3,
        )
    return out[0], out[1], out[2]
