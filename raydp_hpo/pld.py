"""Privacy loss distributions (PLD) of mechanisms, composed incrementally.

PLDs come from dp-accounting (Koskela et al.; Doroshenko et al. 2022 "connect the dots"),
built pessimistically (every figure is an upper bound) for the add/remove relation, which
dp-accounting covers by tracking both directions.

Mechanisms with no PLD of their own — :class:`~raydp_hpo.mechanisms.RandomStopping`,
:class:`~raydp_hpo.mechanisms.SubsampledTuning`, :class:`~raydp_hpo.mechanisms.WorstCase` —
enter the composition through an (εᵢ, δᵢ) guarantee taken from their RDP profile (or their
pure-DP bound, with δᵢ = 0), represented by the worst-case PLD of (εᵢ, δᵢ)-DP (dp-accounting's
``from_privacy_parameters``). **δ split**: when a composition is evaluated at a total δ, each
of the m such mechanisms gets δᵢ = ``NON_PLD_DELTA_FRACTION`` · δ / m; their mass δᵢ sits at
+∞ in the composed PLD, so the final ε at δ accounts for it automatically.

prv-accountant (Gopi et al. 2021) gives error-bounded figures; version 0.2.0's subsampled
Gaussian PRV models only one direction of the add/remove relation, so its upper bound is used
only for mechanisms whose privacy loss is symmetric (Gaussian, Laplace, pure DP) and reported
as a cross-check otherwise.
"""

from __future__ import annotations

import functools
import math

from dp_accounting.pld import common as _pld_common
from dp_accounting.pld import privacy_loss_distribution as _pld

from raydp_hpo.errors import UnsupportedMechanismError
from raydp_hpo.mechanisms import (
    ApproxDP,
    Composition,
    Gaussian,
    Laplace,
    Mechanism,
    PureDP,
    RandomStopping,
    SubsampledGaussian,
    SubsampledTuning,
    WorstCase,
)
from raydp_hpo.pure import pure_epsilon
from raydp_hpo.rdp import rdp_profile

__all__ = [
    "VALUE_DISCRETIZATION",
    "MAX_PLD_POINTS",
    "NON_PLD_DELTA_FRACTION",
    "discretisation_interval",
    "has_pld",
    "count_non_pld",
    "PldComposer",
    "pld_epsilon",
    "pld_delta",
]

#: Discretisation interval of the privacy loss (dp-accounting; pessimistic rounding).
VALUE_DISCRETIZATION = 1e-3
#: Share of the total δ given to mechanisms without a PLD, split evenly among them.
NON_PLD_DELTA_FRACTION = 0.5

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution as PLD  # noqa: E402


def has_pld(m: Mechanism) -> bool:
    """Whether ``m`` has its own PLD (Composition: whether every part has one)."""
    if isinstance(m, Composition):
        return all(has_pld(p) for p in m.mechanisms)
    return isinstance(m, (SubsampledGaussian, Gaussian, Laplace, PureDP, ApproxDP))


def count_non_pld(m: Mechanism) -> int:
    """Number of leaves of ``m`` that enter PLD composition through an (ε, δ) guarantee."""
    if isinstance(m, Composition):
        return sum(count_non_pld(p) for p in m.mechanisms)
    return 0 if has_pld(m) else 1


#: Most grid points the privacy loss of ONE release may span (bounds memory and time).
MAX_PLD_POINTS = 2**21
#: Tail mass bound → standard deviations of the Gaussian's privacy-loss support (z ≥ 9).
_GAUSSIAN_TAIL_Z = 9.0


def discretisation_interval(m: Mechanism) -> float:
    """The PLD grid step for ``m``: :data:`VALUE_DISCRETIZATION`, or coarser when the composed
    privacy loss would span more than :data:`MAX_PLD_POINTS` points.

    The privacy loss of one Gaussian step with noise σ (sensitivity 1) at x ~ N(0, σ²) is
    (x + 1/2)/σ², with standard deviation s = 1/σ; Poisson subsampling at rate q shrinks it to
    about s = q·√(exp(1/σ²) − 1) (never above 1/σ). The composition of T steps has standard
    deviation √T·s, so the grid spans about 2z·√T·s / step points (z = 9); the one-step grid
    itself reaches ±(1/(2σ²) + z/σ). At σ = 1e-3 and step 1e-3 that is ~10⁸–10⁹ points (the
    accountant was killed by the OOM killer at ~23 GB).
    Realistic mechanisms stay far below the limit, so their figures are unchanged. A coarser
    step is still an upper bound — dp-accounting rounds the loss pessimistically on any grid —
    only a looser one; for the near-noiseless mechanisms that reach the limit the RDP figure,
    which the tightest-valid choice also takes, is the informative one. Laplace / pure /
    approximate DP: the loss of one release lies in [−ε, ε].
    """
    if isinstance(m, (SubsampledGaussian, Gaussian)):
        sigma = m.noise_multiplier
        spread = 1.0 / sigma
        if isinstance(m, SubsampledGaussian) and m.sample_rate < 1.0:
            spread = min(spread, m.sample_rate * math.sqrt(math.expm1(min(sigma**-2, 700.0))))
        count = m.steps if isinstance(m, SubsampledGaussian) else m.count
        # the composed spread, or the one-step grid, which reaches up to 1/(2σ²) + z/σ on
        # either side of zero (its centre is 1/(2σ²) from 0): whichever is wider
        width = max(
            2.0 * _GAUSSIAN_TAIL_Z * math.sqrt(count) * spread,
            sigma**-2 + 2.0 * _GAUSSIAN_TAIL_Z / sigma,
        )
    elif isinstance(m, (Laplace, PureDP, ApproxDP)):
        width = 2.0 * m.epsilon * math.sqrt(m.count)
    else:
        return VALUE_DISCRETIZATION
    return max(VALUE_DISCRETIZATION, width / MAX_PLD_POINTS)


@functools.lru_cache(maxsize=1024)
def _leaf_pld(m: Mechanism) -> PLD:
    try:
        return _build_leaf_pld(m)
    except (OverflowError, MemoryError):  # dp-accounting on a near-noiseless mechanism
        raise UnsupportedMechanismError(
            f"{m!r}: its privacy loss is outside the floating-point range, so it has no PLD "
            "figure; the RDP bound applies"
        ) from None


def _build_leaf_pld(m: Mechanism) -> PLD:
    vdi = discretisation_interval(m)
    if isinstance(m, SubsampledGaussian):
        return _pld.from_gaussian_mechanism(
            standard_deviation=m.noise_multiplier,
            sampling_prob=m.sample_rate,
            value_discretization_interval=vdi,
        ).self_compose(m.steps)
    if isinstance(m, Gaussian):
        return _pld.from_gaussian_mechanism(
            standard_deviation=m.noise_multiplier, value_discretization_interval=vdi
        ).self_compose(m.count)
    if isinstance(m, Laplace):
        return _pld.from_laplace_mechanism(
            parameter=1.0 / m.epsilon, value_discretization_interval=vdi
        ).self_compose(m.count)
    if isinstance(m, PureDP):
        return _pld.from_privacy_parameters(
            _pld_common.DifferentialPrivacyParameters(m.epsilon, 0.0), vdi
        ).self_compose(m.count)
    if isinstance(m, ApproxDP):
        return _pld.from_privacy_parameters(
            _pld_common.DifferentialPrivacyParameters(m.epsilon, m.delta), vdi
        ).self_compose(m.count)
    raise UnsupportedMechanismError(f"{m!r} has no PLD")


def _approx_dp_pld(m: Mechanism, delta_share: float) -> PLD:
    """Worst-case PLD of the (ε, δ) guarantee of a mechanism without a PLD of its own."""
    pure = pure_epsilon(m)
    if pure is not None:
        params = _pld_common.DifferentialPrivacyParameters(pure, 0.0)
    else:
        eps = rdp_profile(m).epsilon(delta_share)
        if not math.isfinite(eps):
            raise UnsupportedMechanismError(
                f"{type(m).__name__} has no finite ε at δ={delta_share:g}; PLD cannot compose it"
            )
        params = _pld_common.DifferentialPrivacyParameters(eps, delta_share)
    return _pld.from_privacy_parameters(params, VALUE_DISCRETIZATION)


def _pld_of(m: Mechanism, delta_share: float) -> PLD | None:
    if isinstance(m, Composition):
        out: PLD | None = None
        for part in m.mechanisms:
            p = _pld_of(part, delta_share)
            if p is not None:
                out = p if out is None else out.compose(p)
        return out
    if has_pld(m):
        return _leaf_pld(m)
    if isinstance(m, (RandomStopping, SubsampledTuning, WorstCase)):
        return _approx_dp_pld(m, delta_share)
    raise UnsupportedMechanismError(f"no PLD route for {m!r}")


class PldComposer:
    """Incremental PLD composition of a growing list of mechanisms.

    Mechanisms with a PLD are folded into one composed PLD as they arrive (cheap to query
    again). Mechanisms without one are kept aside and converted at query time, because their
    δᵢ depends on the total δ and on how many of them there are.
    """

    def __init__(self) -> None:
        self._composed: PLD | None = None
        self._pending: list[Mechanism] = []  # PLD-capable, not folded in yet (lazy)
        self._non_pld: list[Mechanism] = []

    def add(self, m: Mechanism) -> None:
        """Record ``m``; PLD composition is deferred until a figure is asked for."""
        if has_pld(m):
            self._pending.append(m)
        else:
            self._non_pld.append(m)

    def copy(self) -> PldComposer:
        out = PldComposer()
        out._composed = self._composed  # immutable PLD object: safe to share
        out._pending = list(self._pending)
        out._non_pld = list(self._non_pld)
        return out

    def _fold(self) -> None:
        # Identical mechanisms (common: trials of one search) are self-composed in one go.
        counts: dict[Mechanism, int] = {}
        for m in self._pending:
            counts[m] = counts.get(m, 0) + 1
        for m, count in counts.items():
            p = _pld_of(m, 0.0)
            assert p is not None
            if count > 1:
                p = p.self_compose(count)
            self._composed = p if self._composed is None else self._composed.compose(p)
        self._pending = []

    def _total(self, delta: float) -> PLD | None:
        self._fold()
        m = sum(count_non_pld(x) for x in self._non_pld)
        share = NON_PLD_DELTA_FRACTION * delta / m if m else 0.0
        out = self._composed
        for x in self._non_pld:
            p = _pld_of(x, share)
            if p is not None:
                out = p if out is None else out.compose(p)
        return out

    def epsilon(self, delta: float) -> float:
        total = self._total(delta)
        if total is None:
            return 0.0
        return float(total.get_epsilon_for_delta(delta))

    def delta(self, epsilon: float) -> float:
        if self._non_pld:
            raise UnsupportedMechanismError(
                "δ(ε) under PLD needs every mechanism to have a PLD; random stopping, subsampled "
                "tuning and worst-case mechanisms only have an (ε, δ) conversion. "
                "Use Accountant.RDP for δ(ε)."
            )
        self._fold()
        if self._composed is None:
            return 0.0
        return float(self._composed.get_delta_for_epsilon(epsilon))


def pld_epsilon(mechanisms: list[Mechanism], delta: float) -> float:
    """ε at ``delta`` of the composition of ``mechanisms`` under the PLD accountant."""
    composer = PldComposer()
    for m in mechanisms:
        composer.add(m)
    return composer.epsilon(delta)


def pld_delta(mechanisms: list[Mechanism], epsilon: float) -> float:
    """δ at ``epsilon`` of the composition of ``mechanisms`` under the PLD accountant."""
    composer = PldComposer()
    for m in mechanisms:
        composer.add(m)
    return composer.delta(epsilon)
