"""``Accountant.TIGHTEST``: the one default for the tightest valid figure of a fixed plan, and
:func:`calibrate_search` for a whole search plan."""

from __future__ import annotations

import warnings

import pytest

from raydp_hpo.accounting.accountants import Accountant, calibrate_noise, delta, epsilon
from raydp_hpo.accounting.calibration import calibrate_search
from raydp_hpo.accounting.mechanisms import (
    Gaussian,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
)
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

DELTA = 1e-5


def _search(sigma: float) -> RandomStopping:
    """KRW 2024's reference setting: geometric E[K]=10 over σ, q=0.01, T=1000."""
    return RandomStopping(SubsampledGaussian(sigma, 0.01, 1000), StoppingDistribution.GEOMETRIC,
                          mean=10)


def test_one_member_with_legacy_names_and_values() -> None:
    assert Accountant.TIGHTEST.value == "tightest"
    assert Accountant.PROFILE is Accountant.TIGHTEST  # deprecated alias, the same member
    assert Accountant("profile") is Accountant.TIGHTEST  # stored by earlier versions
    assert Accountant("tightest") is Accountant.TIGHTEST
    assert list(Accountant) == [Accountant.RDP, Accountant.PLD, Accountant.BEST,
                                Accountant.TIGHTEST]
    with pytest.raises(InvalidParameterError, match="unknown accountant 'moments'"):
        epsilon(Gaussian(5.0), DELTA, "moments")  # type: ignore[arg-type]


def test_epsilon_defaults_to_tightest_for_random_stopping() -> None:
    """Done-when: 4.10 under the old default (BEST), <= 2.9 now (2.8411 measured)."""
    got = epsilon(_search(1.0), DELTA)
    assert got <= 2.9
    assert got == epsilon(_search(1.0), DELTA, Accountant.TIGHTEST)
    assert got == pytest.approx(2.8411, abs=1e-3)
    assert epsilon(_search(1.0), DELTA, Accountant.RDP) == pytest.approx(4.10, abs=0.01)
    assert epsilon(_search(1.0), DELTA, "profile") == got  # the old string still works


def test_best_is_deprecated_and_looser() -> None:
    with pytest.warns(DeprecationWarning, match="TIGHTEST"):
        best = epsilon(_search(1.0), DELTA, Accountant.BEST)
    assert best == pytest.approx(4.10, abs=0.01)  # min of RDP and PLD leaves profiles out
    with pytest.warns(DeprecationWarning, match="TIGHTEST"):
        calibrate_noise(3.0, DELTA, 0.02, 100, Accountant.BEST)
    with pytest.warns(DeprecationWarning, match="TIGHTEST"):
        delta(Gaussian(5.0), 1.0, Accountant.BEST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for the default, PROFILE or RDP
        epsilon(Gaussian(5.0), DELTA)
        epsilon(Gaussian(5.0), DELTA, Accountant.PROFILE)
        epsilon(Gaussian(5.0), DELTA, Accountant.RDP)


def test_delta_default_is_tightest() -> None:
    eps = epsilon(_search(1.0), DELTA)
    assert delta(_search(1.0), eps) <= DELTA * (1 + 1e-6)
    assert delta(_search(1.0), eps) < delta(_search(1.0), eps, Accountant.RDP)


def _dp_accounting_pld_epsilon(sigma: float, q: float, steps: int) -> float:
    """Independent route: dp-accounting's own PLD accountant on its own events."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(DELTA))


def test_calibrate_noise_defaults_to_tightest() -> None:
    """Done-when: the default σ's dp-accounting PLD ε is in [2.94, 3.0] (measured 2.9954 at
    σ = 1.1514; the old RDP default gave σ = 1.2168, PLD ε = 2.725)."""
    sigma = calibrate_noise(3.0, DELTA, sample_rate=0.02, steps=1000)
    eps = _dp_accounting_pld_epsilon(sigma, 0.02, 1000)
    assert 2.94 <= eps <= 3.0
    rdp_sigma = calibrate_noise(3.0, DELTA, 0.02, 1000, Accountant.RDP)
    assert sigma < rdp_sigma * 0.96  # ~5% less noise than RDP alone asks
    assert _dp_accounting_pld_epsilon(rdp_sigma, 0.02, 1000) < 2.8


def test_calibrate_search_random_stopping() -> None:
    sigma = calibrate_search(_search, target_epsilon=3.0, delta=DELTA)
    assert epsilon(_search(sigma), DELTA) <= 3.0  # the guarantee
    # tight: 0.5% less noise misses the target (tolerance 1e-3 relative)
    assert epsilon(_search(sigma * 0.995), DELTA) > 3.0
    assert sigma == pytest.approx(0.9731, abs=2e-3)
    rdp = calibrate_search(_search, 3.0, DELTA, Accountant.RDP)
    assert epsilon(_search(rdp), DELTA, Accountant.RDP) <= 3.0
    assert sigma < rdp  # 0.973 vs 1.190: the tightest figure needs less noise


def test_calibrate_search_matches_calibrate_noise_on_one_run() -> None:
    def run(s: float) -> SubsampledGaussian:
        return SubsampledGaussian(s, 0.02, 200)

    assert calibrate_search(run, 2.0, DELTA, Accountant.RDP) == calibrate_noise(
        2.0, DELTA, 0.02, 200, Accountant.RDP)
    # a list of mechanisms is composed
    sigma = calibrate_search(lambda s: [run(s), Gaussian(s * 10)], 2.0, DELTA, "rdp")
    assert epsilon([run(sigma), Gaussian(sigma * 10)], DELTA, Accountant.RDP) <= 2.0


def test_calibrate_search_errors() -> None:
    # a part without noise: no σ reaches the target
    with pytest.raises(InvalidParameterError, match="no noise multiplier <= 100"):
        calibrate_search(lambda s: [Gaussian(s), Gaussian(0.1, 10_000)], 1.0, DELTA,
                         Accountant.RDP, max_noise_multiplier=100)
    with pytest.raises(InvalidParameterError, match="target_epsilon"):
        calibrate_search(_search, 0.0, DELTA)
    with pytest.raises(InvalidParameterError, match="delta"):
        calibrate_search(_search, 1.0, 1.0)
    with pytest.raises(InvalidParameterError, match="plan_of"):
        calibrate_search(_search(1.0), 1.0, DELTA)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="unknown accountant"):
        calibrate_search(_search, 1.0, DELTA, "moments")

    calls: list[float] = []

    def counted(s: float) -> Gaussian:
        calls.append(s)
        return Gaussian(s)

    calibrate_search(counted, 1.0, DELTA, Accountant.RDP)
    searched = len(calls) - 1  # the last call is the final check
    calls.clear()

    def drifting(s: float) -> Gaussian:  # not a function of σ alone: caught by the check
        calls.append(s)
        return Gaussian(s if len(calls) <= searched else s / 10)

    with pytest.raises(RayDPHPOError, match="calibration check failed"):
        calibrate_search(drifting, 1.0, DELTA, Accountant.RDP)
    # a tolerance below float resolution ends at adjacent floats instead of looping
    assert calibrate_search(Gaussian, 1.0, DELTA, Accountant.RDP, tolerance=1e-300) > 0
