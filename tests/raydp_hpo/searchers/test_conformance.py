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

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import StoppingDistribution, mechanism_from_dict
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.coverage import is_covered
from raydp_hpo.searchers import (
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
from raydp_hpo.searchers.base import plan_epsilon
from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON, privacy_from_config, trial_mechanism
from tests.raydp_hpo.searchers._results import complete

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
COMMON: dict[str, Any] = dict(metric="acc", mode="max", dataset_size=N, budget=BUDGET,
                              seed=7, ledger_name="L", namespace="ns", experiment="exp")
RANDOM_SPACE = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
GRID_SPACE = {"lr": tune.choice([0.01, 0.1, 1.0]), "epochs": 1, "sample_rate": 0.01}

FACTORIES: dict[str, Callable[..., DPSearcher]] = {
    "random_stopping": lambda **kw: RandomStoppingSearch(RANDOM_SPACE, mean=3, **{**COMMON, **kw}),
    "random_stopping_tnb": lambda **kw: RandomStoppingSearch(
        RANDOM_SPACE, distribution=StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL,
        mean=3, shape=0.5, **{**COMMON, **kw}),
    "subsampled_transfer": lambda **kw: SubsampledTransferSearch(
        RANDOM_SPACE, subsample_rate=0.2, mean=3, **{**COMMON, **kw}),
    "svt_threshold": lambda **kw: SVTThresholdSearch(
        GRID_SPACE, num_partitions=20, round_epsilon=0.05, max_rounds=10, **{**COMMON, **kw}),
    "linear_scaling": lambda **kw: LinearScalingSearch(  # the default: refined DP-SGD
        {"momentum": 0.9, "sample_rate": 0.1, "epochs": 1}, runs_per_sweep=2,
        **{**COMMON, **kw}),
    "linear_scaling_paper": lambda **kw: LinearScalingSearch(
        {"momentum": 0.9}, preset="paper", runs_per_sweep=2, **{**COMMON, **kw}),
    "one_shot_random": lambda **kw: OneShotRandomSearch(RANDOM_SPACE, **{**COMMON, **kw}),
    "grid_composed": lambda **kw: GridSearchComposed(GRID_SPACE, **{**COMMON, **kw}),
}
#: algorithms whose tuning trials' scores are privatised by the searcher itself (not Laplace)
SELF_PRIVATISED = {SVTThresholdSearch}
#: algorithms without any selection on a trial score
NO_SELECTION = {OneShotRandomSearch}


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
        complete(searcher, tid, {"acc": metric_of(cfg)})
        i += 1
    raise AssertionError("searcher never finished")


@pytest.fixture(params=sorted(FACTORIES))
def make(request: pytest.FixtureRequest) -> Callable[..., DPSearcher]:
    return FACTORIES[request.param]


def test_is_ray_searcher(make: Callable[..., DPSearcher]) -> None:
    assert isinstance(make(), Searcher)


def test_lifecycle_finishes_with_release(make: Callable[..., DPSearcher]) -> None:
    s = make()
    ids, configs = drive(s)
    rel = s.release()
    assert s.suggest("after") == Searcher.FINISHED
    if rel.selected:
        assert "raydp" not in rel.hyperparameters
        assert rel.trial_id in ids
        assert rel.trial_id is not None
    for cfg in configs:
        r = cfg["raydp"].to_dict()
        assert set(r) == {"ledger", "namespace", "experiment", "charge", "charge_id",
                          "covered_by", "base", "data_view", "nonprivate", "phase",
                          "score_epsilon", "score_noise", "score_delta", "dataset_size",
                          "validation_size", "trial_index", "plan_receipt"}
        assert r["plan_receipt"] is None  # set by DPTuner once the plan is admitted
        assert r["dataset_size"] == s.dataset_size  # declared public size, not the data's
        assert r["ledger"] == "L" and r["namespace"] == "ns" and r["experiment"] == "exp"
        assert r["charge_id"].startswith("exp/")
        assert r["phase"] in ("tune", "final")
        plan = s.privacy_plan()
        if plan.per_trial_charges:
            assert r["charge"] is True and r["covered_by"] is None
        else:
            assert r["charge"] is False and r["covered_by"] == "exp/plan"


def test_plan_within_budget(make: Callable[..., DPSearcher]) -> None:
    s = make()
    plan = s.privacy_plan()
    assert plan.paper and plan.algorithm and plan.description
    assert plan.expected_gradient_evaluations > 0
    mech = plan.mechanism if plan.mechanism is not None else s.composed_mechanism()  # type: ignore[attr-defined]
    assert plan_epsilon(mech, BUDGET.delta) <= BUDGET.epsilon
    assert s.privacy_plan() is plan  # pure, repeatable


def expected_score_epsilon(s: DPSearcher, phase: str) -> float | None:
    """ε_s a trial of ``phase`` must carry: the searcher's for trials whose score feeds a
    selection, None for final runs, SVT candidates (AboveThreshold privatises u_s) and the
    one-shot baseline."""
    if phase == "final" or type(s) in SELF_PRIVATISED | NO_SELECTION:
        return None
    return s.score_epsilon


@pytest.mark.parametrize("score_epsilon", [0.5, None])
def test_score_epsilon_in_raydp_blocks_per_phase(
    make: Callable[..., DPSearcher], score_epsilon: float | None
) -> None:
    s = make(score_epsilon=score_epsilon)
    assert s.score_epsilon == score_epsilon
    _, configs = drive(s)
    phases = set()
    for cfg in configs:
        r = cfg["raydp"].to_dict()
        phases.add(r["phase"])
        assert r["score_epsilon"] == expected_score_epsilon(s, r["phase"]), r["phase"]
    assert phases  # every searcher issued trials


@pytest.mark.parametrize("score_epsilon", [DEFAULT_SCORE_EPSILON, None])
def test_private_trials_are_covered_by_base(
    make: Callable[..., DPSearcher], score_epsilon: float | None
) -> None:
    """What the trainable declares — trial_mechanism(training, block's score_epsilon) — is
    covered by the block's base, in every phase that uses covered_by."""
    s = make(score_epsilon=score_epsilon)
    _, configs = drive(s)
    checked = 0
    for cfg in configs:
        r = cfg["raydp"].to_dict()
        if r["nonprivate"] or r["base"] is None:
            continue
        public = {k: v for k, v in cfg.items() if k != "raydp"}
        declared = trial_mechanism(privacy_from_config(public, N).mechanism(), r["score_epsilon"])
        base = mechanism_from_dict(r["base"])
        assert is_covered(declared, base)
        if r["covered_by"] is not None:
            checked += 1
        if r["score_epsilon"] is not None and r["covered_by"] is not None:
            # the base really contains the score part: training alone + a larger score
            # release would not be covered
            bigger = trial_mechanism(privacy_from_config(public, N).mechanism(),
                                     2 * r["score_epsilon"])
            assert not is_covered(bigger, base)
    if not s.privacy_plan().per_trial_charges:
        assert checked > 0 or isinstance(s, SVTThresholdSearch)


def test_gaussian_score_blocks_and_coverage(make: Callable[..., DPSearcher]) -> None:
    """With score_noise='gaussian' every block whose score feeds a selection carries the
    noise kind and δ_s; what such a trial declares — training + Gaussian(σ_s), σ_s the
    analytic-Gaussian σ for (ε_s, δ_s) — is covered by its base, and a Laplace score at the
    same ε_s is not (the base really holds the Gaussian part)."""
    from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian
    from raydp_hpo.accounting.mechanisms import Composition, Gaussian

    s = make(score_epsilon=0.5, score_noise="gaussian", score_delta=1e-6)
    sigma_s = calibrate_analytic_gaussian(0.5, 1e-6)
    _, configs = drive(s)
    scored = 0
    for cfg in configs:
        block = cfg["raydp"]
        if block.score_epsilon is None:
            assert (block.score_noise, block.score_delta) == ("laplace", None)
            continue
        scored += 1
        assert (block.score_noise, block.score_delta) == ("gaussian", 1e-6)
        training = privacy_from_config({k: v for k, v in cfg.items() if k != "raydp"},
                                       N).mechanism()
        declared = trial_mechanism(training, block.score_release)
        assert declared == Composition((training, Gaussian(sigma_s)))
        if block.base is not None and block.covered_by is not None:
            base = mechanism_from_dict(block.base)
            assert is_covered(declared, base)
            assert not is_covered(trial_mechanism(training, 0.5), base)
    if type(s) not in SELF_PRIVATISED | NO_SELECTION:
        assert scored > 0


def test_per_trial_charges_include_the_score(make: Callable[..., DPSearcher]) -> None:
    """Trials that charge themselves declare trial_mechanism(...); the searcher's own view of
    that charge (composed_mechanism) must agree trial by trial."""
    s = make()
    if not s.privacy_plan().per_trial_charges:
        return
    _, configs = drive(s)
    declared = [
        trial_mechanism(
            privacy_from_config({k: v for k, v in c.items() if k != "raydp"}, N).mechanism(),
            c["raydp"].score_epsilon,
        )
        for c in configs
    ]
    assert tuple(declared) == s.composed_mechanism().mechanisms  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [0, 0.0, -1, -1.0, math.nan, math.inf, "0.1", True])
def test_invalid_score_epsilon_is_refused(make: Callable[..., DPSearcher], bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="score_epsilon"):
        make(score_epsilon=bad)


def test_restore_refuses_other_score_epsilon(
    make: Callable[..., DPSearcher], tmp_path: Any
) -> None:
    s = make()
    path = os.path.join(tmp_path, "s.pkl")
    s.save(path)
    other = make(score_epsilon=0.5)
    with pytest.raises(InvalidParameterError, match="score_epsilon|privacy plan"):
        other.restore(path)


def test_reproducible_with_seed(make: Callable[..., DPSearcher]) -> None:
    a, b = make(), make()
    assert drive(a)[1] == drive(b)[1]


#: searchers with no secret draw of their own (a fixed grid; the noise is in the trials)
NO_SECRET_DRAWS = {GridSearchComposed}


def test_default_secrets_come_from_os_entropy(make: Callable[..., DPSearcher]) -> None:
    """No default seed: two searchers built from identical public inputs without a seed draw
    different secrets (K, hyperparameters, subsample / partition seeds, SVT noise), so none is
    reproducible from public inputs. With the old default seed=0 they were identical."""
    runs = [drive(make(seed=None))[1] for _ in range(4)]
    if type(make()) in NO_SECRET_DRAWS:
        return
    assert any(run != runs[0] for run in runs[1:])


def test_seed_in_the_space_is_refused(make: Callable[..., DPSearcher]) -> None:
    """A trial seed in the (public, logged) space would make the DP noise public."""
    cls = type(make())
    with pytest.raises(ValueError, match="secret_seed"):
        cls({**RANDOM_SPACE, "seed": 0}, **COMMON)


def test_make_searcher_has_no_default_seed() -> None:
    import inspect

    from raydp_hpo.searchers.base import DPSearcher as Base

    assert inspect.signature(Base.__init__).parameters["seed"].default is None
    common = {k: v for k, v in COMMON.items() if k != "seed"}
    ks = set()
    for _ in range(30):
        s = make_searcher("random_stopping", param_space=RANDOM_SPACE, mean=3, **common)
        ks.add(s._k)  # the secret number of trials
    assert len(ks) > 1


def test_save_restore_mid_search(make: Callable[..., DPSearcher], tmp_path: Any) -> None:
    s = make()
    first = s.suggest("t0")
    assert isinstance(first, dict)
    complete(s, "t0", {"acc": metric_of(first)})
    path = os.path.join(tmp_path, "s.pkl")
    s.save(path)
    restored = make()
    restored.restore(path)
    rest_a = [s.suggest(f"t{i}") for i in range(1, 3)]
    rest_b = [restored.suggest(f"t{i}") for i in range(1, 3)]
    assert rest_a == rest_b
    pickle.loads(pickle.dumps(restored.get_state()))


def test_failed_trial_is_not_retried(make: Callable[..., DPSearcher]) -> None:
    s = make()
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict)
    s.on_trial_complete("t0", None, error=True)
    nxt = s.suggest("t1")
    assert nxt == Searcher.FINISHED or (isinstance(nxt, dict) and nxt["raydp"].charge_id == "exp/t1")


def test_reserved_key_in_space_is_refused(make: Callable[..., DPSearcher]) -> None:
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
        SearchAlgorithm.LINEAR_SCALING: dict(param_space={"sample_rate": 0.1, "epochs": 1},
                                             runs_per_sweep=2),
        SearchAlgorithm.ONE_SHOT_RANDOM: dict(param_space=RANDOM_SPACE),
        SearchAlgorithm.GRID_COMPOSED: dict(param_space=GRID_SPACE),
    }
    for alg in SearchAlgorithm:
        s = make_searcher(alg.value, **kwargs[alg], **COMMON)
        assert s.privacy_plan().algorithm == alg.value
    with pytest.raises(ValueError, match="unknown search algorithm"):
        make_searcher("bayes", **COMMON)
    with pytest.raises(InvalidParameterError, match="'noise_multiplyer'"):
        make_searcher(SearchAlgorithm.ONE_SHOT_RANDOM, param_space=RANDOM_SPACE,
                      noise_multiplyer=1.0, **COMMON)


#: a constant spelled as a choice of one value, as the CLI passes a model's kwargs
ONE_KWARGS = tune.choice([{"hidden": [8]}])
WITH_KWARGS: dict[str, Callable[[], DPSearcher]] = {
    "random_stopping": lambda: RandomStoppingSearch(
        {**RANDOM_SPACE, "model_kwargs": ONE_KWARGS}, mean=3, **COMMON),
    "subsampled_transfer": lambda: SubsampledTransferSearch(
        {**RANDOM_SPACE, "model_kwargs": ONE_KWARGS}, subsample_rate=0.2, mean=3, **COMMON),
    "svt_threshold": lambda: SVTThresholdSearch(
        {**GRID_SPACE, "model_kwargs": ONE_KWARGS}, num_partitions=20, round_epsilon=0.05,
        max_rounds=10, **COMMON),
    "linear_scaling": lambda: LinearScalingSearch(
        {"momentum": 0.9, "sample_rate": 0.1, "epochs": 1, "model_kwargs": ONE_KWARGS},
        runs_per_sweep=2, **COMMON),
    "linear_scaling_paper": lambda: LinearScalingSearch(
        {"momentum": 0.9, "model_kwargs": ONE_KWARGS}, preset="paper", runs_per_sweep=2,
        **COMMON),
    "one_shot_random": lambda: OneShotRandomSearch(
        {**RANDOM_SPACE, "model_kwargs": ONE_KWARGS}, **COMMON),
    "grid_composed": lambda: GridSearchComposed(
        {**GRID_SPACE, "model_kwargs": ONE_KWARGS}, **COMMON),
}


@pytest.mark.parametrize("name", sorted(WITH_KWARGS))
def test_a_constant_given_as_a_choice_of_one_reaches_trials_as_its_value(name: str) -> None:
    """Every trial config carries the constant's one value, never the search domain: the CLI
    passes a model's kwargs as ``tune.choice([{...}])``, and linear scaling once forwarded
    the Categorical itself, which failed every trial of ``raydp-hpo run`` with a model's
    kwargs (found by the defaults study's CLI check)."""
    _, configs = drive(WITH_KWARGS[name]())
    assert configs
    for cfg in configs:
        assert cfg["model_kwargs"] == {"hidden": [8]}, (name, cfg["model_kwargs"])
