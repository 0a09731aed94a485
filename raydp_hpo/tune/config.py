"""Ray Tune's ``TuneConfig`` / ``RunConfig`` as :class:`~raydp_hpo.tune.tuner.DPTuner` takes them.

A Tune user passes the configs they already know; :func:`resolve_tune_settings` takes from them
what cannot change the privacy plan (names, paths, concurrency, verbosity, callbacks, retries,
how many checkpoints are kept) and refuses, with an :class:`~raydp_hpo.errors.
InvalidParameterError` naming the field and the reason, whatever would break it. The reasons,
as a DP engineer states them:

* **A trial that is stopped has still paid.** Its whole planned charge is admitted before it
  touches data (the plan charge, or its own), so stopping it early saves no privacy.
* **Deciding from per-trial metrics is a selection.** Per-trial metrics other than the final
  noisy score are not released: a scheduler (ASHA, PBT, median stopping, ...), a stop
  criterion on a reported value, or a Tune search algorithm that acts on them would select on
  unprivatised values that no charge accounts for — a privacy leak.
* **The plan fixes the search.** The number of trials (secret for random stopping), the
  metric and mode the searcher selects on, and the point at which the search ends are part of
  the analysed algorithm; a cap (``num_samples``), a time budget or ``fail_fast`` would run a
  different algorithm than the one charged.

A field left at Tune's default counts as not given (``TuneConfig(reuse_actors=False)`` cannot
be told from the default: pass ``DPTuner(reuse_actors=False)``). A value given both as a
``DPTuner`` keyword and in a config must agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydp_hpo.errors import InvalidParameterError

__all__ = ["TuneSettings", "resolve_tune_settings", "DEFAULT_MAX_CONCURRENT_TRIALS"]

#: Trials running at once when neither ``max_concurrent_trials`` nor a TuneConfig sets it.
DEFAULT_MAX_CONCURRENT_TRIALS = 2

@dataclass(frozen=True)
class TuneSettings:
    """What :class:`~raydp_hpo.tune.tuner.DPTuner` takes from its keywords and Tune's configs."""

    metric: str | None  # None: not given (DPTuner takes the searcher's or its default)
    mode: str | None
    experiment: str | None
    storage_path: str | os.PathLike[str] | None
    max_concurrent_trials: int
    max_failures: int
    reuse_actors: bool
    verbose: int
    callbacks: tuple[Any, ...]
    trial_name_creator: Callable[..., str] | None = None
    trial_dirname_creator: Callable[..., str] | None = None
    checkpoint_config: Any | None = None
    sync_config: Any | None = None
    progress_reporter: Any | None = None
    log_to_file: Any = False


def _path(value: Any) -> str | None:
    return None if value is None else str(Path(value).expanduser().resolve())


def _refuse(field: str, value: Any, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}={value!r} is refused: {why}")


def _agree(name: str, kwarg: Any, field: str, value: Any) -> Any:
    """The value given as ``DPTuner(name=...)`` or in a config field; both must agree."""
    if kwarg is None:
        return value
    if value is None or value == kwarg:
        return kwarg
    raise InvalidParameterError(
        f"{field}={value!r} conflicts with DPTuner({name}={kwarg!r}); give it once"
    )


def _check_tune_config(tune_config: Any) -> None:
    from ray.tune import TuneConfig
    from ray.tune.schedulers import FIFOScheduler

    if not isinstance(tune_config, TuneConfig):
        raise InvalidParameterError(
            f"tune_config must be a ray.tune.TuneConfig, got {type(tune_config).__name__}"
        )
    if tune_config.search_alg is not None:
        raise _refuse(
            "tune_config.search_alg", type(tune_config.search_alg).__name__,
            "the DP searcher is built from DPTuner(search=...) and its privacy plan is charged "
            "before any trial runs; another search algorithm would choose trials from "
            "unreleased per-trial metrics. Pass a search_algs searcher or SearchAlgorithm as "
            "search=",
        )
    scheduler = tune_config.scheduler
    if scheduler is not None and type(scheduler) is not FIFOScheduler:
        raise _refuse(
            "tune_config.scheduler", type(scheduler).__name__,
            "a scheduler other than FIFO stops or pauses trials from their unreleased "
            "per-trial metrics — a selection no charge accounts for (a privacy leak) — and a "
            "stopped trial has paid its whole charge anyway. Remove it: the DP searcher "
            "decides which trials run",
        )
    if tune_config.num_samples not in (1, -1):
        raise _refuse(
            "tune_config.num_samples", tune_config.num_samples,
            "the DP searcher's privacy plan decides how many trials run (random stopping's "
            "number is secret); a cap would run a search the plan does not describe. Leave it "
            "unset",
        )
    if tune_config.time_budget_s is not None:
        raise _refuse(
            "tune_config.time_budget_s", tune_config.time_budget_s,
            "a time budget ends the search where the trials' running time puts it, not where "
            "the plan does, and a trial killed mid-run has paid in full. Remove it (bound the "
            "search through the algorithm's settings, e.g. random stopping's mean)",
        )


def _check_run_config(run_config: Any) -> None:
    from ray import tune

    if not isinstance(run_config, tune.RunConfig):
        import ray.train

        hint = (" (ray.train.RunConfig is Ray Train's; DPTuner runs Ray Tune)"
                if isinstance(run_config, ray.train.RunConfig) else "")
        raise InvalidParameterError(
            f"run_config must be a ray.tune.RunConfig, got {type(run_config).__name__}{hint}"
        )
    if run_config.stop is not None:
        raise _refuse(
            "run_config.stop", run_config.stop,
            "a stop criterion or Stopper ends trials early: each has paid its whole planned "
            "charge before it started, and a criterion on reported values selects on "
            "unreleased per-trial metrics. DPTuner stops the search only when the ledger "
            "refuses further charges",
        )
    if run_config.storage_filesystem is not None:
        raise _refuse(
            "run_config.storage_filesystem", type(run_config.storage_filesystem).__name__,
            "the ledger journal, Tune's experiment directory and the release are written to a "
            "local (or mounted) path that the restore reads back; use storage_path",
        )
    if getattr(run_config, "local_dir", None) is not None:
        raise _refuse("run_config.local_dir", run_config.local_dir,
                      "Ray deprecated it; use storage_path")
    failure = run_config.failure_config
    if failure is not None and failure.fail_fast:
        raise _refuse(
            "run_config.failure_config.fail_fast", failure.fail_fast,
            "it ends the whole search at the first trial error, a truncation of the plan "
            "decided by what a trial did on the data. Leave it off: a failed trial is "
            "reported to the searcher, which the plan accounts for",
        )
    ckpt = run_config.checkpoint_config
    if ckpt is not None and ckpt.checkpoint_score_attribute is not None:
        raise _refuse(
            "run_config.checkpoint_config.checkpoint_score_attribute",
            ckpt.checkpoint_score_attribute,
            "it keeps checkpoints ranked by an unreleased per-trial metric; the released model "
            "is the trial's last checkpoint. Keep num_to_keep, drop the score attribute",
        )


def resolve_tune_settings(
    *,
    tune_config: Any | None,
    run_config: Any | None,
    metric: str | None,
    mode: str | None,
    experiment: str | None,
    storage_path: str | os.PathLike[str] | None,
    max_concurrent_trials: int | None,
    max_failures: int | None,
    reuse_actors: bool | None,
    verbose: int | None,
    callbacks: Sequence[Any],
) -> TuneSettings:
    """Merge the ``DPTuner`` keywords with ``tune_config`` / ``run_config`` (either ``None``),
    refusing what would break the privacy plan (see the module docstring). No Ray is started.
    """
    if tune_config is not None:
        _check_tune_config(tune_config)
        metric = _agree("metric", metric, "tune_config.metric", tune_config.metric)
        mode = _agree("mode", mode, "tune_config.mode", tune_config.mode)
        max_concurrent_trials = _agree(
            "max_concurrent_trials", max_concurrent_trials, "tune_config.max_concurrent_trials",
            tune_config.max_concurrent_trials,
        )
        if reuse_actors is None and tune_config.reuse_actors:
            reuse_actors = True
    trial_name = None if tune_config is None else tune_config.trial_name_creator
    trial_dirname = None if tune_config is None else tune_config.trial_dirname_creator
    extra_callbacks: tuple[Any, ...] = ()
    ckpt = sync = reporter = None
    log_to_file: Any = False
    if run_config is not None:
        _check_run_config(run_config)
        from ray import tune

        default = tune.RunConfig()  # fills storage_path (~/ray_results) and verbose itself

        def given(field: str) -> Any:
            value = getattr(run_config, field)
            return None if value == getattr(default, field) else value

        experiment = _agree("experiment", experiment, "run_config.name", given("name"))
        storage_path = _agree("storage_path", _path(storage_path), "run_config.storage_path",
                              _path(given("storage_path")))
        run_verbose = given("verbose")
        verbose = _agree("verbose", verbose, "run_config.verbose",
                         None if run_verbose is None else int(run_verbose))
        failures = run_config.failure_config.max_failures if run_config.failure_config else 0
        max_failures = _agree("max_failures", max_failures,
                              "run_config.failure_config.max_failures", failures or None)
        extra_callbacks = tuple(run_config.callbacks or ())
        ckpt, sync = run_config.checkpoint_config, run_config.sync_config
        reporter, log_to_file = run_config.progress_reporter, run_config.log_to_file
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise InvalidParameterError(f"metric must be a non-empty string, got {metric!r}")
    if mode is not None and mode not in ("max", "min"):
        raise InvalidParameterError(f"mode must be 'max' or 'min', got {mode!r}")
    concurrent = DEFAULT_MAX_CONCURRENT_TRIALS if max_concurrent_trials is None else (
        max_concurrent_trials)
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise InvalidParameterError(
            f"max_concurrent_trials must be an integer >= 1, got {max_concurrent_trials!r}"
        )
    failures_n = 0 if max_failures is None else max_failures
    if isinstance(failures_n, bool) or not isinstance(failures_n, int) or failures_n < 0:
        raise InvalidParameterError(
            f"max_failures must be an integer >= 0, got {max_failures!r} (every retry from "
            "scratch pays again, so unlimited retries, -1, are refused)"
        )
    return TuneSettings(
        metric=metric,
        mode=mode,
        experiment=experiment,
        storage_path=storage_path,
        max_concurrent_trials=concurrent,
        max_failures=failures_n,
        reuse_actors=True if reuse_actors is None else bool(reuse_actors),
        verbose=0 if verbose is None else int(verbose),
        callbacks=(*tuple(callbacks), *extra_callbacks),
        trial_name_creator=trial_name,
        trial_dirname_creator=trial_dirname,
        checkpoint_config=ckpt,
        sync_config=sync,
        progress_reporter=reporter,
        log_to_file=log_to_file,
    )
