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
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import default_storage_path, warn_if_ephemeral
from raydp_hpo.accounting.accountants import Accountant, epsilon, epsilon_or_inf
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism, mechanism_to_dict
from raydp_hpo.errors import (
    BudgetExhaustedError,
    BudgetTooSmallError,
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.actor import (
    DEFAULT_NAMESPACE,
    LedgerHandle,
    charge_before_start,
    driver_on_head_node,
    start_ledger,
)
from raydp_hpo.ledger.filter import Adaptivity
from raydp_hpo.ledger.plan_receipt import PlanReceipt
from raydp_hpo.searchers.base import Release
from raydp_hpo.tune.publish import PUBLIC_DIR

__all__ = ["DPTuner", "DPResult", "PrivacyCertificate", "require_earlier_charges"]

_log = logging.getLogger(__name__)


#: The privacy unit and neighbouring relation every bound of this project is stated for.
ADJACENCY = (
    "one record; neighbouring datasets differ by adding or removing one record (every bound "
    "holds in both directions)"
)


@dataclass(frozen=True)
class PrivacyCertificate:
    """What the released output costs: every charge of the experiment and the total ε.

    ``epsilon`` is the **certified** figure, the one the ledger's halting rule
    (``ledger_halting_rule``, ``"<adaptivity>/<accountant>"``) stands behind
    (:attr:`certified_accountant`): on a ledger that halts with ``fixed_plan`` every figure is a
    valid bound for the fixed charges, so it is the tightest (``Accountant.TIGHTEST``: the
    minimum of ``epsilon_rdp``, ``epsilon_pld`` and ``epsilon_profile``); on one that halts on
    the adaptive RDP filter it is ``epsilon_rdp`` — the PLD and profile figures are valid only
    for a plan fixed in advance and are then references, not claims. :meth:`format` and
    :meth:`to_dict` name the certified figure and mark the others.

    ``adjacency`` states the privacy unit and neighbouring relation (add/remove one record);
    ``public`` lists every quantity the guarantee treats as public (declared sizes, the
    configuration) — anything computed from the records that is not listed there reaches the
    release only through the charged mechanisms.
    """

    algorithm: str
    paper: str
    description: str
    budget: PrivacyBudget
    charges: tuple[tuple[str, Mechanism], ...]
    epsilon_rdp: float
    epsilon_pld: float
    ledger_name: str
    ledger_spent_epsilon: float
    ledger_halting_rule: str
    public: tuple[tuple[str, str], ...] = ()
    adjacency: str = ADJACENCY
    epsilon_profile: float = math.inf
    #: the dataset ledger this experiment's point (ε, δ) = ``budget`` is charged to, its total
    #: budget and its spend after the charge (basic composition of the experiments' points,
    #: :mod:`raydp_hpo.ledger.experiments`); ``None`` when it ran on no dataset ledger
    dataset_ledger: tuple[str, PrivacyBudget, float] | None = None

    @property
    def fixed_plan(self) -> bool:
        """Whether the ledger halts with ``Adaptivity.FIXED_PLAN`` (standard composition of a
        plan fixed in advance), read from ``ledger_halting_rule``."""
        return self.ledger_halting_rule.split("/", 1)[0] == Adaptivity.FIXED_PLAN.value

    @property
    def certified_accountant(self) -> Accountant:
        """The accountant of the certified figure :attr:`epsilon`: ``TIGHTEST`` under a
        fixed-plan halting rule, ``RDP`` under the adaptive RDP filter."""
        return Accountant.TIGHTEST if self.fixed_plan else Accountant.RDP

    @property
    def epsilon(self) -> float:
        """The certified ε (:attr:`certified_accountant`): with a fixed plan the tightest valid
        bound — RDP, PLD and privacy-profile figures are each an upper bound for the fixed set
        of charges (the profile one accounts random stopping by Koskela, Redberg & Wang 2024;
        :mod:`raydp_hpo.accounting.profiles`); under the adaptive RDP filter the RDP figure."""
        if self.fixed_plan:
            return min(self.epsilon_rdp, self.epsilon_pld, self.epsilon_profile)
        return self.epsilon_rdp

    @property
    def within_budget(self) -> bool:
        return self.epsilon <= self.budget.epsilon

    def _figures(self) -> list[tuple[str, str, float]]:
        """``(key, label, value)`` of each figure, the certified one first."""
        figures = [("rdp", "RDP", self.epsilon_rdp), ("pld", "PLD", self.epsilon_pld),
                   ("profile", "profile", self.epsilon_profile)]
        if self.fixed_plan:
            return [("tightest", "tightest", self.epsilon), *figures]
        return figures

    def _role(self, key: str, value: float) -> str:
        """How a figure is to be read: ``certified``, or a reference (looser, or not valid
        for adaptive charges)."""
        if key == self.certified_accountant.value:
            return "certified"
        if self.fixed_plan:
            return ("reference; the certified minimum" if value == self.epsilon
                    else "looser reference")
        return "reference only: valid for a fixed plan, not for adaptive charges"

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "paper": self.paper,
            "description": self.description,
            "budget": self.budget.to_dict(),
            "charges": [
                {"charge_id": cid, "mechanism": mechanism_to_dict(m)} for cid, m in self.charges
            ],
            # "best" is the certified figure, under its former name (readers of older files)
            "epsilon": {"rdp": self.epsilon_rdp, "pld": self.epsilon_pld,
                        "profile": self.epsilon_profile, "certified": self.epsilon,
                        "certified_accountant": self.certified_accountant.value,
                        "best": self.epsilon},
            "ledger": {
                "name": self.ledger_name,
                "spent_epsilon": self.ledger_spent_epsilon,
                "halting_rule": self.ledger_halting_rule,
            },
            "privacy_unit": self.adjacency,
            "treated_as_public": dict(self.public),
            **({} if self.dataset_ledger is None else {"dataset_ledger": {
                "name": self.dataset_ledger[0], "budget": self.dataset_ledger[1].to_dict(),
                "spent_epsilon": self.dataset_ledger[2],
                "halting_rule": "experiments: the RDP filter at δ/2 or basic composition of "
                                "the experiments' (ε, δ) points"}}),
        }

    def format(self) -> str:
        lines = [
            "Privacy certificate",
            f"  algorithm     {self.algorithm}",
            f"  paper         {self.paper}",
            f"  accounting    {self.description}",
            f"  budget        ε={self.budget.epsilon:g}, δ={self.budget.delta:g}",
            f"  admitted on   ledger halting rule {self.ledger_halting_rule}; certified figure: "
            f"{self.certified_accountant.value}",
        ]
        for key, label, value in self._figures():
            role = self._role(key, value)
            if role == "certified":
                lines.append(f"  ε ({label}){' ' * max(1, 10 - len(label))}{value:.4f}  "
                             f"certified, ≤ budget: {self.within_budget}")
            else:
                lines.append(f"  ε ({label}){' ' * max(1, 10 - len(label))}{value:.4f}  ({role})")
        lines += [
            f"  ledger        {self.ledger_name} ({self.ledger_halting_rule}), "
            f"spent ε={self.ledger_spent_epsilon:.4f}",
            f"  privacy unit  {self.adjacency}",
        ]
        if self.dataset_ledger is not None:
            name, total, spent = self.dataset_ledger
            lines.append(
                f"  dataset       {name}: this experiment is its point (ε={self.budget.epsilon:.4f}, "
                f"δ={self.budget.delta:.3g}); the dataset has spent ε={spent:.4f} of "
                f"ε={total.epsilon:g}, δ={total.delta:g} (the RDP filter at δ/2 or basic "
                "composition of the experiments' points)")
        lines.append(f"  charges       {len(self.charges)}")
        for cid, mech in self.charges[:10]:
            lines.append(f"    {cid}: {type(mech).__name__}")
        if len(self.charges) > 10:
            lines.append(f"    ... {len(self.charges) - 10} more")
        if self.public:
            lines.append("  treated as public")
            lines.extend(f"    {key}: {value}" for key, value in self.public)
        return "\n".join(lines)


@dataclass
class DPResult:
    """The result of :meth:`DPTuner.fit`.

    Public (covered by the certificate): ``hyperparameters``, ``model``, ``model_path`` (the
    released model's weights and architecture alone, ``public/released_model.pt`` in the
    experiment directory; read it with
    :func:`~raydp_hpo.trainables.release.load_released_model`), ``certificate``. The
    experiment directory's ``public/`` folder holds exactly these (``release.json`` — the
    manifest, :meth:`public` —, ``certificate.json``, ``released_model.pt``), with no path of
    this machine: publish it as it is, or copy it with :meth:`save_public`; everything else in
    the experiment directory is private (:mod:`raydp_hpo.tune.publish`).
    ``hyperparameters`` is ``None`` when nothing is released: the selection
    chose nothing, or the model that would be released was not trained (a failed final run;
    ``extras["final_failed"]``) — a release always describes a model that was trained. With a
    trainable of the user's own (:func:`raydp_hpo.trial_session`) whose selected trial trained
    but whose model cannot be loaded, the paid-for ``hyperparameters`` are still released,
    ``model`` is ``None`` and ``extras["model_not_released"]`` says why; a broken trial contract
    makes :meth:`DPTuner.fit` raise :class:`~raydp_hpo.errors.TrialContractError` (its
    ``result`` attribute holds this object, certificate included).
    ``test_accuracy`` is computed on the held-out test split **without noise**: an evaluation
    for the operator, NOT covered by the certificate. It is not in ``public/release.json`` (the
    file to publish, :meth:`public`) but in the private ``evaluation_private.json`` at the top
    of the experiment directory (:meth:`private_evaluation`).
    ``dp_test_accuracy`` (with ``DPTuner(test_accuracy_epsilon=ε_t)``) is the released model's
    test accuracy released with the Laplace mechanism — its own ``Laplace(ε_t)`` charge, in the
    certificate — so it *is* covered and may be published.
    Private (NOT covered; never publish): ``private_checkpoint_path`` (the released trial's
    checkpoint: it holds the state of the run's secret noise and batch generators, from which
    the noise can be regenerated and subtracted, and its unnoised per-epoch metrics),
    ``private_trials``, ``experiment_path`` and ``private_result_grid`` — Tune's own
    ``ResultGrid`` of the run, for a Tune user's usual analysis (``get_dataframe()``, per-trial
    ``metrics``, checkpoints, errors). Its per-trial metrics (unnoised per-epoch scores,
    losses, test accuracies) and its number of trials are **not released** by any charged
    mechanism: they are for the operator and must not be published (nor selected on: a
    selection from them is not covered by the certificate).
    """

    hyperparameters: dict[str, Any] | None
    model: Any | None
    model_path: str | None
    certificate: PrivacyCertificate
    test_accuracy: float | None
    budget_exhausted: bool
    extras: dict[str, Any] = field(default_factory=dict)
    private_trials: list[dict[str, Any]] = field(default_factory=list, repr=False)
    experiment_path: str | None = None
    dp_test_accuracy: float | None = None
    dp_test_accuracy_epsilon: float | None = None
    private_result_grid: Any | None = field(default=None, repr=False)
    private_checkpoint_path: str | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        """The releasable part as a JSON-able dict, what ``public/release.json`` holds: only
        what the certificate covers (no per-trial metrics, no trial count, no unnoised test
        accuracy — that is :meth:`private_evaluation` —, no path of this machine: the model is
        named relative to the folder, ``model_file``)."""
        from raydp_hpo.tune.publish import public_manifest

        return public_manifest(
            hyperparameters=self.hyperparameters,
            certificate=self.certificate.to_dict(),
            budget_exhausted=self.budget_exhausted,
            dp_test_accuracy=None if self.dp_test_accuracy is None else {
                "value": self.dp_test_accuracy,
                "epsilon": self.dp_test_accuracy_epsilon,
                "covered_by_certificate": True,
            },
            model_released=self.model_path is not None,
        )

    def save_public(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write exactly what may be published into ``directory`` (created; it must be new or
        empty and outside the experiment directory, which is private): ``release.json`` (the
        manifest, :meth:`public`: hyperparameters, certificate, DP test accuracy),
        ``certificate.json`` and ``released_model.pt`` when a model is released — nothing else,
        and no path of this machine in them. Returns the files written; raises
        :class:`~raydp_hpo.errors.InvalidParameterError` (and writes nothing) for a directory
        that is inside the experiment directory or holds files, or a release that would name a
        path of this machine."""
        from raydp_hpo.tune.publish import check_publication_dir, write_public_files

        private = self.experiment_path
        target = check_publication_dir(directory, private)
        guarded = () if private is None else (private, Path(private).parent)
        return write_public_files(target, self.public(), self.model_path, private=guarded)

    def private_evaluation(self) -> dict[str, Any]:
        """The unnoised test accuracy of the released model, what ``evaluation_private.json``
        holds: a statistic of the (private) test split released by no charged mechanism, so
        NOT covered by the certificate — for the operator; publish it only if the test split
        is public. ``DPTuner(test_accuracy_epsilon=ε_t)`` gives a covered one."""
        return {
            "test_accuracy": self.test_accuracy,
            "covered_by_certificate": False,
            "note": PRIVATE_EVALUATION_NOTE,
        }


def completed_release(searcher: Any) -> Release:
    """``searcher.release()`` if the search ran to its end, else an empty release.

    Tune returns normally when a run is interrupted (SIGINT, SIGUSR1), with the search cut
    short; a release then would be a selection the charge does not cover
    (:meth:`~raydp_hpo.searchers.base.DPSearcher.search_completed`). The budget spent stays
    spent; resuming the experiment (``DPTuner.restore(path).fit()``) finishes it and releases.
    """
    if searcher.search_completed():
        return searcher.release()  # type: ignore[no-any-return]
    return Release(None, None, searcher.algorithm, {
        "interrupted": True,
        "reason": "the search did not run to its end (interrupted): nothing is released and "
                  "the budget it spent stays spent; resume it with DPTuner.restore(path).fit()",
    })


#: The file in an experiment directory's ``public/`` folder with what may be published
#: (:meth:`DPResult.public`).
RELEASE_FILE = "release.json"
#: The private file at the top of the experiment directory with the unnoised evaluation
#: (:meth:`DPResult.private_evaluation`).
PRIVATE_EVALUATION_FILE = "evaluation_private.json"
PRIVATE_EVALUATION_NOTE = (
    "PRIVATE: computed without noise on the private test split; not covered by the "
    "certificate. Do not publish unless the test split is public."
)

#: The file in an experiment directory that :meth:`DPTuner.restore` reads its settings from.
_RESTORE_FILE = "dptuner.pkl"


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
        experiment: experiment name (prefix of every charge id); default: a fresh unique one.
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
        search: Any,
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
        from raydp_hpo.searchers import DPSearcher, SearchAlgorithm, check_search_settings
        from raydp_hpo.trainables.data import DataSplits
        from raydp_hpo.tune.config import resolve_tune_settings

        if not isinstance(budget, PrivacyBudget):
            raise InvalidParameterError(f"budget must be a PrivacyBudget, got {budget!r}")
        if not isinstance(data, DataSplits):
            raise InvalidParameterError(f"data must be raydp_hpo.trainables.DataSplits, got {type(data)!r}")
        if not isinstance(search, DPSearcher):
            try:
                search = SearchAlgorithm(search)
            except ValueError:
                names = ", ".join(a.value for a in SearchAlgorithm)
                raise InvalidParameterError(
                    f"search={search!r} is neither a DPSearcher nor a search algorithm; use "
                    f"one of {names}"
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
        if ledger is not None and not isinstance(ledger, LedgerHandle):
            raise InvalidParameterError(f"ledger must be a LedgerHandle, got {ledger!r}")
        self._dataset = _whose_budget(ledger, dataset, fresh_budget, data)
        self._fresh_budget = fresh_budget
        self._slot: _Slot | None = None  # this run's place on a dataset ledger (fit)
        self._slot_rule: _DatasetPointRule | None = None  # its plan's admission there
        self._point: Mechanism | None = None  # what it charges there
        self._dataset_ledger: LedgerHandle | None = None  # the ledger that point is on
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
        self._namespace = namespace
        self._search_kwargs = dict(search_kwargs or {})
        if not isinstance(search, DPSearcher):  # a misspelled setting fails here, not in fit
            check_search_settings(search, self._search_kwargs)
        self._max_concurrent = settings.max_concurrent_trials
        self._max_failures = settings.max_failures
        if self._max_failures > 0:
            self._refuse_retries_under_a_plan(self._plan_charged_up_front())
        if secret_seed is not None and (
            isinstance(secret_seed, bool) or not isinstance(secret_seed, int)
        ):
            raise InvalidParameterError(f"secret_seed must be an int or None, got {secret_seed!r}")
        self._secret_seed = secret_seed

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
        self._set_budget(budget)
        if not isinstance(sizes_public, bool):
            raise InvalidParameterError(f"sizes_public must be True or False, got {sizes_public!r}")
        self._sizes_public = sizes_public
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
            "search_kwargs": self._search_kwargs, "max_concurrent_trials": self._max_concurrent,
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
    def experiment_path(self) -> Path:
        """The experiment directory (``storage_path/experiment``): what :meth:`restore` and
        :meth:`can_restore` take. A private artefact (Tune's trials, the audit trail)."""
        return self._storage / self._experiment

    def _plan_charged_up_front(self) -> bool | None:
        """Whether the search charges a plan before its trials (its trials are covered by it,
        not charged one by one); ``None`` when only :meth:`fit` can tell."""
        from raydp_hpo.searchers import DPSearcher, SearchAlgorithm

        if isinstance(self._search, DPSearcher):
            if not self._search.has_space:
                return None
            return self._search.privacy_plan().mechanism is not None
        return self._search is not SearchAlgorithm.GRID_COMPOSED  # an enum since __init__

    def _refuse_retries_under_a_plan(self, plan_charged: bool | None) -> None:
        if plan_charged:
            raise InvalidParameterError(
                f"max_failures={self._max_failures} is refused for a search whose trials are "
                "covered by one plan charge: the plan paid for each covered trial once, and a "
                "trial retried from scratch would run its mechanism again unpaid. Use "
                "max_failures=0, or search='grid_composed', whose trials charge themselves "
                "(every retry from scratch pays again under a new attempt id)"
            )

    # ------------------------------------------------------------------ pieces
    @property
    def ledger_name(self) -> str:
        """Name of the ledger actor trials charge/check: the one given, the dataset's, or the
        dedicated one (``fresh_budget=True``)."""
        if self._slot is not None:  # within its point on a dataset ledger: its own ledger
            return f"ledger-{self._experiment}"
        if self._ledger is not None:
            return self._ledger.name
        if self._dataset is not None:
            from raydp_hpo.trainables.data import dataset_ledger_name

            return dataset_ledger_name(self._dataset)
        return f"ledger-{self._experiment}"

    def _shared_ledger(self) -> LedgerHandle | None:
        """The ledger this experiment shares with others (verified): the one given, else the
        dataset's; ``None`` for a fresh per-experiment budget (logged here)."""
        out = self._progress or _log.info
        if self._ledger is not None:  # on PostgreSQL: the registry binds the data to it
            from raydp_hpo.tune.dataset_ledger import bind_data_to_ledger

            return bind_data_to_ledger(self._ledger.verify(), self._data.name, out)
        if self._dataset is None:
            line = (f"[raydp-hpo] experiment {self._experiment!r} spends from a fresh budget of "
                    f"its own (fresh_budget=True): ε={self._budget.epsilon:g}, "
                    f"δ={self._budget.delta:g}, seen by no other experiment on this data")
            _log.warning(line)
            if self._progress is not None:
                self._progress(line)
            return None
        from raydp_hpo.tune.dataset_ledger import open_dataset_ledger

        return open_dataset_ledger(self._dataset, self._budget, self._storage,
                                   namespace=self._namespace, out=out)

    def _dedicated_adaptivity(self) -> Adaptivity:
        """FIXED_PLAN only for the built-in searchers: their charges are fixed from the
        configuration alone (one plan charge, or grid trials drawn without data), so standard
        composition justifies halting. Any other searcher may adapt charges to results: the
        adaptive RDP filter then. So does ``max_failures > 0``: a retry's charge (and a resumed
        trial's charge for the steps it reruns) exists only because a trial failed, which may
        depend on its outputs, and only the RDP filter is valid for charges chosen that way
        (Feldman & Zrnic 2021); the searcher then calibrates on RDP too."""
        import raydp_hpo.searchers

        if self._max_failures > 0:
            return Adaptivity.ADAPTIVE

        builtin = (
            raydp_hpo.searchers.RandomStoppingSearch,
            raydp_hpo.searchers.SubsampledTransferSearch,
            raydp_hpo.searchers.SVTThresholdSearch,
            raydp_hpo.searchers.LinearScalingSearch,
            raydp_hpo.searchers.OneShotRandomSearch,
            raydp_hpo.searchers.GridSearchComposed,
        )
        if isinstance(self._search, raydp_hpo.searchers.DPSearcher) and type(self._search) not in builtin:
            return Adaptivity.ADAPTIVE
        return Adaptivity.FIXED_PLAN

    def _dedicated_journal(self) -> Path:
        return self._storage / self._experiment / "ledger.journal"

    def _may_charge_before_start(self) -> bool:
        """Whether the driver may charge the dedicated ledger's journal itself before its actor
        starts (:func:`raydp_hpo.ledger.actor.charge_before_start`): only where it sees the
        actor's files (on the head node, not a Ray Client) and no actor of that name is alive
        (one would hold the journal)."""
        if not driver_on_head_node():
            return False
        try:
            ray.get_actor(self.ledger_name, namespace=self._namespace)
        except ValueError:
            return True
        return False

    def _start_dedicated(self, handle: LedgerHandle, adaptivity: Adaptivity,
                         accountant: Accountant, expect_charge: PlanReceipt | None = None
                         ) -> None:
        """Start (or attach to) the dedicated ledger's actor without waiting: ``_fit``
        verifies it before relying on it."""
        start_ledger(
            handle,
            self._budget,
            self._dedicated_journal(),
            adaptivity=adaptivity,
            accountant=accountant,
            expect_charge=expect_charge,
        )

    def _check_selection_inputs(self, searcher: Any) -> None:
        """Selections may only read privatised scores (see raydp_hpo.trial.privacy)."""
        from raydp_hpo.searchers import SVTThresholdSearch

        score_eps = getattr(searcher, "score_epsilon", None)
        if self._trainable is None and self._metric != "val_accuracy":
            raise InvalidParameterError(
                f"metric={self._metric!r} is not a selection score of the built-in trainable: it "
                "reports 'val_accuracy' (validation split, Laplace-noised when private) as the "
                "only score a selection may read; 'loss' is computed on private training data "
                "and 'test_accuracy' on the test split. Use metric='val_accuracy'."
            )
        if score_eps is not None and self._metric != "val_accuracy":
            raise InvalidParameterError(
                f"metric={self._metric!r}: trials privatise only their final 'val_accuracy' "
                "(Laplace noise, charged with the trial); a selection on any other reported "
                "value would read raw private data. Use metric='val_accuracy', or declare the "
                "validation split public with search_kwargs={'score_epsilon': None}."
            )
        if isinstance(searcher, SVTThresholdSearch):
            k = int(getattr(searcher, "num_partitions", 0) or 0)
            n_val = self._validation_size
            if k and n_val < k:
                raise InvalidParameterError(
                    f"SVT with num_partitions={k} needs a declared validation size of at least "
                    f"{k}: each partition model's accuracy is its correct count over the public "
                    f"validation size n_val, so one validation record moves the utility by at "
                    f"most 1/n_val, which must not exceed the sensitivity 1/k; got n_val={n_val}. "
                    "Use fewer partitions or a larger validation split."
                )

    def _build_searcher(self, shared: LedgerHandle | None, dedicated: Adaptivity | None) -> Any:
        """The DP searcher, given its space, metric and mode through Tune's
        ``set_search_properties`` together with the ledger name, namespace and experiment this
        tuner assigns (:data:`raydp_hpo.searchers.base.TUNER_ASSIGNED`), and — for a searcher built
        without a space — the declared sizes, budget, secret seed and the ledger's admission
        rule where its constructor did not get them."""
        from raydp_hpo.searchers import DPSearcher, make_searcher

        if isinstance(self._search, DPSearcher):
            if self._search_kwargs:
                raise InvalidParameterError(
                    "search_kwargs are only for a SearchAlgorithm, not a constructed searcher"
                )
            searcher = self._search
            if searcher.has_space and getattr(searcher, "_validation_size", None) is None:
                # its trials normalise their scores by this run's public validation size
                # (else each trial would fall back to the realised, private one)
                searcher._validation_size = self._validation_size
        else:
            # every keyword but the space and what set_search_properties fills in below
            searcher = make_searcher(self._search, param_space=None, metric=self._metric,
                                     mode=self._mode, **self._search_kwargs)
        budget = self._search_budget
        plan_id = f"{self._experiment}/plan"
        admissible: Any
        if shared is None:
            assert dedicated is not None
            # The dedicated ledger holds only this experiment's charges: judge the plan as its
            # first charge — locally, the same on a first run and on resume (where the ledger
            # already holds this very plan and must not count it twice).
            admissible = _FirstChargeRule(budget, dedicated)
            if self._slot_rule is not None:  # and admitted as its point on the dataset ledger
                admissible = _BothRules(admissible, self._slot_rule)
            ledger_name, namespace = self.ledger_name, self._namespace
        else:
            ledger = shared
            ledger_name, namespace = ledger.name, ledger.namespace
            # A shared ledger: its own rule, unless this experiment's plan is already on it
            # (resume: the charge is replayed by id, not added).
            resumed = ledger.has_charge(plan_id)

            def admissible(mechanism: Mechanism) -> bool:
                own = epsilon(mechanism, budget.delta, Accountant.RDP) <= budget.epsilon
                return own and (resumed or ledger.would_admit(mechanism))

        space = {} if searcher.has_space else self._space
        accepted = searcher.set_search_properties(
            self._metric,
            self._mode,
            space,
            ledger_name=ledger_name,
            namespace=namespace,
            experiment=self._experiment,
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

    def _trainable_with_data(self) -> Any:
        if self._trainable is not None:
            # A user trainable's intermediate reports (trial.report) carry no score, and a
            # score under another key is diagnosed with its fix after the run
            # (raydp_hpo.tune.custom): Tune's strict metric check would abort the run instead,
            # before the certificate of what was spent is written.
            os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
            return self._trainable
        from raydp_hpo.trainables import make_trainable

        return make_trainable(self._data, self._resources, secret_seed=self._secret_seed)

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
        it attaches to holds the experiment's earlier charges
        (:func:`require_earlier_charges`): a moved journal is never a fresh budget.
        """
        resume = self._resume if resume is None else bool(resume)
        ensure_ray()
        started: list[LedgerHandle] = []  # the dedicated ledger's actor, once started
        try:
            return self._fit(self._shared_ledger(), started, resume=resume)
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
        from ray import tune

        exp_dir = Path(path).expanduser()
        return (exp_dir / _RESTORE_FILE).is_file() and tune.Tuner.can_restore(
            str(exp_dir / "tune")
        )

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
        replayed by its id, and trials continue inside their admitted charges.
        """
        exp_dir = Path(path).expanduser().resolve()
        if not cls.can_restore(exp_dir):
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
        """What :meth:`restore` needs: the constructor's settings, without data, trainable,
        callbacks or secrets (the secret seed is never written; a constructed searcher is
        passed again, its secret state is in Tune's searcher checkpoint)."""
        import pickle

        from raydp_hpo._atomic_io import atomic_write_bytes
        from raydp_hpo.searchers import DPSearcher

        constructed = isinstance(self._search, DPSearcher)
        payload = {
            "version": 1,
            "args": self._init_args,
            "search": None if constructed else self._search,
            "searcher_type": type(self._search).__name__,
            "ledger_name": None if self._ledger is None else self._ledger.name,
        }
        exp_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(exp_dir / _RESTORE_FILE, pickle.dumps(payload))

    def _fit(self, shared: LedgerHandle | None, started: list[LedgerHandle], *, resume: bool
             ) -> DPResult:
        from ray import tune
        from ray.tune.logger import TBXLoggerCallback

        from raydp_hpo.tune.hooks import (
            LedgerAuditCallback,
            LedgerStopper,
            NoTensorBoardLogger,
            ProgressCallback,
        )

        if self._trainable is None:
            from raydp_hpo.trainables.training import validate_trial_space

            validate_trial_space(self._space)  # a key the trainable ignores is an error
        dataset_ledger = None
        if shared is not None and shared.settings()["adaptivity"] == (
                Adaptivity.EXPERIMENTS.value):
            # A dataset ledger composes whole experiments: this one takes its (ε, δ) point
            # there and runs within it on a ledger of its own (raydp_hpo.ledger.experiments).
            dataset_ledger, shared = shared, None
            self._slot = self._take_slot(dataset_ledger, resume)
            self._set_budget(PrivacyBudget(self._slot.cap, self._slot.delta))
            if self._slot.reserved is None:  # its plan is its point: calibrated to fit there
                self._slot_rule = _DatasetPointRule(
                    dataset_ledger.budget, self._slot.accountant, self._slot.prior,
                    self._test_epsilon)
        dedicated = None if shared is not None else self._dedicated_adaptivity()
        try:
            searcher = self._build_searcher(shared, dedicated)
        except BudgetTooSmallError as exc:
            if dataset_ledger is None or self._slot is None:
                raise
            report = dataset_ledger.report()
            raise BudgetTooSmallError(
                f"{exc}. On the dataset ledger {dataset_ledger.name!r} (spent "
                f"ε={report.spent_epsilon:.4g} of ε={report.budget.epsilon:g}, "
                f"δ={report.budget.delta:g}) this experiment would be charge {self._slot.k}, "
                f"at δ={self._slot.delta:.3g}: its plan must also fit what the dataset has left"
            ) from None
        self._check_selection_inputs(searcher)
        plan = searcher.privacy_plan()
        if self._max_failures > 0:  # before anything is charged
            self._refuse_retries_under_a_plan(plan.mechanism is not None)
        if self._slot is not None:
            assert dataset_ledger is not None
            self._point = self._point_mechanism(plan, searcher, dataset_ledger)
            self._budget = PrivacyBudget(self._point_epsilon(), self._slot.delta)
        trainable = self._trainable_with_data()
        exp_dir = self._storage / self._experiment
        tune_dir = exp_dir / "tune"
        if not resume and tune.Tuner.can_restore(str(tune_dir)):
            raise InvalidParameterError(
                f"experiment {self._experiment!r} already exists at {exp_dir}; use "
                "DPTuner.restore(path) or fit(resume=True) to continue it, or another "
                "experiment name"
            )
        if resume:
            if not tune.Tuner.can_restore(str(tune_dir)):
                raise RayDPHPOError(
                    f"nothing to resume at {tune_dir}; run fit() without resume=True"
                )
            # before the dedicated ledger's actor starts: it would create a fresh journal
            if shared is None:
                require_earlier_charges(self._dedicated_journal(), self._experiment)
            else:
                require_earlier_charges(None, self._experiment, shared.charges(),
                                        where=f"the shared ledger {shared.name!r}")
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
                            and self._may_charge_before_start())
            if not charge_first:
                self._start_dedicated(ledger, dedicated, accountant)
        overlap_start = ledger.created and plan.mechanism is None and not resume
        stopper = (
            LedgerStopper(ledger, next_charge=plan.base)
            if plan.per_trial_charges or overlap_start
            else None
        )
        callbacks = [LedgerAuditCallback(ledger, exp_dir / "audit.jsonl"), *self._callbacks]
        if self._progress is not None:
            callbacks.append(ProgressCallback(
                ledger, self._budget.epsilon, self._metric, self._mode,
                out=self._progress, interval_s=self._progress_interval,
            ))
        if not self._tensorboard and not any(
            isinstance(c, TBXLoggerCallback) for c in self._callbacks
        ):
            callbacks.append(NoTensorBoardLogger())
        opt = self._settings
        run_config = tune.RunConfig(
            name="tune",
            storage_path=str(exp_dir),
            stop=stopper,
            callbacks=callbacks,
            verbose=self._verbose,
            failure_config=tune.FailureConfig(max_failures=self._max_failures),
            checkpoint_config=opt.checkpoint_config,
            sync_config=opt.sync_config,
            progress_reporter=opt.progress_reporter,
            log_to_file=opt.log_to_file,
        )
        tune_config = tune.TuneConfig(
            search_alg=searcher,
            num_samples=-1,
            max_concurrent_trials=self._max_concurrent,
            reuse_actors=self._reuse_actors,
            trial_name_creator=opt.trial_name_creator,
            trial_dirname_creator=opt.trial_dirname_creator,
        )
        if resume:
            if not tune.Tuner.can_restore(str(tune_dir)):
                raise RayDPHPOError(
                    f"nothing to resume at {tune_dir}; run fit() without resume=True"
                )
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
        else:
            self._write_restore_file(exp_dir)
            from raydp_hpo.tune.publish import write_private_note

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
            if dataset_ledger is not None:
                self._reserve(dataset_ledger)  # refused: raises, and nothing ran
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
        return self._release(searcher, ledger, grid, plan, str(exp_dir))

    # ------------------------------------------------------------------ dataset points
    def _set_budget(self, budget: PrivacyBudget) -> None:
        """This experiment's budget (the one given, or its point's cap on a dataset ledger) and
        the search's share of it: ε − ε_t with a DP test accuracy, whose Laplace(ε_t) release
        composed on top keeps the total within ε (ε_t-DP composes additively under RDP, PLD and
        basic composition)."""
        if self._test_epsilon is not None and self._test_epsilon >= budget.epsilon:
            raise InvalidParameterError(
                f"test_accuracy_epsilon={self._test_epsilon:g} leaves nothing of the budget "
                f"ε={budget.epsilon:g} for the search; use a smaller value"
            )
        self._budget = budget
        self._search_budget = PrivacyBudget(budget.epsilon - (self._test_epsilon or 0.0),
                                            budget.delta)

    def _slot_id(self) -> str:
        return f"{self._experiment}/point"

    def _point_charged(self) -> bool:
        """Whether this experiment's whole cost is one plan charge (its point on a dataset
        ledger is then that plan, composed with the DP test accuracy's Laplace): a built-in
        searcher's fixed plan with no retries. Otherwise (trials that charge themselves,
        retries, a searcher of the user's) it reserves an ``ApproxDP`` point and its own
        ledger halts within it."""
        return (self._dedicated_adaptivity() is Adaptivity.FIXED_PLAN
                and bool(self._plan_charged_up_front()))

    def _take_slot(self, dataset_ledger: LedgerHandle, resume: bool) -> _Slot:
        """This experiment's place on a dataset ledger, before anything is charged: k (it is
        the k-th charge), its δ share δ_k (:func:`raydp_hpo.ledger.experiments.
        experiment_delta`), the charges before it, and the ε cap it calibrates within. The same
        on resume (the point already charged is then found, and k and the charges before it
        are those of the first run), so the plan is calibrated as it was."""
        from raydp_hpo.ledger.experiments import experiment_delta
        from raydp_hpo.ledger.filter import PrivacyLedger

        charges = dataset_ledger.charges()
        ids = [c.charge_id for c in charges]
        slot_id = self._slot_id()
        if slot_id in ids:
            k = ids.index(slot_id) + 1
            charged: Mechanism | None = charges[k - 1].mechanism
        elif resume:
            raise RayDPHPOError(
                f"experiment {self._experiment!r} has no point {slot_id!r} on the dataset "
                f"ledger {dataset_ledger.name!r}: it never started there; run it afresh"
            )
        else:
            k, charged = len(charges) + 1, None
        prior = tuple((c.charge_id, c.mechanism) for c in charges[:k - 1])
        total = dataset_ledger.budget
        accountant = dataset_ledger.report().halting_accountant
        delta_k = experiment_delta(total.delta, k)
        if self._point_charged():
            return _Slot(k, self._budget.epsilon, delta_k, prior, accountant, None, charged)
        # a reservation: only basic composition (B) can admit an ApproxDP point, so its cap is
        # what B has left after the charges before it (the same on resume)
        replica = PrivacyLedger(total, adaptivity=Adaptivity.EXPERIMENTS, accountant=accountant)
        for charge_id, mechanism in prior:
            replica.charge(charge_id, mechanism)
        basic = replica.report().epsilon_by_accountant.get("basic_composition", 0.0)
        cap = min(self._budget.epsilon, total.epsilon - basic)
        if cap <= 0:
            raise BudgetExhaustedError(slot_id, math.inf, replica.spent(), total.epsilon,
                                       total.delta)
        return _Slot(k, cap, delta_k, prior, accountant, ApproxDP(cap, delta_k), charged)

    def _point_mechanism(self, plan: Any, searcher: Any, dataset_ledger: LedgerHandle
                         ) -> Mechanism:
        """What this experiment charges to the dataset ledger: its plan (with the DP test
        accuracy's ``Laplace(ε_t)``) as one mechanism; for a grid whose trials charge
        themselves from a configuration fixed up front, the composition of the whole grid when
        the dataset can pay it; else its ``ApproxDP`` reservation. On resume, what it charged."""
        from raydp_hpo.accounting.mechanisms import Composition, Laplace

        slot = self._slot
        assert slot is not None
        if slot.charged is not None:
            return slot.charged

        def with_test(mechanism: Mechanism) -> Mechanism:
            if self._test_epsilon is None:
                return mechanism
            return Composition((mechanism, Laplace(self._test_epsilon)))

        if slot.reserved is None:
            if plan.mechanism is None:
                raise RayDPHPOError(  # pragma: no cover - _point_charged said it has a plan
                    "internal error: a plan-charged experiment stated no plan mechanism"
                )
            return with_test(plan.mechanism)
        composed = getattr(searcher, "composed_mechanism", None)
        if composed is not None and self._dedicated_adaptivity() is Adaptivity.FIXED_PLAN:
            whole = with_test(composed())
            figure = epsilon(whole, slot.delta, _halting_accountant(Adaptivity.FIXED_PLAN))
            if figure <= slot.cap and dataset_ledger.would_admit(whole):
                return whole
        return slot.reserved

    def _point_epsilon(self) -> float:
        """The budget of this experiment's own ledger: its reservation's ε, or its point's
        tightest fixed-plan figure at δ_k (a hair above: its own ledger composes the same
        charges one by one, which may round differently in the last digits), so its own
        ledger can never charge beyond its point."""
        assert self._slot is not None and self._point is not None
        if isinstance(self._point, ApproxDP):
            return self._point.epsilon
        figure = epsilon(self._point, self._slot.delta, _halting_accountant(
            Adaptivity.FIXED_PLAN))
        return min(self._slot.cap, figure * (1.0 + 1e-7))

    def _reserve(self, dataset_ledger: LedgerHandle) -> None:
        """Charge this experiment's point to the dataset ledger (a replay on resume). Refused
        (the dataset's budget cannot pay it, or another experiment was admitted meanwhile and
        took the k-th δ share): an error, and nothing ran."""
        assert self._slot is not None and self._point is not None
        decision = dataset_ledger.try_charge(self._slot_id(), self._point,
                                             owner=self._experiment)
        if not decision.admitted and len(dataset_ledger.charges()) != self._slot.k - 1:
            raise RayDPHPOError(
                f"another experiment was admitted on the dataset ledger {dataset_ledger.name!r}"
                " while this one was being planned (its plan was calibrated as the "
                f"{self._slot.k}-th charge); nothing was charged and nothing ran: run this "
                "experiment again"
            )
        decision.raise_if_refused()
        self._dataset_ledger = dataset_ledger
        if self._budget.epsilon < 0.5 * self._slot.cap:
            line = (f"[raydp-hpo] experiment {self._experiment!r}: the dataset ledger "
                    f"{dataset_ledger.name!r} admitted it at ε={self._budget.epsilon:.4g} "
                    f"(δ={self._budget.delta:.3g}), far below the ε={self._slot.cap:g} asked "
                    "for: that is what the dataset has left, and its noise is calibrated to it")
            _log.warning(line)
            if self._progress is not None:
                self._progress(line)

    def _release(self, searcher: Any, ledger: LedgerHandle, grid: Any, plan: Any,
                 exp_dir: str) -> DPResult:
        release = completed_release(searcher)
        trials: list[dict[str, Any]] = []
        by_id: dict[str, Any] = {}
        exhausted = False
        for result in grid:
            trial_id = (result.metrics or {}).get("trial_id")
            if trial_id is None and result.path:
                trial_id = Path(result.path).name
            by_id[str(trial_id)] = result
            err = result.error
            if err is not None and isinstance(_root_cause(err), BudgetExhaustedError):
                exhausted = True
            trials.append(
                {
                    "trial_id": trial_id,
                    "config": {k: v for k, v in (result.config or {}).items() if k != "raydp"},
                    "metrics": {k: v for k, v in (result.metrics or {}).items()
                                if isinstance(v, (int, float, str, bool))},
                    "error": None if err is None else repr(err)[:300],
                }
            )
        model, ckpt_path, model_path, test_acc = None, None, None, None
        contract, unreleased = None, None  # a user trainable's broken contract / lost model
        if release.trial_id is not None:
            result = self._find_result(by_id, release.trial_id)
            if result is not None and self._trainable is not None and not _builtin_result(result):
                # a trainable of the user's own (raydp_hpo.trial_session): raydp_hpo.tune.custom
                from raydp_hpo.tune import custom

                contract = custom.check_selected(release.trial_id, result.metrics)
                if contract is None:
                    ckpt_path = None if result.checkpoint is None else result.checkpoint.path
                    model, unreleased = custom.load_selected_model(ckpt_path)
                    if model is not None:
                        assert ckpt_path is not None
                        model_path = custom.write_user_release(Path(exp_dir) / PUBLIC_DIR,
                                                               ckpt_path)
            elif result is not None and result.checkpoint is not None:
                ckpt_path = result.checkpoint.path
                model = self._load_model(ckpt_path, result.config or {})
                model_path = self._write_released_model(Path(exp_dir) / PUBLIC_DIR, model,
                                                        result.config or {})
                test_acc = (result.metrics or {}).get("test_accuracy")
        extras = dict(release.extras)
        dp_test = None
        if model is not None and self._test_epsilon is not None:
            dp_test = self._dp_test_accuracy(model, ledger, extras)
        # charges of this experiment (plan and/or individual trials, DP test accuracy)
        prefix = f"{self._experiment}/"
        charges = tuple(
            (c.charge_id, c.mechanism) for c in ledger.charges() if c.charge_id.startswith(prefix)
        )
        mechs = [m for _, m in charges]
        delta = self._budget.delta
        eps_rdp = epsilon(mechs, delta, Accountant.RDP) if mechs else 0.0
        eps_pld = epsilon(mechs, delta, Accountant.PLD) if mechs else 0.0
        # random stopping by privacy profiles; inf where that accountant has no figure
        eps_profile = epsilon_or_inf(mechs, delta, Accountant.PROFILE) if mechs else 0.0
        settings = ledger.settings()
        certificate = PrivacyCertificate(
            algorithm=plan.algorithm,
            paper=plan.paper,
            description=plan.description,
            budget=self._budget,
            charges=charges,
            epsilon_rdp=eps_rdp,
            epsilon_pld=eps_pld,
            ledger_name=ledger.name,
            ledger_spent_epsilon=ledger.spent(),
            ledger_halting_rule=f"{settings['adaptivity']}/{settings['accountant']}",
            public=self._public_quantities(),
            epsilon_profile=eps_profile,
            dataset_ledger=None if self._dataset_ledger is None else (
                self._dataset_ledger.name, self._dataset_ledger.budget,
                self._dataset_ledger.spent()),
        )
        if not certificate.within_budget and not math.isclose(
            certificate.epsilon, self._budget.epsilon, rel_tol=1e-9
        ):
            raise RayDPHPOError(  # pragma: no cover - would be a bug in admission
                f"internal error: charged ε={certificate.epsilon} exceeds the budget"
            )
        hyperparameters = release.hyperparameters
        if contract is not None:  # nothing from a trial that was never admitted nor checked
            hyperparameters = None
            extras["reason"] = contract
        elif unreleased is not None:
            # the hyperparameters are paid for and selected: released; the model is not
            extras["model_not_released"] = unreleased
            warnings.warn(f"the model is not released: {unreleased}", UserWarning, stacklevel=3)
        elif (hyperparameters is None and self._trainable is not None
              and "no trial reported the metric" in str(extras.get("reason", ""))):
            from raydp_hpo.tune.custom import explain_no_selection

            contract = explain_no_selection(trials, self._metric)
            if contract is not None:
                extras["reason"] = contract
        if hyperparameters is not None and model is None and unreleased is None:
            # A release must describe a model that was trained: the final run failed (or left
            # no checkpoint), so nothing is released; the budget it spent stays spent.
            hyperparameters = None
            extras["final_failed"] = True
            extras.setdefault("reason", "the model to release was not trained (its run failed)")
        out = DPResult(
            hyperparameters=hyperparameters,
            model=model,
            model_path=model_path,
            certificate=certificate,
            test_accuracy=test_acc,
            budget_exhausted=exhausted,
            extras=extras,
            private_trials=trials,
            experiment_path=exp_dir,
            dp_test_accuracy=dp_test,
            dp_test_accuracy_epsilon=None if dp_test is None else self._test_epsilon,
            private_result_grid=grid,
            private_checkpoint_path=ckpt_path,
        )
        Path(exp_dir).mkdir(parents=True, exist_ok=True)
        self._write_public(Path(exp_dir), out)
        atomic_write_json(Path(exp_dir) / PRIVATE_EVALUATION_FILE, out.private_evaluation())
        if contract is not None:  # loud: never a silent hyperparameters=None
            from raydp_hpo.tune.custom import contract_error

            err = contract_error(contract, exp_dir)
            err.result = out  # type: ignore[attr-defined]
            raise err
        return out

    def _write_public(self, exp_dir: Path, out: DPResult) -> None:
        """``exp_dir/public/``: exactly what may be published (:mod:`raydp_hpo.tune.publish`),
        and the note that the rest of ``exp_dir`` is private. A release naming a path of this
        machine (a search-space constant) is still written, with a warning: the search has
        run and spent its budget, and :meth:`DPResult.save_public` refuses to copy it."""
        import warnings

        from raydp_hpo.tune.publish import (
            machine_paths,
            write_private_note,
            write_public_files,
        )

        manifest = out.public()
        private = (exp_dir, self._storage)
        found = machine_paths(manifest, private=private)
        if found:
            warnings.warn(
                f"the public release of {self._experiment!r} names paths of this machine "
                f"({', '.join(found[:3])}): remove them from the search space's constants "
                "before publishing it", UserWarning, stacklevel=3,
            )
        write_public_files(exp_dir / PUBLIC_DIR, manifest, out.model_path, private=private,
                           strict=False)
        write_private_note(exp_dir)

    def _dp_test_accuracy(self, model: Any, ledger: LedgerHandle, extras: dict[str, Any]
                          ) -> float | None:
        """The released model's test accuracy by the Laplace mechanism, charged first.

        The count of correct test predictions changes by at most 1 when one test record is
        added or removed (the model does not depend on test records; for a training or
        validation record the count is post-processing of the already charged model), so
        count + Laplace(1/ε_t) is ε_t-DP (Dwork et al. 2006); it is divided by the declared
        test size (post-processing) and clipped to [0, 1]. One release per experiment: a charge
        already on the ledger (a resumed run) is not released a second time."""
        import secrets

        import numpy as np

        from raydp_hpo.accounting.calibration import calibrate_laplace
        from raydp_hpo.accounting.mechanisms import Laplace
        from raydp_hpo.trainables.training import count_correct

        assert self._test_epsilon is not None
        charge_id = f"{self._experiment}/test_accuracy"
        if ledger.has_charge(charge_id):
            extras["dp_test_accuracy"] = "already released once by this experiment: not again"
            return None
        decision = ledger.try_charge(charge_id, Laplace(self._test_epsilon), owner=self._experiment)
        if not decision.admitted:
            extras["dp_test_accuracy"] = "refused by the ledger (budget exhausted): not released"
            return None
        rng = np.random.default_rng(
            secrets.randbits(128) if self._secret_seed is None else [self._secret_seed, 7]
        )
        noisy = count_correct(model, self._data.test) + float(
            rng.laplace(0.0, calibrate_laplace(self._test_epsilon))
        )
        return min(1.0, max(0.0, noisy / self._test_size))

    def _public_quantities(self) -> tuple[tuple[str, str], ...]:
        """What the certificate's guarantee treats as public (DESIGN.md, "Released vs
        private" and "Secrets and neighbouring datasets")."""
        train, val, test = self._sizes
        return (
            ("training-set size", f"{train.value} ({train.how})"),
            ("validation-set size", f"{val.value} ({val.how})"),
            *((("test-set size", f"{test.value} ({test.how})"),)
              if self._test_epsilon is not None else ()),
            *self._class_count(),
            ("configuration", "the search space, search settings, budget, model, sample rates, "
             "epochs and the train/validation/test split seed"),
        )

    def _class_count(self) -> tuple[tuple[str, str], ...]:
        """The number of classes fixes the released model's output width: declared, or read
        off the labels (``load_parquet`` without ``num_classes``) and then treated as public."""
        train = getattr(self._data, "train", None)
        if train is None:  # a user trainable with its own data: nothing known here
            return ()
        how = ("declared" if train.num_classes_declared else "max label + 1 in the data, "
               "treated as public: sizes_public=True (declare num_classes to make it "
               "data-independent)")
        return (("number of classes", f"{train.num_classes} ({how})"),)

    @staticmethod
    def _find_result(by_id: dict[str, Any], trial_id: str) -> Any | None:
        if trial_id in by_id:
            return by_id[trial_id]
        for key, result in by_id.items():
            if key and (key.endswith(trial_id) or trial_id in key):
                return result
        return None

    def _write_released_model(self, public_dir: Path, model: Any, config: Mapping[str, Any]
                              ) -> str:
        """Write the released model alone (:mod:`raydp_hpo.trainables.release`) into the
        experiment's ``public/`` folder: never the trial's checkpoint, which holds the secret
        generators' states."""
        from raydp_hpo.trainables.release import RELEASED_MODEL_FILE, save_released_model

        train = self._data.train
        public_dir.mkdir(parents=True, exist_ok=True)
        return str(save_released_model(
            public_dir / RELEASED_MODEL_FILE,
            model,
            model_name=config.get("model", "mlp"),
            model_kwargs=dict(config.get("model_kwargs", {})),
            feature_shape=train.feature_shape,
            num_classes=train.num_classes,
        ))

    def _load_model(self, checkpoint_path: str, config: Mapping[str, Any]) -> Any:
        """The released model: built from the released trial's config, weights from its
        checkpoint (the first model of the trial; its moving average with ``ema_decay``)."""
        from raydp_hpo.trainables.models import build_model
        from raydp_hpo.trainables.training import load_checkpoint, released_model_state

        payload = load_checkpoint(checkpoint_path)
        train = self._data.train
        model = build_model(
            config.get("model", "mlp"),
            train.feature_shape,
            train.num_classes,
            **dict(config.get("model_kwargs", {})),
        )
        model.load_state_dict(released_model_state(payload["runners"][0]))
        model.eval()
        return model


def _builtin_result(result: Any) -> bool:
    """Whether a Tune result came from the built-in trainable (its checkpoint format)."""
    from raydp_hpo.trainables.training import CHECKPOINT_FILE

    return result.checkpoint is not None and (Path(result.checkpoint.path)
                                              / CHECKPOINT_FILE).is_file()


@contextlib.contextmanager
def _quiet_tune_output(verbose: int) -> Any:
    """With ``verbose=0``, Tune's new console output still prints an experiment header that
    misleads here — "Number of trials 9223372036854775807" (the searcher decides the number,
    which is private) and a TensorBoard hint although no event files are written. Tune reads
    ``RAY_AIR_NEW_OUTPUT`` when a run starts; its legacy reporter prints nothing at verbosity 0.
    The variable is restored afterwards."""
    if verbose != 0:
        yield
        return
    old = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = old


def _whose_budget(ledger: LedgerHandle | None, dataset: str | None, fresh_budget: bool,
                  data: Any) -> str | None:
    """The fingerprint of the dataset whose ledger ``DPTuner`` charges by default, or ``None``
    when it charges the ``ledger`` given or a fresh budget (``fresh_budget=True``). Refuses
    conflicting choices and a run that names no data and asks for no fresh budget."""
    if not isinstance(fresh_budget, bool):
        raise InvalidParameterError(f"fresh_budget must be True or False, got {fresh_budget!r}")
    given = [name for name, on in (("ledger=", ledger is not None),
                                   ("dataset=", dataset is not None),
                                   ("fresh_budget=True", fresh_budget)) if on]
    if len(given) > 1:
        raise InvalidParameterError(
            f"{' and '.join(given)} both say whose budget to spend: give one of them (ledger= "
            "a shared ledger, dataset= the data's own ledger, fresh_budget=True a budget of "
            "this experiment's own)"
        )
    if ledger is not None or fresh_budget:
        return None
    if dataset is not None:
        if not isinstance(dataset, str) or not dataset.strip():
            raise InvalidParameterError(
                f"dataset must be a non-empty string naming the data, got {dataset!r}"
            )
        return dataset.strip()
    if data.name is None:
        raise InvalidParameterError(
            "DPTuner does not know whose budget this search spends: the data has no name. "
            "Name the dataset (DPTuner(dataset='census-2024'), or DataSplits(..., name=...); "
            "the loaders load_digits, load_mnist1d and load_parquet name theirs) so every "
            "experiment on it spends from one budget, pass a shared ledger (ledger="
            "get_ledger(...)), or ask for a budget of this experiment's own explicitly "
            "(fresh_budget=True)"
        )
    return str(data.name)
#: Tune's logger that prints a failed trial's error with its traceback.
_TUNE_CONTROLLER_LOGGER = "ray.tune.execution.tune_controller"


class _LedgerRefusalFilter(logging.Filter):
    """A trial the ledger refused (``BudgetExhaustedError`` at admission: nothing charged,
    nothing trained) is the search's documented halting rule, not a crash: Tune's "Trial task
    failed" record for it becomes one line naming the refusal, without the traceback. Every
    other trial error keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cause = _ledger_refusal(exc) if exc is not None else None
        if cause is not None:
            record.msg = f"{record.getMessage()}: refused by the ledger: {cause}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _ledger_refusal(err: BaseException) -> BudgetExhaustedError | None:
    """The ledger's own refusal inside ``err`` (Ray wraps it in a ``RayTaskError`` that is
    also an instance of the cause's class, with the task's traceback as its text)."""
    from ray.exceptions import RayTaskError

    seen: BaseException | None = err
    found = None
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, BudgetExhaustedError) and not isinstance(seen, RayTaskError):
            found = seen
        seen = getattr(seen, "cause", None) or seen.__cause__
    return found


@contextlib.contextmanager
def _ledger_refusals_without_traceback() -> Any:
    """:class:`_LedgerRefusalFilter` on Tune's trial-failure logger while a search runs."""
    logger = logging.getLogger(_TUNE_CONTROLLER_LOGGER)
    refusals = _LedgerRefusalFilter()
    logger.addFilter(refusals)
    try:
        yield
    finally:
        logger.removeFilter(refusals)


def _halting_accountant(adaptivity: Adaptivity) -> Accountant:
    """The dedicated ledger's halting accountant: the tightest valid one for the rule
    (:func:`raydp_hpo.ledger.tightest_halting_accountant`).

    A plan fixed before any data is touched (every built-in searcher: one plan charge, or a
    grid whose trials are fixed in advance) composes a fixed sequence, so it is calibrated and
    admitted on ``PROFILE`` — the minimum of the RDP, PLD and privacy-profile upper bounds
    (random stopping by Koskela, Redberg & Wang 2024's profiles) — and standard (fixed)
    composition justifies halting. Charges chosen adaptively halt on the RDP filter (Feldman &
    Zrnic 2021), whose guarantee holds under adaptivity; PLD and profiles have no such filter
    theorem. Measured: one DP-SGD run calibrated to ε = 3 by RDP alone is ε = 2.55 under PLD;
    the demo's random stopping admitted at RDP ε = 7.99 is ε = 6.03 under profiles.
    """
    from raydp_hpo.ledger.filter import tightest_halting_accountant

    return tightest_halting_accountant(adaptivity)


def require_earlier_charges(journal: Path | str | None, experiment: str,
                            charges: Sequence[Any] | None = None, *,
                            where: str | None = None) -> None:
    """Refuse to resume ``experiment`` unless the ledger it attaches to holds its earlier
    charges (ids ``<experiment>/...``): the journal at ``journal`` (read-only, nothing
    created), or ``charges`` of a live ledger (``where`` names it).

    A resume replays the plan charge by its id and continues trials inside their admitted
    charges. On a ledger without them — the journal and its seal moved away, another storage
    path, another ledger — the replay would be a fresh charge of the whole plan on a fresh
    budget: the experiment's first charges would be forgotten, and its spend counted
    nowhere. Raises :class:`LedgerMismatchError` naming the journal it expected."""
    prefix = f"{experiment}/"
    from raydp_hpo.ledger.pg import is_postgres_uri

    if charges is None and is_postgres_uri(journal):
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

        charges = PrivacyLedger.read_only(str(journal), curve_check=CurveCheck.ON_DEMAND).charges()
        where = f"the ledger {journal}"
    if charges is None:
        assert journal is not None
        journal = Path(journal)
        if not journal.exists():
            raise LedgerMismatchError(
                f"cannot resume experiment {experiment!r}: its charges should be in the ledger "
                f"journal {journal}, which does not exist (moved or deleted?). Put the journal "
                "and its .seal back where they were; resuming on a fresh ledger would charge "
                "the experiment again on a budget that does not know its earlier spend. "
                "Nothing was charged"
            )
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

        charges = PrivacyLedger.read_only(journal, curve_check=CurveCheck.ON_DEMAND).charges()
        where = f"the ledger journal {journal}"
    if not any(c.charge_id.startswith(prefix) for c in charges):
        raise LedgerMismatchError(
            f"cannot resume experiment {experiment!r}: {where} holds no charge of it (no "
            f"charge id starting with {prefix!r}), so it is not the ledger the experiment "
            "charged. Resume with the ledger (journal, storage path) it started on; resuming "
            "here would charge it again on a budget that does not know its earlier spend. "
            "Nothing was charged"
        )


def _resumed_accountant(journal: Path, adaptivity: Adaptivity) -> Accountant:
    """The halting accountant for the dedicated ledger at ``journal``.

    A fresh ledger gets :func:`_halting_accountant`. A journal that already exists (a resumed
    experiment) keeps the accountant written in its header when that one is valid for the
    same halting rule: experiments started before fixed plans halted on ``PROFILE`` were
    admitted on ``BEST`` (min of RDP and PLD), which stays a valid — only looser — bound for
    the charges still to come, so resuming them must not fail on the changed default. Any
    other mismatch (or an unreadable header) is left to the ledger actor to report.
    """
    default = _halting_accountant(adaptivity)
    if not journal.exists():
        return default
    from raydp_hpo.ledger.journal import read_header

    try:
        header = read_header(journal)
        stored = Accountant(header["accountant"])
        same_rule = Adaptivity(header["adaptivity"]) is adaptivity
    except (RayDPHPOError, KeyError, TypeError, ValueError):
        return default
    if not same_rule:
        return default
    if adaptivity is Adaptivity.ADAPTIVE:
        return stored if stored is Accountant.RDP else default
    return stored


@dataclass(frozen=True)
class _Slot:
    """An experiment's place on a dataset ledger (see :meth:`DPTuner._take_slot`): it is the
    k-th charge, with δ share ``delta``, after the charges ``prior``; it calibrates within
    ``cap``; ``reserved`` is the ``ApproxDP`` reservation of an experiment whose trials charge
    themselves (``None``: its plan is its point)."""

    k: int
    cap: float
    delta: float
    prior: tuple[tuple[str, Mechanism], ...]
    accountant: Accountant  # the dataset ledger's: how it prices a point
    reserved: Any | None
    charged: Mechanism | None  # on resume: the point this experiment charged


@dataclass(frozen=True)
class _BothRules:
    """Picklable: admissible under both rules; ``figure`` (calibration's guide) the first's."""

    first: _FirstChargeRule
    second: Any

    def figure(self, mechanism: Mechanism) -> float:
        return self.first.figure(mechanism)

    def __call__(self, mechanism: Mechanism) -> bool:
        return self.first(mechanism) and bool(self.second(mechanism))


@dataclass
class _DatasetPointRule:
    """Picklable admissibility rule for an experiment whose plan is its point on a dataset
    ledger: the plan (with the DP test accuracy's ``Laplace(ε_t)``) would be admitted there
    as the next charge after ``prior``. Decided on a local replica of the ledger (the
    decision is a function of the charges alone, :mod:`raydp_hpo.ledger.experiments`), so
    calibrating σ asks no actor; the real charge is checked again when it is made."""

    budget: PrivacyBudget
    accountant: Accountant  # the dataset ledger's: how it prices a point
    prior: tuple[tuple[str, Mechanism], ...]
    test_epsilon: float | None

    def __post_init__(self) -> None:
        self._replica: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_replica"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._replica = None

    def __call__(self, mechanism: Mechanism) -> bool:
        from raydp_hpo.accounting.mechanisms import Composition, Laplace
        from raydp_hpo.ledger.filter import PrivacyLedger

        if self._replica is None:
            replica = PrivacyLedger(self.budget, adaptivity=Adaptivity.EXPERIMENTS,
                                    accountant=self.accountant)
            for charge_id, prior in self.prior:
                replica.charge(charge_id, prior)
            self._replica = replica
        if self.test_epsilon is not None:
            mechanism = Composition((mechanism, Laplace(self.test_epsilon)))
        return bool(self._replica.would_admit(mechanism))


@dataclass(frozen=True)
class _FirstChargeRule:
    """Picklable admissibility rule for a dedicated ledger: within the experiment's budget
    and admitted as the first charge of a fresh ledger with this halting rule, both on the
    ledger's halting accountant (:func:`_halting_accountant`)."""

    budget: PrivacyBudget
    adaptivity: Adaptivity

    def figure(self, mechanism: Mechanism) -> float:
        """ε of ``mechanism`` on the halting accountant (guides calibration; see
        :meth:`raydp_hpo.searchers.base.DPSearcher._calibrate_noise`)."""
        return epsilon(mechanism, self.budget.delta, _halting_accountant(self.adaptivity))

    def __call__(self, mechanism: Mechanism) -> bool:
        from raydp_hpo.ledger.filter import admits_as_first_charge

        accountant = _halting_accountant(self.adaptivity)
        own = self.figure(mechanism) <= self.budget.epsilon
        return own and admits_as_first_charge(
            self.budget, mechanism, adaptivity=self.adaptivity, accountant=accountant
        )


def _root_cause(err: BaseException) -> BaseException:
    seen = err
    for _ in range(10):
        cause = getattr(seen, "cause", None) or seen.__cause__
        if cause is None or cause is seen:
            break
        seen = cause
    if isinstance(err, BudgetExhaustedError):
        return err
    return seen
