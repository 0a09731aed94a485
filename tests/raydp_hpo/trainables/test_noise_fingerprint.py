"""The noise as implemented is the noise the certificate assumes (issue 40): no Box–Muller
fingerprint in released values on any engine, and the documented floor under δ.

The probe (the issue's): for a released value v and its known noiseless value g, recover
z = (v − g)/s, s the noise's std; pair elements j and j + 8 of each block of 16 (torch's CPU
``normal_`` layout) and take R² = z_j² + z_{j+8}². torch's Box–Muller draws u on a grid of
2^-bits and sets R² = −2 ln u, so exp(−R²/2)·2^bits is an integer for every pair it drew:
24 bits in float32, 53 in float64. Someone who knows g can tell it from a neighbour's g′ by
how many pairs with R > 4 show integers centred on each. After the fix the noise is no
Box–Muller pair at all, and centred on the truth the probe finds no more than centred 0.01·s
off. Each engine's test fails on the code before issue 40 (100% of the pairs centred on the
truth).
"""

from __future__ import annotations

import copy
import math
from unittest import mock

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils.data import TensorDataset

import raydp_hpo
from raydp_hpo.trainables.dp_step import GaussianNoise, make_clipper
from raydp_hpo.trainables.dp_step import noise as noise_module
from raydp_hpo.trainables.native_private import (
    DPEngine,
    NativeDPOptimizer,
    NativePrivateModule,
)
from raydp_hpo.trainables.secret_rng import secret_generator
from tests.raydp_hpo.trainables.test_session import _ledger

#: radius above which the issue's probe looks (a fraction e⁻⁸ of the pairs)
R_MIN = 4.0
#: |exp(−R²/2)·2^bits − nearest integer| below this counts as "integer" (chance: 10%)
TOL = 0.05


def probe(released: np.ndarray, truth: np.ndarray, std: float, bits: int,
          shift: float = 0.0) -> tuple[int, int]:
    """(pairs with R > R_MIN, how many of them look drawn by Box–Muller on 2^-bits uniforms)
    with the noise recovered around ``truth + shift·std``."""
    z = (released.astype(np.float64) - truth.astype(np.float64)) / std - shift
    n = z.size // 16 * 16
    blocks = z[:n].reshape(-1, 16)
    r2 = blocks[:, :8].ravel() ** 2 + blocks[:, 8:].ravel() ** 2
    k = np.exp(-r2[r2 > R_MIN**2] / 2) * 2.0**bits
    return int(k.size), int(np.sum(np.abs(k - np.round(k)) < TOL))


def assert_no_fingerprint(released: np.ndarray, truth: np.ndarray, std: float) -> None:
    """For 24- and 53-bit uniforms: centred on the truth the probe finds no more integer
    pairs than centred 0.01·std off (both at chance, ~TOL·2), with enough pairs to see it."""
    for bits in (24, 53):
        pairs, hits = probe(released, truth, std, bits)
        off_pairs, off_hits = probe(released, truth, std, bits, shift=0.01)
        assert pairs >= 40 and off_pairs >= 40
        rate, off_rate = hits / pairs, off_hits / off_pairs
        assert rate < 0.3 and rate <= off_rate + 0.12, (
            f"{bits}-bit Box–Muller fingerprint: {hits}/{pairs} pairs centred on the truth, "
            f"{off_hits}/{off_pairs} centred off")


def test_probe_sees_the_fingerprint_of_torch_normal():
    """The probe has power: torch's own ``normal_`` in float32 and in float64, added to a
    known value, shows it on (nearly) every pair centred on the truth."""
    for dtype, bits in ((torch.float32, 24), (torch.float64, 53)):
        g = torch.Generator().manual_seed(0)
        truth = (torch.randn(2**21, generator=g, dtype=dtype) * 0.1).numpy()
        noise = torch.empty(2**21, dtype=dtype).normal_(0.0, 1.0, generator=g).numpy()
        pairs, hits = probe(truth + noise, truth, 1.0, bits)
        off_pairs, off_hits = probe(truth + noise, truth, 1.0, bits, shift=0.01)
        assert pairs > 100 and hits / pairs > 0.9 and off_hits / off_pairs < 0.3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_built_in_step_releases_no_fingerprint(dtype):
    """The built-in trainable's step: book-keeping clipping fused with GaussianNoise
    (privatise_with), a 2²⁰-parameter layer, σ = 1.3, C = 0.7, normaliser 4; the truth is the
    same release at σ = 0 (the same clipped sum, written the same way)."""
    torch.manual_seed(0)
    model = nn.Linear(1024, 1024).to(dtype)
    x, y = torch.randn(6, 1024, dtype=dtype), torch.randint(0, 1024, (6,))
    params = list(model.parameters())
    clipper = make_clipper(model, "auto")
    released, truth = [], []
    for sigma, out in ((1.3, released), (0.0, truth)):
        noise = GaussianNoise(sigma, 0.7, 4.0, secret_generator("cpu", 40, int(sigma * 10)))
        clipper.privatised_gradient(x, y, 0.7, noise, params)
        out.extend(p.grad.detach().flatten().numpy().copy() for p in params)
    assert_no_fingerprint(np.concatenate(released), np.concatenate(truth), 1.3 * 0.7 / 4.0)


def test_gaussian_noise_privatise_releases_no_fingerprint():
    """GaussianNoise.privatise on a known clipped sum (the issue's check: σ = 1.3, C = 0.7)."""
    p = nn.Parameter(torch.zeros(2**21))
    s = torch.randn(2**21, generator=torch.Generator().manual_seed(1)) * 0.2
    p.grad = s.clone()
    GaussianNoise(1.3, 0.7, 4.0, secret_generator("cpu", 41)).privatise([p])
    assert_no_fingerprint(p.grad.numpy(), (s / 4.0).numpy(), 1.3 * 0.7 / 4.0)


def _native_release(sigma: float, model: nn.Module, x: torch.Tensor, y: torch.Tensor
                    ) -> np.ndarray:
    module = NativePrivateModule(model)
    opt = NativeDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), module,
                            noise_multiplier=sigma, max_grad_norm=0.7, expected_batch_size=4,
                            generator=secret_generator("cpu", 42))
    opt.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()
    opt.privatise()
    return np.concatenate([p.grad.detach().flatten().numpy().copy()
                           for p in model.parameters()])


def test_native_engine_releases_no_fingerprint():
    """make_private's native engine (NativeDPOptimizer): the same batch through a copy of the
    model at σ = 0 gives the noiseless release."""
    torch.manual_seed(0)
    model = nn.Linear(1024, 1024)
    x, y = torch.randn(6, 1024), torch.randint(0, 1024, (6,))
    truth = _native_release(0.0, copy.deepcopy(model), x, y)
    released = _native_release(1.3, model, x, y)
    assert_no_fingerprint(released, truth, 1.3 * 0.7 / 4.0)


def test_opacus_engine_releases_no_fingerprint():
    """make_private's Opacus engine, as a trial gets it: Opacus keeps the clipped sum in
    ``p.summed_grad``; p.grad = release / expected batch size (16, a power of two: exact)."""
    n = 160
    data = TensorDataset(torch.randn(n, 1024), torch.randint(0, 1024, (n,)))
    config = {"lr": 0.0, "epochs": 1, "batch_size": 16, "noise_multiplier": 1.3,
              "max_grad_norm": 0.7,
              "raydp": {"charge": True, "charge_id": "exp/t1", "experiment": "exp",
                        "dataset_size": n}}
    with mock.patch.object(raydp_hpo.trainables.session.TrialSession, "_finish"), \
            raydp_hpo.trial_session(config, ledger=_ledger()) as trial:
        model = nn.Linear(1024, 1024)
        model, opt, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.0), data, engine=DPEngine.OPACUS)
        assert trial.expected_batch_size == 16
        x, y = next(iter(loader))
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        params = [p for p in model.parameters()]
        released = np.concatenate([(p.grad * 16).detach().flatten().numpy() for p in params])
        truth = np.concatenate([p.summed_grad.detach().flatten().numpy() for p in params])
    assert_no_fingerprint(released, truth, 1.3 * 0.7)


# -- the floor under δ --------------------------------------------------------------------


def test_support_bound_and_floor_are_the_documented_ones():
    """B = √2·√(−2 ln 2⁻⁵³) = 12.12; per release and coordinate 2·Φ̄(B − 1/σ): 9.8e-29 at
    σ = 1, 4.4e-24 at σ = 0.5, 1.5e-18 at σ = 0.3 (module docstring), times d and T."""
    assert math.isclose(noise_module.SUPPORT_BOUND, 12.122178116110506, rel_tol=1e-15)
    for sigma, floor in ((1.0, 9.785e-29), (0.5, 4.405e-24), (0.3, 1.511e-18)):
        assert noise_module.noise_floor_delta(sigma, 1) == pytest.approx(floor, rel=1e-3)
        assert noise_module.noise_floor_delta(sigma, 1) == pytest.approx(
            2 * stats.norm.sf(noise_module.SUPPORT_BOUND - 1 / sigma), rel=1e-9)
    # the docstring's example: 10⁶ parameters, 10⁴ releases, σ = 0.5
    assert noise_module.noise_floor_delta(0.5, 10**6, 10**4) < 4.5e-14
    assert noise_module.noise_floor_delta(0.05, 10) == 1.0  # σ ≤ 1/B: no bound


def test_secure_draw_reaches_exactly_the_support_bound():
    """The bound is the draw's: with every uniform at its smallest value 2⁻⁵³, the sum of two
    Box–Muller draws is B in the first half (cos 0) and 0 in the second (sin 0)."""
    with mock.patch.object(noise_module.os, "urandom", lambda k: bytes(k)):
        z = noise_module._secure_normal(8)
    assert z.max() == pytest.approx(noise_module.SUPPORT_BOUND, rel=1e-12)
    assert z.max() <= noise_module.SUPPORT_BOUND * (1 + 1e-15)


def test_numpy_ziggurat_tail_bound_exceeds_the_support_bound():
    """The CPU's seeded draw (numpy's ziggurat) reaches further out than B: its tail
    r − ln(1 − U)/r with U ≤ 1 − 2⁻⁵³ is bounded by 13.71, and values above the float32
    Box–Muller cap 5.77 occur at the Gaussian rate (here: among 4·10⁷ draws, ~0.3 expected
    above 5.77 — checked instead above 4.5, 2.7e5 expected per 4e7 at the Gaussian rate)."""
    r = 3.6541528853610088
    assert r - math.log(2.0**-53) / r == pytest.approx(13.7076, abs=1e-3)
    assert r - math.log(2.0**-53) / r > noise_module.SUPPORT_BOUND
    normal = noise_module.StandardNormal64(secret_generator("cpu", 43))
    z = normal.fill_(torch.empty(4 * 10**6, dtype=torch.float64)).numpy()
    expected = 4 * 10**6 * 2 * stats.norm.sf(4.5)
    assert abs(np.sum(np.abs(z) > 4.5) - expected) < 5 * math.sqrt(expected)


# -- secure mode ----------------------------------------------------------------------------


def test_secure_source_draws_from_os_urandom_with_the_normal_law():
    p = nn.Parameter(torch.zeros(400_000))
    p.grad = torch.zeros_like(p)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    noise = GaussianNoise(1.0, 1.0, 1.0, gen, raydp_hpo.NoiseSource.SECURE)
    with mock.patch.object(noise_module.os, "urandom", wraps=noise_module.os.urandom) as ur:
        noise.privatise([p])
    assert ur.called and torch.equal(gen.get_state(), state)  # the seeded generator unused
    z = p.grad.double().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.var() - 1) < 4.5 * math.sqrt(2 / z.size)


def test_noise_source_is_an_enum_with_a_clear_error():
    assert noise_module.noise_source("secure") is raydp_hpo.NoiseSource.SECURE
    assert noise_module.noise_source("SEEDED") is raydp_hpo.NoiseSource.SEEDED
    with pytest.raises(raydp_hpo.InvalidParameterError,
                       match=r"noise_source must be a raydp_hpo.NoiseSource \(SEEDED, SECURE\)"):
        GaussianNoise(1.0, 1.0, 1.0, torch.Generator(), "fast")  # type: ignore[arg-type]


def test_release_is_on_the_public_grid():
    """Every released value is a multiple of λ = 2^(⌊log₂ s⌋ − 8); s = 0.2275 → λ = 2⁻¹¹."""
    s = 1.3 * 0.7 / 4.0
    assert noise_module.snap_grid(s) == 2.0**-11
    p = nn.Parameter(torch.zeros(10_000))
    p.grad = torch.randn(10_000)
    GaussianNoise(1.3, 0.7, 4.0, secret_generator("cpu", 44)).privatise([p])
    scaled = p.grad.double() / 2.0**-11
    assert torch.equal(scaled, scaled.round())


def test_built_in_trainable_takes_noise_source_from_its_config():
    """``noise_source: secure`` in a trial's config (a constant of the search space or an
    experiment file's space) makes the built-in step draw from os.urandom; a bad value is
    refused with the enum's names."""
    from raydp_hpo.trainables.data import load_mnist1d, split
    from raydp_hpo.trainables.training import TRAINABLE_CONFIG_KEYS, _Runner, declared_privacy

    assert "noise_source" in TRAINABLE_CONFIG_KEYS
    data = split(load_mnist1d(num_samples=300, seed=0), 0.2, 0.2, seed=0)
    config = {"lr": 0.3, "epochs": 1, "sample_rate": 0.2, "noise_multiplier": 1.0,
              "max_grad_norm": 1.0, "model": "mlp", "model_kwargs": {"hidden": [16]},
              "noise_source": "secure"}
    privacy, n_view = declared_privacy(config, data)
    runner = _Runner(config, data.train, privacy, False, 0, torch.device("cpu"), seed=5,
                     normaliser=privacy.sample_rate * n_view)
    assert runner.noise.source is raydp_hpo.NoiseSource.SECURE
    with mock.patch.object(noise_module.os, "urandom", wraps=noise_module.os.urandom) as ur:
        runner.step()
    assert ur.called
    with pytest.raises(raydp_hpo.InvalidParameterError, match="noise_source must be"):
        _Runner({**config, "noise_source": "fast"}, data.train, privacy, False, 0,
                torch.device("cpu"), seed=5, normaliser=privacy.sample_rate * n_view)


def test_make_private_takes_noise_source():
    """``make_private(..., noise_source=NoiseSource.SECURE)`` on both engines."""
    from tests.raydp_hpo.trainables.test_session import TRAIN, _config
    from tests.raydp_hpo.tune._user_trainables import TinyMLP

    for engine in (DPEngine.NATIVE, DPEngine.OPACUS):
        with mock.patch.object(raydp_hpo.trainables.session.TrialSession, "_finish"), \
                raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
            model = TinyMLP(8)
            model, opt, loader = trial.make_private(
                model, torch.optim.SGD(model.parameters(), lr=0.1), TRAIN, engine=engine,
                noise_source=raydp_hpo.NoiseSource.SECURE)
            x, y = next(iter(loader))
            nn.functional.cross_entropy(model(x), y).backward()
            with mock.patch.object(noise_module.os, "urandom",
                                   wraps=noise_module.os.urandom) as ur:
                opt.step()
            assert ur.called, engine


def test_a_floor_above_delta_over_1000_is_warned():
    """σ = 0.15 over 10⁴ values and 1000 releases: 2·Φ̄(12.12 − 6.67)·10⁷ ≈ 5e-1 > δ/1000;
    σ = 1 is silent (9.8e-22)."""
    with pytest.warns(noise_module.NoiseFloorWarning, match="noise_multiplier=0.15"):
        noise_module.warn_noise_floor(0.15, 10_000, 1000, 1e-5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert noise_module.warn_noise_floor(1.0, 10_000, 1000, 1e-5) < 1e-20
        assert noise_module.warn_noise_floor(0.0, 10_000, 1000, 1e-5) == 0.0


def test_the_float64_stream_resumes_from_its_state():
    """A checkpoint keeps the CPU stream (seeded once from the torch generator): restoring
    both states continues the same noise; without the stream state the noise is fresh."""
    gen = secret_generator("cpu", 45)
    normal = noise_module.StandardNormal64(gen)
    normal.fill_(torch.empty(1001, dtype=torch.float64))
    saved, gen_state = normal.stream_state(), gen.get_state()
    expected = normal.fill_(torch.empty(77, dtype=torch.float64)).clone()
    twin_gen = torch.Generator()
    twin_gen.set_state(gen_state)
    twin = noise_module.StandardNormal64(twin_gen)
    twin.load_stream_state(saved)
    assert torch.equal(twin.fill_(torch.empty(77, dtype=torch.float64)), expected)
    fresh = noise_module.StandardNormal64(twin_gen)
    assert not torch.equal(fresh.fill_(torch.empty(77, dtype=torch.float64)), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("source", list(raydp_hpo.NoiseSource))
def test_cuda_release_has_the_law_and_the_grid(source):
    """On CUDA: the draw is on the device's generator (SEEDED: two float64 normal_ draws
    summed) or os.urandom (SECURE); the release is on the grid and has the declared std."""
    p = nn.Parameter(torch.zeros(2**20, device="cuda"))
    p.grad = torch.zeros_like(p)
    gen = secret_generator("cuda", 46)
    GaussianNoise(2.0, 0.5, 4.0, gen, source).privatise([p])
    z = p.grad.double().cpu()
    lam = noise_module.snap_grid(0.25)
    assert torch.equal(z / lam, (z / lam).round())
    assert float(z.std()) == pytest.approx(0.25, rel=0.01)
    summed = torch.randn(4096, device="cuda")
    out = noise_module.exact_gaussian_release(
        summed, 0.25, noise_module.StandardNormal64(gen, source))
    assert out.device == summed.device and out.dtype == summed.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dp_fed_avg_releases_no_fingerprint(dtype):
    """Client-level DP FedAvg (raydp_hpo.trainables.federated.dp_fed_avg) drew
    ``torch.normal`` in float64: Box–Muller on 53-bit uniforms, the same pair structure. One
    declared client whose update (norm < C, unclipped) is known: the release is θ + S + noise."""
    from raydp_hpo.trainables import federated

    n = 2**21
    update = torch.randn(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    update *= 0.5 / float(update.norm())  # ‖update‖ = 0.5 < C = 1
    glob = {"w": torch.zeros(n, dtype=dtype)}
    client = {"w": update.to(dtype)}
    dp = federated.ClientDP(1.0, 1.3, num_clients=1)
    out = federated.dp_fed_avg(glob, [client], dp, secret_generator("cpu", 47))
    assert_no_fingerprint(out["w"].double().numpy(), client["w"].double().numpy(), 1.3)
