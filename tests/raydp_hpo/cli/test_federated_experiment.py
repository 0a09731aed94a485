"""Federated experiment files (raydp_hpo.cli.federated_experiment, `raydp-hpo federated --config`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from raydp_hpo.cli.federated_experiment import (
    RESULT_FILE,
    load_federated,
    parse_federated,
    run_federated_experiment,
)
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import ConfigError
from raydp_hpo.trainables.data import load_digits, split
from raydp_hpo.trainables.federated import CHECKPOINT_NAME
from raydp_hpo.trainables.release import load_released_model

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "cluster/examples/federated_digits.yaml"


@pytest.fixture
def raw() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_file_parses() -> None:
    spec = load_federated(EXAMPLE)
    assert spec.experiment == "fed-digits" and spec.clients.count == 5 and spec.ray
    s = spec.settings()
    assert s.optimizer.value == "adadp" and s.tol == 0.1 and s.batch_size == 10
    assert dict(s.model_kwargs) == {"hidden": [64]}


def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    *head, last = path.split(".")
    node = out
    for k in head:
        node = node[k]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("trainng", {}, "unknown key 'trainng' in the federated experiment file; did you mean "
                        "'training'"),
        ("kind", "experiment", "kind must be 'federated'"),
        ("kind", _DELETE, "needs the key 'kind'"),
        ("experiment", "../x", "experiment must be a plain name"),
        ("data.source", "cifar10", "data.source must be one of digits, mnist1d"),
        ("data.size", 500, "data.size only applies to data.source: mnist1d"),
        ("data.test_fraction", 1.0, "data.test_fraction must be in (0, 1)"),
        ("data.sorce", "digits", "did you mean 'source'"),
        ("clients.count", 0, "clients.count must be >= 1"),
        ("clients.count", 11, "clients.count=11 exceeds the 10 classes"),
        ("clients.count", 2.5, "clients.count must be an integer"),
        ("clients.random_fraction", 1.5, "clients.random_fraction must be in [0, 1]"),
        ("model.name", "transformer", "model / training"),
        ("model.kwargs", {"hiden": [8]}, "model / training"),
        ("training.optimizer", "rmsprop", "training.optimizer must be one of adadp, sgd, adam"),
        ("training.lr", -0.1, "training.lr must be > 0"),
        ("training.rounds", 0, "training.rounds must be >= 1"),
        ("training.alpha_max", 0.95, "training.alpha_max must be > 1"),
        ("training.tol", "x", "training.tol must be a number"),
        ("training.epochs", 1, "unknown key 'epochs' in training"),
        ("ray", "yes", "ray must be true or false"),
    ],
)
def test_bad_input_names_the_key(raw: dict[str, Any], path: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_federated(_set(raw, path, value))
    assert words in str(info.value)


def test_cli_refuses_a_bad_file_and_dry_runs_a_good_one(
    raw: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_set(raw, "training.optimizer", "rmsprop")))
    assert main(["federated", "--config", str(bad)]) == EXIT_BAD_INPUT
    assert "training.optimizer" in capsys.readouterr().err
    assert main(["federated", "--config", str(tmp_path / "missing.yaml")]) == EXIT_BAD_INPUT
    assert main(["federated", "--config", str(EXAMPLE), "--dry-run"]) == EXIT_OK
    assert "valid federated experiment 'fed-digits'" in capsys.readouterr().out
    assert not (tmp_path / "raydp_results").exists()


def test_runs_briefly_writes_result_and_resumes(raw: dict[str, Any], tmp_path: Path) -> None:
    """The example file, shortened (1 round, small model, in process), runs end to end and
    writes result.json; the same file with 2 rounds resumes from the checkpoint: round 1 is
    not run again (its accuracy is carried over) and one more round is added."""
    raw = _set(raw, "storage_path", str(tmp_path / "out"))
    raw = _set(raw, "ray", False)
    raw = _set(raw, "model.kwargs", {"hidden": [8]})
    raw = _set(raw, "training.batch_size", 50)
    raw = _set(raw, "training.rounds", 1)
    lines: list[str] = []
    first = run_federated_experiment(parse_federated(raw), out=lines.append)
    result = tmp_path / "out" / "fed-digits" / RESULT_FILE
    assert json.loads(result.read_text())["accuracy"] == first["accuracy"]
    assert len(first["accuracy"]) == 2 and first["private"] is False
    train = split(load_digits(), val_fraction=0.0, test_fraction=0.2, seed=0).train
    assert sum(first["client_sizes"]) == len(train)  # each training record on one client
    assert any(line.startswith("round    1") for line in lines)
    more = run_federated_experiment(parse_federated(_set(raw, "training.rounds", 2)),
                                    out=lines.append)
    assert len(more["accuracy"]) == 3 and more["accuracy"][:2] == first["accuracy"]


@pytest.mark.slow  # ~3 min on the loaded 2-core machine (5 actors); the Ray client path is
@pytest.mark.ray   # also covered by tests/raydp_hpo/trainables/test_federated.py
def test_cli_runs_the_example_with_ray_clients(
    ray_session: None, raw: dict[str, Any], tmp_path: Path
) -> None:
    """`raydp-hpo federated --config FILE` with clients as Ray actors (a shortened example)."""
    raw = _set(raw, "storage_path", str(tmp_path / "out"))
    raw = _set(raw, "cpus_per_client", 0.2)
    raw = _set(raw, "model.kwargs", {"hidden": [8]})
    raw = _set(raw, "training.batch_size", 50)
    raw = _set(raw, "training.rounds", 1)
    path = tmp_path / "fed.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["federated", "--config", str(path)]) == EXIT_OK
    payload = json.loads((tmp_path / "out" / "fed-digits" / RESULT_FILE).read_text())
    assert len(payload["accuracy"]) == 2 and len(payload["client_lr"][0]) == 5


PRIVACY = {"clip_norm": 1.0, "noise_multiplier": 2.0, "budget": {"epsilon": 20.0,
                                                                 "delta": 1.0e-5}}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({**PRIVACY, "clip": 1.0}, "unknown key 'clip' in privacy; did you mean 'clip_norm'"),
        ({"clip_norm": 1.0, "noise_multiplier": 2.0}, "privacy needs the key 'budget'"),
        ({**PRIVACY, "clip_norm": 0}, "privacy.clip_norm must be > 0"),
        ({**PRIVACY, "noise_multiplier": -1}, "privacy.noise_multiplier must be > 0"),
        ({**PRIVACY, "budget": {"epsilon": 1.0}}, "privacy.budget needs the key 'delta'"),
    ],
)
def test_bad_privacy_block_names_the_key(raw: dict[str, Any], value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_federated(_set(raw, "privacy", value))
    assert words in str(info.value)


def _private(raw: dict[str, Any], tmp_path: Path, **privacy: Any) -> dict[str, Any]:
    raw = _set(raw, "storage_path", str(tmp_path / "out"))
    raw = _set(raw, "ray", False)
    raw = _set(raw, "model.kwargs", {"hidden": [8]})
    raw = _set(raw, "training.batch_size", 50)
    raw = _set(raw, "training.rounds", 2)
    return _set(raw, "privacy", {**PRIVACY, **privacy})


def test_private_run_charges_the_client_ledger_and_releases_only_covered_values(
    raw: dict[str, Any], tmp_path: Path
) -> None:
    """With privacy: Gaussian(σ, rounds) is charged to the client-level ledger journaled in
    the run dir before round 1; result.json holds the figures (ε under RDP ≥ PLD) and no
    client learning rates, step counts or shard sizes; running the file again resumes and
    replays the charge instead of paying twice."""
    from raydp_hpo.accounting.mechanisms import Gaussian
    from raydp_hpo.ledger.filter import PrivacyLedger

    spec = parse_federated(_private(raw, tmp_path))
    payload = run_federated_experiment(spec, out=lambda _: None)
    assert payload["private"] is True
    assert not {"client_lr", "accepted", "rejected", "client_sizes"} & set(payload)
    fig = payload["privacy"]
    assert fig["mechanism"] == {"type": "gaussian", "noise_multiplier": 2.0, "count": 2}
    assert fig["epsilon_pld"] <= fig["epsilon_rdp"] <= 20.0
    assert "one client" in fig["unit"]
    # the model to publish is written alone: weights and architecture, no generator state
    released = torch.load(payload["model_path"], map_location="cpu", weights_only=True)
    assert set(released) == {"format", "model", "model_kwargs", "feature_shape",
                             "num_classes", "state_dict"}
    checkpoint = torch.load(spec.run_dir / "checkpoints" / CHECKPOINT_NAME, map_location="cpu",
                            weights_only=False)
    model = load_released_model(payload["model_path"])
    assert all(torch.equal(v, checkpoint["state"][k]) for k, v in model.state_dict().items())
    ledger = PrivacyLedger.read_only(spec.journal)
    (charge,) = ledger.charges()
    assert charge.mechanism == Gaussian(2.0, 2) and charge.charge_id == "fed-digits/federated"
    ledger.close()
    again = run_federated_experiment(spec, out=lambda _: None)
    assert again["accuracy"] == payload["accuracy"]
    ledger = PrivacyLedger.read_only(spec.journal)
    assert len(ledger.charges()) == 1
    ledger.close()


def test_private_run_refused_by_a_small_budget_runs_nothing(
    raw: dict[str, Any], tmp_path: Path
) -> None:
    from raydp_hpo.errors import BudgetExhaustedError

    spec = parse_federated(_private(raw, tmp_path, budget={"epsilon": 0.5, "delta": 1e-5}))
    with pytest.raises(BudgetExhaustedError):
        run_federated_experiment(spec, out=lambda _: None)
    assert not (spec.run_dir / RESULT_FILE).exists()
    assert not (spec.run_dir / "checkpoints").exists()
