"""What :meth:`DPTuner.fit <raydp_hpo.tune.tuner.DPTuner.fit>` returns: :class:`DPResult`,
its public part and its private evaluation, and :func:`completed_release` (nothing is released
from a search cut short).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydp_hpo.searchers.base import Release
from raydp_hpo.tune.certificate import PrivacyCertificate

#: ``DPResult.extras`` key of the public reason a search selected nothing (``release.json``'s
#: ``reason``: a coarse category, never a trial's error text).
NOT_SELECTED_KEY = "not_selected"

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
    ``extras["final_failed"]``) — a release always describes a model that was trained. Then
    :meth:`DPTuner.fit` raises :class:`~raydp_hpo.errors.SearchFailedError` (its ``result``
    attribute holds this object) after writing ``public/``, whose ``release.json`` says
    ``"selected": false`` and the ``reason`` (``extras["not_selected"]``). With a
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
            reason=(self.extras or {}).get(NOT_SELECTED_KEY),
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
