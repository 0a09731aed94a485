"""Federated experiment files: ``raydp-hpo federated --config FEDERATED.yaml``.

A federated experiment file is a YAML mapping, validated in full like an experiment file
(:mod:`raydp_hpo.cli.experiment`) *before* anything runs: an unknown or misspelled key is a
:class:`~raydp_hpo.errors.ConfigError` naming the key (and the closest valid one), a bad value
names its key path. It runs :func:`raydp_hpo.trainables.federated.run_federated_ray` (clients as Ray
actors) or :func:`~raydp_hpo.trainables.federated.run_federated` (in process) and writes
``result.json`` (accuracy per round, client learning rates, ADADP accepted/rejected steps)
into the run dir ``<storage_path>/<experiment>``; checkpoints go to ``<run dir>/checkpoints``,
so running the same file again resumes after the last finished round (and may add rounds).
Schema (``?`` = optional)::

    kind: federated                  # marks the file as a federated experiment
    experiment: fed-digits           # name of the run dir
    seed?: 0                         # reproducibility seed: initial model, client batches
    data:
      source: digits                 # digits | mnist1d
      size?: 2000                    # mnist1d: number of samples (default 5000)
      generator_seed?: 42            # mnist1d: generator seed
      test_fraction?: 0.2
      split_seed?: 0                 # the train/test split
    clients:
      count: 5                       # every client takes part in every round (C = 1)
      random_fraction?: 0.0          # p: share of records dealt at random (0 pathological,
                                     # 1 iid); see raydp_hpo.trainables.federated.pathological_split
      partition_seed?: 0
    model:
      name: mlp
      kwargs?: {hidden: [64]}
    training:
      optimizer: adadp               # adadp | sgd | adam
      lr?: 0.1                       # SGD/Adam rate, ADADP's initial η₀
      rounds?: 10
      local_epochs?: 1
      batch_size?: 10
      tol?: 0.1                      # ADADP only (the paper's non-private value)
      alpha_min?: 0.9
      alpha_max?: 1.1
    ray?: true                       # clients as Ray actors (RAY_ADDRESS or a local Ray)
    cpus_per_client?: 1
    storage_path?: ~/raydp_results   # default ~/raydp_results, or $RAYDP_HPO_STORAGE
    privacy?:                        # client-level DP (omit: not private)
      clip_norm: 1.0                 # C: each client's model update is clipped to ℓ₂ norm C
      noise_multiplier: 1.0          # σ: N(0, σ²C²) on the sum of the clipped updates
      budget: {epsilon: 8.0, delta: 1.0e-5}   # the client-level ledger's budget
      journal?: path                 # default <run dir>/client_ledger.journal

Without ``privacy`` the run is **not differentially private**: nothing touches a ledger, the
clients' updates are averaged in the clear and the seeds are ordinary reproducibility seeds.
With it, the run is client-level DP (:class:`raydp_hpo.trainables.federated.ClientDP`; privacy unit:
one client's whole data, add/remove one client; the noisy sum of updates is divided by the
declared ``clients.count``, never by the number of clients present):
``Gaussian(σ, rounds)`` is charged to a client-level ledger journaled in the run dir before
any round runs (refused: nothing runs), the DP noise comes from OS entropy, and
``result.json`` holds only what the guarantee covers (the per-round test accuracy of the
released global models, on the server's held-out split) plus the privacy figures — not the
clients' learning rates, step counts or shard sizes. The final global model is written alone
to ``<run dir>/released_model.pt`` (``model_path`` in ``result.json``); publish that, never
``checkpoints/``, which holds the secret noise generator's state (whoever has it can
regenerate the noise of every round and subtract it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import default_storage_path
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.experiment import (
    _budget,
    _check_keys,
    _int,
    _mapping,
    _number,
    _str,
    _StrictLoader,
    run_dir_of,
)
from raydp_hpo.errors import ConfigError, RayDPHPOError
from raydp_hpo.ledger.ledger_like import LedgerLike

if TYPE_CHECKING:
    from raydp_hpo.ledger.filter import PrivacyLedger

__all__ = [
    "FederatedSpec",
    "FedDataSpec",
    "ClientsSpec",
    "FedTrainingSpec",
    "parse_federated",
    "load_federated",
    "run_federated_experiment",
    "RESULT_FILE",
]

RESULT_FILE = "result.json"
_TOP_KEYS = ("kind", "experiment", "seed", "data", "clients", "model", "training", "ray",
             "cpus_per_client", "storage_path", "privacy")
_PRIVACY_KEYS = ("clip_norm", "noise_multiplier", "budget", "journal")
_DATA_KEYS = ("source", "size", "generator_seed", "test_fraction", "split_seed")
_CLIENT_KEYS = ("count", "random_fraction", "partition_seed")
_MODEL_KEYS = ("name", "kwargs")
_TRAINING_KEYS = ("optimizer", "lr", "rounds", "local_epochs", "batch_size", "tol",
                  "alpha_min", "alpha_max")
_SOURCES = ("digits", "mnist1d")
_FEATURE_SHAPES = {"digits": (1, 8, 8), "mnist1d": (40,)}  # raydp_hpo.trainables.data's loaders
_NUM_CLASSES = 10


@dataclass(frozen=True)
class FedDataSpec:
    source: str
    size: int = 5000
    generator_seed: int = 42
    test_fraction: float = 0.2
    split_seed: int = 0


@dataclass(frozen=True)
class ClientsSpec:
    count: int
    random_fraction: float = 0.0
    partition_seed: int = 0


@dataclass(frozen=True)
class FedTrainingSpec:
    """Keyword arguments of :class:`raydp_hpo.trainables.federated.FedSettings` (validated there too)."""

    optimizer: str
    lr: float = 0.1
    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 10
    tol: float = 0.1
    alpha_min: float = 0.9
    alpha_max: float = 1.1


@dataclass(frozen=True)
class FedPrivacySpec:
    """Client-level DP: clip norm C, noise multiplier σ, the client-level ledger's budget."""

    clip_norm: float
    noise_multiplier: float
    budget: PrivacyBudget
    journal: str | None = None


@dataclass(frozen=True)
class FederatedSpec:
    experiment: str
    data: FedDataSpec
    clients: ClientsSpec
    model_name: str
    training: FedTrainingSpec
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    ray: bool = True
    cpus_per_client: float = 1.0
    storage_path: str = field(default_factory=lambda: str(default_storage_path()))
    privacy: FedPrivacySpec | None = None

    @property
    def run_dir(self) -> Path:
        return run_dir_of(self.storage_path, self.experiment)

    @property
    def charge_id(self) -> str:
        return f"{self.experiment}/federated"

    @property
    def journal(self) -> Path:
        if self.privacy is not None and self.privacy.journal is not None:
            return Path(self.privacy.journal)
        return self.run_dir / "client_ledger.journal"

    def settings(self) -> Any:
        """The run's :class:`raydp_hpo.trainables.federated.FedSettings`."""
        from raydp_hpo.trainables.federated import ClientDP, ClientOptimizer, FedSettings

        t = self.training
        dp = None if self.privacy is None else ClientDP(self.privacy.clip_norm,
                                                        self.privacy.noise_multiplier,
                                                        num_clients=self.clients.count)
        return FedSettings(
            optimizer=ClientOptimizer(t.optimizer), lr=t.lr, rounds=t.rounds,
            local_epochs=t.local_epochs, batch_size=t.batch_size, tol=t.tol,
            alpha_min=t.alpha_min, alpha_max=t.alpha_max, model=self.model_name,
            model_kwargs=dict(self.model_kwargs), client_dp=dp,
        )


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _positive(where: str, value: Any) -> float:
    x = _number(where, value)
    if x <= 0:
        raise ConfigError(f"{where} must be > 0, got {value!r}")
    return x


def _fraction(where: str, value: Any, *, open_ends: bool) -> float:
    x = _number(where, value)
    ok = 0.0 < x < 1.0 if open_ends else 0.0 <= x <= 1.0
    if not ok:
        interval = "(0, 1)" if open_ends else "[0, 1]"
        raise ConfigError(f"{where} must be in {interval}, got {value!r}")
    return x


def parse_federated(raw: Any) -> FederatedSpec:
    """Validate a parsed YAML mapping into a :class:`FederatedSpec` (raises ConfigError)."""
    top = _mapping("the federated experiment file", raw)
    _check_keys("the federated experiment file", top, _TOP_KEYS,
                required=("kind", "experiment", "data", "clients", "model", "training"))
    if top["kind"] != "federated":
        raise ConfigError(f"kind must be 'federated', got {top['kind']!r} (experiment files "
                          "without kind run with `raydp-hpo run`)")
    experiment = _str("experiment", top["experiment"])
    if "/" in experiment or "\\" in experiment or experiment in (".", ".."):
        raise ConfigError(f"experiment must be a plain name (no path), got {experiment!r}")

    d = _mapping("data", top["data"])
    _check_keys("data", d, _DATA_KEYS, required=("source",))
    source = _choice("data.source", d["source"], _SOURCES)
    if source == "digits":
        for key in ("size", "generator_seed"):
            if key in d:
                raise ConfigError(f"data.{key} only applies to data.source: mnist1d")
    data = FedDataSpec(
        source=source,
        size=_int("data.size", d.get("size", 5000), minimum=10),
        generator_seed=_int("data.generator_seed", d.get("generator_seed", 42)),
        test_fraction=_fraction("data.test_fraction", d.get("test_fraction", 0.2),
                                open_ends=True),
        split_seed=_int("data.split_seed", d.get("split_seed", 0), minimum=0),
    )

    c = _mapping("clients", top["clients"])
    _check_keys("clients", c, _CLIENT_KEYS, required=("count",))
    clients = ClientsSpec(
        count=_int("clients.count", c["count"], minimum=1),
        random_fraction=_fraction("clients.random_fraction", c.get("random_fraction", 0.0),
                                  open_ends=False),
        partition_seed=_int("clients.partition_seed", c.get("partition_seed", 0), minimum=0),
    )

    m = _mapping("model", top["model"])
    _check_keys("model", m, _MODEL_KEYS, required=("name",))
    model_kwargs = dict(_mapping("model.kwargs", m.get("kwargs", {})))

    t = _mapping("training", top["training"])
    _check_keys("training", t, _TRAINING_KEYS, required=("optimizer",))
    training = FedTrainingSpec(
        optimizer=_choice("training.optimizer", t["optimizer"], ("adadp", "sgd", "adam")),
        lr=_positive("training.lr", t.get("lr", 0.1)),
        rounds=_int("training.rounds", t.get("rounds", 10), minimum=1),
        local_epochs=_int("training.local_epochs", t.get("local_epochs", 1), minimum=1),
        batch_size=_int("training.batch_size", t.get("batch_size", 10), minimum=1),
        tol=_positive("training.tol", t.get("tol", 0.1)),
        alpha_min=_fraction("training.alpha_min", t.get("alpha_min", 0.9), open_ends=True),
        alpha_max=_positive("training.alpha_max", t.get("alpha_max", 1.1)),
    )
    if not training.alpha_max > 1.0:
        raise ConfigError(f"training.alpha_max must be > 1, got {training.alpha_max!r}")

    privacy = None
    if "privacy" in top:
        pr = _mapping("privacy", top["privacy"])
        _check_keys("privacy", pr, _PRIVACY_KEYS,
                    required=("clip_norm", "noise_multiplier", "budget"))
        privacy = FedPrivacySpec(
            clip_norm=_positive("privacy.clip_norm", pr["clip_norm"]),
            noise_multiplier=_positive("privacy.noise_multiplier", pr["noise_multiplier"]),
            budget=_budget("privacy.budget", pr["budget"]),
            journal=None if pr.get("journal") is None else _str("privacy.journal",
                                                                  pr["journal"]),
        )
    ray = top.get("ray", True)
    if not isinstance(ray, bool):
        raise ConfigError(f"ray must be true or false, got {ray!r}")
    spec = FederatedSpec(
        experiment=experiment, data=data, clients=clients,
        model_name=_str("model.name", m["name"]), training=training, model_kwargs=model_kwargs,
        seed=_int("seed", top.get("seed", 0), minimum=0), ray=ray,
        cpus_per_client=_positive("cpus_per_client", top.get("cpus_per_client", 1.0)),
        storage_path=(_str("storage_path", top["storage_path"]) if "storage_path" in top
                      else str(default_storage_path())),
        privacy=privacy,
    )
    if clients.count > _NUM_CLASSES:
        raise ConfigError(
            f"clients.count={clients.count} exceeds the {_NUM_CLASSES} classes of "
            f"{source}: the pathological split gives each client its own classes; use at most "
            f"{_NUM_CLASSES} clients"
        )
    try:  # the trainer's own checks (model name and kwargs, settings), still before any data
        from raydp_hpo.trainables.models import build_model

        spec.settings()
        build_model(spec.model_name, _FEATURE_SHAPES[source], _NUM_CLASSES, **model_kwargs)
    except ConfigError:
        raise
    except (RayDPHPOError, TypeError, ValueError) as exc:
        raise ConfigError(f"model / training: {exc}") from None
    return spec


def load_federated(path: str | os.PathLike[str]) -> FederatedSpec:
    """Read and validate a federated experiment YAML file (raises :class:`ConfigError`)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"federated experiment file {str(p)!r} does not exist or is not a file")
    try:
        raw = yaml.load(p.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{str(p)!r} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{str(p)!r} is not valid YAML: {exc}") from None
    if raw is None:
        raise ConfigError(f"{str(p)!r} is empty; see raydp_hpo/cli/federated_experiment.py")
    return parse_federated(raw)


def run_federated_experiment(
    spec: FederatedSpec, *, out: Callable[[str], None] = print
) -> dict[str, Any]:
    """Load the data, split it across the clients, run every round (resuming from
    ``<run dir>/checkpoints``) and write ``<run dir>/result.json``; returns its content."""
    import numpy as np

    from raydp_hpo.trainables.data import load_digits, load_mnist1d, split
    from raydp_hpo.trainables.federated import pathological_split

    raw = (load_digits() if spec.data.source == "digits"
           else load_mnist1d(spec.data.size, seed=spec.data.generator_seed))
    data = split(raw, val_fraction=0.0, test_fraction=spec.data.test_fraction,
                 seed=spec.data.split_seed)
    parts = pathological_split(data.train.labels, spec.clients.count,
                               spec.clients.random_fraction,
                               np.random.default_rng(spec.clients.partition_seed))
    shards = [data.train.subset(i) for i in parts]
    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)

    def report(r: int, acc: float) -> None:
        out(f"round {r:4d}  test accuracy {acc:.4f}")

    kwargs: dict[str, Any] = {"seed": spec.seed, "checkpoint_dir": run_dir / "checkpoints",
                              "on_round": report}
    settings = spec.settings()
    ledger = None
    if spec.privacy is not None:
        ledger = _client_ledger(spec)
        kwargs.update(ledger=ledger, charge_id=spec.charge_id)
    try:
        result = _run(spec, shards, data.test, settings, kwargs)
        payload: dict[str, Any] = {
            "experiment": spec.experiment,
            "spec": asdict(spec),
            "private": spec.privacy is not None,
            "accuracy": result.accuracy,
        }
        if ledger is None:
            payload.update(client_sizes=[len(s) for s in shards], client_lr=result.client_lr,
                           accepted=result.accepted, rejected=result.rejected)
        else:
            payload["privacy"] = _privacy_figures(spec, settings, ledger)
        payload["model_path"] = str(_save_global_model(spec, result.state, data.train))
    finally:
        if ledger is not None:
            ledger.close()
    atomic_write_json(run_dir / RESULT_FILE, payload)
    out(f"final test accuracy {result.accuracy[-1]:.4f}; wrote {run_dir / RESULT_FILE}")
    return payload


def _save_global_model(spec: FederatedSpec, state: Mapping[str, Any], train: Any) -> Path:
    """The final global model alone (:mod:`raydp_hpo.trainables.release`), the file to
    publish: the round checkpoint under ``checkpoints/`` also holds the DP noise generator's
    state, from which every round's noise can be regenerated and subtracted."""
    from raydp_hpo.trainables.models import build_model
    from raydp_hpo.trainables.release import RELEASED_MODEL_FILE, save_released_model

    model = build_model(spec.model_name, train.feature_shape, train.num_classes,
                        **dict(spec.model_kwargs))
    model.load_state_dict(dict(state))
    return save_released_model(spec.run_dir / RELEASED_MODEL_FILE, model,
                               model_name=spec.model_name, model_kwargs=dict(spec.model_kwargs),
                               feature_shape=train.feature_shape,
                               num_classes=train.num_classes)


def _run(spec: FederatedSpec, shards: list[Any], test: Any, settings: Any,
         kwargs: dict[str, Any]) -> Any:
    from raydp_hpo.trainables.federated import run_federated, run_federated_ray

    if not spec.ray:
        return run_federated(shards, test, settings, **kwargs)
    import ray

    started = ensure_ray()  # attach to RAY_ADDRESS (a cluster, a job) or start a local Ray
    try:
        return run_federated_ray(shards, test, settings, num_cpus=spec.cpus_per_client,
                                 **kwargs)
    finally:
        if started:
            ray.shutdown()


def _client_ledger(spec: FederatedSpec) -> PrivacyLedger:
    """The client-level ledger: its journal (created with ``privacy.budget``, or reopened —
    a reopened journal must have that budget)."""
    from raydp_hpo.ledger.filter import PrivacyLedger

    if spec.privacy is None:
        raise ConfigError("a client ledger needs the privacy block")
    journal = spec.journal
    journal.parent.mkdir(parents=True, exist_ok=True)
    if journal.exists():
        ledger = PrivacyLedger.open(journal)
        if ledger.budget != spec.privacy.budget:
            ledger.close()
            raise ConfigError(
                f"privacy.budget {spec.privacy.budget} differs from the budget "
                f"{ledger.budget} of the existing client ledger {str(journal)!r}; keep the "
                "budget or name another privacy.journal"
            )
        return ledger
    return PrivacyLedger(spec.privacy.budget, journal)


def _privacy_figures(spec: FederatedSpec, settings: Any, ledger: LedgerLike) -> dict[str, Any]:
    from raydp_hpo.accounting.accountants import Accountant, epsilon_or_inf
    from raydp_hpo.accounting.mechanisms import mechanism_to_dict

    if spec.privacy is None or settings.client_dp is None:
        raise ConfigError("privacy figures need the privacy block")
    mechanism = settings.client_dp.mechanism(settings.rounds)
    delta = spec.privacy.budget.delta
    return {
        "unit": "one client's whole data (add/remove one client); the noisy sum of updates is "
                "divided by the declared clients.count, never by the number of clients present",
        "mechanism": mechanism_to_dict(mechanism),
        "delta": delta,
        "epsilon_rdp": epsilon_or_inf(mechanism, delta, Accountant.RDP),
        "epsilon_pld": epsilon_or_inf(mechanism, delta, Accountant.PLD),
        "charge_id": spec.charge_id,
        "ledger_spent_epsilon": ledger.spent(),
        "journal": str(spec.journal),
        "covers": "the global model after every round; not the clients' learning rates, step "
                  "counts or shard sizes, and not the test split (the server's own data)",
    }
