"""Every check ``raydp-hpo run`` makes before its first charge that needs more than the file:
the data (path, columns, labels), the resources, the space against the trainable and the
search plan against the budget (:func:`preflight`; ``run --dry-run`` and ``run`` both call it,
so they refuse the same files). The file itself was validated by
:class:`raydp_hpo.cli.config.ExperimentFile`, which is what every function here reads.

Also here: the searcher's space built from the file (:func:`build_param_space`) and the data
loaded and split as the file says (:func:`load_data`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.config import ExperimentFile, config_error
from raydp_hpo.cli.config.data import DigitsData, Mnist1dData, ParquetData
from raydp_hpo.cli.config.search import domain_of
from raydp_hpo.errors import BudgetTooSmallError, ConfigError, RayDPHPOError
from raydp_hpo.tune.searcher_setup import public_num_classes

__all__ = ["build_param_space", "load_data", "local_resources", "check_resources",
           "validate_search", "Preflight", "preflight", "describe_sizes"]

#: Searchers that enumerate their space: a domain with ``points`` becomes a grid for every key.
_ENUMERATING = ("grid_composed", "svt_threshold")


def build_param_space(spec: ExperimentFile) -> dict[str, Any]:
    """The searcher's flat space: model name/kwargs plus the file's ``space`` as domains.

    A ``uniform`` / ``loguniform`` domain with ``points: N`` becomes a grid of N values for
    every key under a searcher that enumerates its space (grid, SVT) and, under any searcher,
    for a privacy key (which must take finitely many values so their worst case is charged);
    elsewhere it stays continuous."""
    from ray import tune

    from raydp_hpo.searchers.base import PRIVACY_KEYS

    enumerating = spec.search.algorithm in _ENUMERATING
    space: dict[str, Any] = {"model": spec.model.name}
    if spec.model.kwargs:
        # a one-value Categorical: searchers need a flat space, and a constant dict is "nested"
        space["model_kwargs"] = tune.choice([dict(spec.model.kwargs)])
    for key, value in spec.space.items():
        domain = domain_of(key, value)
        if domain is None:
            space[key] = value
        elif domain.points is not None and enumerating:
            space[key] = tune.grid_search(domain.grid())
        elif domain.points is not None and key in PRIVACY_KEYS:
            space[key] = tune.choice(domain.grid())
        else:
            space[key] = domain.to_tune()
    return space


def _continuous_without_points(spec: ExperimentFile) -> list[str]:
    """Space keys with a continuous domain and no ``points`` (a grid / SVT search refuses
    them)."""
    out = []
    for key, value in spec.space.items():
        domain = domain_of(key, value)
        if domain is not None and domain.kind not in ("choice", "grid") and domain.points is None:
            out.append(key)
    return out


class _Problems:
    """Collects every error of an experiment file: each check runs under the key it checks,
    and an error there is recorded (path, message) instead of stopping the others."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.too_small: BudgetTooSmallError | None = None

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def run(self, path: str, check: Callable[[], Any]) -> Any:
        """``check()``, or None after recording its error under ``path``."""
        try:
            return check()
        except BudgetTooSmallError as exc:
            self.too_small = exc
            self.add(path, str(exc))
        except ConfigError as exc:
            for sub, message in exc.problems:
                self.add(sub or path, message)
        except (RayDPHPOError, ValueError, TypeError, OSError) as exc:
            self.add(path, f"{type(exc).__name__}: {exc}" if not isinstance(
                exc, RayDPHPOError) else str(exc))
        return None

    def raise_if_any(self, what: str) -> None:
        if not self.items:
            return
        if len(self.items) == 1 and self.too_small is not None:
            raise self.too_small  # alone: keeps its "budget exhausted" exit code
        raise config_error(self.items, what)


def load_data(spec: Mnist1dData | DigitsData | ParquetData, split_seed: int) -> Any:
    """Load and split the private dataset (``raydp_hpo.trainables.DataSplits``); the split is
    stable per record and its seed is public (:func:`raydp_hpo.trainables.data.split`). A
    Parquet ``val_uri`` / ``test_uri`` file is that split as is (``uri`` then gives none of its
    records to it)."""
    from raydp_hpo.errors import DataValidationError
    from raydp_hpo.trainables.data import (
        Dataset,
        DataSplits,
        load_digits,
        load_mnist1d,
        load_parquet,
        parquet_feature_columns,
        split,
    )

    fractions = spec.split_fractions()  # 0 for a split read from its own file
    if isinstance(spec, Mnist1dData):
        dataset = load_mnist1d(spec.samples, seed=spec.generator_seed)
    elif isinstance(spec, DigitsData):
        dataset = load_digits()
    else:
        dataset = load_parquet(
            spec.uri,
            label_column=spec.label_column,
            feature_columns=spec.feature_columns,
            feature_column=spec.feature_column,
            num_classes=spec.num_classes,
        )
        if spec.val_uri or spec.test_uri:
            default = spec.feature_columns is None and spec.feature_column is None
            files = {}
            for name, uri in (("val", spec.val_uri), ("test", spec.test_uri)):
                if not uri:
                    continue
                if default:  # the same features in every file
                    here = parquet_feature_columns(uri, spec.label_column, f"data.{name}_uri")
                    there = parquet_feature_columns(spec.uri, spec.label_column)
                    if here != there:
                        raise DataValidationError(
                            f"data.{name}_uri {uri!r} has the feature columns {here}, data.uri "
                            f"{there}: list the features in data.feature_columns"
                        )
                files[name] = load_parquet(
                    uri, label_column=spec.label_column, feature_columns=spec.feature_columns,
                    feature_column=spec.feature_column, num_classes=spec.num_classes,
                    key=f"data.{name}_uri")
            splits = split(dataset, *fractions, seed=split_seed)
            parts = {"train": splits.train, "val": files.get("val", splits.val),
                     "test": files.get("test", splits.test)}
            # one label set: num_classes (default max(label) + 1) over every file
            k = max(part.num_classes for part in parts.values())
            train, val, test = (Dataset(part.features, part.labels, k,
                                        num_classes_declared=spec.num_classes is not None,
                                        name=dataset.name)
                                for part in parts.values())
            return DataSplits(train, val, test)  # sizes private: the spec declares them
    return split(dataset, *fractions, seed=split_seed)


def local_resources() -> dict[str, float]:
    """CPUs, GPUs and memory (bytes) of this machine: what a local Ray started here has."""
    cpus = float(os.cpu_count() or 1)
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = math.inf
    try:
        import torch

        gpus = float(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPU
        gpus = 0.0
    return {"cpu": cpus, "gpu": gpus, "memory": memory}


def check_resources(spec: ExperimentFile, available: Mapping[str, float], where: str) -> None:
    """Refuse a per-trial request larger than everything ``available`` (the machine, or the
    whole cluster's total): it can never be placed, and Tune would wait forever after the plan
    was charged. A request that fits the total but no single node is not caught here.
    ``available`` uses Ray's keys (CPU, GPU, memory) or ours (cpu, gpu, memory)."""
    problems = _Problems()
    for key, ray_key, unit in (("cpu", "CPU", ""), ("gpu", "GPU", ""), ("memory", "memory",
                                                                        " bytes")):
        asked = float(spec.resources.as_dict().get(key, 0.0))
        have = float(available.get(ray_key, available.get(key, 0.0)))
        if asked > have:
            problems.add(
                f"resources.{key}",
                f"resources.{key}={asked:g} per trial, but {where} has {have:g}{unit}: no trial "
                "could ever start (Tune would wait forever); lower it, or run on a larger "
                "cluster (RAY_ADDRESS, or --num-cpus for a local one)",
            )
    problems.raise_if_any(f"experiment {spec.experiment!r}")


def validate_search(
    spec: ExperimentFile, dataset_size: int, validation_size: int | None = None
) -> None:
    """Build the searcher once without Ray or a ledger: a space key the trainable does not
    read, a bad constant, a space the algorithm cannot use, an unknown setting or a budget too
    small for the plan fail here, before anything runs. ``dataset_size`` and
    ``validation_size`` are the declared public sizes. Raises one :class:`ConfigError` with
    every problem found (or :class:`BudgetTooSmallError` when that is the only one)."""
    problems = _Problems()
    _validate_search(spec, dataset_size, validation_size, problems,
                     num_classes=getattr(spec.data, "num_classes", None))
    problems.raise_if_any(f"experiment {spec.experiment!r}")


def _validate_search(spec: ExperimentFile, dataset_size: int, validation_size: int | None,
                     problems: _Problems, *, num_classes: int | None = None) -> Any:
    """The checks of :func:`validate_search`; returns ``search: auto``'s choice (or None).
    ``num_classes`` is the public class count the run hands auto (declared, or realised
    under ``sizes_public``), so that the dry run's choice is the run's, u₀ included."""
    from raydp_hpo.errors import SearchSpaceError
    from raydp_hpo.searchers import make_searcher
    from raydp_hpo.searchers.auto import is_auto, resolve_auto
    from raydp_hpo.trainables.training import validate_trial_space

    space = build_param_space(spec)
    try:
        validate_trial_space(space)
    except ValueError as exc:
        problems.add("space", f"space: {exc}")
    search_budget = PrivacyBudget(spec.budget.epsilon - (spec.test_accuracy_epsilon or 0.0),
                                  spec.budget.delta)
    algorithm, settings = spec.search.algorithm, dict(spec.search.settings)
    choice = None
    if is_auto(algorithm):  # what DPTuner will run: read off the measured table
        try:
            choice = resolve_auto(space, search_budget.epsilon, settings,
                                  dataset_size=dataset_size, num_classes=num_classes)
        except (RayDPHPOError, ValueError) as exc:
            problems.add("search.settings", str(exc))
            return None
        algorithm, settings = choice.algorithm.value, dict(choice.settings)
    try:
        searcher = make_searcher(
            algorithm,
            param_space=space,
            metric=spec.search.metric,
            mode=spec.search.mode,
            dataset_size=dataset_size,
            validation_size=validation_size,
            # the search's share: a DP test accuracy takes its ε_t from the budget first
            budget=search_budget,
            experiment=spec.experiment,
            **settings,
        )
        _check_whole_grid(searcher, search_budget, problems)
    except TypeError as exc:
        problems.add("search.settings", f"search.settings: {exc}")
    except BudgetTooSmallError as exc:
        problems.too_small = exc
        problems.add("budget", str(exc))
    except SearchSpaceError as exc:
        hint = ""
        continuous = _continuous_without_points(spec)
        if algorithm in _ENUMERATING and continuous:
            hint = (f"; in the experiment file, give space.{continuous[0]} a number of points "
                    "to take from its range (e.g. {loguniform: [0.01, 1], points: 5}: a grid "
                    "of 5 log-spaced values)")
        problems.add("space", f"space ({algorithm}): {exc}{hint}")
    except (RayDPHPOError, ValueError) as exc:
        problems.add("search.settings", str(exc))
    return choice


def _check_whole_grid(searcher: Any, budget: PrivacyBudget, problems: _Problems) -> None:
    """A composed grid's whole cost is known before any charge: refuse a grid whose
    composition the budget cannot pay (the ledger would stop it after a few trials, having
    spent the budget on an arbitrary prefix of the grid)."""
    from raydp_hpo.searchers.base import plan_epsilon

    composed = getattr(searcher, "composed_mechanism", None)
    if composed is None:
        return
    eps = plan_epsilon(composed(), budget.delta)
    if eps <= budget.epsilon:
        return
    exc = BudgetTooSmallError(
        f"the budget cannot pay for the whole grid: grid_composed trains all "
        f"{searcher.grid_size} grid points and their composition needs ε={eps:.4g} at "
        f"δ={budget.delta:g} (RDP accountant), but the search's budget is ε={budget.epsilon:g}. "
        "Take fewer points (space.<key>.points, shorter choice lists), more noise "
        f"(space.noise_multiplier), or a budget of at least ε={eps:.4g}; nothing was charged"
    )
    problems.too_small = exc
    problems.add("budget", str(exc))


@dataclass(frozen=True)
class Preflight:
    """What :func:`preflight` checked: the loaded data and the public sizes used."""

    data: Any
    train_size: int
    validation_size: int | None
    #: what ``search: {algorithm: auto}`` chose (an AutoChoice), or None
    auto: Any = None


def preflight(spec: ExperimentFile) -> Preflight:
    """Every check ``run`` makes before its first charge, without Ray or a ledger: the data
    (path, columns, labels), then the space against the trainable and the search plan against
    the budget. ``raydp-hpo run --dry-run`` and ``run`` both call it, so they refuse the same
    files; every problem is reported in one :class:`ConfigError` with its path."""
    problems = _Problems()
    if not os.environ.get("RAY_ADDRESS"):  # a cluster's resources are checked once attached
        problems.run("resources", lambda: check_resources(
            spec, local_resources(), "this machine (the local Ray `run` starts)"))
    data = problems.run("data", lambda: load_data(spec.data, spec.split_seed))
    train_size, val_size = spec.data.public_sizes()
    if data is not None:
        if train_size is None:
            train_size = len(data.train)
        if val_size is None:
            val_size = max(1, len(data.val))
    choice = None
    if train_size is not None:
        # the class count DPTuner hands search='auto': public only
        classes = (None if data is None
                   else public_num_classes(data, spec.data.sizes_accepted))
        choice = _validate_search(spec, train_size, val_size, problems, num_classes=classes)
    problems.raise_if_any(f"experiment {spec.experiment!r}")
    assert data is not None and train_size is not None  # else a problem was raised
    return Preflight(data, train_size, val_size, choice)


def describe_sizes(spec: ExperimentFile, checked: Preflight) -> list[str]:
    """Lines for ``run --dry-run``: the public sizes the run will use, and the realised split
    sizes and number of classes of the loaded data — private, shown to the data's owner so
    that they can declare public values (never written to a release, certificate or log)."""
    data = checked.data
    train, val = spec.data.public_sizes()
    test = spec.data.public_test_size()
    declared_k = data.train.num_classes if data.train.num_classes_declared else None

    def shown(value: int | None) -> str:
        if value is not None:
            return str(value)
        return "realised (sizes_public: true)" if spec.data.sizes_accepted else "undeclared"

    return [
        f"public sizes the run uses: train={shown(train)}, validation={shown(val)}, "
        f"test={shown(test)} (read with test_accuracy_epsilon only), classes={shown(declared_k)}",
        "realised sizes (private; declare public values: data.declared_train_size, "
        "data.declared_validation_size, data.declared_test_size, data.num_classes): "
        f"train={len(data.train)}, validation={len(data.val)}, test={len(data.test)}, "
        f"classes={_label_classes(data)} (max label + 1)",
    ]


def _label_classes(data: Any) -> int:
    """max(label) + 1 over every split (what ``num_classes`` defaults to)."""
    return 1 + max(int(part.labels.max()) for part in (data.train, data.val, data.test)
                   if len(part))

