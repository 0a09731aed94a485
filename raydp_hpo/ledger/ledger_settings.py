"""Which settings a privacy ledger may have, and the settings a stored ledger's header holds.

Kept apart from :mod:`raydp_hpo.ledger.filter` (the admission logic): the rules that refuse a
combination before a ledger exists, with the reason each is refused (an adaptive halting rule
is only valid for the RDP filter, Feldman & Zrnic 2021; a δ split only for a ledger that
composes whole experiments, :mod:`raydp_hpo.ledger.experiments`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.rdp import RdpProfile
from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerCorruptedError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.curve_checks import CurveCheck
from raydp_hpo.ledger.experiments import DeltaSplit, split_of_header
from raydp_hpo.ledger.records import Adaptivity

__all__ = ["check_ledger_settings", "check_supported", "settings_of_header"]


def check_ledger_settings(budget: Any, adaptivity: Any, accountant: Any, curve_check: Any,
                          delta_split: Any) -> None:
    """Refuse (:class:`~raydp_hpo.errors.InvalidParameterError`, naming the value and what to
    use) settings of a :class:`~raydp_hpo.ledger.filter.PrivacyLedger` that are of the wrong
    type or that no halting theorem covers together."""
    if not isinstance(curve_check, CurveCheck):
        raise InvalidParameterError(f"curve_check must be a CurveCheck, got {curve_check!r}")
    if not isinstance(budget, PrivacyBudget):
        raise InvalidParameterError(f"budget must be a PrivacyBudget, got {budget!r}")
    if not isinstance(adaptivity, Adaptivity):
        raise InvalidParameterError(f"adaptivity must be an Adaptivity, got {adaptivity!r}")
    if not isinstance(accountant, Accountant):
        raise InvalidParameterError(f"accountant must be an Accountant, got {accountant!r}")
    if adaptivity is Adaptivity.ADAPTIVE and accountant is Accountant.PROFILE:
        raise InvalidParameterError(
            "halting with accountant='profile' is only valid for a plan fixed before any "
            "data is touched: its composition gives each selection one (ε, δ) point at a "
            "δ split over the selections of the whole sequence, which adaptively chosen "
            "charges do not fix in advance, and no privacy-filter theorem covers it; use "
            "adaptivity=Adaptivity.FIXED_PLAN, or accountant=Accountant.RDP (adaptive RDP "
            "filter)"
        )
    if adaptivity is Adaptivity.ADAPTIVE and accountant is not Accountant.RDP:
        raise InvalidParameterError(
            f"halting with accountant={accountant.value!r} is only justified for a plan "
            "fixed up front; use accountant=Accountant.RDP (adaptive RDP filter) or "
            "adaptivity=Adaptivity.FIXED_PLAN"
        )
    if delta_split is not None and not isinstance(delta_split, DeltaSplit):
        raise InvalidParameterError(
            f"delta_split must be a DeltaSplit or None, got {delta_split!r}")
    if delta_split is not None and adaptivity is not Adaptivity.EXPERIMENTS:
        raise InvalidParameterError(
            f"delta_split={delta_split.value!r} is only for adaptivity=Adaptivity.EXPERIMENTS "
            f"(got {adaptivity.value!r}); leave it unset")


def check_supported(adaptivity: Adaptivity, profile: RdpProfile) -> None:
    """Refuse a mechanism whose RDP ``profile`` has an (ε, δ)-only part on a ledger halting on
    the adaptive RDP filter, which has no theorem for it (changes nothing)."""
    if adaptivity is Adaptivity.ADAPTIVE and (
        profile.side_delta > 0 or profile.side_epsilon > 0
    ):
        raise InvalidParameterError(
            "an ApproxDP (ε, δ)-only mechanism has no RDP curve, so the adaptive RDP filter "
            "cannot admit it; use a ledger with adaptivity=Adaptivity.FIXED_PLAN"
        )


def settings_of_header(
    journal: str | Path, header: dict[str, Any]
) -> tuple[PrivacyBudget, Adaptivity, Accountant, DeltaSplit | None]:
    """(budget, adaptivity, accountant, δ split) stored in the header of the ledger
    ``journal``; :class:`~raydp_hpo.errors.LedgerCorruptedError` naming it if they are
    invalid (a header that passes its checksum was written by something else)."""
    try:
        adaptivity = Adaptivity(header["adaptivity"])
        return (
            PrivacyBudget.from_dict(header["budget"]),
            adaptivity,
            Accountant(header["accountant"]),
            split_of_header(header) if adaptivity is Adaptivity.EXPERIMENTS else None,
        )
    except LedgerMismatchError:
        raise
    except (KeyError, TypeError, ValueError, RayDPHPOError) as exc:
        raise LedgerCorruptedError(
            f"journal {journal}: the header (line 1, byte offset 0) passes its checksum but "
            f"its settings are invalid ({type(exc).__name__}: {exc}); restore the journal "
            "from a backup"
        ) from None
