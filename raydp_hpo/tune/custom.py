"""How DPTuner releases the selection of a trainable of the user's own
(:func:`raydp_hpo.trial_session`): the contract checks and the model it loads.

* The selected trial's final result must carry :data:`~raydp_hpo.trainables.session.SESSION_KEY`
  (set by every report of a session): a result without it came from a trainable that never
  entered a session — never admitted, never checked — and nothing from it is released
  (:func:`check_selected`).
* The model is read from the trial's checkpoint in the documented user-model format
  (:func:`~raydp_hpo.trainables.release.save_user_model`). If it cannot be (no checkpoint, an
  unreadable file, a ``model_fn`` the driver cannot import), the hyperparameters — already paid
  for and selected — are still released, with the reason (:func:`load_selected_model`).
* A search that selected nothing because of the trainable (every trial broke the contract, or
  reported its score under another metric name) is an error naming the key and the fix
  (:func:`explain_no_selection`), never a silent ``hyperparameters=None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raydp_hpo.errors import RayDPHPOError, TrialContractError
from raydp_hpo.trainables.release import USER_MODEL_FILE, load_user_model
from raydp_hpo.trainables.session import SESSION_KEY
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY

__all__ = [
    "check_selected",
    "contract_error",
    "explain_no_selection",
    "is_user_checkpoint",
    "load_selected_model",
    "write_user_release",
]


def is_user_checkpoint(path: str | None) -> bool:
    """Whether a trial's checkpoint directory holds a user model (``trial.save_model``)."""
    return path is not None and (Path(path) / USER_MODEL_FILE).is_file()


def check_selected(trial_id: str, metrics: Mapping[str, Any] | None) -> str | None:
    """Why the selected trial of a custom trainable cannot be released, or ``None``."""
    if SESSION_KEY not in (metrics or {}):
        return (
            f"trial {trial_id} reported without raydp_hpo.trial_session (its result has no "
            f"{SESSION_KEY!r} key): it was never admitted or checked, so nothing from it is "
            "released. Run the trainable's loop inside `with raydp_hpo.trial_session(config) "
            "as trial:` and report with trial.report_score(correct)"
        )
    return None


def load_selected_model(checkpoint_path: str | None) -> tuple[Any | None, str | None]:
    """``(model, None)`` from a user checkpoint, or ``(None, reason)``."""
    if checkpoint_path is None:
        return None, (
            f"the selected trial left no checkpoint: call trial.save_model(model, model_fn=...)"
            f" before trial.report_score so its report carries {USER_MODEL_FILE}"
        )
    try:
        return load_user_model(Path(checkpoint_path) / USER_MODEL_FILE), None
    except (RayDPHPOError, RuntimeError, OSError) as err:
        return None, f"the selected trial's model cannot be loaded: {err}"


def write_user_release(public_dir: Path, checkpoint_path: str) -> str:
    """Write the released user model (weights and rebuild information only, the format of
    :func:`~raydp_hpo.trainables.release.save_user_model`) to ``public_dir``, with its
    exported program beside it when the trial saved one (``released_model.pt2``); its path."""
    from raydp_hpo._atomic_io import atomic_write_bytes
    from raydp_hpo.trainables.release import (
        RELEASED_MODEL_FILE,
        program_path,
        read_user_model,
        save_user_model,
    )

    source = Path(checkpoint_path) / USER_MODEL_FILE
    payload = read_user_model(source)
    public_dir.mkdir(parents=True, exist_ok=True)
    target = public_dir / RELEASED_MODEL_FILE
    program = program_path(target)
    if program_path(source).is_file():  # the exported program: loads without model_fn
        atomic_write_bytes(program, program_path(source).read_bytes())
    else:
        program.unlink(missing_ok=True)
    return str(save_user_model(target, payload["state_dict"], model_fn=payload["model_fn"],
                               model_kwargs=payload["model_kwargs"]))


def explain_no_selection(trials: Sequence[Mapping[str, Any]], metric: str) -> str | None:
    """The contract break that left a search with no selection, or ``None`` (an honest
    outcome: K = 0 drawn, budget exhausted, ...). ``trials``: ``DPResult.private_trials``."""
    if not trials:
        return None
    errors = [t["error"] for t in trials if t.get("error")]
    if errors and len(errors) == len(trials) and any("TrialContractError" in e for e in errors):
        first = next(e for e in errors if "TrialContractError" in e)
        return f"every trial failed; the first broke the trial contract: {first}"
    scored = [t for t in trials if NOISY_SCORE_KEY in (t.get("metrics") or {})]
    if scored and not any(metric in t["metrics"] for t in scored):
        keys = sorted(set(scored[0]["metrics"]) - {NOISY_SCORE_KEY, SESSION_KEY})
        return (
            f"the trials reported their noisy score but not under the metric {metric!r} that "
            f"DPTuner selects on (their keys: {keys}); pass DPTuner(metric=...) with the key "
            f"of trial.report_score(..., metric=...), or report under {metric!r}"
        )
    if not errors and not scored:
        return (
            f"no trial reported a noisy score ({NOISY_SCORE_KEY!r} missing from every result): "
            "report it with trial.report_score(correct) inside raydp_hpo.trial_session"
        )
    return None


def contract_error(reason: str, exp_dir: str) -> TrialContractError:
    """The error :meth:`DPTuner.fit` raises after writing the certificate of what was spent."""
    return TrialContractError(
        f"{reason}. The budget the search spent stays spent; its certificate is in "
        f"{Path(exp_dir) / 'public'}"
    )
