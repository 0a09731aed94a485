"""The Gaussian noise of a DP-SGD release and its public normaliser: :class:`GaussianNoise`
(N(0, σ²C²·I) added to the clipped sum, divided by q·n_public, every release counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError


@dataclass
class GaussianNoise:
    """Adds N(0, σ²C²·I) to the clipped sum and divides by a public normaliser.

    ``normaliser`` is the expected batch size q·n_public, computed from declared public
    sizes, never from the data. Dividing by the realised training-set size n would leak n:
    under add/remove adjacency neighbouring datasets have sizes n and n ± 1, so the scale of
    the released gradient would differ between them by a factor no noise accounts for
    (DESIGN.md, "Public vs private"). With a data-independent normaliser the release is
    (Σ clip + noise)/const, post-processing of the subsampled Gaussian mechanism.

    Computed as N(0, (σC/normaliser)²·I) + g/normaliser, the same law: the noise for every
    parameter is one flat draw of Σ|p| values with ``generator`` (split in parameter order;
    one RNG call and one allocation per step instead of one per parameter; ``normal_`` with
    ``generator``), and the scaled
    clipped sum is added in one fused pass (``torch._foreach_add_``), instead of a draw, an
    add and a divide per parameter (:meth:`privatise`), or accumulated into the noise by the
    clipper's own matrix products (:meth:`privatise_with`, used by
    :meth:`BookKeepingClipper.privatised_gradient`; same noise values). The generator must
    live on the parameters' device (``torch.Generator(device=...)``), where the noise is
    drawn. Parameters of different dtypes get one draw each, in order.

    The flat buffer and its per-parameter views are kept and drawn into again at the next
    release for the same parameters: as with PyTorch's own ``.grad`` tensors (accumulated in
    place unless set to None), each ``p.grad`` it sets is overwritten by the next release, so
    copy a gradient that must outlive the step. This saves an allocation, a split and a view
    per parameter every step (issue 15: 55-85 µs of a 1.5 ms MLP step); the values drawn are
    the same.
    """

    noise_multiplier: float
    max_grad_norm: float
    normaliser: float
    generator: torch.Generator
    releases: int = field(default=0)
    #: (parameter ids and shapes, dtype, device) → the flat noise buffer and its per-parameter
    #: views, reused from release to release (see the class docstring)
    _buffer: tuple[Any, torch.Tensor, list[torch.Tensor]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

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
        for p in params:
            if p.grad is None:
                raise RayDPHPOError(
                    "privatise needs p.grad on every parameter (run the clipper first); "
                    f"a parameter of shape {tuple(p.shape)} has none"
                )
        grads = [cast(torch.Tensor, p.grad) for p in params]  # all present: checked above
        # a gradient that is still the last release's view of the noise buffer would be
        # overwritten by this release's draw: copy it first
        grads = [g.clone() if self._aliases_buffer(g) else g for g in grads]

        def add_grads(views: list[torch.Tensor], alpha: float) -> None:
            if views:  # noise + scale·g in one fused pass (foreach)
                torch._foreach_add_(views, grads, alpha=alpha)

        self._release(params, add_grads)

    def privatise_with(
        self,
        params: list[nn.Parameter],
        write: Callable[[dict[int, torch.Tensor], float], None],
    ) -> None:
        """Set each ``p.grad`` to N(0, (σC/normaliser)²·I) + what ``write`` adds; count the
        release.

        ``write(into, alpha)`` receives the noise drawn for each parameter (parameter id → a
        tensor of its shape, the same values :meth:`privatise` would draw) and must add
        alpha·S_p in place, S_p the parameter's clipped sum, alpha = 1/normaliser, so that
        p.grad = (S_p + N(0, σ²C²·I))/normaliser (:meth:`BookKeepingClipper.privatised_gradient`).
        The devices are checked before the draw.
        """
        self._release(
            params, lambda views, alpha: write({id(p): v for p, v in zip(params, views)}, alpha)
        )

    def _release(
        self, params: list[nn.Parameter], add: Callable[[list[torch.Tensor], float], None]
    ) -> None:
        """The one release path of both entry points: check the devices, draw the noise
        (:meth:`_noise`), let ``add(views, 1/normaliser)`` add the scaled clipped sum into the
        views in parameter order, make each view its parameter's ``grad``, count the release."""
        self._check_devices(params)
        views = self._noise(params)
        try:
            add(views, 1.0 / self.normaliser)
        except BaseException:
            # the buffer (each p.grad of the last release) now holds fresh noise and part of
            # a sum: no gradient is left that looks like a release, and the buffer is dropped
            for p in params:
                p.grad = None
            self._buffer = None
            raise
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

    def _noise(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """N(0, (σC/normaliser)²·I) for each parameter, in its shape, with ``generator``: one
        flat draw of Σ|p| values (``normal_``, one allocation) split in parameter order;
        parameters of different dtypes (mixed precision) get one draw each, in order."""
        std = self.noise_multiplier * self.max_grad_norm / self.normaliser
        if not params:
            return []
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            return [
                torch.empty(p.shape, device=p.device, dtype=p.dtype).normal_(
                    0.0, std, generator=self.generator)
                for p in params
            ]
        key = (tuple((id(p), p.shape) for p in params), dtype, params[0].device)
        if self._buffer is None or self._buffer[0] != key:
            sizes = [p.numel() for p in params]
            flat = torch.empty(sum(sizes), device=params[0].device, dtype=dtype)
            self._buffer = (key, flat, [v.view(p.shape) for v, p in zip(flat.split(sizes), params)])
        _, flat, views = self._buffer
        flat.normal_(0.0, std, generator=self.generator)
        return views

    def _aliases_buffer(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives in the reused noise buffer (a ``p.grad`` from the last release)."""
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
