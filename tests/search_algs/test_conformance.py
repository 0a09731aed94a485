"""Conformance kit (Optuna-style): every DPSearcher honours the same contract."""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from ray import tune
from ray.tune.search import Searcher

from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.coverage import is_covered
from raydp_hpo.mechanisms import StoppingDistribution, mechanism_from_dict
from raydp_hpo.trial_privacy import privacy_from_config
from search_algs import (
    DPSearcher,
    GridSearchComposed,
    LinearScalingSearch,
    OneShotRandomSearch,
    RandomStoppingSearch,
    SearchAlgorithm,
    SubsampledTransferSearch,
    SVTThresholdSearch,
    make_searcher,
)
from search_algs.base import plan_epsilon

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
COMMON: dict[str, Any] = dict(metric="acc", mode="max", dataset_size=N, budget=BUDGET,
                              seed=7, ledger_name="L", namespace="ns", experiment="exp")
RANDOM_SPACE = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
GRID_SPACE = {"lr": tune.choice([0.01, 0.1, 1.0]), "epochs": 1, "sample_rate": 0.01}

FACTORIES: dict[str, Callable[[], DPSearcher]] = {
    "random_stopping": lambda: RandomStoppingSearch(RANDOM_SPACE, mean=3, **COMMON),
    "random_stopping_tnb": lambda: RandomStoppingSearch(
        RANDOM_SPACE, distribution=StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL,
        mean=3, shape=0.5, **COMMON),
    "subsampled_transfer": lambda: SubsampledTransferSearch(
        RANDOM_SPACE, subsample_rate=0.2, mean=3, **COMMON),
    "svt_threshold": lambda: SVTThresholdSearch(
        GRID_SPACE, num_partitions=20, round_epsilon=0.05, max_rounds=10, **COMMON),
    "linear_scaling": lambda: LinearScalingSearch({"momentum": 0.9}, runs_per_sweep=2, **COMMON),
    "one_shot_random": lambda: OneShotRandomSearch(RANDOM_SPACE, **COMMON),
    "grid_composed": lambda: GridSearchComposed(GRID_SPACE, **COMMON),
}


def metric_of(config: dict[str, Any]) -> float:
    """A synthetic, deterministic accuracy in [0, 1]."""
    lr = float(config.get("lr", 0.1))
    return 1.0 / (1.0 + abs(math.log10(lr) + 1.0))


def drive(searcher: DPSearcher, max_trials: int = 200) -> tuple[list[str], list[dict]]:
    """Run the searcher sequentially to FINISHED; returns the ids and configs issued."""
    ids, configs, i = [], [], 0
    while i < max_trials:
        tid = f"t{i}"
        cfg = searcher.suggest(tid)
        if cfg == Searcher.FINISHED:
            return ids, configs
        assert cfg is not None, "None while nothing runs would hang Ray Tune"
        ids.append(tid)
        configs.append(cfg)
        searcher.on_trial_complete(tid, {"acc": metric_of(cfg)})
        i += 1
    raise AssertionError("searcher never finished")


@pytest.fixture(params=sorted(FACTORIES))
def make(request: pytest.FixtureRequest) -> Callable[[], DPSearcher]:
    return FACTORIES[request.param]


def test_is_ray_searcher(make: Callable[[], DPSearcher]) -> None:
    assert isinstance(make(), Searcher)


def test_lifecycle_finishes_with_release(make: Callable[[], DPSearcher]) -> None:
    s = make()
    ids, configs = drive(s)
    rel = s.release()
    assert s.suggest("after") == Searcher.FINISHED
    if rel.selected:
        assert "raydp" not in rel.hyperparameters
        assert rel.trial_id in ids
        assert rel.trial_id is not None
    for cfg in configs:
        r = cfg["raydp"]
        assert set(r) == {"ledger", "namespace", "experiment", "charge", "charge_id",
                          "covered_by", "base", "data_view", "nonprivate", "phase"}
        assert r["ledger"] == "L" and r["namespace"] == "ns" and r["experiment"] == "exp"
        assert r["charge_id"].startswith("exp/")
        assert r["phase"] in ("tune", "final")
        plan = s.privacy_plan()
        if plan.per_trial_charges:
            assert r["charge"] is True and r["covered_by"] is None
        else:
            assert r["charge"] is False and r["covered_by"] == "exp/plan"


def test_plan_within_budget(make: Callable[[], DPSearcher]) -> None:
    s = make()
    plan = s.privacy_plan()
    assert plan.paper and plan.algorithm and plan.description
    assert plan.expected_gradient_evaluations > 0
    mech = plan.mechanism if plan.mechanism is not None else s.composed_mechanism()  # type: ignore[attr-defined]
    assert plan_epsilon(mech, BUDGET.delta) <= BUDGET.epsilon
    assert s.privacy_plan() is plan  # pure, repeatable


def test_private_trials_are_covered_by_base(make: Callable[[], DPSearcher]) -> None:
    s = make()
    _, configs = drive(s)
    for cfg in configs:
        r = cfg["raydp"]
        if r["nonprivate"] or r["base"] is None:
            continue
        public = {k: v for k, v in cfg.items() if k != "raydp"}
        mech = privacy_from_config(public, N).mechanism()
        assert is_covered(mech, mechanism_from_dict(r["base"]))


def test_reproducible_with_seed(make: Callable[[], DPSearcher]) -> None:
    a, b = make(), make()
    assert drive(a)[1] == drive(b)[1]


def test_save_restore_mid_search(make: Callable[[], DPSearcher], tmp_path: Any) -> None:
    s = make()
    first = s.suggest("t0")
    assert isinstance(first, dict)
    s.on_trial_complete("t0", {"acc": metric_of(first)})
    path = os.path.join(tmp_path, "s.pkl")
    s.save(path)
    restored = make()
    restored.restore(path)
    rest_a = [s.suggest(f"t{i}") for i in range(1, 3)]
    rest_b = [restored.suggest(f"t{i}") for i in range(1, 3)]
    assert rest_a == rest_b
    pickle.loads(pickle.dumps(restored.get_state()))


def test_failed_trial_is_not_retried(make: Callable[[], DPSearcher]) -> None:
    s = make()
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict)
    s.on_trial_complete("t0", None, error=True)
    nxt = s.suggest("t1")
    assert nxt == Searcher.FINISHED or (isinstance(nxt, dict) and nxt["raydp"]["charge_id"] == "exp/t1")


def test_reserved_key_in_space_is_refused(make: Callable[[], DPSearcher]) -> None:
    s = make()
    cls = type(s)
    with pytest.raises(ValueError, match="reserved"):
        cls({**RANDOM_SPACE, "raydp": 1}, **COMMON)


def test_factory_builds_every_algorithm() -> None:
    kwargs: dict[SearchAlgorithm, dict[str, Any]] = {
        SearchAlgorithm.RANDOM_STOPPING: dict(param_space=RANDOM_SPACE, mean=2),
        SearchAlgorithm.SUBSAMPLED_TRANSFER: dict(param_space=RANDOM_SPACE, mean=2),
        SearchAlgorithm.SVT_THRESHOLD: dict(param_space=GRID_SPACE, max_rounds=5,
                                            num_partitions=10),
        SearchAlgorithm.LINEAR_SCALING: dict(param_space={}, runs_per_sweep=2),
        SearchAlgorithm.ONE_SHOT_RANDOM: dict(param_space=RANDOM_SPACE),
        SearchAlgorithm.GRID_COMPOSED: dict(param_space=GRID_SPACE),
    }
    for alg in SearchAlgorithm:
        s = make_searcher(alg.value, **kwargs[alg], **COMMON)
        assert s.privacy_plan().algorithm == alg.value
    with pytest.raises(ValueError, match="unknown search algorithm"):
        make_searcher("bayes", **COMMON)
    with pytest.raises(TypeError):
        make_searcher(SearchAlgorithm.ONE_SHOT_RANDOM, param_space=RANDOM_SPACE,
                      noise_multiplyer=1.0, **COMMON)
