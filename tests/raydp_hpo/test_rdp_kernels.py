"""The port of dp-accounting's RDP kernels agrees with dp-accounting itself.

Every function of :mod:`raydp_hpo._rdp_kernels` is checked against the dp-accounting 0.6
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

from raydp_hpo import _rdp_kernels as port
from raydp_hpo.rdp import DEFAULT_ORDERS, subsampled_gaussian_rdp

RTOL = 1e-12


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
        "import raydp_hpo.ledger_actor, raydp_hpo.ledger\n"
        "from raydp_hpo.budget import PrivacyBudget\n"
        "from raydp_hpo.ledger import PrivacyLedger\n"
        "from raydp_hpo.mechanisms import Laplace, RandomStopping, SubsampledGaussian\n"
        "led = PrivacyLedger(PrivacyBudget(8.0, 1e-5))\n"
        "led.charge('a', SubsampledGaussian(1.1, 0.01, 100))\n"
        "led.charge('b', RandomStopping(SubsampledGaussian(1.1, 0.01, 100), 'geometric', 3.0))\n"
        "led.charge('c', Laplace(0.1))\n"
        "assert 'dp_accounting' not in sys.modules, 'RDP ledger imported dp_accounting'\n"
        "led.report()\n"
        "assert 'dp_accounting' in sys.modules, 'report() gives a PLD figure'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
