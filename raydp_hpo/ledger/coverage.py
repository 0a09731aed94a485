"""Is a trial covered by a charge that was admitted for it?

Searchers that charge a whole plan up front (random stopping, subsampled tuning, ...) charge
a *base* mechanism once; each trial then checks that what it is about to run is no worse than
that base before touching data. "No worse" is pointwise RDP domination: if ε_trial(α) ≤
ε_base(α) at every order, every RDP-based guarantee derived from the base (including the
Papernot–Steinke selection bound, which is monotone in the base curve) covers the trial.
"""

from __future__ import annotations

import numpy as np

from raydp_hpo.accounting.mechanisms import Mechanism
from raydp_hpo.accounting.rdp import rdp_profile

__all__ = ["is_covered"]

#: Relative slack for floating-point noise in the comparison (never more privacy than this).
_RTOL = 1e-9


def is_covered(mechanism: Mechanism, base: Mechanism) -> bool:
    """True iff ``mechanism``'s RDP curve is pointwise ≤ ``base``'s (and neither has an
    (ε, δ)-only part that the comparison cannot see)."""
    m, b = rdp_profile(mechanism), rdp_profile(base)
    if m.side_epsilon > b.side_epsilon or m.side_delta > b.side_delta:
        return False
    finite = np.isfinite(b.values)
    if np.any(~np.isfinite(m.values) & finite):
        return False
    return bool(np.all(m.values[finite] <= b.values[finite] * (1 + _RTOL) + 1e-15))
