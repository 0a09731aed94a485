"""``search="auto"`` end to end: from Python and from an experiment file, on a real Tuner,
ledger and DP trainable, the chosen searcher runs as if named, and the certificate and
``public/release.json`` name what auto chose and why. The table is the test's own (a copy of
the rule's format with every row written out: ``tests/raydp_hpo/searchers/_auto_tables.py``),
so these tests do not depend on the study's measured table, which the lead replaces."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import ConfigError, InvalidParameterError
from raydp_hpo.searchers import auto
from raydp_hpo.trainables.data import load_mnist1d, split
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.searchers import _auto_tables as T

ROOT = Path(__file__).resolve().parents[3]
#: two learning rates, one epoch: a finite grid of two configurations
SPACE = {"lr": tune.grid_search([0.1, 0.5]), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}


@pytest.fixture(scope="module")
def data() -> Any:
    return split(load_mnist1d(num_samples=1200, seed=3), 0.2, 0.2, seed=0)


@pytest.fixture
def test_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's table in place of the packaged one (choices happen in the driver)."""
    path = T.write(tmp_path / "auto_table.json")
    monkeypatch.setattr(auto, "auto_table_path", lambda: path)
    return path


def _check_release(exp_dir: Path, setting: str, searcher: str, band: float) -> dict[str, Any]:
    public = json.loads((exp_dir / "public" / "release.json").read_text())
    cert = json.loads((exp_dir / "public" / "certificate.json").read_text())
    choice = public["auto_search"]
    assert cert["auto_search"] == choice == public["certificate"]["auto_search"]
    assert choice["setting"] == setting and choice["searcher"] == searcher
    assert choice["table_row"] == {"epsilon_band": band, "compute_band": "inf",
                                   "space_class": "finite_grid"}
    assert choice["S"] == T.score(band, float("inf"))
    assert choice["outside_measured_range"] is False and choice["table"] == "auto_table.json"
    assert "2 configuration(s)" in choice["reason"]
    assert cert["algorithm"] == searcher  # the chosen searcher's own plan was charged
    return choice


@pytest.mark.ray
def test_auto_from_python_runs_the_chosen_searcher_and_says_why(
        ray_session: Any, data: Any, tmp_path: Path, test_table: Path) -> None:
    lines: list[str] = []
    tuner = DPTuner(None, param_space=SPACE, search="auto", search_kwargs={"max_trials": 2},
                    budget=PrivacyBudget(3.0, 1e-5), data=data, storage_path=tmp_path,
                    experiment=f"auto-{uuid.uuid4().hex[:6]}", fresh_budget=True,
                    progress=lines.append)
    assert any("search='auto' chose grid4" in line for line in lines)
    result = tuner.fit()
    # the table's row (3, inf, finite_grid) is grid4 = grid_composed: the user's 2-point
    # grid, each trial its own charge, exactly as search="grid_composed" runs it
    assert len(result.private_trials) == 2
    assert len(result.certificate.charges) == 2 and result.certificate.within_budget
    assert result.hyperparameters is not None and result.hyperparameters["lr"] in (0.1, 0.5)
    choice = _check_release(Path(result.experiment_path), "grid4", "grid_composed", 3.0)
    assert choice["max_trials"] == 2
    assert result.certificate.auto_search == choice
    assert "auto search   chose grid4 = grid_composed" in result.certificate.format()
    # the restore file keeps the choice (a resume runs the same searcher, not a new choice)
    import pickle

    saved = pickle.loads((Path(result.experiment_path) / "dptuner.pkl").read_bytes())
    assert isinstance(saved["search"], auto.AutoChoice) and saved["args"]["search_kwargs"] == {}
    restored = DPTuner.restore(result.experiment_path, data=data)  # builds, runs nothing
    assert restored._auto_choice == tuner._auto_choice
    assert restored._search.value == "grid_composed" and restored._search_kwargs == {}


@pytest.mark.ray
@pytest.mark.slow
def test_auto_from_an_experiment_file(ray_session: Any, tmp_path: Path,
                                      test_table: Path) -> None:
    from raydp_hpo.cli.experiment import format_summary, parse_experiment, run_experiment

    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_small.yaml").read_text())
    raw.update(experiment=f"auto-file-{uuid.uuid4().hex[:6]}", storage_path=str(tmp_path),
               search={"algorithm": "auto", "settings": {"max_trials": 2}},
               budget={"epsilon": 8.0, "delta": 1e-5})
    raw["data"]["size"] = 1200
    raw["space"] = {"lr": {"choice": [0.1, 0.5]}, "batch_size": 64, "epochs": 1,
                    "noise_multiplier": 1.0, "max_grad_norm": 1.0, "optimizer": "sgd"}
    lines: list[str] = []
    outcome = run_experiment(parse_experiment(raw), out=lines.append)
    # ε = 8, finite grid, max_trials 2: the (8, inf) row is SVT (21 expected trials), over
    # the limit; the largest band that fits is 50, grid4 — the user's grid of 2 trials
    public = json.loads((outcome.run_dir / "public" / "release.json").read_text())
    # the run's dataset ledger actor (ε = 8, named from the data) must not outlive this test
    # in the shared Ray session: a later search on the same data asks for another budget
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(public["certificate"]["dataset_ledger"]["name"],
                               namespace="raydp_hpo"))
    assert public["auto_search"]["setting"] == "grid4"
    assert public["auto_search"]["table_row"]["compute_band"] == 50.0
    assert public["certificate"]["algorithm"] == "grid_composed"
    assert any("search='auto' chose grid4" in line for line in lines)
    assert "auto search   chose grid4" in format_summary(outcome)


def test_unknown_algorithm_spelling_is_refused(data: Any) -> None:
    with pytest.raises(InvalidParameterError, match="search='atuo' is neither.*or 'auto'"):
        DPTuner(None, param_space=SPACE, search="atuo", budget=PrivacyBudget(3.0, 1e-5),
                data=data)
    from raydp_hpo.cli.experiment import parse_experiment

    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_small.yaml").read_text())
    raw["search"] = {"algorithm": "atuo"}
    with pytest.raises(ConfigError, match="did you mean 'auto'"):
        parse_experiment(raw)
    raw["search"] = {"algorithm": "auto", "preset": "tnb20"}
    with pytest.raises(ConfigError, match="auto chooses the searcher"):
        parse_experiment(raw)


def test_bad_auto_settings_are_refused_before_anything_runs(data: Any, test_table: Path
                                                            ) -> None:
    budget = PrivacyBudget(3.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="positive number, got -1"):
        DPTuner(None, param_space=SPACE, search="auto", budget=budget, data=data,
                search_kwargs={"max_gradient_evaluations": -1})
    with pytest.raises(InvalidParameterError, match="'mean'.*name the searcher"):
        DPTuner(None, param_space=SPACE, search="auto", budget=budget, data=data,
                search_kwargs={"mean": 3})
    # one run is 10 steps of 72 records (0.1 · 720): a limit of 1.5 runs fits no row
    with pytest.raises(InvalidParameterError, match="L = 1.5 one-shot runs"):
        DPTuner(None, param_space=SPACE, search="auto", budget=budget, data=data,
                search_kwargs={"max_gradient_evaluations": 1.5 * 720})


def test_auto_in_an_experiment_file_is_checked_by_the_dry_run(
        tmp_path: Path, test_table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main

    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_small.yaml").read_text())
    raw.update(storage_path=str(tmp_path), search={"algorithm": "auto",
                                                   "settings": {"max_trials": 1}})
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_BAD_INPUT  # no row within 1 trial
    assert "no measured setting fits max_trials = 1" in capsys.readouterr().err
    raw["search"]["settings"] = {"max_trials": 12}
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_OK
    # the example's space tunes lr and batch_size: 'other'; ε = 8, ≤ 12 trials: rs_geom_k10
    assert "search 'auto' chooses rs_geom_k10: ε = 8 uses the ε = 8 rows; the space is other" \
        in capsys.readouterr().out


@pytest.mark.slow
def test_a_file_without_search_runs_the_package_default_on_the_packaged_table(
        ray_session: Any, tmp_path: Path) -> None:
    """What a newcomer's file gets: no ``search:`` at all, a model with kwargs, the lr the
    one tuned key; auto (the package default, L = 25) picks from the shipped table and every
    trial runs (the CLI's model kwargs once reached linear scaling's trials as a search
    domain and failed each of them)."""
    from raydp_hpo.cli.experiment import parse_experiment, run_experiment

    raw = yaml.safe_load((ROOT / "cluster/examples/mnist1d_small.yaml").read_text())
    del raw["search"]
    raw.update(experiment=f"newcomer-{uuid.uuid4().hex[:6]}", storage_path=str(tmp_path),
               budget={"epsilon": 3.0, "delta": 1e-5})
    raw["data"]["size"] = 1200
    raw["space"] = {"lr": {"loguniform": [0.01, 2.0]}, "sample_rate": 0.1, "epochs": 1,
                    "max_grad_norm": 1.0, "optimizer": "sgd"}
    outcome = run_experiment(parse_experiment(raw), out=lambda line: None)
    public = json.loads((outcome.run_dir / "public" / "release.json").read_text())
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(public["certificate"]["dataset_ledger"]["name"],
                               namespace="raydp_hpo"))
    chosen = public["auto_search"]
    assert chosen["table_row"]["space_class"] == "lr_only"
    assert chosen["table_row"]["compute_band"] == 25.0 and chosen["compute_limit"] == 25.0
    assert public["certificate"]["algorithm"] == chosen["searcher"]
    assert public["hyperparameters"] is not None, public
    assert public["certificate"]["epsilon"]["best"] <= 3.0
