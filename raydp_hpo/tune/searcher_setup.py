"""How DPTuner sets up its searcher, and which scores a selection may read.

One concern: the searcher a run uses — ``search=`` and the space checked
(:func:`check_search_and_space`), its metric and mode (:func:`searcher_metric_mode`), built
(:func:`make_dp_searcher`) — and
the check that its selection reads only privatised scores (:func:`check_selection_inputs`,
see :mod:`raydp_hpo.trial.privacy`). :meth:`DPTuner._build_searcher
<raydp_hpo.tune.tuner.DPTuner._build_searcher>` then gives it the ledger's admission rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "public_num_classes",
    "resolve_auto_search",
    "check_search_and_space",
    "check_selection_inputs",
    "make_dp_searcher",
    "searcher_metric_mode",
]


def public_num_classes(data: Any, sizes_public: bool) -> int | None:
    """The number of classes ``search="auto"`` may read (SVT's u₀ = 1/classes): the training
    split's when declared, or realised under ``sizes_public``; else ``None`` (private). The
    run (:func:`resolve_auto_search`) and ``raydp-hpo run --dry-run`` both use it."""
    return data.train.num_classes if data.train.num_classes_declared or sizes_public else None


def resolve_auto_search(search: Any, search_kwargs: Mapping[str, Any] | None, *,
                        param_space: Mapping[str, Any] | None, epsilon: float, data: Any,
                        dataset_size: int | None, sizes_public: bool,
                        progress: Callable[[str], None]
                        ) -> tuple[Any, dict[str, Any], Any]:
    """``(search, search_kwargs, choice)``: for ``search="auto"`` the searcher and settings
    :func:`~raydp_hpo.searchers.auto.resolve_auto` reads off the measured table (``choice``, an
    :class:`~raydp_hpo.searchers.auto.AutoChoice`), for an ``AutoChoice`` its searcher and
    settings, else ``search`` and ``search_kwargs`` as given (``choice`` ``None``).

    Auto's inputs are public: ``epsilon`` (the search's share of the budget, less a DP test
    accuracy's ε_t: :func:`~raydp_hpo.tune.dataset_points.search_share`), the space, its own settings
    (the compute limit), the training size it converts ``max_gradient_evaluations`` with (the
    ``dataset_size`` keyword, else ``data.declared_sizes``, else — with ``sizes_public`` — the
    realised size) and the number of classes where declared (SVT's u₀)."""
    from raydp_hpo.searchers.auto import AutoChoice, is_auto, resolve_auto

    if isinstance(search, AutoChoice):
        if search_kwargs:
            raise InvalidParameterError(
                "search= is an AutoChoice, which carries its searcher's settings: pass no "
                f"search_kwargs (got {dict(search_kwargs)!r})")
        return search.algorithm, dict(search.settings), search
    if not is_auto(search):
        return search, dict(search_kwargs or {}), None
    if param_space is None or not isinstance(param_space, Mapping):
        raise InvalidParameterError(
            "search='auto' chooses from the search space: pass DPTuner(param_space={...})")
    n = dataset_size
    if n is None and data.declared_sizes is not None:
        n = data.declared_sizes.train
    if n is None and sizes_public:
        n = max(1, len(data.train))
    choice = resolve_auto(param_space, epsilon, search_kwargs, dataset_size=n,
                          num_classes=public_num_classes(data, sizes_public))
    progress(f"[raydp-hpo] search='auto' chose {choice.setting}: {choice.reason}")
    return choice.algorithm, dict(choice.settings), choice


def make_dp_searcher(search: Any, search_kwargs: Mapping[str, Any], *, metric: str, mode: str,
                     validation_size: int) -> Any:
    """The DP searcher of ``search``: a constructed one as it is (given this run's public
    validation size if it has its own space and none), else the searcher of the algorithm
    named, with ``search_kwargs``."""
    from raydp_hpo.searchers import DPSearcher, make_searcher

    if isinstance(search, DPSearcher):
        if search_kwargs:
            raise InvalidParameterError(
                "search_kwargs are only for a SearchAlgorithm, not a constructed searcher"
            )
        searcher = search
        if searcher.has_space and getattr(searcher, "_validation_size", None) is None:
            # its trials normalise their scores by this run's public validation size
            # (else each trial would fall back to the realised, private one)
            searcher._validation_size = validation_size
    else:
        # every keyword but the space and what set_search_properties fills in below
        searcher = make_searcher(search, param_space=None, metric=metric,
                                 mode=mode, **search_kwargs)
    return searcher


def check_selection_inputs(searcher: Any, *, builtin_trainable: bool, metric: str,
                           validation_size: int) -> None:
    """Selections may only read privatised scores (see raydp_hpo.trial.privacy)."""
    from raydp_hpo.searchers import SVTThresholdSearch

    score_eps = getattr(searcher, "score_epsilon", None)
    if builtin_trainable and metric != "val_accuracy":
        raise InvalidParameterError(
            f"metric={metric!r} is not a selection score of the built-in trainable: it "
            "reports 'val_accuracy' (validation split, Laplace-noised when private) as the "
            "only score a selection may read; 'loss' is computed on private training data "
            "and 'test_accuracy' on the test split. Use metric='val_accuracy'."
        )
    if score_eps is not None and metric != "val_accuracy":
        raise InvalidParameterError(
            f"metric={metric!r}: trials privatise only their final 'val_accuracy' "
            "(Laplace noise, charged with the trial); a selection on any other reported "
            "value would read raw private data. Use metric='val_accuracy', or declare the "
            "validation split public with search_kwargs={'score_epsilon': None}."
        )
    if isinstance(searcher, SVTThresholdSearch):
        k = int(getattr(searcher, "num_partitions", 0) or 0)
        n_val = validation_size
        if k and n_val < k:
            raise InvalidParameterError(
                f"SVT with num_partitions={k} needs a declared validation size of at least "
                f"{k}: each partition model's accuracy is its correct count over the public "
                f"validation size n_val, so one validation record moves the utility by at "
                f"most 1/n_val, which must not exceed the sensitivity 1/k; got n_val={n_val}. "
                "Use fewer partitions or a larger validation split."
            )


def _same_space(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal search spaces: the same keys, each value equal or (a Tune Domain, which compares
    by identity) pickled alike."""
    import pickle

    if set(a) != set(b):
        return False
    for key in a:
        x, y = a[key], b[key]
        if x is y:
            continue
        try:
            if x == y:
                continue
            if type(x) is type(y) and pickle.dumps(x) == pickle.dumps(y):
                continue
        except Exception:  # unpicklable or uncomparable: not shown to be the same
            return False
        return False
    return True


def check_search_and_space(search: Any, param_space: Mapping[str, Any] | None) -> Any:
    """``search`` as a DPSearcher or a :class:`~raydp_hpo.searchers.SearchAlgorithm`, refusing
    a search that is neither, a missing or empty space, and a second space for a searcher
    constructed with its own."""
    from raydp_hpo.searchers import DPSearcher, SearchAlgorithm

    if not isinstance(search, DPSearcher):
        try:
            search = SearchAlgorithm(search)
        except ValueError:
            names = ", ".join(a.value for a in SearchAlgorithm)
            raise InvalidParameterError(
                f"search={search!r} is neither a DPSearcher nor a search algorithm; use "
                f"one of {names}, or 'auto' (chosen from the measured table)"
            ) from None
    searcher_space = isinstance(search, DPSearcher) and search.has_space
    if param_space is None and not searcher_space:
        raise InvalidParameterError(
            "param_space is missing: pass DPTuner(param_space={...}), or a searcher "
            "constructed with its own param_space as search="
        )
    if param_space is not None:
        if not isinstance(param_space, Mapping) or not param_space:
            raise InvalidParameterError(
                f"param_space must be a non-empty dict, got {param_space!r}"
            )
        if searcher_space and not _same_space(param_space, search._space):
            raise InvalidParameterError(
                f"the searcher {type(search).__name__} was constructed with its own "
                "param_space and DPTuner got another one; give the space once (construct "
                "the searcher with param_space=None to take DPTuner's)"
            )
    return search


def searcher_metric_mode(search: Any, metric: str | None, mode: str | None
                         ) -> tuple[str | None, str | None]:
    """The metric and mode to select on: a constructed searcher's own, unless DPTuner was
    given others (refused)."""
    from raydp_hpo.searchers import DPSearcher

    if isinstance(search, DPSearcher):
        # the searcher's own metric / mode, unless DPTuner was given others (refused)
        for name, ours, theirs in (("metric", metric, search.metric),
                                   ("mode", mode, search.mode)):
            if ours is not None and theirs is not None and ours != theirs:
                raise InvalidParameterError(
                    f"{name}={ours!r} conflicts with the searcher's {name}={theirs!r} "
                    f"({type(search).__name__}); the searcher selects on its own {name}: "
                    "give one"
                )
        metric = metric if metric is not None else search.metric
        mode = mode if mode is not None else search.mode
    return metric, mode
