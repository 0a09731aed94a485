"""The experiment directory's restore file: the settings :meth:`DPTuner.restore` reads back.

One concern: ``dptuner.pkl`` in ``<storage_path>/<experiment>``, written when a run starts
(:func:`write_restore_file`: the constructor's settings, never data, the trainable, callbacks
or secrets), read back for a restore (:func:`restore_args`, which also checks that the caller
passes again what the file does not hold), the run id it records (:func:`recorded_run_id`), and
whether the directory holds Tune's state for a run or a resume (:func:`check_tune_state`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

if TYPE_CHECKING:
    from raydp_hpo.ledger.actor import LedgerHandle

__all__ = ["can_restore", "check_tune_state", "recorded_run_id", "restore_args", "write_restore_file"]

#: The file in an experiment directory that :meth:`DPTuner.restore` reads its settings from.
_RESTORE_FILE = "dptuner.pkl"


def can_restore(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (an experiment directory, ``DPResult.experiment_path`` or
    :attr:`DPTuner.experiment_path`) holds a DPTuner experiment that :meth:`DPTuner.restore`
    can continue: its restore file and Tune's experiment state. Starts nothing."""
    from ray import tune

    exp_dir = Path(path).expanduser()
    return (exp_dir / _RESTORE_FILE).is_file() and tune.Tuner.can_restore(
        str(exp_dir / "tune")
    )


def check_tune_state(exp_dir: Path, experiment: str, *, resume: bool) -> None:
    """Refuse a new run of an experiment whose Tune state exists at ``exp_dir``, and a resume
    of one whose Tune state does not."""
    from ray import tune

    tune_dir = exp_dir / "tune"
    if not resume and tune.Tuner.can_restore(str(tune_dir)):
        raise InvalidParameterError(
            f"experiment {experiment!r} already exists at {exp_dir}; use "
            "DPTuner.restore(path) or fit(resume=True) to continue it, or another "
            "experiment name"
        )
    if resume and not tune.Tuner.can_restore(str(tune_dir)):
        raise RayDPHPOError(f"nothing to resume at {tune_dir}; run fit() without resume=True")


def recorded_run_id(exp_dir: str | os.PathLike[str]) -> str | None:
    """The run id that the run in the experiment directory ``exp_dir`` recorded in its restore
    file when it started. A resume proves with it that it continues that run
    (:func:`require_earlier_charges`). ``None`` for a run from before run ids (its restore
    file has none, or there is no restore file): its charges are ``<experiment>/...``, so it
    can attach only to charges made before run ids existed, never to a run that has one."""
    import pickle

    path = Path(exp_dir) / _RESTORE_FILE
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        saved = pickle.load(fh)  # noqa: S301 - our own file in the private experiment dir
    run_id = saved.get("run_id") if isinstance(saved, dict) else None
    return None if run_id is None else str(run_id)


def restore_args(exp_dir: Path, search: Any, ledger: LedgerHandle | None
                 ) -> tuple[dict[str, Any], Any]:
    """The constructor keywords saved in ``exp_dir``'s restore file and the search to restore
    (``search`` if given, else the saved one), checking that ``search`` and ``ledger`` are
    passed again where the run needs them (:meth:`DPTuner.restore`)."""
    if not can_restore(exp_dir):
        raise InvalidParameterError(
            f"nothing to restore at {exp_dir}: it needs {_RESTORE_FILE} and Tune's state in "
            "tune/ (an experiment directory, DPResult.experiment_path, of a DPTuner run "
            "that started)"
        )
    import pickle

    with open(exp_dir / _RESTORE_FILE, "rb") as fh:
        saved = pickle.load(fh)  # noqa: S301 - our own file in the private experiment dir
    args = dict(saved["args"])
    # a restore file from before dataset ledgers: no ledger given meant a dedicated one
    args.setdefault("fresh_budget", saved["ledger_name"] is None)
    # a restore file from before sizes_public existed: that run's plan was charged with the
    # realised sizes treated as public, so its resume keeps them (the same normalisers)
    args.setdefault("sizes_public", True)
    saved_search = saved["search"]
    if search is None:
        if saved_search is None:
            raise InvalidParameterError(
                f"the experiment at {exp_dir} ran a constructed searcher "
                f"({saved['searcher_type']}); pass search=<the same searcher, constructed "
                "with the same arguments> to restore it"
            )
        search = saved_search
    if (saved["ledger_name"] is not None) != (ledger is not None) or (
        ledger is not None and ledger.name != saved["ledger_name"]
    ):
        raise InvalidParameterError(
            f"the experiment at {exp_dir} ran on "
            + (f"the shared ledger {saved['ledger_name']!r}: pass it as ledger="
               if saved["ledger_name"] is not None else "its dedicated ledger: pass no ledger")
            + f" (got {None if ledger is None else ledger.name!r})"
        )
    from raydp_hpo.searchers import DPSearcher

    if isinstance(search, DPSearcher) and search.has_space:
        args.pop("param_space")  # the searcher's own (its restored state checks the plan)
    return args, search


def write_restore_file(exp_dir: Path, *, init_args: dict[str, Any], search: Any,
                       ledger_name: str | None, run_id: str | None) -> None:
    """What :meth:`restore` needs: the constructor's settings, without data, trainable,
    callbacks or secrets (the secret seed is never written; a constructed searcher is
    passed again, its secret state is in Tune's searcher checkpoint)."""
    import pickle

    from raydp_hpo._atomic_io import atomic_write_bytes
    from raydp_hpo.searchers import DPSearcher

    constructed = isinstance(search, DPSearcher)
    payload = {
        "version": 1,
        "args": init_args,
        "search": None if constructed else search,
        "searcher_type": type(search).__name__,
        "ledger_name": ledger_name,
        "run_id": run_id,  # what a resume proves on the ledger (_attach_run)
    }
    exp_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(exp_dir / _RESTORE_FILE, pickle.dumps(payload))
