"""One client of federated averaging (:mod:`raydp_hpo.trainables.federated`): its shard of the
data (:func:`pathological_split`, the paper's split interpolated to iid), the non-private
ADADP step with the err < tol acceptance rule (:func:`adadp_step`, Koskela & Honkela 2020) and
the :class:`Client` that holds a model replica, its learning rate or optimiser state and its
minibatch generator. Nothing here is a release: a client's update reaches the world only
through the server's step. Re-exported by :mod:`raydp_hpo.trainables.federated`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.trainables.data import Dataset
from raydp_hpo.trainables.federated_settings import ClientOptimizer, FedSettings, StateDict
from raydp_hpo.trainables.models import build_model
from raydp_hpo.trainables.training import (
    ADADP_ALPHA_MAX,
    ADADP_ALPHA_MIN,
    ADADP_TOL_NONPRIVATE,
)

__all__ = ["AdadpOutcome", "adadp_step", "pathological_split", "Client"]


# -- the ADADP client step ------------------------------------------------------------------


@dataclass(frozen=True)
class AdadpOutcome:
    """One non-private ADADP step: the error estimate, whether θ moved, the new η."""

    err: float
    accepted: bool
    lr: float


def _grad(model: nn.Module, params: list[nn.Parameter], x: torch.Tensor, y: torch.Tensor
          ) -> list[torch.Tensor]:
    loss = nn.functional.cross_entropy(model(x), y)
    return list(torch.autograd.grad(loss, params))


def adadp_step(
    model: nn.Module,
    batch1: tuple[torch.Tensor, torch.Tensor],
    batch2: tuple[torch.Tensor, torch.Tensor],
    lr: float,
    *,
    tol: float = ADADP_TOL_NONPRIVATE,
    alpha_min: float = ADADP_ALPHA_MIN,
    alpha_max: float = ADADP_ALPHA_MAX,
) -> AdadpOutcome:
    """One step of non-private ADADP (module docstring) on ``model``'s trainable parameters,
    in place: θ ← θ̂_{ℓ+1} if err < tol, unchanged otherwise. Returns err, acceptance, η_{ℓ+1}.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        theta0 = [p.detach().clone() for p in params]
    g1 = _grad(model, params, *batch1)
    with torch.no_grad():
        full = [t - lr * g for t, g in zip(theta0, g1)]
        for p, t, g in zip(params, theta0, g1):
            p.copy_(t - lr / 2 * g)
    g2 = _grad(model, params, *batch2)
    with torch.no_grad():
        for p, g in zip(params, g2):
            p.sub_(lr / 2 * g)  # θ̂_{ℓ+1}
        sq = sum(
            float((((f - p) / f.abs().clamp(min=1.0)) ** 2).sum()) for f, p in zip(full, params)
        )
        err = math.sqrt(sq)
        accepted = err < tol
        if not accepted:
            for p, t in zip(params, theta0):
                p.copy_(t)
    factor = alpha_max if err == 0 else min(max(tol / err, alpha_min), alpha_max)
    return AdadpOutcome(err=err, accepted=accepted, lr=lr * factor)


# -- data split -----------------------------------------------------------------------------


def pathological_split(
    labels: np.ndarray,
    num_clients: int,
    random_fraction: float,
    generator: np.random.Generator,
) -> list[np.ndarray]:
    """Record indices of each client: the paper's pathological split interpolated to iid.

    The sorted classes are cut into ``num_clients`` contiguous groups
    (``np.array_split``; 10 classes, 5 clients → {0,1}, {2,3}, …, {8,9}, like the paper's
    cars/trucks, planes/ships, …). A uniformly random subset of round(p·n) records
    (p = ``random_fraction``) is shuffled and dealt round-robin to the clients; every other
    record goes to the client owning its class. p = 0: fully pathological; p = 1: an iid
    split into (almost) equal shards. Every record is assigned to exactly one client.
    """
    y = np.asarray(labels)
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise InvalidParameterError(f"num_clients must be an int >= 1, got {num_clients!r}")
    if not 0.0 <= float(random_fraction) <= 1.0:
        raise InvalidParameterError(f"random_fraction must be in [0, 1], got {random_fraction!r}")
    classes = np.unique(y)
    if len(classes) < num_clients:
        raise InvalidParameterError(
            f"a pathological split needs at least num_clients={num_clients} classes, got "
            f"{len(classes)}; use fewer clients"
        )
    owner = np.empty(int(classes.max()) + 1, dtype=np.int64)
    for k, group in enumerate(np.array_split(classes, num_clients)):
        owner[group] = k
    n = len(y)
    client = owner[y]
    chosen = generator.permutation(n)[: round(float(random_fraction) * n)]
    client[chosen] = np.arange(len(chosen)) % num_clients
    return [np.flatnonzero(client == k) for k in range(num_clients)]


# -- clients --------------------------------------------------------------------------------


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def _build(settings: FedSettings, shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return build_model(settings.model, shape, num_classes, **dict(settings.model_kwargs))


class Client:
    """One client: its own shard, a model replica, its learning rate / optimiser state and a
    minibatch generator. :meth:`local_update` loads the server's model, trains
    ``local_epochs`` epochs and returns (state dict, N_k, stats)."""

    def __init__(
        self, data: Dataset, settings: FedSettings, *, seed: int, num_threads: int | None = None
    ) -> None:
        """``num_threads``: set torch's intra-op thread count (for a client in its own process,
        e.g. a Ray actor; leave ``None`` in-process)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if len(data) == 0:
            raise InvalidParameterError("a client shard is empty; use fewer clients")
        self.settings = settings
        self.n = len(data)
        self.x = torch.as_tensor(np.array(data.features))
        self.y = torch.as_tensor(np.array(data.labels))
        with torch.random.fork_rng(devices=[]):  # the replica's init is overwritten anyway
            self.model = _build(settings, data.feature_shape, data.num_classes)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.generator = torch.Generator().manual_seed(seed)
        self.lr = settings.lr
        self.optimizer: torch.optim.Optimizer | None = None
        if settings.optimizer is ClientOptimizer.SGD:
            self.optimizer = torch.optim.SGD(self.params, lr=settings.lr)
        elif settings.optimizer is ClientOptimizer.ADAM:
            self.optimizer = torch.optim.Adam(self.params, lr=settings.lr)

    def _batches(self) -> list[torch.Tensor]:
        b = self.settings.batch_size
        perm = torch.randperm(self.n, generator=self.generator)
        return [perm[i : i + b] for i in range(0, self.n - b + 1, b)] or [perm]

    def local_update(self, global_state: Mapping[str, torch.Tensor]
                     ) -> tuple[StateDict, int, dict[str, float]]:
        s = self.settings
        self.model.load_state_dict(global_state)
        self.model.train()
        accepted = rejected = 0
        for _ in range(s.local_epochs):
            batches = self._batches()
            if s.optimizer is ClientOptimizer.ADADP:
                for j in range(0, len(batches) - 1, 2):
                    b1, b2 = batches[j], batches[j + 1]
                    out = adadp_step(
                        self.model, (self.x[b1], self.y[b1]), (self.x[b2], self.y[b2]),
                        self.lr, tol=s.tol, alpha_min=s.alpha_min, alpha_max=s.alpha_max,
                    )
                    self.lr = out.lr
                    accepted += out.accepted
                    rejected += not out.accepted
            else:
                assert self.optimizer is not None  # set in __init__ for SGD and Adam
                for idx in batches:
                    self.optimizer.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
                    self.optimizer.step()
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return state, self.n, {"lr": self.lr, "accepted": accepted, "rejected": rejected}

    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the global model."""
        return {
            "lr": self.lr,
            "generator": self.generator.get_state(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.lr = float(state["lr"])
        self.generator.set_state(state["generator"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
