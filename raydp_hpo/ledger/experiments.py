"""A ledger that composes whole experiments: the RDP filter or basic composition of points.

Every experiment on a ledger (a search and its release, from ``DPTuner`` or ``raydp-hpo
run``: a dataset's own ledger, a ledger named in an experiment file, a PostgreSQL ledger)
may be chosen after earlier experiments' releases were seen, so the rule that halts it must
be a valid *privacy filter* under fully adaptive composition. A filter that halts on the
composed PLD or privacy profile is not valid in general (Honkela, Koskela, Tran & Räisä 2026,
arXiv 2602.06756). The adaptive RDP filter is (Feldman & Zrnic 2021), but it prices every
experiment by RDP and a union bound over orders: one experiment paid 20-44 % of its budget
for no guarantee (issues #30, #38). Basic composition of each experiment's tightest figure
wastes nothing on one experiment but adds ε linearly over many, where RDP composes
sub-additively. This ledger therefore admits a charge when **either** of two valid filters
admits it, δ split between them by the ledger's :class:`DeltaSplit` (stored in its header:
a ledger keeps the split it was created with).

**Rule** (:attr:`~raydp_hpo.ledger.records.Adaptivity.EXPERIMENTS`). Let the k-th charge
admitted (k = 1, 2, …) be the mechanism Mₖ (a whole experiment's plan, an explicit
``ApproxDP(ε, δ)`` reservation of an experiment that runs its own filter inside it, or any
other charge), and let the split give rule (A) δ_A and rule (B) the shares δ₁, δ₂, … with
δ_A + Σₖ δₖ ≤ δ:

* (A) the adaptive RDP filter of :func:`~raydp_hpo.ledger.filter.filter_epsilon` at δ_A:
  ε_A = min over the halting orders of the converted Σ RDP curves, union bound over the
  orders (Feldman & Zrnic 2021, Thm. 3.1; Canonne, Kamath & Steinke 2020, Prop. 12);
  ``ApproxDP`` has no RDP curve, so once one is charged (A) is exceeded for good;
* (B) basic composition of points: Mₖ is charged as (εₖ, δₖ), εₖ = ε(Mₖ, δₖ) under the
  ledger's fixed-composition accountant (the tightest valid figure for Mₖ alone: an
  experiment's plan is fixed before it touches data), or its own (ε, δ) for an ``ApproxDP``
  (refused if that δ exceeds δₖ); ε_B = Σ εᵢ.

The ledger admits Mₖ iff min(ε_A, ε_B) ≤ ε with Mₖ included, and reports min(ε_A, ε_B) as
spent.

**The splits.**

* :attr:`DeltaSplit.FIRST_HEAVY` (ledgers created from issue #38 on): δ_A = 0.21·δ,
  δ₁ = 0.78·δ, and δₖ = 0.01·δ·6/(π²(k−1)²) for k ≥ 2 (Σ = δ). The first experiment is priced
  at 0.78·δ, within 3 % of its ε at the whole δ for the built-in searches (measured through
  ``raydp-hpo run`` on digits at ε = 3: 2.4 % for one-shot DP-SGD, 2.0 % for random stopping
  of mean 2; the loss shrinks as a mechanism gets closer to a Gaussian). Rule (A) keeps
  0.21·δ: ``benchmarks/dataset_ledger.py``'s sequences record less than under the halves
  split (2 × ε 1.5: 2.9935 against 2.997; 5 × ε 0.6: 2.1804 against 2.203). That is measured,
  not a theorem for every sequence: a model computation (one-shot and random-stopping DP-SGD
  plans, q = 0.05, 20 steps, each calibrated to its point) finds three experiments of ε = 1
  starting with a one-shot run recording about 2 % more (2.48 against 2.42), since the first
  is calibrated with less noise at 0.78·δ and (A) has less δ. The cost falls on experiments
  k ≥ 2: their points get small δ shares (δ₂ = 0.0061·δ against 0.076·δ), so one that only
  (B) admits is calibrated to its point with more noise than under the halves split.
* :attr:`DeltaSplit.HALVES` (ledgers created before issue #38: a header without
  ``delta_split``): δ_A = δ/2 and δₖ = (δ/2)·6/(π²k²) (Σ = δ/2).

**Theorem** (validity). Let an analyst choose, adaptively from the public configuration and
all earlier outputs, each next mechanism Mₖ (DP for the (εₖ, δₖ) point above, interactive or
not), run only if the rule admits it. Then the whole interaction is (ε, δ)-DP for add/remove-
one neighbours.

*Proof.* Each filter alone is valid: (A) with δ_A by Feldman & Zrnic's fixed-order filter
and a union bound over the finite grid of orders (module docstring of
:mod:`raydp_hpo.ledger.filter`); (B) with Σ δₖ ≤ δ_B := δ − δ_A is the basic-composition
filter COMP_{ε,δ_B} of Rogers, Roth, Ullman & Vadhan (2016, "Privacy Odometers and Filters:
Pay-as-you-Go Composition", Sec. 3), valid for adaptively chosen (εₖ, δₖ) (restated by
Whitehouse, Ramdas, Rogers & Wu 2023, "Fully-Adaptive Composition in Differential
Privacy"); here (εₖ, δₖ) is a function of Mₖ and k, both chosen adaptively, and every
path's δ total is at most Σₖ δₖ ≤ δ_B whatever the number of charges. For "either admits":
both running totals only grow and are functions of the transcript (the sequence of
mechanisms is). Split the transcripts into T_A, where ε_A never exceeded ε, and its
complement. On T_A every admission was also (A)'s, so the run is exactly a run of the
(A)-filtered interaction with the same analyst; on the complement, (A) was exceeded at some
step and stayed exceeded, so every later admission was (B)'s, and since ε_B only grows and
ended ≤ ε, (B) admitted every step: the run is exactly a run of the (B)-filtered
interaction. Hence for any set S of transcripts and neighbours D, D',
P_D[S] = P_D[S ∩ T_A] + P_D[S − T_A]
       ≤ (e^ε P_D'[S ∩ T_A] + δ_A) + (e^ε P_D'[S − T_A] + δ_B) = e^ε P_D'[S] + δ.
The split is a constant of the ledger (fixed in its header before any charge), so it is
not chosen from outputs. Experiments are interactive and may run at once; Haney, Shoemate,
Tian, Vadhan, Vyrros, Xu & Zhang (2023, "Concurrent Composition for Interactive Differential
Privacy with Adaptive Privacy-Loss Parameters") prove that every valid filter for
non-interactive mechanisms stays valid for the concurrent composition of interactive
mechanisms, under (ε, δ)-DP and RDP of a fixed order. That each experiment is DP at its
point is its own guarantee: a plan fixed before data (the tightest fixed-plan figure at δₖ),
or an experiment that runs its own filter within the (ε, δ) it reserved. ∎

**Which rule prices which charge** (one place; the docs' concepts page on ledgers repeats
it). Every ledger that receives whole experiments halts with this rule: a dataset's own
ledger, a ledger named in an experiment file (``ledger: {name: …}``, a journal file) and a
PostgreSQL ledger (``ledger: {name: …, uri: postgresql://…}``), when created by
``raydp-hpo run`` or ``DPTuner``'s dataset path. Per kind of charge:

* an experiment whose plan is fixed up front (every built-in searcher without retries): its
  plan is its point, priced by its tightest fixed-plan figure (PROFILE: min of RDP, PLD and
  privacy profiles; standard composition of a fixed sequence) at δₖ under (B), and by its
  RDP curve under (A); this theorem;
* an experiment whose trials charge themselves, retry, or come from a searcher of the
  user's: an ``ApproxDP(ε, δₖ)`` reservation, admitted by (B) only; inside it the
  experiment's own ledger halts on the adaptive RDP filter (Feldman & Zrnic 2021) at the
  reservation's (ε, δₖ);
* any other charge (a user's own trainable charging per trial, a script calling
  ``try_charge``): the same rule applies and stays valid (the theorem allows any Mₖ), but each
  such charge takes the next δ share, so in practice (A), the RDP filter at δ_A, admits them;
* a ledger created before (the adaptive RDP filter at the whole δ, ``Adaptivity.ADAPTIVE``)
  keeps the rule its header states, and a ledger with ``EXPERIMENTS`` and no ``delta_split``
  in its header keeps :attr:`DeltaSplit.HALVES`.

**Cost.** One experiment pays its own tightest figure at δ₁ = 0.78·δ (2-2.5 % above its
figure at δ) where the RDP filter's union bound cost 20-44 % and the halves split's
δ₁ = 0.30·δ cost 9-10 %; many small experiments are admitted by (A) at 0.21·δ
(``benchmarks/dataset_ledger.py`` measures both; results in
``benchmarks/results/dataset_ledger/summary.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism
from raydp_hpo.errors import InvalidParameterError, LedgerMismatchError

__all__ = ["DeltaSplit", "LATEST_SPLIT", "experiment_delta", "experiment_point", "filter_delta",
           "split_of_header"]

_BASEL = 6.0 / math.pi**2  # Σ_{k≥1} 1/k² = π²/6


class DeltaSplit(Enum):
    """How an ``EXPERIMENTS`` ledger splits its δ between rule (A) and the points of rule (B)
    (see the module docstring; a ledger keeps the split stored in its header for life)."""

    #: before issue #38: δ_A = δ/2, δₖ = (δ/2)·6/(π²k²)
    HALVES = "halves"
    #: from issue #38: δ_A = 0.21δ, δ₁ = 0.78δ, δₖ = 0.01δ·6/(π²(k−1)²) for k ≥ 2
    FIRST_HEAVY = "first-heavy"


#: The split of a new ledger.
LATEST_SPLIT = DeltaSplit.FIRST_HEAVY

_FIRST_HEAVY_A, _FIRST_HEAVY_1 = 0.21, 0.78
_FIRST_HEAVY_TAIL = 0.01  # δ_A + δ₁ + tail = δ; the tail's partial sums stay below it


def _check_split(split: DeltaSplit) -> DeltaSplit:
    if not isinstance(split, DeltaSplit):
        raise InvalidParameterError(f"split must be a DeltaSplit, got {split!r}")
    return split


def split_of_header(header: Mapping[str, Any]) -> DeltaSplit:
    """The δ split an ``EXPERIMENTS`` ledger's header states; a header from before the split
    was stored (no ``delta_split``) is :attr:`DeltaSplit.HALVES`, the split those ledgers
    admitted under. A value this version does not know (a ledger written by a newer one)
    raises :class:`~raydp_hpo.errors.LedgerMismatchError`: its rule cannot be applied here."""
    value = header.get("delta_split", DeltaSplit.HALVES.value)
    try:
        return DeltaSplit(value)
    except ValueError:
        raise LedgerMismatchError(
            f"the ledger's header states delta_split={value!r}, which this version of raydp-hpo "
            f"does not know (it knows {[s.value for s in DeltaSplit]}); open it with the "
            "version that created it"
        ) from None


def filter_delta(total_delta: float, split: DeltaSplit = LATEST_SPLIT) -> float:
    """δ_A: the δ of rule (A), the RDP filter."""
    if _check_split(split) is DeltaSplit.HALVES:
        return total_delta / 2.0
    return total_delta * _FIRST_HEAVY_A


def experiment_delta(total_delta: float, k: int, split: DeltaSplit = LATEST_SPLIT) -> float:
    """δₖ: the δ share of the k-th charge (k ≥ 1) under rule (B)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidParameterError(f"k must be an int >= 1, got {k!r}")
    if _check_split(split) is DeltaSplit.HALVES:
        return total_delta * 0.5 * _BASEL / (k * k)
    if k == 1:
        return total_delta * _FIRST_HEAVY_1
    return total_delta * _FIRST_HEAVY_TAIL * _BASEL / ((k - 1) * (k - 1))


def experiment_point(mechanism: Mechanism, delta_share: float,
                     accountant: Accountant) -> tuple[float, float]:
    """The (εₖ, δₖ) point a dataset ledger charges for ``mechanism`` in a slot of
    ``delta_share``: an ``ApproxDP`` is its own point (``count`` copies by basic
    composition); any other mechanism is ``(ε(M, delta_share), delta_share)`` under
    ``accountant`` (a fixed-composition figure: M is one fixed mechanism)."""
    if isinstance(mechanism, ApproxDP):
        return mechanism.epsilon * mechanism.count, mechanism.delta * mechanism.count
    from raydp_hpo.accounting.accountants import epsilon

    return epsilon(mechanism, delta_share, accountant), delta_share
