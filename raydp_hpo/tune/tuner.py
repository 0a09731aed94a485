"""``DPTuner``: one DP hyperparameter search against one total budget, and its release.

Orchestration layer: the only place that wires a search algorithm (``raydp_hpo.searchers``), the DP
trainable (``raydp_hpo.trainables``), the ledger actor and Ray Tune together.

Data flow of :meth:`DPTuner.fit` (DESIGN.md, "Data flow of one run"):

1. Ray is used if already initialised (a Ray program, a Ray task), else a local one starts.
2. The ledger: the one given (``ledger=``, a shared ledger); by default the **dataset's
   ledger** (:mod:`raydp_hpo.tune.dataset_ledger`: named from the data, journaled under
   ``storage_path/ledgers``, the same one ``raydp-hpo run`` charges, so every experiment on
   the same data spends from one budget); or, only when asked for with
   ``fresh_budget=True`` (logged), a dedicated one for this experiment, journaled under
   ``storage_path/<experiment>``. A dedicated ledger halts with
   ``Adaptivity.FIXED_PLAN`` (``ADAPTIVE``, the RDP filter, when trials may be retried or the
   searcher is not a built-in one: :meth:`DPTuner._dedicated_adaptivity`) because every search here fixes its privacy plan from the
   configuration alone before any data is touched (configs are drawn from the searcher's
   own RNG, charges are stated up front), so standard composition applies, and it admits
   (and the searcher calibrates its noise) on the tightest valid bound, ``Accountant.PROFILE``
   (the minimum of the RDP, PLD and privacy-profile figures).
3. The searcher gets the space, metric and mode through Tune's ``set_search_properties``,
   with the ledger name and experiment this tuner assigns; it states its plan, and the plan is
   charged **before** any trial runs. A refusal raises
   :class:`~raydp_hpo.errors.BudgetExhaustedError` and nothing runs. A fresh dedicated
   ledger's plan is charged by the driver itself on the ledger's journal, and the ledger's
   actor is started only then, beside the trials: it replays the journal and refuses to
   start without that record (:func:`raydp_hpo.ledger.actor.charge_before_start`). The settings that
   :meth:`DPTuner.restore` needs (no data, no secret seed) are written to the experiment
   directory first.
4. Ray Tune runs the trials; each checks its own mechanism against the ledger before
   training. A trial covered by the admitted plan gets the plan's receipt (where its charge
   lies in the journal) with its config and checks the journal file locally, with no ledger
   round trip (:mod:`raydp_hpo.ledger.plan_receipt`); a trial that charges itself asks the ledger. Searches whose trials charge individually are stopped by :class:`LedgerStopper`
   once the ledger refuses.
5. The searcher's release names the hyperparameters and the trial whose model is released;
   the model is loaded from that trial's checkpoint, and a certificate states every charge.

Released vs private: :class:`DPResult` exposes ``hyperparameters``, ``model`` and
``certificate`` as the public part (``test_accuracy`` is a noiseless evaluation on the private
test split for the operator, not covered by the certificate); ``private_trials`` and
``private_result_grid`` (per-trial metrics, Tune's ``ResultGrid``), the number of trials and
Tune's experiment directory are **not covered by the guarantee** and must not be published.
The experiment directory ``<storage_path>/<experiment>`` (default storage ``~/raydp_results``)
is private except its ``public/`` folder, which holds exactly the release
(:mod:`raydp_hpo.tune.publish`; :meth:`DPResult.save_public` copies it).

This module is :class:`DPTuner` itself: construction, the ledgers it charges, :meth:`DPTuner.fit`,
:meth:`DPTuner.restore` and the run. Its other concerns live beside it: the certificate
(:mod:`.certificate`), :class:`DPResult` (:mod:`.result`), the release it builds
(:class:`~.release.ReleaseBuilder`) and the experiment's place on a dataset ledger
(:class:`~.dataset_points.DatasetPlace`), objects it composes with explicit inputs, the
public sizes (:mod:`.sizes`), whose ledger is charged and the rules that admit its charges
(:mod:`.ledger_rules`, with :func:`require_earlier_charges`), the searcher's setup
(:mod:`.searcher_setup`), the Tune run it starts (:mod:`.tune_run`), the restore file
(:mod:`.restore_file`) and what a run prints (:mod:`.run_output`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import default_storage_path, warn_if_ephemeral
from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import (
    BudgetTooSmallError,
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.actor import (
    DEFAULT_NAMESPACE,
    LedgerHandle,
    charge_before_start,
    may_charge_before_start,
    start_ledger,
)
from raydp_hpo.ledger.filter import Adaptivity
from raydp_hpo.ledger.plan_receipt import PlanReceipt
from raydp_hpo.tune.certificate import PrivacyCertificate
from raydp_hpo.tune.dataset_ledger import shared_ledger
from raydp_hpo.tune.dataset_points import DatasetPlace, PointRequest, search_share
from raydp_hpo.tune.ledger_rules import (
    _BothRules,
    _FirstChargeRule,
    _resumed_accountant,
    _SharedLedgerRule,
    _whose_budget,
    charge_prefix,
    dedicated_adaptivity,
    plan_charged_up_front,
    refuse_retries_under_a_plan,
    require_earlier_charges,
    say_if_adaptive_filter,
    say_if_name_used,
)
from raydp_hpo.tune.publish import PUBLIC_DIR, write_private_note
from raydp_hpo.tune.release import ReleaseBuilder
from raydp_hpo.tune.release_claim import claim_release, refuse_if_released
from raydp_hpo.tune.restore_file import (
    _RESTORE_FILE,
    can_restore,
    check_tune_state,
    recorded_run_id,
    restore_args,
    write_restore_file,
)
from raydp_hpo.tune.result import DPResult
from raydp_hpo.tune.run_output import _ledger_refusals_without_traceback, _quiet_tune_output
from raydp_hpo.tune.searcher_setup import (
    check_search_and_space,
    check_selection_inputs,
    make_dp_searcher,
    resolve_auto_search,
    searcher_metric_mode,
)
from raydp_hpo.tune.sizes import _resolve_sizes
from raydp_hpo.tune.tune_run import (
    restore_tune,
    run_callbacks,
    trainable_with_data,
    tune_configs,
)

__all__ = ["DPTuner", "DPResult", "PrivacyCertificate", "require_earlier_charges",
           "recorded_run_id"]

_log = logging.getLogger(__name__)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


class DPTuner:
    """Run one DP hyperparameter search on Ray Tune within one total privacy budget.

    Shaped like ``ray.tune.Tuner``: ``DPTuner(trainable, *, param_space=..., search=...,
    budget=..., tune_config=..., run_config=...)``, then :meth:`fit`; :meth:`restore` and
    :meth:`can_restore` continue an interrupted experiment. Every argument after the
    trainable is a keyword.

    Args:
        trainable: the Tune trainable (e.g. ``raydp_hpo.trainables.make_trainable(data)``), or ``None``
            to build the default Opacus trainable from ``data`` and ``resources``.
        param_space: the search space (dict of ``ray.tune`` domains / constants); the
            searcher samples it itself. It reaches the searcher through Tune's
            ``set_search_properties`` (``None``: the constructed searcher's own space).
        search: a ``raydp_hpo.searchers.SearchAlgorithm`` (or its value) or a constructed
            ``DPSearcher`` (then ``search_kwargs`` must be empty), with or without its own
            space. The tuner assigns it the ledger name, namespace and experiment name.
            ``"auto"`` (the default): the searcher and its settings are read off the measured
            table from the search's ε, the space and a compute limit (``search_kwargs``
            ``compute_limit``, default 25 one-shot runs, ``max_gradient_evaluations``,
            ``max_trials``; :mod:`raydp_hpo.searchers.auto`), then run exactly as if named;
            the certificate's ``auto_search`` says what was chosen and why. An :class:`~raydp_hpo.searchers.auto.AutoChoice`
            (``choose_auto(...)``) runs that choice.
        budget: the total (ε, δ) of this experiment.
        tune_config, run_config: Ray Tune's ``ray.tune.TuneConfig`` / ``ray.tune.RunConfig``.
            What cannot change the privacy plan is taken (metric, mode, max_concurrent_trials,
            reuse_actors, trial name creators; name → ``experiment``, storage_path, verbose,
            callbacks, ``failure_config.max_failures``, checkpoint_config's ``num_to_keep``,
            sync_config, progress_reporter, log_to_file); what would break it is refused with
            an :class:`~raydp_hpo.errors.InvalidParameterError` before Ray starts — a search
            algorithm, a scheduler other than FIFO, ``num_samples``, ``time_budget_s``, a stop
            criterion, ``fail_fast``, a checkpoint score attribute (reasons:
            :mod:`raydp_hpo.tune.config`). A value given both here and as a keyword must agree.
        metric, mode: the reported metric and whether to ``"max"`` or ``"min"`` it (default:
            the constructed searcher's, else ``"val_accuracy"`` / ``"max"``).
        data: the ``raydp_hpo.trainables.DataSplits`` (needed for the public dataset size, the default
            trainable and loading the released model).
        resources: per-trial resources, e.g. ``{"cpu": 1, "gpu": 0}``.
        storage_path: where the experiment directory ``<storage_path>/<experiment>`` goes
            (Tune results, the dedicated ledger journal, the release in its ``public/``
            folder) and the dataset ledgers' journals (``<storage_path>/ledgers/<name>``, as
            ``raydp-hpo run`` puts them). Default ``~/raydp_results``, or
            ``$RAYDP_HPO_STORAGE`` when set — never the working directory, which in a Ray Job
            is Ray's temporary copy of the job's files. A path under a temporary directory or
            a Ray working/session dir gets an :class:`~raydp_hpo.errors.
            EphemeralStorageWarning`: a deleted journal resets the budget.
        ledger: a shared :class:`LedgerHandle` to charge. Default ``None``: the **dataset's
            ledger** (the budget belongs to the data, as on the CLI): named from ``dataset``
            or ``data.name``; the first experiment on the data creates it with ``budget`` as
            the dataset's total, later ones spend from what is left, each at most its own
            ``budget.epsilon`` (:mod:`raydp_hpo.tune.dataset_ledger`).
        dataset: the identity of the data whose budget this search spends, e.g.
            ``"census-2024"`` (default: ``data.name``, which the built-in loaders and
            ``load_parquet`` set: ``"digits"``, ``"mnist1d:size=6000:generator_seed=42"``,
            ``"parquet:file:///..."``). Public: it names the budget, not the records.
        fresh_budget: ``True`` gives this experiment a dedicated ledger with exactly
            ``budget`` that no other experiment sees (its actor is stopped when ``fit``
            returns; its journal under ``storage_path/<experiment>`` stays and is the record).
            An explicit choice, logged: a budget per experiment is how tuning 200
            configurations ends up reported as one run's ε.
        experiment: experiment name; default: a fresh unique one. Every charge id of a run is
            ``<experiment>@<run id>/...``, the run id fresh for every run (:attr:`run_id`, OS
            entropy): a second run under a used name pays again, never replays the first
            run's charge; only :meth:`restore` / ``fit(resume=True)`` continue a run's
            charges, with the run id its experiment directory records.
        search_kwargs: algorithm-specific keyword arguments, ``preset`` included (e.g.
            ``{"preset": "tnb20"}``, :data:`raydp_hpo.searchers.PRESETS`); unknown ones are
            refused here, all at once.
        max_concurrent_trials: trials running at once (default 2).
        max_failures: how often Tune retries a failed trial (default 0). **Every retry that
            starts from scratch pays again**: a trial that charges itself (``grid_composed``)
            charges its mechanism under a fresh attempt id ``<trial charge id>/attempt-k``
            (:mod:`raydp_hpo.trainables.privacy_gate`), and a retry from a checkpoint continues inside
            the charge the checkpoint records. Trials covered by a plan charge cannot pay per
            attempt (the plan charged each covered trial once), so ``max_failures > 0`` is
            refused for a search with a plan charge.
        callbacks: extra ``ray.tune.Callback`` objects (logging); they see per-trial results,
            which are private.
        progress: ``progress(line)`` receives progress lines (trials, best noisy score so
            far, ε spent; :class:`~raydp_hpo.tune.hooks.ProgressCallback`) at most every
            ``progress_interval_s``; ``None`` (default): none. The lines are private (they
            count trials).
        tensorboard: also write Tune's per-trial TensorBoard event files (default ``False``:
            they repeat the per-trial metrics of ``result.json``, a private artefact, and cost
            Tune's controller ~4-7 ms per trial; see :class:`~raydp_hpo.tune.hooks.
            NoTensorBoardLogger`). A ``TBXLoggerCallback`` in ``callbacks`` also turns it on.
        reuse_actors: reuse trial worker processes between trials (default ``True``: much less
            start-up time; each trial still builds its own model, RNGs and charge).
        secret_seed: default ``None``: every secret draw (random stopping's K, subsample and
            partition seeds, SVT noise, and — with the built-in trainable — DP-SGD noise,
            Poisson batches and score noise) comes from OS entropy. A given seed makes the run
            reproducible; anyone who knows it can regenerate the noise, so it must be kept as
            secret as the data. It is never written to a config, release, certificate or log
            (nor to the restore file: pass it again to :meth:`restore`).
        test_accuracy_epsilon: ε_t of a DP test accuracy of the released model (default
            ``None``: none). The search then gets the budget ε − ε_t, and after it the released
            model's count of correct test predictions is released with Laplace noise of scale
            1/ε_t (sensitivity 1 under add/remove; :func:`raydp_hpo.accounting.calibration.
            calibrate_laplace`) over the declared test size, as its own ``Laplace(ε_t)`` charge.
        test_size: the declared public number of test records, the DP test accuracy's
            normaliser (needed with ``test_accuracy_epsilon``).
        dataset_size, validation_size: the declared **public** numbers of training and
            validation records. The training size n is needed by every run (q from
            ``batch_size``, the DP-SGD normaliser q·n, and ``config["raydp"]["dataset_size"]``
            of every trial), unless a searcher constructed with its own space declares it; the
            validation size n_val when a selection reads privatised scores (``score_epsilon``
            not ``None``, or SVT's partition utility) — the score is the noisy correct count
            over n_val. Default: ``data.declared_sizes`` (set by :func:`raydp_hpo.trainables.
            split` from a dataset of public size: the built-in loaders), else a needed size is
            **refused** (:class:`~raydp_hpo.errors.InvalidParameterError` naming it): the
            realised sizes are private — one record added or removed changes them, and a
            normaliser read off them moves a score by more than its noise covers.
        sizes_public: ``True`` accepts the realised sizes of ``data`` as public where none is
            declared, and a number of classes read off the labels (``load_parquet`` without
            ``num_classes``, refused otherwise); a warning says so and the certificate lists
            them as taken from the data and treated as public. Declaring them is the
            data-independent alternative.
    """

    def __init__(
        self,
        trainable: Any | None = None,
        *,
        param_space: Mapping[str, Any] | None = None,
        search: Any = "auto",
        budget: PrivacyBudget,
        data: Any,
        tune_config: Any | None = None,
        run_config: Any | None = None,
        metric: str | None = None,
        mode: str | None = None,
        resources: Mapping[str, float] | None = None,
        storage_path: str | os.PathLike[str] | None = None,
        ledger: LedgerHandle | None = None,
        dataset: str | None = None,
        fresh_budget: bool = False,
        experiment: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        search_kwargs: Mapping[str, Any] | None = None,
        max_concurrent_trials: int | None = None,
        max_failures: int | None = None,
        secret_seed: int | None = None,
        dataset_size: int | None = None,
        validation_size: int | None = None,
        test_accuracy_epsilon: float | None = None,
        test_size: int | None = None,
        sizes_public: bool = False,
        verbose: int | None = None,
        callbacks: Sequence[Any] = (),
        progress: Callable[[str], None] | None = None,
        progress_interval_s: float = 5.0,
        reuse_actors: bool | None = None,
        tensorboard: bool = False,
    ) -> None:
        from raydp_hpo._validation import positive_float, positive_int
        from raydp_hpo.searchers import DPSearcher, check_search_settings
        from raydp_hpo.trainables.data import DataSplits
        from raydp_hpo.tune.config import resolve_tune_settings

        if not isinstance(budget, PrivacyBudget):
            raise InvalidParameterError(f"budget must be a PrivacyBudget, got {budget!r}")
        if not isinstance(data, DataSplits):
            raise InvalidParameterError(f"data must be raydp_hpo.trainables.DataSplits, got {type(data)!r}")
        # declared public sizes (None: from the searcher or data.declared_sizes, or refused;
        # the realised ones only with sizes_public=True: _resolve_sizes)
        dataset_size, validation_size, test_size = (
            None if v is None else positive_int(name, v)
            for name, v in (("dataset_size", dataset_size), ("validation_size", validation_size),
                            ("test_size", test_size))
        )
        self._test_epsilon: float | None = (
            None if test_accuracy_epsilon is None
            else positive_float("test_accuracy_epsilon", test_accuracy_epsilon)
        )
        self._search_budget = search_share(budget, self._test_epsilon)  # ε − ε_t
        if not isinstance(sizes_public, bool):
            raise InvalidParameterError(f"sizes_public must be True or False, got {sizes_public!r}")
        self._sizes_public = sizes_public
        # search="auto" (or an AutoChoice): the searcher and settings read off the measured
        # table, from public inputs only (the validated ones above); then run exactly as if
        # they had been named
        search, search_kwargs, self._auto_choice = resolve_auto_search(
            search, search_kwargs, param_space=param_space,
            epsilon=self._search_budget.epsilon, data=data, dataset_size=dataset_size,
            sizes_public=sizes_public, progress=progress or _log.info)
        search = check_search_and_space(search, param_space)
        if ledger is not None and not isinstance(ledger, LedgerHandle):
            raise InvalidParameterError(f"ledger must be a LedgerHandle, got {ledger!r}")
        self._dataset = _whose_budget(ledger, dataset, fresh_budget, data)
        self._fresh_budget = fresh_budget
        self._place: DatasetPlace | None = None  # this run's place on a dataset ledger (fit)
        settings = resolve_tune_settings(
            tune_config=tune_config,
            run_config=run_config,
            metric=metric,
            mode=mode,
            experiment=experiment,
            storage_path=storage_path,
            max_concurrent_trials=max_concurrent_trials,
            max_failures=max_failures,
            reuse_actors=reuse_actors,
            verbose=verbose,
            callbacks=callbacks,
        )
        metric, mode = settings.metric, settings.mode
        metric, mode = searcher_metric_mode(search, metric, mode)
        self._settings = settings
        self._trainable = trainable
        self._space = dict(param_space) if param_space is not None else dict(search._space)
        self._search = search
        self._budget = budget
        self._metric = metric if metric is not None else "val_accuracy"
        self._mode = mode if mode is not None else "max"
        self._data = data
        self._resources = dict(resources or {"cpu": 1})
        # default ~/raydp_results ($RAYDP_HPO_STORAGE), never the working dir: inside a Ray
        # Job that is Ray's temporary copy of the job's files, deleted with the job
        self._storage = (Path(settings.storage_path).expanduser().resolve()
                         if settings.storage_path else default_storage_path())
        warn_if_ephemeral(self._storage, "DPTuner storage_path (results and the dedicated "
                          "ledger journal)")
        self._ledger = ledger
        self._experiment = _safe_name(settings.experiment or f"exp-{time.strftime('%Y%m%d-%H%M%S')}-"
                                      f"{uuid.uuid4().hex[:6]}")
        # a fresh random id for this run (OS entropy): every charge it makes carries it
        # (:meth:`_set_run_id`), so a run under a used name pays again; only a resume reads
        # back the id of the run it continues (from its own experiment directory)
        self._set_run_id(secrets.token_hex(8))
        self._namespace = namespace
        self._search_kwargs = dict(search_kwargs or {})
        if not isinstance(search, DPSearcher):  # a misspelled setting fails here, not in fit
            check_search_settings(search, self._search_kwargs)
        self._max_concurrent = settings.max_concurrent_trials
        self._max_failures = settings.max_failures
        if self._max_failures > 0:
            refuse_retries_under_a_plan(self._max_failures, plan_charged_up_front(self._search))
        if secret_seed is not None and (
            isinstance(secret_seed, bool) or not isinstance(secret_seed, int)
        ):
            raise InvalidParameterError(f"secret_seed must be an int or None, got {secret_seed!r}")
        self._secret_seed = secret_seed

        sizes = _resolve_sizes(data, search, self._search_kwargs, sizes_public=sizes_public,
                               declared=(dataset_size, validation_size, test_size),
                               test_release=self._test_epsilon is not None)
        self._sizes = sizes
        self._dataset_size, self._validation_size, self._test_size = (s.value for s in sizes)
        self._verbose = settings.verbose
        self._callbacks = list(settings.callbacks)
        self._reuse_actors = settings.reuse_actors
        self._tensorboard = bool(tensorboard)
        self._progress = progress
        self._progress_interval = positive_float("progress_interval_s", progress_interval_s)
        # what restore() needs besides data, trainable and secrets (see _restore_args)
        self._init_args: dict[str, Any] = {
            "param_space": self._space, "budget": budget, "metric": self._metric,
            "mode": self._mode, "resources": self._resources, "namespace": namespace,
            # an AutoChoice (the restore file's search) carries its settings
            "search_kwargs": {} if self._auto_choice is not None else self._search_kwargs,
            "max_concurrent_trials": self._max_concurrent,
            "max_failures": self._max_failures, "dataset_size": dataset_size,
            "validation_size": validation_size, "test_accuracy_epsilon": test_accuracy_epsilon,
            "test_size": test_size, "sizes_public": sizes_public, "verbose": self._verbose,
            "reuse_actors": self._reuse_actors, "tensorboard": self._tensorboard,
            "dataset": self._dataset, "fresh_budget": fresh_budget,
        }
        self._resume = False

    @property
    def experiment(self) -> str:
        return self._experiment

    @property
    def run_id(self) -> str | None:
        """This run's random id, carried by every charge it makes (``<experiment>@<run id>/
        ...``): fresh for every run, read back from the experiment directory on a resume
        (``None``: a resumed run started before run ids, whose charges are
        ``<experiment>/...``)."""
        return self._run_id

    def _set_run_id(self, run_id: str | None) -> None:
        """The run id, and the prefix of every charge id of this run: ``<experiment>@<run
        id>`` (:func:`charge_prefix`)."""
        self._run_id = run_id
        self._charge_prefix = charge_prefix(self._experiment, run_id)

    @property
    def experiment_path(self) -> Path:
        """The experiment directory (``storage_path/experiment``): what :meth:`restore` and
        :meth:`can_restore` take. A private artefact (Tune's trials, the audit trail)."""
        return self._storage / self._experiment

    # ------------------------------------------------------------------ pieces
    @property
    def ledger_name(self) -> str:
        """Name of the ledger actor trials charge/check: the one given, the dataset's, or the
        dedicated one (``fresh_budget=True``)."""
        if self._place is not None:  # within its point on a dataset ledger: its own ledger
            return f"ledger-{self._experiment}"
        if self._ledger is not None:
            return self._ledger.name
        if self._dataset is not None:
            from raydp_hpo.trainables.data import dataset_ledger_name

            return dataset_ledger_name(self._dataset)
        return f"ledger-{self._experiment}"

    def _dedicated_adaptivity(self) -> Adaptivity:
        """:func:`~raydp_hpo.tune.ledger_rules.dedicated_adaptivity` of this search."""
        return dedicated_adaptivity(self._search, self._max_failures)

    def _point_request(self) -> PointRequest:
        """What this experiment asks of a dataset ledger (:class:`DatasetPlace`)."""
        adaptivity = self._dedicated_adaptivity()
        return PointRequest(
            experiment=self._experiment, charge_prefix=self._charge_prefix,
            budget=self._budget, test_epsilon=self._test_epsilon, adaptivity=adaptivity,
            plan_is_point=(adaptivity is Adaptivity.FIXED_PLAN
                           and bool(plan_charged_up_front(self._search))))

    def _dedicated_journal(self) -> Path:
        return self._storage / self._experiment / "ledger.journal"

    def _start_dedicated(self, handle: LedgerHandle, adaptivity: Adaptivity,
                         accountant: Accountant, expect_charge: PlanReceipt | None = None
                         ) -> None:
        """Start (or attach to) the dedicated ledger's actor without waiting: ``_fit``
        verifies it before relying on it."""
        start_ledger(handle, self._budget, self._dedicated_journal(), adaptivity=adaptivity,
                     accountant=accountant, expect_charge=expect_charge)

    def _build_searcher(self, shared: LedgerHandle | None, dedicated: Adaptivity | None) -> Any:
        """The DP searcher, given its space, metric and mode through Tune's
        ``set_search_properties`` together with the ledger name, namespace and experiment this
        tuner assigns (:data:`raydp_hpo.searchers.base.TUNER_ASSIGNED`), and — for a searcher built
        without a space — the declared sizes, budget, secret seed and the ledger's admission
        rule where its constructor did not get them."""
        searcher = make_dp_searcher(self._search, self._search_kwargs, metric=self._metric,
                                    mode=self._mode, validation_size=self._validation_size)
        budget = self._search_budget
        plan_id = f"{self._charge_prefix}/plan"
        admissible: Any
        if shared is None:
            assert dedicated is not None
            # The dedicated ledger holds only this experiment's charges: judge the plan as its
            # first charge — locally, the same on a first run and on resume (where the ledger
            # already holds this very plan and must not count it twice).
            admissible = _FirstChargeRule(budget, dedicated)
            point_rule = None if self._place is None else self._place.plan_rule
            if point_rule is not None:  # and admitted as its point on the dataset ledger
                admissible = _BothRules(admissible, point_rule)
            ledger_name, namespace = self.ledger_name, self._namespace
        else:
            ledger = shared
            ledger_name, namespace = ledger.name, ledger.namespace
            # A shared ledger: its own rule, unless this experiment's plan is already on it
            # (resume: the charge is replayed by id, not added).
            admissible = _SharedLedgerRule(budget, ledger, ledger.has_charge(plan_id))

        space = {} if searcher.has_space else self._space
        accepted = searcher.set_search_properties(
            self._metric,
            self._mode,
            space,
            ledger_name=ledger_name,
            namespace=namespace,
            experiment=self._charge_prefix,  # every charge id of this run carries its run id
            dataset_size=self._dataset_size,
            validation_size=self._validation_size,
            budget=budget,
            seed=self._secret_seed,
            admissible=admissible,
        )
        if not accepted:
            raise InvalidParameterError(
                f"the searcher {type(searcher).__name__} refused metric={self._metric!r}, "
                f"mode={self._mode!r}: construct it with the metric and mode DPTuner selects on"
            )
        return searcher

    # ------------------------------------------------------------------ fit
    def fit(self, *, resume: bool | None = None) -> DPResult:
        """Charge the plan, run the search, release hyperparameters + model + certificate.

        ``resume=True`` continues an interrupted experiment of the same name and storage path
        with ``Tuner.restore``: the ledger is re-attached from its journal, the plan charge is
        replayed by its id (never charged twice), the searcher's saved state (including its
        secret draws) is restored, and unfinished trials continue from their checkpoints
        (a trial that must start over pays again; a self-charging trial also pays for the
        steps it reruns; errored trials are not rerun). A plan-covered trial continues inside
        the plan charge: this assumes the interruption of the driver did not depend on the
        data (trials run in their own processes, so their outputs cannot stop the driver; an
        operator or an out-of-memory kill that correlates with the data is outside it). A
        tuner from :meth:`restore` resumes by default. A resume is refused unless the ledger
        it attaches to holds the earlier charges of the run its experiment directory records
        (its run id, :func:`recorded_run_id`; :func:`require_earlier_charges`): a moved
        journal is never a fresh budget, and another run's charges are never its own.

        A search that selects nothing, for any reason (every trial failed, a failed final
        run, K = 0 drawn, the ledger refused the trials first), raises
        :class:`~raydp_hpo.errors.SearchFailedError` after the certificate of what it spent
        is written (``public/release.json``: ``"selected": false`` and the ``reason``); the
        error's ``result`` is the :class:`DPResult`.
        """
        resume = self._resume if resume is None else bool(resume)
        ensure_ray()
        started: list[LedgerHandle] = []  # the dedicated ledger's actor, once started
        try:
            shared = shared_ledger(
                self._ledger, self._dataset, self._storage, self._data.name, self._budget,
                experiment=self._experiment, namespace=self._namespace, progress=self._progress,
                log=_log)
            return self._fit(shared, started, resume=resume)
        finally:
            for ledger in started:
                # The dedicated ledger serves this run only: its journal is the record
                # (`raydp-hpo ledger show`), and a resume re-creates the actor from it. A
                # detached actor left behind per experiment would pile up on the cluster.
                with contextlib.suppress(Exception):  # never mask the run's own outcome
                    ledger.kill()

    # ------------------------------------------------------------------ restore
    @classmethod
    def can_restore(cls, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` (an experiment directory, ``DPResult.experiment_path`` or
        :attr:`experiment_path`) holds a DPTuner experiment that :meth:`restore` can continue:
        its restore file and Tune's experiment state. Starts nothing."""
        return can_restore(path)

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        trainable: Any | None = None,
        *,
        data: Any,
        search: Any = None,
        ledger: LedgerHandle | None = None,
        secret_seed: int | None = None,
        callbacks: Sequence[Any] = (),
        progress: Callable[[str], None] | None = None,
        progress_interval_s: float = 5.0,
    ) -> DPTuner:
        """A tuner that continues the interrupted experiment at ``path`` (like
        ``ray.tune.Tuner.restore``); call :meth:`fit` on it.

        The settings (space, search algorithm and its keywords, budget, metric, declared sizes,
        ...) come from the experiment's restore file, written when it started. What is not
        written there is passed again: ``data`` and ``trainable`` (as for the constructor),
        ``secret_seed`` if the run had one (a secret, never written), a shared ``ledger`` if it
        used one, ``search`` when it was a constructed searcher (construct it with the same
        arguments: its saved state, secret draws included, is restored into it and a different
        plan is refused), and callbacks / progress. Nothing is charged twice: the plan charge is
        replayed by its id — which carries the run id recorded in ``path``, so a restore
        attaches only to the charges of that run — and trials continue inside their admitted
        charges.
        """
        exp_dir = Path(path).expanduser().resolve()
        args, search = restore_args(exp_dir, search, ledger)
        tuner = cls(
            trainable,
            search=search,
            data=data,
            ledger=ledger,
            secret_seed=secret_seed,
            callbacks=callbacks,
            progress=progress,
            progress_interval_s=progress_interval_s,
            storage_path=exp_dir.parent,
            experiment=exp_dir.name,
            **args,
        )
        tuner._resume = True
        return tuner

    def _write_restore_file(self, exp_dir: Path) -> None:
        """:func:`~raydp_hpo.tune.restore_file.write_restore_file` of this tuner's settings."""
        write_restore_file(exp_dir, init_args=self._init_args,
                           search=self._search if self._auto_choice is None
                           else self._auto_choice,
                           ledger_name=None if self._ledger is None else self._ledger.name,
                           run_id=self._run_id)

    def _fit(self, shared: LedgerHandle | None, started: list[LedgerHandle], *, resume: bool
             ) -> DPResult:
        from ray import tune

        from raydp_hpo.tune.hooks import LedgerStopper

        if self._trainable is None:
            from raydp_hpo.trainables.training import validate_trial_space

            validate_trial_space(self._space)  # a key the trainable ignores is an error
        if resume:  # the run continued is the one its own experiment directory names
            self._set_run_id(recorded_run_id(self._storage / self._experiment))
        else:
            say_if_name_used(shared, self._experiment, self._run_id, self._progress, _log)
        place = None  # its place on a dataset ledger
        if shared is not None and shared.settings()["adaptivity"] == (
                Adaptivity.EXPERIMENTS.value):
            # A dataset ledger composes whole experiments: this one takes its (ε, δ) point
            # there and runs within it on a ledger of its own (raydp_hpo.ledger.experiments).
            place = self._place = DatasetPlace.take(shared, self._point_request(), resume=resume)
            shared = None  # its trials charge a ledger of its own, within its place
            self._search_budget = search_share(place.budget, self._test_epsilon)
            self._budget = place.budget
        elif shared is not None:
            say_if_adaptive_filter(shared, self._progress or _log.info)
        dedicated = None if shared is not None else self._dedicated_adaptivity()
        try:
            searcher = self._build_searcher(shared, dedicated)
        except BudgetTooSmallError as exc:
            if place is None:
                raise
            raise place.too_small(exc) from None
        check_selection_inputs(searcher, builtin_trainable=self._trainable is None,
                               metric=self._metric, validation_size=self._validation_size)
        plan = searcher.privacy_plan()
        if self._max_failures > 0:  # before anything is charged
            refuse_retries_under_a_plan(self._max_failures, plan.mechanism is not None)
        point = None if place is None else place.point(plan, searcher)
        if point is not None:  # its own ledger's budget: never beyond its point
            self._budget = point.budget
        trainable = trainable_with_data(self._trainable, self._data, self._resources,
                                        self._secret_seed)
        exp_dir = self._storage / self._experiment
        tune_dir = exp_dir / "tune"
        check_tune_state(exp_dir, self._experiment, resume=resume)
        if resume:
            # one release per run: a run whose release is on its ledger runs nothing again
            holder = shared if place is None else place.ledger
            refuse_if_released(holder, None if holder is not None else self._dedicated_journal(),
                               self._experiment, self._charge_prefix)
            # before the dedicated ledger's actor starts: it would create a fresh journal
            if shared is None:
                require_earlier_charges(self._dedicated_journal(), self._experiment,
                                        run_id=self._run_id)
            else:
                require_earlier_charges(None, self._experiment, shared.charges(),
                                        where=f"the shared ledger {shared.name!r}",
                                        run_id=self._run_id)
        # The dedicated ledger: a fresh experiment with a plan charges it in this process
        # before the ledger's actor starts (below, once Tune's inputs are built), so the
        # actor's start (a new worker that loads the accountants, ~0.5-1 s) runs beside the
        # trials instead of before them; otherwise the actor starts now, in the background.
        charge_first = False
        if shared is not None:
            ledger = shared
        else:
            assert dedicated is not None
            # the halting accountant, read before anything creates the journal
            accountant = _resumed_accountant(self._dedicated_journal(), dedicated)
            ledger = LedgerHandle(self.ledger_name, self._namespace, None)
            started.append(ledger)
            charge_first = (plan.mechanism is not None and not resume
                            and may_charge_before_start(self.ledger_name, self._namespace))
            if not charge_first:
                self._start_dedicated(ledger, dedicated, accountant)
        overlap_start = ledger.created and plan.mechanism is None and not resume
        stopper = (
            LedgerStopper(ledger, next_charge=plan.base)
            if plan.per_trial_charges or overlap_start
            else None
        )
        callbacks = run_callbacks(
            ledger, exp_dir, self._callbacks, progress=self._progress,
            epsilon=self._budget.epsilon, metric=self._metric, mode=self._mode,
            progress_interval_s=self._progress_interval, tensorboard=self._tensorboard)
        run_config, tune_config = tune_configs(
            self._settings, exp_dir, searcher=searcher, stopper=stopper, callbacks=callbacks,
            verbose=self._verbose, max_failures=self._max_failures,
            max_concurrent_trials=self._max_concurrent, reuse_actors=self._reuse_actors)
        if resume:
            if not tune.Tuner.can_restore(str(tune_dir)):
                raise RayDPHPOError(
                    f"nothing to resume at {tune_dir}; run fit() without resume=True"
                )
            tuner = restore_tune(tune_dir, trainable, callbacks=callbacks, stopper=stopper)
        else:
            self._write_restore_file(exp_dir)
            write_private_note(exp_dir)  # the folder says that all but public/ is private
            tuner = tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)
        # The ledger actor started in the background meanwhile (unless the plan is charged
        # first, just below); nothing has run yet.
        # A dedicated ledger that this call created has the settings asked for by
        # construction, and every trial is admitted by it before touching data, so when there
        # is no plan to charge first, Tune may start while the actor is still coming up (its
        # worker start is ~1 s). Should the actor fail to start, every admission fails
        # (nothing runs), the LedgerStopper stops the search, and verify() below says why.
        try:
            if place is not None and point is not None:  # refused: raises, nothing ran
                place.reserve(point, self._progress)
            if charge_first:
                assert dedicated is not None and plan.mechanism is not None
                # Admitted and fsync'd in the journal before the actor exists, which then
                # refuses to start without this record (raydp_hpo.ledger.actor). Refused:
                # raises, and nothing ran.
                receipt = charge_before_start(
                    self._budget, self._dedicated_journal(), adaptivity=dedicated,
                    accountant=accountant, charge_id=searcher.plan_charge_id,
                    mechanism=plan.mechanism, owner=self._experiment,
                )
                self._start_dedicated(ledger, dedicated, accountant, expect_charge=receipt)
                if receipt is None:  # a version-1 journal: the actor replays it (below)
                    charge_first = False
                elif not ledger.created:  # another driver's actor appeared meanwhile
                    ledger.verify()
                    if not ledger.has_charge(searcher.plan_charge_id):
                        raise LedgerMismatchError(
                            f"ledger actor {ledger.name!r}, started elsewhere, does not hold "
                            f"the plan charge {searcher.plan_charge_id!r} just written to "
                            f"{self._dedicated_journal()}; nothing ran"
                        )
                searcher.plan_receipt = receipt
            if not charge_first and not overlap_start:
                ledger.verify()  # up, with the settings asked for, before anything is charged
            if plan.mechanism is not None and not charge_first:
                # Admitted (or refused, raising) before any trial touches data. Idempotent on
                # restore: the same plan id is a replay, not a second charge.
                ledger.charge(searcher.plan_charge_id, plan.mechanism, owner=self._experiment)
                # Admitted and fsync'd: where it lies in the journal goes to every trial it
                # covers, which checks it there instead of asking the ledger actor (one round
                # trip per trial saved; raydp_hpo.ledger.plan_receipt states the argument).
                searcher.plan_receipt = ledger.receipt(searcher.plan_charge_id)
        except BaseException:
            if not resume:  # leave no half-created experiment behind: nothing ran
                shutil.rmtree(tune_dir, ignore_errors=True)
                with contextlib.suppress(OSError):
                    (exp_dir / _RESTORE_FILE).unlink()
            raise
        with _quiet_tune_output(self._verbose), _ledger_refusals_without_traceback():
            grid = tuner.fit()
        ledger.verify()  # raises the reason if the ledger never came up
        if resume:
            # Tune ran its own (unpickled) copy of the searcher: read back its final state.
            searcher.restore_from_dir(str(tune_dir))
        # one release per run (a copied run directory resumed twice continues one run): its
        # release is claimed on the ledger holding its charge before anything is published
        claim_release(ledger if place is None else place.ledger, self._experiment,
                      self._charge_prefix, exp_dir / PUBLIC_DIR)
        return self._release_builder().build(searcher, ledger, grid, plan, str(exp_dir))

    def _release_builder(self) -> ReleaseBuilder:
        """What builds this run's release: its settings, as they stand once it has run."""
        return ReleaseBuilder(
            experiment=self._experiment, charge_prefix=self._charge_prefix,
            budget=self._budget, metric=self._metric, storage=self._storage, data=self._data,
            trainable_given=self._trainable is not None, sizes=self._sizes,
            test_epsilon=self._test_epsilon, secret_seed=self._secret_seed,
            dataset_ledger=None if self._place is None else self._place.ledger,
            auto_choice=self._auto_choice)

