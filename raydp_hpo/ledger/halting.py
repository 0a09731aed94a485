"""The ledger's halting rules: when a privacy filter may stop, with each rule's theorem.

One concern: the ε figure each halting rule (:class:`~raydp_hpo.ledger.records.Adaptivity`)
halts on and why it is an upper bound. :class:`~raydp_hpo.ledger.filter.PrivacyLedger` admits a
charge iff the figure of its rule, for every charge so far plus the candidate, stays within the
budget (check, then commit).

Halting rules (:class:`Adaptivity`):

``ADAPTIVE`` (default) — an RDP privacy filter valid when each charge's mechanism is chosen
adaptively from earlier outputs. Feldman & Zrnic (2021, "Individual Privacy Accounting via a
Rényi Filter", Thm. 3.1) prove that for a *fixed* order α, halting before Σₜ εₜ(α) exceeds B
yields (α, B)-RDP under fully adaptive composition. Choosing the best α afterwards is not
covered by that theorem, so this filter uses a union bound over the finite halting grid
Λ = :data:`HALTING_ORDERS`: each α ∈ Λ gets δ/|Λ|, and a charge is admitted iff

    ε_filter = min_{α∈Λ} [ Σₜ εₜ(α) + log(1 − 1/α) − log(α·δ/|Λ|)/(α − 1) ] ≤ ε_budget

(conversion of Canonne, Kamath & Steinke 2020, Prop. 12). Proof sketch: partition outcomes by
the first α ∈ Λ whose budget was never exceeded on that run; on that part the ledger behaves
exactly like the fixed-α Feldman–Zrnic filter, which is (ε, δ/|Λ|)-DP; summing over the
partition gives (ε, δ)-DP. A charge is also admitted when basic composition of pure-DP charges
stays within ε (a valid filter for pure DP, Rogers et al. 2016); the same partition argument
covers "either rule admits" (the pure part adds δ = 0), since both running totals only grow. This costs ≈ log|Λ|/(α − 1) in ε against a fixed-sequence
analysis — the conservative choice; the report states both figures.
(ε, δ)-only mechanisms (:class:`~raydp_hpo.accounting.mechanisms.ApproxDP`) are refused in this mode.

``EXPERIMENTS`` — a ledger that composes whole experiments (a dataset's own, a named or
PostgreSQL ledger that ``raydp-hpo run`` creates): each charge is a whole experiment, chosen
adaptively; a charge is admitted when either the RDP filter at δ_A or basic composition of
(εₖ, δₖ) points (each experiment's tightest figure at its δ share) admits it, a valid filter
under fully adaptive (and concurrent) composition. The δ split is the ledger's
:class:`~raydp_hpo.ledger.experiments.DeltaSplit`, stored in its header (``delta_split``;
absent: the split of ledgers created before it, ``HALVES``). The rule, its theorem, its
proof and which charge it prices how are in :mod:`raydp_hpo.ledger.experiments`.

``FIXED_PLAN`` — the caller asserts that the sequence of mechanisms is fixed before any data
is touched (e.g. a whole search plan admitted in one charge). Then standard composition
theorems apply and any :class:`~raydp_hpo.accounting.Accountant` may halt, PLD included.
``PROFILE`` halts on the minimum of three figures for all charges plus the candidate: the RDP
composition, the PLD composition and the composition in which every random stopping is
accounted by privacy profiles (:func:`raydp_hpo.accounting.profiles.profile_epsilon`: each selection
enters as one (εᵢ, δᵢ) point at an explicit δ split, composed as the PLD of its dominating
pair). Validity: the admission decision depends on the mechanisms only, never on data or on
outputs, so the admitted charges are a fixed, data-independent sequence M₁, …, M_k; each of
the three figures is an upper bound on ε at the budget's δ for that fixed composition (RDP:
Mironov 2017, Prop. 1 with Canonne, Kamath & Steinke 2020, Prop. 12; PLD: dp-accounting's
pessimistic composition; profiles: :mod:`raydp_hpo.accounting.profiles`' theorem with the dominating
pairs of Kairouz, Oh & Viswanath 2015, Thm. 2.1), so their minimum is one, and the ledger
admits only while it is within budget. ``PROFILE`` is refused with ``ADAPTIVE``: the δ split
gives δᵢ = s·δ/n to each of the n selections of the *whole* sequence, which is not known
while charges are still being chosen from earlier outputs, and no filter theorem (as
Feldman & Zrnic's for RDP) covers halting on a PLD or profile figure under adaptivity.
"""

from __future__ import annotations

import math

import numpy as np

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, RdpProfile
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.records import Adaptivity

__all__ = ["HALTING_ORDERS", "filter_epsilon", "tightest_halting_accountant"]

#: Orders of the adaptive RDP filter's union bound (each gets δ/|Λ|).
HALTING_ORDERS: tuple[float, ...] = (
    1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 48, 64, 96, 128, 256,
    512, 1024,
)
_HALT_INDEX = np.array([int(np.argmin(np.abs(DEFAULT_ORDERS - a))) for a in HALTING_ORDERS])
assert np.allclose(DEFAULT_ORDERS[_HALT_INDEX], HALTING_ORDERS)


def filter_epsilon(profile: RdpProfile, delta: float) -> float:
    """ε guaranteed by the adaptive RDP filter (union bound over :data:`HALTING_ORDERS`)."""
    if profile.side_delta > 0 or profile.side_epsilon > 0:
        return math.inf
    alphas = DEFAULT_ORDERS[_HALT_INDEX]
    rdp = profile.values[_HALT_INDEX]
    delta_each = delta / len(HALTING_ORDERS)
    with np.errstate(invalid="ignore"):
        eps = rdp + np.log1p(-1.0 / alphas) - np.log(delta_each * alphas) / (alphas - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    return float(max(0.0, np.min(eps)))


def tightest_halting_accountant(adaptivity: Adaptivity) -> Accountant:
    """The tightest accountant a ledger with this halting rule may halt on.

    ``FIXED_PLAN``: :attr:`Accountant.PROFILE`, the minimum of the RDP, PLD and privacy-profile
    figures (each valid for the fixed sequence the plan is; see the module docstring).
    ``ADAPTIVE``: :attr:`Accountant.RDP`, the only one with a filter theorem (Feldman & Zrnic
    2021). ``EXPERIMENTS``: :attr:`Accountant.TIGHTEST` prices each charge's own (εₖ, δₖ)
    point (one fixed mechanism); the halting rule is the RDP filter at its δ share or basic
    composition of the points. Searchers calibrate on the same accountant the ledger then
    halts on, so the σ they calibrate is exactly what the ledger admits.
    """
    if not isinstance(adaptivity, Adaptivity):
        raise InvalidParameterError(f"adaptivity must be an Adaptivity, got {adaptivity!r}")
    return Accountant.RDP if adaptivity is Adaptivity.ADAPTIVE else Accountant.TIGHTEST
