"""The privacy gate: a trial is admitted by the ledger before it touches any data.

A trial reads ``config["raydp"]`` (a :class:`~raydp_hpo.trial.settings.RaydpSettings`, or a
dict with its keys) and, before training:

* ``charge=True`` — charges its own mechanism under a fresh attempt id
  ``"<charge_id>/attempt-<k>"`` (k = the smallest unused attempt number). A Ray Tune retry from
  scratch runs under the same trial id and config, so reusing ``charge_id`` itself would be
  *replayed* by the ledger without charging; the attempt suffix makes every fresh start pay.
  A resume from a checkpoint continues inside the charge stored in the checkpoint.
* ``covered_by=<plan charge id>`` — a searcher charged a base mechanism for the whole plan
  (e.g. Papernot & Steinke random stopping); the trial checks that the plan charge exists and
  is durable, and that its own mechanism is RDP-dominated by ``base``
  (:func:`raydp_hpo.ledger.coverage.is_covered`). With a ``plan_receipt`` (DPTuner gives one to every
  plan-covered trial) the plan charge is checked against the journal file on this node, with
  no Ray call (:func:`raydp_hpo.ledger.plan_receipt.check_receipt`: the seal vouches that the record
  is ``fsync``'d, the record's bytes and chain hash that it is this charge); a receipt the
  journal contradicts refuses the trial, and where the journal is not readable here the trial
  asks the ledger actor, as it does without a receipt.
* ``nonprivate=True`` — oracle baseline: no noise, no clipping, no ledger (not DP!).

A refused charge raises :class:`~raydp_hpo.errors.BudgetExhaustedError`; a failed coverage
check raises :class:`~raydp_hpo.errors.RayDPHPOError`; nothing is trained in either case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo.accounting.mechanisms import Mechanism, mechanism_from_dict, mechanism_to_dict
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trial.settings import RaydpSettings

if TYPE_CHECKING:
    from raydp_hpo.ledger.actor import LedgerHandle
    from raydp_hpo.ledger.ledger_like import LedgerLike

__all__ = ["RaydpSettings", "admit", "ledger_delta", "resolve_ledger"]


def resolve_ledger(settings: RaydpSettings, ledger: LedgerLike | None) -> LedgerLike | None:
    """The ledger passed in, else the named ledger actor (Ray must be initialised).

    ``None`` for a trial that does not need the ledger, and for one that carries a plan
    receipt: :func:`admit` checks that locally and attaches to the actor only if it must."""
    if ledger is not None or not settings.needs_ledger:
        return ledger
    if settings.plan_receipt is not None and settings.covered_by is not None:
        return None
    return _attach(settings)


def _attach(settings: RaydpSettings) -> LedgerHandle:
    if not settings.ledger:
        raise InvalidParameterError(
            "config['raydp'] asks for a charge/coverage check but names no ledger"
        )
    from raydp_hpo.ledger.actor import get_ledger

    return get_ledger(settings.ledger, namespace=settings.namespace)


def _plan_charge_durable(settings: RaydpSettings, ledger: LedgerLike | None) -> bool:
    """Is the trial's ``covered_by`` charge admitted (and so durable)? Locally from the plan
    receipt when the journal on this node shows it; else one ledger round trip. Raises when
    the journal contradicts the receipt."""
    assert settings.covered_by is not None
    if settings.plan_receipt is not None:
        from raydp_hpo.ledger.plan_receipt import ReceiptCheck, check_receipt

        if check_receipt(settings.plan_receipt, settings.covered_by) is ReceiptCheck.DURABLE:
            return True
    if ledger is None:
        ledger = _attach(settings)
    return bool(ledger.has_charge(settings.covered_by))


def admit(
    settings: RaydpSettings,
    mechanism: Mechanism,
    ledger: LedgerLike | None,
    *,
    owner: str,
    resume_charge_id: str | None = None,
    resume_mechanism: Mechanism | None = None,
) -> str | None:
    """Admit the trial or raise; return the charge id it runs under (None if unaccounted).

    ``ledger``: the ledger or its actor handle; ``None`` attaches to the actor named in the
    settings when (and only when) a round trip is needed.
    ``resume_charge_id``: the charge stored in the checkpoint being resumed (it must be on the
    ledger). ``resume_mechanism``: what the resumed run executes from the checkpoint on (the
    remaining steps and the final score). A self-charging trial pays it again, under
    ``f"{resume_charge_id}/resume/attempt-k"``: the steps after the checkpoint were (perhaps
    partly) run by the interrupted attempt and are run again with fresh noise, and the restart
    itself may follow from that attempt's outputs (a diverging run that crashed), so keeping
    the rerun inside the first charge would let a retry select among noise draws unpaid. Its
    charge is chosen adaptively (it happens only after a failure): DPTuner halts such ledgers
    on the RDP filter, valid under adaptivity (Feldman & Zrnic 2021), whenever retries are on.
    """
    if not settings.needs_ledger:
        return None
    if settings.nonprivate:
        # Non-private training whose outputs leave only through a searcher's own DP mechanism
        # (Ding et al.'s SVT: partition models → noisy AboveThreshold). It must run under that
        # searcher's admitted plan.
        if settings.covered_by is None or not _plan_charge_durable(settings, ledger):
            raise RayDPHPOError(
                f"non-private trial needs the searcher's plan charge {settings.covered_by!r} on "
                "the ledger (its outputs are privatised by that plan). Nothing was trained."
            )
        return settings.covered_by
    if settings.covered_by is not None:
        from raydp_hpo.ledger.coverage import is_covered  # RDP curves: only trials under a plan

        base = mechanism_from_dict(dict(settings.base or {}))
        if not is_covered(mechanism, base):
            raise RayDPHPOError(
                f"trial mechanism {mechanism_to_dict(mechanism)} is not covered by the plan's "
                f"base mechanism {mechanism_to_dict(base)} (charge {settings.covered_by!r}); "
                "reduce steps / sample rate or raise the noise. Nothing was trained."
            )
        if not _plan_charge_durable(settings, ledger):
            raise RayDPHPOError(
                f"plan charge {settings.covered_by!r} is not on the ledger; the searcher must "
                "charge the plan before starting its trials. Nothing was trained."
            )
        return settings.covered_by
    if ledger is None:
        ledger = _attach(settings)
    if resume_charge_id is not None:
        if not ledger.has_charge(resume_charge_id):
            raise RayDPHPOError(
                f"checkpoint charge {resume_charge_id!r} is not on the ledger; refusing to resume"
            )
        if resume_mechanism is not None:
            ledger.try_charge_new_attempt(
                f"{resume_charge_id}/resume", resume_mechanism, owner=owner
            ).raise_if_refused()  # BudgetExhaustedError: the resumed run does not start
        return resume_charge_id
    assert settings.charge_id is not None
    # One atomic call (one actor round trip): the smallest unused attempt id is charged.
    decision = ledger.try_charge_new_attempt(settings.charge_id, mechanism, owner=owner)
    return decision.raise_if_refused().charge_id  # raises BudgetExhaustedError


def ledger_delta(settings: RaydpSettings, ledger: LedgerLike | None) -> float | None:
    """The ledger budget's δ (the figure a trial reports its own ε at), without a round trip
    for a trial with a plan receipt; ``None`` for an unaccounted trial."""
    if ledger is None and settings.plan_receipt is not None:
        return settings.plan_receipt.delta
    if ledger is None:
        return None
    return float(ledger.budget.delta)
