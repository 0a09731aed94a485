"""The :class:`Accountant` enum, on its own so the ledger can name it without the accountants.

:mod:`raydp_hpo.accounting` describes each choice and re-exports it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Accountant"]

#: Values written by earlier versions that now name another member (journal headers, settings
#: files): ``"profile"`` was the value of what is now :attr:`Accountant.TIGHTEST`.
_LEGACY_VALUES = {"profile": "tightest"}


class Accountant(Enum):
    """Which accountant turns a composition of mechanisms into (ε, δ).

    Every figure is a valid upper bound for a composition of mechanisms fixed in advance;
    ``TIGHTEST`` (the default everywhere) is the smallest of them. Under adaptive charges
    only the RDP filter has a halting theorem (:mod:`raydp_hpo.ledger.filter`).
    """

    #: Rényi DP composition, converted by Canonne, Kamath & Steinke 2020 (Prop. 12); composes
    #: every mechanism and is the only one with a filter for adaptively chosen charges.
    RDP = "rdp"
    #: dp-accounting privacy loss distributions (pessimistic; with prv-accountant's upper bound
    #: where valid). Mechanisms without a PLD enter through an (ε, δ) point.
    PLD = "pld"
    #: Deprecated: the minimum of ``RDP`` and ``PLD`` only (leaves out the privacy-profile
    #: figure, e.g. 4.10 instead of 2.84 for random stopping); use ``TIGHTEST``.
    BEST = "best"
    #: The tightest valid figure for a fixed composition: the minimum of the RDP, PLD (and PRV)
    #: and privacy-profile figures, random stopping accounted by privacy profiles (Koskela,
    #: Redberg & Wang 2024; :mod:`raydp_hpo.accounting.profiles`). The default of
    #: :func:`~raydp_hpo.accounting.epsilon` and :func:`~raydp_hpo.accounting.calibrate_noise`;
    #: a ledger halts on it only with ``Adaptivity.FIXED_PLAN``.
    TIGHTEST = "tightest"
    #: Deprecated alias of ``TIGHTEST`` (the same member; its old stored value ``"profile"``
    #: still reads as ``TIGHTEST``).
    PROFILE = "tightest"

    @classmethod
    def _missing_(cls, value: object) -> Accountant | None:
        """Read values stored by earlier versions (``"profile"``) as their member today."""
        if isinstance(value, str) and value in _LEGACY_VALUES:
            return cls(_LEGACY_VALUES[value])
        return None
