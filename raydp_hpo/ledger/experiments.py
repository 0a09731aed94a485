"""A dataset's ledger composes whole experiments: one (εᵢ, δᵢ) point each, basic composition.

Every experiment on a dataset (a search and its release, from ``DPTuner`` or ``raydp-hpo
run``) may be chosen after earlier experiments' releases were seen, so the rule that halts a
dataset's ledger must be a valid *privacy filter* under fully adaptive composition. A filter
that halts on the composed PLD or privacy profile is not valid in general (Honkela, Koskela,
Tran & Räisä 2026, arXiv 2602.06756). The
adaptive RDP filter is (Feldman & Zrnic 2021), but it prices every experiment by RDP and a
union bound over orders: 20-44 % of a dataset's budget bought no guarantee
(issue #30). This ledger instead halts by **basic composition of (εᵢ, δᵢ) points**:

**Rule** (:attr:`~raydp_hpo.ledger.records.Adaptivity.EXPERIMENTS`). The k-th charge admitted
on the ledger (k = 1, 2, …) is given the δ share

    δ_k = δ · 6 / (π² k²)            (Σ_k δ_k = δ · (6/π²) · Σ_k 1/k² = δ)

and its mechanism Mₖ is charged as the point (εₖ, δₖ) with εₖ = ε(Mₖ, δ_k) under the
ledger's fixed-composition accountant (the tightest valid figure for Mₖ alone: an
experiment's plan is fixed before it touches data); an explicit ``ApproxDP(ε, δ)`` charge
(an experiment's reservation) is its own point, and is refused if its δ exceeds δ_k. The
ledger admits Mₖ iff Σ_{i≤k} εᵢ ≤ ε (and so Σ_{i≤k} δᵢ ≤ δ always).

**Theorem** (validity). Let the analyst choose, adaptively from the public configuration
and all earlier outputs, the k-th mechanism Mₖ (any (εₖ, δₖ)-DP mechanism, interactive or
not) together with its point, and let the ledger run Mₖ only if the rule admits it. Then the
whole interaction is (ε, δ)-DP for add/remove-one neighbours.

*Proof.* The rule is the basic-composition privacy filter COMP_{ε,δ} of Rogers, Roth, Ullman
& Vadhan (2016, "Privacy Odometers and Filters: Pay-as-you-Go Composition", Sec. 3: halt
before Σ εᵢ > ε or Σ δᵢ > δ), which they prove valid for adaptively chosen parameters;
Whitehouse, Ramdas, Rogers & Wu (2023, "Fully-Adaptive Composition in Differential
Privacy") restate it within their martingale framework. Here the parameters (εₖ, δₖ) are a
function of Mₖ and k alone, both chosen adaptively, which the filter allows. Each
experiment is an interactive mechanism and several may run at once on one ledger; Haney,
Shoemate, Tian, Vadhan, Vyrros, Xu & Zhang (2023, "Concurrent Composition for Interactive
Differential Privacy with Adaptive Privacy-Loss Parameters") prove that every valid filter
for non-interactive mechanisms stays valid for the concurrent composition of interactive
mechanisms under (ε, δ)-DP. That each experiment is (εₖ, δₖ)-DP is its own guarantee: a
plan fixed before data (the tightest fixed-plan figure at δₖ), or an experiment that runs
its own filter within the point it reserved. ∎

**Cost.** Each experiment pays its own tightest figure at a smaller δ (the first at 0.61δ,
the second at 0.15δ, the tenth at 0.006δ) instead of an RDP figure with a union bound over
24 orders; an experiment's ε grows roughly like √log(1/δₖ), a few percent
(``benchmarks/dataset_ledger.py`` measures both rules).
"""

from __future__ import annotations

import math

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.mechanisms import ApproxDP, Mechanism
from raydp_hpo.errors import InvalidParameterError

__all__ = ["experiment_delta", "experiment_point", "DELTA_SHARE_RULE"]

#: The stated rule for how a dataset ledger shares its δ among future experiments.
DELTA_SHARE_RULE = "δ_k = δ·6/(π²k²) for the k-th charge (Σ_k δ_k = δ)"

_SHARE = 6.0 / math.pi**2


def experiment_delta(total_delta: float, k: int) -> float:
    """δ_k = δ·6/(π²k²): the δ share of the k-th charge (k ≥ 1) on a dataset ledger."""
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
