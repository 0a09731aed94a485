"""The privacy ledger as a named, detached, restartable Ray actor.

One actor per ledger name (in an explicit namespace) serialises every admission: a plain
(non-threaded, non-async) Ray actor runs one method at a time, so check-and-charge is atomic
across every trial, node and experiment that attaches to it. The actor has ``num_cpus=0`` so
it never takes a trial's slot, ``max_restarts=-1`` and ``max_task_retries=-1`` so a crash is
survived: a restarted actor re-runs ``__init__``, which replays the journal, and a retried
call is idempotent through its charge id.

The journal is what makes the budget durable (a detached actor does not survive a head-node
restart without GCS fault tolerance). On a multi-node cluster put it on shared storage
(NFS); the default path is only right for single-node use.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorAlreadyExistsError

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.errors import LedgerMismatchError, RayDPHPOError
from raydp_hpo.ledger.plan_receipt import PlanReceipt, receipt_for
from raydp_hpo.ledger.records import Adaptivity, Charge, ChargeDecision, LedgerReport

__all__ = ["DEFAULT_NAMESPACE", "LedgerHandle", "get_ledger", "default_journal_path"]

DEFAULT_NAMESPACE = "raydp_hpo"


def default_journal_path(name: str, namespace: str = DEFAULT_NAMESPACE) -> Path:
    """``$RAYDP_HPO_HOME/ledgers/<namespace>/<name>.journal`` (default home ``~/.raydp_hpo``)."""
    home = Path(os.environ.get("RAYDP_HPO_HOME", "~/.raydp_hpo")).expanduser()
    return (home / "ledgers" / namespace / f"{name}.journal").resolve()


class _LedgerActor:
    def __init__(self, budget: PrivacyBudget, journal: str, adaptivity: str, accountant: str):
        # Imported here, in the actor's process only: clients (trial workers, drivers) use
        # this module without loading the accountants.
        from raydp_hpo.ledger.filter import PrivacyLedger

        self._ledger = PrivacyLedger(
            budget,
            journal,
            adaptivity=Adaptivity(adaptivity),
            accountant=Accountant(accountant),
        )

    def settings(self) -> dict[str, Any]:
        return {
            "budget": self._ledger.budget,
            "journal": str(self._ledger.journal_path),
            "adaptivity": self._ledger.adaptivity.value,
            "accountant": self._ledger.halting_accountant.value,
        }

    def try_charge(self, charge_id: str, mechanism: Mechanism, owner: str) -> ChargeDecision:
        return self._ledger.try_charge(charge_id, mechanism, owner)

    def try_charge_new_attempt(
        self, charge_id: str, mechanism: Mechanism, owner: str
    ) -> ChargeDecision:
        return self._ledger.try_charge_new_attempt(charge_id, mechanism, owner)

    def epsilon_if_charged(self, mechanism: Mechanism) -> float:
        return self._ledger.epsilon_if_charged(mechanism)

    def would_admit(self, mechanism: Mechanism) -> bool:
        return self._ledger.would_admit(mechanism)

    def has_charge(self, charge_id: str) -> bool:
        return self._ledger.has_charge(charge_id)

    def receipt(self, charge_id: str) -> PlanReceipt | None:
        path = self._ledger.journal_path
        if path is None or not self._ledger.has_charge(charge_id):
            return None
        return receipt_for(path, charge_id)

    def spent(self) -> float:
        return self._ledger.spent()

    def remaining(self) -> float:
        return self._ledger.remaining()

    def charges(self) -> tuple[Charge, ...]:
        return self._ledger.charges()

    def report(self) -> LedgerReport:
        return self._ledger.report()

    def pid(self) -> int:
        return os.getpid()


class LedgerHandle:
    """Synchronous client of a ledger actor, with the same methods as :class:`PrivacyLedger`.

    Picklable: trials receive it (or just the name/namespace) and call it from any node.
    """

    def __init__(self, name: str, namespace: str, actor: Any, *, created: bool = False) -> None:
        self.name = name
        self.namespace = namespace
        self._actor = actor
        #: True when :func:`get_ledger` created the actor (rather than attaching to one): it
        #: then has exactly the settings asked for. Its start-up can still fail (e.g. a journal
        #: written with other settings); every call then fails and :meth:`verify` says why.
        self.created = created

    _expected: tuple[Any, ...] | None = None  # settings still to verify (get_ledger wait=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reattach, (self.name, self.namespace))

    def verify(self) -> LedgerHandle:
        """Block until the actor is up and check it has the settings asked for."""
        _verify(self)
        return self

    @property
    def actor(self) -> Any:
        return self._actor

    def settings(self) -> dict[str, Any]:
        return ray.get(self._actor.settings.remote())

    @property
    def budget(self) -> PrivacyBudget:
        return self.settings()["budget"]

    def try_charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        return ray.get(self._actor.try_charge.remote(charge_id, mechanism, owner))

    def charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        return self.try_charge(charge_id, mechanism, owner).raise_if_refused()

    def try_charge_new_attempt(
        self, charge_id: str, mechanism: Mechanism, owner: str = ""
    ) -> ChargeDecision:
        """One round trip: see :meth:`PrivacyLedger.try_charge_new_attempt`."""
        return ray.get(self._actor.try_charge_new_attempt.remote(charge_id, mechanism, owner))

    def epsilon_if_charged(self, mechanism: Mechanism) -> float:
        return ray.get(self._actor.epsilon_if_charged.remote(mechanism))

    def would_admit(self, mechanism: Mechanism) -> bool:
        return ray.get(self._actor.would_admit.remote(mechanism))

    def has_charge(self, charge_id: str) -> bool:
        return ray.get(self._actor.has_charge.remote(charge_id))

    def receipt(self, charge_id: str) -> PlanReceipt | None:
        """Where admitted charge ``charge_id`` lies in the journal, for trials to check it
        locally (:mod:`raydp_hpo.ledger.plan_receipt`); ``None`` if it is not admitted, or the
        ledger has no version-2 journal."""
        return ray.get(self._actor.receipt.remote(charge_id))

    def spent(self) -> float:
        return ray.get(self._actor.spent.remote())

    def spent_ref(self) -> ray.ObjectRef:
        """Ask for :meth:`spent` without waiting: an ObjectRef to ``ray.get`` later."""
        return self._actor.spent.remote()

    def would_admit_ref(self, mechanism: Mechanism) -> ray.ObjectRef:
        """Ask for :meth:`would_admit` without waiting: an ObjectRef to ``ray.get`` later."""
        return self._actor.would_admit.remote(mechanism)

    def remaining_ref(self) -> ray.ObjectRef:
        """Ask for :meth:`remaining` without waiting: an ObjectRef to ``ray.get`` later."""
        return self._actor.remaining.remote()

    def remaining(self) -> float:
        return ray.get(self._actor.remaining.remote())

    def charges(self) -> tuple[Charge, ...]:
        return ray.get(self._actor.charges.remote())

    def report(self) -> LedgerReport:
        return ray.get(self._actor.report.remote())

    def kill(self) -> None:
        """Terminate the actor for good (its journal stays; re-create to resume)."""
        ray.kill(self._actor, no_restart=True)


@functools.cache
def _remote_ledger_class() -> Any:
    """The Ray actor class, made once per process: Ray exports (pickles and uploads) a remote
    class the first time it is used, so a class made anew per call is exported anew."""
    return ray.remote(_LedgerActor)


def _reattach(name: str, namespace: str) -> LedgerHandle:
    return get_ledger(name, namespace=namespace)


def get_ledger(
    name: str,
    budget: PrivacyBudget | None = None,
    journal: str | Path | None = None,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    adaptivity: Adaptivity = Adaptivity.ADAPTIVE,
    accountant: Accountant = Accountant.RDP,
    wait: bool = True,
) -> LedgerHandle:
    """Create or attach to the ledger actor ``name`` in ``namespace``.

    * With ``budget``: creates the actor if it does not exist (replaying ``journal`` if that
      file exists), else attaches; either way the live ledger's budget and settings must equal
      the ones given, or :class:`~raydp_hpo.errors.LedgerMismatchError` is raised.
    * Without ``budget``: attaches to an existing actor, or raises if there is none.

    ``journal`` defaults to :func:`default_journal_path`. Ray must be initialised.

    ``wait=False`` returns at once while the actor starts (a new worker process: ~1 s). If
    this call created the actor (``handle.created``), its settings are the ones given by
    construction; if it attached to an existing one, the caller must call
    :meth:`LedgerHandle.verify` before relying on the ledger.
    """
    if not name or not isinstance(name, str):
        raise RayDPHPOError(f"ledger name must be a non-empty string, got {name!r}")
    if not ray.is_initialized():
        raise RayDPHPOError("Ray is not initialised; call ray.init() before get_ledger()")
    if budget is None:
        try:
            existing = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise RayDPHPOError(
                f"no ledger named {name!r} in namespace {namespace!r}; create it with a budget: "
                f"get_ledger({name!r}, budget=PrivacyBudget(epsilon, delta))"
            ) from None
        return LedgerHandle(name, namespace, existing)

    journal_path = Path(journal).expanduser().resolve() if journal else default_journal_path(
        name, namespace
    )
    remote_cls = _remote_ledger_class().options(
        name=name,
        namespace=namespace,
        lifetime="detached",
        num_cpus=0,
        max_restarts=-1,
        max_task_retries=-1,
        # On the head node: worker nodes come and go; the journal keeps the budget anyway.
        resources={"node:__internal_head__": 0.001},
    )
    # Get-or-create (what Ray's ``get_if_exists`` does), keeping track of which happened.
    actor: Any
    created: bool
    try:
        actor, created = ray.get_actor(name, namespace=namespace), False
    except ValueError:
        try:
            actor = remote_cls.remote(budget, str(journal_path), adaptivity.value, accountant.value)
            created = True
        except ActorAlreadyExistsError:  # another driver created it meanwhile
            actor, created = ray.get_actor(name, namespace=namespace), False
    handle = LedgerHandle(name, namespace, actor, created=created)
    handle._expected = (budget, adaptivity, accountant, None if journal is None else journal_path)
    if wait:
        handle.verify()
    return handle


def _verify(handle: LedgerHandle) -> None:
    expected = handle._expected
    if expected is None:
        return
    budget, adaptivity, accountant, journal_path = expected
    name = handle.name
    try:
        settings = handle.settings()
    except ray.exceptions.RayActorError as exc:
        cause = getattr(exc, "cause", None) or exc
        # Ray's message holds the actor's whole traceback; its last line is the error itself.
        lines = str(cause).strip().splitlines()
        reason = lines[-1] if lines else repr(cause)
        raise RayDPHPOError(f"ledger actor {name!r} failed to start: {reason}") from None
    wanted = {
        "budget": budget,
        "adaptivity": adaptivity.value,
        "accountant": accountant.value,
    }
    live = {k: settings[k] for k in wanted}
    if live != wanted or (journal_path is not None and settings["journal"] != str(journal_path)):
        raise LedgerMismatchError(
            f"ledger {name!r} already exists with {live} (journal {settings['journal']}); "
            f"asked for {wanted} (journal {journal_path}). Attach without a budget, or use "
            "another ledger name."
        )
    handle._expected = None
