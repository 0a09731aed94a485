"""The Gaussian noise of a DP-SGD release and its public normaliser: :class:`GaussianNoise`
(N(0, σ²C²·I) added to the clipped sum, divided by q·n_public, every release counted), and
how the noise is drawn so that its law is the one the accountants assume (issue 40).

**Why not ``Tensor.normal_``.** Every accountant here assumes exact N(0, σ²C²) noise. torch's
CPU ``normal_`` in float32 is Box–Muller over 24-bit uniforms (elements j and j + 8 of each
block of 16 form a pair): for a pair of radius R, exp(−R²/2)·2²⁴ is an integer, so someone
who knows every other contribution to a release can recentre it on each neighbouring
dataset's noiseless gradient and see which one gives integers (all pairs with R > 4 do for
the true one, ~3% for a wrong one: a membership test on ~e⁻⁸ of all pairs in every release,
the floating-point attack class of Jin et al. 2022, "Are We There Yet? Timing and
Floating-Point Attacks on Differential Privacy Systems"; Mironov 2012 for Laplace). And its
radius is at most √(48 ln 2) = 5.77: bounded noise leaves a neighbour's support with
probability ~2.3e-6 per release at σ = 1, a floor under δ that q·T releases multiply.

**What is drawn instead** (:class:`NoiseSource`, the same on every engine: the built-in
step, ``make_private``'s native engine and its Opacus engine, whose ``DPOptimizer`` draws
through :func:`exact_gaussian_release`):

1. Z ~ N(0, 1) in float64 for every coordinate: on the CPU numpy's 256-layer ziggurat
   (``Generator.standard_normal``, one 64-bit word a value, 52-bit positions, exact
   rejection; no pairs) on an SFC64 stream seeded with 256 bits drawn from the trial's
   secret torch generator (:mod:`raydp_hpo.trainables.secret_rng`); on CUDA the sum
   (Z₁ + Z₂)/√2 of two float64 ``normal_`` draws with the device's secret generator
   (curand's Box–Muller on uniforms of ≥ 53 bits, each draw reaching ≥ 8.57; Holohan &
   Braghin 2021, "Secure Random Sampling in Differential Privacy", Sec. 5.1); with :attr:`NoiseSource.SECURE` the same sum of two
   Box–Muller draws on 53-bit uniforms from ``os.urandom`` (the OS's cryptographic
   generator), on any device.
2. The release x = αS + s·Z is formed in float64 (αS the scaled clipped sum as the clipper
   computed it, s = σC/normaliser, α = 1/normaliser), never in the parameters' float32:
   adding float32 noise to a float32 sum is exact when they cancel, which leaves the sum's
   low bits in the result.
3. x is rounded to the grid λ·ℤ, λ = 2^(⌊log₂ s⌋ − 8) ∈ (s/512, s/256] (a public constant:
   Mironov's "snapping", 2012), then cast to the parameters' dtype. Rounding the exact
   Gaussian release to a grid is post-processing of the Gaussian mechanism, so its
   guarantee is the accounted one; what the float arithmetic could still leave is structure
   finer than λ, which the grid erases. It costs nothing in utility: the rounding error is
   below s/512, a variance 4e-6 of the noise's.

**The floor under δ** (pinned by ``tests/raydp_hpo/trainables/test_noise_fingerprint.py``).
Every draw is bounded: numpy's ziggurat by 13.71 (its tail is r − ln(1 − U)/r with r =
3.654 and U ≤ 1 − 2⁻⁵³), a sum of two 53-bit Box–Muller draws by √2·√(106 ln 2) =
:data:`SUPPORT_BOUND` = 12.12 (each radius ≤ √(−2 ln 2⁻⁵³) = 8.57). So a release under D
can fall where D′ (one record more or less, ‖Δ‖₂ ≤ C) cannot put it only if some
coordinate i with Δᵢ ≠ 0 has |Zᵢ| > B − |Δᵢ|/(σC) ≥ B − 1/σ. A union bound over the
coordinates gives, per release,

    δ_floor ≤ d · 2·Φ̄(B − 1/σ),   B = 12.12,

d the number of noised coordinates (:func:`noise_floor_delta`; conservative: the Gaussian
tail stands for the draw's, and every coordinate is counted). At σ = 1 that is
9.8e-29·d; at σ = 0.5, 4.4e-24·d; at σ = 0.3, 1.5e-18·d. Over T releases (every step
counted, not only the q·T that sample a record) the floor is at most T times that: for a
10⁶-parameter model, 10⁴ steps and σ ≥ 0.5 it is ≤ 4.4e-14, nine orders below the
δ = 1e-5 the examples certify. It is not added to the printed δ: the built-in trainable and
``make_private`` warn (:class:`NoiseFloorWarning`, :func:`warn_noise_floor`) when it exceeds
δ/1000 for the trial's d and T. Below σ ≈ 0.2 it stops being negligible (2·Φ̄(B − 5) =
1.1e-12 a coordinate at σ = 0.2; at σ = 0.1, 0.034) — see :func:`noise_floor_delta` and the
privacy-model page of the docs.

**What this does not give.** The grid argument is a coupling argument, not a proof about
every bit: the float64 result differs from the exact αS + s·Z by a few units in the last
place, so a cell boundary can fall between them; that changes the released cell with
probability ≲ 2⁻⁴⁰ per coordinate (1e-12), the relative error of each cell's probability,
which the accountants do not count. The noise draw's timing does not depend on the data (the
ziggurat's rare rejections depend only on the noise; the float64 sum can take longer on
subnormal values), and the rest of a step's timing can;
the clipped sum's own floating-point rounding (its sensitivity is C up to float32 rounding)
is not addressed here. :attr:`NoiseSource.SEEDED` is as strong as its 256-bit seed and the
non-cryptographic SFC64/Philox/MT19937 streams (as Opacus outside ``secure_mode``);
:attr:`NoiseSource.SECURE` draws from ``os.urandom`` at a cost of a few ms per 10⁵
parameters a step (``benchmarks/dpsgd_throughput.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

#: Bound on |Z| for every draw (a sum of two 53-bit Box–Muller draws; numpy's ziggurat's
#: 13.71 is larger): √2·√(−2 ln 2⁻⁵³).
SUPPORT_BOUND = math.sqrt(2.0) * math.sqrt(2.0 * 53 * math.log(2.0))
#: The release is rounded to multiples of λ = 2^(⌊log₂ s⌋ − SNAP_BITS), s the noise's std.
SNAP_BITS = 8


class NoiseSource(Enum):
    """Where the randomness of the DP noise comes from (module docstring)."""

    #: a 256-bit seed from the trial's secret generator; numpy's float64 ziggurat on SFC64 on
    #: the CPU, two float64 ``normal_`` draws on the device's generator elsewhere (default)
    SEEDED = "seeded"
    #: 53-bit uniforms from ``os.urandom`` (the OS's cryptographic generator), Box–Muller,
    #: two draws summed; on the CPU, then copied to the device
    SECURE = "secure"


def noise_source(value: NoiseSource | str) -> NoiseSource:
    """``value`` as a :class:`NoiseSource` (its name or value, any case), or a clear error."""
    if isinstance(value, NoiseSource):
        return value
    if isinstance(value, str):
        for member in NoiseSource:
            if value.lower() in (member.value, member.name.lower()):
                return member
    raise InvalidParameterError(
        f"noise_source must be a raydp_hpo.NoiseSource ({', '.join(m.name for m in NoiseSource)})"
        f" or its value ({', '.join(repr(m.value) for m in NoiseSource)}), got {value!r}"
    )


def noise_floor_delta(noise_multiplier: float, dimension: int, releases: int = 1) -> float:
    """Upper bound on what the draws' bounded support adds to δ: ``releases`` · d ·
    2·Φ̄(B − 1/σ), B = :data:`SUPPORT_BOUND` (module docstring); 1.0 when σ ≤ 1/B.

    >>> noise_floor_delta(1.0, 1) < 1e-28
    True
    """
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise InvalidParameterError(
            f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    if dimension < 1 or releases < 0:
        raise InvalidParameterError(
            f"dimension must be >= 1 and releases >= 0, got {dimension!r}, {releases!r}")
    gap = SUPPORT_BOUND - 1.0 / noise_multiplier
    if gap <= 0:
        return 1.0
    return min(1.0, releases * dimension * math.erfc(gap / math.sqrt(2.0)))


class NoiseFloorWarning(RuntimeWarning):
    """The draws' support floor under δ (:func:`noise_floor_delta`) is not negligible."""


def warn_noise_floor(noise_multiplier: float, dimension: int, releases: int,
                     delta: float) -> float:
    """Warn (:class:`NoiseFloorWarning`) when the support floor of ``releases`` releases of
    ``dimension`` noised values exceeds δ/1000: the certificate's δ does not count it (module
    docstring). Returns the floor (0 when σ = 0: nothing is claimed)."""
    if noise_multiplier == 0 or releases == 0:
        return 0.0
    floor = noise_floor_delta(noise_multiplier, max(1, dimension), releases)
    if floor > delta / 1000:
        import warnings

        warnings.warn(
            f"noise_multiplier={noise_multiplier!r} is so small that the DP noise's bounded "
            f"support (|z| <= {SUPPORT_BOUND:.2f}) adds up to {floor:.3g} to delta over "
            f"{releases} releases of {dimension} values, more than delta/1000 = "
            f"{delta / 1000:.3g}, and the certificate does not count it: use a larger "
            "noise_multiplier (raydp_hpo.trainables.dp_step.noise_floor_delta gives the bound)",
            NoiseFloorWarning, stacklevel=2)
    return floor


def snap_grid(std: float) -> float:
    """λ = 2^(⌊log₂ std⌋ − :data:`SNAP_BITS`), the release's grid (exact power of two)."""
    _, e = math.frexp(std)  # std = m·2^e, m ∈ [0.5, 1): ⌊log₂ std⌋ = e − 1
    return math.ldexp(1.0, e - 1 - SNAP_BITS)


class StandardNormal64:
    """N(0, 1) draws in float64 from ``generator``'s secret (or ``os.urandom``), module
    docstring. The CPU stream's 256-bit seed is drawn from ``generator`` at the first draw."""

    def __init__(self, generator: torch.Generator,
                 source: NoiseSource = NoiseSource.SEEDED) -> None:
        self.generator = generator
        self.source = noise_source(source)
        self._numpy: np.random.Generator | None = None

    def fill_(self, out: torch.Tensor, std: float = 1.0) -> torch.Tensor:
        """Fill the contiguous float64 tensor ``out`` with N(0, std²) draws (N(0, 1) draws
        times ``std``); return it."""
        if out.dtype != torch.float64 or not out.is_contiguous():
            raise RayDPHPOError("StandardNormal64.fill_ needs a contiguous float64 tensor")
        n = out.numel()
        if n == 0:
            return out
        if self.source is NoiseSource.SECURE:
            z = _secure_normal(n)
            out.copy_(torch.from_numpy(z).view(out.shape))
        elif out.device.type == "cpu":
            if self._numpy is None:
                words = torch.randint(0, 2**63 - 1, (4,), generator=self.generator,
                                      dtype=torch.int64)
                seed = np.random.SeedSequence([int(w) for w in words])
                self._numpy = np.random.Generator(np.random.SFC64(seed))
            x = out.view(-1).numpy()
            self._numpy.standard_normal(out=x)
            if std != 1.0:
                np.multiply(x, std, out=x)
            return out
        else:
            out.normal_(0.0, 1.0, generator=self.generator)
            second = torch.empty_like(out).normal_(0.0, 1.0, generator=self.generator)
            out.add_(second).mul_(math.sqrt(0.5))
        return out if std == 1.0 else out.mul_(std)


    def stream_state(self) -> torch.Tensor | None:
        """The CPU stream's state (SFC64's four words, its buffered half-word flag and value,
        as int64), for a checkpoint; None before the first draw or on another source/device
        (then the torch generator's state is the whole state)."""
        if self._numpy is None:
            return None
        st = self._numpy.bit_generator.state
        words = np.asarray(st["state"]["state"], dtype=np.uint64).view(np.int64)
        extra = np.array([st["has_uint32"], st["uinteger"]], dtype=np.uint64).view(np.int64)
        return torch.from_numpy(np.concatenate([words, extra]).copy())

    def load_stream_state(self, state: torch.Tensor | None) -> None:
        """Restore :meth:`stream_state` (None: the stream is seeded from the generator at the
        next draw, as on a fresh start)."""
        if state is None:
            self._numpy = None
            return
        raw = state.numpy().astype(np.int64).view(np.uint64)
        bit_generator = np.random.SFC64()
        bit_generator.state = {"bit_generator": "SFC64", "state": {"state": raw[:4].copy()},
                               "has_uint32": int(raw[4]), "uinteger": int(raw[5])}
        self._numpy = np.random.Generator(bit_generator)


def _secure_normal(n: int) -> np.ndarray:
    """n N(0, 1) values: (Z₁ + Z₂)/√2, each Zₖ Box–Muller on 53-bit uniforms in (0, 1] from
    ``os.urandom``."""
    pairs = (n + 1) // 2
    raw = np.frombuffer(os.urandom(32 * pairs), dtype=np.uint64).reshape(4, pairs)
    u = ((raw >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]
    total = np.zeros(2 * pairs)
    for k in (0, 2):
        radius = np.sqrt(-2.0 * np.log(u[k]))
        theta = (2.0 * math.pi) * u[k + 1]
        total[:pairs] += radius * np.cos(theta)
        total[pairs:] += radius * np.sin(theta)
    return cast(np.ndarray, total[:n] * math.sqrt(0.5))


def _snap_(x: torch.Tensor, std: float) -> torch.Tensor:
    """Round the float64 ``x`` in place to multiples of :func:`snap_grid` (half to even;
    dividing and multiplying by a power of two is exact)."""
    lam = snap_grid(std)
    return x.div_(lam).round_().mul_(lam)


def _add_and_snap_(out: torch.Tensor, noise: torch.Tensor, std: float) -> torch.Tensor:
    """out ← round_λ(out + noise), the sum formed in float64 (``noise`` is float64 and is
    overwritten). On the CPU in numpy, four vectorised passes (numpy casts float32 to
    float64 inside its loops, where torch's mixed-dtype add is several times slower): the
    rounding is fl(fl(x + M) − M), M = 1.5·2⁵²·λ, which is round-half-even to λ·ℤ for
    |x| < 2⁵¹·λ (and a fixed coarser rounding beyond: still a function of x alone)."""
    if out.device.type == "cpu" and out.dtype in (torch.float32, torch.float64) \
            and out.is_contiguous() and noise.is_contiguous():
        x, o = noise.view(-1).numpy(), out.view(-1).numpy()
        magic = 1.5 * 2.0**52 * snap_grid(std)
        np.add(x, o, out=x)
        np.add(x, magic, out=x)
        np.subtract(x, magic, out=x)
        np.copyto(o, x, casting="same_kind")
        return out
    return out.copy_(_snap_(noise.add_(out), std))


def exact_gaussian_release(summed: torch.Tensor, std: float,
                           normal: StandardNormal64) -> torch.Tensor:
    """round_λ(summed + N(0, std²·I)) in ``summed``'s dtype, formed in float64 (module
    docstring); ``summed`` itself unchanged. Opacus's ``DPOptimizer`` draws through this
    (:class:`~raydp_hpo.trainables.dp_step.opacus_noise.ExactNoiseDPOptimizer`)."""
    if std == 0:
        return summed.clone()
    x = normal.fill_(torch.empty(summed.shape, dtype=torch.float64, device=summed.device), std)
    x.add_(summed)
    return _snap_(x, std).to(summed.dtype)


@dataclass
class GaussianNoise:
    """Adds N(0, σ²C²·I) to the clipped sum and divides by a public normaliser.

    ``normaliser`` is the expected batch size q·n_public, computed from declared public
    sizes, never from the data. Dividing by the realised training-set size n would leak n:
    under add/remove adjacency neighbouring datasets have sizes n and n ± 1, so the scale of
    the released gradient would differ between them by a factor no noise accounts for
    (DESIGN.md, "Public vs private"). With a data-independent normaliser the release is
    (Σ clip + noise)/const, post-processing of the subsampled Gaussian mechanism.

    Computed as round_λ(g/normaliser + N(0, (σC/normaliser)²·I)) in float64, then cast to
    the parameters' dtype (the module docstring says why: no float32 Box–Muller, no float32
    addition, the grid λ): the scaled clipped sum is first written into a zeroed buffer in
    the parameters' dtype — by one fused ``torch._foreach_add_`` (:meth:`privatise`) or by
    the clipper's own matrix products (:meth:`privatise_with`, used by
    :meth:`BookKeepingClipper.privatised_gradient`) — then the noise for every parameter,
    one flat float64 draw of Σ|p| values from ``generator``'s secret (:class:`NoiseSource`)
    split in parameter order, is added to it in float64, rounded and cast back. The
    generator must live on the parameters' device (``torch.Generator(device=...)``), where
    the noise is drawn. Parameters of different dtypes get one draw each, in order.

    The flat buffers and their per-parameter views are kept and used again at the next
    release for the same parameters: as with PyTorch's own ``.grad`` tensors (accumulated in
    place unless set to None), each ``p.grad`` it sets is overwritten by the next release, so
    copy a gradient that must outlive the step. This saves an allocation, a split and a view
    per parameter every step (issue 15: 55-85 µs of a 1.5 ms MLP step).
    """

    noise_multiplier: float
    max_grad_norm: float
    normaliser: float
    generator: torch.Generator
    source: NoiseSource = NoiseSource.SEEDED
    releases: int = field(default=0)
    #: (parameter ids and shapes, dtype, device) → the flat release buffer (parameters'
    #: dtype), its per-parameter views, the flat float64 noise buffer and its views, reused
    #: from release to release (see the class docstring)
    _buffer: tuple[Any, torch.Tensor, list[torch.Tensor], torch.Tensor, list[torch.Tensor]] \
        | None = field(default=None, init=False, repr=False, compare=False)
    _normal: StandardNormal64 = field(init=False, repr=False, compare=False)
    #: whether the last :meth:`_sum_views` handed out views of the flat buffer
    _flat: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise InvalidParameterError(
                f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}"
            )
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InvalidParameterError(
                f"max_grad_norm must be finite and > 0, got {self.max_grad_norm!r}"
            )
        if isinstance(self.normaliser, bool) or not (
            isinstance(self.normaliser, (int, float))
            and math.isfinite(self.normaliser)
            and self.normaliser > 0
        ):
            raise InvalidParameterError(
                f"normaliser must be a finite number > 0 (the expected batch size q·n from "
                f"declared public sizes), got {self.normaliser!r}"
            )
        self.source = noise_source(self.source)
        self._normal = StandardNormal64(self.generator, self.source)

    def privatise(self, params: list[nn.Parameter]) -> None:
        """Replace each ``p.grad`` by (p.grad + N(0, σ²C²·I)) / normaliser; count the release.

        Checks every parameter first (gradient present, generator on its device), so a
        refused call changes no gradient, draws no noise and counts no release.
        """
        for p in params:
            if p.grad is None:
                raise RayDPHPOError(
                    "privatise needs p.grad on every parameter (run the clipper first); "
                    f"a parameter of shape {tuple(p.shape)} has none"
                )
        grads = [cast(torch.Tensor, p.grad) for p in params]  # all present: checked above
        # a gradient that is still the last release's view of the buffer would be zeroed
        # before this release's sum is written: copy it first
        grads = [g.clone() if self._aliases_buffer(g) else g for g in grads]

        def add_grads(views: list[torch.Tensor], alpha: float) -> None:
            if views:  # scale·g into the zeroed buffer in one fused pass (foreach)
                torch._foreach_add_(views, grads, alpha=alpha)

        self._release(params, add_grads)

    def privatise_with(
        self,
        params: list[nn.Parameter],
        write: Callable[[dict[int, torch.Tensor], float], None],
    ) -> None:
        """Set each ``p.grad`` to round_λ(what ``write`` adds + N(0, (σC/normaliser)²·I));
        count the release.

        ``write(into, alpha)`` receives a zeroed tensor of each parameter's shape and dtype
        (parameter id → tensor) and must add alpha·S_p in place, S_p the parameter's clipped
        sum, alpha = 1/normaliser; the noise is then added as :meth:`privatise` adds it, so
        that p.grad = (S_p + N(0, σ²C²·I))/normaliser
        (:meth:`BookKeepingClipper.privatised_gradient`). The devices are checked first.
        """
        self._release(
            params, lambda views, alpha: write({id(p): v for p, v in zip(params, views)}, alpha)
        )

    def _release(
        self, params: list[nn.Parameter], add: Callable[[list[torch.Tensor], float], None]
    ) -> None:
        """The one release path of both entry points: check the devices, let
        ``add(views, 1/normaliser)`` add the scaled clipped sum into zeroed views in parameter
        order, add the noise (:meth:`_noise`) in float64 and round (:func:`_snap_`), make each
        view its parameter's ``grad``, count the release."""
        self._check_devices(params)
        views = self._sum_views(params)
        try:
            add(views, 1.0 / self.normaliser)
        except BaseException:
            # the buffer (each p.grad of the last release) now holds part of a sum: no
            # gradient is left that looks like a release, and the buffer is dropped
            for p in params:
                p.grad = None
            self._buffer = None
            raise
        std = self.noise_multiplier * self.max_grad_norm / self.normaliser
        if std > 0:
            noise = self._noise(params)
            if self._flat and self._buffer is not None:
                _add_and_snap_(self._buffer[1], self._buffer[3], std)  # all values at once
            else:
                for v, n in zip(views, noise):
                    _add_and_snap_(v, n, std)
        for p, v in zip(params, views):
            p.grad = v
        self.releases += 1

    def _check_devices(self, params: list[nn.Parameter]) -> None:
        gen_device = torch.device(self.generator.device)
        if gen_device.type == "cpu" and all(p.device.type == "cpu" for p in params):
            return  # the common case, without a device comparison per parameter
        for p in params:
            if not _same_device(p.device, gen_device):
                raise RayDPHPOError(
                    f"noise generator is on {gen_device}, parameter on {p.device}: create it "
                    f"with torch.Generator(device={str(p.device)!r}) so the noise is drawn "
                    "where the parameters live"
                )

    def _sum_views(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """Zeroed tensors in each parameter's shape, dtype and device, for the scaled clipped
        sum: views of the reused flat buffer when all parameters share a dtype."""
        self._flat = False
        if not params:
            return []
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            return [torch.zeros(p.shape, device=p.device, dtype=p.dtype) for p in params]
        key = (tuple((id(p), p.shape) for p in params), dtype, params[0].device)
        if self._buffer is None or self._buffer[0] != key:
            sizes = [p.numel() for p in params]
            device = params[0].device
            flat = torch.empty(sum(sizes), device=device, dtype=dtype)
            flat64 = torch.empty(sum(sizes), device=device, dtype=torch.float64)
            self._buffer = (key, flat, [v.view(p.shape) for v, p in zip(flat.split(sizes), params)],
                            flat64, [v.view(p.shape) for v, p in zip(flat64.split(sizes), params)])
        _, flat, views, _, _ = self._buffer
        flat.zero_()
        self._flat = True
        return views

    def _noise(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """N(0, (σC/normaliser)²·I) in float64 for each parameter, in its shape: one flat draw
        of Σ|p| values (:class:`StandardNormal64`) split in parameter order, into the reused
        float64 buffer when the parameters share a dtype, else one draw each, in order."""
        std = self.noise_multiplier * self.max_grad_norm / self.normaliser
        if not params:
            return []
        if self._flat and self._buffer is not None:  # _sum_views just set it up for params
            _, _, _, flat64, views64 = self._buffer
            self._normal.fill_(flat64, std)
            return views64
        return [self._normal.fill_(torch.empty(p.shape, device=p.device, dtype=torch.float64),
                                   std) for p in params]

    def _aliases_buffer(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in the reused release buffer (a ``p.grad`` from the last
        release)."""
        return self._buffer is not None and (
            t.untyped_storage().data_ptr() == self._buffer[1].untyped_storage().data_ptr()
        )


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats ``cuda`` and ``cuda:<current>`` as the same device."""
    if a.type != b.type:
        return False
    if a.type == "cpu":
        return True
    ia = a.index if a.index is not None else torch.cuda.current_device()
    ib = b.index if b.index is not None else torch.cuda.current_device()
    return ia == ib
