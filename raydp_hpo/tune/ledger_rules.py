"""Which ledger a DPTuner charges and the rules that admit its charges: whose budget
(:func:`_whose_budget`), the dedicated ledger's halting accountant, the check that a resumed
experiment attaches to the ledger that holds its earlier charges
(:func:`require_earlier_charges`), and the picklable admissibility rules a searcher calibrates
against (:class:`_FirstChargeRule` on a dedicated ledger, :class:`_DatasetPointRule` for an
experiment's point on a dataset ledger, :class:`_Slot` its place there).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.errors import InvalidParameterError, LedgerMismatchError, RayDPHPOError
from raydp_hpo.ledger.actor import LedgerHandle
from raydp_hpo.ledger.experiments import LATEST_SPLIT, DeltaSplit
from raydp_hpo.ledger.filter import Adaptivity


def _whose_budget(ledger: LedgerHandle | None, dataset: str | None, fresh_budget: bool,
                  data: Any) -> str | None:
    """The fingerprint of the dataset whose ledger ``DPTuner`` charges by default, or ``None``
    when it charges the ``ledger`` given or a fresh budget (``fresh_budget=True``). Refuses
    conflicting choices and a run that names no data and asks for no fresh budget."""
    if not isinstance(fresh_budget, bool):
        raise InvalidParameterError(f"fresh_budget must be True or False, got {fresh_budget!r}")
    given = [name for name, on in (("ledger=", ledger is not None),
                                   ("dataset=", dataset is not None),
                                   ("fresh_budget=True", fresh_budget)) if on]
    if len(given) > 1:
        raise InvalidParameterError(
            f"{' and '.join(given)} both say whose budget to spend: give one of them (ledger= "
            "a shared ledger, dataset= the data's own ledger, fresh_budget=True a budget of "
            "this experiment's own)"
        )
    if ledger is not None or fresh_budget:
        return None
    if dataset is not None:
        if not isinstance(dataset, str) or not dataset.strip():
            raise InvalidParameterError(
                f"dataset must be a non-empty string naming the data, got {dataset!r}"
            )
        return dataset.strip()
    if data.name is None:
        raise InvalidParameterError(
            "DPTuner does not know whose budget this search spends: the data has no name. "
            "Name the dataset (DPTuner(dataset='census-2024'), or DataSplits(..., name=...); "
            "the loaders load_digits, load_mnist1d and load_parquet name theirs) so every "
            "experiment on it spends from one budget, pass a shared ledger (ledger="
            "get_ledger(...)), or ask for a budget of this experiment's own explicitly "
            "(fresh_budget=True)"
        )
    return str(data.name)


def _halting_accountant(adaptivity: Adaptivity) -> Accountant:
    """The dedicated ledger's halting accountant: the tightest valid one for the rule
    (:func:`raydp_hpo.ledger.tightest_halting_accountant`).

    A plan fixed before any data is touched (every built-in searcher: one plan charge, or a
    grid whose trials are fixed in advance) composes a fixed sequence, so it is calibrated and
    admitted on ``PROFILE`` — the minimum of the RDP, PLD and privacy-profile upper bounds
    (random stopping by Koskela, Redberg & Wang 2024's profiles) — and standard (fixed)
    composition justifies halting. Charges chosen adaptively halt on the RDP filter (Feldman &
    Zrnic 2021), whose guarantee holds under adaptivity; PLD and profiles have no such filter
    theorem. Measured: one DP-SGD run calibrated to ε = 3 by RDP alone is ε = 2.55 under PLD;
    the demo's random stopping admitted at RDP ε = 7.99 is ε = 6.03 under profiles.
    """
    from raydp_hpo.ledger.filter import tightest_halting_accountant

    return tightest_halting_accountant(adaptivity)


def charge_prefix(experiment: str, run_id: str | None) -> str:
    """The prefix of every charge id of one run: ``<experiment>@<run id>`` (``<experiment>``
    for a run started before run ids, ``run_id=None``).

    The run id is fresh for every run (``secrets.token_hex``, OS entropy), so two runs under
    one experiment name — the run directory deleted, another storage path, another machine —
    never share a charge id, and a ledger's replay-by-id can never hand one run's admission
    to another: each run pays for what it releases. An experiment name never contains ``@``
    (``DPTuner`` keeps ``[A-Za-z0-9_.-]``), so the prefix names one run unambiguously."""
    return experiment if run_id is None else f"{experiment}@{run_id}"


def other_runs(charges: Sequence[Any], experiment: str, run_id: str | None) -> list[str]:
    """The charge prefixes of the *other* runs of ``experiment`` among ``charges`` (a used
    experiment name: this run pays again, and says so)."""
    own = charge_prefix(experiment, run_id)
    found: dict[str, None] = {}
    for c in charges:
        head = c.charge_id.split("/", 1)[0]
        if head != own and (head == experiment or head.startswith(f"{experiment}@")):
            found[head] = None
    return list(found)


def require_earlier_charges(journal: Path | str | None, experiment: str,
                            charges: Sequence[Any] | None = None, *,
                            where: str | None = None, run_id: str | None = None) -> None:
    """Refuse to resume the run ``run_id`` of ``experiment`` unless the ledger it attaches to
    holds that run's earlier charges (ids ``<experiment>@<run id>/...``, :func:`charge_prefix`;
    ``<experiment>/...`` for a run from before run ids): the journal at ``journal``
    (read-only, nothing created), or ``charges`` of a live ledger (``where`` names it).

    A resume replays the plan charge by its id and continues trials inside their admitted
    charges. On a ledger without them — the journal and its seal moved away, another storage
    path, another ledger, or a ledger holding only *another* run of the same name — the
    replay would attach to nothing of its own: a fresh charge of the whole plan on a budget
    that does not know its earlier spend. The run id comes from the resumed run's own
    experiment directory, so only the run that made the charges can attach to them. Raises
    :class:`LedgerMismatchError` naming the run and both choices."""
    prefix = f"{charge_prefix(experiment, run_id)}/"
    from raydp_hpo.ledger.pg import is_postgres_uri

    if charges is None and is_postgres_uri(journal):
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

        charges = PrivacyLedger.read_only(str(journal), curve_check=CurveCheck.ON_DEMAND).charges()
        where = f"the ledger {journal}"
    if charges is None:
        assert journal is not None
        journal = Path(journal)
        if not journal.exists():
            raise LedgerMismatchError(
                f"cannot resume experiment {experiment!r}: its charges should be in the ledger "
                f"journal {journal}, which does not exist (moved or deleted?). Put the journal "
                "and its .seal back where they were; resuming on a fresh ledger would charge "
                "the experiment again on a budget that does not know its earlier spend. "
                "Nothing was charged"
            )
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

        charges = PrivacyLedger.read_only(journal, curve_check=CurveCheck.ON_DEMAND).charges()
        where = f"the ledger journal {journal}"
    if not any(c.charge_id.startswith(prefix) for c in charges):
        others = other_runs(charges, experiment, run_id)
        also = (f" (it holds charges of other runs of this name: {', '.join(others)}; a "
                "resume attaches only to the charges of the run it continues)" if others else "")
        raise LedgerMismatchError(
            f"cannot resume experiment {experiment!r} (run "
            f"{run_id or 'without a run id: from before run ids, or its dptuner.pkl is gone'}):"
            f" {where} holds no charge of this run (no charge id starting with {prefix!r}), "
            f"so it is not the ledger this run charged{also}. Either resume it with the "
            "ledger (journal, storage path) it started on, or run the experiment again as a "
            "new run, which pays again (without --resume / DPTuner.restore, after removing "
            "or renaming its run directory). Nothing was charged"
        )


def _resumed_accountant(journal: Path, adaptivity: Adaptivity) -> Accountant:
    """The halting accountant for the dedicated ledger at ``journal``.

    A fresh ledger gets :func:`_halting_accountant`. A journal that already exists (a resumed
    experiment) keeps the accountant written in its header when that one is valid for the
    same halting rule: experiments started before fixed plans halted on ``PROFILE`` were
    admitted on ``BEST`` (min of RDP and PLD), which stays a valid — only looser — bound for
    the charges still to come, so resuming them must not fail on the changed default. Any
    other mismatch (or an unreadable header) is left to the ledger actor to report.
    """
    default = _halting_accountant(adaptivity)
    if not journal.exists():
        return default
    from raydp_hpo.ledger.journal import read_header

    try:
        header = read_header(journal)
        stored = Accountant(header["accountant"])
        same_rule = Adaptivity(header["adaptivity"]) is adaptivity
    except (RayDPHPOError, KeyError, TypeError, ValueError):
        return default
    if not same_rule:
        return default
    if adaptivity is Adaptivity.ADAPTIVE:
        return stored if stored is Accountant.RDP else default
    return stored


def _at_least(eps: float) -> str:
    """``eps`` rounded *up* to 4 decimals: a budget printed as "at least" must pass."""
    return f"{math.ceil(eps * 1e4 - 1e-9) / 1e4:.4f}"


def _rule_name(adaptivity: Adaptivity, accountant: Accountant, budget: PrivacyBudget,
               split: DeltaSplit | None = None) -> str:
    """The halting rule in words, as a refusal names it."""
    if adaptivity is Adaptivity.ADAPTIVE:
        return "the adaptive RDP filter (Feldman & Zrnic 2021, union bound over 24 orders)"
    if adaptivity is Adaptivity.EXPERIMENTS:
        from raydp_hpo.ledger.experiments import filter_delta

        delta_a = filter_delta(budget.delta, split or LATEST_SPLIT)
        return (f"the experiments rule (the smaller of the RDP filter at δ={delta_a:.3g} and "
                "basic composition of the experiments' points)")
    return (f"the tightest fixed-plan figure ({accountant.value}: standard composition of the "
            "plan fixed before any data is touched)")


Refusal = tuple[str, str]  # (what the refusing rule says, the fix)


@dataclass(frozen=True)
class _Slot:
    """An experiment's place on a dataset ledger (see :meth:`raydp_hpo.tune.dataset_points.
    DatasetPlace.take`): it is the k-th charge, with δ share ``delta``, after the charges
    ``prior``; it calibrates within ``cap``; ``reserved`` is the ``ApproxDP`` reservation of an
    experiment whose trials charge themselves (``None``: its plan is its point)."""

    k: int
    cap: float
    delta: float
    prior: tuple[tuple[str, Mechanism], ...]
    accountant: Accountant  # the dataset ledger's: how it prices a point
    reserved: Any | None
    charged: Mechanism | None  # on resume: the point this experiment charged
    split: DeltaSplit = LATEST_SPLIT  # the ledger's δ split: how it prices a point


def ledger_split(ledger: Any) -> DeltaSplit:
    """The δ split of an ``EXPERIMENTS`` ledger: a :class:`PrivacyLedger`'s own, or a ledger
    actor's (its settings; a ledger that states none was created before splits were stored,
    :attr:`DeltaSplit.HALVES`)."""
    split = getattr(ledger, "delta_split", None)
    if isinstance(split, DeltaSplit):
        return split
    value = ledger.settings().get("delta_split")
    return DeltaSplit.HALVES if value is None else DeltaSplit(value)


@dataclass(frozen=True)
class _BothRules:
    """Picklable: admissible under both rules; ``figure`` (calibration's guide) the first's."""

    first: _FirstChargeRule
    second: Any

    def figure(self, mechanism: Mechanism) -> float:
        return self.first.figure(mechanism)

    def __call__(self, mechanism: Mechanism) -> bool:
        return self.first(mechanism) and bool(self.second(mechanism))

    def explain(self, mechanism: Mechanism) -> Refusal | None:
        """The refusal of the first rule that refuses ``mechanism`` (None: both admit)."""
        refusal = self.first.explain(mechanism)
        if refusal is None:
            explain = getattr(self.second, "explain", None)
            refusal = None if explain is None else explain(mechanism)
        return refusal


@dataclass
class _DatasetPointRule:
    """Picklable admissibility rule for an experiment whose plan is its point on a dataset
    ledger: the plan (with the DP test accuracy's ``Laplace(ε_t)``) would be admitted there
    as the next charge after ``prior``. Decided on a local replica of the ledger (the
    decision is a function of the charges alone, :mod:`raydp_hpo.ledger.experiments`), so
    calibrating σ asks no actor; the real charge is checked again when it is made."""

    budget: PrivacyBudget
    accountant: Accountant  # the dataset ledger's: how it prices a point
    prior: tuple[tuple[str, Mechanism], ...]
    test_epsilon: float | None
    split: DeltaSplit = LATEST_SPLIT  # the dataset ledger's δ split

    def __post_init__(self) -> None:
        self._replica: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_replica"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._replica = None

    def __call__(self, mechanism: Mechanism) -> bool:
        from raydp_hpo.accounting.mechanisms import Composition, Laplace
        from raydp_hpo.ledger.filter import PrivacyLedger

        if self._replica is None:
            replica = PrivacyLedger(self.budget, adaptivity=Adaptivity.EXPERIMENTS,
                                    accountant=self.accountant, delta_split=self.split)
            for charge_id, prior in self.prior:
                replica.charge(charge_id, prior)
            self._replica = replica
        if self.test_epsilon is not None:
            mechanism = Composition((mechanism, Laplace(self.test_epsilon)))
        return bool(self._replica.would_admit(mechanism))

    def explain(self, mechanism: Mechanism) -> Refusal | None:
        """Why the ledger refuses ``mechanism`` as its next charge: what its rule would record
        with it, and the ledger budget that would admit it (None: admitted)."""
        from raydp_hpo.accounting.mechanisms import Composition, Laplace

        if self(mechanism):
            return None
        if self.test_epsilon is not None:
            mechanism = Composition((mechanism, Laplace(self.test_epsilon)))
        after = self._replica.epsilon_if_charged(mechanism)
        k = len(self.prior) + 1
        rule = _rule_name(Adaptivity.EXPERIMENTS, self.accountant, self.budget, self.split)
        return (f"as charge {k} on the ledger (ε={self.budget.epsilon:g}, "
                f"δ={self.budget.delta:g}), {rule} would record ε={after:.4g} with this plan",
                f"A ledger budget of at least ε={_at_least(after)} would admit it; this "
                "experiment must fit what the ledger has left: ask for less ε")


@dataclass(frozen=True)
class _FirstChargeRule:
    """Picklable admissibility rule for a dedicated ledger: within the experiment's budget
    and admitted as the first charge of a fresh ledger with this halting rule, both on the
    ledger's halting accountant (:func:`_halting_accountant`)."""

    budget: PrivacyBudget
    adaptivity: Adaptivity

    def figure(self, mechanism: Mechanism) -> float:
        """ε of ``mechanism`` on the halting accountant (guides calibration; see
        :meth:`raydp_hpo.searchers.base.DPSearcher._calibrate_noise`)."""
        return epsilon(mechanism, self.budget.delta, _halting_accountant(self.adaptivity))

    def __call__(self, mechanism: Mechanism) -> bool:
        from raydp_hpo.ledger.filter import admits_as_first_charge

        accountant = _halting_accountant(self.adaptivity)
        own = self.figure(mechanism) <= self.budget.epsilon
        return own and admits_as_first_charge(
            self.budget, mechanism, adaptivity=self.adaptivity, accountant=accountant
        )

    def explain(self, mechanism: Mechanism) -> Refusal | None:
        """The figure of the rule that refuses ``mechanism`` and the smallest budget that
        passes it (None: admitted). Both checks price the plan at the budget's δ only, so any
        budget ε at least the larger figure admits it."""
        from raydp_hpo.ledger.filter import PrivacyLedger

        if self(mechanism):
            return None
        accountant = _halting_accountant(self.adaptivity)
        ledger = PrivacyLedger(self.budget, adaptivity=self.adaptivity, accountant=accountant)
        needed = max(self.figure(mechanism), ledger.epsilon_if_charged(mechanism))
        rule = _rule_name(self.adaptivity, accountant, self.budget)
        return (f"the plan needs ε={needed:.4g} at that δ under {rule}",
                f"Use a budget of at least ε={_at_least(needed)}")


@dataclass
class _SharedLedgerRule:
    """Admissibility on a shared ledger that does not compose whole experiments (an
    ``ADAPTIVE`` ledger created before issue #38, or one a user created with ``get_ledger``):
    the plan within this experiment's budget by RDP, and admitted by the ledger's own rule as
    its next charge (a plan already on it, on resume, is replayed, not added)."""

    budget: PrivacyBudget
    ledger: Any  # a LedgerHandle
    resumed: bool

    def _own(self, mechanism: Mechanism) -> float:
        return epsilon(mechanism, self.budget.delta, Accountant.RDP)

    def __call__(self, mechanism: Mechanism) -> bool:
        own = self._own(mechanism) <= self.budget.epsilon
        return own and (self.resumed or bool(self.ledger.would_admit(mechanism)))

    def explain(self, mechanism: Mechanism) -> Refusal | None:
        if self(mechanism):
            return None
        own = self._own(mechanism)
        if own > self.budget.epsilon:
            return (f"the plan needs ε={own:.4g} at that δ (RDP accountant, this experiment's "
                    "own budget)", f"Use a budget of at least ε={_at_least(own)}")
        report = self.ledger.report()
        after = self.ledger.epsilon_if_charged(mechanism)
        rule = _rule_name(report.adaptivity, report.halting_accountant, report.budget,
                          None if report.delta_split is None else DeltaSplit(report.delta_split))
        return (f"the shared ledger {self.ledger.name!r} (ε={report.budget.epsilon:g}, "
                f"δ={report.budget.delta:g}, spent ε={report.spent_epsilon:.4f}) halts on {rule}, "
                f"which gives ε={after:.4g} with this plan",
                f"A ledger budget of at least ε={_at_least(after)} would admit it")


def plan_charged_up_front(search: Any) -> bool | None:
    """Whether the search charges a plan before its trials (its trials are covered by it,
    not charged one by one); ``None`` when only :meth:`DPTuner.fit` can tell."""
    from raydp_hpo.searchers import DPSearcher, SearchAlgorithm

    if isinstance(search, DPSearcher):
        if not search.has_space:
            return None
        return search.privacy_plan().mechanism is not None
    return search is not SearchAlgorithm.GRID_COMPOSED  # an enum since __init__


def refuse_retries_under_a_plan(max_failures: int, plan_charged: bool | None) -> None:
    """Refuse ``max_failures > 0`` for a search whose trials one plan charge covers."""
    if plan_charged:
        raise InvalidParameterError(
            f"max_failures={max_failures} is refused for a search whose trials are "
            "covered by one plan charge: the plan paid for each covered trial once, and a "
            "trial retried from scratch would run its mechanism again unpaid. Use "
            "max_failures=0, or search='grid_composed', whose trials charge themselves "
            "(every retry from scratch pays again under a new attempt id)"
        )


def dedicated_adaptivity(search: Any, max_failures: int) -> Adaptivity:
    """FIXED_PLAN only for the built-in searchers: their charges are fixed from the
    configuration alone (one plan charge, or grid trials drawn without data), so standard
    composition justifies halting. Any other searcher may adapt charges to results: the
    adaptive RDP filter then. So does ``max_failures > 0``: a retry's charge (and a resumed
    trial's charge for the steps it reruns) exists only because a trial failed, which may
    depend on its outputs, and only the RDP filter is valid for charges chosen that way
    (Feldman & Zrnic 2021); the searcher then calibrates on RDP too."""
    import raydp_hpo.searchers

    if max_failures > 0:
        return Adaptivity.ADAPTIVE

    builtin = (
        raydp_hpo.searchers.RandomStoppingSearch,
        raydp_hpo.searchers.SubsampledTransferSearch,
        raydp_hpo.searchers.SVTThresholdSearch,
        raydp_hpo.searchers.LinearScalingSearch,
        raydp_hpo.searchers.OneShotRandomSearch,
        raydp_hpo.searchers.GridSearchComposed,
    )
    if isinstance(search, raydp_hpo.searchers.DPSearcher) and type(search) not in builtin:
        return Adaptivity.ADAPTIVE
    return Adaptivity.FIXED_PLAN


def say_if_adaptive_filter(shared: LedgerHandle, say: Callable[[str], None]) -> None:
    """Tell the user (``say``) when the shared ledger ``shared`` halts on the adaptive RDP
    filter: every charge of the experiment is then priced by it, not at the tightest figure
    a ledger composing whole experiments would use."""
    if shared.settings()["adaptivity"] != Adaptivity.ADAPTIVE.value:
        return
    say(f"[raydp-hpo] the shared ledger {shared.name!r} halts on the adaptive RDP "
        "filter (the rule it was created with): this experiment's charges are priced "
        "by it. A ledger that composes whole experiments prices a plan at its tightest "
        "figure instead (raydp-hpo run creates one; in Python get_ledger(..., "
        "adaptivity=Adaptivity.EXPERIMENTS, accountant=Accountant.TIGHTEST))")


def say_if_name_used(shared: LedgerHandle | None, experiment: str, run_id: str | None,
                     progress: Callable[[str], None] | None, log: logging.Logger) -> None:
    """A new run under an experiment name that another run already charged on ``shared``
    pays again (its charges carry its own run id): said on the progress line and the log,
    with the other choice (resuming that run, from its own experiment directory)."""
    if shared is None:
        return
    others = other_runs(shared.charges(), experiment, run_id)
    if not others:
        return
    line = (f"[raydp-hpo] experiment {experiment!r} was already run on the ledger "
            f"{shared.name!r} ({', '.join(others)}); this is a new run (id {run_id})"
            " and pays again. To continue an interrupted run instead, resume it from its "
            "own experiment directory (DPTuner.restore, raydp-hpo run --resume)")
    log.warning(line)
    if progress is not None:
        progress(line)
