"""Secret generators: every bit of the secret reaches the stream (torch's CPU ``manual_seed``
keeps 32), the CPU state layout is checked, and train_dp / DP FedAvg use them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trainables import secret_rng
from raydp_hpo.trainables.data import Dataset, load_mnist1d, split
from raydp_hpo.trainables.secret_rng import derive_seed, secret_generator
from raydp_hpo.trainables.training import _Runner, declared_privacy


def _mt_words(generator: torch.Generator) -> np.ndarray:
    raw = generator.get_state().numpy()
    return np.frombuffer(raw[24:24 + 624 * 8].tobytes(), np.uint64).astype(np.uint32)


def _seeded_by_32_bits(words: np.ndarray) -> bool:
    """Whether an MT19937 state vector is init_genrand(s) for some 32-bit s: then word 1 is
    1812433253·(w0 ⊕ (w0 >> 30)) + 1 mod 2³² (Matsumoto & Nishimura's initialisation)."""
    w0 = int(words[0])
    return int(words[1]) == (1812433253 * (w0 ^ (w0 >> 30)) + 1) & 0xFFFFFFFF


def test_the_check_recognises_manual_seed() -> None:
    # the reason for the module: manual_seed states are 32-bit seeded, whatever the seed
    assert _seeded_by_32_bits(_mt_words(torch.Generator().manual_seed(2**62 + 12345)))
    assert not _seeded_by_32_bits(_mt_words(secret_generator("cpu", 12345)))


def test_bits_above_32_change_the_stream() -> None:
    draws = [torch.randn(8, generator=secret_generator("cpu", s, 1))
             for s in (5, 5 + 2**40, 5 + 2**100)]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not torch.equal(draws[1], draws[2])


def test_same_parts_same_stream_and_nothing_in_initial_seed() -> None:
    a, b = secret_generator("cpu", 7, 0, 2), secret_generator("cpu", 7, 0, 2)
    assert torch.equal(torch.rand(1000, generator=a), torch.rand(1000, generator=b))
    assert secret_generator("cpu", 7, 0, 2).initial_seed() == 0
    assert not torch.equal(torch.rand(10, generator=secret_generator("cpu", 7, 0, 1)),
                           torch.rand(10, generator=secret_generator("cpu", 7, 0, 2)))


def test_draws_have_the_right_law() -> None:
    z = torch.randn(400_000, generator=secret_generator("cpu", derive_seed(3)), dtype=torch.float64)
    # standard errors: mean 1/√n = 0.0016, sd ≈ 1/√(2n) = 0.0011; 5 standard errors
    assert abs(float(z.mean())) < 0.008
    assert abs(float(z.std()) - 1.0) < 0.006


def test_derive_seed_uses_every_bit() -> None:
    assert derive_seed(1, 2).bit_length() > 64
    assert derive_seed(1) != derive_seed(1 + 2**64)
    assert derive_seed(1, 2) == derive_seed(1, 2)


def test_a_changed_state_layout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    secret_rng._check_layout.cache_clear()
    monkeypatch.setattr(secret_rng, "_WORDS", 32)  # as if torch moved the state vector
    try:
        with pytest.raises(RayDPHPOError, match="state layout"):
            secret_generator("cpu", 1)
    finally:
        monkeypatch.undo()
        secret_rng._check_layout.cache_clear()
    secret_generator("cpu", 1)


def test_train_dp_runner_streams_are_not_32_bit_seeded() -> None:
    data = split(load_mnist1d(num_samples=200, seed=0), 0.2, 0.2, seed=0)
    config = {"lr": 0.1, "epochs": 1, "sample_rate": 0.5, "noise_multiplier": 1.0,
              "max_grad_norm": 1.0}
    privacy, n_view = declared_privacy(config, data)
    train: Dataset = data.train
    runner = _Runner(config, train, privacy, False, 0, torch.device("cpu"), seed=2**100 + 3,
                     normaliser=privacy.sample_rate * n_view)
    assert not _seeded_by_32_bits(_mt_words(runner.noise.generator))
    assert not _seeded_by_32_bits(_mt_words(runner.sampler))
    other = _Runner(config, train, privacy, False, 0, torch.device("cpu"), seed=3,
                    normaliser=privacy.sample_rate * n_view)  # same low 64 bits
    assert not np.array_equal(_mt_words(runner.noise.generator), _mt_words(other.noise.generator))
