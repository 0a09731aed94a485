"""Federated averaging with adaptive client learning rates (Koskela & Honkela 2020).

Section "Adaptive federated averaging algorithm" of Koskela & Honkela, *Learning rate
adaptation for differentially private learning* (AISTATS 2020): FedAvg (McMahan et al. 2017,
Algorithm 1) with client fraction C = 1 (every client takes part in every round), where each
client's local update is the **non-private** variant of ADADP (their Algorithm 2 with no
clipping and no noise, C = ∞, Cσ = 0) plus the extra acceptance rule err < tol.

One ADADP client step from θ_ℓ with learning rate η_ℓ, on two fresh minibatches B₁, B₂
(``G(θ, B)`` is the gradient of the *mean* cross-entropy over B; the paper's factor |B| only
rescales η):

* full step  θ_{ℓ+1} = θ_ℓ − η_ℓ·G(θ_ℓ, B₁);
* two half steps  θ_{ℓ+½} = θ_ℓ − η_ℓ/2·G(θ_ℓ, B₁),  θ̂_{ℓ+1} = θ_{ℓ+½} − η_ℓ/2·G(θ_{ℓ+½}, B₂);
* err_ℓ = ‖err(θ_{ℓ+1}, θ̂_{ℓ+1})‖₂ with err(θ, θ̂)_i = |θ_i − θ̂_i| / max(1, |θ_i|)  (eq. 6);
* the step is **accepted** (θ ← θ̂_{ℓ+1}, as :mod:`raydp_hpo.trainables.training` does) iff err_ℓ < tol,
  otherwise rejected (θ stays θ_ℓ); in both cases
  η_{ℓ+1} = min(max(tol/err_ℓ, α_min), α_max)·η_ℓ  (α_max when err_ℓ = 0).

Defaults α_min = 0.9, α_max = 1.1, tol = 0.1 (the paper's non-DP value). Minibatches follow
the paper: each local epoch permutes the client's shard and cuts it into batches of size |B|
(the last, shorter batch is dropped), so ADADP runs ⌊N_k/|B|⌋/2 steps per epoch — the same
number of gradient evaluations as SGD's ⌊N_k/|B|⌋ steps (a shard with fewer than 2|B| records
therefore makes no ADADP step; a shard smaller than |B| is one batch for SGD/Adam). Each client keeps its own η (and,
for Adam, its moment estimates) from round to round; only the model is replaced by the
server's average at the start of a round.

Server: θ ← Σ_k (N_k / N)·θ_k, the average of the client models **weighted by the client's
number of training records N_k** (McMahan et al.'s weighting; N = Σ_k N_k).

Baselines for the client update (:class:`ClientOptimizer`): SGD with a constant learning
rate (McMahan et al.'s choice) and Adam.

Not differentially private by default: the seeds are then ordinary reproducibility seeds and
nothing touches a privacy ledger.

**Client-level DP** (optional, ``FedSettings.client_dp`` = :class:`ClientDP`; the server-side
Gaussian mechanism of McMahan, Ramage, Talwar & Zhang 2018, "Learning Differentially Private
Recurrent Language Models", ICLR, Alg. 1 with every client in every round and a flat clip).
Each round, client k's update Δ_k = θ_k − θ is clipped to ℓ₂ norm C over all floating
tensors, Δ̃_k = Δ_k·min(1, C/‖Δ_k‖₂); the server releases

    θ ← θ + (Σ_k Δ̃_k + N(0, σ²C² I)) / K,

K = ``ClientDP.num_clients``, the **declared** number of clients (a public constant of the
configuration, the fixed-denominator estimator of McMahan et al. 2018): dividing by the number
of clients actually present would make the scale of every release, noise included, depend on
whether the added client is there — over a model's many coordinates the released noise's
spread alone then tells neighbouring federations apart (the same fault as a DP-SGD
normaliser computed from the realised dataset size). The average is unweighted because the
weights N_k would depend on private client sizes.
*Privacy unit: one client's whole data*; neighbouring federations differ by adding or removing
one client. Adding one client changes the sum by one clipped update, so each round is a
Gaussian mechanism of ℓ₂ sensitivity C and noise σC, i.e. ``Gaussian(σ)`` at sensitivity 1;
R rounds compose adaptively to ``Gaussian(σ, R)``, which is exactly (√R/σ)-GDP (Dong, Roth &
Su 2022, Cor. 3.3) and has RDP R·α/(2σ²) (Mironov 2017, Prop. 7; composition Prop. 1). That
mechanism is charged to the ledger passed in **before any round runs** (refused: nothing runs).
The ledger must account at client level: under add/remove of one *record* (each record held by
one client) one client's update changes within the ball of radius C, so the sensitivity is 2C
and the same run is ``Gaussian(σ/2, R)`` — do not charge the client-level figure to a
record-level ledger. What the guarantee covers: the sequence of global models. The clients'
learning rates, accepted/rejected counts and shard sizes (in :class:`FedResult` and the
checkpoint) are private artefacts, not releases; the per-round test accuracy is computed on
the server's own held-out split, which no client holds. The noise comes from OS entropy unless
a secret ``noise_seed`` is passed.

Two drivers share one server loop: :func:`run_federated` (in-process, no Ray) and
:func:`run_federated_ray` (one Ray actor per client, each holding only its own shard).
Both checkpoint after every round (atomic write: temporary file, then ``os.replace``) when
given ``checkpoint_dir`` and resume from the last checkpoint found there (the checkpoint holds
the global model, every client's η / optimiser state / minibatch generator and the history, so
a resumed run reproduces the uninterrupted one; it must have the same settings and seed except
``rounds``, which may grow).

This module holds the server: its (DP) averaging step, the loop whose inputs that step bounds,
the two drivers and the command line. The settings and result types
(:mod:`~raydp_hpo.trainables.federated_settings`) and the client side — its shard, the ADADP
step, the :class:`Client` (:mod:`~raydp_hpo.trainables.federated_client`) — are neighbours,
their names re-exported here.
"""

from __future__ import annotations

import argparse
import math
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raydp_hpo._atomic_io import atomic_write
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.ledger_like import LedgerLike
from raydp_hpo.trainables.data import Dataset
from raydp_hpo.trainables.dp_step.noise import StandardNormal64, exact_gaussian_release
from raydp_hpo.trainables.federated_client import (  # noqa: F401 (re-exported)
    AdadpOutcome,
    Client,
    _build,
    _grad,
    _seed,
    adadp_step,
    pathological_split,
)
from raydp_hpo.trainables.federated_settings import (
    ClientDP,
    ClientOptimizer,
    FedResult,
    FedSettings,
    StateDict,
)
from raydp_hpo.trainables.secret_rng import secret_generator
from raydp_hpo.trainables.training import count_correct

__all__ = [
    "ClientDP",
    "dp_fed_avg",
    "ClientOptimizer",
    "FedSettings",
    "FedResult",
    "AdadpOutcome",
    "Client",
    "adadp_step",
    "fed_avg",
    "pathological_split",
    "run_federated",
    "run_federated_ray",
    "main",
    "CHECKPOINT_NAME",
]

CHECKPOINT_NAME = "federated_state.pt"


# -- server ---------------------------------------------------------------------------------


def _same_keys(states: Sequence[Mapping[str, torch.Tensor]], keys: list[str]) -> None:
    for k, st in enumerate(states):
        if list(st) != keys:
            raise InvalidParameterError(f"state {k} has keys {sorted(st)}, expected {sorted(keys)}")


def _agreed_copy(key: str, ref: torch.Tensor,
                 states: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """A non-float tensor (an integer buffer) is not averaged: every client must hold ``ref``."""
    if any(not torch.equal(st[key], ref) for st in states):
        raise InvalidParameterError(f"non-float tensor {key!r} differs across states")
    return ref.detach().clone()


def fed_avg(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> StateDict:
    """Σ_k w_k·θ_k / Σ_k w_k over state dicts with identical keys and shapes (FedAvg uses
    w_k = N_k). Floating tensors are averaged (in float64, cast back); other tensors (integer
    buffers) must agree across clients and are copied."""
    if len(states) == 0 or len(states) != len(weights):
        raise InvalidParameterError(
            f"fed_avg needs one weight per state and at least one state, got {len(states)} "
            f"states and {len(weights)} weights"
        )
    w = [float(v) for v in weights]
    if not all(math.isfinite(v) and v >= 0 for v in w) or sum(w) <= 0:
        raise InvalidParameterError(f"weights must be finite, >= 0 and not all 0, got {w}")
    keys = list(states[0])
    _same_keys(states, keys)
    total = sum(w)
    out: StateDict = {}
    for key in keys:
        ref = states[0][key]
        if any(s[key].shape != ref.shape for s in states):
            raise InvalidParameterError(f"tensor {key!r} has different shapes across states")
        if ref.is_floating_point():
            acc = sum(wk / total * s[key].detach().to(torch.float64) for wk, s in zip(w, states))
            out[key] = torch.as_tensor(acc).to(ref.dtype).clone()
        else:
            out[key] = _agreed_copy(key, ref, states)
    return out


def dp_fed_avg(
    global_state: Mapping[str, torch.Tensor],
    states: Sequence[Mapping[str, torch.Tensor]],
    dp: ClientDP,
    generator: torch.Generator,
) -> StateDict:
    """θ + (Σ_k clip_C(θ_k − θ) + N(0, σ²C² I)) / K over the floating tensors (module
    docstring), K = ``dp.num_clients``, the declared number of clients — not ``len(states)``,
    the realised one, which differs between neighbouring federations (adding a client would
    change the scale of the whole release, noise included; see the module docstring). With
    more or fewer clients present than declared the average is only rescaled (utility, not
    privacy). The clip is on the ℓ₂ norm of each client's whole update; the noise is drawn
    from ``generator`` (a secret stream) in float64 and the noisy sum rounded to a public
    grid (:func:`~raydp_hpo.trainables.dp_step.noise.exact_gaussian_release`, issue 40). An
    update whose norm is inf or NaN contributes 0 (still of norm ≤ C, so the sensitivity C holds), instead of turning the
    released state into NaN if and only if that client is present. Non-float tensors must
    agree across clients and are copied."""
    if len(states) == 0:
        raise InvalidParameterError("dp_fed_avg needs at least one client state")
    keys = list(global_state)
    _same_keys(states, keys)
    floats = [key for key in keys if global_state[key].is_floating_point()]
    total = {key: torch.zeros(global_state[key].shape, dtype=torch.float64) for key in floats}
    for st in states:
        delta = {key: st[key].detach().to(torch.float64)
                 - global_state[key].detach().to(torch.float64) for key in floats}
        norm = math.sqrt(sum(float((d * d).sum()) for d in delta.values()))
        if not math.isfinite(norm):  # an inf/NaN update (a diverged client) adds exactly 0:
            continue  # scaling it would leave NaN in the sum iff that client took part
        scale = min(1.0, dp.clip_norm / norm) if norm > 0 else 1.0
        for key in floats:
            total[key] += scale * delta[key]
    std = dp.noise_multiplier * dp.clip_norm
    # the noise as the DP-SGD step draws it (issue 40): float64 draws with no Box–Muller pair
    # structure and a support of 12.12σ, the noisy sum rounded to a public grid
    normal = StandardNormal64(generator)
    out: StateDict = {}
    for key in keys:
        ref = global_state[key]
        if key in total:
            noisy = exact_gaussian_release(total[key], std, normal)
            new = ref.detach().to(torch.float64) + noisy / dp.num_clients
            out[key] = new.to(ref.dtype).clone()
        else:
            out[key] = _agreed_copy(key, ref, states)
    return out


# -- the server loop ------------------------------------------------------------------------


@dataclass
class _Pool:
    """How the server reaches its clients (in-process objects or Ray actors)."""

    update: Callable[[StateDict], list[tuple[StateDict, int, dict[str, float]]]]
    states: Callable[[], list[dict[str, Any]]]
    load: Callable[[list[dict[str, Any]]], None]


def _save_atomic(path: Path, payload: dict[str, Any]) -> None:
    atomic_write(path, lambda fh: torch.save(payload, fh))


def _resumable(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must share with the checkpoint (all but ``rounds``: a run
    may be resumed to go on for more rounds)."""
    return {k: v for k, v in settings.items() if k != "rounds"}


def _admit(
    settings: FedSettings,
    ledger: LedgerLike | None,
    charge_id: str | None,
    checkpoint_dir: str | Path | None,
) -> None:
    """Charge client-level DP's ``Gaussian(σ, rounds)`` to ``ledger`` before any round runs.

    A fresh run (no checkpoint) pays under a ``charge_id`` not yet on the ledger (an id
    already there is refused: a second run under it would spend privacy unpaid); a resumed run
    needs its charge on the ledger with the same mechanism (replayed, not paid twice; more
    rounds than were charged need a fresh run under a new id). Raises
    :class:`~raydp_hpo.errors.BudgetExhaustedError` when the budget refuses; nothing has run.
    """
    dp = settings.client_dp
    if dp is None:
        if ledger is not None or charge_id is not None:
            raise InvalidParameterError(
                "ledger / charge_id given but settings.client_dp is None: a non-private run "
                "charges nothing; set client_dp=ClientDP(clip_norm, noise_multiplier, "
                "num_clients) or drop them"
            )
        return
    if ledger is None or not isinstance(charge_id, str) or not charge_id:
        raise InvalidParameterError(
            "client-level DP needs a ledger and a non-empty charge_id: its Gaussian(σ, rounds) "
            f"is charged before any round runs (got ledger={ledger!r}, charge_id={charge_id!r})"
        )
    mechanism = dp.mechanism(settings.rounds)
    resuming = checkpoint_dir is not None and (Path(checkpoint_dir) / CHECKPOINT_NAME).exists()
    if resuming:
        if not ledger.has_charge(charge_id):
            raise RayDPHPOError(
                f"checkpoint in {checkpoint_dir} but charge {charge_id!r} is not on the ledger; "
                "refusing to resume a private run that was never paid for"
            )
        ledger.try_charge(charge_id, mechanism, owner="federated").raise_if_refused()
        return
    if ledger.has_charge(charge_id):
        raise RayDPHPOError(
            f"charge {charge_id!r} is already on the ledger and there is no checkpoint to "
            "resume: a new run must pay under a new charge_id"
        )
    ledger.try_charge(charge_id, mechanism, owner="federated").raise_if_refused()


def _serve(
    pool: _Pool,
    test: Dataset,
    settings: FedSettings,
    *,
    seed: int,
    feature_shape: tuple[int, ...],
    num_classes: int,
    checkpoint_dir: str | Path | None,
    on_round: Callable[[int, float], None] | None,
    noise_seed: int | None = None,
    charge_id: str | None = None,
) -> FedResult:
    dp = settings.client_dp
    # secret: OS entropy unless the caller passes a secret seed (never the public `seed`);
    # the generator's whole state comes from it, not the 32 bits manual_seed keeps
    noise = secret_generator(
        "cpu", secrets.randbits(128) if noise_seed is None else int(noise_seed) % 2**128
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(seed, 0))
        model = _build(settings, feature_shape, num_classes)
    state: StateDict = {k: v.detach().clone() for k, v in model.state_dict().items()}
    accuracy = [count_correct(model, test) / max(len(test), 1)]
    client_lr: list[list[float]] = []
    accepted: list[int] = []
    rejected: list[int] = []
    start = 1
    ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / CHECKPOINT_NAME
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        if _resumable(saved["settings"]) != _resumable(settings.to_dict()) or saved[
            "seed"
        ] != seed:
            raise RayDPHPOError(
                f"checkpoint {ckpt} was written with other settings or seed "
                f"({saved['settings']}, seed={saved['seed']}); use another checkpoint_dir"
            )
        if saved.get("charge_id") != charge_id:
            raise RayDPHPOError(
                f"checkpoint {ckpt} was written under charge {saved.get('charge_id')!r}, not "
                f"{charge_id!r}; resume with the same charge_id"
            )
        if saved.get("noise") is not None:
            noise.set_state(saved["noise"])
        state, accuracy = saved["state"], saved["accuracy"]
        client_lr, accepted, rejected = saved["client_lr"], saved["accepted"], saved["rejected"]
        pool.load(saved["clients"])
        start = saved["round"] + 1
    for r in range(start, settings.rounds + 1):
        results = pool.update(state)
        if dp is None:
            state = fed_avg([s for s, _, _ in results], [n for _, n, _ in results])
        else:
            state = dp_fed_avg(state, [s for s, _, _ in results], dp, noise)
        model.load_state_dict(state)
        accuracy.append(count_correct(model, test) / max(len(test), 1))
        client_lr.append([float(st["lr"]) for _, _, st in results])
        accepted.append(int(sum(st["accepted"] for _, _, st in results)))
        rejected.append(int(sum(st["rejected"] for _, _, st in results)))
        if ckpt is not None:
            _save_atomic(ckpt, {
                "round": r, "seed": seed, "settings": settings.to_dict(), "state": state,
                "accuracy": accuracy, "client_lr": client_lr, "accepted": accepted,
                "rejected": rejected, "clients": pool.states(), "charge_id": charge_id,
                "noise": None if dp is None else noise.get_state(),
            })
        if on_round is not None:
            on_round(r, accuracy[-1])
    return FedResult(accuracy, client_lr, accepted, rejected, state)


def _check_shards(shards: Sequence[Dataset]) -> tuple[tuple[int, ...], int]:
    if len(shards) == 0:
        raise InvalidParameterError("run_federated needs at least one client shard")
    shapes = {d.feature_shape for d in shards}
    classes = {d.num_classes for d in shards}
    if len(shapes) != 1 or len(classes) != 1:
        raise InvalidParameterError(
            f"client shards disagree on feature shape {sorted(shapes)} or classes {classes}"
        )
    return shapes.pop(), classes.pop()


def run_federated(
    shards: Sequence[Dataset],
    test: Dataset,
    settings: FedSettings,
    *,
    seed: int,
    checkpoint_dir: str | Path | None = None,
    on_round: Callable[[int, float], None] | None = None,
    ledger: LedgerLike | None = None,
    charge_id: str | None = None,
    noise_seed: int | None = None,
) -> FedResult:
    """FedAvg with C = 1 over in-process clients (one per shard), ``settings.rounds`` rounds.

    ``seed`` fixes the initial model and each client's minibatch order (client k uses
    ``SeedSequence([seed, 1, k])``), so two calls with the same arguments agree exactly.
    With ``settings.client_dp``: ``ledger`` and ``charge_id`` are required and the run's
    ``Gaussian(σ, rounds)`` is charged first (:func:`_admit`); ``noise_seed`` is a *secret*
    seed of the DP noise (default: OS entropy).
    """
    shape, k = _check_shards(shards)
    _admit(settings, ledger, charge_id, checkpoint_dir)
    clients = [Client(d, settings, seed=_seed(seed, 1, i)) for i, d in enumerate(shards)]

    def load(states: list[dict[str, Any]]) -> None:
        for c, st in zip(clients, states):
            c.load(st)

    pool = _Pool(
        update=lambda state: [c.local_update(state) for c in clients],
        states=lambda: [c.state() for c in clients],
        load=load,
    )
    return _serve(pool, test, settings, seed=seed, feature_shape=shape, num_classes=k,
                  checkpoint_dir=checkpoint_dir, on_round=on_round, noise_seed=noise_seed,
                  charge_id=charge_id)


def run_federated_ray(
    shards: Sequence[Dataset],
    test: Dataset,
    settings: FedSettings,
    *,
    seed: int,
    num_cpus: float = 1.0,
    checkpoint_dir: str | Path | None = None,
    on_round: Callable[[int, float], None] | None = None,
    ledger: LedgerLike | None = None,
    charge_id: str | None = None,
    noise_seed: int | None = None,
) -> FedResult:
    """As :func:`run_federated`, with each client a Ray actor (``num_cpus`` each) that holds
    only its own shard; clients train in parallel, the server (this process) broadcasts the
    global state dict once per round through the object store and averages. Actors use the
    default scheduler, or ``"SPREAD"`` when the cluster has several alive nodes. Needs
    ``ray.init()`` first; the actors are killed on return."""
    import ray

    if not ray.is_initialized():
        raise RayDPHPOError("run_federated_ray needs a Ray runtime; call ray.init() first")
    if not (math.isfinite(num_cpus) and num_cpus > 0):
        raise InvalidParameterError(f"num_cpus must be finite and > 0, got {num_cpus!r}")
    shape, k = _check_shards(shards)
    _admit(settings, ledger, charge_id, checkpoint_dir)  # before any actor holds data
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    options: dict[str, Any] = {"num_cpus": num_cpus}
    if len(nodes) > 1:
        options["scheduling_strategy"] = "SPREAD"
    actor_cls = ray.remote(Client)
    actors: list[Any] = [
        actor_cls.options(**options).remote(  # type: ignore[attr-defined]
            d, settings, seed=_seed(seed, 1, i), num_threads=max(1, int(num_cpus))
        )
        for i, d in enumerate(shards)
    ]
    def update(state: StateDict) -> list[tuple[StateDict, int, dict[str, float]]]:
        ref = ray.put(state)  # one broadcast per round
        return ray.get([a.local_update.remote(ref) for a in actors])

    def load(states: list[dict[str, Any]]) -> None:
        ray.get([a.load.remote(st) for a, st in zip(actors, states)])

    try:
        pool = _Pool(update, lambda: ray.get([a.state.remote() for a in actors]), load)
        return _serve(pool, test, settings, seed=seed, feature_shape=shape, num_classes=k,
                      checkpoint_dir=checkpoint_dir, on_round=on_round, noise_seed=noise_seed,
                      charge_id=charge_id)
    finally:
        for a in actors:
            ray.kill(a)


# -- command line ---------------------------------------------------------------------------


def _load(name: str) -> Dataset:
    from raydp_hpo.trainables.data import load_digits, load_mnist1d

    if name == "digits":
        return load_digits()
    if name == "mnist1d":
        return load_mnist1d()
    raise InvalidParameterError(f"unknown dataset {name!r}; use digits or mnist1d")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raydp_hpo.trainables.federated --dataset digits --rounds 10 ...``: one run, prints
    the test accuracy per round."""
    p = argparse.ArgumentParser(prog="python -m raydp_hpo.trainables.federated", description=__doc__
                                .split("\n\n")[0])
    p.add_argument("--dataset", choices=["digits", "mnist1d"], default="digits")
    p.add_argument("--optimizer", choices=[o.value for o in ClientOptimizer], default="adadp")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--random-fraction", type=float, default=0.0,
                   help="p: fraction of records dealt at random (0 pathological, 1 iid)")
    p.add_argument("--hidden", type=int, nargs="*", default=[256, 256])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--ray", action="store_true", help="clients as Ray actors (ray.init())")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per client actor (--ray)")
    a = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: one thread is fastest and shares the machine
    try:
        return _run_main(a)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process keeps its setting


def _run_main(a: argparse.Namespace) -> int:
    from raydp_hpo.trainables.data import split

    try:
        settings = FedSettings(
            optimizer=ClientOptimizer(a.optimizer), lr=a.lr, rounds=a.rounds,
            local_epochs=a.local_epochs, batch_size=a.batch_size,
            model_kwargs={"hidden": tuple(a.hidden)},
        )
        data = split(_load(a.dataset), val_fraction=0.0, test_fraction=0.2, seed=a.seed)
        idx = pathological_split(data.train.labels, a.clients, a.random_fraction,
                                 np.random.default_rng(a.seed))
        shards = [data.train.subset(i) for i in idx]

        def report(r: int, acc: float) -> None:
            print(f"round {r:4d}  test accuracy {acc:.4f}", flush=True)

        kwargs: dict[str, Any] = {"seed": a.seed, "checkpoint_dir": a.checkpoint_dir,
                                  "on_round": report}
        if a.ray:
            import ray

            started = ensure_ray()  # attach to RAY_ADDRESS or start a local Ray
            try:
                run_federated_ray(shards, data.test, settings, num_cpus=a.num_cpus, **kwargs)
            finally:
                if started:
                    ray.shutdown()
        else:
            run_federated(shards, data.test, settings, **kwargs)
    except RayDPHPOError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
