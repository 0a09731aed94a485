"""The DP-SGD noise as :class:`GaussianNoise` draws it: its law, and that its only secret is
the trial's secret generator (:mod:`raydp_hpo.trainables.secret_rng`).

The noise is a float64 draw seeded from that generator, and the release is rounded to the
public grid λ = 2^(⌊log₂ s⌋ − 8) (issue 40, :mod:`raydp_hpo.trainables.dp_step.noise`): the
law tests add a uniform dither of one grid step (the test's own randomness) so that the
rounded Gaussian is compared with the continuous one it is post-processing of."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch import nn

from raydp_hpo.trainables.dp_step import GaussianNoise
from raydp_hpo.trainables.dp_step.noise import snap_grid
from raydp_hpo.trainables.secret_rng import secret_generator


def _noise(n: int, std: float, generator: torch.Generator, releases: int = 1) -> list[np.ndarray]:
    """``releases`` consecutive noise vectors of one parameter of ``n`` values whose clipped
    sum is zero, at noise standard deviation ``std`` (σ = std, C = 1, normaliser 1)."""
    p = nn.Parameter(torch.zeros(n))
    noise = GaussianNoise(std, 1.0, 1.0, generator)
    out = []
    for _ in range(releases):
        p.grad = torch.zeros(n)
        noise.privatise([p])
        out.append(p.grad.double().numpy().copy())
    return out


def test_the_noise_law_is_standard_normal():
    """2·10⁶ values of one release at std 1: mean, variance, kurtosis and tail mass within
    ~4.5 standard errors, and a KS test at p > 1e-3."""
    (z,) = _noise(2_000_000, 1.0, secret_generator("cpu", 2024))
    lam = snap_grid(1.0)
    np.testing.assert_array_equal(z / lam, np.round(z / lam))  # on the grid
    z = z + np.random.default_rng(0).uniform(-lam / 2, lam / 2, z.size)  # N ⊛ U(λ): ≈ N
    n = z.size
    assert abs(z.mean()) < 4.5 / np.sqrt(n)
    assert abs(z.var() - 1) < 4.5 * np.sqrt(2 / n)
    assert abs(np.mean(z**4) - 3) < 4.5 * np.sqrt(96 / n)
    beyond3 = np.mean(np.abs(z) > 3)
    p3 = 2 * stats.norm.sf(3)
    assert abs(beyond3 - p3) < 4.5 * np.sqrt(p3 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3


def test_the_noise_has_exactly_the_declared_scale():
    """σ·C/normaliser is the standard deviation: the same generator state at std 1 and at
    std 0.37 gives the same values scaled by 0.37, up to each release's grid (half a step
    each) and float32 rounding (relative 1e-6)."""
    (a,) = _noise(10_000, 1.0, secret_generator("cpu", 5))
    (b,) = _noise(10_000, 0.37, secret_generator("cpu", 5))
    grid = snap_grid(0.37) / 2 + 0.37 * snap_grid(1.0) / 2
    np.testing.assert_allclose(b, 0.37 * a, rtol=1e-6, atol=grid)
    assert np.abs(b - 0.37 * a).max() > 0  # the grids differ: not trivially equal


def test_consecutive_releases_and_neighbouring_values_are_uncorrelated():
    a, b = _noise(400_000, 1.0, secret_generator("cpu", 7), releases=2)
    bound = 4.5 / np.sqrt(a.size)
    assert abs(np.corrcoef(a, b)[0, 1]) < bound  # two releases: the generator advanced
    for lag in (1, 2, 16, 64):
        assert abs(np.corrcoef(a[:-lag], a[lag:])[0, 1]) < bound


def test_the_values_are_a_function_of_the_generator_state_only():
    """The only secret is the trial's generator: the same state gives the same noise, the
    global torch RNG plays no part, a release advances the generator, and another secret
    seed gives other noise."""
    gen = secret_generator("cpu", 11, 3)
    twin = torch.Generator()
    twin.set_state(gen.get_state())
    torch.manual_seed(0)
    (first,) = _noise(5000, 0.3, gen)
    torch.manual_seed(12345)
    (again,) = _noise(5000, 0.3, twin)
    np.testing.assert_array_equal(first, again)
    assert torch.equal(gen.get_state(), twin.get_state())
    assert not torch.equal(gen.get_state(), secret_generator("cpu", 11, 3).get_state())
    (other,) = _noise(5000, 0.3, secret_generator("cpu", 11, 4))
    assert not np.array_equal(first, other)
