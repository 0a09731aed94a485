"""The budget belongs to the data: the dataset ledger that ``DPTuner`` and ``raydp-hpo run``
charge by default.

A dataset is named by its fingerprint (:func:`raydp_hpo.trainables.data.dataset_fingerprint`:
the built-in dataset and its generator settings, the canonical Parquet URI, or a name the
user declares). Its ledger is the Ray actor :func:`~raydp_hpo.trainables.data.
dataset_ledger_name` journaled at ``<storage>/ledgers/<name>.journal``, so every experiment on
the same data, from Python or from an experiment file, spends from one budget:

* the first experiment creates the ledger with its own budget as the dataset's total;
* a later experiment on the same data attaches to it (the journal's total budget, never its
  own): it may spend at most its own ε, and only what the dataset has left;
* a fresh per-experiment budget is an explicit choice (``DPTuner(fresh_budget=True)``, or a
  ``ledger:`` named in an experiment file), logged as such.

Experiments on one dataset ledger are chosen adaptively (one release may shape the next), so
its halting rule must be a valid privacy filter. A new dataset ledger composes whole
experiments (:attr:`Adaptivity.EXPERIMENTS`, :mod:`raydp_hpo.ledger.experiments`): each
experiment takes one (εₖ, δₖ) point, its δ share δₖ (the ledger's δ split) and the ε its
plan costs at that δ on the tightest fixed-plan accounting, runs within that point on a ledger
of its own, and the dataset's ledger halts when neither basic composition of the points nor
the RDP filter at its δ share admits. A ledger named in an experiment file (journal file or
PostgreSQL) gets the same rule when ``raydp-hpo run`` creates it (:func:`dataset_ledger_rule`).
A ledger created before (the adaptive RDP filter, Feldman & Zrnic 2021) keeps the rule its
journal states.

On PostgreSQL the registry is the organisation's: a ledger handle on a ``postgresql://`` URI
binds the data it charges to that ledger (:func:`bind_data_to_ledger`, which ``DPTuner``
calls as ``raydp-hpo run`` calls :func:`raydp_hpo.cli.experiment.
bind_data_to_postgres_ledger`), so data already bound to another ledger is refused before
anything is charged. The organisation's registry can also be named for every run, whatever
ledger it charges: with ``RAYDP_HPO_REGISTRY`` set, :func:`check_data_registry` (called where
``DPTuner`` chooses its ledger and where ``raydp-hpo run`` does) refuses a run on data the
registry binds to another ledger, including a journal file and ``fresh_budget=True``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import InvalidParameterError, LedgerMismatchError
from raydp_hpo.ledger.actor import DEFAULT_NAMESPACE, LedgerHandle, get_ledger
from raydp_hpo.ledger.filter import Adaptivity, CurveCheck, PrivacyLedger
from raydp_hpo.ledger.journal import read_header
from raydp_hpo.trainables.data import dataset_ledger_name

__all__ = ["dataset_ledger_journal", "dataset_ledger_budget", "dataset_ledger_rule",
           "create_dataset_ledger", "open_dataset_ledger", "bind_data_to_ledger",
           "check_data_registry", "shared_ledger", "REGISTRY_ENV"]

#: The environment variable naming the organisation's dataset registry (a PostgreSQL URI).
REGISTRY_ENV = "RAYDP_HPO_REGISTRY"

#: How a new dataset ledger halts (see the module docstring).
DATASET_ADAPTIVITY = Adaptivity.EXPERIMENTS
DATASET_ACCOUNTANT = Accountant.TIGHTEST


def dataset_ledger_rule(journal: Path | str) -> tuple[Adaptivity, Accountant]:
    """The halting rule of a ledger that composes experiments — a dataset's own, or one named
    in an experiment file (a journal file or a PostgreSQL URI): the one its header states if
    it exists (a ledger keeps its rule, and its δ split, for life), else the rule of a new one
    (:attr:`Adaptivity.EXPERIMENTS` on the tightest fixed-plan points,
    :mod:`raydp_hpo.ledger.experiments`)."""
    from raydp_hpo.errors import LedgerUnavailableError, RayDPHPOError
    from raydp_hpo.ledger.pg import is_postgres_uri, scan_ledger

    if is_postgres_uri(journal):
        try:
            header = scan_ledger(str(journal)).header
        except LedgerUnavailableError:
            raise
        except RayDPHPOError:  # no schema or no such ledger yet: a new one
            return DATASET_ADAPTIVITY, DATASET_ACCOUNTANT
    else:
        if not Path(journal).exists():
            return DATASET_ADAPTIVITY, DATASET_ACCOUNTANT
        header = read_header(journal)
    return Adaptivity(header["adaptivity"]), Accountant(header["accountant"])


def dataset_ledger_journal(storage: str | Path, fingerprint: str) -> Path:
    """The journal of the dataset's ledger under ``storage``: ``<storage>/ledgers/<name>``."""
    name = dataset_ledger_name(fingerprint)
    return (Path(storage).expanduser() / "ledgers" / f"{name}.journal").resolve()


def dataset_ledger_budget(journal: Path, budget: PrivacyBudget, fingerprint: str,
                          out: Callable[[str], None]) -> PrivacyBudget:
    """The total budget of the dataset's ledger: the journal's, if it exists (its δ must be
    ``budget.delta``: a ledger states ε at one δ), else ``budget`` (a new ledger). Reads the
    journal without changing it; says on ``out`` which case it is."""
    name = dataset_ledger_name(fingerprint)
    if journal.exists():
        # ON_DEMAND, as every read-only replay that only reads figures: no background
        # curve-check thread (the ledger actor that opens the journal checks its curves)
        report = PrivacyLedger.read_only(journal, curve_check=CurveCheck.ON_DEMAND).report()
        out(f"[raydp-hpo] dataset ledger {name!r} ({fingerprint}): total "
            f"ε={report.budget.epsilon:g}, δ={report.budget.delta:g}, already spent "
            f"ε={report.spent_epsilon:.4f}; this experiment may spend at most "
            f"ε={budget.epsilon:g}")
        if report.budget.delta != budget.delta:
            raise InvalidParameterError(
                f"budget.delta={budget.delta:g} differs from the dataset ledger's "
                f"δ={report.budget.delta:g} ({journal}); a dataset ledger states ε at one δ: "
                f"use delta={report.budget.delta:g}"
            )
        return report.budget
    out(f"[raydp-hpo] new dataset ledger {name!r} for {fingerprint} with total budget "
        f"ε={budget.epsilon:g}, δ={budget.delta:g} (journal {journal}); later experiments on "
        "this data spend from it")
    return budget


def open_dataset_ledger(fingerprint: str, budget: PrivacyBudget, storage: str | Path, *,
                        namespace: str = DEFAULT_NAMESPACE,
                        out: Callable[[str], None] = print) -> LedgerHandle:
    """Create or attach to the dataset's ledger actor (Ray must be initialised) and verify
    it: its journal is :func:`dataset_ledger_journal`, its total budget
    :func:`dataset_ledger_budget`."""
    journal = dataset_ledger_journal(storage, fingerprint)
    total = dataset_ledger_budget(journal, budget, fingerprint, out)
    adaptivity, accountant = dataset_ledger_rule(journal)
    return get_ledger(dataset_ledger_name(fingerprint), total, journal, namespace=namespace,
                      adaptivity=adaptivity, accountant=accountant)


def create_dataset_ledger(dataset: str, budget: PrivacyBudget,
                          storage_path: str | Path | None = None) -> Path:
    """Create the ledger of ``dataset`` (its fingerprint or declared name, as
    ``DPTuner(dataset=...)`` / ``data.name``) with the total ``budget``, before any experiment
    (by default the first experiment's budget becomes the dataset's total). No Ray needed;
    returns the journal. An existing ledger is left alone and must have this budget."""
    from raydp_hpo._storage import default_storage_path

    if not isinstance(budget, PrivacyBudget):
        raise InvalidParameterError(f"budget must be a PrivacyBudget, got {budget!r}")
    storage = default_storage_path() if storage_path is None else storage_path
    journal = dataset_ledger_journal(storage, dataset)
    journal.parent.mkdir(parents=True, exist_ok=True)
    adaptivity, accountant = dataset_ledger_rule(journal)
    PrivacyLedger(budget, journal, adaptivity=adaptivity, accountant=accountant).close()
    return journal


def bind_data_to_ledger(ledger: LedgerHandle, dataset: str | None,
                        out: Callable[[str], None] = print) -> LedgerHandle:
    """Bind ``dataset`` (a data source's fingerprint or declared name) to ``ledger`` in the
    PostgreSQL registry when ``ledger`` is stored in PostgreSQL
    (:func:`raydp_hpo.ledger.pg.register_dataset`); return ``ledger``.

    Data already bound to another ledger there is refused with
    :class:`~raydp_hpo.errors.LedgerMismatchError` (a second budget on the same people is an
    administrator's recorded act, not a run's choice); the ledger is left as it was. Nothing
    to do for a journal-file ledger (its registry is the storage path) or unnamed data (it has
    no identity to register; said on ``out``)."""
    from raydp_hpo.ledger.pg import is_postgres_uri, register_dataset

    uri = ledger.settings()["journal"]
    if not is_postgres_uri(uri):
        return ledger
    if dataset is None:
        out(f"[raydp-hpo] the data has no name, so it is not bound to ledger {uri} in the "
            "registry; name it (DataSplits(..., name=...)) so no other ledger can take it")
        return ledger
    register_dataset(uri, dataset)
    out(f"[raydp-hpo] data {dataset} is bound to ledger {uri}")
    return ledger


def check_data_registry(names: Iterable[str | None], charged: str | Path | None,
                        out: Callable[[str], None] = print) -> None:
    """Before a run's first charge: refuse data that the organisation's registry binds to a
    ledger other than the one this run charges.

    The registry is the database named by the environment variable :data:`REGISTRY_ENV`
    (``RAYDP_HPO_REGISTRY=postgresql://host:port/db``; credentials from libpq, a password in
    the URI is refused). Unset or empty: nothing is checked (behaviour as without a registry).
    Set: each of ``names`` (the data's fingerprint or declared name, as
    :func:`bind_data_to_ledger` registers it) is looked up there
    (:func:`raydp_hpo.ledger.pg.ledger_for_dataset`). ``charged`` is the ledger the run
    charges: a PostgreSQL URI, a journal file, or ``None`` for a fresh budget
    (``fresh_budget=True``). Bound data passes only when ``charged`` is one of its bound
    ledgers in the registry's database (the same host, port and database as libpq reads the
    two URIs, query parameters and ``PG*`` variables included:
    :meth:`raydp_hpo.ledger.pg.PgLocation.same_database`); a journal
    file and a fresh budget never are. Otherwise :class:`~raydp_hpo.errors.LedgerMismatchError`
    names the bound ledger: a second budget on the same people is an administrator's recorded
    act (:func:`raydp_hpo.ledger.pg.register_dataset` with ``admin_reason``), not a run's
    choice. Unbound data passes (a PostgreSQL ledger then binds it, :func:`bind_data_to_ledger`).
    A registry that cannot be reached or queried raises
    :class:`~raydp_hpo.errors.LedgerUnavailableError` (fail closed: nothing is charged).
    Unnamed data has no identity to look up: said on ``out``."""
    from raydp_hpo.ledger.pg import is_postgres_uri, ledger_for_dataset, parse_uri

    registry = os.environ.get(REGISTRY_ENV, "").strip()
    if not registry:
        return
    if not is_postgres_uri(registry):
        raise InvalidParameterError(
            f"{REGISTRY_ENV}={registry!r} is not a PostgreSQL URI; set it to the registry's "
            "database, postgresql://host:port/db (credentials from libpq), or unset it"
        )
    try:
        reg = parse_uri(registry, need_ledger=False)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{REGISTRY_ENV}: {exc}") from None
    base = reg.conninfo
    named = list(dict.fromkeys(n for n in names if n))
    if not named:
        out(f"[raydp-hpo] the data has no name, so the registry {base} ({REGISTRY_ENV}) cannot "
            "say whose budget it is; name it (DataSplits(..., name=...))")
        return
    if isinstance(charged, str) and is_postgres_uri(charged):
        loc = parse_uri(charged)
        # where libpq will really connect (?dbname=/&port=/PG* variables), not how it is written
        on_registry = loc.same_database(reg)
        what = f"ledger {loc.uri}" + ("" if on_registry else
                                      " (database {}:{}/{} as user {})".format(*loc.database()))
    else:
        loc, on_registry = None, False
        what = ("a fresh budget of its own (fresh_budget=True)" if charged is None
                else f"the journal file {charged}")
    for name in named:
        bound = ledger_for_dataset(base, name)
        if not bound or (on_registry and loc is not None and loc.ledger in bound):
            continue
        uris = [reg.with_ledger(b) for b in bound]
        raise LedgerMismatchError(
            f"data source {name!r} already has its budget in ledger(s) {uris} (registry "
            f"{REGISTRY_ENV}={base}); this run charges {what}, a fresh budget on the same "
            f"data. Run on {uris[0]} (DPTuner(ledger=get_ledger(..., {uris[0]!r})) or "
            "ledger.uri in the experiment file), or, if a second budget is really meant, have "
            "an administrator register a new PostgreSQL ledger for it with an admin_reason "
            "(raydp_hpo.ledger.pg.register_dataset, recorded) and run on that one."
        )
    out(f"[raydp-hpo] registry ({REGISTRY_ENV}) {base}: data {', '.join(named)} may be "
        f"charged on {what}")


def shared_ledger(ledger: LedgerHandle | None, dataset: str | None, storage: Path, data_name: str | None,
                  budget: PrivacyBudget, *, experiment: str, namespace: str,
                  progress: Callable[[str], None] | None, log: logging.Logger) -> LedgerHandle | None:
    """The ledger this experiment shares with others (verified): the one given, else the
    dataset's; ``None`` for a fresh per-experiment budget (logged here). Every choice is
    first checked against the organisation's registry when ``RAYDP_HPO_REGISTRY`` is set
    (:func:`check_data_registry`). ``log``: the logger the lines also go to (DPTuner's)."""
    out = progress or log.info
    given = None if ledger is None else ledger.verify()
    charged: str | Path | None = (
        given.settings()["journal"] if given is not None
        else None if dataset is None  # fresh_budget=True
        else dataset_ledger_journal(storage, dataset)
    )
    check_data_registry((dataset, data_name), charged, out)  # before any charge
    if given is not None:  # on PostgreSQL: the registry binds the data to it
        return bind_data_to_ledger(given, data_name, out)
    if dataset is None:
        line = (f"[raydp-hpo] experiment {experiment!r} spends from a fresh budget of "
                f"its own (fresh_budget=True): ε={budget.epsilon:g}, "
                f"δ={budget.delta:g}, seen by no other experiment on this data")
        log.warning(line)
        if progress is not None:
            progress(line)
        return None
    return open_dataset_ledger(dataset, budget, storage,
                               namespace=namespace, out=out)
