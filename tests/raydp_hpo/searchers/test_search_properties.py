"""Every searcher takes its space through Tune's ``set_search_properties`` (``DPTuner``'s way)
and is told the ledger name, namespace and experiment there: same plan, same suggestions."""

from __future__ import annotations

from typing import Any

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.searchers import SearchAlgorithm, make_searcher

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
RANDOM_SPACE = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
GRID_SPACE = {"lr": tune.choice([0.01, 0.1, 1.0]), "epochs": 1, "sample_rate": 0.01}
CASES: dict[SearchAlgorithm, tuple[dict[str, Any], dict[str, Any]]] = {
    SearchAlgorithm.RANDOM_STOPPING: (RANDOM_SPACE, {"mean": 3}),
    SearchAlgorithm.SUBSAMPLED_TRANSFER: (RANDOM_SPACE, {"subsample_rate": 0.2, "mean": 3}),
    SearchAlgorithm.SVT_THRESHOLD: (GRID_SPACE, {"num_partitions": 20, "round_epsilon": 0.05,
                                                 "max_rounds": 10}),
    SearchAlgorithm.LINEAR_SCALING: ({"momentum": 0.9, "sample_rate": 0.1, "epochs": 1},
                                     {"runs_per_sweep": 2}),
    SearchAlgorithm.ONE_SHOT_RANDOM: (RANDOM_SPACE, {}),
    SearchAlgorithm.GRID_COMPOSED: (GRID_SPACE, {}),
}
TUNER = {"ledger_name": "ledger-x", "namespace": "ns-x", "experiment": "exp-x"}


@pytest.mark.parametrize("algorithm", list(SearchAlgorithm), ids=lambda a: a.value)
def test_space_through_set_search_properties_is_the_same_search(algorithm) -> None:
    space, kwargs = CASES[algorithm]
    eager = make_searcher(algorithm, param_space=space, metric="acc", mode="max",
                          dataset_size=N, budget=BUDGET, seed=7, **kwargs, **TUNER)
    deferred = make_searcher(algorithm, param_space=None, metric="acc", **kwargs)
    assert not deferred.has_space
    # Tune's own spec keys (stop, num_samples, ...) are ignored; the tuner's are used
    assert deferred.set_search_properties("acc", "max", space, dataset_size=N, budget=BUDGET,
                                          seed=7, stop=None, num_samples=-1, **TUNER)
    assert deferred.privacy_plan() == eager.privacy_plan()
    assert deferred.plan_charge_id == "exp-x/plan"
    first, second = eager.suggest("t1"), deferred.suggest("t1")
    assert first == second  # same seed, same draws, same trial settings (ledger and all)
    # the space is given once: another one is refused, as by Tune's searchers
    assert deferred.set_search_properties("acc", "max", space) is False


def test_the_tuner_assigns_the_ledger_name_to_a_constructed_searcher() -> None:
    searcher = make_searcher("one_shot_random", param_space=RANDOM_SPACE, metric="acc",
                             dataset_size=N, budget=BUDGET, ledger_name="users-choice")
    plan = searcher.privacy_plan()
    assert searcher.set_search_properties(None, None, {}, **TUNER)
    assert searcher.privacy_plan() is plan  # naming decides no part of the plan
    settings = searcher.suggest("t1")["raydp"]
    assert (settings.ledger, settings.namespace, settings.experiment) == (
        "ledger-x", "ns-x", "exp-x")
    assert settings.covered_by == "exp-x/plan"
    assert searcher.set_search_properties("loss", None, {}) is False  # another metric
    assert searcher.set_search_properties(None, "min", {}) is False  # another mode


def test_constructor_arguments_win_over_the_tuners_defaults() -> None:
    searcher = make_searcher("one_shot_random", param_space=None, metric="acc",
                             dataset_size=N, budget=BUDGET)
    assert searcher.set_search_properties("acc", "max", RANDOM_SPACE, dataset_size=5,
                                          budget=PrivacyBudget(100.0, 1e-5))
    assert searcher.dataset_size == N and searcher.budget == BUDGET


@pytest.mark.parametrize(
    ("algorithm", "attribute"),
    [(SearchAlgorithm.SUBSAMPLED_TRANSFER, "_subsample_seed"),
     (SearchAlgorithm.SVT_THRESHOLD, "_partition_seed")],
    ids=lambda a: getattr(a, "value", a),
)
def test_data_view_seeds_carry_128_secret_bits(algorithm, attribute) -> None:
    """The subsample's and partitions' seeds are drawn with 128 bits from the secret stream
    (a 31-bit seed could be enumerated); the same secret seed gives the same view seed, and
    the trials get it in their data view."""
    space, kwargs = CASES[algorithm]

    def build(seed: int | None) -> Any:
        return make_searcher(algorithm, param_space=space, metric="acc", mode="max",
                             dataset_size=N, budget=BUDGET, seed=seed, **kwargs)

    fresh = [getattr(build(None), attribute) for _ in range(4)]
    assert len(set(fresh)) == 4
    assert max(s.bit_length() for s in fresh) > 120  # P[all four ≤ 120 bits] = 2^-32
    a, b = build(7), build(7)
    assert getattr(a, attribute) == getattr(b, attribute)
    assert a.suggest("t1")["raydp"].data_view["seed"] == getattr(a, attribute)
