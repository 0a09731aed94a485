"""Error-bounded ε from prv-accountant (Gopi, Lee & Wutschitz 2021), where it is valid.

``PRVAccountant.compute_epsilon`` returns (lower, estimate, upper) with the upper bound valid
up to the stated ``eps_error`` / ``delta_error`` (their Thm. 5.5); we use the upper bound only.

Validity under add/remove: prv-accountant 0.2.0 models one privacy random variable per
mechanism. For the Gaussian, Laplace and pure-DP mechanisms the privacy loss distribution is
the same in both directions, so its bound covers add/remove. Its Poisson-subsampled Gaussian
models only the pair (mixture, N(0, σ²)) — one direction of add/remove — so it is *not* used
as an upper bound for :class:`~raydp_hpo.accounting.mechanisms.SubsampledGaussian`; :func:`prv_epsilon`
returns ``None`` there (dp-accounting's PLD, which tracks both directions, is used instead).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from raydp_hpo.accounting.mechanisms import Composition, Gaussian, Laplace, Mechanism, PureDP

__all__ = ["prv_epsilon", "PRV_EPS_ERROR", "PRV_MAX_DISTINCT"]

#: ε error of the PRV discretisation (added to the upper bound by the library itself).
PRV_EPS_ERROR = 0.01
#: Above this many distinct mechanisms prv-accountant gets slow; no figure is computed.
PRV_MAX_DISTINCT = 20


def _leaves(m: Mechanism) -> Iterable[tuple[Mechanism, int]]:
    if isinstance(m, Composition):
        for part in m.mechanisms:
            yield from _leaves(part)
    elif isinstance(m, Gaussian):
        yield Gaussian(m.noise_multiplier), m.count
    elif isinstance(m, Laplace):
        yield Laplace(m.epsilon), m.count
    elif isinstance(m, PureDP):
        yield PureDP(m.epsilon), m.count
    else:
        yield m, 0  # unsupported marker


#: Below this Gaussian noise multiplier (or above this per-release ε) prv-accountant's grid,
#: which spans the privacy loss's support (width ~1/σ² for a Gaussian), outgrows memory
#: (σ = 1e-3: an 8 TiB allocation). Such a mechanism's ε is enormous anyway; RDP and the
#: bounded PLD grid (:func:`raydp_hpo.accounting.pld.discretisation_interval`) still give bounds.
PRV_MIN_NOISE_MULTIPLIER = 0.2
PRV_MAX_RELEASE_EPSILON = 20.0


def _too_wide(leaf: Mechanism) -> bool:
    if isinstance(leaf, Gaussian):
        return leaf.noise_multiplier < PRV_MIN_NOISE_MULTIPLIER
    if isinstance(leaf, (Laplace, PureDP)):
        return leaf.epsilon > PRV_MAX_RELEASE_EPSILON
    return False


def prv_epsilon(mechanisms: Iterable[Mechanism], delta: float) -> float | None:
    """prv-accountant's upper bound on ε at ``delta``, or ``None`` where it is not valid or
    not computed (unsupported/one-directional mechanism, too many distinct mechanisms)."""
    from prv_accountant import GaussianMechanism, LaplaceMechanism, PRVAccountant, PureDPMechanism

    counts: Counter[Mechanism] = Counter()
    for mech in mechanisms:
        for leaf, count in _leaves(mech):
            if count == 0:
                return None
            counts[leaf] += count
    if not counts or len(counts) > PRV_MAX_DISTINCT:
        return None
    if any(_too_wide(leaf) for leaf in counts):
        return None
    prvs = []
    for leaf in counts:
        if isinstance(leaf, Gaussian):
            prvs.append(GaussianMechanism(noise_multiplier=leaf.noise_multiplier))
        elif isinstance(leaf, Laplace):
            prvs.append(LaplaceMechanism(mu=leaf.epsilon))
        else:
            assert isinstance(leaf, PureDP)
            prvs.append(PureDPMechanism(eps=leaf.epsilon))
    steps = list(counts.values())
    try:
        accountant = PRVAccountant(
            prvs=prvs,
            max_self_compositions=steps,
            eps_error=PRV_EPS_ERROR,
            delta_error=delta * 1e-3,
        )
        _, _, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=steps)
    except (ValueError, RuntimeError, AssertionError, MemoryError):
        return None  # e.g. "Discrete mean differs" at large ε in 0.2.0: no figure, no claim
    upper = float(upper)
    return upper if math.isfinite(upper) else None
