"""DP training of one trial, as a plain function (usable without Ray Tune).

:func:`train_dp` runs DP-SGD (Abadi et al. 2016) with Poisson sampling: at every gradient
evaluation each training record is included independently with probability q, per-example
gradients are clipped to norm C = ``max_grad_norm`` and N(0, σ²C²) noise is added
(:mod:`raydp_hpo.trainables.dp_step`). Optimisers (:class:`raydp_hpo.trial.privacy.Optimizer`):

* ``sgd`` / ``momentum`` / ``adam`` — torch optimisers applied to the privatised gradient
  (post-processing, so they cost no privacy);
* ``gd`` — full-batch DP gradient descent, q = 1 (Panda et al. 2024);
* ``adadp`` — Koskela & Honkela (2020), Algorithm 2: from θ_ℓ, a full step θ_{ℓ+1} = θ_ℓ − ηG₁
  and two half steps θ̂_{ℓ+1} = θ_ℓ − η/2·G₁ − η/2·G₂, where G₂ is evaluated at
  θ_ℓ − η/2·G₁ on an *independent* Poisson batch; err = ‖(θ_{ℓ+1} − θ̂_{ℓ+1}) /
  max(1, |θ_{ℓ+1}|)‖₂ (eq. 6) and η ← min(max(tol/err, α_min), α_max)·η. The iterate
  continues from θ̂_{ℓ+1} (the more accurate two-half-step solution, as in the authors'
  code). Two subsampled Gaussian releases per step: RDP 2× that of DP-SGD (their Thm. 2).

The number of optimiser steps is T = ``DPSGDPrivacy.steps`` = ⌈epochs/q⌉, reported in
"epochs" of ⌈1/q⌉ steps. The privacy gate (:mod:`raydp_hpo.trainables.privacy_gate`) runs before any
data is touched. Every release is counted and, at the end, checked against the declared
mechanism ``privacy_from_config(config, n).mechanism()``.

Longer than ~600 lines because it is one training loop: :func:`train_dp` and its per-model
runner share the state that the optimisers, checkpoints and release counting use; splitting
would separate what a run spends from the code that counts it. The search space the trainable
accepts (its config keys and their checks) is its own concern, in
:mod:`raydp_hpo.trainables.trial_space` (re-exported here).
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydp_hpo._atomic_io import replace_dir
from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.mechanisms import (
    Mechanism,
    mechanism_to_dict,
)
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.ledger_like import LedgerLike
from raydp_hpo.trainables.data import Dataset, DataSplits, select_view, view_kind
from raydp_hpo.trainables.dp_step import GaussianNoise, PoissonBatches, make_clipper
from raydp_hpo.trainables.dp_step.noise import NoiseSource, noise_source, warn_noise_floor
from raydp_hpo.trainables.models import build_model
from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit, ledger_delta, resolve_ledger
from raydp_hpo.trainables.secret_rng import derive_seed, secret_generator
from raydp_hpo.trainables.trial_space import (
    TRAINABLE_CONFIG_KEYS,
    _finite_real,
    validate_trial_space,
)
from raydp_hpo.trial.privacy import (
    NOISY_SCORE_KEY,
    TRIAL_EPSILON_KEY,
    DPSGDPrivacy,
    Optimizer,
    dpsgd_steps,
    privacy_from_config,
    trial_mechanism,
)

__all__ = [
    "TrainResult",
    "ReleaseLog",
    "train_dp",
    "declared_privacy",
    "load_checkpoint",
    "training_sets",
    "validation_count",
    "count_correct",
    "ema_decay_at",
    "released_model_state",
    "public_sizes",
    "public_view_size",
    "validate_trial_space",
    "TRAINABLE_CONFIG_KEYS",
    "CHECKPOINT_FILE",
    "CHECKPOINT_META",
]

CHECKPOINT_FILE = "trial_state.pt"
CHECKPOINT_META = "meta.json"
ReportFn = Callable[[dict[str, Any], "str | None"], None]

#: ADADP defaults from Koskela & Honkela (2020), Sec. "Experiments": α_min = 0.9,
#: α_max = 1.1, tol = 1.0 with DP and 0.1 without.
ADADP_ALPHA_MIN, ADADP_ALPHA_MAX, ADADP_TOL_DP, ADADP_TOL_NONPRIVATE = 0.9, 1.1, 1.0, 0.1


def ema_decay_at(decay: float, step: int) -> float:
    """The decay β_t of the moving average of the weights after step t = 1, 2, ...:

        β_t = min(β, (1 + t) / (10 + t)),   w̄_t = β_t·w̄_{t−1} + (1 − β_t)·w_t,   w̄_0 = w_0,

an exponential moving average of the iterates — the parameter averaging that De, Berrada,
    Hayes, Smith & Balle (2022, "Unlocking high-accuracy differentially private image
    classification through scale") found to improve DP-SGD — with the warm-up of TensorFlow's
    ``ExponentialMovingAverage(num_updates=t)``: early iterates, far from any optimum, are
    forgotten quickly; later ones are averaged over ~1/(1 − β) steps, which averages out part
    of the Gaussian noise of the last updates.

    Privacy: w̄_t is a function of the iterates w_0, ..., w_t only, and DP-SGD's guarantee (the
    subsampled Gaussian mechanism composed over its steps) covers the whole sequence of
    iterates, so releasing, evaluating or selecting on w̄ instead of w_T is post-processing:
    no record is touched and nothing is charged (Dwork & Roth 2014, Prop. 2.1).
    """
    return min(decay, (1.0 + step) / (10.0 + step))


def _ema_decay(config: Mapping[str, Any]) -> float:
    value = config.get("ema_decay", 0.0)
    decay = _finite_real(value)
    if decay is None or not 0 <= decay < 1:
        raise InvalidParameterError(
            f"ema_decay must be a number in [0, 1) (0: release the last iterate; e.g. 0.95: "
            f"average the weights over ~20 steps), got {value!r}"
        )
    return decay


@dataclass(frozen=True)
class ReleaseLog:
    """What actually ran: noisy-gradient releases with their (σ, q) — for cross-checks."""

    noise_multiplier: float
    sample_rate: float
    releases: int


@dataclass
class TrainResult:
    """Outcome of :func:`train_dp`. ``models`` hold one state dict per trained model."""

    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    charge_id: str | None
    mechanism: Mechanism | None
    releases: list[ReleaseLog]
    models: list[dict[str, torch.Tensor]]
    learning_rates: list[list[float]] = field(default_factory=list)


def public_sizes(settings: RaydpSettings, data: DataSplits) -> tuple[int, int]:
    """The declared public (training, validation) sizes of a trial.

    From ``config["raydp"]`` (the searcher declares them). A hand-written block without them
    falls back to the realised sizes of ``data``, which are then *treated as public* — the
    caller's declaration, as in every DP-SGD library that computes q from ``len(dataset)``.
    """
    n = settings.dataset_size if settings.dataset_size is not None else len(data.train)
    n_val = (
        settings.validation_size if settings.validation_size is not None else max(1, len(data.val))
    )
    return n, n_val


def public_view_size(n_public: int, view: Mapping[str, Any] | None) -> int:
    """The public size one model of a view is accounted and normalised for: n for the full
    split, round(r·n) / n − round(r·n) for a rate-r subsample / its complement, ⌊n/k⌋ for one
    of k partitions (at least 1). Computed from the declared n alone: the realised sizes of a
    subsample or partition are private (DESIGN.md, "Secrets and neighbouring datasets")."""
    kind = view_kind(view)
    if kind == "full":
        return n_public
    assert view is not None
    if kind in ("subsample", "complement"):
        m = round(float(view["rate"]) * n_public)
        return max(1, m if kind == "subsample" else n_public - m)
    return max(1, n_public // int(view["num_partitions"]))


def declared_privacy(config: Mapping[str, Any], data: DataSplits) -> tuple[DPSGDPrivacy, int]:
    """The trial's privacy settings and the public size n_view they are computed for.

    n_view is :func:`public_view_size` of the declared public training-set size (never a
    realised, private size): q = batch_size / n_view when the config gives a batch size, and
    the DP-SGD normaliser is q·n_view. Needs no records.
    """
    settings = RaydpSettings.from_config(config)
    n_public, _ = public_sizes(settings, data)
    n_view = public_view_size(n_public, settings.data_view)
    return privacy_from_config(config, n_view), n_view


class _Runner:
    """One model, its optimiser state and its RNG streams (sampling, noise)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        train: Dataset,
        privacy: DPSGDPrivacy,
        nonprivate: bool,
        index: int,
        device: torch.device,
        *,
        seed: int,
        normaliser: float,
    ) -> None:
        # ``seed``: OS entropy, or derived from the user's secret seed (train_dp); never public.
        self.privacy, self.nonprivate, self.device = privacy, nonprivate, device
        self.n = len(train)
        with torch.random.fork_rng(devices=[]):
            # the initialisation need not be secret (DP-SGD holds for any data-independent
            # start), so torch's 64-bit (in effect 32-bit) global seed is fine here
            torch.manual_seed(derive_seed(seed, index, 0) % 2**64)
            self.model = build_model(
                config.get("model", "mlp"),
                train.feature_shape,
                train.num_classes,
                **dict(config.get("model_kwargs", {})),
            ).to(device)
        named = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        self.param_names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.x = torch.as_tensor(np.array(train.features), device=device)
        self.y = torch.as_tensor(np.array(train.labels), device=device)
        # secret streams seeded with all of ``seed``, not the 32 bits manual_seed keeps
        self.sampler = secret_generator(device, seed, index, 1)
        # Poisson batches drawn a block of steps ahead (same law, fewer small ops per step)
        self.batches = (
            None if privacy.optimizer is Optimizer.GD
            else PoissonBatches(len(train), privacy.sample_rate, self.sampler)
        )
        self.max_grad_norm = float(config.get("max_grad_norm", 1.0))
        if not self.max_grad_norm > 0:
            raise InvalidParameterError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        self.clipper = None if nonprivate else make_clipper(
            self.model, str(config.get("grad_sample_mode", "auto"))
        )
        # The normaliser q·n_view is a public constant (declared sizes), never len(train):
        # the realised size differs between neighbouring datasets and would leak through the
        # scale of every update.
        self.noise = GaussianNoise(
            privacy.noise_multiplier,
            self.max_grad_norm,
            normaliser,
            secret_generator(device, seed, index, 2),
            noise_source(config.get("noise_source", NoiseSource.SEEDED)),
        )
        lr = float(config.get("lr", 0.1))
        if not lr > 0:
            raise InvalidParameterError(f"lr must be > 0, got lr={lr}")
        opt = privacy.optimizer
        self.optimizer: torch.optim.Optimizer | None = None
        if opt in (Optimizer.SGD, Optimizer.GD):
            self.optimizer = torch.optim.SGD(self.params, lr=lr)
        elif opt is Optimizer.MOMENTUM:
            self.optimizer = torch.optim.SGD(
                self.params, lr=lr, momentum=float(config.get("momentum", 0.9))
            )
        elif opt is Optimizer.ADAM:
            self.optimizer = torch.optim.Adam(self.params, lr=lr)
        self.lr = lr  # ADADP's η_ℓ
        default_tol = ADADP_TOL_NONPRIVATE if nonprivate else ADADP_TOL_DP
        self.tol = float(config.get("adadp_tol", default_tol))
        self.alpha_min = float(config.get("adadp_alpha_min", ADADP_ALPHA_MIN))
        self.alpha_max = float(config.get("adadp_alpha_max", ADADP_ALPHA_MAX))
        if opt is Optimizer.ADADP and not (0 < self.alpha_min < 1 < self.alpha_max and self.tol > 0):
            raise InvalidParameterError(
                "ADADP needs 0 < adadp_alpha_min < 1 < adadp_alpha_max and adadp_tol > 0, got "
                f"{self.alpha_min=}, {self.alpha_max=}, {self.tol=}"
            )
        self.steps_done = 0
        self.lr_history: list[float] = []
        self.ema_decay = _ema_decay(config)
        # the exponential moving average of the iterates (None: off), see ema_decay_at
        self.ema: list[torch.Tensor] | None = (
            [p.detach().clone() for p in self.params] if self.ema_decay > 0 else None
        )

    # -- one noisy gradient -------------------------------------------------------------
    def _batch(self) -> torch.Tensor:
        if self.privacy.optimizer is Optimizer.GD:
            return torch.arange(self.n)
        # Poisson sampling in O(batch), from geometric gaps between the selected records
        assert self.batches is not None
        return self.batches.next()

    def _gradient(self) -> tuple[float, int]:
        """Draw a fresh Poisson batch and set ``p.grad`` to the (privatised) gradient."""
        idx = self._batch().to(self.device)
        x, y = self.x[idx], self.y[idx]
        if self.nonprivate:
            for p in self.params:
                p.grad = None
            if len(idx) == 0:
                for p in self.params:
                    p.grad = torch.zeros_like(p)
                return 0.0, 0
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return float(loss.detach()) * len(idx), len(idx)
        assert self.clipper is not None
        return self.clipper.privatised_gradient(
            x, y, self.max_grad_norm, self.noise, self.params
        )

    def step(self) -> tuple[float, int]:
        if self.privacy.optimizer is Optimizer.ADADP:
            out = self._adadp_step()
        else:
            assert self.optimizer is not None
            out = self._gradient()
            self.optimizer.step()
        self.steps_done += 1
        if self.ema is not None:
            weight = 1.0 - ema_decay_at(self.ema_decay, self.steps_done)
            with torch.no_grad():
                torch._foreach_lerp_(self.ema, [p.detach() for p in self.params], weight)
        return out

    @torch.no_grad()
    def _apply(self, base: list[torch.Tensor], scale: float) -> None:
        for p, b in zip(self.params, base):
            assert p.grad is not None
            p.copy_(b - scale * p.grad)

    def _adadp_step(self) -> tuple[float, int]:
        eta = self.lr
        theta0 = [p.detach().clone() for p in self.params]
        loss1, c1 = self._gradient()  # G₁ at θ_ℓ on batch B₁
        with torch.no_grad():
            full = [b - eta * p.grad for p, b in zip(self.params, theta0)]  # type: ignore[operator]
        self._apply(theta0, eta / 2)  # θ_{ℓ+1/2}
        half = [p.detach().clone() for p in self.params]
        loss2, c2 = self._gradient()  # G₂ at θ_{ℓ+1/2} on an independent batch B₂
        self._apply(half, eta / 2)  # θ̂_{ℓ+1}
        with torch.no_grad():
            sq = sum(
                (((f - p) / f.abs().clamp(min=1.0)) ** 2).sum() for f, p in zip(full, self.params)
            )
            err = float(torch.as_tensor(sq).sqrt())
        factor = self.alpha_max if err == 0 else min(max(self.tol / err, self.alpha_min), self.alpha_max)
        self.lr = eta * factor
        self.lr_history.append(self.lr)
        return loss1 + loss2, c1 + c2

    @contextlib.contextmanager
    def released_weights(self) -> Iterator[nn.Module]:
        """The model with the weights this runner releases and evaluates: the moving average
        of the iterates when ``ema_decay`` > 0 (swapped in for the block), else the iterate."""
        if self.ema is None:
            yield self.model
            return
        with torch.no_grad():
            live = [p.detach().clone() for p in self.params]
            for p, e in zip(self.params, self.ema):
                p.copy_(e)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for p, v in zip(self.params, live):
                    p.copy_(v)

    def correct(self, data: Dataset) -> int:
        """Number of records of ``data`` the released weights classify correctly."""
        with self.released_weights() as model:
            return count_correct(model, data)

    def released_state(self) -> dict[str, torch.Tensor]:
        """The state dict of the released weights (on the CPU): :func:`released_model_state`
        of this runner's checkpoint state."""
        return released_model_state(self.state())

    def accuracy(self, data: Dataset) -> float:
        """Accuracy on ``data`` with its realised size (an evaluation, never a release)."""
        return float("nan") if len(data) == 0 else self.correct(data) / len(data)

    # -- checkpoint state ---------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "lr": self.lr,
            "lr_history": list(self.lr_history),
            "steps_done": self.steps_done,
            "releases": self.noise.releases,
            "sampler_rng": self.sampler.get_state(),
            "sampler_pending": None if self.batches is None else self.batches.state(),
            "noise_rng": self.noise.generator.get_state(),
            # the float64 noise stream seeded from noise_rng at the first release (issue 40)
            "noise_stream": self.noise._normal.stream_state(),
            # parameter name → its moving average (what a release publishes in place of the
            # iterate: released_model_state)
            "ema": None if self.ema is None else {
                name: e.detach().cpu() for name, e in zip(self.param_names, self.ema)
            },
        }

    def load(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.lr = float(state["lr"])
        self.lr_history = list(state["lr_history"])
        self.steps_done = int(state["steps_done"])
        self.noise.releases = int(state["releases"])
        self.sampler.set_state(state["sampler_rng"])
        if self.batches is not None:  # no batches drawn ahead in the checkpoint: none kept
            self.batches.load(state.get("sampler_pending") or {})
        self.noise.generator.set_state(state["noise_rng"])
        self.noise._normal.load_stream_state(state.get("noise_stream"))
        if self.ema is not None:
            saved = state.get("ema")
            if not isinstance(saved, Mapping) or set(saved) != set(self.param_names):
                raise RayDPHPOError(
                    "the checkpoint holds no moving average of the weights for this config's "
                    f"ema_decay={self.ema_decay}; resume with the config it was written with"
                )
            with torch.no_grad():
                for name, e in zip(self.param_names, self.ema):
                    e.copy_(saved[name])


def released_model_state(runner_state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a trial releases, from one runner's checkpoint state (``trial_state.pt``'s
    ``runners[i]``): the moving average of the iterates when the trial ran with
    ``ema_decay`` > 0, else the last iterate. Releases and evaluations read this, never the
    live ``"model"`` entry alone."""
    return {**runner_state["model"], **(runner_state.get("ema") or {})}


@torch.no_grad()
def count_correct(model: nn.Module, data: Dataset, batch: int = 4096) -> int:
    """Number of records of ``data`` that ``model`` classifies correctly (batches are moved to
    the model's device; the model's train/eval mode is restored)."""
    if len(data) == 0:
        return 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    x = torch.as_tensor(np.array(data.features))
    y = torch.as_tensor(np.array(data.labels))
    for start in range(0, len(data), batch):
        pred = model(x[start : start + batch].to(device)).argmax(1).cpu()
        correct += int((pred == y[start : start + batch]).sum())
    model.train(was_training)
    return correct


def _save_checkpoint(path: Path, payload: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write the checkpoint directory: built beside ``path``, then swapped in
    (:func:`raydp_hpo._atomic_io.replace_dir`)."""

    def build(folder: Path) -> None:
        torch.save(payload, folder / CHECKPOINT_FILE)
        (folder / CHECKPOINT_META).write_text(json.dumps(meta, indent=2, sort_keys=True))

    replace_dir(path, build)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`train_dp` (a dict; see ``CHECKPOINT_FILE``)."""
    file = Path(path) / CHECKPOINT_FILE
    if not file.exists():
        raise RayDPHPOError(f"no checkpoint at {path!s} (missing {CHECKPOINT_FILE})")
    return torch.load(file, map_location="cpu", weights_only=False)  # type: ignore[no-any-return]


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_dp(
    config: Mapping[str, Any],
    data: DataSplits,
    *,
    ledger: LedgerLike | None = None,
    report: ReportFn | None = None,
    checkpoint_dir: str | Path | None = None,
    resume_from: str | Path | None = None,
    device: str | torch.device | None = None,
    owner: str | None = None,
    secret_seed: int | None = None,
) -> TrainResult:
    """Train one trial privately and return its :class:`TrainResult`.

    Order of events: validate config → declare the mechanism (from public sizes only) →
    privacy gate (charge / coverage; may raise, nothing trained) → train T steps, reporting
    ``report(metrics, checkpoint_dir)`` after each epoch of ⌈1/q⌉ steps and, if
    ``checkpoint_dir`` is given, saving a checkpoint there first.

    ``resume_from``: a checkpoint directory to continue from. A self-charging trial pays
    again for the steps it reruns (``<charge id>/resume/attempt-k``, see
    :func:`~raydp_hpo.trainables.privacy_gate.admit`); a plan-covered trial continues inside
    its plan charge, which assumes the interruption (a driver or node crash followed by
    ``DPTuner.restore``) did not depend on the data.
    ``ledger``: a :class:`~raydp_hpo.ledger.PrivacyLedger` or actor handle; default: the
    ledger actor named in ``config["raydp"]``.

    ``secret_seed``: ``None`` (default) draws every random choice the guarantee relies on
    (initialisation, Poisson batches, gradient noise, score noise) from OS entropy. A given
    seed makes the run reproducible (streams derived from (secret_seed, trial index)); anyone
    who knows it can regenerate the noise, so it is an argument, never a config key (configs
    are logged by Ray Tune), and must be kept as secret as the data. *Reproducible* means bit
    for bit with the same code, torch build, device and intra-op thread count
    (``torch.get_num_threads()``), in any process; at another thread count or on another CPU
    a multi-threaded reduction may sum in another order, and the run agrees only to
    floating-point rounding (the random draws are the same; ~3e-7 seen in the weights).

    Sizes: the normaliser q·n_view and q from ``batch_size`` use the declared public sizes of
    ``config["raydp"]`` (:func:`public_sizes`); the selection score is the noisy count of
    correct validation predictions over the declared validation size
    (:mod:`raydp_hpo.trial.privacy`).
    """
    if not isinstance(data, DataSplits):
        raise InvalidParameterError(f"data must be a DataSplits, got {type(data).__name__}")
    if "seed" in config:
        raise InvalidParameterError(
            "config key 'seed' is not allowed: a trial's seed drives its DP noise and a config "
            "is logged (Ray Tune's params.json); pass train_dp(..., secret_seed=...) or "
            "DPTuner(secret_seed=...) instead, or nothing for OS entropy"
        )
    settings = RaydpSettings.from_config(config)
    privacy, n_view = declared_privacy(config, data)
    _ema_decay(config)  # checked before the charge: a refused config costs nothing
    _, n_val_public = public_sizes(settings, data)
    training_mechanism = privacy.mechanism()
    score = None if settings.nonprivate else settings.score_release
    # What this trial releases: its training and, when its score feeds a selection, the
    # Laplace- or Gaussian-noised count of correct validation predictions
    # (raydp_hpo.trial.privacy.ScoreRelease).
    mechanism = trial_mechanism(training_mechanism, score)
    # Only when the validation size is not declared is the realised one public (and an empty
    # split a public fact). With a declared size an empty realised split is private: refusing
    # would tell the searcher so outside any mechanism, so the noisy count of 0 is released.
    if score is not None and settings.validation_size is None and len(data.val) == 0:
        raise InvalidParameterError(
            "a private selection score needs a validation split; the validation split is empty"
        )
    if secret_seed is None:
        # No seed: fresh OS entropy. A seed known to anyone lets them regenerate the DP noise
        # (and the Poisson batches), which voids the guarantee.
        seed = secrets.randbits(128)
        score_rng = np.random.default_rng(secrets.randbits(128))
    else:
        if isinstance(secret_seed, bool) or not isinstance(secret_seed, (int, np.integer)):
            raise InvalidParameterError(f"secret_seed must be an int or None, got {secret_seed!r}")
        seed = derive_seed(int(secret_seed) % 2**128, settings.trial_index or 0)
        score_rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    checkpoint = load_checkpoint(resume_from) if resume_from is not None else None
    if checkpoint is not None and checkpoint["mechanism"] != (
        None if settings.nonprivate else mechanism_to_dict(mechanism)
    ):
        raise RayDPHPOError("checkpoint was written for a different mechanism/config")
    ledger = resolve_ledger(settings, ledger)
    resume_mechanism = None
    if checkpoint is not None and not settings.nonprivate and settings.covered_by is None:
        # A self-charging trial pays again for what it reruns (privacy_gate.admit).
        remaining = privacy.steps - int(checkpoint["runners"][0]["steps_done"])
        if remaining > 0:
            resume_mechanism = trial_mechanism(
                privacy.mechanism_of_evaluations(remaining * privacy.gradient_evaluations_per_step),
                score,
            )
    charge_id = admit(
        settings,
        mechanism,
        ledger,
        owner=owner or f"{settings.experiment}:{settings.charge_id}",
        resume_charge_id=None if checkpoint is None else checkpoint["charge_id"],
        resume_mechanism=resume_mechanism,
    )
    # ---- admitted: from here on data is touched ----------------------------------------
    delta = float(config.get("target_delta", 0.0)) or ledger_delta(settings, ledger) or 1e-5
    dev = _pick_device(device)
    normaliser = privacy.sample_rate * n_view  # public: declared sizes only
    runners = [
        _Runner(config, t, privacy, settings.nonprivate, i, dev, seed=seed, normaliser=normaliser)
        for i, t in enumerate(training_sets(data.train, settings))
    ]
    if not settings.nonprivate:  # the noise's support floor, not in the certificate (issue 40)
        warn_noise_floor(privacy.noise_multiplier, sum(p.numel() for r in runners
                                                       for p in r.params),
                         privacy.steps * len(runners), delta)
    history: list[dict[str, Any]] = []
    start_epoch = 0
    if checkpoint is not None:
        for r, s in zip(runners, checkpoint["runners"], strict=True):
            r.load(s)
        history = list(checkpoint["history"])
        start_epoch = int(checkpoint["epoch"])
        torch.set_rng_state(checkpoint["torch_rng"])

    total = privacy.steps
    per_epoch = dpsgd_steps(1.0, privacy.sample_rate)
    epochs = math.ceil(total / per_epoch)
    evals_per_step = privacy.gradient_evaluations_per_step
    for epoch in range(start_epoch, epochs):
        stop = min((epoch + 1) * per_epoch, total)
        loss_sum, count = 0.0, 0
        for r in runners:
            while r.steps_done < stop:
                ls, c = r.step()
                loss_sum, count = loss_sum + ls, count + c
        steps = runners[0].steps_done
        # Mean over the trial's models of the count of correct validation predictions, each
        # clipped to the declared validation size (validation_count); scores are this count
        # over the declared public size, never over the realised size.
        mean_correct = validation_count([r.correct(data.val) for r in runners], n_val_public)
        metrics: dict[str, Any] = {
            "epoch": epoch + 1,
            "steps": steps,
            "loss": loss_sum / max(count, 1),
            "val_accuracy": min(1.0, mean_correct / n_val_public),
            # this trial's own ε under RDP, not the search's (TRIAL_EPSILON_KEY)
            TRIAL_EPSILON_KEY: 0.0
            if settings.nonprivate
            else epsilon(privacy.mechanism_of_evaluations(steps * evals_per_step), delta, Accountant.RDP),
            "delta": delta,
        }
        if privacy.optimizer is Optimizer.ADADP:
            metrics["learning_rate"] = float(np.mean([r.lr for r in runners]))
        if epoch + 1 == epochs:
            if len(data.test) > 0:  # no test split (test_fraction 0): no test accuracy, not NaN
                metrics["test_accuracy"] = float(np.mean([r.accuracy(data.test)
                                                          for r in runners]))
            if score is not None:
                # The selection score: the count plus Laplace(1/ε_s) or N(0, σ_s²) (sensitivity
                # 1), over the public validation size, clipped to [0, 1] (post-processing).
                # Earlier epochs' scores stay private artefacts: searchers read only the final
                # result.
                noisy = mean_correct + score.draw(score_rng)
                metrics["val_accuracy"] = min(1.0, max(0.0, noisy / n_val_public))
                metrics[NOISY_SCORE_KEY] = score.epsilon
                metrics["score_noise"] = score.noise.value
                metrics[TRIAL_EPSILON_KEY] = epsilon(
                    trial_mechanism(privacy.mechanism_of_evaluations(steps * evals_per_step), score),
                    delta,
                    Accountant.RDP,
                )
        history.append(metrics)
        if checkpoint_dir is not None:
            _save_checkpoint(
                Path(checkpoint_dir),
                {
                    "runners": [r.state() for r in runners],
                    "epoch": epoch + 1,
                    "history": history,
                    "charge_id": charge_id,
                    "mechanism": None if settings.nonprivate else mechanism_to_dict(mechanism),
                    "torch_rng": torch.get_rng_state(),
                },
                {"epoch": epoch + 1, "steps": steps, "charge_id": charge_id},
            )
        if report is not None:
            report(dict(metrics), None if checkpoint_dir is None else str(checkpoint_dir))

    releases = [
        ReleaseLog(privacy.noise_multiplier, privacy.sample_rate, r.noise.releases)
        for r in runners
    ]
    if not settings.nonprivate:
        for log in releases:  # what ran must be exactly what was declared and charged
            if privacy.mechanism_of_evaluations(log.releases) != training_mechanism:
                raise RayDPHPOError(
                    f"ran {log.releases} releases but declared {training_mechanism}; please "
                    "report a bug"
                )
    return TrainResult(
        metrics=history[-1] if history else {},
        history=history,
        charge_id=charge_id,
        mechanism=None if settings.nonprivate else mechanism,
        releases=releases,
        models=[r.released_state() for r in runners],
        learning_rates=[list(r.lr_history) for r in runners],
    )


def validation_count(counts: list[int], n_val_public: int) -> float:
    """(1/k) Σ_i min(c_i, n_val): the mean over a trial's k models of their counts of correct
    validation predictions, each clipped to the declared validation size ``n_val_public``.

    Sensitivities (add/remove one record): a validation record moves every c_i by at most 1
    and clipping is 1-Lipschitz, so the mean moves by at most 1; a training record of one of
    k disjoint partitions changes that partition's model only, so one clipped term moves by at
    most n_val and the mean by at most n_val/k — the 1/k of Ding et al.'s Lemma 2 once divided
    by n_val. Without the per-model clip, a realised validation split larger than the declared
    size (the declared size is a public estimate) let one partition's term exceed n_val, and
    one training record moved the SVT utility by n_val_realised/(k·n_val) > 1/k.
    """
    return float(np.mean([min(int(c), int(n_val_public)) for c in counts]))


def training_sets(train: Dataset, settings: RaydpSettings) -> list[Dataset]:
    """The records each model of a trial trains on (one set per model), exactly as
    :func:`train_dp` uses them: the trial's data view of the training split, untouched.

    In particular each of k partitions trains on all of its own records. (Trimming every
    partition to the smallest one's size, as an earlier version did, made one record added to
    a smallest partition change the training set of all k partitions, breaking the 1/k
    sensitivity of Ding et al.'s Lemma 2.) The mechanism does not need equal sizes: q and the
    steps come from the config, the normaliser from declared public sizes.
    """
    return select_view(train, settings.data_view)
