"""Checking the RDP curves a journal stores against what the current code computes.

One concern: a reopened ledger sums the curves its journal stores instead of recomputing every
mechanism's, and this module checks (lazily) that each stored curve is not below what the
current code gives for its mechanism.

Restart: each journal record stores the charge's RDP curve on :data:`DEFAULT_ORDERS`
(float64, covered by the record's chain hash), so opening a journal sums stored curves instead
of recomputing every mechanism's (62 s for 10,000 distinct DP-SGD charges before; see
``benchmarks/ledger.py``). A stored curve is what was charged when the record was admitted;
that it is also what the current code gives for the mechanism is checked lazily
(:class:`CurveCheck`): a few records at open, the rest in a background thread or on
:meth:`PrivacyLedger.verify_stored_curves`. A curve the current code finds larger is folded in
on top (the spend only ever goes up) with a warning. A journal written on another order grid,
or a version-1 journal, is replayed by recomputing every curve.
"""

from __future__ import annotations

import base64
import hashlib
import random
import threading
import warnings
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, RdpProfile, rdp_profile
from raydp_hpo.errors import RayDPHPOError

if TYPE_CHECKING:
    from raydp_hpo.ledger.filter import PrivacyLedger

__all__ = ["ORDERS_FINGERPRINT", "CurveCheck", "verify_pending_sync", "start_curve_check"]

#: Identifies :data:`DEFAULT_ORDERS` in a journal header: stored curves are used only on it.
ORDERS_FINGERPRINT = hashlib.sha256(np.asarray(DEFAULT_ORDERS, dtype="<f8").tobytes()).hexdigest()[
    :16
]
_SPOT_CHECKS = 4  # stored curves recomputed at open, before the ledger answers
_CURVE_RTOL = 1e-9  # a recomputed curve above stored·(1 + rtol) + rtol is a mismatch


class CurveCheck(Enum):
    """How a reopened ledger checks the RDP curves stored in its journal.

    ``BACKGROUND`` (default): a few records are recomputed at open (the last of each
    mechanism type and a random sample), the rest by a background thread; admission starts at
    once. ``EAGER``: every record is recomputed before the constructor returns, and a PLD
    snapshot is not used (the PLD is rebuilt from the charges; slow, strict).
    ``ON_DEMAND``: the spot checks only; the rest when
    :meth:`PrivacyLedger.verify_stored_curves` is called (short-lived readers, benchmarks).
    """

    BACKGROUND = "background"
    EAGER = "eager"
    ON_DEMAND = "on_demand"


def _encode_profile(profile: RdpProfile) -> dict[str, Any]:
    return {
        "orders": ORDERS_FINGERPRINT,
        "f64le": base64.b64encode(np.asarray(profile.values, dtype="<f8").tobytes()).decode(),
        "side_epsilon": profile.side_epsilon,
        "side_delta": profile.side_delta,
    }


_Curve = tuple[np.ndarray, float, float]  # RDP values on DEFAULT_ORDERS, side ε, side δ


def _decode_curve(data: dict[str, Any]) -> _Curve:
    """A stored curve (checked: right length, no NaN, nothing negative), without copying."""
    values = np.frombuffer(base64.b64decode(data["f64le"], validate=True), dtype="<f8")
    side_eps, side_delta = float(data["side_epsilon"]), float(data["side_delta"])
    if values.shape != DEFAULT_ORDERS.shape or not values.min() >= 0:  # min is NaN if any is
        raise ValueError(
            f"stored RDP curve has {values.size} values (want {DEFAULT_ORDERS.size}), some NaN "
            "or negative"
        )
    if not (side_eps >= 0 and 0 <= side_delta <= 1):
        raise ValueError(f"stored side (ε, δ) = ({side_eps}, {side_delta}) is invalid")
    return values, side_eps, side_delta


def _excess(recomputed: RdpProfile, stored: RdpProfile) -> RdpProfile | None:
    """What ``recomputed`` has above ``stored`` (beyond rounding), or None if nothing."""
    with np.errstate(invalid="ignore"):
        over = recomputed.values - stored.values
        over = np.where(np.isnan(over), 0.0, over)  # inf - inf: equal
    tol = _CURVE_RTOL * (1.0 + np.abs(np.where(np.isinf(stored.values), 0.0, stored.values)))
    d_eps = recomputed.side_epsilon - stored.side_epsilon
    d_delta = recomputed.side_delta - stored.side_delta
    if not (over > tol).any() and d_eps <= _CURVE_RTOL and d_delta <= 1e-300:
        return None
    return RdpProfile(np.maximum(over, 0.0), max(d_eps, 0.0), max(d_delta, 0.0))


def start_curve_check(ledger: PrivacyLedger) -> None:
    if not ledger._unverified:
        return
    if ledger._curve_check is CurveCheck.EAGER:
        ledger.verify_stored_curves()
        return
    by_type: dict[type, int] = {}
    for i in ledger._unverified:
        by_type[type(ledger._charges[i].mechanism)] = i  # the last of each type
    picks = set(by_type.values())
    rest = [i for i in ledger._unverified if i not in picks]
    picks.update(random.sample(rest, min(len(rest), max(0, _SPOT_CHECKS - len(picks)))))
    for i in sorted(picks):
        verify_one(ledger, i)
    if ledger._unverified and ledger._curve_check is CurveCheck.BACKGROUND:
        ledger._verifier = threading.Thread(
            target=verify_pending, args=(ledger,), name="ledger-curve-check", daemon=True
        )
        ledger._verifier.start()


def verify_one(ledger: PrivacyLedger, index: int) -> None:
    with ledger._verify_lock:
        curve = ledger._unverified.pop(index, None)
    if curve is None:
        return
    charge = ledger._charges[index]
    try:
        recomputed = rdp_profile(charge.mechanism)
    except RayDPHPOError as exc:  # the stored curve stays: it is what was charged
        issue = (
            f"charge #{charge.seq} {charge.charge_id!r}: its stored RDP curve cannot be "
            f"checked, the current code gives none ({exc})"
        )
        with ledger._lock:
            ledger._curve_issues.append(issue)
        warnings.warn(f"journal {ledger._source}: {issue}", RuntimeWarning, stacklevel=2)
        return
    excess = _excess(recomputed, RdpProfile(*curve))
    if excess is None:
        return
    issue = (
        f"charge #{charge.seq} {charge.charge_id!r}: the RDP curve stored in the journal is "
        f"below what {type(charge.mechanism).__name__} gives now (at up to "
        f"{float(np.max(excess.values)):.3g} per order); the difference is added to the "
        "spend"
    )
    with ledger._lock:
        ledger._rdp = ledger._rdp + excess
        ledger._curve_issues.append(issue)
    warnings.warn(f"journal {ledger._source}: {issue}", RuntimeWarning, stacklevel=2)


def verify_pending(ledger: PrivacyLedger) -> None:
    while not ledger._verify_stop.is_set():
        with ledger._verify_lock:
            if not ledger._unverified:
                return
            index = next(iter(ledger._unverified))
        verify_one(ledger, index)


def verify_pending_sync(ledger: PrivacyLedger) -> None:
    while True:
        with ledger._verify_lock:
            if not ledger._unverified:
                break
            index = next(iter(ledger._unverified))
        verify_one(ledger, index)
    if ledger._verifier is not None and ledger._verifier is not threading.current_thread():
        ledger._verifier.join()
