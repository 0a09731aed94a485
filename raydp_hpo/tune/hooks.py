"""Ray Tune pieces around the ledger: a Stopper that halts on exhaustion and an audit Callback.

* :class:`LedgerStopper` — ``stop_all()`` returns True once the ledger cannot admit another
  trial (remaining ε below the cheapest next charge, or a trial reported that the ledger
  refused it). ``stop_all`` is polled every controller step, so the ledger is queried at most
  every ``poll_interval_s``. Stopping a Tune experiment this way kills running trials
  abruptly; their privacy was admitted before they started, so nothing is lost.
* :class:`LedgerAuditCallback` — appends one JSON line per trial event (start, result,
  completion, error) and ``spend`` lines with the ledger's spend over time. It is a private
  artefact (it contains per-trial metrics), like Tune's experiment directory.
* :class:`ProgressCallback` — prints one line when something changed, at most every
  ``interval_s``: trials done / errored / running, the best **noisy** selection score so far,
  and the ε the ledger has spent. It reads Tune's trial events and asks the ledger without
  waiting, instead of a thread re-reading the audit file.
* :class:`NoTensorBoardLogger` — takes the place of Tune's default TensorBoard logger, so that
  a run writes no per-trial TensorBoard event files (see its docstring).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.tune import Callback, Stopper
from ray.tune.logger import LoggerCallback, TBXLoggerCallback

from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.ledger_like import LedgerLike
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY, TRIAL_EPSILON_KEY

__all__ = [
    "LedgerStopper",
    "LedgerAuditCallback",
    "ProgressCallback",
    "NoTensorBoardLogger",
    "BUDGET_EXHAUSTED_KEY",
    "NOISY_SCORE_KEY",
]

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
        poll_interval_s: ask the ledger at most this often.

    With a ledger actor the question is sent without waiting and its answer read at a later
    controller step (Tune's controller is single-threaded; a blocking round trip per step, or
    waiting for an actor still starting, would stall every trial). A ledger that cannot be
    reached stops the experiment: it could not admit anything anyway. Trials refused by the
    ledger (``raydp_budget_exhausted`` in a result) stop it at once.
    """

    def __init__(
        self,
        ledger: LedgerLike,
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
        self._asked: Any = None  # an unanswered ObjectRef
        self.ledger_error: Exception | None = None  # why the ledger could not be asked

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if result.get(BUDGET_EXHAUSTED_KEY):
            self._exhausted = True
        return False

    def _ask(self) -> Any:
        """The ledger's answer (local ledger) or an ObjectRef for it (ledger actor)."""
        if self._next is not None:
            ask = getattr(self._ledger, "would_admit_ref", None)
            return ask(self._next) if ask is not None else self._ledger.would_admit(self._next)
        ask = getattr(self._ledger, "remaining_ref", None)
        return ask() if ask is not None else self._ledger.remaining()

    def _is_exhausted(self, answer: Any) -> bool:
        if self._next is not None:
            return not answer
        return float(answer) <= self._min_remaining

    def stop_all(self) -> bool:
        if self._exhausted:
            return True
        try:
            if self._asked is not None:
                if not _ready(self._asked):
                    return False
                answer, self._asked = ray.get(self._asked), None
                self._exhausted = self._is_exhausted(answer)
                return self._exhausted
            now = time.monotonic()
            if now - self._last_poll >= self._poll:
                self._last_poll = now
                answer = self._ask()
                if isinstance(answer, ray.ObjectRef):
                    self._asked = answer
                else:
                    self._exhausted = self._is_exhausted(answer)
        except Exception as exc:  # unreachable ledger: nothing more can be admitted
            self._asked = None
            self.ledger_error = exc
            self._exhausted = True
        return self._exhausted


class LedgerAuditCallback(Callback):
    """Append-only JSON-lines audit trail: trial events, and the ledger's spend over time.

    Trial events (``start``, ``result``, ``complete``, ``error``) are written as they happen.
    The ledger's spend is written as ``spend`` records: asked for at most every
    ``spend_interval_s`` at a controller step, without waiting (Tune's controller is
    single-threaded; a round trip per trial would slow every experiment), written when the
    answer is in, and asked once more, waiting, when the experiment ends. The file is synced
    to disk at the end; the ledger's journal, fsync'd on every charge, is the privacy record.
    """

    def __init__(
        self, ledger: LedgerLike, path: str | os.PathLike[str], *, spend_interval_s: float = 1.0
    ) -> None:
        self._ledger = ledger
        self._path = Path(path).expanduser().resolve()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._interval = float(spend_interval_s)
        self._last_ask = -float("inf")
        self._asked: Any = None  # an unanswered ObjectRef for the spend
        self._fh: Any = None  # the file, opened on the first record and kept open

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment state: no open file, no ObjectRef.
        return {**self.__dict__, "_fh": None, "_asked": None}

    @property
    def path(self) -> Path:
        return self._path

    def _append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        if self._fh is None or self._fh.closed:
            self._fh = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        fh = self._fh
        fh.write(json.dumps(record, default=str, allow_nan=True) + "\n")
        fh.flush()  # each record reaches the file as it happens
        if durable:
            os.fsync(fh.fileno())

    def close(self) -> None:
        """Close the file (the next record opens it again)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _event(self, event: str, trial: Any, **extra: Any) -> None:
        record: dict[str, Any] = {
            "time": time.time(),
            "event": event,
            "trial_id": getattr(trial, "trial_id", str(trial)),
        }
        record.update(extra)
        self._append(record)

    def _write_spend(self, spend: Any, *, durable: bool = False) -> None:
        record: dict[str, Any] = {"time": time.time(), "event": "spend"}
        if isinstance(spend, Exception):  # the audit must never crash the experiment
            record["spent_epsilon"] = float("nan")
            record["ledger_error"] = repr(spend)
        else:
            record["spent_epsilon"] = float(spend)
        self._append(record, durable=durable)

    def _ask_spend(self) -> Any:
        """An ObjectRef for the ledger actor's spend, or the spend itself for a local ledger."""
        try:
            return _spend_request(self._ledger)
        except Exception as exc:
            return exc

    def record_spend(self, *, wait: bool) -> None:
        """Write the spend answered since the last call; ask again if the interval has passed.

        ``wait=True`` asks now and writes the answer before returning (and syncs the file).
        """
        if self._asked is not None and (wait or _ready(self._asked)):
            self._write_spend(_resolve(self._asked))
            self._asked = None
        now = time.monotonic()
        if wait or (self._asked is None and now - self._last_ask >= self._interval):
            self._last_ask = now
            answer = self._ask_spend()
            if isinstance(answer, ray.ObjectRef):
                if wait:
                    self._write_spend(_resolve(answer), durable=True)
                else:
                    self._asked = answer
            else:
                self._write_spend(answer, durable=wait)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        config = {k: v for k, v in (getattr(trial, "config", {}) or {}).items() if k != "raydp"}
        self._event("start", trial, config=config)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        keep = {
            k: result[k]
            for k in ("training_iteration", "epoch", TRIAL_EPSILON_KEY, "val_accuracy", "loss")
            if k in result
        }
        if result.get(BUDGET_EXHAUSTED_KEY):
            keep[BUDGET_EXHAUSTED_KEY] = True
        self._event("result", trial, result=keep)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._event("complete", trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._event("error", trial)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.record_spend(wait=False)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        try:
            self.record_spend(wait=True)
        finally:
            self.close()


class ProgressCallback(Callback):
    """Progress lines for the operator: trials, the best noisy score so far, ε spent.

    ``trials done N, errored E, running R; best <metric> (noisy) so far S; ledger ε spent
    x / total``, written with ``out`` when it changed, at most every ``interval_s`` (and once at
    the end of the experiment).

    Only **noisy** scores count towards "best so far": a trial's score is taken from its final
    result, and only when that result carries :data:`NOISY_SCORE_KEY` (the trial released its
    score with noise charged to it); per-epoch values and unnoised scores (a validation split
    declared public, a final run) are never shown. The lines are nonetheless a private
    artefact, like Tune's console output: the number of trials run is not released (random
    stopping's is secret), so show them to the operator only.

    The ledger's spend is asked without waiting (an ``ObjectRef`` read at a later controller
    step; Tune's controller is single-threaded) and asked once more, waiting, at the end. A
    ledger that cannot be asked shows ε spent as ``?``; progress never stops the experiment.

    Args:
        ledger: a ledger actor handle (``spent_ref``) or a local ledger (``spent``).
        total_epsilon: the budget shown after the spend.
        metric, mode: the selection score and whether larger (``"max"``) is better.
        out: where lines go (default ``print``).
        interval_s: at most one line this often.
    """

    def __init__(
        self,
        ledger: LedgerLike,
        total_epsilon: float,
        metric: str,
        mode: str = "max",
        *,
        out: Callable[[str], None] = print,
        interval_s: float = 5.0,
    ) -> None:
        if mode not in ("max", "min"):
            raise InvalidParameterError(f"mode must be 'max' or 'min', got mode={mode!r}")
        self._ledger = ledger
        self._total = float(total_epsilon)
        self._metric = metric
        self._mode = mode
        self._out = out
        self._interval = float(interval_s)
        self._running: set[str] = set()
        self._done: set[str] = set()
        self._errored: set[str] = set()
        self.best: float | None = None
        self.spent: float | None = None
        self._asked: Any = None
        self._last_line_at = -float("inf")
        self._last_key = ""
        self._t0 = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its run config when a run starts: ``out`` (any callable) and an
        unanswered ledger question are not kept; a restored copy prints with ``print``."""
        state = self.__dict__.copy()
        state["_out"] = print
        state["_asked"] = None
        return state

    # ------------------------------------------------------------ state
    def _noisy_score(self, result: dict[str, Any] | None) -> float | None:
        if not result or NOISY_SCORE_KEY not in result:
            return None
        value = result.get(self._metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value) if math.isfinite(value) else None

    def _ask_spend(self, *, wait: bool) -> None:
        try:
            if self._asked is not None and (wait or _ready(self._asked)):
                self.spent, self._asked = float(ray.get(self._asked)), None
            if self._asked is None:
                answer = _spend_request(self._ledger)
                if not isinstance(answer, ray.ObjectRef):
                    self.spent = answer
                elif wait:
                    self.spent = float(ray.get(answer))
                else:
                    self._asked = answer
        except Exception:  # progress must never stop the experiment
            self._asked = None

    def summary(self) -> str:
        best = "-" if self.best is None else f"{self.best:.4f}"
        spent = "?" if self.spent is None else f"{self.spent:.4f}"
        return (
            f"[raydp-hpo {time.monotonic() - self._t0:6.0f}s] trials done {len(self._done)}, "
            f"errored {len(self._errored)}, running {len(self._running)}; best {self._metric} "
            f"(noisy) so far {best}; ledger ε spent {spent} / {self._total:g}"
        )

    def _emit(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_line_at < self._interval:
            return
        line = self.summary()
        key = line.split("]", 1)[1]
        if key != self._last_key:
            self._last_key, self._last_line_at = key, now
            with contextlib.suppress(Exception):  # progress must never stop the experiment
                self._out(line)

    # ------------------------------------------------------------ Tune hooks
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._running.add(getattr(trial, "trial_id", str(trial)))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = getattr(trial, "trial_id", str(trial))
        self._running.discard(tid)
        self._done.add(tid)
        score = self._noisy_score(getattr(trial, "last_result", None))
        if score is not None and (
            self.best is None or (score > self.best if self._mode == "max" else score < self.best)
        ):
            self.best = score

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        tid = getattr(trial, "trial_id", str(trial))
        self._running.discard(tid)
        self._errored.add(tid)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self._ask_spend(wait=False)
        if self.spent is None and self._asked is not None:
            return  # the first answer is not in yet: no line with an unknown spend
        self._emit(force=False)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._ask_spend(wait=True)
        self._emit(force=True)


class SilentLogger(LoggerCallback):
    """A Tune logger that writes nothing: subclass it together with one of Tune's default
    logger classes to fill that logger's slot (see :class:`NoTensorBoardLogger`)."""

    def __init__(self) -> None:  # no writers, no tensorboardX import
        LoggerCallback.__init__(self)

    def log_trial_start(self, trial: Any) -> None:
        pass

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        pass

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        pass


class NoTensorBoardLogger(SilentLogger, TBXLoggerCallback):
    """Fills Tune's TensorBoard-logger slot and writes nothing.

    Tune adds its CSV, JSON and TensorBoard loggers to every run unless a callback of the
    same type is given (``ray.tune.utils.callback._create_default_callbacks``); the only other
    switch, ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``, drops all three and is process-wide. An
    instance of this subclass counts as the TensorBoard logger, so Tune adds none.

    Why DPTuner leaves TensorBoard off by default: the event files repeat, per trial, the
    unprivatised metrics already in Tune's ``result.json`` and ``progress.csv`` — one more
    private artefact to guard — and opening a ``SummaryWriter`` for each trial costs Tune's
    single-threaded controller ~4-7 ms per trial (measured, ``benchmarks/overhead.py``), more
    than the ledger's admission. ``DPTuner(..., tensorboard=True)`` turns it back on.
    """


def _spend_request(ledger: LedgerLike) -> ray.ObjectRef | float:
    """The ledger's spend without waiting: an ``ObjectRef`` from a ledger actor's handle
    (``spent_ref``), the spend itself from a local ledger."""
    ask = getattr(ledger, "spent_ref", None)
    return ask() if ask is not None else float(ledger.spent())


def _ready(ref: ray.ObjectRef) -> bool:
    done, _ = ray.wait([ref], timeout=0)
    return bool(done)


def _resolve(ref: ray.ObjectRef) -> Any:
    try:
        return ray.get(ref)
    except Exception as exc:  # the audit must never crash the experiment
        return exc
