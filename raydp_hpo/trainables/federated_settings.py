"""The settings and result types of federated averaging (:mod:`raydp_hpo.trainables.federated`):
the client update rule (:class:`ClientOptimizer`), client-level DP (:class:`ClientDP`: clip
norm, noise multiplier and the declared number of clients, whose ``mechanism(R)`` is the
``Gaussian(σ, R)`` charged before any round), one run's :class:`FedSettings` and its
:class:`FedResult`. Re-exported by :mod:`raydp_hpo.trainables.federated`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import torch

from raydp_hpo._validation import positive_int
from raydp_hpo.accounting.mechanisms import Gaussian
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.trainables.training import (
    ADADP_ALPHA_MAX,
    ADADP_ALPHA_MIN,
    ADADP_TOL_NONPRIVATE,
)

__all__ = ["ClientOptimizer", "ClientDP", "FedSettings", "FedResult", "StateDict"]

StateDict = dict[str, torch.Tensor]


class ClientOptimizer(Enum):
    """Local update rule of every client."""

    ADADP = "adadp"  # non-private ADADP with the err < tol acceptance rule
    SGD = "sgd"  # constant learning rate
    ADAM = "adam"


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings (module docstring): clip norm C of each client's update, noise
    multiplier σ of the Gaussian noise σC on the sum of clipped updates, and the declared
    number of clients K that divides the noisy sum — a public figure of the configuration,
    never the number of clients actually present (which differs between neighbouring
    federations)."""

    clip_norm: float
    noise_multiplier: float
    num_clients: int

    def __post_init__(self) -> None:
        for name in ("clip_norm", "noise_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0
            ):
                raise InvalidParameterError(f"{name} must be finite and > 0, got {name}={v!r}")
            object.__setattr__(self, name, float(v))
        object.__setattr__(self, "num_clients", positive_int("num_clients", self.num_clients))

    def mechanism(self, rounds: int) -> Gaussian:
        """``rounds`` releases of the noised sum, client-level sensitivity C: Gaussian(σ, R)."""
        return Gaussian(self.noise_multiplier, rounds)


@dataclass(frozen=True)
class FedSettings:
    """Settings of one federated run (no privacy parameters: the algorithm is not DP).

    ``lr`` is SGD's constant rate, Adam's rate, or ADADP's initial η₀. ``model_kwargs`` go to
    :func:`raydp_hpo.trainables.models.build_model`.
    """

    optimizer: ClientOptimizer = ClientOptimizer.ADADP
    lr: float = 0.1
    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 10
    tol: float = ADADP_TOL_NONPRIVATE
    alpha_min: float = ADADP_ALPHA_MIN
    alpha_max: float = ADADP_ALPHA_MAX
    model: str = "mlp"
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    client_dp: ClientDP | None = None

    def __post_init__(self) -> None:
        if self.client_dp is not None and not isinstance(self.client_dp, ClientDP):
            raise InvalidParameterError(
                f"client_dp must be a ClientDP or None, got {self.client_dp!r}"
            )
        if not isinstance(self.optimizer, ClientOptimizer):
            raise InvalidParameterError(
                f"optimizer must be a ClientOptimizer, got {self.optimizer!r}; use "
                f"ClientOptimizer('adadp'|'sgd'|'adam')"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise InvalidParameterError(f"lr must be finite and > 0, got lr={self.lr!r}")
        for name in ("rounds", "local_epochs", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidParameterError(f"{name} must be an int >= 1, got {name}={v!r}")
        if not (0 < self.alpha_min < 1 < self.alpha_max and math.isfinite(self.alpha_max)):
            raise InvalidParameterError(
                "ADADP needs 0 < alpha_min < 1 < alpha_max < inf, got "
                f"alpha_min={self.alpha_min!r}, alpha_max={self.alpha_max!r}"
            )
        if not (math.isfinite(self.tol) and self.tol > 0):
            raise InvalidParameterError(f"tol must be finite and > 0, got tol={self.tol!r}")
        object.__setattr__(self, "model_kwargs", dict(self.model_kwargs))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["optimizer"] = self.optimizer.value
        return d


@dataclass(frozen=True)
class FedResult:
    """Outcome of a run. ``accuracy[r]`` is the global model's test accuracy after round r
    (``accuracy[0]``: the initial model). ``client_lr[r][k]``: client k's learning rate at the
    end of round r+1 (constant for SGD/Adam). ``accepted`` / ``rejected``: ADADP steps per
    round, summed over clients (zero for SGD/Adam)."""

    accuracy: list[float]
    client_lr: list[list[float]]
    accepted: list[int]
    rejected: list[int]
    state: StateDict
