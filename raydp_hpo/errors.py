"""Exception hierarchy of raydp-hpo.

Every error the package raises on purpose derives from :class:`RayDPHPOError`, so callers can
catch the whole family with one ``except``. Validation errors also derive from ``ValueError``
so generic code that expects ``ValueError`` for bad arguments keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RayDPHPOError",
    "InvalidParameterError",
    "UnsupportedMechanismError",
    "BudgetExhaustedError",
    "BudgetTooSmallError",
    "ChargeConflictError",
    "LedgerCorruptedError",
    "JournalReplacedError",
    "LedgerClosedError",
    "LedgerMismatchError",
    "LedgerUnavailableError",
    "LedgerOutcomeUnknownError",
    "SchemaVersionError",
    "DataValidationError",
    "SearchSpaceError",
    "ConfigError",
    "TrialContractError",
    "SearchFailedError",
    "ReleaseAlreadyPublishedError",
    "EphemeralStorageWarning",
]


class RayDPHPOError(Exception):
    """Root of every error raised deliberately by raydp-hpo."""


class InvalidParameterError(RayDPHPOError, ValueError):
    """A parameter (budget, mechanism, distribution, ...) has an invalid value.

    The message always names the parameter and the offending value.
    """


class UnsupportedMechanismError(RayDPHPOError, TypeError):
    """An accountant cannot bound the privacy loss of the given mechanism."""


class BudgetExhaustedError(RayDPHPOError):
    """The ledger refused a charge because it would exceed the privacy budget.

    Attributes:
        charge_id: the id of the refused charge.
        requested_epsilon: ε the ledger would have spent *after* admitting the charge.
        spent_epsilon: ε spent before the charge (unchanged by the refusal).
        budget_epsilon: the ledger's total ε budget.
        delta: the δ at which the ε figures are stated.
    """

    def __init__(
        self,
        charge_id: str,
        requested_epsilon: float,
        spent_epsilon: float,
        budget_epsilon: float,
        delta: float,
    ) -> None:
        self.charge_id = charge_id
        self.requested_epsilon = requested_epsilon
        self.spent_epsilon = spent_epsilon
        self.budget_epsilon = budget_epsilon
        self.delta = delta
        remaining = max(budget_epsilon - spent_epsilon, 0.0)
        super().__init__(
            f"privacy budget exhausted: charge {charge_id!r} would bring total spend to "
            f"ε={requested_epsilon:.4g} at δ={delta:g}, above the budget ε={budget_epsilon:.4g} "
            f"(spent so far ε={spent_epsilon:.4g}, remaining ε={remaining:.4g}). Nothing was "
            "charged. Use fewer/cheaper trials (more noise, fewer steps, lower sample rate) or a "
            "ledger with a larger budget."
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes across Ray's pickling
        return (
            type(self),
            (
                self.charge_id,
                self.requested_epsilon,
                self.spent_epsilon,
                self.budget_epsilon,
                self.delta,
            ),
        )


class BudgetTooSmallError(InvalidParameterError):
    """A search's whole plan cannot fit its budget, whatever noise is calibrated: refused
    before anything is charged or run. The CLI reports it, like a ledger refusal, with the
    "budget exhausted" exit code 3; it is also an :class:`InvalidParameterError`."""


class ChargeConflictError(RayDPHPOError):
    """A charge id was reused with a different mechanism (ids must identify one charge)."""


class LedgerCorruptedError(RayDPHPOError):
    """The ledger journal is damaged in a way that cannot be recovered safely.

    Raised instead of silently resetting a budget: a reset budget is a privacy breach.
    """


class JournalReplacedError(LedgerCorruptedError):
    """A live ledger's journal path no longer names the file it holds (deleted, replaced) or
    the file was changed behind its back; the ledger refuses to charge (nothing is written)."""


class LedgerClosedError(RayDPHPOError):
    """A charge was asked of a ledger after :meth:`~raydp_hpo.ledger.PrivacyLedger.close`."""


class LedgerMismatchError(RayDPHPOError):
    """A ledger was attached with a budget or settings that differ from its journal."""


class LedgerUnavailableError(RayDPHPOError):
    """The ledger's storage (a PostgreSQL server) could not be reached, timed out or failed
    to commit: the charge is refused (fail closed; there is never a local fallback)."""


class LedgerOutcomeUnknownError(LedgerUnavailableError):
    """The commit of a charge was sent but its answer never came (the server froze, crashed or
    the network failed mid-commit): the charge MAY be stored. It is not acknowledged, so its
    mechanism must not run; it is not reported as refused either. The next admission reads
    the ledger and counts it if it was stored (asking again under the same charge id replays
    it: admitted, or refused if it never landed and the budget is gone)."""


class SchemaVersionError(RayDPHPOError):
    """A PostgreSQL ledger database's schema is not the one this raydp-hpo uses (newer, older
    or none) and the connecting role cannot bring it up to date: ``raydp-hpo ledger init``."""


class DataValidationError(RayDPHPOError, ValueError):
    """Training data is unusable (missing column, NaN, wrong dtype, unknown label, ...)."""


class SearchSpaceError(RayDPHPOError, ValueError):
    """A search space cannot be used by the chosen search algorithm."""


class ConfigError(RayDPHPOError, ValueError):
    """An experiment configuration (file or dict) is invalid.

    ``problems`` lists every error found, each as (path, message) with ``path`` the key it is
    about (``search.settings``, ``data.uri``, ``space.lr``; ``""`` for the whole file): the
    experiment checks collect them all and raise one error (see
    :mod:`raydp_hpo.cli.experiment`). A single error has one problem.
    """

    def __init__(self, message: str, problems: tuple[tuple[str, str], ...] | None = None
                 ) -> None:
        super().__init__(message)
        self.problems: tuple[tuple[str, str], ...] = (
            problems if problems is not None else (("", message),)
        )


class TrialContractError(RayDPHPOError):
    """A trainable broke the trial contract of :func:`raydp_hpo.trial_session`: it reported
    without admission, ran other than what was charged (σ, clipping norm, sample rate, more
    steps), left out its noisy score or its release checkpoint, or reported under another
    metric name. The message names the key or file and the fix. The trial fails: nothing
    from it is selected or released; what it was charged stays charged."""


class SearchFailedError(RayDPHPOError):
    """A search ended with nothing selected — every trial failed (an exception in the
    trainable), no trial reported the metric, the final run failed, ``K = 0`` was drawn, or
    the ledger refused the trials before any could be selected (``result.budget_exhausted``)
    — raised by :meth:`raydp_hpo.tune.tuner.DPTuner.fit` *after* the certificate of what was
    spent is written (``public/`` says that nothing was selected, and why). ``result`` is the
    :class:`~raydp_hpo.tune.result.DPResult` (its certificate: the spend stays spent);
    ``reason`` the public reason written to ``release.json``."""

    def __init__(self, message: str, *, reason: str = "", result: object = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.result: Any = result


class ReleaseAlreadyPublishedError(RayDPHPOError):
    """A run's release was already claimed on its ledger: at most one release (selected
    hyperparameters, model, certificate) is published per run id, so a run directory copied
    and resumed twice, or a run resumed after it released, publishes nothing more. Raised
    before anything of the second release is written; the ledger's spend is unchanged.
    ``run`` is ``<experiment>@<run id>``; ``first`` the ledger's record of the first release
    (:class:`~raydp_hpo.ledger.records.ReleaseRecord`)."""

    def __init__(self, message: str, *, run: str = "", first: object = None) -> None:
        super().__init__(message)
        self.run = run
        self.first: Any = first


class EphemeralStorageWarning(UserWarning):
    """A results folder or ledger journal is in a place that is likely to be deleted (a
    temporary directory, a Ray job's working dir or session dir): a deleted journal resets the
    privacy budget. A warning, not an error: tests and throw-away runs use temporary folders
    on purpose (filter it with ``warnings.filterwarnings("ignore", category=...)``)."""
