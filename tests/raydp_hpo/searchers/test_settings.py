"""Searcher settings (issue #31): unknown settings refused all at once with a guess each,
the space as make_searcher's second argument, named presets, and linear scaling's refined
default with what it derives from the space."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers import (
    PRESETS,
    FitVariable,
    LinearScalingPreset,
    LinearScalingSearch,
    LineFit,
    RandomStoppingPreset,
    RandomStoppingSearch,
    SearchAlgorithm,
    SweepDraw,
    SweepEstimate,
    check_search_settings,
    make_searcher,
)
from raydp_hpo.searchers.base import DPSearcher, searcher_settings
from raydp_hpo.searchers.random_stopping import DEFAULT_DISTRIBUTION, DEFAULT_MEAN, DEFAULT_SHAPE
from raydp_hpo.trial.privacy import Optimizer

BUDGET = PrivacyBudget(3.0, 1e-5)
KW: dict[str, Any] = dict(metric="acc", dataset_size=2819, budget=BUDGET, seed=5)
RANDOM_SPACE = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
#: the benchmark's space (benchmarks/privacy_utility.py, default sizing, MNIST-1D)
DPSGD_SPACE = {"model": "random_kernels1d", "optimizer": "sgd", "epochs": 15,
               "sample_rate": 0.1, "max_grad_norm": 1.0, "lr": tune.loguniform(1e-3, 10.0)}


# ------------------------------------------------------------------------ unknown settings


def _unknown_message(call) -> str:
    with pytest.raises(InvalidParameterError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("how", ["constructor", "make_searcher", "deferred", "check"])
def test_every_unknown_setting_is_named_at_once_with_a_guess(how: str) -> None:
    """Two misspellings and one unknown word: all three in one error, a guess for each
    misspelling, and the algorithm's own settings listed (before: TypeError on the first)."""
    bad = {"shap": 2.0, "meen": 3, "wibble": 1}
    calls = {
        "constructor": lambda: RandomStoppingSearch(RANDOM_SPACE, **bad, **KW),
        "make_searcher": lambda: make_searcher("random_stopping", RANDOM_SPACE, **bad, **KW),
        "deferred": lambda: make_searcher("random_stopping", None, metric="acc", **bad),
        "check": lambda: check_search_settings("random_stopping", bad),
    }
    message = _unknown_message(calls[how])
    assert "unknown random_stopping settings: 'shap' (did you mean 'shape'?), 'meen' (did " \
           "you mean 'mean'?), 'wibble'." in message
    assert "Settings of random_stopping: distribution, mean, shape, preset;" in message
    assert "score_epsilon" in message  # the settings every searcher takes are listed too


def test_valid_settings_come_from_the_constructors_signatures() -> None:
    """No hand-kept list: a subclass's new keyword is valid at once, and each algorithm's
    own settings are exactly its constructor's keywords (plus ``preset`` where it has
    presets)."""
    for algorithm in SearchAlgorithm:
        cls = make_searcher.__globals__["_CLASSES"][algorithm]
        own, common = searcher_settings(cls)
        params = inspect.signature(cls.__init__).parameters
        keywords = {p for p, v in params.items() if v.kind is v.KEYWORD_ONLY}
        assert set(own) - {"preset"} == keywords, algorithm
        assert ("preset" in own) == (algorithm in PRESETS)
        assert {"metric", "budget", "score_epsilon", "dataset_size"} <= set(common)

    class Wider(RandomStoppingSearch):
        def __init__(self, param_space: Any, *, extra: int = 0, **kwargs: Any) -> None:
            self.extra = extra
            super().__init__(param_space, **kwargs)

    assert Wider(RANDOM_SPACE, extra=4, mean=2, **KW).extra == 4
    message = _unknown_message(lambda: Wider(RANDOM_SPACE, extr=4, **KW))
    assert "'extr' (did you mean 'extra'?)" in message and "extra, distribution" in message


def test_dptuner_refuses_unknown_search_kwargs_at_construction() -> None:
    """DPTuner(search_kwargs=...) fails in its constructor, before fit starts Ray."""
    from raydp_hpo.trainables.data import load_digits, split
    from raydp_hpo.tune.tuner import DPTuner

    data = split(load_digits(), val_fraction=0.15, test_fraction=0.15, seed=0)
    message = _unknown_message(lambda: DPTuner(
        None, param_space=dict(RANDOM_SPACE), search="random_stopping", budget=BUDGET,
        data=data, search_kwargs={"mean": 2, "shap": 2}))
    assert "'shap' (did you mean 'shape'?)" in message
    with pytest.raises(InvalidParameterError, match="unknown random_stopping preset 'tnb'"):
        DPTuner(None, param_space=dict(RANDOM_SPACE), search="random_stopping",
                budget=BUDGET, data=data, search_kwargs={"preset": "tnb"})


# ------------------------------------------------------------------------ make_searcher


def test_make_searcher_takes_the_space_as_second_argument() -> None:
    positional = make_searcher("one_shot_random", RANDOM_SPACE, **KW)
    keyword = make_searcher("one_shot_random", param_space=RANDOM_SPACE, **KW)
    assert positional.privacy_plan() == keyword.privacy_plan()
    assert positional.suggest("t0") == keyword.suggest("t0")  # same seed, same draws
    assert not make_searcher("one_shot_random", None, metric="acc").has_space
    with pytest.raises(InvalidParameterError, match="search space twice"):
        make_searcher("one_shot_random", RANDOM_SPACE, param_space=RANDOM_SPACE, **KW)
    with pytest.raises(InvalidParameterError, match="needs the search space"):
        make_searcher("one_shot_random", **KW)


# ------------------------------------------------------------------------ presets


def test_presets_are_enums_listed_per_algorithm() -> None:
    assert {SearchAlgorithm.LINEAR_SCALING: LinearScalingPreset,
                       SearchAlgorithm.RANDOM_STOPPING: RandomStoppingPreset} == PRESETS
    assert [p.value for p in LinearScalingPreset] == ["refined", "paper"]
    assert [p.value for p in RandomStoppingPreset] == ["tnb20"]
    with pytest.raises(InvalidParameterError, match="preset 'refnied'; did you mean 'refined'"):
        make_searcher("linear_scaling", DPSGD_SPACE, preset="refnied", **KW)
    with pytest.raises(InvalidParameterError, match="unknown one_shot_random setting: 'preset'"):
        make_searcher("one_shot_random", RANDOM_SPACE, preset="tnb20", **KW)


def test_the_refined_preset_is_linear_scalings_default() -> None:
    """Every value of the ``refined`` preset is the constructor's default (or, for the sweep
    fractions, what ``None`` means), so the default and the preset are one search."""
    params = inspect.signature(LinearScalingSearch.__init__).parameters
    for key, value in LinearScalingSearch.presets[LinearScalingPreset.REFINED].items():
        default = params[key].default
        if key == "sweep_epsilon_fractions":
            assert default is None and value == (0.1, 0.2)
        else:
            assert getattr(default, "value", default) == value, key
    default = make_searcher("linear_scaling", DPSGD_SPACE, **KW)
    refined = make_searcher("linear_scaling", DPSGD_SPACE, preset="refined", **KW)
    assert default.privacy_plan() == refined.privacy_plan()
    assert [default.suggest(f"t{i}") for i in range(3)] == [
        refined.suggest(f"t{i}") for i in range(3)]


def test_default_linear_scaling_is_the_benchmarks_refined_search() -> None:
    """On the benchmark's space the default derives what linear_scaling_refined was given:
    q = 0.1, T = ⌈15/0.1⌉ = 150 steps at both ends, lr ∈ [1e-3, 10], sgd, 3 runs per sweep at
    0.1·ε and 0.2·ε (0.3 and 0.6 at ε = 3, exactly), 1/σ proportional fit, quadratic
    estimate, refined draw ± 1 decade, DP-SGD; and no warning (every key it reads is used)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = make_searcher("linear_scaling", DPSGD_SPACE, **KW)
    assert (s._q, s._steps_range, s._lr_range) == (0.1, (150, 150), (1e-3, 10.0))  # noqa: SLF001
    assert s._optimizer is Optimizer.SGD and not s._full_batch  # noqa: SLF001
    assert s._n == 3 and s._sweep_eps == (0.3, 0.6)  # noqa: SLF001
    assert (s._fit, s._line_fit, s._sweep_estimate, s._sweep_draw, s._refine_decades) == (  # noqa: SLF001
        FitVariable.INVERSE_NOISE, LineFit.PROPORTIONAL, SweepEstimate.QUADRATIC,
        SweepDraw.REFINED, 1.0)
    assert s.plan_epsilon() <= BUDGET.epsilon
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict) and cfg["sample_rate"] == 0.1 and cfg["optimizer"] == "sgd"
    assert cfg["epochs"] == pytest.approx(15.0, rel=1e-12) and "noise_multiplier" in cfg
    assert cfg["model"] == "random_kernels1d" and cfg["max_grad_norm"] == 1.0
    # fractions of the budget: the sweeps follow ε
    at8 = make_searcher("linear_scaling", DPSGD_SPACE, **{**KW, "budget": PrivacyBudget(8, 1e-5)})
    assert at8._sweep_eps == (0.8, 1.6)  # noqa: SLF001


def test_linear_scaling_defaults_from_the_space_and_what_to_add_otherwise() -> None:
    """q from batch_size / the declared size, the optimizer the space fixes; a space that
    gives no single q or T is refused with the setting to add; explicit settings win (the
    space's key then ignored with a warning)."""
    space = {"batch_size": 282, "epochs": 2, "optimizer": "momentum", "momentum": 0.9}
    s = make_searcher("linear_scaling", space, **KW)
    assert s._q == pytest.approx(282 / 2819, rel=1e-12)  # noqa: SLF001
    assert s._steps_range == (20, 20) and s._optimizer is Optimizer.MOMENTUM  # noqa: SLF001
    assert s._lr_range == (1e-3, 1.0)  # no lr in the space: the fallback  # noqa: SLF001
    with pytest.raises(InvalidParameterError, match=r"add the setting sample_rate=q"):
        make_searcher("linear_scaling", {"model": "mlp", "epochs": 1}, **KW)
    with pytest.raises(InvalidParameterError, match=r"'batch_size' varies \(values \[32, 64\]\)"
                                                    r": add the setting sample_rate=q"):
        make_searcher("linear_scaling", {"batch_size": tune.choice([32, 64]), "epochs": 1}, **KW)
    with pytest.raises(InvalidParameterError, match=r"add the setting steps_range=\(T, T\)"):
        make_searcher("linear_scaling", {"sample_rate": 0.1}, **KW)
    for bad in (0, 1.5, True, "0.1"):  # refused by name before it is used for T
        with pytest.raises(InvalidParameterError, match="needs sample_rate in"):
            make_searcher("linear_scaling", {"epochs": 1}, sample_rate=bad, **KW)
    with pytest.warns(UserWarning, match="sets 'sample_rate' itself"):
        s = make_searcher("linear_scaling", {"sample_rate": 0.1}, sample_rate=0.2,
                          steps_range=(30, 30), **KW)
    assert s._q == 0.2 and s._steps_range == (30, 30)  # noqa: SLF001


def test_the_paper_preset_is_the_old_full_batch_rule() -> None:
    """preset='paper': the defaults before issue #31 — full-batch DP-GD, 5 runs per sweep at
    ε = 0.1 and 0.2 whatever the budget, T ∈ [10, 100], two-point line clamped at 2, uniform
    r, each sweep's best run; a setting given explicitly overrides the preset's."""
    s = make_searcher("linear_scaling", {"momentum": 0.9}, preset="paper", **KW)
    assert s._full_batch and s._n == 5 and s._sweep_eps == (0.1, 0.2)  # noqa: SLF001
    assert s._steps_range == (10, 100) and s._lr_range == (1e-3, 1.0)  # noqa: SLF001
    assert (s._fit, s._line_fit, s._sweep_draw, s._sweep_estimate) == (  # noqa: SLF001
        FitVariable.EPSILON, LineFit.TWO_POINT, SweepDraw.UNIFORM, SweepEstimate.BEST)
    assert s._max_extrapolation == 2.0 and s._optimizer is Optimizer.GD  # noqa: SLF001
    assert s.total_mu > 0
    s = make_searcher("linear_scaling", {}, preset=LinearScalingPreset.PAPER, runs_per_sweep=2,
                      max_extrapolation=None, **KW)
    assert s._n == 2 and s._max_extrapolation is None  # noqa: SLF001
    # fractions given explicitly replace the preset's absolute sweep ε's (alternatives)
    s = make_searcher("linear_scaling", {}, preset="paper", sweep_epsilon_fractions=(0.05, 0.1),
                      **KW)
    assert s._sweep_eps == (0.15, 0.3)  # noqa: SLF001
    with pytest.raises(InvalidParameterError, match="not both"):
        make_searcher("linear_scaling", DPSGD_SPACE, sweep_epsilons=(0.1, 0.2),
                      sweep_epsilon_fractions=(0.1, 0.2), **KW)
    for bad in ((0.2, 0.1), (0.5, 1.0), (0.1,), "ab"):
        with pytest.raises(InvalidParameterError, match="sweep_epsilon_fractions"):
            make_searcher("linear_scaling", DPSGD_SPACE, sweep_epsilon_fractions=bad, **KW)


def test_the_tnb20_preset_is_the_benchmarks_law() -> None:
    s = make_searcher("random_stopping", RANDOM_SPACE, preset="tnb20", **KW)
    direct = make_searcher("random_stopping", RANDOM_SPACE, distribution=
                           "truncated_negative_binomial", mean=20.0, shape=2.0, **KW)
    assert s.privacy_plan() == direct.privacy_plan()
    assert "truncated_negative_binomial(η=2.0) with E[K]=20.0" in s.privacy_plan().description
    s = make_searcher("random_stopping", RANDOM_SPACE, preset="tnb20", mean=5, **KW)
    assert "(η=2.0) with E[K]=5" in s.privacy_plan().description
    # without the preset: the default law (truncated negative binomial, η = 2, E[K] = 10;
    # pinned in tests/raydp_hpo/searchers/test_random_stopping_default.py)
    eta = "" if DEFAULT_SHAPE is None else f"(η={DEFAULT_SHAPE})"
    assert (f"{DEFAULT_DISTRIBUTION.value}{eta} with E[K]={DEFAULT_MEAN}"
            in make_searcher("random_stopping", RANDOM_SPACE, **KW).privacy_plan().description)


def test_a_preset_through_set_search_properties_is_the_same_search() -> None:
    """DPTuner's way (space later): the preset is expanded once, with the same result."""
    eager = make_searcher("linear_scaling", {"momentum": 0.9}, preset="paper",
                          runs_per_sweep=2, **KW)
    deferred = make_searcher("linear_scaling", None, metric="acc", preset="paper",
                             runs_per_sweep=2)
    assert deferred.set_search_properties("acc", "max", {"momentum": 0.9}, dataset_size=2819,
                                          budget=BUDGET, seed=5)
    assert deferred.privacy_plan() == eager.privacy_plan()
    assert deferred.suggest("t0") == eager.suggest("t0")
    assert isinstance(eager, DPSearcher) and math.isfinite(eager.plan_epsilon())
