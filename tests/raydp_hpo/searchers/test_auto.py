"""``search="auto"`` (no Ray): the choice is reproducible from the table — each input picks
the row the pre-registered rule (defaults study, section 7.3) names —, the space classes, the
compute and trial limits, the out-of-range flag, and a malformed table or bad input refused
with a clear error."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from ray import tune

from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers import SearchAlgorithm, check_search_settings
from raydp_hpo.searchers.auto import (
    DEFAULT_COMPUTE_LIMIT,
    AutoTableError,
    SpaceClass,
    auto_table_path,
    choose_auto,
    epsilon_band,
    load_auto_table,
    one_run_gradient_evaluations,
    resolve_auto,
    space_class,
)
from tests.raydp_hpo.searchers import _auto_tables as T

BASE = {"epochs": 15, "sample_rate": 0.1, "max_grad_norm": 1.0, "model": "mlp",
        "model_kwargs": tune.choice([{"hidden": [64]}]), "optimizer": "sgd"}
LR_ONLY = {**BASE, "lr": tune.loguniform(1e-3, 10.0)}
GRID2 = {**BASE, "lr": tune.grid_search([0.1, 1.0])}
OTHER = {**BASE, "lr": tune.loguniform(1e-3, 10.0), "momentum": tune.uniform(0.0, 0.9)}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_auto_table(T.write(tmp_path_factory.mktemp("auto") / "auto_table.json"))


@pytest.mark.parametrize("space, expected", [
    (LR_ONLY, SpaceClass.LR_ONLY),
    ({**BASE, "lr": tune.uniform(0.01, 1.0), "batch_size": tune.choice([64])},
     SpaceClass.LR_ONLY),  # a choice of one value is a constant
    (GRID2, SpaceClass.FINITE_GRID),
    ({**BASE, "lr": tune.choice([0.1, 1.0])}, SpaceClass.FINITE_GRID),  # lr alone, finite
    ({**BASE, "lr": tune.choice([0.1, 1.0]), "epochs": tune.grid_search([5, 10])},
     SpaceClass.FINITE_GRID),
    ({**BASE, "lr": 0.1}, SpaceClass.FINITE_GRID),  # nothing tuned: one configuration
    (OTHER, SpaceClass.OTHER),
    ({**BASE, "lr": tune.loguniform(1e-3, 1.0), "epochs": tune.choice([5, 10])},
     SpaceClass.OTHER),  # a second tuned key, even finite
    ({**BASE, "learning_rate": tune.loguniform(1e-3, 1.0)}, SpaceClass.OTHER),  # not 'lr'
])
def test_space_classes(space: dict[str, Any], expected: SpaceClass) -> None:
    assert space_class(space)[0] is expected


def test_epsilon_bands_are_the_log_midpoints() -> None:
    assert math.sqrt(3) == pytest.approx(1.7320508) and math.sqrt(24) == pytest.approx(4.89898)
    assert [epsilon_band(e) for e in (0.1, 1.0, 1.73, 1.7321, 3.0, 4.89, 4.9, 8.0, 50.0)] == \
        [1, 1, 1, 3, 3, 3, 8, 8, 8]


# (ε, space, compute limit L, max_trials) → (setting, ε band, compute band, class, outside)
CASES = [
    (3.0, LR_ONLY, None, None, ("ls_refined", 3.0, math.inf, "lr_only", False)),
    (1.0, LR_ONLY, None, None, ("ls_refined", 1.0, math.inf, "lr_only", False)),
    (1.73, OTHER, None, None, ("rs_tnb2_k20", 1.0, math.inf, "other", False)),
    (1.74, OTHER, None, None, ("rs_tnb2_k20", 3.0, math.inf, "other", False)),
    (4.9, GRID2, None, None, ("svt_k20", 8.0, math.inf, "finite_grid", False)),
    (4.8, GRID2, None, None, ("grid4", 3.0, math.inf, "finite_grid", False)),
    (0.3, OTHER, None, None, ("rs_tnb2_k20", 1.0, math.inf, "other", True)),  # below 0.5
    (0.5, OTHER, None, None, ("rs_tnb2_k20", 1.0, math.inf, "other", False)),
    (16.0, OTHER, None, None, ("rs_tnb2_k20", 8.0, math.inf, "other", False)),
    (20.0, OTHER, None, None, ("rs_tnb2_k20", 8.0, math.inf, "other", True)),  # above 16
    # the largest compute band ≤ L
    (3.0, LR_ONLY, 6.0, None, ("rs_geom_k5", 3.0, 5.0, "lr_only", False)),
    (3.0, LR_ONLY, 10.0, None, ("ls_refined", 3.0, 10.0, "lr_only", False)),
    (3.0, OTHER, 24.9, None, ("rs_geom_k10", 3.0, 10.0, "other", False)),
    (3.0, OTHER, 25.0, None, ("rs_tnb2_k20", 3.0, 25.0, "other", False)),
    (3.0, OTHER, 1e9, None, ("rs_tnb2_k20", 3.0, 50.0, "other", False)),
    # a trial limit: the largest band whose setting's expected trials fit
    (3.0, OTHER, None, 10, ("rs_geom_k10", 3.0, 10.0, "other", False)),
    (3.0, LR_ONLY, None, 5, ("rs_geom_k5", 3.0, 5.0, "lr_only", False)),
    (8.0, GRID2, None, 2, ("grid4", 8.0, 50.0, "finite_grid", False)),  # SVT: 21 trials;
    # a grid search trains exactly the user's grid (2 trials), not the table's 4
    (3.0, LR_ONLY, 50.0, 7, ("ls_refined", 3.0, 50.0, "lr_only", False)),  # both limits
]


@pytest.mark.parametrize("eps, space, limit, trials, expected", CASES)
def test_the_choice_is_the_documented_row(table: Any, eps: float, space: dict[str, Any],
                                          limit: float | None, trials: int | None,
                                          expected: tuple[Any, ...]) -> None:
    setting, band, compute, cls, outside = expected
    c = choose_auto(eps, space, limit, max_trials=trials, table=table, num_classes=10)
    assert (c.setting, c.epsilon_band, c.row.compute_limit, c.space_class.value,
            c.outside_measured_range) == expected
    row = next(r for r in table.rows if (r.epsilon_band, r.compute_limit, r.space_class.value)
               == (band, compute, cls))
    assert c.row == row and c.algorithm is SearchAlgorithm(row.searcher)
    # the searcher's settings are the row's (relative ones resolved), which it accepts
    check_search_settings(c.algorithm, c.settings)
    record = c.to_dict()
    assert record["setting"] == setting and record["S"] == row.score
    assert record["table_row"] == {"epsilon_band": band, "space_class": cls,
                                   "compute_band": "inf" if math.isinf(compute) else compute}
    assert record["outside_measured_range"] is outside
    assert ("OUTSIDE the measured range" in c.reason) is outside
    json.dumps(record)  # JSON-able: it goes into the certificate


def test_relative_settings_resolve_for_the_run(table: Any) -> None:
    c = choose_auto(8.0, GRID2, table=table, num_classes=10)
    assert c.algorithm is SearchAlgorithm.SVT_THRESHOLD
    assert c.settings == {"num_partitions": 20, "round_epsilon": pytest.approx(0.8),
                          "max_rounds": 2, "granularity": 0.2, "u0": pytest.approx(0.1)}
    # no public number of classes: u0 stays the searcher's default
    assert "u0" not in choose_auto(8.0, GRID2, table=table).settings


def test_limit_too_small_names_the_limit_and_the_cheapest_setting(table: Any) -> None:
    with pytest.raises(InvalidParameterError) as err:
        choose_auto(3.0, LR_ONLY, 1.5, table=table)
    msg = str(err.value)
    assert "L = 1.5 one-shot runs" in msg and "rs_geom_k5" in msg and "G = 4.8" in msg
    with pytest.raises(InvalidParameterError, match=r"max_trials = 3.*rs_geom_k5"):
        choose_auto(3.0, LR_ONLY, max_trials=3, table=table)


@pytest.mark.parametrize("kwargs, match", [
    ({"compute_limit": -1.0}, "positive number, got -1"),
    ({"compute_limit": 0}, "positive number, got 0"),
    ({"compute_limit": float("nan")}, "positive number"),
    ({"max_trials": 0}, "max_trials must be an integer >= 1, got max_trials=0"),
    ({"max_trials": 2.5}, "max_trials must be an integer"),
    ({"epsilon": -3.0}, "positive finite ε"),
])
def test_bad_inputs_are_refused(table: Any, kwargs: dict[str, Any], match: str) -> None:
    args = {"epsilon": 3.0, "space": LR_ONLY, "table": table, **kwargs}
    with pytest.raises(InvalidParameterError, match=match):
        choose_auto(**args)


def test_max_gradient_evaluations_in_one_shot_units(table: Any) -> None:
    # one run: T = epochs / q = 150 steps of q·n = 100 records: 15,000 gradient evaluations
    assert one_run_gradient_evaluations(LR_ONLY, 1000) == pytest.approx(15_000)
    # the worst case over the privacy keys' values
    assert one_run_gradient_evaluations({**LR_ONLY, "epochs": tune.choice([5, 30])}, 1000) \
        == pytest.approx(30_000)
    c = resolve_auto(LR_ONLY, 3.0, {"max_gradient_evaluations": 6 * 15_000},
                     dataset_size=1000, table=table)
    assert c.compute_limit == pytest.approx(6.0) and c.setting == "rs_geom_k5"
    assert c.to_dict()["max_gradient_evaluations"] == 90_000
    with pytest.raises(InvalidParameterError, match="declared public training-set size"):
        resolve_auto(LR_ONLY, 3.0, {"max_gradient_evaluations": 1e6}, dataset_size=None,
                     table=table)
    with pytest.raises(InvalidParameterError, match="positive number, got -5"):
        resolve_auto(LR_ONLY, 3.0, {"max_gradient_evaluations": -5}, dataset_size=1000,
                     table=table)


def test_dptuner_and_files_default_to_a_compute_limit_of_25_one_shot_runs(table: Any) -> None:
    """With none of auto's limits given (and for a search left unnamed, which is auto), the
    row is the one of the band 25, not ∞: the package default's compute cap (study rule 7.1).
    ``compute_limit`` sets L itself ("inf": none); the most restrictive limit given applies."""
    other = {**LR_ONLY, "momentum": tune.uniform(0.0, 0.9)}  # class other: TNB20 ≤ 25, RS10 ≤ 10
    default = resolve_auto(other, 8.0, {}, dataset_size=1000, table=table)
    assert DEFAULT_COMPUTE_LIMIT == 25.0
    assert default.compute_limit == 25.0 and default.row.compute_limit == 25.0
    assert default.setting == "rs_tnb2_k20" and "L = 25 one-shot runs" in default.reason
    unlimited = resolve_auto(other, 8.0, {"compute_limit": "inf"}, dataset_size=1000,
                             table=table)
    assert unlimited.row.compute_limit == math.inf
    assert resolve_auto(other, 8.0, {"compute_limit": 10}, dataset_size=1000,
                        table=table).setting == "rs_geom_k10"
    # max_gradient_evaluations alone replaces the default cap; with compute_limit, the smaller
    assert resolve_auto(other, 8.0, {"max_gradient_evaluations": 60 * 15_000},
                        dataset_size=1000, table=table).row.compute_limit == 50.0
    assert resolve_auto(other, 8.0, {"max_gradient_evaluations": 60 * 15_000,
                                     "compute_limit": 10}, dataset_size=1000,
                        table=table).row.compute_limit == 10.0
    # max_trials alone: no compute cap beyond the trials (as before)
    assert resolve_auto(other, 8.0, {"max_trials": 100}, dataset_size=1000,
                        table=table).compute_limit == math.inf
    with pytest.raises(InvalidParameterError, match="compute_limit must be a positive number"):
        resolve_auto(other, 8.0, {"compute_limit": 0}, dataset_size=1000, table=table)


def test_a_search_left_unnamed_is_auto() -> None:
    """The package-wide default search: DPTuner's ``search`` and an experiment file's
    ``search.algorithm`` (and a file with no ``search`` at all) default to ``auto``."""
    import inspect

    from raydp_hpo.cli.config.experiment import ExperimentFile
    from raydp_hpo.cli.config.search import SearchModel
    from raydp_hpo.tune.tuner import DPTuner

    assert inspect.signature(DPTuner).parameters["search"].default == "auto"
    assert SearchModel.model_validate({}).algorithm == "auto"
    assert ExperimentFile.model_fields["search"].default_factory is not None
    assert ExperimentFile.model_fields["search"].default_factory().algorithm == "auto"


def test_auto_takes_only_its_own_settings(table: Any) -> None:
    with pytest.raises(InvalidParameterError,
                       match=r"'max_trial'.*did you mean 'max_trials'.*name the searcher"):
        resolve_auto(LR_ONLY, 3.0, {"max_trial": 4}, dataset_size=1000, table=table)
    with pytest.raises(InvalidParameterError, match="'mean'"):
        resolve_auto(LR_ONLY, 3.0, {"mean": 4}, dataset_size=1000, table=table)


def _broken(doc: dict[str, Any], where: str, value: Any, band: Any = "inf") -> dict[str, Any]:
    rows = [dict(r) for r in doc["rows"]]
    i = next(k for k, r in enumerate(rows) if r["epsilon_band"] == 3.0 and
             r["compute_limit"] == band and r["space_class"] == "lr_only")
    if where == "drop":
        del rows[i]
    elif where == "duplicate":
        rows.append(rows[i])
    else:
        rows[i][where] = value
    return {**doc, "rows": rows}


@pytest.mark.parametrize("mutate, match", [
    (lambda d: _broken(d, "drop", None), "rows are missing, e.g. (3, inf, lr_only)"),
    (lambda d: _broken(d, "duplicate", None), "appears twice"),
    (lambda d: _broken(d, "searcher", "bayes"), "searcher 'bayes' is not one of"),
    (lambda d: _broken(d, "space_class", "tiny"), "space_class 'tiny'"),
    (lambda d: _broken(d, "epsilon_band", 2.0), "epsilon_band 2 is not one of"),
    (lambda d: _broken(d, "settings", {"preset": "refined", "runs_per_swep": 2}),
     "runs_per_swep"),
    (lambda d: _broken(d, "G", 7.0, band=5.0), "G = 7 must be in (0, compute_limit = 5]"),
    (lambda d: _broken(d, "score", "high"), "score must be a finite number"),
    (lambda d: {**d, "rows": [{**r, "searcher": "linear_scaling", "setting": "ls_refined",
                               "settings": {}} if r["space_class"] == "other"
                              and r["setting"] else r for r in d["rows"]]},
     "linear_scaling does not apply to a space of class other"),
    (lambda d: {**d, "version": 2}, "version 2"),
    (lambda d: {**d, "provisional": "maybe"}, "provisional must be true or false"),
    (lambda d: {**d, "compute_bands": [2, 5]}, "end with 'inf'"),
])
def test_a_malformed_table_is_refused(tmp_path: Path, mutate: Any, match: str) -> None:
    path = T.write(tmp_path / "t.json", mutate(T.document()))
    with pytest.raises(AutoTableError, match=re.escape(match)) as err:
        load_auto_table(path)
    assert str(path) in str(err.value) and "--install-auto-table" in str(err.value)


def test_not_json_or_missing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text("{rows: ")
    with pytest.raises(AutoTableError, match="not JSON"):
        load_auto_table(tmp_path / "t.json")
    with pytest.raises(AutoTableError, match="cannot read"):
        load_auto_table(tmp_path / "missing.json")


def test_the_packaged_table_is_valid_and_says_where_it_comes_from() -> None:
    doc = json.loads(auto_table_path().read_text())
    assert doc["generated_by"] == "benchmarks/defaults_study.py report"
    table = load_auto_table()  # checked: every row, every band
    assert len(table.rows) == 3 * len(table.compute_bands) * 3
    assert table.provisional is doc["provisional"]
    # at ε = 3 (the decision point, measured first) an lr-only space gets a setting
    assert choose_auto(3.0, LR_ONLY).row.setting is not None
