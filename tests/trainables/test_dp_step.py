"""The DP step's pieces: Gaussian noise and its public normaliser, Poisson batches, clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from trainables.dp_step import GaussianNoise
from trainables.models import build_model

CUDA = torch.cuda.is_available()


def _params_with_grads(seed: int = 0) -> list[nn.Parameter]:
    torch.manual_seed(seed)
    model = build_model("cnn1d", (40,), 10)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


# -- A. Gaussian noise ------------------------------------------------------------------


def test_noise_on_cpu_is_the_sequential_per_parameter_draw():
    """Bit for bit: (g + N(0, σC) drawn parameter by parameter with the generator) / normaliser,
    the draws the CPU path made before the noise moved to the parameters' device."""
    params = _params_with_grads()
    grads = [p.grad.clone() for p in params]
    sigma, clip, normaliser = 1.3, 0.7, 0.05 * 4000
    GaussianNoise(sigma, clip, normaliser, torch.Generator().manual_seed(3)).privatise(params)
    ref = torch.Generator().manual_seed(3)
    for p, g in zip(params, grads):
        noise = torch.normal(0.0, sigma * clip, size=p.shape, generator=ref, device="cpu")
        assert torch.equal(p.grad, (g + noise) / normaliser)


def test_noise_divides_by_the_public_normaliser_and_counts_releases():
    params = _params_with_grads()
    grads = [p.grad.clone() for p in params]
    noise = GaussianNoise(0.0, 1.0, 37.5, torch.Generator().manual_seed(0))
    noise.privatise(params)
    noise.privatise(params)
    assert noise.releases == 2
    for p, g in zip(params, grads):
        torch.testing.assert_close(p.grad, g / 37.5**2, rtol=1e-6, atol=0)


def test_noise_has_the_declared_standard_deviation():
    p = nn.Parameter(torch.zeros(200_000))
    p.grad = torch.zeros_like(p)
    GaussianNoise(2.0, 0.5, 4.0, torch.Generator().manual_seed(1)).privatise([p])
    # std of the mean-zero output: σC/normaliser = 0.25; 200k draws: s.e. of s ≈ 0.25/632.
    assert float(p.grad.std()) == pytest.approx(0.25, rel=0.01)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "128"])
def test_normaliser_must_be_a_positive_finite_number(bad):
    with pytest.raises(InvalidParameterError, match="normaliser"):
        GaussianNoise(1.0, 1.0, bad, torch.Generator())


@pytest.mark.parametrize(("sigma", "clip"), [(-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0)])
def test_noise_multiplier_and_clip_norm_are_checked(sigma, clip):
    with pytest.raises(InvalidParameterError):
        GaussianNoise(sigma, clip, 10.0, torch.Generator())


def test_refused_privatise_changes_nothing():
    params = _params_with_grads()
    params[-1].grad = None
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    noise = GaussianNoise(1.0, 1.0, 10.0, gen)
    with pytest.raises(RayDPHPOError, match="p.grad"):
        noise.privatise(params)
    assert noise.releases == 0 and torch.equal(gen.get_state(), state)
    for p, g in zip(params[:-1], grads[:-1]):
        assert torch.equal(p.grad, g)


def test_generator_on_another_device_is_refused_before_any_draw():
    p = nn.Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    with pytest.raises(RayDPHPOError, match="Generator"):
        GaussianNoise(1.0, 1.0, 10.0, gen).privatise([p])
    assert torch.equal(gen.get_state(), state)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (the device path is exercised on CPU only)")
def test_noise_is_drawn_on_the_gpu_with_a_gpu_generator():
    params = [nn.Parameter(torch.zeros(1000, device="cuda"))]
    params[0].grad = torch.zeros_like(params[0])
    gen = torch.Generator(device="cuda").manual_seed(0)
    GaussianNoise(1.0, 1.0, 1.0, gen).privatise(params)
    assert params[0].grad.device.type == "cuda"
    assert float(params[0].grad.std()) == pytest.approx(1.0, rel=0.15)
