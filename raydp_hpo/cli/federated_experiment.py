"""Federated experiment files: ``raydp-hpo federated --config FEDERATED.yaml``.

A federated experiment file is a YAML mapping, validated in full like an experiment file
*before* anything runs, by :class:`raydp_hpo.cli.config.FederatedFile` (its keys, with
comments, are in :mod:`raydp_hpo.cli.config.federated`; ``raydp-hpo schema --kind federated``
prints the JSON Schema): an unknown or misspelled key is a
:class:`~raydp_hpo.errors.ConfigError` naming the key (and the closest valid one), a bad value
names its key path. The validated, frozen model is what this module runs. It runs
:func:`raydp_hpo.trainables.federated.run_federated_ray` (clients as Ray actors) or
:func:`~raydp_hpo.trainables.federated.run_federated` (in process) and writes ``result.json``
(accuracy per round, client learning rates, ADADP accepted/rejected steps) into the run dir
``<storage_path>/<experiment>``; checkpoints go to ``<run dir>/checkpoints``, so running the
same file again resumes after the last finished round (and may add rounds).

Without ``privacy`` the run is **not differentially private**: nothing touches a ledger, the
clients' updates are averaged in the clear and the seeds are ordinary reproducibility seeds.
With it, the run is client-level DP (:class:`raydp_hpo.trainables.federated.ClientDP`; privacy unit:
one client's whole data, add/remove one client; the noisy sum of updates is divided by the
declared ``clients.count``, never by the number of clients present):
``Gaussian(σ, rounds)`` is charged to a client-level ledger journaled in the run dir before
any round runs (refused: nothing runs; data bound to a ledger in the organisation's registry,
``RAYDP_HPO_REGISTRY``, is refused before that, as for every run), the DP noise comes from OS entropy, and
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo.cli.config import FederatedFile, load_yaml, validate_federated_file
from raydp_hpo.errors import ConfigError
from raydp_hpo.ledger.ledger_like import LedgerLike

if TYPE_CHECKING:
    from raydp_hpo.ledger.filter import PrivacyLedger

__all__ = [
    "FederatedFile",
    "parse_federated",
    "load_federated",
    "run_federated_experiment",
    "RESULT_FILE",
]

RESULT_FILE = "result.json"


def parse_federated(raw: Any) -> FederatedFile:
    """Validate a parsed YAML mapping into a :class:`FederatedFile` (raises ConfigError)."""
    return validate_federated_file(raw)


def load_federated(path: str | os.PathLike[str]) -> FederatedFile:
    """Read and validate a federated experiment YAML file (raises :class:`ConfigError`)."""
    raw = load_yaml(Path(path), "federated experiment file",
                      "see the schema in raydp_hpo/cli/config/federated.py ('raydp-hpo schema "
                      "--kind federated' prints it as JSON Schema) or cluster/examples/")
    return parse_federated(raw)


def run_federated_experiment(
    spec: FederatedFile, *, out: Callable[[str], None] = print
) -> dict[str, Any]:
    """Load the data, split it across the clients, run every round (resuming from
    ``<run dir>/checkpoints``) and write ``<run dir>/result.json``; returns its content."""
    import numpy as np

    from raydp_hpo.trainables.data import load_digits, load_mnist1d, split
    from raydp_hpo.trainables.federated import pathological_split

    if spec.privacy is not None:
        _check_registry(spec, out)  # before the data is loaded or anything is charged
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
            "spec": spec.model_dump(mode="json"),
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


def _save_global_model(spec: FederatedFile, state: Mapping[str, Any], train: Any) -> Path:
    """The final global model alone (:mod:`raydp_hpo.trainables.release`), the file to
    publish: the round checkpoint under ``checkpoints/`` also holds the DP noise generator's
    state, from which every round's noise can be regenerated and subtracted."""
    from raydp_hpo.trainables.models import build_model
    from raydp_hpo.trainables.release import RELEASED_MODEL_FILE, save_released_model

    model = build_model(spec.model.name, train.feature_shape, train.num_classes,
                        **dict(spec.model.kwargs))
    model.load_state_dict(dict(state))
    return save_released_model(spec.run_dir / RELEASED_MODEL_FILE, model,
                               model_name=spec.model.name, model_kwargs=dict(spec.model.kwargs),
                               feature_shape=train.feature_shape,
                               num_classes=train.num_classes)


def _run(spec: FederatedFile, shards: list[Any], test: Any, settings: Any,
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


def _check_registry(spec: FederatedFile, out: Callable[[str], None]) -> None:
    """Consult the organisation's dataset registry (``RAYDP_HPO_REGISTRY``) like every other
    run (:func:`raydp_hpo.tune.dataset_ledger.check_data_registry`): data bound to a ledger
    there may not be charged to this run's client-level journal, a fresh budget on the same
    people. Unset: nothing is checked."""
    from raydp_hpo.trainables.data import dataset_fingerprint
    from raydp_hpo.tune.dataset_ledger import check_data_registry

    source = spec.data.source
    fingerprint = (dataset_fingerprint(source, size=spec.data.size,
                                       generator_seed=spec.data.generator_seed)
                   if source == "mnist1d" else dataset_fingerprint(source))
    check_data_registry([fingerprint], spec.journal, out)


def _client_ledger(spec: FederatedFile) -> PrivacyLedger:
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


def _privacy_figures(spec: FederatedFile, settings: Any, ledger: LedgerLike) -> dict[str, Any]:
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
