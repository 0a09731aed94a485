"""A dataset's ledger composes whole experiments: the RDP filter or basic composition of points.

Every experiment on a dataset (a search and its release, from ``DPTuner`` or ``raydp-hpo
run``) may be chosen after earlier experiments' releases were seen, so the rule that halts a
dataset's ledger must be a valid *privacy filter* under fully adaptive composition. A filter
that halts on the composed PLD or privacy profile is not valid in general (Honkela, Koskela,
Tran & Räisä 2026, arXiv 2602.06756). The
adaptive RDP filter is (Feldman & Zrnic 2021), but it prices every experiment by RDP and a
union bound over orders: one experiment on a dataset ledger paid 20-44 % of its budget for
no guarantee (issue #30). Basic composition of each experiment's tightest figure wastes nothing
on one experiment but adds ε linearly over many, where RDP composes sub-additively. This
ledger therefore admits a charge when **either** of two valid filters admits it, each with
half of δ:

**Rule** (:attr:`~raydp_hpo.ledger.records.Adaptivity.EXPERIMENTS`). Let the k-th charge
admitted (k = 1, 2, …) be the mechanism Mₖ (a whole experiment's plan, or an explicit
``ApproxDP(ε, δ)`` reservation of an experiment that runs its own filter inside it).

* (A) the adaptive RDP filter of :func:`~raydp_hpo.ledger.filter.filter_epsilon` at δ/2:
  ε_A = min over the halting orders of the converted Σ RDP curves, union bound over the
  orders (Feldman & Zrnic 2021, Thm. 3.1; Canonne, Kamath & Steinke 2020, Prop. 12);
  ``ApproxDP`` has no RDP curve, so once one is charged (A) is exceeded for good;
* (B) basic composition of points: Mₖ gets the δ share δ_k = (δ/2)·6/(π²k²)
  (Σ_k δ_k = δ/2) and is charged as (εₖ, δₖ), εₖ = ε(Mₖ, δ_k) under the ledger's
  fixed-composition accountant (the tightest valid figure for Mₖ alone: an experiment's plan
  is fixed before it touches data), or its own (ε, δ) for an ``ApproxDP`` (refused if that
  δ exceeds δ_k); ε_B = Σ εᵢ.

The ledger admits Mₖ iff min(ε_A, ε_B) ≤ ε with Mₖ included, and reports min(ε_A, ε_B) as
spent.

**Theorem** (validity). Let an analyst choose, adaptively from the public configuration and
all earlier outputs, each next mechanism Mₖ (DP for the (εₖ, δₖ) point above, interactive or
not), run only if the rule admits it. Then the whole interaction is (ε, δ)-DP for add/remove-
one neighbours.

*Proof.* Each filter alone is valid: (A) with δ/2 by Feldman & Zrnic's fixed-order filter
and a union bound over the finite grid of orders (module docstring of
:mod:`raydp_hpo.ledger.filter`); (B) with Σ δ_k ≤ δ/2 is the basic-composition filter
COMP_{ε,δ/2} of Rogers, Roth, Ullman & Vadhan (2016, "Privacy Odometers and Filters:
Pay-as-you-Go Composition", Sec. 3), valid for adaptively chosen (εₖ, δₖ) (restated by
Whitehouse, Ramdas, Rogers & Wu 2023, "Fully-Adaptive Composition in Differential
Privacy"); here (εₖ, δₖ) is a function of Mₖ and k, both chosen adaptively. For "either
admits": both running totals only grow and are functions of the transcript (the sequence
of mechanisms is). Split the transcripts into T_A, where ε_A never exceeded ε, and its
complement. On T_A every admission was also (A)'s, so the run is exactly a run of the
(A)-filtered interaction with the same analyst; on the complement, (A) was exceeded at some
step and stayed exceeded, so every later admission was (B)'s, and since ε_B only grows and
ended ≤ ε, (B) admitted every step: the run is exactly a run of the (B)-filtered
interaction. Hence for any set S of transcripts and neighbours D, D',
P_D[S] = P_D[S ∩ T_A] + P_D[S − T_A]
       ≤ (e^ε P_D'[S ∩ T_A] + δ/2) + (e^ε P_D'[S − T_A] + δ/2) = e^ε P_D'[S] + δ.
Experiments are interactive and may run at once; Haney, Shoemate, Tian, Vadhan, Vyrros, Xu
& Zhang (2023, "Concurrent Composition for Interactive Differential Privacy with Adaptive
Privacy-Loss Parameters") prove that every valid filter for non-interactive mechanisms stays
valid for the concurrent composition of interactive mechanisms, under (ε, δ)-DP and RDP of a
fixed order. That each experiment is DP at its point is its own guarantee: a plan fixed
before data (the tightest fixed-plan figure at δₖ), or an experiment that runs its own
filter within the (ε, δ) it reserved. ∎

**Cost.** One experiment pays its own tightest figure at δ_1 = 0.30δ (a few percent above
its figure at δ) where the RDP filter's union bound cost 20-44 %; many small experiments
are admitted by (A) at δ/2 instead of adding up (``benchmarks/dataset_ledger.py`` measures
both).
"""

from __future__ import annotations

import math

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism
from raydp_hpo.errors import InvalidParameterError

__all__ = ["experiment_delta", "experiment_point", "filter_delta"]

_SHARE = 3.0 / math.pi**2  # (1/2)·6/π²


def filter_delta(total_delta: float) -> float:
    """The δ of rule (A), the RDP filter: half of the ledger's δ."""
    return total_delta / 2.0


def experiment_delta(total_delta: float, k: int) -> float:
    """δ_k = (δ/2)·6/(π²k²): the δ share of the k-th charge (k ≥ 1) under rule (B)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidParameterError(f"k must be an int >= 1, got {k!r}")
    return total_delta * _SHARE / (k * k)


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
