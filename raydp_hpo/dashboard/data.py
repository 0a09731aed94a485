"""What the dashboard shows, read without changing anything (no web framework needed here).

Sources are the locations the user names: journal folders (a storage path such as
``~/raydp_results``; every ``*.journal`` under it, as ``raydp-hpo ledger list DIR``) and
PostgreSQL databases (``postgresql://host:port/db``, credentials from libpq; every ledger in the
database, as ``raydp-hpo ledger list URI``).

Read-only by construction: a journal is read with :func:`~raydp_hpo.ledger.journal.scan_journal`
and replayed with :meth:`PrivacyLedger.from_scan <raydp_hpo.ledger.filter.PrivacyLedger.from_scan>`
(no journal handle: no lock, no seal or PLD-snapshot write, the file is left as it is), a
PostgreSQL ledger with :func:`~raydp_hpo.ledger.pg.scan_ledger` (``SELECT`` only). The figures
are those of ``raydp-hpo ledger show`` (spent and remaining ε under the ledger's halting rule,
each charge's recorded ε after) and the integrity status is what ``raydp-hpo ledger verify``
checks: every line's chain and sequence, the seal (a journal) and every stored RDP curve
against a recomputation.

What is never shown: credentials (a URI with a password is refused by
:func:`~raydp_hpo.ledger.pg.parse_uri`), private artefacts of an experiment (per-trial scores,
Tune's folder, ``evaluation_private.json``, logs: only their names are listed, marked private),
and machine paths beyond what the user gave (paths are shown relative to the location as the
user typed it, and error messages are rewritten the same way).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from raydp_hpo.errors import LedgerCorruptedError, RayDPHPOError

__all__ = [
    "Integrity",
    "LedgerSource",
    "LedgerSummary",
    "ExperimentSource",
    "Catalogue",
    "PAGE_SIZE",
]

#: Charges per page of a ledger's table.
PAGE_SIZE = 50
#: Ledgers with at most this many charges have every stored curve recomputed before their
#: figures are shown; a larger one is shown at once, its curves checked in the background.
CURVE_CHECK_INLINE = 2000
#: Seconds a PostgreSQL ledger's reading is reused (a journal's is reused until its file changes).
PG_CACHE_S = 5.0
#: Files of an experiment folder that are released (the rest is private: DESIGN.md).
PUBLIC_DIR = "public"


class Integrity(Enum):
    """The verdict of ``raydp-hpo ledger verify`` on a ledger."""

    OK = "ok"
    #: chain and seal (or the database's rows) check out; the stored curves of a large ledger
    #: are still being recomputed in the background
    CHECKING = "checking"
    CORRUPTED = "CORRUPTED"
    UNREADABLE = "unreadable"


def _finite(x: float | None) -> float | None:
    """``x`` for JSON (which has no infinity): ``None`` when it is not finite."""
    return None if x is None or not math.isfinite(x) else x


def _short_id(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LedgerSource:
    """One ledger as the user named its location: ``shown`` is what the pages print (the
    location as given, plus the journal's path below it, or the URI with its ledger)."""

    id: str
    shown: str
    location: str
    target: str  # the journal's path or the ledger's URI (what the ledger API opens)
    postgres: bool
    root: Path | None  # the resolved folder the user gave (journals); None for PostgreSQL
    binding: str  # what the ledger is for: a dataset, an experiment's own budget, ...


@dataclass(frozen=True)
class ExperimentSource:
    """One experiment folder (``<storage>/<experiment>``) that released something."""

    id: str
    name: str
    shown: str
    directory: Path


@dataclass
class LedgerSummary:
    """One row of the ledgers page (and of ``GET /api/ledgers``)."""

    source: LedgerSource
    integrity: Integrity
    problems: list[str] = field(default_factory=list)
    chain: str = ""
    seal: str = ""
    curves: str = ""
    budget_epsilon: float | None = None
    budget_delta: float | None = None
    spent_epsilon: float | None = None
    remaining_epsilon: float | None = None
    halting_rule: str = ""
    charges: int = 0
    #: runs whose one release is recorded on the ledger (a marker that charges nothing)
    releases: int = 0
    last_charge: float | None = None
    created: float | None = None
    charge_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.source.id,
            "ledger": self.source.shown,
            "location": self.source.location,
            "storage": "postgresql" if self.source.postgres else "journal",
            "binding": self.source.binding,
            "budget": (None if self.budget_epsilon is None
                       else {"epsilon": self.budget_epsilon, "delta": self.budget_delta}),
            "spent_epsilon": _finite(self.spent_epsilon),
            "remaining_epsilon": _finite(self.remaining_epsilon),
            "halting_rule": self.halting_rule,
            "charges": self.charges,
            "releases": self.releases,
            "last_charge": self.last_charge,
            "integrity": {"status": self.integrity.value, "chain": self.chain, "seal": self.seal,
                          "curves": self.curves, "problems": list(self.problems)},
        }

    @property
    def used_fraction(self) -> float:
        """Share of the budget spent (for the gauge), in [0, 1]."""
        if not self.budget_epsilon or self.spent_epsilon is None:
            return 0.0
        return min(1.0, max(0.0, self.spent_epsilon / self.budget_epsilon))


class Catalogue:
    """Every ledger and experiment under the user's locations, read on demand and cached
    (a journal until its file or seal changes, a PostgreSQL ledger for :data:`PG_CACHE_S`)."""

    def __init__(self, locations: list[str]) -> None:
        if not locations:
            raise RayDPHPOError("dashboard: no location to show; pass a storage path or a "
                                "postgresql://host:port/db URI")
        from raydp_hpo.ledger.pg import is_postgres_uri, parse_uri

        self._locations: list[tuple[str, Path | str]] = []
        for given in locations:
            if is_postgres_uri(given):
                base = parse_uri(given, need_ledger=False)  # refuses a password
                self._locations.append((base.uri, given))
                continue
            root = Path(given).expanduser()
            if not root.is_dir():
                what = "is not a directory" if root.exists() else "does not exist"
                raise RayDPHPOError(
                    f"dashboard: {given!r} {what}; pass a storage path (the folder holding the "
                    "experiments and ledgers/, default ~/raydp_results or $RAYDP_HPO_STORAGE) "
                    "or a postgresql://host:port/db URI"
                )
            self._locations.append((given, root.resolve()))
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[Any, LedgerSummary]] = {}
        self._sources: dict[str, LedgerSource] = {}
        self._experiments: dict[str, ExperimentSource] = {}
        self._discovered = 0.0
        self._executor: ThreadPoolExecutor | None = None
        #: locations that could not be listed at the last discovery (shown on the pages)
        self.errors: list[str] = []
        self._pending: list[Future[None]] = []

    # -- discovery ------------------------------------------------------------------------
    def _discover(self) -> None:
        """Find the ledgers and experiments (again at most every few seconds)."""
        now = time.monotonic()
        if self._sources and now - self._discovered < PG_CACHE_S:
            return
        sources: dict[str, LedgerSource] = {}
        experiments: dict[str, ExperimentSource] = {}
        errors: list[str] = []
        seen: set[str] = set()  # a journal or experiment under two given folders: once
        for given, where in self._locations:
            if isinstance(where, Path):
                for src in self._journals_under(given, where):
                    if src.target not in seen:
                        seen.add(src.target)
                        sources[src.id] = src
                for exp in self._experiments_under(given, where):
                    if str(exp.directory) not in seen:
                        seen.add(str(exp.directory))
                        experiments[exp.id] = exp
            else:
                try:
                    found = self._postgres_ledgers(given, where)
                except Exception as exc:  # noqa: BLE001  (an unreachable database is shown)
                    errors.append(f"{where}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
                    continue
                for src in found:
                    sources[src.id] = src
        self._sources, self._experiments, self._discovered = sources, experiments, now
        self.errors = errors

    @staticmethod
    def _journals_under(given: str, root: Path) -> list[LedgerSource]:
        out = []
        for path in sorted(root.rglob("*.journal")):
            rel = path.relative_to(root)
            if rel.parts[:1] == ("ledgers",) and len(rel.parts) == 2:
                binding = f"dataset ledger {path.stem}"
            elif rel.name == "ledger.journal" and len(rel.parts) == 2:
                binding = f"experiment {rel.parts[0]} (a budget of its own)"
            else:
                binding = ""
            shown = f"{given.rstrip('/')}/{rel.as_posix()}"
            out.append(LedgerSource(_short_id("journal", str(root), rel.as_posix()), shown,
                                    given, str(path), False, root, binding))
        return out

    @staticmethod
    def _experiments_under(given: str, root: Path) -> list[ExperimentSource]:
        found: dict[Path, str] = {}
        for release in [*root.glob("public/release.json"), *root.glob("*/public/release.json")]:
            found[release.parent.parent] = ""
        for release in [*root.glob("release.json"), *root.glob("*/release.json")]:
            found.setdefault(release.parent, "")  # older run dirs kept it at the top
        out = []
        for directory in sorted(found):
            rel = directory.relative_to(root).as_posix()
            shown = given.rstrip("/") if rel == "." else f"{given.rstrip('/')}/{rel}"
            out.append(ExperimentSource(_short_id("experiment", str(root), rel),
                                        directory.name, shown, directory))
        return out

    @staticmethod
    def _postgres_ledgers(given: str, base_uri: str) -> list[LedgerSource]:
        from raydp_hpo.ledger.pg import dataset_bindings, list_ledgers, parse_uri

        base = parse_uri(given, need_ledger=False)
        bindings = dataset_bindings(base.uri)
        sep = "&" if "?" in base.conninfo else "?"
        out = []
        for name in list_ledgers(base.uri):
            target = f"{base.conninfo}{sep}ledger={name}"
            bound = bindings.get(name, [])
            binding = ("registry: " + ", ".join(bound)) if bound else "no dataset registered"
            out.append(LedgerSource(_short_id("postgresql", base.conninfo, name),
                                    f"{base_uri.split('?')[0]}?ledger={name}", base_uri, target,
                                    True, None, binding))
        return out

    # -- ledgers --------------------------------------------------------------------------
    def ledgers(self) -> list[LedgerSummary]:
        with self._lock:
            self._discover()
            return [self._summary(src) for src in self._sources.values()]

    def ledger(self, ledger_id: str) -> LedgerSummary | None:
        with self._lock:
            self._discover()
            src = self._sources.get(ledger_id)
            return None if src is None else self._summary(src)

    def experiments(self) -> list[ExperimentSource]:
        with self._lock:
            self._discover()
            return list(self._experiments.values())

    def experiment(self, experiment_id: str) -> ExperimentSource | None:
        with self._lock:
            self._discover()
            return self._experiments.get(experiment_id)

    def experiments_named(self, name: str) -> list[ExperimentSource]:
        """The experiment folders whose name is ``name`` (a charge's owner)."""
        return [e for e in self._experiments.values() if e.name == name]

    @staticmethod
    def _stamp(src: LedgerSource) -> Any:
        if src.postgres:
            return ("pg", math.floor(time.monotonic() / PG_CACHE_S))
        from raydp_hpo.ledger.journal import seal_path

        out: list[tuple[int, int, int] | None] = []
        for p in (Path(src.target), seal_path(src.target)):
            try:
                st = p.stat()
                out.append((st.st_size, st.st_mtime_ns, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def _summary(self, src: LedgerSource) -> LedgerSummary:
        stamp = self._stamp(src)
        cached = self._cache.get(src.id)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        summary = self._read(src)
        self._cache[src.id] = (stamp, summary)
        return summary

    def _hide_paths(self, src: LedgerSource, text: str) -> str:
        """``text`` with the resolved location replaced by the location as the user gave it."""
        if src.root is not None:
            text = text.replace(str(src.root), src.location.rstrip("/"))
        return text

    def _checker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="dashboard-curves")
        return self._executor

    def settle(self, timeout: float | None = None) -> None:
        """Wait for the background curve checks started so far (tests, benchmarks)."""
        pending, self._pending = self._pending, []
        wait(pending, timeout=timeout)

    def _check_curves(self, src: LedgerSource, summary: LedgerSummary, ledger: Any,
                      stored: bool) -> None:
        """Recompute every stored RDP curve (``ledger verify`` without ``--quick``) and set
        the verdict on ``summary``."""
        try:
            issues = ledger.verify_stored_curves()
        except RayDPHPOError as exc:
            issues = (str(exc),)
        if issues:
            summary.curves = "MISMATCH"
            summary.problems.extend(self._hide_paths(src, i) for i in issues)
            summary.integrity = Integrity.CORRUPTED
        else:
            summary.curves = ("stored curves match a recomputation" if stored
                              else "recomputed (none stored)")
            if summary.integrity is Integrity.CHECKING:
                summary.integrity = Integrity.OK

    def _read(self, src: LedgerSource) -> LedgerSummary:
        """``ledger verify`` and ``ledger show`` of one ledger, read-only."""
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

        summary = LedgerSummary(src, Integrity.OK)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if src.postgres:
                    from raydp_hpo.ledger.pg import head_mac_status, ledger_head, scan_ledger

                    scan = scan_ledger(src.target)  # checks the rows against the ledger's head
                    summary.seal = (f"head vouches for {len(scan.records)} records; MAC "
                                    f"{head_mac_status(ledger_head(src.target))}")
                else:
                    from raydp_hpo.ledger.journal import inspect_seal, read_seal, scan_journal

                    scan = scan_journal(src.target)
                    claim = read_seal(Path(src.target))
                    seal_problems = inspect_seal(src.target).problems()
                    summary.seal = ("none (no truncation check)" if claim is None
                                    else f"vouches for {claim.records} records")
                    if seal_problems:
                        summary.integrity = Integrity.CORRUPTED
                        summary.seal = "DAMAGED"
                        summary.problems.extend(self._hide_paths(src, p) for p in seal_problems)
                    if scan.torn is not None:
                        summary.problems.append(
                            f"torn tail: {scan.torn.length} bytes at byte offset "
                            f"{scan.torn.offset} (an interrupted, never-acknowledged write)")
                summary.chain = (f"version {scan.version}, hash-chained, {len(scan.records)} records"
                                 if scan.version >= 2 else
                                 f"version {scan.version}, CRC-32 per record, no chain")
                ledger = PrivacyLedger.from_scan(scan, curve_check=CurveCheck.ON_DEMAND)
        except LedgerCorruptedError as exc:
            summary.integrity = Integrity.CORRUPTED
            summary.chain = summary.chain or "FAILED"
            summary.problems.append(self._hide_paths(src, str(exc)))
            return summary
        except RayDPHPOError as exc:
            summary.integrity = Integrity.UNREADABLE
            summary.problems.append(self._hide_paths(src, str(exc)))
            return summary
        summary.budget_epsilon = ledger.budget.epsilon
        summary.budget_delta = ledger.budget.delta
        summary.spent_epsilon = ledger.spent()
        summary.remaining_epsilon = ledger.remaining()
        summary.halting_rule = f"{ledger.adaptivity.value} / {ledger.halting_accountant.value}"
        charges = ledger.charges()
        summary.charges = len(charges)
        summary.releases = len(ledger.releases())
        summary.last_charge = charges[-1].time if charges else None
        created = scan.header.get("created")
        summary.created = float(created) if isinstance(created, (int, float)) else None
        summary.charge_rows = [
            {"seq": c.seq, "time": c.time, "charge_id": c.charge_id, "owner": c.owner,
             "mechanism": type(c.mechanism).__name__, "epsilon_after": c.epsilon_after}
            for c in charges
        ]
        stored = scan.header.get("rdp_orders") is not None
        if len(scan.records) <= CURVE_CHECK_INLINE:
            self._check_curves(src, summary, ledger, stored)
        else:  # a large ledger's page does not wait for every curve's recomputation
            if summary.integrity is Integrity.OK:
                summary.integrity = Integrity.CHECKING
            summary.curves = f"being recomputed ({len(scan.records)} records)"
            self._pending.append(self._checker().submit(
                self._check_curves, src, summary, ledger, stored))
        return summary


def sort_and_filter(rows: list[LedgerSummary], *, sort: str = "ledger", descending: bool = False,
                    query: str = "") -> list[LedgerSummary]:
    """The ledgers page's rows filtered by ``query`` (a substring of the ledger, its binding,
    halting rule or integrity status, case-insensitive) and sorted by column ``sort``."""
    q = query.strip().lower()
    if q:
        rows = [r for r in rows if q in " ".join(
            [r.source.shown, r.source.binding, r.halting_rule, r.integrity.value]).lower()]
    keys: dict[str, Any] = {
        "ledger": lambda r: r.source.shown.lower(),
        "binding": lambda r: r.source.binding.lower(),
        "budget": lambda r: r.budget_epsilon if r.budget_epsilon is not None else -1.0,
        "spent": lambda r: r.spent_epsilon if r.spent_epsilon is not None else -1.0,
        "remaining": lambda r: r.remaining_epsilon if r.remaining_epsilon is not None else -1.0,
        "rule": lambda r: r.halting_rule,
        "charges": lambda r: r.charges,
        "last": lambda r: r.last_charge or 0.0,
        "integrity": lambda r: r.integrity.value,
    }
    if sort not in keys:
        raise RayDPHPOError(f"sort={sort!r} is not a column; use one of {', '.join(keys)}")
    return sorted(rows, key=keys[sort], reverse=descending)


# -- experiments ----------------------------------------------------------------------------
#: Names of an experiment folder's private artefacts, and what each is (never read or served).
PRIVATE_ARTEFACTS = {
    "tune": "Ray Tune's experiment folder: per-trial configs, scores and logs",
    "evaluation_private.json": "the released model's test accuracy without noise",
    "audit.jsonl": "the run's spend log",
    "run.json": "the run's settings (paths of this machine)",
    "dptuner.pkl": "the tuner's state for a resume",
    "report": "the run's report (holds per-trial results)",
    "ledger.journal": "the experiment's own ledger (its figures are on the ledger's page)",
}


def read_experiment(exp: ExperimentSource) -> dict[str, Any]:
    """The public part of an experiment: its release (hyperparameters, certificate, DP test
    accuracy) from ``public/release.json`` and the names of the public files; the private
    artefacts by name only. Nothing outside ``public/`` is opened (an older run dir without
    ``public/`` keeps its release at the top; only that file is read)."""
    public = exp.directory / PUBLIC_DIR
    release_file = public / "release.json"
    if not release_file.is_file():
        release_file = exp.directory / "release.json"
    try:
        release = json.loads(release_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RayDPHPOError(f"experiment {exp.shown}: cannot read its release "
                            f"({type(exc).__name__})") from None
    if not isinstance(release, dict):
        raise RayDPHPOError(f"experiment {exp.shown}: its release is not a JSON object")
    certificate = release.get("certificate") or {}
    cert_file = public / "certificate.json"
    if cert_file.is_file():
        with contextlib.suppress(OSError, ValueError):  # else the release's copy stands
            certificate = json.loads(cert_file.read_text(encoding="utf-8"))
    public_files = sorted(p.name for p in public.iterdir()) if public.is_dir() else []
    private = [{"name": name, "what": what} for name, what in PRIVATE_ARTEFACTS.items()
               if (exp.directory / name).exists()]
    eps = certificate.get("epsilon", {}) if isinstance(certificate, dict) else {}
    raw_accuracy = release.get("dp_test_accuracy")
    # {"value": a, "epsilon": ε_t}: the released model's test accuracy by the Laplace
    # mechanism, charged to the ledger and covered by the certificate (an older release: a number)
    accuracy = raw_accuracy.get("value") if isinstance(raw_accuracy, dict) else raw_accuracy
    points = []
    if isinstance(accuracy, (int, float)) and isinstance(eps.get("certified"), (int, float)):
        own = raw_accuracy.get("epsilon") if isinstance(raw_accuracy, dict) else None
        points.append({"epsilon": eps["certified"], "accuracy": accuracy,
                       "what": "released model: DP test accuracy"
                               + (f" (its own noise ε={own:g})" if isinstance(own, (int, float))
                                  else "") + ", at the certified ε of the whole release"})
    return {
        "id": exp.id,
        "name": exp.name,
        "experiment": exp.shown,
        "hyperparameters": release.get("hyperparameters"),
        "budget_exhausted": release.get("budget_exhausted"),
        "dp_test_accuracy": raw_accuracy,
        "accuracy_vs_epsilon": points,
        "certificate": certificate,
        "public_files": public_files,
        "private_artefacts": private,
        "note": release.get("note", ""),
    }
