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
    #: PLD composition in which random stopping is accounted by privacy profiles
    #: (:mod:`raydp_hpo.profiles`); only :mod:`raydp_hpo.accounting` knows it so far (the
    #: ledger does not halt on it).
    PROFILE = "profile"
