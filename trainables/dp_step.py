"""Per-example clipping and Gaussian noise: the privatised gradient of one DP-SGD step.

For a Poisson batch B (each record in independently with probability q) the privatised
gradient is (Abadi et al. 2016, Alg. 1; Opacus' convention for the normalisation)

    g̃ = ( Σ_{i∈B} clip_C(∇ℓ_i) + N(0, σ²C²·I) ) / (q·n_pub),   clip_C(v) = v · min(1, C/‖v‖),

with n_pub a declared public size (never the realised n, which differs between neighbours),
whose release is one subsampled Gaussian mechanism with noise multiplier σ.

Two implementations of Σ clip_C(∇ℓ_i), checked against each other in the tests:

* :class:`BookKeepingClipper` — models whose parameters all live in ``nn.Linear`` layers fed
  2-D inputs (MLP, linear head). For such a layer with input a_i and output gradient g_i the
  per-example weight gradient is the outer product g_i a_iᵀ, so
  ‖∇_W ℓ_i‖² = ‖g_i‖²·‖a_i‖² (Goodfellow 2015) and the clipped sum is (c⊙g)ᵀa with
  c_i = min(1, C/‖∇ℓ_i‖): one backward pass to the layer outputs, no per-example gradients
  materialised ("book-keeping", Bu et al. 2023). This keeps a DP step within ~2× of a
  non-private step on CPU.
* :class:`OpacusClipper` — any model Opacus supports: per-example gradients from
  ``opacus.GradSampleModule`` (hooks), then clip and sum.

:class:`GaussianNoise` adds the noise and records every release (σ, q) so that tests can
compare what actually ran with the declared mechanism.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

__all__ = [
    "BookKeepingClipper",
    "OpacusClipper",
    "GaussianNoise",
    "make_clipper",
    "poisson_batch",
    "supports_bk",
]

_EPS = 1e-6  # as Opacus: clip factor C / (‖v‖ + 1e-6)
_DENSE_POISSON_MAX_N = 4096  # poisson_batch: below this, one uniform per record is cheaper


def supports_bk(model: nn.Module) -> bool:
    """True iff every trainable parameter belongs to an ``nn.Linear`` layer."""
    linear_params = {
        id(p) for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()
    }
    params = [p for p in model.parameters() if p.requires_grad]
    return bool(params) and all(id(p) in linear_params for p in params)


class BookKeepingClipper:
    """Σᵢ clip_C(∇ℓᵢ) for Linear-only models in one backward pass (see module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        if not supports_bk(model):
            raise RayDPHPOError("book-keeping clipping needs a model made of nn.Linear layers")
        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int]:
        """Set ``p.grad`` to the clipped per-example gradient sum; return (loss sum, |B|)."""
        n = int(x.shape[0])
        if n == 0:
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
            return 0.0, 0
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []

        def hook(module: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            if inp[0].dim() != 2:
                raise RayDPHPOError(
                    f"book-keeping clipping needs 2-D Linear inputs, got {tuple(inp[0].shape)}; "
                    "use grad_sample_mode='opacus'"
                )
            inputs.append(inp[0].detach())
            outputs.append(out)

        handles = [m.register_forward_hook(hook) for m in self.layers]
        try:
            logits = self.model(x)
        finally:
            for h in handles:
                h.remove()
        loss = nn.functional.cross_entropy(logits, y, reduction="sum")
        grads = torch.autograd.grad(loss, outputs)
        sq = torch.zeros(n, device=x.device, dtype=x.dtype)
        for layer, a, g in zip(self.layers, inputs, grads):
            g_sq = g.pow(2).sum(1)
            sq += g_sq * a.pow(2).sum(1)
            if layer.bias is not None:
                sq += g_sq
        coef = (max_grad_norm / (sq.sqrt() + _EPS)).clamp(max=1.0)
        for layer, a, g in zip(self.layers, inputs, grads):
            cg = g * coef[:, None]
            layer.weight.grad = cg.t() @ a
            if layer.bias is not None:
                layer.bias.grad = cg.sum(0)
        return float(loss.detach()), n


class OpacusClipper:
    """Σᵢ clip_C(∇ℓᵢ) from Opacus per-example gradients (``GradSampleModule``, hooks mode)."""

    def __init__(self, model: nn.Module) -> None:
        from opacus import GradSampleModule

        self.model = model
        self.gsm = GradSampleModule(model, loss_reduction="sum")

    def clipped_sum(
        self, x: torch.Tensor, y: torch.Tensor, max_grad_norm: float
    ) -> tuple[float, int]:
        n = int(x.shape[0])
        params = [p for p in self.model.parameters() if p.requires_grad]
        if n == 0:
            for p in params:
                p.grad = torch.zeros_like(p)
            return 0.0, 0
        for p in params:
            p.grad_sample = None  # type: ignore[attr-defined]
            p.grad = None
        loss = nn.functional.cross_entropy(self.gsm(x), y, reduction="sum")
        with warnings.catch_warnings():  # inputs need no grad: Opacus' hooks still fire
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        samples = [p.grad_sample for p in params]  # type: ignore[attr-defined]
        norms = torch.stack([s.reshape(n, -1).norm(dim=1) for s in samples], dim=1).norm(dim=1)
        coef = (max_grad_norm / (norms + _EPS)).clamp(max=1.0)
        for p, s in zip(params, samples):
            p.grad = torch.einsum("i,i...->...", coef, s)
            p.grad_sample = None  # type: ignore[attr-defined]
        return float(loss.detach()), n


def poisson_batch(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """A Poisson sample of {0, …, n−1} with rate q, as sorted int64 indices, in O(|B|) work.

    Poisson sampling puts each record in the batch independently with probability q. This
    draws the same law in two steps: the size B ~ Binomial(n, q), then B distinct indices
    uniformly at random.

    Proof that the laws agree: for a fixed subset S of size b, Poisson sampling gives
    P(batch = S) = q^b (1 − q)^{n−b}, which depends on S only through b. There are C(n, b)
    such subsets, so P(|batch| = b) = C(n, b) q^b (1 − q)^{n−b} (the Binomial(n, q) mass) and
    P(batch = S | |batch| = b) = 1/C(n, b): conditionally on its size, a Poisson sample is a
    uniform b-subset. Drawing b from Binomial(n, q) and then a uniform b-subset therefore
    gives P(S) = C(n, b) q^b (1 − q)^{n−b} · 1/C(n, b), exactly the Poisson law.

    The uniform b-subset, when 2b < n: i.i.d. uniform draws from {0, …, n−1}, keeping each
    value at its first occurrence, until b distinct values are seen. The distinct values in
    order of first occurrence are a uniformly random ordered sample without replacement (by
    symmetry: every ordered b-tuple of distinct values has the same probability), so their
    set is a uniform b-subset. The expected number of draws is n(H_n − H_{n−b}) ≤ b + b²/(n−b)
    (under 2b for 2b < n), hence O(b log b) work with the sort; the first b draws are
    usually distinct already (probability ≈ e^{−b²/2n}), which is the fast path. When
    2b ≥ n a random permutation's first b entries are used (O(n), but then n ≤ 2b anyway).
    q = 1 gives every index without drawing; n ≤ 4096 or q > 1/4 uses one uniform per record
    (the definition of Poisson sampling; cheaper than sorting there).

    The law is exact up to the floating-point arithmetic of ``torch.binomial`` (float64
    BTRS/inversion) and of ``torch.randint``; ``tests/trainables/test_dp_step.py`` tests the
    size distribution and the per-index inclusion frequencies. All draws use ``generator``
    and happen on its device, where the indices are returned.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
    if isinstance(q, bool) or not (isinstance(q, (int, float)) and 0.0 < q <= 1.0):
        raise InvalidParameterError(f"sample rate q must be in (0, 1], got {q!r}")
    device = torch.device(generator.device)
    if q == 1.0 or n == 0:
        return torch.arange(n, dtype=torch.int64, device=device)
    if n <= _DENSE_POISSON_MAX_N or q > 0.25:  # one uniform per record is cheaper here
        mask = torch.rand(n, generator=generator, device=device) < q
        return torch.nonzero(mask).flatten()
    size = torch.binomial(
        torch.tensor(float(n), dtype=torch.float64, device=device),
        torch.tensor(float(q), dtype=torch.float64, device=device),
        generator=generator,
    )
    b = min(max(int(size), 0), n)  # the clamp only guards the sampler's range
    return _uniform_subset(n, b, generator)


def _uniform_subset(n: int, b: int, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random b-subset of {0, …, n−1}, sorted (see :func:`poisson_batch`)."""
    device = torch.device(generator.device)
    if b == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    if 2 * b >= n:
        return torch.randperm(n, generator=generator, device=device)[:b].sort().values
    drawn = torch.randint(n, (b,), generator=generator, device=device)
    values = drawn.sort().values
    if not bool((values[1:] == values[:-1]).any()):
        return values  # the first b draws are distinct: they are the first b distinct values
    while True:
        more = torch.randint(n, (b // 4 + 8,), generator=generator, device=device)
        drawn = torch.cat([drawn, more])
        values, order = torch.sort(drawn, stable=True)
        first = torch.ones_like(values, dtype=torch.bool)
        first[1:] = values[1:] != values[:-1]
        if int(first.sum()) >= b:
            positions = order[first].sort().values[:b]  # first occurrences, in draw order
            return drawn[positions].sort().values


def make_clipper(model: nn.Module, mode: str = "auto") -> BookKeepingClipper | OpacusClipper:
    """``mode``: ``"auto"`` (book-keeping when possible), ``"bk"`` or ``"opacus"``."""
    if mode == "auto":
        mode = "bk" if supports_bk(model) else "opacus"
    if mode == "bk":
        return BookKeepingClipper(model)
    if mode == "opacus":
        return OpacusClipper(model)
    raise RayDPHPOError(f"grad_sample_mode must be 'auto', 'bk' or 'opacus', got {mode!r}")


@dataclass
class GaussianNoise:
    """Adds N(0, σ²C²·I) to the clipped sum and divides by a public normaliser.

    ``normaliser`` is the expected batch size q·n_public, computed from declared public
    sizes, never from the data. Dividing by the realised training-set size n would leak n:
    under add/remove adjacency neighbouring datasets have sizes n and n ± 1, so the scale of
    the released gradient would differ between them by a factor no noise accounts for
    (DESIGN.md, "Public vs private"). With a data-independent normaliser the release is
    (Σ clip + noise)/const, post-processing of the subsampled Gaussian mechanism.

    The noise is drawn on the parameters' device with ``generator``, which must live on that
    device (``torch.Generator(device=...)``); on the CPU the draws are those of
    ``torch.normal(0, σC, p.shape, generator=generator)``, parameter by parameter in order.
    """

    noise_multiplier: float
    max_grad_norm: float
    normaliser: float
    generator: torch.Generator
    releases: int = field(default=0)

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

    def privatise(self, params: list[nn.Parameter]) -> None:
        """Replace each ``p.grad`` by (p.grad + N(0, σ²C²·I)) / normaliser; count the release.

        Checks every parameter first (gradient present, generator on its device), so a
        refused call changes no gradient, draws no noise and counts no release.
        """
        gen_device = torch.device(self.generator.device)
        for p in params:
            if p.grad is None:
                raise RayDPHPOError(
                    "privatise needs p.grad on every parameter (run the clipper first); "
                    f"a parameter of shape {tuple(p.shape)} has none"
                )
            if not _same_device(p.device, gen_device):
                raise RayDPHPOError(
                    f"noise generator is on {gen_device}, parameter on {p.device}: create it "
                    f"with torch.Generator(device={str(p.device)!r}) so the noise is drawn "
                    "where the parameters live"
                )
        std = self.noise_multiplier * self.max_grad_norm
        for p in params:
            assert p.grad is not None  # checked above
            noise = torch.normal(
                0.0, std, size=p.shape, generator=self.generator, device=p.device,
                dtype=p.grad.dtype,
            )
            p.grad = noise.add_(p.grad).div_(self.normaliser)
        self.releases += 1


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats ``cuda`` and ``cuda:<current>`` as the same device."""
    if a.type != b.type:
        return False
    if a.type == "cpu":
        return True
    ia = a.index if a.index is not None else torch.cuda.current_device()
    ib = b.index if b.index is not None else torch.cuda.current_device()
    return ia == ib
