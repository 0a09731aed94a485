"""Opacus's ``DPOptimizer`` with the project's noise: :class:`ExactNoiseDPOptimizer`, what
``make_private``'s Opacus engine returns (issue 40).

Opacus draws its noise with ``torch.normal`` in the parameters' dtype (float32 Box–Muller on
24-bit uniforms on the CPU outside its ``secure_mode``) and adds it in that dtype: the
fingerprint and the δ floor of :mod:`raydp_hpo.trainables.dp_step.noise`. This subclass
replaces only :meth:`~opacus.optimizers.DPOptimizer.add_noise`: each parameter's
``p.grad`` becomes :func:`~raydp_hpo.trainables.dp_step.noise.exact_gaussian_release` of
its ``summed_grad`` at std σC (float64 draw from the trial's secret generator or
``os.urandom``, float64 sum, rounded to the grid λ), then Opacus divides it by the expected
batch size as before (post-processing). Clipping, accounting hooks and everything else are
Opacus's.
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.trainables.dp_step.noise import (
    NoiseSource,
    StandardNormal64,
    exact_gaussian_release,
)

__all__ = ["ExactNoiseDPOptimizer"]


class ExactNoiseDPOptimizer(DPOptimizer):  # type: ignore[misc]
    """``DPOptimizer`` whose noise is drawn as the project's (module docstring).

    ``generator`` is required (the trial's secret noise generator, on the parameters'
    device); ``noise_source`` picks :class:`NoiseSource`.
    """

    def __init__(self, *args: Any, generator: torch.Generator | None = None,
                 noise_source: NoiseSource = NoiseSource.SEEDED, **kwargs: Any) -> None:
        if generator is None:
            raise RayDPHPOError("ExactNoiseDPOptimizer needs the trial's secret noise generator")
        super().__init__(*args, generator=generator, **kwargs)
        self.normal64 = StandardNormal64(generator, noise_source)

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            p.grad = exact_gaussian_release(p.summed_grad, std, self.normal64).view_as(p)
            _mark_as_processed(p.summed_grad)
