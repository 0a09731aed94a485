"""The privacy core: mechanisms as values, their RDP / PLD / privacy-profile / GDP / pure-DP
bounds, (ε, δ) conversion and noise calibration. No Ray, no torch, no I/O.

Modules: :mod:`.mechanisms` (immutable mechanism specs), :mod:`.rdp` and :mod:`._rdp_kernels`
(Rényi DP, Mironov 2017; Balle et al. 2020 conversion), :mod:`.pld` (privacy loss
distributions, dp-accounting), :mod:`.prv` (Gopi, Lee & Wutschitz 2021), :mod:`.profiles` and
:mod:`.profiles_subsampled` (random stopping by privacy profiles, Koskela, Redberg & Wang 2024),
:mod:`.gdp` (Dong, Roth & Su 2022), :mod:`.pure`, :mod:`.calibration` (Laplace; analytic Gaussian,
Balle & Wang 2018; σ of a whole search plan), :mod:`.accountants` (ε(δ), δ(ε) and σ calibration
for a list of mechanisms, by default on ``Accountant.TIGHTEST``),
:mod:`.budget` (the total (ε, δ)).

Names are re-exported lazily (PEP 562): importing one light module (e.g. ``.rdp`` on a worker)
never imports dp-accounting.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo.accounting.accountants import (
        Accountant,
        calibrate_noise,
        delta,
        epsilon,
        epsilon_or_inf,
        epsilons,
        smallest_noise_multiplier,
    )
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.calibration import calibrate_search

_EXPORTS: dict[str, str] = {
    "Accountant": "raydp_hpo.accounting.accountants",
    "epsilon": "raydp_hpo.accounting.accountants",
    "epsilon_or_inf": "raydp_hpo.accounting.accountants",
    "epsilons": "raydp_hpo.accounting.accountants",
    "delta": "raydp_hpo.accounting.accountants",
    "calibrate_noise": "raydp_hpo.accounting.accountants",
    "smallest_noise_multiplier": "raydp_hpo.accounting.accountants",
    "calibrate_search": "raydp_hpo.accounting.calibration",
    "PrivacyBudget": "raydp_hpo.accounting.budget",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
