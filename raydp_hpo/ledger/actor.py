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
from raydp_hpo.ledger.pg import is_postgres_uri
from raydp_hpo.ledger.plan_receipt import PlanReceipt, receipt_for
from raydp_hpo.ledger.records import (
    Adaptivity,
    Charge,
    ChargeDecision,
    LedgerReport,
    ReleaseClaim,
    ReleaseRecord,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "LedgerHandle",
    "charge_before_start",
    "default_journal_path",
    "driver_on_head_node",
    "get_ledger",
    "may_charge_before_start",
    "start_ledger",
]

DEFAULT_NAMESPACE = "raydp_hpo"


def default_journal_path(name: str, namespace: str = DEFAULT_NAMESPACE) -> Path:
    """``$RAYDP_HPO_HOME/ledgers/<namespace>/<name>.journal`` (default home ``~/.raydp_hpo``)."""
    home = Path(os.environ.get("RAYDP_HPO_HOME", "~/.raydp_hpo")).expanduser()
    return (home / "ledgers" / namespace / f"{name}.journal").resolve()


class _LedgerActor:
    def __init__(self, budget: PrivacyBudget, journal: str, adaptivity: str, accountant: str,
                 expect: PlanReceipt | None = None):
        # Imported here, in the actor's process only: clients (trial workers, drivers) use
        # this module without loading the accountants.
        from raydp_hpo.ledger.filter import PrivacyLedger

        self._ledger = PrivacyLedger(
            budget,
            journal,
            adaptivity=Adaptivity(adaptivity),
            accountant=Accountant(accountant),
        )
        if expect is not None:
            # The driver charged this journal before starting the actor
            # (charge_before_start): refuse to serve a journal without that very record.
            found = receipt_for(journal, expect.charge_id)
            if found != expect:
                self._ledger.close()
                raise LedgerMismatchError(
                    f"the journal {journal} this ledger actor opened does not hold charge "
                    f"{expect.charge_id!r} as record {expect.seq}, which the driver wrote to "
                    f"{expect.journal} before starting it (found {found!r}): the driver and the "
                    "ledger actor do not see the same file. Run the driver on the head node or "
                    "put the storage path on storage both share."
                )

    def settings(self) -> dict[str, Any]:
        return {
            "budget": self._ledger.budget,
            "journal": str(self._ledger.location),
            "adaptivity": self._ledger.adaptivity.value,
            "accountant": self._ledger.halting_accountant.value,
            # EXPERIMENTS: its δ split (replicas that predict its admissions need it)
            "delta_split": (None if self._ledger.delta_split is None
                            else self._ledger.delta_split.value),
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

    def claim_release(self, run: str, where: str, owner: str, token: str) -> ReleaseClaim:
        return self._ledger.claim_release(run, where, owner, token)

    def release_of(self, run: str) -> ReleaseRecord | None:
        self._ledger.refresh()  # a shared (PostgreSQL) ledger: others' releases too
        return self._ledger.release_of(run)

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


class _Unstarted:
    """Stands in for the actor of a handle not started yet: every call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise RayDPHPOError(
            f"ledger actor {self._name!r} is not started yet (start_ledger); nothing was asked"
        )


class LedgerHandle:
    """Synchronous client of a ledger actor, with the same methods as :class:`PrivacyLedger`.

    Picklable: trials receive it (or just the name/namespace) and call it from any node.
    ``actor=None`` makes a handle whose actor :func:`start_ledger` starts later (callbacks can
    hold it meanwhile; a call before that raises).
    """

    def __init__(self, name: str, namespace: str, actor: Any, *, created: bool = False) -> None:
        self.name = name
        self.namespace = namespace
        self._actor = _Unstarted(name) if actor is None else actor
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
        """The Ray actor handle, ``None`` before :func:`start_ledger`."""
        return None if isinstance(self._actor, _Unstarted) else self._actor

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

    def claim_release(self, run: str, where: str = "", owner: str = "", token: str = ""
                      ) -> ReleaseClaim:
        """One round trip: :meth:`PrivacyLedger.claim_release` (the actor serialises it with
        every admission, so of two claims of one run exactly one is granted; a retried call
        with the same ``token`` is a replay)."""
        return ray.get(self._actor.claim_release.remote(run, where, owner, token))

    def release_of(self, run: str) -> ReleaseRecord | None:
        """The release marker of run ``run`` (``<experiment>@<run id>``), or None."""
        return ray.get(self._actor.release_of.remote(run))

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
        """Terminate the actor for good (its journal stays; re-create to resume); nothing for
        a handle whose actor was never started."""
        actor = self.actor
        if actor is not None:
            ray.kill(actor, no_restart=True)


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
    expect_charge: PlanReceipt | None = None,
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

    ``expect_charge`` (the receipt :func:`charge_before_start` returned): a created actor
    refuses to start unless its journal holds exactly that record, so it can never serve a
    ledger that lacks a charge already made; an existing actor is checked by the caller.
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

    handle = LedgerHandle(name, namespace, None)
    start_ledger(handle, budget, journal, adaptivity=adaptivity, accountant=accountant,
                 expect_charge=expect_charge)
    if wait:
        handle.verify()
    return handle


def start_ledger(
    handle: LedgerHandle,
    budget: PrivacyBudget,
    journal: str | Path | None = None,
    *,
    adaptivity: Adaptivity = Adaptivity.ADAPTIVE,
    accountant: Accountant = Accountant.RDP,
    expect_charge: PlanReceipt | None = None,
) -> None:
    """Create or attach to the actor of an unstarted ``handle`` (``LedgerHandle(name,
    namespace, None)``) without waiting: :func:`get_ledger`'s ``budget`` case, for a handle
    that callbacks already hold. :meth:`LedgerHandle.verify` checks the settings later."""
    if handle.actor is not None:
        raise RayDPHPOError(f"ledger handle {handle.name!r} is already started")
    name, namespace = handle.name, handle.namespace
    # a PostgreSQL URI is passed as it is (the actor connects; libpq supplies credentials)
    journal_path: Path | str = (
        str(journal) if is_postgres_uri(journal)
        else Path(journal).expanduser().resolve() if journal
        else default_journal_path(name, namespace)
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
            actor = remote_cls.remote(budget, str(journal_path), adaptivity.value,
                                      accountant.value, expect_charge)
            created = True
        except ActorAlreadyExistsError:  # another driver created it meanwhile
            actor, created = ray.get_actor(name, namespace=namespace), False
    handle._actor, handle.created = actor, created
    handle._expected = (budget, adaptivity, accountant, None if journal is None else journal_path)


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


def charge_before_start(
    budget: PrivacyBudget,
    journal: str | Path,
    *,
    adaptivity: Adaptivity,
    accountant: Accountant,
    charge_id: str,
    mechanism: Mechanism,
    owner: str = "",
) -> PlanReceipt | None:
    """Admit ``mechanism`` on the ledger at ``journal`` *in this process*, before the ledger's
    actor exists, and return the receipt of the durable record.

    For a ledger whose first charge is known before anything runs (a dedicated ledger and its
    experiment's plan): the driver opens the journal itself (taking its exclusive lock, so no
    live actor can hold it meanwhile), admits the charge with the same
    :class:`~raydp_hpo.ledger.filter.PrivacyLedger` rule the actor runs, waits for the record's
    ``fsync``, closes the journal and only then starts the actor
    (``get_ledger(..., expect_charge=receipt)``), which replays the journal and refuses to start
    without that record. Trials covered by the charge check the receipt locally
    (:mod:`raydp_hpo.ledger.plan_receipt`), so the actor's start-up (a new worker process that
    loads the accountants: ~0.5-1 s) runs beside the trials instead of before them.

    Raises :class:`~raydp_hpo.errors.BudgetExhaustedError` when the ledger refuses (nothing is
    charged). Returns ``None`` when the journal gives no receipts (a version-1 journal left at
    that path): the charge is made all the same; start the actor without ``expect_charge`` and
    charge through it under the same id, which replays the admission instead of adding it.
    """
    from raydp_hpo.ledger.filter import PrivacyLedger

    with PrivacyLedger(budget, journal, adaptivity=adaptivity, accountant=accountant) as ledger:
        ledger.charge(charge_id, mechanism, owner)
    return receipt_for(journal, charge_id)


def driver_on_head_node() -> bool:
    """Whether this process runs on the Ray head node, where the ledger actor is placed (so
    a journal path names the same file for both), and is not a Ray Client (whose files are on
    another machine). Ray must be initialised."""
    from ray.util.client import ray as client_ray

    if client_ray.is_connected():
        return False
    here = ray.get_runtime_context().get_node_id()
    return any(
        node.get("Alive") and node.get("NodeID") == here
        and "node:__internal_head__" in (node.get("Resources") or {})
        for node in ray.nodes()
    )


def may_charge_before_start(name: str, namespace: str) -> bool:
    """Whether a driver may charge the journal of the ledger actor ``name`` itself before
    that actor starts (:func:`charge_before_start`): only where it sees the actor's files (on
    the head node, not a Ray Client: :func:`driver_on_head_node`) and no actor of that name is
    alive (one would hold the journal)."""
    if not driver_on_head_node():
        return False
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return True
    return False
