"""Ray Tune pieces around the ledger: a Stopper that halts on exhaustion and an audit Callback.

* :class:`LedgerStopper` — ``stop_all()`` returns True once the ledger cannot admit another
  trial (remaining ε below the cheapest next charge, or a trial reported that the ledger
  refused it). ``stop_all`` is polled every controller step, so the ledger is queried at most
  every ``poll_interval_s``. Stopping a Tune experiment this way kills running trials
  abruptly; their privacy was admitted before they started, so nothing is lost.
* :class:`LedgerAuditCallback` — appends one JSON line per trial event (start, result,
  completion, error); completion and error lines carry the ledger's spend at that moment. It is a private
  artefact (it contains per-trial metrics), like Tune's experiment directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback, Stopper

from raydp_hpo.mechanisms import Mechanism

__all__ = ["LedgerStopper", "LedgerAuditCallback", "BUDGET_EXHAUSTED_KEY"]

#: Result key a trial sets to True when the ledger refused its charge.
BUDGET_EXHAUSTED_KEY = "raydp_budget_exhausted"


class LedgerStopper(Stopper):
    """Stop the whole experiment once the ledger is exhausted.

    Args:
        ledger: a :class:`~raydp_hpo.ledger.PrivacyLedger` or a ledger actor handle.
        next_charge: the cheapest mechanism a further trial would need; the experiment stops
            when the ledger would refuse it. Without it, stops when remaining ε ≤
            ``min_remaining_epsilon``.
        min_remaining_epsilon: see above (default 0: stop only when nothing remains).
        poll_interval_s: cache the ledger answer this long.
    """

    def __init__(
        self,
        ledger: Any,
        next_charge: Mechanism | None = None,
        *,
        min_remaining_epsilon: float = 0.0,
        poll_interval_s: float = 1.0,
    ) -> None:
        self._ledger = ledger
        self._next = next_charge
        self._min_remaining = float(min_remaining_epsilon)
        self._poll = float(poll_interval_s)
        self._last_poll = -float("inf")
        self._exhausted = False

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if result.get(BUDGET_EXHAUSTED_KEY):
            self._exhausted = True
        return False

    def _check(self) -> bool:
        if self._next is not None:
            return not self._ledger.would_admit(self._next)
        return self._ledger.remaining() <= self._min_remaining

    def stop_all(self) -> bool:
        if self._exhausted:
            return True
        now = time.monotonic()
        if now - self._last_poll >= self._poll:
            self._last_poll = now
            self._exhausted = self._check()
        return self._exhausted


class LedgerAuditCallback(Callback):
    """Append-only JSON-lines audit trail of trial events with the ledger's spend."""

    def __init__(self, ledger: Any, path: str | os.PathLike[str]) -> None:
        self._ledger = ledger
        self._path = Path(path).expanduser().resolve()
        self._path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        return self._path

    def _write(self, event: str, trial: Any, *, with_spend: bool = False, **extra: Any) -> None:
        record: dict[str, Any] = {
            "time": time.time(),
            "event": event,
            "trial_id": getattr(trial, "trial_id", str(trial)),
        }
        if with_spend:
            # One ledger round trip, only where a trial's charge is settled (it runs on Tune's
            # single-threaded controller, so per-result calls would slow every experiment).
            try:
                record["spent_epsilon"] = float(self._ledger.spent())
            except Exception as exc:  # the audit must never crash the experiment
                record["spent_epsilon"] = float("nan")
                record["ledger_error"] = repr(exc)
        record.update(extra)
        line = json.dumps(record, default=str, allow_nan=True) + "\n"
        with open(self._path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            if with_spend:  # settlement lines are made durable; the ledger journal is the record
                os.fsync(fh.fileno())

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        config = {k: v for k, v in (getattr(trial, "config", {}) or {}).items() if k != "raydp"}
        self._write("start", trial, config=config)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        keep = {
            k: result[k]
            for k in ("training_iteration", "epoch", "epsilon", "val_accuracy", "loss")
            if k in result
        }
        if result.get(BUDGET_EXHAUSTED_KEY):
            keep[BUDGET_EXHAUSTED_KEY] = True
        self._write("result", trial, result=keep)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._write("complete", trial, with_spend=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._write("error", trial, with_spend=True)
