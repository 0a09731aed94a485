"""Torch generators for the draws a privacy guarantee relies on (DP-SGD noise, Poisson
batches, DP FedAvg noise), seeded with the whole secret, not 32 bits of it.

``torch.Generator().manual_seed(s)`` on the CPU keeps only the low 32 bits of ``s``: ATen's
MT19937 engine is initialised by ``init_with_uint32(s)`` (Matsumoto & Nishimura's
``init_genrand``), so ``manual_seed(5)`` and ``manual_seed(5 + 2**40)`` give the same stream.
A noise stream from one of 2³² seeds can be found from a released model by trying every
seed (regenerate the noise, look for the candidate whose residual is a plausible clipped
gradient sum): about 17 core-hours in plain Python, far less vectorised. Once the noise is
known it can be subtracted and DP-SGD releases the exact clipped gradient sum, whatever ε was
charged.

:func:`secret_generator` therefore sets the CPU engine's whole state: the 624 32-bit words of
MT19937's state vector come from ``numpy.random.SeedSequence(parts)`` (a hash of the secret
parts, O'Neill's seed_seq design), so the stream depends on every bit of the secret —
at least 128 bits when the trial seed comes from OS entropy
(:func:`derive_seed`). On CUDA (and other devices) torch's Philox engine takes a 64-bit seed,
which is derived the same way; 2⁶⁴ seeds cannot be searched.

What this does **not** give: MT19937 and Philox are not cryptographically secure generators.
The guarantee against an adversary who reconstructs a generator's state from its outputs is
computational and rests on the outputs never being observed without the data's contribution
(the released noise is always added to a clipped gradient sum). This is the same position as
Opacus outside its ``secure_mode``; say so wherever a certificate is published for a threat
model that needs more.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from raydp_hpo.errors import RayDPHPOError

#: MT19937's state: 624 words of 32 bits.
_MT_WORDS = 624
#: Byte layout of ATen's CPU generator state (``CPUGeneratorImplStateLegacy``): the initial
#: seed (uint64), ``left`` and ``seeded`` (int32 each), ``next`` (uint64), then the 624 state
#: words, each stored as a uint64; the cached normal samples follow.
_LEFT, _SEEDED, _NEXT, _WORDS = 8, 12, 16, 24


def derive_seed(*parts: int) -> int:
    """A 128-bit integer hashed from ``parts`` (non-negative ints of any width) by
    ``SeedSequence``: every bit of every part matters, unlike a 32-bit ``generate_state(1)``."""
    words = np.random.SeedSequence([int(p) for p in parts]).generate_state(4, np.uint32)
    return int.from_bytes(words.tobytes(), "little")


def secret_generator(device: torch.device | str, *parts: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` whose whole state is derived from ``parts``.

    CPU: the MT19937 state vector is set to ``SeedSequence(parts).generate_state(624)`` with
    the engine positioned to regenerate it before the first draw (``left = 1``, as after
    ``manual_seed``); the reported ``initial_seed()`` is 0 and carries nothing. Other devices:
    ``manual_seed`` with a 64-bit seed derived from ``parts`` (Philox on CUDA keeps all 64).
    The same ``parts`` give the same stream on the same device.
    """
    device = torch.device(device)
    if device.type != "cpu":
        return torch.Generator(device=device).manual_seed(derive_seed(*parts) % 2**64)
    _check_layout()
    words = np.random.SeedSequence([int(p) for p in parts]).generate_state(_MT_WORDS, np.uint32)
    if not words.any():  # MT19937's one degenerate state; probability 2^-19968
        words[0] = 1
    return _cpu_generator(words)


def _cpu_generator(words: np.ndarray) -> torch.Generator:
    """A CPU generator whose MT19937 state vector is ``words`` (624 uint32), positioned as
    ``manual_seed`` leaves it."""
    generator = torch.Generator()
    state = generator.manual_seed(0).get_state().numpy().copy()
    state[0:_LEFT] = 0  # initial_seed(): nothing to read
    state[_LEFT:_NEXT] = np.array([1, 1], dtype=np.int32).view(np.uint8)  # left, seeded
    state[_NEXT:_WORDS] = 0  # next
    state[_WORDS:_WORDS + 8 * _MT_WORDS] = words.astype(np.uint64).view(np.uint8)
    generator.set_state(torch.from_numpy(state))
    return generator


@functools.cache
def _check_layout() -> None:
    """Refuse to run if this torch's CPU generator state is not laid out as assumed: a
    generator written from ``init_genrand(5)``'s state (numpy's legacy seeding) must draw
    exactly what ``manual_seed(5)`` draws. A silent mismatch could leave the noise on a
    weaker seed, so it is an error, not a fallback."""
    legacy = np.random.RandomState(5).get_state(legacy=False)  # MT19937 seeded by init_genrand
    words = np.asarray(legacy["state"]["key"], dtype=np.uint32)
    written = torch.randn(64, generator=_cpu_generator(words))
    reference = torch.randn(64, generator=torch.Generator().manual_seed(5))
    if not torch.equal(written, reference):
        raise RayDPHPOError(
            f"torch {torch.__version__}: the CPU generator's state layout is not the one "
            "raydp_hpo.trainables.secret_rng writes; the DP noise cannot be seeded safely. "
            "Please report this with your torch version"
        )
