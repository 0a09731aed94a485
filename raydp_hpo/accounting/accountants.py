"""Public privacy accounting: ε(δ), δ(ε) and noise calibration for lists of mechanisms.

Accountants (an enum, never a string flag):

* ``RDP``  — Rényi DP composition on :data:`~raydp_hpo.accounting.rdp.DEFAULT_ORDERS`, improved
  conversion (Canonne, Kamath & Steinke 2020, Prop. 12); composes every mechanism here.
* ``PLD``  — dp-accounting privacy loss distributions (pessimistic, both directions of
  add/remove); mechanisms without a PLD enter through an (ε, δ) guarantee with the δ split
  documented in :mod:`raydp_hpo.accounting.pld`. Where prv-accountant's error-bounded upper bound is
  valid (:mod:`raydp_hpo.accounting.prv`), the smaller of the two upper bounds is reported.
* ``TIGHTEST`` (the default) — the tightest valid figure for a fixed list: the minimum of the
  RDP and PLD (and PRV) figures and, when some part has no PLD of its own, the composition in
  which each :class:`~raydp_hpo.accounting.mechanisms.RandomStopping` is accounted by privacy
  profiles (Koskela, Redberg & Wang 2024, reconstructed and proved in
  :mod:`raydp_hpo.accounting.profiles`). A lone selection is bounded directly; in a composition
  it enters through one (εᵢ, δᵢ) point with an explicit δ split
  (:func:`raydp_hpo.accounting.profiles.profile_epsilon`). Every candidate is a valid bound for
  the same fixed list, so the minimum is one, and it is never above ``RDP`` or ``PLD``. Costs
  a few tenths of a second per distinct base mechanism (its PLD and profile grid, then
  cached). ``PROFILE`` is a deprecated alias of it (the same member; a stored ``"profile"``
  reads as ``TIGHTEST``).
* ``BEST`` — deprecated: the minimum of ``RDP`` and ``PLD`` only, without the profile figure
  (random stopping, σ=1, q=0.01, T=1000, geometric E[K]=10, δ=1e-5: 4.10 where ``TIGHTEST``
  gives 2.84); use ``TIGHTEST``. Using it explicitly warns (``DeprecationWarning``).

Every figure is additionally capped by a pure-DP bound when one exists (:mod:`raydp_hpo.accounting.pure`).
These are statements about a *fixed* list of mechanisms; the ledger's halting rule under
adaptive charges is in :mod:`raydp_hpo.ledger`.

The PLD, PRV and profile accountants are imported when a figure needs them: importing
dp-accounting loads its whole PLD stack (~1 s), which RDP-only callers (trial workers, the
ledger actor, searchers) never need.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Sequence

from raydp_hpo._validation import (
    coerce_enum,
    nonnegative_float,
    open_unit_float,
    positive_float,
    positive_int,
    unit_interval_float,
)
from raydp_hpo.accounting.accountant_kind import Accountant
from raydp_hpo.accounting.mechanisms import Composition, Mechanism, SubsampledGaussian
from raydp_hpo.accounting.pure import pure_epsilon
from raydp_hpo.accounting.rdp import RdpProfile, rdp_profile
from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "Accountant",
    "epsilon",
    "epsilon_or_inf",
    "delta",
    "calibrate_noise",
    "calibrate_plan",
    "epsilons",
    "smallest_noise_multiplier",
]


def _as_list(mechanisms: Mechanism | Iterable[Mechanism]) -> list[Mechanism]:
    if isinstance(mechanisms, (list, tuple)):
        mechs = list(mechanisms)
    elif hasattr(mechanisms, "__dataclass_fields__"):
        mechs = [mechanisms]  # type: ignore[list-item]
    else:
        mechs = list(mechanisms)  # type: ignore[arg-type]
    if not mechs:
        raise InvalidParameterError("at least one mechanism is needed, got none")
    Composition(tuple(mechs))  # validates every element
    return mechs


def _pure_total(mechs: Sequence[Mechanism]) -> float | None:
    parts = [pure_epsilon(m) for m in mechs]
    return None if any(p is None for p in parts) else float(sum(parts))  # type: ignore[arg-type]


def _rdp_total(mechs: Sequence[Mechanism]) -> RdpProfile:
    total = RdpProfile.zero()
    for m in mechs:
        total = total + rdp_profile(m)
    return total


def _coerce_accountant(accountant: Accountant | str) -> Accountant:
    return coerce_enum(Accountant, accountant, "accountant")


def _warn_if_deprecated(accountant: Accountant) -> None:
    """``DeprecationWarning`` for an explicit ``BEST`` (``PROFILE`` is ``TIGHTEST`` itself)."""
    if accountant is Accountant.BEST:
        warnings.warn(
            "Accountant.BEST (min of RDP and PLD only) is deprecated: it leaves out the "
            "privacy-profile figure; use Accountant.TIGHTEST (the default)",
            DeprecationWarning,
            stacklevel=3,
        )


def epsilon(
    mechanisms: Mechanism | Iterable[Mechanism],
    delta: float,
    accountant: Accountant = Accountant.TIGHTEST,
) -> float:
    """Upper bound on ε at ``delta`` for the composition of ``mechanisms``; by default the
    tightest valid one (``Accountant.TIGHTEST``).

    >>> from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution
    >>> search = RandomStopping(SubsampledGaussian(1.0, 0.01, 1000),
    ...                         StoppingDistribution.GEOMETRIC, mean=10)
    >>> round(epsilon(search, 1e-5), 2), round(epsilon(search, 1e-5, Accountant.RDP), 2)
    (2.84, 4.1)

    >>> from raydp_hpo.accounting.mechanisms import SubsampledGaussian
    >>> round(epsilon(SubsampledGaussian(1.1, 256 / 60000, 14063), 1e-5, Accountant.RDP), 2)
    2.6

    (dp-accounting 0.6's ``RdpAccountant`` gives 2.5967 for the same event. The often-quoted
    2.92 for this MNIST setting used the older RDP→(ε, δ) conversion of Mironov 2017,
    Prop. 3; we use the tighter one of Canonne, Kamath & Steinke 2020, Prop. 12, as
    dp-accounting does.)
    """
    accountant = _coerce_accountant(accountant)
    _warn_if_deprecated(accountant)
    return _epsilon(mechanisms, delta, accountant)


def _epsilon(
    mechanisms: Mechanism | Iterable[Mechanism], delta: float, accountant: Accountant
) -> float:
    """:func:`epsilon` without the deprecation warning (for :func:`epsilons`)."""
    delta = open_unit_float("delta", delta)
    mechs = _as_list(mechanisms)
    candidates: list[float] = []
    if accountant in (Accountant.RDP, Accountant.BEST, Accountant.TIGHTEST):
        candidates.append(_rdp_total(mechs).epsilon(delta))
    if accountant in (Accountant.PLD, Accountant.BEST, Accountant.TIGHTEST):
        from raydp_hpo.accounting.pld import pld_epsilon
        from raydp_hpo.accounting.prv import prv_epsilon

        candidates.append(pld_epsilon(mechs, delta))
        prv = prv_epsilon(mechs, delta)  # error-bounded upper bound, where valid
        if prv is not None:
            candidates.append(prv)
    if accountant is Accountant.TIGHTEST:
        from raydp_hpo.accounting.pld import count_non_pld
        from raydp_hpo.accounting.profiles import profile_epsilon

        if any(count_non_pld(m) for m in mechs):
            # with every part having a PLD, the profile figure is the PLD composition above
            candidates.append(profile_epsilon(mechs, delta))
    pure = _pure_total(mechs)
    if pure is not None:
        candidates.append(pure)
    return float(min(candidates))


def epsilon_or_inf(
    mechanisms: Mechanism | Iterable[Mechanism], delta: float, accountant: Accountant
) -> float:
    """:func:`epsilon`, or ``inf`` (no figure, no claim) where ``accountant`` cannot bound the
    mechanisms (:class:`~raydp_hpo.errors.UnsupportedMechanismError`): for reports that show
    several accountants side by side and take the smallest valid one."""
    from raydp_hpo.errors import UnsupportedMechanismError

    try:
        return epsilon(mechanisms, delta, accountant)
    except UnsupportedMechanismError:
        return math.inf


def epsilons(mechanisms: Mechanism | Iterable[Mechanism], delta: float) -> dict[Accountant, float]:
    """ε at ``delta`` under every accountant, as a dict keyed by :class:`Accountant` (the
    deprecated ``BEST`` included, without a warning)."""
    return {a: _epsilon(mechanisms, delta, a) for a in Accountant}


def delta(
    mechanisms: Mechanism | Iterable[Mechanism],
    epsilon: float,
    accountant: Accountant = Accountant.TIGHTEST,
) -> float:
    """Upper bound on δ at ``epsilon`` for the composition of ``mechanisms``.

    Under ``PLD`` every mechanism needs its own PLD (no ε split is invented for random
    stopping / subsampled tuning); ``BEST`` falls back to RDP for those. ``TIGHTEST`` (the
    default) is the minimum of the RDP, PLD and privacy-profile δ where each is valid: it
    falls back to RDP (and PLD) for a composition that contains a selection, which the
    profile δ does not cover.
    """
    eps = nonnegative_float("epsilon", epsilon)
    mechs = _as_list(mechanisms)
    accountant = _coerce_accountant(accountant)
    pure = _pure_total(mechs)
    if pure is not None and pure <= eps:
        return 0.0
    _warn_if_deprecated(accountant)
    candidates: list[float] = []
    if accountant in (Accountant.RDP, Accountant.BEST, Accountant.TIGHTEST):
        candidates.append(_rdp_total(mechs).delta(eps))
    if accountant in (Accountant.PLD, Accountant.BEST, Accountant.TIGHTEST):
        from raydp_hpo.accounting.pld import has_pld, pld_delta

        if accountant is Accountant.PLD or all(has_pld(m) for m in mechs):
            candidates.append(pld_delta(mechs, eps))
    if accountant is Accountant.TIGHTEST:
        from raydp_hpo.accounting.profiles import profile_delta
        from raydp_hpo.errors import UnsupportedMechanismError

        # a composition containing a selection has no profile δ: the RDP (and PLD) δ stand
        with contextlib.suppress(UnsupportedMechanismError):
            candidates.append(profile_delta(mechs, eps))
    return float(min(candidates))


def smallest_noise_multiplier(
    fits: Callable[[float], bool],
    *,
    max_noise_multiplier: float,
    tolerance: float,
    floor: float,
    refine_below_floor: bool,
) -> float | None:
    """Smallest σ (to within ``tolerance``, relative) with ``fits(σ)``; ``None`` if none up to
    ``max_noise_multiplier`` does. ``fits`` must be monotone: more noise never hurts.

    Doubles σ from 1 until it fits; if σ = 1 already fits, halves it while it still fits and
    stays above ``floor`` (at the floor: returns the last fitting σ, or with
    ``refine_below_floor`` goes on bisecting below it). Then bisects. The result is always
    the upper end of the final bracket, a σ at which ``fits`` held ("round toward more
    privacy").
    """
    hi = 1.0
    while not fits(hi):
        hi *= 2.0
        if hi > max_noise_multiplier:
            return None
    lo = hi / 2.0 if hi > 1.0 else 0.0
    if lo == 0.0:
        # σ = 1 fits: search downward for the smallest fitting σ.
        lo = 1.0
        while lo > floor and fits(lo):
            hi, lo = lo, lo / 2.0
        if lo <= floor and not refine_below_floor:
            return hi
    while (hi - lo) > tolerance * hi:
        mid = (lo + hi) / 2.0
        if not lo < mid < hi:  # adjacent floats: a tolerance below float resolution
            break
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_plan(
    plan_of: Callable[[float], Mechanism | Sequence[Mechanism]],
    target_epsilon: float,
    delta: float,
    accountant: Accountant,
    *,
    tolerance: float,
    max_noise_multiplier: float,
    what: str,
) -> float:
    """Smallest σ (to within ``tolerance``, relative) with ``epsilon(plan_of(σ), delta,
    accountant) <= target_epsilon``: the bisection behind :func:`calibrate_noise` and
    :func:`raydp_hpo.accounting.calibration.calibrate_search` (inputs already validated).

    ``plan_of`` must be monotone (more noise never raises ε). The returned σ is the upper end
    of the final bracket, a σ whose plan was computed to fit, and the plan is checked again
    before returning. ``what`` describes the plan in the error for an unreachable target.
    A σ at which ``accountant`` has no figure (a near-noiseless mechanism the PLD grid cannot
    hold) counts as not fitting.
    """
    from raydp_hpo.errors import RayDPHPOError, UnsupportedMechanismError

    def eps_of(sigma: float) -> float:
        try:
            return _epsilon(plan_of(sigma), delta, accountant)
        except UnsupportedMechanismError:
            return math.inf

    sigma = smallest_noise_multiplier(
        lambda s: eps_of(s) <= target_epsilon,
        max_noise_multiplier=max_noise_multiplier,
        tolerance=tolerance,
        floor=1e-3,
        refine_below_floor=True,
    )
    if sigma is None:
        raise InvalidParameterError(
            f"no noise multiplier <= {max_noise_multiplier:g} reaches "
            f"target_epsilon={target_epsilon} at delta={delta} under accountant="
            f"{accountant.value!r} for {what}; raise the target or lower the sample rate / "
            "steps / number of trials"
        )
    got = eps_of(sigma)
    if not math.isfinite(got) or got > target_epsilon:
        raise RayDPHPOError(  # a plan_of whose ε is not a function of σ alone
            f"calibration check failed: the plan at σ={sigma!r} has ε={got!r} > "
            f"target_epsilon={target_epsilon}; plan_of must be deterministic and monotone"
        )
    return sigma


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: Accountant = Accountant.TIGHTEST,
    *,
    tolerance: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest noise multiplier σ (to within ``tolerance``, relative) such that DP-SGD with
    ``steps`` Poisson-subsampled steps at ``sample_rate`` is (``target_epsilon``, ``delta``)-DP.

    Bisection on σ ↦ ε(σ), which is non-increasing (:func:`calibrate_plan`); the returned σ is
    always the upper end of the final bracket, so ε(σ) ≤ target_epsilon holds exactly under
    the chosen accountant ("round toward more privacy"). The default, ``TIGHTEST``, needs the
    least noise (σ = 1.1514 for ε = 3, δ = 1e-5, q = 0.02, T = 1000, where RDP alone asks
    1.2168, whose PLD ε is 2.72).

    >>> sigma = calibrate_noise(3.0, 1e-5, 256 / 60000, 14063, Accountant.RDP)
    >>> epsilon(SubsampledGaussian(sigma, 256 / 60000, 14063), 1e-5, Accountant.RDP) <= 3.0
    True
    """
    target = positive_float("target_epsilon", target_epsilon)
    delta = open_unit_float("delta", delta)
    q = unit_interval_float("sample_rate", sample_rate)
    steps = positive_int("steps", steps)
    tolerance = positive_float("tolerance", tolerance)
    max_noise_multiplier = positive_float("max_noise_multiplier", max_noise_multiplier)
    accountant = _coerce_accountant(accountant)
    _warn_if_deprecated(accountant)
    return calibrate_plan(
        lambda sigma: SubsampledGaussian(sigma, q, steps),
        target,
        delta,
        accountant,
        tolerance=tolerance,
        max_noise_multiplier=max_noise_multiplier,
        what=f"DP-SGD with sample_rate={q}, steps={steps}",
    )
