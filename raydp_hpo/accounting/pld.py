"""Privacy loss distributions (PLD) of mechanisms, composed incrementally.

PLDs come from dp-accounting (Koskela et al.; Doroshenko et al. 2022 "connect the dots"),
built pessimistically (every figure is an upper bound) for the add/remove relation, which
dp-accounting covers by tracking both directions.

Mechanisms with no PLD of their own — :class:`~raydp_hpo.accounting.mechanisms.RandomStopping`,
:class:`~raydp_hpo.accounting.mechanisms.SubsampledTuning`, :class:`~raydp_hpo.accounting.mechanisms.WorstCase` —
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
import hashlib
import io
import json
import math
from collections import Counter
from typing import Any

import numpy as np
from dp_accounting.pld import common as _pld_common
from dp_accounting.pld import pld_pmf as _pld_pmf
from dp_accounting.pld import privacy_loss_distribution as _pld
from scipy import signal as _signal

from raydp_hpo.accounting.mechanisms import (
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
from raydp_hpo.accounting.pure import pure_epsilon
from raydp_hpo.accounting.rdp import rdp_profile
from raydp_hpo.errors import UnsupportedMechanismError

__all__ = [
    "VALUE_DISCRETIZATION",
    "MAX_PLD_POINTS",
    "NON_PLD_DELTA_FRACTION",
    "discretisation_interval",
    "has_pld",
    "count_non_pld",
    "PldComposer",
    "epsilon_for_delta",
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


def _pmf_epsilon(pmf: _pld_pmf.PLDPmf, delta: float) -> float:
    """ε at ``delta`` of one direction's PMF: dp-accounting's ``_get_epsilon_for_delta``,
    vectorised (the same sums in the same order, so the same figure up to rounding).

    With the losses l₁ > l₂ > … (descending) and masses p, write Uₖ = p_∞ + Σ_{j<k} pⱼ and
    Lₖ = Σ_{j<k} pⱼ e^{−lⱼ}. Then δ(ε) = Uₖ − e^ε Lₖ for l_k ≤ ε ≤ l_{k−1}, and the smallest
    ε with δ(ε) ≤ δ is log((Uₖ − δ)/Lₖ) at the first k with Uₖ > δ, Lₖ > 0 and
    log((Uₖ − δ)/Lₖ) ≥ lₖ (Koskela et al. 2020; Meiser & Mohammadi 2018, Eq. (2) of the
    dp-accounting supplement). dp-accounting walks the grid in Python from the top loss down,
    so a query costs time linear in the number of grid points above ε, which grows with the
    number of charges (16 ms at 1,000 distinct DP-SGD charges); this is one numpy pass.
    """
    dense = pmf.to_dense_pmf()
    inf_mass = float(dense._infinity_mass)  # noqa: SLF001
    if inf_mass > delta:
        return math.inf
    probs_all = np.asarray(dense._probs, dtype=np.float64)[::-1]  # noqa: SLF001
    step = dense._discretization  # noqa: SLF001
    top = dense._lower_loss + probs_all.size - 1  # noqa: SLF001
    n = probs_all.size
    # From the top loss down in chunks of doubling size (ε usually sits in the upper part of
    # the grid); the sums run in one sequence across chunks, as in dp-accounting's loop.
    start, chunk = 0, 4096
    upper_carry, lower_carry = inf_mass, 0.0
    while start < n:
        end = min(n, start + chunk)
        probs = probs_all[start:end]
        losses = (top - np.arange(start, end)) * step
        upper_incl = np.cumsum(np.concatenate(([upper_carry], probs)))[1:]
        lower_incl = np.cumsum(np.concatenate(([lower_carry], np.exp(-losses) * probs)))[1:]
        upper = np.concatenate(([upper_carry], upper_incl[:-1]))  # before adding point k
        lower = np.concatenate(([lower_carry], lower_incl[:-1]))
        with np.errstate(divide="ignore", invalid="ignore"):
            cand = np.log((upper - delta) / lower)
            stop = (upper > delta) & (lower > 0) & (cand >= losses)
            # dp-accounting's early return: a loss so large that exp(-loss) underflows to 0
            underflow = (upper_incl >= delta) & (lower_incl == 0)
        first_stop = int(np.argmax(stop)) if stop.any() else probs.size
        first_under = int(np.argmax(underflow)) if underflow.any() else probs.size
        if first_under < first_stop:
            return max(0.0, float(losses[first_under]))
        if first_stop < probs.size:  # the walk stops before adding this point
            return _final_epsilon(float(upper[first_stop]), float(lower[first_stop]), delta)
        upper_carry, lower_carry = float(upper_incl[-1]), float(lower_incl[-1])
        start, chunk = end, chunk * 2
    return _final_epsilon(upper_carry, lower_carry, delta)


def _final_epsilon(mass_upper: float, mass_lower: float, delta: float) -> float:
    if mass_upper <= mass_lower + delta:
        return 0.0
    eps = math.log((mass_upper - delta) / mass_lower)
    return eps + _ROUND_UP * (1.0 + abs(eps))


#: Relative margin added to :func:`_pmf_epsilon`'s figure: its sums round differently from
#: dp-accounting's loop (≤ 1e-11 relative, measured), and a figure must never be below it.
_ROUND_UP = 1e-9


def epsilon_for_delta(pld: PLD, delta: float) -> float:
    """ε at ``delta`` of ``pld``: the larger of its two directions (as
    ``PrivacyLossDistribution.get_epsilon_for_delta``), computed by :func:`_pmf_epsilon`."""
    eps = _pmf_epsilon(pld._pmf_remove, delta)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return eps
    return max(eps, _pmf_epsilon(pld._pmf_add, delta))  # noqa: SLF001


#: Version of :meth:`PldComposer.snapshot`'s format (with the settings it depends on).
SNAPSHOT_FORMAT = f"raydp-hpo pld snapshot 1; vdi={VALUE_DISCRETIZATION!r}; tail=1e-15"


#: Tail mass dp-accounting's ``PrivacyLossDistribution.compose`` truncates (pessimistically).
_TAIL_MASS = 1e-15


def _compose_pmfs(p1: _pld_pmf.PLDPmf, p2: _pld_pmf.PLDPmf) -> _pld_pmf.PLDPmf:
    """dp-accounting's ``compose_pmfs`` (tail truncation 1e-15, pessimistic), with the dense
    convolution done by overlap-add: composing the wide composed PMF with one candidate's
    narrow one then costs O(N log M) instead of an FFT over the whole grid (2 ms instead of
    31 ms at N = 69,000, M = 563, measured). Same sums, up to floating-point rounding."""
    if isinstance(p1, _pld_pmf.SparsePLDPmf) and isinstance(p2, _pld_pmf.SparsePLDPmf):
        return _pld_pmf.compose_pmfs(p1, p2, _TAIL_MASS)
    d1, d2 = p1.to_dense_pmf(), p2.to_dense_pmf()
    d1.validate_composable(d2)
    probs = _signal.oaconvolve(d1._probs, d2._probs)  # noqa: SLF001
    inf1, inf2 = d1._infinity_mass, d2._infinity_mass  # noqa: SLF001
    offset, probs, right_tail = _pld_pmf._truncate_tails(  # noqa: SLF001
        probs, _TAIL_MASS, d1._pessimistic_estimate)  # noqa: SLF001
    return _pld_pmf.DensePLDPmf(
        d1._discretization, d1._lower_loss + d2._lower_loss + offset,  # noqa: SLF001
        probs, inf1 + inf2 - inf1 * inf2 + right_tail, d1._pessimistic_estimate)  # noqa: SLF001


def _compose(a: PLD | None, b: PLD | None) -> PLD | None:
    if a is None:
        return b
    if b is None:
        return a
    try:
        remove = _compose_pmfs(a._pmf_remove, b._pmf_remove)  # noqa: SLF001
        if a._symmetric and b._symmetric:  # noqa: SLF001
            return PLD(remove)
        return PLD(remove, _compose_pmfs(a._pmf_add, b._pmf_add))  # noqa: SLF001
    except ValueError as exc:  # grids of different steps (a near-noiseless mechanism)
        raise UnsupportedMechanismError(
            f"PLD composition failed ({exc}); a near-noiseless mechanism needs a coarser PLD "
            "grid than the others, so the composition has no PLD figure; the RDP bound applies"
        ) from None


#: Most negative probability a snapshot may hold (FFT round-off of a composed PLD): it is
#: raised to 0 on load. Anything below is damage, and the snapshot is not used.
SNAPSHOT_NEGATIVE_TOLERANCE = 1e-12


class PldComposer:
    """Incremental PLD composition of a growing list of mechanisms.

    Mechanisms with a PLD are folded into one composed PLD (identical ones pending together
    are self-composed by their count). Mechanisms without one are kept aside, grouped by
    identity, and converted at query time, because their δᵢ depends on the total δ and on how
    many of them there are.

    Admission cost: :meth:`with_candidate` composes the folded PLD with the candidate's only
    (one FFT convolution) and :meth:`epsilon` is one vectorised pass over the grid
    (:func:`epsilon_for_delta`); the composed grid is bounded by dp-accounting's tail
    truncation (mass ≤ 1e-15 per composition, moved pessimistically to +∞ on the right).
    """

    def __init__(self) -> None:
        self._composed: PLD | None = None
        self._folded = 0  # PLD-capable mechanisms folded into _composed
        self._pending: list[Mechanism] = []  # PLD-capable, not folded in yet (lazy)
        self._non_pld: Counter[Mechanism] = Counter()

    def add(self, m: Mechanism) -> None:
        """Record ``m``; PLD composition is deferred until a figure is asked for."""
        if has_pld(m):
            self._pending.append(m)
        else:
            self._non_pld[m] += 1

    def copy(self) -> PldComposer:
        out = PldComposer()
        out._composed = self._composed  # immutable PLD object: safe to share
        out._folded = self._folded
        out._pending = list(self._pending)
        out._non_pld = Counter(self._non_pld)
        return out

    def with_candidate(self, m: Mechanism) -> PldComposer:
        """This composition plus ``m`` (self is folded first and left otherwise unchanged):
        only ``m``'s PLD is convolved with the folded one."""
        self.fold()
        out = self.copy()
        out.add(m)
        out.fold()
        return out

    @property
    def folded_count(self) -> int:
        """Number of PLD-capable mechanisms folded into the composed PLD."""
        return self._folded

    def fold(self) -> None:
        """Fold every pending PLD-capable mechanism into the composed PLD."""
        if not self._pending:
            return
        counts: dict[Mechanism, int] = {}
        for m in self._pending:
            counts[m] = counts.get(m, 0) + 1
        composed = self._composed
        for m, count in counts.items():
            p = _pld_of(m, 0.0)
            if count > 1:
                p = None if p is None else p.self_compose(count)
            composed = _compose(composed, p)
        self._composed, self._folded = composed, self._folded + len(self._pending)
        self._pending = []

    _fold = fold  # the name the ledger used before

    def _total(self, delta: float) -> PLD | None:
        self.fold()
        m = sum(count_non_pld(x) * k for x, k in self._non_pld.items())
        share = NON_PLD_DELTA_FRACTION * delta / m if m else 0.0
        out = self._composed
        for x, k in self._non_pld.items():
            p = _pld_of(x, share)
            if p is not None and k > 1:
                p = p.self_compose(k)
            out = _compose(out, p)
        return out

    def epsilon(self, delta: float) -> float:
        total = self._total(delta)
        if total is None:
            return 0.0
        return epsilon_for_delta(total, delta)

    def delta(self, epsilon: float) -> float:
        if self._non_pld:
            raise UnsupportedMechanismError(
                "δ(ε) under PLD needs every mechanism to have a PLD; random stopping, subsampled "
                "tuning and worst-case mechanisms only have an (ε, δ) conversion. "
                "Use Accountant.RDP for δ(ε)."
            )
        self.fold()
        if self._composed is None:
            return 0.0
        return float(self._composed.get_delta_for_epsilon(epsilon))

    # -- snapshots (fast restart of a ledger) ------------------------------------------------
    def snapshot(self, binding: dict[str, Any]) -> bytes:
        """The folded PLD as bytes, tagged with ``binding`` (what it was composed from: the
        ledger passes the journal's chain hash and record count) and a SHA-256 of the rest.

        Only the folded PLD-capable part is stored; mechanisms without a PLD are cheap to
        convert again and depend on δ.
        """
        self.fold()
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {"format": SNAPSHOT_FORMAT, "binding": binding,
                                "folded": self._folded, "symmetric": True, "pmfs": {}}
        if self._composed is not None:
            meta["symmetric"] = bool(self._composed._symmetric)  # noqa: SLF001
            for name, pmf in (("remove", self._composed._pmf_remove),  # noqa: SLF001
                              ("add", self._composed._pmf_add)):  # noqa: SLF001
                dense = pmf.to_dense_pmf()
                arrays[name] = np.asarray(dense._probs, dtype="<f8")  # noqa: SLF001
                meta["pmfs"][name] = {
                    "discretization": float(dense._discretization),  # noqa: SLF001
                    "lower_loss": int(dense._lower_loss),  # noqa: SLF001
                    "infinity_mass": float(dense._infinity_mass),  # noqa: SLF001
                    "pessimistic": bool(dense._pessimistic_estimate),  # noqa: SLF001
                }
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs: **kwds as bool
        body = json.dumps(meta, sort_keys=True).encode() + b"\n" + buf.getvalue()
        return hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    @classmethod
    def from_snapshot(cls, data: bytes, binding: dict[str, Any]) -> PldComposer | None:
        """The composer stored by :meth:`snapshot`, or None unless its checksum, format and
        ``binding`` all match (a stale or damaged snapshot is never used)."""
        try:
            digest, body = data.split(b"\n", 1)
            if hashlib.sha256(body).hexdigest().encode() != digest:
                return None
            head, npz = body.split(b"\n", 1)
            meta = json.loads(head)
            if meta.get("format") != SNAPSHOT_FORMAT or meta.get("binding") != binding:
                return None
            out = cls()
            out._folded = int(meta["folded"])
            if meta["pmfs"]:
                with np.load(io.BytesIO(npz), allow_pickle=False) as arrays:
                    pmfs = {}
                    for name, info in meta["pmfs"].items():
                        probs = np.array(arrays[name], dtype=np.float64)
                        if not (probs.ndim == 1 and probs.size
                                and probs.min() >= -SNAPSHOT_NEGATIVE_TOLERANCE):
                            return None
                        # FFT convolution leaves round-off below zero (~1e-17) in composed
                        # PLDs; raising it to 0 only adds mass, which can only raise δ(ε),
                        # so the restored figure is never below the live one.
                        probs = np.maximum(probs, 0.0)
                        pmfs[name] = _pld_pmf.DensePLDPmf(
                            float(info["discretization"]), int(info["lower_loss"]), probs,
                            float(info["infinity_mass"]), bool(info["pessimistic"]))
                out._composed = (PLD(pmfs["remove"]) if meta["symmetric"]
                                 else PLD(pmfs["remove"], pmfs["add"]))
            return out
        except (ValueError, KeyError, TypeError, OSError):
            return None


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
