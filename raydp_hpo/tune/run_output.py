"""What a search run shows around Ray Tune: no misleading console header at ``verbose=0``,
a trial the ledger refused as one line without a traceback, and the root cause of a failed
run.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from raydp_hpo.errors import BudgetExhaustedError


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
