"""The privacy ledger: a privacy filter that admits each charge before its mechanism runs.

The budget (ε, δ) is fixed up front. :meth:`PrivacyLedger.try_charge` admits a mechanism only
if the guarantee of everything admitted so far *plus* the new mechanism stays within the
budget; otherwise it refuses and nothing changes (check, then commit). Charges are never
refunded, reordered or lost: a crashed trial still spent its privacy.

Halting rules (:class:`Adaptivity`): ``ADAPTIVE`` (default, an RDP privacy filter valid under
fully adaptive composition), ``EXPERIMENTS`` (a ledger that composes whole experiments) and
``FIXED_PLAN`` (any accountant, for a sequence of mechanisms fixed before any data is touched).
Each rule's ε figure, its theorem and its proof are in :mod:`raydp_hpo.ledger.halting`.

Restart: each journal record stores the charge's RDP curve on :data:`DEFAULT_ORDERS`, so opening
a journal sums stored curves instead of recomputing every mechanism's; they are checked lazily
against the current code (:mod:`raydp_hpo.ledger.curve_checks`). A ledger with a PLD keeps a
snapshot of it beside the journal (:mod:`raydp_hpo.ledger.pld_snapshot`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism, mechanism_from_dict, mechanism_to_dict
from raydp_hpo.accounting.pure import pure_epsilon
from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, RdpProfile, rdp_profile
from raydp_hpo.errors import (
    ChargeConflictError,
    InvalidParameterError,
    LedgerClosedError,
    LedgerCorruptedError,
    LedgerMismatchError,
    RayDPHPOError,
    UnsupportedMechanismError,
)
from raydp_hpo.ledger.curve_checks import (
    ORDERS_FINGERPRINT,
    CurveCheck,
    _Curve,
    _decode_curve,
    _encode_profile,
    start_curve_check,
    verify_pending_sync,
)
from raydp_hpo.ledger.experiments import LATEST_SPLIT, DeltaSplit, split_of_header
from raydp_hpo.ledger.halting import (
    HALTING_ORDERS,
    filter_epsilon,
    tightest_halting_accountant,
)
from raydp_hpo.ledger.journal import Journal, JournalScan, read_header, scan_journal
from raydp_hpo.ledger.ledger_settings import (
    check_ledger_settings,
    check_supported,
    settings_of_header,
)
from raydp_hpo.ledger.pg import PgJournal, is_postgres_uri, scan_ledger
from raydp_hpo.ledger.pld_snapshot import (
    PLD_SNAPSHOT_EVERY,
    pld_snapshot_path,
    read_pld_snapshot,
    write_pld_snapshot,
)
from raydp_hpo.ledger.records import (
    Adaptivity,
    Charge,
    ChargeDecision,
    LedgerReport,
    ReleaseBook,
    ReleaseClaim,
    ReleaseRecord,
    release_from_record,
)

if TYPE_CHECKING:
    from raydp_hpo.accounting.pld import PldComposer

__all__ = [
    "Adaptivity",
    "HALTING_ORDERS",
    "MAX_ATTEMPTS",
    "Charge",
    "ChargeDecision",
    "CurveCheck",
    "ORDERS_FINGERPRINT",
    "LedgerReport",
    "PrivacyLedger",
    "filter_epsilon",
    "admits_as_first_charge",
    "tightest_halting_accountant",
    "PLD_SNAPSHOT_EVERY",
    "pld_snapshot_path",
]

#: Most fresh starts :meth:`PrivacyLedger.try_charge_new_attempt` allows under one charge id.
MAX_ATTEMPTS = 10_000


def admits_as_first_charge(budget: PrivacyBudget, mechanism: Mechanism, *,
                           adaptivity: Adaptivity, accountant: Accountant = Accountant.RDP
                           ) -> bool:
    """Whether a fresh ledger with these settings would admit ``mechanism`` (no actor call)."""
    return PrivacyLedger(budget, adaptivity=adaptivity, accountant=accountant).would_admit(
        mechanism
    )


class PrivacyLedger:
    """A privacy filter over one dataset's budget, optionally backed by a durable journal.

    Lifecycle: construct (replays the journal if it exists, else creates it atomically with
    its header) → :meth:`try_charge` / :meth:`charge` any number of times → :meth:`close`
    (charging afterwards raises :class:`~raydp_hpo.errors.LedgerClosedError`).
    ``curve_check`` says when the RDP curves stored in a reopened journal are recomputed and
    compared (:class:`CurveCheck`).

    Concurrency: methods are serialised by an internal lock, so check-and-charge is atomic
    within a process; across processes use one ledger actor (:mod:`raydp_hpo.ledger.actor`).
    The journal holds an exclusive record lock (NFS-safe, see :mod:`raydp_hpo.ledger.journal`), so a
    second live ledger cannot open the same file, and every append first checks that the
    journal's path still names that file.

    With a PostgreSQL URI (``postgresql://host/db?ledger=NAME``, :mod:`raydp_hpo.ledger.pg`)
    instead of a path, any number of processes may open and charge the same ledger: each
    admission is one transaction that first absorbs the charges others made. Reads
    (:meth:`spent`, :meth:`charges`, :meth:`report`) answer from the charges seen at the last
    admission; :meth:`refresh` catches up.
    """

    def __init__(
        self,
        budget: PrivacyBudget,
        journal: str | Path | None = None,
        *,
        adaptivity: Adaptivity = Adaptivity.ADAPTIVE,
        accountant: Accountant = Accountant.RDP,
        curve_check: CurveCheck = CurveCheck.BACKGROUND,
        delta_split: DeltaSplit | None = None,
    ) -> None:
        check_ledger_settings(budget, adaptivity, accountant, curve_check, delta_split)
        self._budget = budget
        self._adaptivity = adaptivity
        self._accountant = accountant
        # EXPERIMENTS: how δ is split between its two rules; None (not given) means the
        # journal's own on reopening, the latest for a new ledger
        self._split_given = delta_split is not None
        self._split: DeltaSplit | None = (
            (delta_split or LATEST_SPLIT) if adaptivity is Adaptivity.EXPERIMENTS else None)
        self._lock = threading.RLock()
        self._charges: list[Charge] = []
        self._by_id: dict[str, Charge] = {}
        # release markers by run (claim_release), and the number of records of every kind
        # (a charge's seq is its record number: releases interleave with charges)
        self._releases = ReleaseBook()
        self._records = 0
        self._rdp = RdpProfile.zero()
        self._pld_composer: PldComposer | None = None  # built on first PLD use (see _pld)
        # the last admission check's composition with its candidate, reused by _commit:
        # (composer it extended, number of charges then, candidate, composition, its ε)
        self._pld_trial: tuple[PldComposer, int, Mechanism, PldComposer, float] | None = None
        # ε of the composition of every charge: (composer, number of charges, ε)
        self._pld_spent: tuple[PldComposer, int, float] | None = None
        self._replayed_chains: tuple[str, ...] = ()  # chain hashes of the replayed journal
        self._pld_snapshot_seq = 0  # charges covered by the last PLD snapshot written/read
        self._pure: float | None = 0.0
        # EXPERIMENTS: the (εₖ, δₖ) point of every charge, and the last one computed for a
        # candidate (mechanism, slot, point), reused when it is committed
        self._points: list[tuple[float, float]] = []
        self._point_trial: tuple[Mechanism, int, tuple[float, float]] | None = None
        self._journal: Journal | PgJournal | None = None
        self._source: Path | str | None = None  # the journal (or ledger URI) replayed
        self._admitting = 0  # depth of the open admission (PostgreSQL: one transaction)
        self._closed = False
        self._curve_check = curve_check
        # stored curves not yet recomputed: charge index -> stored profile
        self._unverified: dict[int, _Curve] = {}
        self._verify_lock = threading.Lock()
        self._verify_stop = threading.Event()
        self._verifier: threading.Thread | None = None
        self._curve_issues: list[str] = []
        if journal is not None:
            header = {**self._settings(), "created": time.time(), "rdp_orders": ORDERS_FINGERPRINT}
            if is_postgres_uri(journal):
                self._journal = PgJournal.open(str(journal), create_header=header)
            else:
                self._journal = Journal.open(journal, create_header=header)
            self._source = self._journal.path
            try:
                self._load()
            except BaseException:
                self._journal.close()
                raise
            start_curve_check(self)

    # -- persistence -------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        settings = {
            "budget": self._budget.to_dict(),
            "adaptivity": self._adaptivity.value,
            "accountant": self._accountant.value,
        }
        if self._split is not None:  # EXPERIMENTS only: other ledgers' headers are unchanged
            settings["delta_split"] = self._split.value
        return settings

    def _load(self) -> None:
        assert self._journal is not None
        header = self._journal.header
        if (self._split is not None and not self._split_given
                and header.get("adaptivity") == Adaptivity.EXPERIMENTS.value):
            # opened without a split: an existing journal's own (a ledger keeps its split for
            # life; absent: HALVES, the split before it was stored), a new one's is the latest
            self._split = split_of_header(header)
        keys = ["budget", "adaptivity", "accountant"]
        if self._split is not None or "delta_split" in header:
            keys.append("delta_split")
        stored = {k: header.get(k) for k in keys}
        if self._split is not None and header.get("adaptivity") == Adaptivity.EXPERIMENTS.value:
            stored["delta_split"] = split_of_header(header).value
        # a value stored by an earlier version ("profile") names today's member; an unknown
        # one stays as it is and is reported as a mismatch below
        with contextlib.suppress(ValueError):
            stored["accountant"] = Accountant(stored["accountant"]).value
        if stored != self._settings():
            raise LedgerMismatchError(
                f"journal {self._journal.path} was created with {stored}, but this ledger was "
                f"opened with {self._settings()}. A budget cannot be changed after charges; "
                "open it with the journal's settings (or use `raydp-hpo ledger show`)."
            )
        self._replay(self._journal.scan)

    def _replay(self, scan: JournalScan) -> None:
        """Rebuild the state from a checked journal, in order (no admission checks: these
        charges were admitted when they were written).

        Uses each record's stored RDP curve when it is on this ledger's order grid; otherwise
        (version-1 journal, a curve on another grid) recomputes it. Every failure names the
        journal, line, record and byte offset.
        """
        total = np.zeros_like(DEFAULT_ORDERS)
        side_eps = side_delta = 0.0
        pure: float | None = 0.0
        for i, rec in enumerate(scan.records):
            if rec.get("kind") == "release":
                self._releases.add(release_from_record(rec, f"journal {scan.path}: "
                                                       f"{scan.where(i)}"), scan.path)
                continue
            try:
                mech = mechanism_from_dict(rec["mechanism"])
                charge = Charge(
                    seq=int(rec["seq"]),
                    charge_id=str(rec["charge_id"]),
                    owner=str(rec.get("owner", "")),
                    time=float(rec["time"]),
                    mechanism=mech,
                    epsilon_after=float(rec["epsilon_after"]),
                )
                stored = rec.get("rdp")
                if isinstance(stored, dict) and stored.get("orders") == ORDERS_FINGERPRINT:
                    curve = _decode_curve(stored)
                    self._unverified[len(self._charges)] = curve
                else:
                    profile = rdp_profile(mech)
                    curve = (profile.values, profile.side_epsilon, profile.side_delta)
            except (KeyError, TypeError, ValueError, RayDPHPOError) as exc:
                raise LedgerCorruptedError(
                    f"journal {scan.path}: {scan.where(i)} passes its checksum but is not a "
                    f"valid charge record ({type(exc).__name__}: {exc}). It was written by "
                    "something other than a raydp-hpo ledger; restore the journal from a backup."
                ) from None
            if charge.charge_id in self._by_id:
                raise LedgerCorruptedError(
                    f"journal {scan.path}: {scan.where(i)} repeats charge id "
                    f"{charge.charge_id!r} (record {self._by_id[charge.charge_id].seq}); a "
                    "ledger never writes an id twice: restore the journal from a backup."
                )
            self._charges.append(charge)
            self._by_id[charge.charge_id] = charge
            total += curve[0]  # in charge order, as the live ledger summed: same floats
            side_eps += curve[1]
            side_delta += curve[2]
            if pure is not None:
                p = pure_epsilon(mech)
                pure = None if p is None else pure + p
        self._rdp = RdpProfile(total, side_eps, side_delta)
        self._pure = pure
        self._records = len(scan.records)
        if self._split is not None:  # EXPERIMENTS: few charges, whole experiments
            self._points = [self._point(c.mechanism, i + 1)
                            for i, c in enumerate(self._charges)]
        self._pld_composer = None
        self._pld_trial = None
        self._pld_spent = None
        self._replayed_chains = scan.chains if scan.version == 2 else ()

    # -- checking stored curves ------------------------------------------------------------
    def verify_stored_curves(self) -> tuple[str, ...]:
        """Recompute every stored RDP curve not checked yet (in this thread; blocks).

        Returns one line per record whose stored curve was below the recomputed one (its
        excess is then part of the spend); empty when every stored curve checks out.
        """
        verify_pending_sync(self)
        with self._lock:
            return tuple(self._curve_issues)

    @property
    def curves_verified(self) -> bool:
        """Whether every stored curve has been recomputed and checked."""
        with self._verify_lock:
            return not self._unverified

    @classmethod
    def open(cls, journal: str | Path, *, curve_check: CurveCheck = CurveCheck.BACKGROUND
             ) -> PrivacyLedger:
        """Open an existing journal for writing, with the settings stored in its header."""
        header = (scan_ledger(str(journal)).header if is_postgres_uri(journal)
                  else read_header(journal))
        budget, adaptivity, accountant, split = settings_of_header(journal, header)
        return cls(
            budget, journal, adaptivity=adaptivity, accountant=accountant, curve_check=curve_check,
            delta_split=split,
        )

    @classmethod
    def read_only(cls, journal: str | Path, *, curve_check: CurveCheck = CurveCheck.BACKGROUND
                  ) -> PrivacyLedger:
        """An in-memory copy of a journal's ledger: no lock, no writes, so it can inspect a
        journal that a live ledger holds open. Charges made on it are not persisted."""
        scan = scan_ledger(str(journal)) if is_postgres_uri(journal) else scan_journal(journal)
        if scan.torn is not None:
            warnings.warn(
                f"journal {scan.path}: skipping an incomplete final line ({scan.torn.length} "
                f"bytes at byte offset {scan.torn.offset}), an interrupted write that was never "
                "acknowledged (read-only: the file is left as it is)",
                RuntimeWarning,
                stacklevel=2,
            )
        return cls.from_scan(scan, curve_check=curve_check)

    @classmethod
    def from_scan(
        cls, scan: JournalScan, *, curve_check: CurveCheck = CurveCheck.BACKGROUND
    ) -> PrivacyLedger:
        """An in-memory ledger replayed from a checked journal (see :func:`scan_journal`)."""
        budget, adaptivity, accountant, split = settings_of_header(scan.path, scan.header)
        ledger = cls(
            budget, None, adaptivity=adaptivity, accountant=accountant, curve_check=curve_check,
            delta_split=split,
        )
        ledger._source = scan.path
        ledger._replay(scan)
        start_curve_check(ledger)
        return ledger

    def close(self) -> None:
        """Stop the background curve check, store the PLD snapshot (if a PLD was built) and
        release the journal. Charging afterwards raises
        :class:`~raydp_hpo.errors.LedgerClosedError`; reading still works."""
        with self._lock:
            if (not self._closed and self._pld_composer is not None
                    and self._pld_snapshot_seq != len(self._charges)):
                write_pld_snapshot(self)
        self._closed = True
        self._verify_stop.set()
        if self._verifier is not None and self._verifier is not threading.current_thread():
            self._verifier.join()
        if self._journal is not None:
            self._journal.close()

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- accounting ----------------------------------------------------------------------
    def _point(self, mechanism: Mechanism, k: int) -> tuple[float, float]:
        """EXPERIMENTS: the (ε, δ) point of ``mechanism`` as the k-th charge; ε = inf when
        its δ exceeds the k-th share (:mod:`raydp_hpo.ledger.experiments`)."""
        from raydp_hpo.ledger.experiments import experiment_delta, experiment_point

        assert self._split is not None
        share = experiment_delta(self._budget.delta, k, self._split)
        eps, delta = experiment_point(mechanism, share, self._accountant)
        if delta > share * (1.0 + 1e-12):
            return math.inf, delta
        return eps, delta

    def _halting_epsilon(self, rdp: RdpProfile, extra: Mechanism | None) -> float:
        delta = self._budget.delta
        if self._split is not None:  # EXPERIMENTS
            from raydp_hpo.ledger.experiments import filter_delta

            basic = math.fsum(eps for eps, _ in self._points)  # rule (B)
            if extra is not None:
                k = len(self._charges) + 1
                point = self._point(extra, k)
                self._point_trial = (extra, k, point)
                basic += point[0]
            return min(basic, filter_epsilon(rdp, filter_delta(delta, self._split)))  # or (A)
        if self._adaptivity is Adaptivity.ADAPTIVE:
            eps = filter_epsilon(rdp, delta)
        else:
            candidates = []
            if self._accountant in (Accountant.RDP, Accountant.BEST, Accountant.PROFILE):
                candidates.append(rdp.epsilon(delta))
            if self._accountant in (Accountant.PLD, Accountant.BEST, Accountant.PROFILE):
                try:
                    candidates.append(self._pld_epsilon(extra))
                except UnsupportedMechanismError:
                    # No PLD figure for this composition (a near-noiseless mechanism needs a
                    # grid the others cannot share): the other accountants decide, and a
                    # PLD-only ledger refuses (ε = inf) instead of raising.
                    candidates.append(math.inf)
            if self._accountant is Accountant.PROFILE:
                candidates.append(self._profile_epsilon(extra))
            eps = min(candidates)
        pure = self._pure
        if pure is not None and extra is not None:
            extra_pure = pure_epsilon(extra)
            pure = None if extra_pure is None else pure + extra_pure
        # Basic composition of pure-DP charges is a valid filter too (Rogers et al. 2016).
        return eps if pure is None else min(eps, pure)

    def _profile_epsilon(self, extra: Mechanism | None) -> float:
        """ε of every charge (and ``extra``) with random stopping accounted by privacy profiles
        (:func:`raydp_hpo.accounting.profiles.profile_epsilon`); ``inf`` when no charge has a part without
        a PLD (the profile figure is then the PLD composition, already a candidate)."""
        from raydp_hpo.accounting.pld import count_non_pld
        from raydp_hpo.accounting.profiles import profile_epsilon

        mechs = [c.mechanism for c in self._charges] + ([] if extra is None else [extra])
        if not any(count_non_pld(m) for m in mechs):
            return math.inf
        try:
            return profile_epsilon(mechs, self._budget.delta)
        except UnsupportedMechanismError:
            return math.inf

    @property
    def _pld(self) -> PldComposer:
        """The PLD composition of every charge, built on first use.

        Only PLD halting, BEST halting and :meth:`report` need it; importing dp-accounting's
        PLD stack costs ~1.2 s, which an RDP-halting ledger (actor) never pays. A reopened
        journal starts from its PLD snapshot (:func:`~raydp_hpo.ledger.pld_snapshot.read_pld_snapshot`) when one matches,
        and folds in only the charges after it.
        """
        if self._pld_composer is None:
            from raydp_hpo.accounting.pld import PldComposer, has_pld

            composer, start = read_pld_snapshot(self)
            if composer is None:
                composer, start = PldComposer(), 0
            # A snapshot holds the folded PLD-capable part of its charges only: the charges
            # it covers that have no PLD (random stopping, subsampled tuning, (ε, δ)-only
            # mechanisms; converted at query time) are added back, or they would be forgotten.
            for charge in self._charges[:start]:
                if not has_pld(charge.mechanism):
                    composer.add(charge.mechanism)
            for charge in self._charges[start:]:
                composer.add(charge.mechanism)
            self._pld_composer = composer
        return self._pld_composer

    def _pld_epsilon(self, extra: Mechanism | None) -> float:
        base = self._pld
        if extra is None:
            cached = self._pld_spent
            if cached is not None and cached[0] is base and cached[1] == len(self._charges):
                return cached[2]
            eps = base.epsilon(self._budget.delta)
            self._pld_spent = (base, len(self._charges), eps)
            return eps
        trial = base.with_candidate(extra)  # folds base once; convolves only extra's PLD
        eps = trial.epsilon(self._budget.delta)
        self._pld_trial = (base, len(self._charges), extra, trial, eps)
        return eps

    def _commit(self, charge: Charge, profile: RdpProfile) -> None:
        if self._adaptivity is Adaptivity.EXPERIMENTS:
            point_trial, k = self._point_trial, len(self._charges) + 1
            self._points.append(point_trial[2] if point_trial is not None and point_trial[:2] == (
                charge.mechanism, k) else self._point(charge.mechanism, k))
            self._point_trial = None
        self._charges.append(charge)
        self._by_id[charge.charge_id] = charge
        self._records = charge.seq
        self._rdp = self._rdp + profile
        if self._pure is not None:
            p = pure_epsilon(charge.mechanism)
            self._pure = None if p is None else self._pure + p
        if self._pld_composer is not None:
            trial = self._pld_trial
            if (trial is not None and trial[0] is self._pld_composer
                    and trial[1] == len(self._charges) - 1 and trial[2] == charge.mechanism):
                self._pld_composer = trial[3]  # the admission check composed it already
                self._pld_spent = (trial[3], len(self._charges), trial[4])  # and its ε
            else:
                self._pld_composer.add(charge.mechanism)
            self._pld_trial = None
            if len(self._charges) - self._pld_snapshot_seq >= PLD_SNAPSHOT_EVERY:
                write_pld_snapshot(self)

    # -- PLD snapshots ------------------------------------------------------------------------
    # -- public API ----------------------------------------------------------------------
    @property
    def budget(self) -> PrivacyBudget:
        return self._budget

    @property
    def adaptivity(self) -> Adaptivity:
        return self._adaptivity

    @property
    def halting_accountant(self) -> Accountant:
        return self._accountant

    @property
    def delta_split(self) -> DeltaSplit | None:
        """An ``EXPERIMENTS`` ledger's δ split between its rules (None for other rules)."""
        return self._split

    @property
    def journal_path(self) -> Path | None:
        """The journal file (None in memory and for a PostgreSQL ledger: see :attr:`location`)."""
        return self._journal.path if isinstance(self._journal, Journal) else None

    @property
    def location(self) -> str | None:
        """Where the charges live: the journal's path or the ledger's PostgreSQL URI."""
        return None if self._journal is None else str(self._journal.path)

    @contextlib.contextmanager
    def _admission(self) -> Any:
        """One admission: for a PostgreSQL ledger, one transaction that locks the ledger and
        absorbs the charges other processes made since this one last looked, so the decision
        inside sees every charge; nested uses share it. Nothing to do for a journal file,
        which this ledger alone holds."""
        with self._lock:
            if not isinstance(self._journal, PgJournal) or self._admitting:
                self._admitting += 1
                try:
                    yield
                finally:
                    self._admitting -= 1
                return
            self._check_open()
            self._absorb(self._journal.begin_admission())
            self._admitting += 1
            try:
                yield
            finally:
                self._admitting -= 1
                self._journal.end_admission()  # rolls back unless append_charge committed

    def _absorb(self, records: list[dict[str, Any]]) -> None:
        """Fold in charge records other processes admitted (checked by the store), in order,
        exactly as a replay would; their stored curves join the curve check."""
        for rec in records:
            if rec.get("kind") == "release":
                release = release_from_record(rec, f"ledger {self._source}: record "
                                              f"{rec.get('seq')}")
                if release.seq != self._records + 1:
                    raise LedgerCorruptedError(
                        f"ledger {self._source}: release record {release.seq} skips a record; "
                        "restore the database from a backup")
                self._records = self._releases.add(release, self._source)
                continue
            try:
                mech = mechanism_from_dict(rec["mechanism"])
                charge = Charge(
                    seq=int(rec["seq"]), charge_id=str(rec["charge_id"]),
                    owner=str(rec.get("owner", "")), time=float(rec["time"]), mechanism=mech,
                    epsilon_after=float(rec["epsilon_after"]),
                )
                curve = _decode_curve(rec["rdp"])
            except (KeyError, TypeError, ValueError, RayDPHPOError) as exc:
                raise LedgerCorruptedError(
                    f"ledger {self._source}: record {rec.get('seq')} passes its chain but is not "
                    f"a valid charge record ({type(exc).__name__}: {exc})"
                ) from None
            if charge.seq != self._records + 1 or charge.charge_id in self._by_id:
                raise LedgerCorruptedError(
                    f"ledger {self._source}: record {charge.seq} ({charge.charge_id!r}) repeats "
                    "a charge id or skips a record; restore the database from a backup"
                )
            with self._verify_lock:
                self._unverified[len(self._charges)] = curve
            self._commit(charge, RdpProfile(*curve))

    def refresh(self) -> None:
        """Catch up with charges other processes made on a shared (PostgreSQL) ledger; a
        journal-file ledger has nothing to catch up with."""
        with self._admission():
            pass

    def epsilon_if_charged(self, mechanism: Mechanism) -> float:
        """ε the ledger would report after admitting ``mechanism`` (changes nothing)."""
        with self._lock:
            profile = rdp_profile(mechanism)
            check_supported(self._adaptivity, profile)
            return self._halting_epsilon(self._rdp + profile, mechanism)

    def would_admit(self, mechanism: Mechanism) -> bool:
        return self.epsilon_if_charged(mechanism) <= self._budget.epsilon

    def _check_open(self) -> None:
        """Refuse to charge a closed ledger, or one whose journal path no longer names its
        file (changes nothing)."""
        if self._closed:
            where = f"on journal {self.journal_path}" if self._journal is not None else "(in memory)"
            raise LedgerClosedError(
                f"the ledger {where} is closed; open it again (PrivacyLedger.open) to charge it"
            )
        if self._journal is not None:
            self._journal.check_writable()

    def try_charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        """Admit ``mechanism`` under ``charge_id`` iff the budget still covers it.

        Repeating an admitted ``charge_id`` with the same mechanism returns the original
        admission (``replayed=True``) without charging again; with a different mechanism it
        raises :class:`~raydp_hpo.errors.ChargeConflictError`. A refusal changes nothing.
        """
        if not isinstance(charge_id, str) or not charge_id:
            raise InvalidParameterError(f"charge_id must be a non-empty string, got {charge_id!r}")
        mechanism_to_dict(mechanism)  # validates the type
        with self._lock, self._admission():
            self._check_open()
            existing = self._by_id.get(charge_id)
            if existing is not None:
                if existing.mechanism != mechanism:
                    raise ChargeConflictError(
                        f"charge id {charge_id!r} was already used for {existing.mechanism!r}; "
                        f"a different mechanism {mechanism!r} needs a new id"
                    )
                return ChargeDecision(
                    True, charge_id, existing.epsilon_after, self._spent(), self._budget, True
                )
            profile = rdp_profile(mechanism)
            check_supported(self._adaptivity, profile)
            after = self._halting_epsilon(self._rdp + profile, mechanism)
            spent = self._spent()
            if not (after <= self._budget.epsilon):
                return ChargeDecision(False, charge_id, after, spent, self._budget)
            charge = Charge(
                seq=self._records + 1,
                charge_id=charge_id,
                owner=str(owner),
                time=time.time(),
                mechanism=mechanism,
                epsilon_after=after,
            )
            if self._journal is not None:
                record = charge.to_dict()
                record.pop("seq")
                record["rdp"] = _encode_profile(profile)
                self._journal.append_charge(record)  # durable before we acknowledge
            self._commit(charge, profile)
            return ChargeDecision(True, charge_id, after, after, self._budget)

    def charge(self, charge_id: str, mechanism: Mechanism, owner: str = "") -> ChargeDecision:
        """Like :meth:`try_charge` but raises :class:`BudgetExhaustedError` on refusal."""
        return self.try_charge(charge_id, mechanism, owner).raise_if_refused()

    def try_charge_new_attempt(
        self, charge_id: str, mechanism: Mechanism, owner: str = ""
    ) -> ChargeDecision:
        """:meth:`try_charge` under ``f"{charge_id}/attempt-{k}"``, k the smallest unused.

        For runs that may start over under the same id (a Tune trial retried from scratch):
        every fresh start pays, instead of replaying the first attempt's charge. Finding k and
        charging is one atomic step, so two concurrent starts can never share one charge. The
        decision's ``charge_id`` is the attempt id charged (or refused).
        """
        if not isinstance(charge_id, str) or not charge_id:
            raise InvalidParameterError(f"charge_id must be a non-empty string, got {charge_id!r}")
        with self._lock, self._admission():
            for attempt in range(MAX_ATTEMPTS):
                attempt_id = f"{charge_id}/attempt-{attempt}"
                if attempt_id not in self._by_id:
                    return self.try_charge(attempt_id, mechanism, owner)
        raise RayDPHPOError(f"more than {MAX_ATTEMPTS} attempts of charge {charge_id!r}")

    def has_charge(self, charge_id: str) -> bool:
        with self._lock:
            return charge_id in self._by_id

    # -- release markers ------------------------------------------------------------------
    def claim_release(self, run: str, where: str = "", owner: str = "",
                      token: str = "") -> ReleaseClaim:
        """Claim the one release of run ``run`` (``<experiment>@<run id>``), atomically.

        Granted (a ``release`` record is made durable, like a charge, before this returns)
        iff the ledger holds no release of ``run`` yet; the same ``token`` asking again (a
        retried call) is granted again as a replay. Otherwise refused, with the first
        release's record, and nothing changes. The marker charges nothing: no ε, no δ, no
        slot of a dataset ledger (it is not a :class:`Charge`). Serialised like an admission:
        by this ledger's lock and the journal's exclusive lock, or for PostgreSQL by the
        admission transaction's advisory lock (which first absorbs the records others made),
        so of two attempts racing on one run exactly one is granted."""
        if not isinstance(run, str) or not run:
            raise InvalidParameterError(f"run must be a non-empty string, got {run!r}")
        if not isinstance(token, str):
            raise InvalidParameterError(f"token must be a string, got {token!r}")
        with self._lock, self._admission():
            self._check_open()
            first = self._releases.get(run)
            if first is not None:
                replay = bool(token) and first.token == token
                return ReleaseClaim(replay, first, replayed=replay)
            release = ReleaseRecord(seq=self._records + 1, run=run, time=time.time(),
                                    where=str(where), owner=str(owner), token=token)
            if self._journal is not None:
                record = release.to_dict()
                record.pop("seq")
                self._journal.append_charge(record, kind="release")  # durable first
            self._records = self._releases.add(release, self._source)
            return ReleaseClaim(True, release)

    def release_of(self, run: str) -> ReleaseRecord | None:
        """The release marker of run ``run`` on this ledger, or None (not released). A
        shared (PostgreSQL) ledger answers from the records seen at its last admission:
        :meth:`refresh` first to see other processes' releases."""
        with self._lock:
            return self._releases.get(run)

    def releases(self) -> tuple[ReleaseRecord, ...]:
        """Every release marker, in ledger order."""
        with self._lock:
            return self._releases.all()

    def _spent(self) -> float:
        if not self._charges:
            return 0.0
        return self._halting_epsilon(self._rdp, None)

    def spent(self) -> float:
        """ε spent so far under the ledger's halting rule (at the budget's δ)."""
        with self._lock:
            return self._spent()

    def remaining(self) -> float:
        """ε still available under the halting rule (never negative)."""
        with self._lock:
            return max(0.0, self._budget.epsilon - self._spent())

    def charges(self) -> tuple[Charge, ...]:
        with self._lock:
            return tuple(self._charges)

    def report(self) -> LedgerReport:
        """Budget, spend and every charge; ε under RDP and PLD as fixed-sequence figures."""
        with self._lock:
            delta = self._budget.delta
            by_acc: dict[str, float] = {}
            if self._charges:
                by_acc["rdp_filter"] = filter_epsilon(self._rdp, delta)
                by_acc["rdp"] = self._rdp.epsilon(delta)
                try:
                    by_acc["pld"] = self._pld.epsilon(delta)
                except RayDPHPOError:
                    by_acc["pld"] = math.inf
                if self._pure is not None:
                    by_acc["pure"] = self._pure
                if self._split is not None:  # EXPERIMENTS
                    from raydp_hpo.ledger.experiments import filter_delta

                    by_acc["basic_composition"] = math.fsum(e for e, _ in self._points)
                    by_acc["basic_composition_delta"] = math.fsum(d for _, d in self._points)
                    by_acc["rdp_filter_split_delta"] = filter_epsilon(
                        self._rdp, filter_delta(delta, self._split))
                if self._accountant is Accountant.PROFILE:
                    profile = self._profile_epsilon(None)
                    if math.isfinite(profile):
                        by_acc["profile"] = profile
            spent = self._spent()
            return LedgerReport(
                budget=self._budget,
                adaptivity=self._adaptivity,
                halting_accountant=self._accountant,
                spent_epsilon=spent,
                remaining_epsilon=max(0.0, self._budget.epsilon - spent),
                epsilon_by_accountant=by_acc,
                charges=tuple(self._charges),
                delta_split=None if self._split is None else self._split.value,
                releases=self._releases.all(),
            )
