"""Report a trial's result to a searcher the way the built-in trainable does."""

from __future__ import annotations

from typing import Any

from raydp_hpo.searchers.base import RESERVED_KEY
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY


def complete(searcher: Any, trial_id: str, result: dict[str, Any]) -> None:
    """``searcher.on_trial_complete(trial_id, result)`` with the noisy-score key a trial that
    releases its score (``score_epsilon`` in its raydp block) sets on its final result."""
    settings = searcher._configs[trial_id].get(RESERVED_KEY)
    score_epsilon = getattr(settings, "score_epsilon", None)
    if score_epsilon is not None:
        result = {**result, NOISY_SCORE_KEY: score_epsilon}
    searcher.on_trial_complete(trial_id, result)
