"""Building and publishing one run's release (:class:`ReleaseBuilder`): the released model,
the certificate of every charge, the public folder, the DP test accuracy and the private
evaluation.

:class:`~raydp_hpo.tune.tuner.DPTuner` composes it once its search has run: it states the
run's settings (:class:`ReleaseBuilder`'s fields) and gets the :class:`DPResult` of
:meth:`ReleaseBuilder.build`. Nothing here reads or sets the tuner's state.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo.accounting.accountants import Accountant, epsilon, epsilon_or_inf
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import BudgetExhaustedError, RayDPHPOError, SearchFailedError
from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.tune.certificate import PrivacyCertificate
from raydp_hpo.tune.publish import PUBLIC_DIR
from raydp_hpo.tune.result import (
    NOT_SELECTED_KEY,
    PRIVATE_EVALUATION_FILE,
    DPResult,
    completed_release,
)
from raydp_hpo.tune.run_output import _root_cause
from raydp_hpo.tune.sizes import _Size


@dataclass(frozen=True)
class ReleaseBuilder:
    """Builds and publishes the release of one run (:meth:`build`), from its settings.

    ``experiment`` and ``charge_prefix`` (``<experiment>@<run id>``) name the run and its
    charges; ``budget`` is its (ε, δ) (the certificate's); ``metric`` what it selects on;
    ``storage`` its storage path (a release naming it gets a warning); ``data`` its
    ``DataSplits`` (the test split of the DP test accuracy, the released model's shape);
    ``trainable_given`` whether a trainable was passed (not built from ``data``; a trainable
    of the user's own, ``raydp_hpo.trial_session``, is told from the built-in one by its
    checkpoint); ``sizes`` the public (training, validation, test) sizes;
    ``test_epsilon`` the ε_t of a DP test accuracy (``None``: none); ``secret_seed`` the run's
    secret seed (never printed); ``dataset_ledger`` the dataset ledger its point is on, if
    any (the certificate states it); ``auto_choice`` the
    :class:`~raydp_hpo.searchers.auto.AutoChoice` of ``search="auto"`` (``None``: the search was
    named), which the certificate and release.json state."""

    experiment: str
    charge_prefix: str
    budget: PrivacyBudget
    metric: str
    storage: Path
    data: Any = field(repr=False)
    trainable_given: bool
    sizes: tuple[_Size, _Size, _Size]
    test_epsilon: float | None = None
    secret_seed: int | None = field(default=None, repr=False)
    dataset_ledger: LedgerHandle | None = None
    auto_choice: Any = None

    def build(self, searcher: Any, ledger: LedgerHandle, grid: Any, plan: Any, exp_dir: str
              ) -> DPResult:
        """The release of the finished search ``searcher`` (its result ``grid`` of Tune, its
        ``plan``; ``ledger`` the one its trials charged), written to ``exp_dir``'s public
        folder with its private evaluation beside it. A search that selected nothing, or a
        user trainable that broke the trial contract, raises after writing its certificate."""
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
            if result is not None and self.trainable_given and not _builtin_result(result):
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
        if model is not None and self.test_epsilon is not None:
            dp_test = self._dp_test_accuracy(model, ledger, extras)
        # charges of this experiment (plan and/or individual trials, DP test accuracy)
        prefix = f"{self.charge_prefix}/"  # this run's, never another run's of the name
        charges = tuple(
            (c.charge_id, c.mechanism) for c in ledger.charges() if c.charge_id.startswith(prefix)
        )
        mechs = [m for _, m in charges]
        delta = self.budget.delta
        eps_rdp = epsilon(mechs, delta, Accountant.RDP) if mechs else 0.0
        eps_pld = epsilon(mechs, delta, Accountant.PLD) if mechs else 0.0
        # random stopping by privacy profiles; inf where that accountant has no figure
        eps_profile = epsilon_or_inf(mechs, delta, Accountant.PROFILE) if mechs else 0.0
        settings = ledger.settings()
        certificate = PrivacyCertificate(
            algorithm=plan.algorithm,
            paper=plan.paper,
            description=plan.description,
            budget=self.budget,
            charges=charges,
            epsilon_rdp=eps_rdp,
            epsilon_pld=eps_pld,
            ledger_name=ledger.name,
            ledger_spent_epsilon=ledger.spent(),
            ledger_halting_rule=f"{settings['adaptivity']}/{settings['accountant']}",
            public=self.public_quantities(),
            epsilon_profile=eps_profile,
            dataset_ledger=None if self.dataset_ledger is None else (
                self.dataset_ledger.name, self.dataset_ledger.budget,
                self.dataset_ledger.spent()),
            auto_search=None if self.auto_choice is None else self.auto_choice.to_dict(),
        )
        if not certificate.within_budget and not math.isclose(
            certificate.epsilon, self.budget.epsilon, rel_tol=1e-9
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
        elif (hyperparameters is None and self.trainable_given
              and "no trial reported the metric" in str(extras.get("reason", ""))):
            from raydp_hpo.tune.custom import explain_no_selection

            contract = explain_no_selection(trials, self.metric)
            if contract is not None:
                extras["reason"] = contract
        if hyperparameters is not None and model is None and unreleased is None:
            # A release must describe a model that was trained: the final run failed (or left
            # no checkpoint), so nothing is released; the budget it spent stays spent.
            hyperparameters = None
            extras["final_failed"] = True
            extras.setdefault("reason", "the model to release was not trained (its run failed)")
        if hyperparameters is None:  # said in release.json, then raised (below)
            extras[NOT_SELECTED_KEY] = _public_reason(contract is not None, exhausted, trials,
                                                      extras)
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
            dp_test_accuracy_epsilon=None if dp_test is None else self.test_epsilon,
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
        if hyperparameters is None:  # loud: a failed search never looks like a finished one
            raise _search_failed(out, trials, exp_dir)
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
        private = (exp_dir, self.storage)
        found = machine_paths(manifest, private=private)
        if found:
            warnings.warn(
                f"the public release of {self.experiment!r} names paths of this machine "
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

        assert self.test_epsilon is not None
        charge_id = f"{self.charge_prefix}/test_accuracy"
        if ledger.has_charge(charge_id):
            extras["dp_test_accuracy"] = "already released once by this experiment: not again"
            return None
        decision = ledger.try_charge(charge_id, Laplace(self.test_epsilon), owner=self.experiment)
        if not decision.admitted:
            extras["dp_test_accuracy"] = "refused by the ledger (budget exhausted): not released"
            return None
        rng = np.random.default_rng(
            secrets.randbits(128) if self.secret_seed is None else [self.secret_seed, 7]
        )
        noisy = count_correct(model, self.data.test) + float(
            rng.laplace(0.0, calibrate_laplace(self.test_epsilon))
        )
        return min(1.0, max(0.0, noisy / self.sizes[2].value))

    def public_quantities(self) -> tuple[tuple[str, str], ...]:
        """What the certificate's guarantee treats as public (DESIGN.md, "Released vs
        private" and "Secrets and neighbouring datasets")."""
        train, val, test = self.sizes
        return (
            ("training-set size", f"{train.value} ({train.how})"),
            ("validation-set size", f"{val.value} ({val.how})"),
            *((("test-set size", f"{test.value} ({test.how})"),)
              if self.test_epsilon is not None else ()),
            *self._class_count(),
            ("configuration", "the search space, search settings, budget, model, sample rates, "
             "epochs and the train/validation/test split seed"),
        )

    def _class_count(self) -> tuple[tuple[str, str], ...]:
        """The number of classes fixes the released model's output width: declared, or read
        off the labels (``load_parquet`` without ``num_classes``) and then treated as public."""
        train = getattr(self.data, "train", None)
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

        train = self.data.train
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
        train = self.data.train
        model = build_model(
            config.get("model", "mlp"),
            train.feature_shape,
            train.num_classes,
            **dict(config.get("model_kwargs", {})),
        )
        model.load_state_dict(released_model_state(payload["runners"][0]))
        model.eval()
        return model


def _public_reason(contract: bool, exhausted: bool, trials: list[dict[str, Any]],
                   extras: Mapping[str, Any]) -> str:
    """Why nothing was selected, as ``release.json`` states it: a coarse category, never a
    trial's error text (which may quote private data) nor a count of trials (private)."""
    if contract:
        return "a trainable broke the trial contract; nothing from it is released"
    if extras.get("final_failed"):
        return "the final run failed, so no trained model can be released"
    if exhausted:
        return "the ledger refused the trials before any could be selected (budget exhausted)"
    if any(t.get("error") for t in trials):
        return "trials failed (an exception in the trainable) and none could be selected"
    reason = str(extras.get("reason") or "")
    if "K = 0" in reason:
        return "K = 0 was drawn (the random number of trials is part of the DP selection)"
    return reason or "no configuration was selected"


def _search_failed(out: DPResult, trials: list[dict[str, Any]], exp_dir: str
                   ) -> SearchFailedError:
    """The error :meth:`DPTuner.fit` raises for a search that selected nothing, after the
    certificate of what it spent is written: the public reason, and for the operator the
    first trial error (private: it is not in ``release.json``) and where the trials are."""
    reason = str(out.extras[NOT_SELECTED_KEY])
    errors = [t["error"] for t in trials if t.get("error")]
    cert = out.certificate
    detail = (f" ({len(errors)} of {len(trials)} trial(s) failed; the first: {errors[0]}). "
              "Fix the trainable and run the search again as a new run (it pays again)"
              if errors else "")
    return SearchFailedError(
        f"the search selected nothing: {reason}{detail}. Nothing is released; what it spent "
        f"stays spent (ε={cert.epsilon:.4g}, δ={cert.budget.delta:g}), and its certificate is "
        f"in {Path(exp_dir) / PUBLIC_DIR} (release.json says \"selected\": false). The "
        f"trials (private) are in {Path(exp_dir) / 'tune'}",
        reason=reason, result=out,
    )


def _builtin_result(result: Any) -> bool:
    """Whether a Tune result came from the built-in trainable (its checkpoint format)."""
    from raydp_hpo.trainables.training import CHECKPOINT_FILE

    return result.checkpoint is not None and (Path(result.checkpoint.path)
                                              / CHECKPOINT_FILE).is_file()
