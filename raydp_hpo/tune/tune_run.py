"""The Ray Tune run a :class:`~raydp_hpo.tune.tuner.DPTuner` starts.

One concern: what DPTuner hands Ray Tune — the trainable, its callbacks (the ledger audit trail, progress
lines, no TensorBoard files unless asked for), the ``RunConfig`` and ``TuneConfig`` built from
the settings :mod:`raydp_hpo.tune.config` checked, and Tune's own restore for a resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.tune.config import TuneSettings

__all__ = ["restore_tune", "run_callbacks", "trainable_with_data", "tune_configs"]


def run_callbacks(ledger: LedgerHandle, exp_dir: Path, callbacks: Sequence[Any], *,
                  progress: Callable[[str], None] | None, epsilon: float, metric: str, mode: str,
                  progress_interval_s: float, tensorboard: bool) -> list[Any]:
    """The run's Tune callbacks: the ledger audit trail (``<exp_dir>/audit.jsonl``), the
    caller's ``callbacks``, progress lines if ``progress`` is given, and no TensorBoard
    files unless ``tensorboard`` or a ``TBXLoggerCallback`` asks for them."""
    from ray.tune.logger import TBXLoggerCallback

    from raydp_hpo.tune.hooks import LedgerAuditCallback, NoTensorBoardLogger, ProgressCallback

    out = [LedgerAuditCallback(ledger, exp_dir / "audit.jsonl"), *callbacks]
    if progress is not None:
        out.append(ProgressCallback(
            ledger, epsilon, metric, mode,
            out=progress, interval_s=progress_interval_s,
        ))
    if not tensorboard and not any(
        isinstance(c, TBXLoggerCallback) for c in callbacks
    ):
        out.append(NoTensorBoardLogger())
    return out


def tune_configs(settings: TuneSettings, exp_dir: Path, *, searcher: Any, stopper: Any,
                 callbacks: list[Any], verbose: int, max_failures: int,
                 max_concurrent_trials: int, reuse_actors: bool) -> tuple[Any, Any]:
    """Tune's ``RunConfig`` (results under ``<exp_dir>/tune``) and ``TuneConfig`` (the DP
    searcher as the search algorithm, no cap on samples: the searcher ends the search)."""
    from ray import tune

    opt = settings
    run_config = tune.RunConfig(
        name="tune",
        storage_path=str(exp_dir),
        stop=stopper,
        callbacks=callbacks,
        verbose=verbose,
        failure_config=tune.FailureConfig(max_failures=max_failures),
        checkpoint_config=opt.checkpoint_config,
        sync_config=opt.sync_config,
        progress_reporter=opt.progress_reporter,
        log_to_file=opt.log_to_file,
    )
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        num_samples=-1,
        max_concurrent_trials=max_concurrent_trials,
        reuse_actors=reuse_actors,
        trial_name_creator=opt.trial_name_creator,
        trial_dirname_creator=opt.trial_dirname_creator,
    )
    return run_config, tune_config


def restore_tune(tune_dir: Path, trainable: Any, *, callbacks: list[Any], stopper: Any) -> Any:
    """Tune's tuner restored from ``tune_dir`` (unfinished trials resumed, errored ones not),
    with this run's callbacks and stopper in place of those Tune pickled."""
    from ray import tune

    tuner = tune.Tuner.restore(
        str(tune_dir),
        trainable,
        resume_unfinished=True,
        resume_errored=False,
        restart_errored=False,
    )
    # Tune restores the run config it pickled when the run started; this run's ledger
    # handle, stopper and callbacks (progress, the caller's) take the place of those.
    internal = getattr(tuner, "_local_tuner", None)
    if internal is not None:
        restored = internal.get_run_config()
        restored.callbacks = callbacks
        restored.stop = stopper
    return tuner


def trainable_with_data(trainable: Any | None, data: Any, resources: dict[str, float],
                        secret_seed: int | None) -> Any:
    """The trainable Tune runs: the user's (Tune's strict metric check off), else the
    built-in one on ``data``."""
    if trainable is not None:
        # A user trainable's intermediate reports (trial.report) carry no score, and a
        # score under another key is diagnosed with its fix after the run
        # (raydp_hpo.tune.custom): Tune's strict metric check would abort the run instead,
        # before the certificate of what was spent is written.
        os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
        return trainable
    from raydp_hpo.trainables import make_trainable

    return make_trainable(data, resources, secret_seed=secret_seed)
