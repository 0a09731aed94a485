"""The :class:`Accountant` enum, on its own so the ledger can name it without the accountants.

:mod:`raydp_hpo.accounting` describes each choice and re-exports it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Accountant"]


class Accountant(Enum):
    """Which accountant turns a composition of mechanisms into (ε, δ)."""

    RDP = "rdp"
    PLD = "pld"
    BEST = "best"
    #: The tightest valid figure for a fixed plan: the minimum of ``BEST`` and the composition
    #: in which random stopping is accounted by privacy profiles (:mod:`raydp_hpo.accounting.profiles`);
    #: a ledger halts on it only with ``Adaptivity.FIXED_PLAN``.
    PROFILE = "profile"
