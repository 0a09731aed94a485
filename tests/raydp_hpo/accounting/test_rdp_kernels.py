"""The port of dp-accounting's RDP kernels agrees with dp-accounting itself.

Every function of :mod:`raydp_hpo.accounting._rdp_kernels` is checked against the dp-accounting 0.6
function it was ported from, on grids covering DP-SGD, selection-noise and random-stopping
settings (including non-convergent fractional-order series and the logarithmic, geometric,
truncated negative binomial and Poisson stopping distributions). Relative tolerance 1e-12:
the port is the same arithmetic, so agreement is expected to the last few ulps.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as lib

from raydp_hpo.accounting import _rdp_kernels as port
from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, subsampled_gaussian_rdp

RTOL = 1e-12
# The golden subsampled-Gaussian curves were recorded with an older numpy/scipy; at tiny values
# (q = 1e-4, σ = 50: ε(α) ≈ 1e-10) the log-sum-exp series differs by ~1e-10 relative between
# library versions. 1e-9 still catches any change of formula (those move values by > 1e-3).
GOLDEN_RTOL = 1e-9


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-300)


@pytest.mark.parametrize("q", [1e-4, 0.004, 0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("sigma", [0.3, 0.6, 1.0, 1.1, 2.0, 8.0, 50.0])
def test_log_a_frac_matches_dp_accounting(q: float, sigma: float) -> None:
    fractional = [a for a in DEFAULT_ORDERS if not float(a).is_integer()]
    for alpha in fractional:
        ours = port.log_a_frac(q, sigma, float(alpha))
        theirs = lib._compute_log_a_frac(q, sigma, float(alpha))  # noqa: SLF001
        assert _close(ours, theirs), (q, sigma, alpha, ours, theirs)


def test_log_a_frac_non_convergence_claims_nothing() -> None:
    # Near α = 1 with q close to 1 the series does not converge: both give +inf.
    assert port.log_a_frac(0.999, 0.3, 1.01) == lib._compute_log_a_frac(0.999, 0.3, 1.01)  # noqa: SLF001


@pytest.mark.parametrize("eps", [0.0, 1e-3, 0.1, 0.5, 1.0, 3.0, 10.0])
def test_laplace_rdp_matches_dp_accounting(eps: float) -> None:
    for alpha in [1.0, 1.01, 1.05, 1.09, 1.1, 1.5, *DEFAULT_ORDERS[::7]]:
        ours = port.laplace_rdp(eps, float(alpha))
        theirs = lib._laplace_rdp(eps, float(alpha))  # noqa: SLF001
        assert _close(ours, theirs), (eps, alpha)


@pytest.mark.parametrize("epsilon", [0.0, 0.05, 0.5, 1.0, 4.0, 20.0])
@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.1, 1000), (0.1, 0.8, 50), (1.0, 5.0, 3)])
def test_compute_delta_matches_dp_accounting(epsilon: float, q: float, sigma: float,
                                             steps: int) -> None:
    rdp = subsampled_gaussian_rdp(q, sigma) * steps
    ours = port.compute_delta(DEFAULT_ORDERS, rdp, epsilon)
    theirs = lib.compute_delta(list(DEFAULT_ORDERS), list(rdp), epsilon)
    assert _close(ours[0], theirs[0]) and ours[1] == theirs[1]


def test_compute_delta_negative_and_zero_rdp_give_zero_delta() -> None:
    rdp = np.full(DEFAULT_ORDERS.shape, -1e-15)
    assert port.compute_delta(DEFAULT_ORDERS, rdp, 0.1)[0] == 0.0
    assert port.compute_delta(DEFAULT_ORDERS, np.zeros_like(DEFAULT_ORDERS), 0.1)[0] == 0.0


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 2.0, math.inf])
@pytest.mark.parametrize("mean", [1.0, 3.0, 10.0, 100.0])
@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.0, 500), (1.0, 10.0, 1)])
def test_repeat_and_select_matches_dp_accounting(shape: float, mean: float, q: float,
                                                 sigma: float, steps: int) -> None:
    base = subsampled_gaussian_rdp(q, sigma) * steps
    ours = port.repeat_and_select_rdp(DEFAULT_ORDERS, base, mean, shape)
    theirs = np.asarray(
        lib._compute_rdp_repeat_and_select(list(DEFAULT_ORDERS), list(base), mean, shape)  # noqa: SLF001
    )
    finite = np.isfinite(theirs)
    assert np.array_equal(finite, np.isfinite(ours))
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=RTOL)


@pytest.mark.parametrize("shape", [0.0, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("mean", [1.0, 1.5, 10.0, 1e4])
def test_truncated_negative_binomial_gamma_matches_dp_accounting(shape: float, mean: float) -> None:
    ours = port.truncated_negative_binomial_gamma(shape, mean)
    theirs = lib._gamma_truncated_negative_binomial(shape, mean)  # noqa: SLF001
    assert ours == theirs


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: port.compute_delta([2.0], [1.0], -1.0), "epsilon"),
        (lambda: port.compute_delta([0.5], [1.0], 1.0), "order"),
        (lambda: port.compute_delta([2.0, 3.0], [1.0], 1.0), "length"),
        (lambda: port.laplace_rdp(-1.0, 2.0), "eps"),
        (lambda: port.laplace_rdp(1.0, 0.5), "order"),
        (lambda: port.repeat_and_select_rdp([2.0], [1.0], 0.5, 1.0), "mean"),
        (lambda: port.repeat_and_select_rdp([2.0], [1.0], 2.0, -1.0), "shape"),
    ],
)
def test_invalid_arguments_are_refused(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_ledger_and_its_actor_client_do_not_import_dp_accounting() -> None:
    """The point of the port: an RDP ledger and every trial worker start without the PLD stack."""
    code = (
        "import sys\n"
        "import raydp_hpo.ledger.actor, raydp_hpo.ledger\n"
        "from raydp_hpo.accounting.budget import PrivacyBudget\n"
        "from raydp_hpo.ledger.filter import PrivacyLedger\n"
        "from raydp_hpo.accounting.mechanisms import Laplace, RandomStopping, SubsampledGaussian\n"
        "led = PrivacyLedger(PrivacyBudget(8.0, 1e-5))\n"
        "led.charge('a', SubsampledGaussian(1.1, 0.01, 100))\n"
        "led.charge('b', RandomStopping(SubsampledGaussian(1.1, 0.01, 100), 'geometric', 3.0))\n"
        "led.charge('c', Laplace(0.1))\n"
        "assert 'dp_accounting' not in sys.modules, 'RDP ledger imported dp_accounting'\n"
        "led.report()\n"
        "assert 'dp_accounting' in sys.modules, 'report() gives a PLD figure'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- Vectorised kernels (issue 15): same values as the scalar loops they replaced ------------


@pytest.mark.parametrize("q", [1e-4, 0.004, 0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("sigma", [0.3, 0.6, 1.0, 1.1, 2.0, 8.0, 50.0])
def test_vectorised_log_a_frac_matches_dp_accounting(q: float, sigma: float) -> None:
    """Every fractional order at once, incl. the non-convergent (+inf) ones, rel 1e-12."""
    fractional = np.array([a for a in DEFAULT_ORDERS if not float(a).is_integer()])
    ours = port.log_a_frac_orders(q, sigma, fractional)
    for alpha, value in zip(fractional, ours):
        theirs = lib._compute_log_a_frac(q, sigma, float(alpha))  # noqa: SLF001
        assert _close(float(value), theirs), (q, sigma, alpha, value, theirs)


# Values of subsampled_gaussian_rdp computed by the code before issue 15 (per-order Python
# loops for fractional and large orders, gammaln per call), at the orders of ORDERS_IDX. The
# vectorised code reproduced them bit for bit; the tolerance is 1e-12 relative.
ORDERS_IDX = [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 41, 64, 87, 110, 133, 156, 179, 202,
              225, 248, 271, 294, 296, 298, 300, 302]
GOLDEN_SUBSAMPLED_GAUSSIAN = {
    (256 / 60000, 1.1): [
        1.2038211816840198e-05, 1.5409722802191686e-05, 1.9999272927312504e-05,
        2.6372748879333187e-05, 3.839066985874085e-05, 5.06061224360946e-05,
        6.302727960422205e-05, 7.566498608634235e-05, 8.85317728664561e-05,
        0.0001016425972962871, 0.00011501695278052483, 0.00011840499150502084,
        4.6462849402695765, 14.261683615231773, 23.803964544243005, 33.32737622497587,
        42.843142606837326, 52.35505883818799, 61.86476479794914, 71.37308485768659,
        80.88047876308126, 90.38722315763819, 99.8934944832778, 126.75737622215135,
        179.6548366653419, 311.8913348725545, 840.8214035242561,
    ],
    (0.05, 0.7): [
        0.008239502405109424, math.inf, 0.013502493008348927, 0.021291512798251776,
        0.07241671131545109, 0.5225085701180368, 1.6609722290522744, 2.8117096534516093,
        3.9229734597517973, 5.0094387344124, 6.079925211557073, 6.3457068078800924,
        22.38964963001392, 45.92012057863701, 69.41045114294627, 92.89042289840036,
        116.36619755026656, 139.8398585528439, 163.31230616416283, 186.7839929463684,
        210.25517128988758, 233.72599306601631, 257.1965551375497, 323.5254889610821,
        454.14042300739374, 780.6738313354873, 2086.798722619307,
    ],
    (1e-4, 50.0): [
        2.3541667898194233e-12, 2.9042627286496194e-12, 3.5709034683200735e-12,
        4.500904044948162e-12, 6.5013008957646486e-12, 8.501701085863541e-12,
        1.0502101646243966e-11, 1.2502502649524944e-11, 1.4502903547267348e-11,
        1.6503304576861437e-11, 1.8503705863014478e-11, 1.900380625839935e-11,
        5.001004726437261e-11, 9.601937697590123e-11, 1.4202879799831068e-10,
        1.8803829496693887e-10, 2.340478849400845e-10, 2.8005756818821053e-10,
        3.260673096625547e-10, 3.720771453141458e-10, 4.180870798136052e-10,
        4.640970431730844e-10, 5.101071816835206e-10, 6.401361673842574e-10,
        8.961953029206605e-10, 1.5363544423697874e-09, 4.097154884077047e-09,
    ],
}


@pytest.mark.parametrize(("q", "sigma"), list(GOLDEN_SUBSAMPLED_GAUSSIAN))
def test_subsampled_gaussian_curve_unchanged_by_vectorisation(q: float, sigma: float) -> None:
    ours = subsampled_gaussian_rdp(q, sigma)[ORDERS_IDX]
    golden = np.array(GOLDEN_SUBSAMPLED_GAUSSIAN[(q, sigma)])
    assert np.array_equal(np.isinf(ours), np.isinf(golden))
    finite = np.isfinite(golden)
    np.testing.assert_allclose(ours[finite], golden[finite], rtol=GOLDEN_RTOL, atol=0)


@pytest.mark.parametrize("epsilon", [0.0, 0.01, 0.5, 3.0])
def test_compute_deltas_equals_compute_delta_per_epsilon(epsilon: float) -> None:
    rdp = subsampled_gaussian_rdp(0.02, 0.9) * 300
    rdp[5] = -1e-15  # a negative (numerical-noise) order must give δ = 0 there
    eps = np.array([epsilon, epsilon * 2 + 0.1, 7.0])
    ours = port.compute_deltas(DEFAULT_ORDERS, rdp, eps)
    for e, d in zip(eps, ours):
        assert _close(float(d), port.compute_delta(DEFAULT_ORDERS, rdp, float(e))[0])


def test_monotone_envelope_equals_its_quadratic_definition() -> None:
    """v'(λ) = min{v(λ') : λ' ≥ λ}, on unsorted orders with ties, infinities and orders ≤ 1."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        orders = rng.choice([0.5, 1.0, 1.5, 2.0, 2.0, 3.0, 7.0, 7.0, 20.0], size=12)
        values = rng.exponential(size=12)
        values[rng.random(12) < 0.2] = np.inf
        ours = port._monotone_from_above(orders, values)  # noqa: SLF001
        quadratic = [min(values[j] for j in range(12) if o <= orders[j]) for o in orders]
        np.testing.assert_array_equal(ours, quadratic)
