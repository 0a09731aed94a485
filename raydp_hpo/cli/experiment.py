"""Experiment files: ``raydp-hpo run EXPERIMENT.yaml``.

An experiment file is a YAML mapping, validated in full *before* anything runs (no Ray, no
ledger, no data loaded) by :class:`raydp_hpo.cli.config.ExperimentFile` (its keys, with
comments, are in :mod:`raydp_hpo.cli.config.experiment`; ``raydp-hpo schema`` prints the JSON
Schema). The validated, frozen model is what this module runs: there is no second spec
hierarchy. An unknown or misspelled key or value is an error that names its path and
suggests the closest valid one, and every error of a file is reported at once. What needs
the data, the trainable or the searcher is checked next, by :func:`preflight`.

**One space for every searcher.** A continuous ``uniform`` / ``loguniform`` domain with
``points: N`` becomes a grid of N values from low to high (log-spaced for loguniform) where a
finite set is needed: for every key under grid and SVT search, which enumerate the space, and
for the privacy keys (noise, batch size, epochs, ...) under every searcher, which charge the
worst case over their values; elsewhere it is sampled as usual. The points are a function of
the file alone (public). Linear scaling sets ``lr``, the steps and the noise itself and
ignores those keys with a warning. A ``grid_composed`` search whose whole grid the budget
cannot pay is refused before any charge (``--dry-run`` too, exit 3).

**The budget belongs to the data.** Without a ``ledger:`` block an experiment charges the
dataset's default ledger, named from a fingerprint of the data source
(:meth:`~raydp_hpo.cli.config.data.Mnist1dData.fingerprint`: the built-in dataset and its generator settings, or the
canonical Parquet URI) and journaled under ``<storage_path>/ledgers/``. A second experiment
on the same data — a re-run under a new name after a crash, say — spends from the same budget
instead of getting a fresh one. The first experiment on a dataset creates its ledger with its
``budget`` (logged); later ones attach to it, their own ``budget`` being a cap on what they
spend. A fresh budget on the same data is an explicit, logged act: name another ledger in
``ledger:``. A crashed run continues with ``raydp-hpo run --resume`` (same experiment name), which first
checks that the ledger journal it attaches to holds the experiment's earlier charges (a moved
or replaced journal is refused, never silently a fresh budget).
Parquet ``val_uri`` / ``test_uri`` files are private data of the same dataset: they are
accounted on the ledger of ``uri``. Use a validation or test file with one training file only,
or name one shared ``ledger:`` for every experiment that reads it.

:func:`run_experiment` executes a spec: connects to ``RAY_ADDRESS`` when set (a cluster, or
the cluster a ``ray job submit`` job runs on), else starts a local Ray; runs
:class:`~raydp_hpo.tune.tuner.DPTuner` with a progress monitor. The run dir
``<storage_path>/<experiment>`` is private except its ``public/`` folder, which DPTuner fills
with exactly what may be published (``release.json``, ``certificate.json``,
``released_model.pt``; :mod:`raydp_hpo.tune.publish`); ``run.json`` and the rest stay private.
A storage path or ledger journal in a temporary directory or a Ray working dir is warned
about (a deleted journal resets the budget).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import warn_if_ephemeral
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.config import (
    ExperimentFile,
    config_error,
    read_config,
    run_dir_of,
    validate_experiment_file,
)
from raydp_hpo.cli.config.data import DATA_SOURCES, DigitsData, Mnist1dData, ParquetData
from raydp_hpo.cli.config.search import DOMAIN_KINDS, domain_of
from raydp_hpo.errors import BudgetTooSmallError, ConfigError, RayDPHPOError

__all__ = [
    "ExperimentFile",
    "RunOutcome",
    "load_experiment",
    "parse_experiment",
    "build_param_space",
    "load_data",
    "validate_search",
    "run_experiment",
    "run_dir_of",
    "DATA_SOURCES",
    "DOMAIN_KINDS",
]

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


def parse_experiment(raw: Any, *, source_path: str | None = None) -> ExperimentFile:
    """Validate a parsed experiment mapping; raises one :class:`ConfigError` listing every
    error found (``problems``: (path, message) pairs), not just the first."""
    what = f"experiment file {source_path!r}" if source_path else "the experiment"
    return validate_experiment_file(raw, what)


def load_experiment(path: str | os.PathLike[str]) -> ExperimentFile:
    """Read and validate an experiment YAML file (raises :class:`ConfigError`)."""
    p = Path(path)
    raw = read_config(p, "experiment file", "see the schema in "
                      "raydp_hpo/cli/config/experiment.py ('raydp-hpo schema' prints it as "
                      "JSON Schema) or cluster/examples/")
    return parse_experiment(raw, source_path=str(p.resolve()))


# --------------------------------------------------------------------------------- running


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
    _validate_search(spec, dataset_size, validation_size, problems)
    problems.raise_if_any(f"experiment {spec.experiment!r}")


def _validate_search(spec: ExperimentFile, dataset_size: int, validation_size: int | None,
                     problems: _Problems) -> None:
    from raydp_hpo.errors import SearchSpaceError
    from raydp_hpo.searchers import make_searcher
    from raydp_hpo.trainables.training import validate_trial_space

    space = build_param_space(spec)
    try:
        validate_trial_space(space)
    except ValueError as exc:
        problems.add("space", f"space: {exc}")
    search_budget = PrivacyBudget(spec.budget.epsilon - (spec.test_accuracy_epsilon or 0.0),
                                  spec.budget.delta)
    try:
        searcher = make_searcher(
            spec.search.algorithm,
            param_space=space,
            metric=spec.search.metric,
            mode=spec.search.mode,
            dataset_size=dataset_size,
            validation_size=validation_size,
            # the search's share: a DP test accuracy takes its ε_t from the budget first
            budget=search_budget,
            experiment=spec.experiment,
            **spec.search.settings,
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
        if spec.search.algorithm in _ENUMERATING and continuous:
            hint = (f"; in the experiment file, give space.{continuous[0]} a number of points "
                    "to take from its range (e.g. {loguniform: [0.01, 1], points: 5}: a grid "
                    "of 5 log-spaced values)")
        problems.add("space", f"space ({spec.search.algorithm}): {exc}{hint}")
    except (RayDPHPOError, ValueError) as exc:
        problems.add("search.settings", str(exc))


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
    if train_size is not None:
        _validate_search(spec, train_size, val_size, problems)
    problems.raise_if_any(f"experiment {spec.experiment!r}")
    assert data is not None and train_size is not None  # else a problem was raised
    return Preflight(data, train_size, val_size)


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


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_experiment` produced (``result`` is the :class:`DPResult`)."""

    run_dir: Path
    result: Any
    journal: Path | str
    trial_errors: int
    test_split: bool = True  # False: no test records (test_fraction 0), nothing evaluated


def _dataset_ledger_budget(spec: ExperimentFile, out: Callable[[str], None]) -> PrivacyBudget:
    """The total budget of the ledger this experiment charges (see the module docstring)."""
    journal = spec.ledger_journal()
    if spec.ledger is not None:
        out(f"[raydp-hpo] ledger {spec.ledger.name!r} named explicitly (journal {journal}); "
            f"the dataset's default ledger is {spec.data.ledger_name()!r}")
        return spec.ledger_budget
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_budget

    return dataset_ledger_budget(Path(journal), spec.budget, spec.data.fingerprint(), out)


def bind_data_to_postgres_ledger(spec: ExperimentFile, budget: PrivacyBudget,
                                 out: Callable[[str], None] = print) -> None:
    """For a PostgreSQL ledger: create it (the settings the ledger actor uses) and bind the
    data source's fingerprint to it in the registry (:func:`raydp_hpo.ledger.pg.register_dataset`).
    Data already bound to another ledger is refused (:class:`LedgerMismatchError`) before
    anything is charged: a second budget for registered data is an administrator's act.
    Nothing to do for a journal file."""
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.ledger.filter import Adaptivity, CurveCheck, PrivacyLedger
    from raydp_hpo.ledger.pg import is_postgres_uri, register_dataset

    uri = spec.ledger_journal()
    if not isinstance(uri, str) or not is_postgres_uri(uri):
        return
    PrivacyLedger(budget, uri, adaptivity=Adaptivity.ADAPTIVE, accountant=Accountant.RDP,
                  curve_check=CurveCheck.ON_DEMAND).close()
    register_dataset(uri, spec.data.fingerprint())
    out(f"[raydp-hpo] data {spec.data.fingerprint()} is bound to ledger {uri}")


def _require_earlier_charges(spec: ExperimentFile, run_dir: Path) -> None:
    """A resume attaches to ``spec.ledger_journal()``: refuse unless that journal holds the
    experiment's earlier charges (:func:`raydp_hpo.tune.tuner.require_earlier_charges`);
    the message also names the journal ``run.json`` recorded, when it is another."""
    import json

    from raydp_hpo.errors import LedgerMismatchError
    from raydp_hpo.tune.tuner import require_earlier_charges

    journal = spec.ledger_journal()
    try:
        require_earlier_charges(journal, spec.experiment)
    except LedgerMismatchError as exc:
        try:
            recorded = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get(
                "ledger_journal")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded and str(recorded) != str(journal) and (
                isinstance(journal, str) or Path(recorded) != journal):
            raise LedgerMismatchError(
                f"{exc} (its run.json records that it charged the journal {recorded}: "
                "resume with the storage_path / ledger it started with)") from None
        raise


def run_experiment(spec: ExperimentFile, *, progress_interval_s: float = 5.0,
                   out: Callable[[str], None] = print, resume: bool = False,
                   num_cpus: int | None = None, ray_temp_dir: str | None = None) -> RunOutcome:
    """Run a validated spec end to end (see the module docstring). ``resume=True`` continues
    an interrupted run of the same experiment (its charges are already on the ledger).
    A local Ray started here (``num_cpus``, ``ray_temp_dir``) is shut down before returning."""
    started = False

    def start_ray() -> None:
        nonlocal started
        started = ensure_ray(num_cpus, ray_temp_dir)

    try:
        return _run_experiment(spec, progress_interval_s, out, resume, start_ray)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run_experiment(spec: ExperimentFile, progress_interval_s: float,
                    out: Callable[[str], None], resume: bool,
                    start_ray: Callable[[], None]) -> RunOutcome:
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.ledger.actor import get_ledger
    from raydp_hpo.ledger.filter import Adaptivity
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_rule
    from raydp_hpo.tune.publish import find_release
    from raydp_hpo.tune.tuner import DPTuner

    run_dir = spec.run_dir
    if find_release(run_dir) is not None:
        raise ConfigError(
            f"experiment {spec.experiment!r} already has a release in {run_dir}; pick a new "
            "experiment name (a finished experiment is never re-run)"
        )
    started = (run_dir / "tune").exists()
    if started and not resume:
        raise ConfigError(
            f"experiment {spec.experiment!r} was started before ({run_dir}); continue it with "
            "'raydp-hpo run --resume' (what it charged stays charged), or pick a new name — a "
            "new experiment spends from the same dataset budget"
        )
    if resume and not started:
        raise ConfigError(
            f"nothing to resume: experiment {spec.experiment!r} has no run in {run_dir}; run "
            "it without --resume"
        )
    if resume:  # before Ray and the ledger actor, which would create a fresh journal
        _require_earlier_charges(spec, run_dir)
    checked = preflight(spec)  # every check, all errors at once: before Ray and any ledger
    data = checked.data
    train_size, val_size = spec.data.public_sizes()
    ledger_budget = _dataset_ledger_budget(spec, out)
    warn_if_ephemeral(spec.storage, "storage_path", out)
    bind_data_to_postgres_ledger(spec, ledger_budget, out)  # before Ray and any charge
    if isinstance(spec.ledger_journal(), Path):  # a PostgreSQL ledger is no local file
        warn_if_ephemeral(spec.ledger_journal(), "ledger journal", out)
    start_ray()
    import ray

    check_resources(spec, ray.cluster_resources(), "the Ray cluster")  # before any charge
    # a named ledger halts on the adaptive RDP filter (any charge may meet it); the dataset's
    # own composes whole experiments (raydp_hpo.tune.dataset_ledger), or keeps its rule
    adaptivity, accountant = (
        (Adaptivity.ADAPTIVE, Accountant.RDP) if spec.ledger is not None
        else dataset_ledger_rule(Path(spec.ledger_journal()))  # a dataset's own: a file
    )
    ledger = get_ledger(
        spec.ledger_name,
        ledger_budget,
        spec.ledger_journal(),
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        adaptivity=adaptivity,
        accountant=accountant,
    )
    tuner = DPTuner(
        None,
        param_space=build_param_space(spec),
        search=spec.search.algorithm,
        budget=spec.budget,
        metric=spec.search.metric,
        mode=spec.search.mode,
        data=data,
        resources=spec.resources.as_dict(),
        storage_path=spec.storage,
        ledger=ledger,
        experiment=spec.experiment,
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        search_kwargs=dict(spec.search.settings),
        max_concurrent_trials=spec.search.max_concurrent_trials,
        secret_seed=spec.secret_seed,
        dataset_size=train_size,
        validation_size=val_size,
        test_accuracy_epsilon=spec.test_accuracy_epsilon,
        test_size=spec.data.public_test_size() if spec.test_accuracy_epsilon else None,
        sizes_public=spec.data.sizes_accepted,
        tensorboard=spec.tensorboard,
        progress=out,
        progress_interval_s=progress_interval_s,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = spec.ledger_journal()
    meta = {
        "experiment": spec.experiment,
        "spec": spec.to_dict(),
        "ledger_name": spec.ledger_name,
        "ledger_journal": str(journal),  # a resume proves its charges are there
        "charge_prefix": f"{spec.experiment}/",
        "started": time.time(),
        "status": "running",
    }
    atomic_write_json(run_dir / "run.json", meta)
    out(f"[raydp-hpo] experiment {spec.experiment}: {spec.search.algorithm}, budget "
        f"ε={spec.budget.epsilon:g} δ={spec.budget.delta:g}, run dir {run_dir}")
    try:
        result = tuner.fit(resume=resume)
    except BaseException as exc:
        meta.update(status="failed", error=repr(exc)[:500], finished=time.time())
        atomic_write_json(run_dir / "run.json", meta)
        raise
    # DPTuner wrote the release into run_dir/public/ (release.json, certificate.json, model)
    errors = sum(1 for t in result.private_trials if t.get("error"))
    meta.update(
        status="budget_exhausted" if result.budget_exhausted else "finished",
        finished=time.time(),
        selected=result.hyperparameters is not None,
    )
    atomic_write_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir=run_dir, result=result, journal=journal, trial_errors=errors,
                      test_split=len(data.test) > 0)


def format_summary(outcome: RunOutcome) -> str:
    """The final summary: the release (public, covered by the certificate), the certificate,
    and, apart, the noiseless test accuracy (an evaluation NOT covered by the certificate)."""
    r = outcome.result
    lines = ["", "=" * 72, "Released (public, covered by the certificate)"]
    if r.hyperparameters is None:
        reason = (r.extras or {}).get("reason", "no configuration was selected")
        lines.append(f"  nothing is released: {reason}")
        lines.append(f"  privacy spent all the same: ε={r.certificate.epsilon:.4f} "
                     f"(δ={r.certificate.budget.delta:g})")
    else:
        for key, value in sorted(r.hyperparameters.items()):
            lines.append(f"  {key:<18} {value}")
        if r.dp_test_accuracy is not None:
            lines.append(f"  test accuracy      {r.dp_test_accuracy:.4f}  (DP: Laplace, "
                         f"ε={r.dp_test_accuracy_epsilon:g}, in the certificate)")
    lines.append(r.certificate.format())
    if r.hyperparameters is not None and not outcome.test_split:
        lines.append("Evaluation: there is no test split (data.test_fraction: 0), so the "
                     "released model was not evaluated; set data.test_fraction (or "
                     "data.test_uri) for a test accuracy")
    elif r.hyperparameters is not None:
        acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
        lines.append("Evaluation (NOT covered by the certificate: computed without noise on the "
                     "private test split; publish it only if that split is public)")
        lines.append(f"  test accuracy      {acc}")
    lines.append(f"Publish: {outcome.run_dir / 'public'} (release.json, certificate.json"
                 + (", released_model.pt" if r.model_path is not None else "")
                 + f"), as it is, or: raydp-hpo publish {outcome.run_dir} OUT_DIR")
    lines.append(f"Run dir: {outcome.run_dir} — PRIVATE except public/ (never publish the Tune "
                 "dir tune/, the ledger journal, audit.jsonl, evaluation_private.json, run.json, "
                 "the progress lines above)")
    return "\n".join(lines)
