"""The privacy-utility benchmark's statistics and its driver's admission memo (no training)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _driver  # noqa: E402
import privacy_utility as pu  # noqa: E402

from raydp_hpo.accounting.accountants import Accountant, epsilon  # noqa: E402
from raydp_hpo.accounting.budget import PrivacyBudget  # noqa: E402
from raydp_hpo.accounting.mechanisms import SubsampledGaussian  # noqa: E402
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger  # noqa: E402


def _row(method: str, seed: int, acc: float | None, status: str = "ok") -> dict:
    return {"dataset": "d", "epsilon": 3.0, "method": method, "seed": seed, "status": status,
            "test_accuracy": acc, "plan_epsilons": {"rdp": 3.3, "tightest": 3.0},
            "accountant": "profile"}


def test_t_interval_matches_scipy() -> None:
    xs = [0.81, 0.79, 0.85, 0.12, 0.88]
    lo, hi = pu.t_interval(xs)
    ref = st.t.interval(0.95, len(xs) - 1, loc=np.mean(xs), scale=st.sem(xs))
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert all(math.isnan(v) for v in pu.t_interval([0.5]))


def test_aggregate_counts_collapses_and_failures_apart() -> None:
    rows = [_row("m", 0, 0.80), _row("m", 1, 0.15), _row("m", 2, 0.151),
            _row("m", 3, None, "no_release")]
    s = pu.aggregate(rows)[("d", 3.0, "m")]
    # 0.15 = chance 0.1 + margin 0.05 is a collapse; 0.151 is not; a failure is not a collapse
    assert s["collapses"] == 1 and s["ok"] == 3 and s["n"] == 4 and len(s["failures"]) == 1
    assert s["eps_rdp"] == 3.3 and s["eps_tight"] == 3.0


def test_rerr_point_and_bootstrap_interval() -> None:
    rows = [_row("oracle", i, a) for i, a in enumerate([0.9, 0.88, 0.92, 0.9])]
    rows += [_row("one_shot_random", i, a) for i, a in enumerate([0.5, 0.1, 0.8, 0.6])]
    rows += [_row("m", i, a) for i, a in enumerate([0.8, 0.85, 0.75, 0.8])]
    stats = pu.aggregate(rows)
    r = pu.rerr(stats, "d", 3.0, "m")
    assert r == pytest.approx((0.8 - 0.5) / (0.9 - 0.5), rel=1e-12)
    lo, hi = pu.rerr_interval(stats, "d", 3.0, "m")
    assert lo < r < hi
    assert pu.rerr_interval(stats, "d", 3.0, "m") == (lo, hi)  # fixed RNG: reproducible


def test_empty_ledger_admission_memo_is_exact_and_defers_after_a_charge() -> None:
    budget = PrivacyBudget(3.0, 1e-5)
    ledger = PrivacyLedger(budget, adaptivity=Adaptivity.FIXED_PLAN, accountant=Accountant.BEST)
    rule = _driver.EmptyLedgerAdmission(ledger)
    m = SubsampledGaussian(2.0, 0.1, 150)
    assert rule.figure(m) == ledger.epsilon_if_charged(m)
    assert rule(m) == ledger.would_admit(m)
    assert rule.figure(m) == pytest.approx(epsilon(m, 1e-5, Accountant.BEST), rel=1e-9)
    ledger.charge("plan", m)
    # a second copy no longer fits: the memo of the empty ledger must not answer
    assert rule(m) is False and rule(m) == ledger.would_admit(m)


def test_mode_modifiers_compose_and_bad_models_are_refused() -> None:
    """``+m1d=`` swaps the MNIST-1D model only (digits and every other knob unchanged), and
    composes with ``+ema=``; a name that is neither built in nor a class path is refused."""
    base = pu.sizing("default")
    mode = pu.with_ema(pu.with_mnist1d_model("default", "_driver:mlp128"), 0.95)
    size = pu.sizing(mode)
    assert size["models"] == {**base["models"], "mnist1d": "_driver:mlp128"}
    assert size["ema_decay"] == 0.95
    assert {k: v for k, v in size.items() if k not in ("models", "ema_decay")} == {
        k: v for k, v in base.items() if k != "models"}
    assert pu.with_mnist1d_model("default", None) == "default"
    with pytest.raises(ValueError, match="mnist1d-model"):
        pu.with_mnist1d_model("default", "resnet")


#: what method_setup passed for linear_scaling_refined before the presets (issue #31), at
#: the default sizing on MNIST-1D and ε = 3: the preset must run exactly this
_REFINED_BEFORE_PRESETS = {
    "runs_per_sweep": 3, "sweep_epsilons": (0.3, 0.6), "lr_range": (1e-3, 10.0),
    "full_batch": False, "sample_rate": 0.1, "optimizer": "sgd", "steps_range": (150, 150),
    "fit_variable": "inverse_noise", "line_fit": "proportional", "sweep_draw": "refined",
    "sweep_estimate": "quadratic", "refine_decades": 1.0}


def _searcher(space: dict, kwargs: dict, epsilon: float = 3.0, seed: int = 0):
    from raydp_hpo.searchers import make_searcher

    return make_searcher("linear_scaling", space, metric="val_accuracy", dataset_size=2819,
                         budget=PrivacyBudget(epsilon, 1e-5), seed=seed, **kwargs)


def test_linear_scaling_refined_is_the_preset_and_runs_what_was_measured() -> None:
    """The benchmark's linear_scaling_refined is ``preset="refined"`` and nothing else; on
    its space that preset builds the very search the explicit settings of runs X–X4 built:
    the same plan and, from one seed, the same trial configurations."""
    size = pu.sizing("default")
    space, kwargs = pu.method_setup("linear_scaling_refined", size, "mnist1d", 3.0)
    assert kwargs == {"preset": "refined"}
    old_space = {"model": space["model"], "max_grad_norm": space["max_grad_norm"]}
    new, old = _searcher(space, kwargs), _searcher(old_space, _REFINED_BEFORE_PRESETS)
    assert new.privacy_plan() == old.privacy_plan()
    assert [new.suggest(f"t{i}") for i in range(3)] == [old.suggest(f"t{i}") for i in range(3)]


@pytest.mark.parametrize("mode", ["default", "quick", "full"])
def test_linear_scaling_proportional_runs_the_benchmarks_dpsgd(mode: str) -> None:
    """The benchmark's linear_scaling_proportional trains like every other method (DP-SGD at
    the sizing's sample rate, its fixed T = epochs / q steps, sweeps at fixed fractions 0.1
    and 0.2 of the total ε) and its plan fits ε = 3 on the default MNIST-1D training split
    (2819 records); the final σ is below the sweeps' σ."""
    from raydp_hpo.trial.privacy import dpsgd_steps

    size = pu.sizing(mode)
    space, kwargs = pu.method_setup("linear_scaling_proportional", size, "mnist1d", 3.0)
    assert kwargs["preset"] == "refined"
    s = _searcher(space, kwargs)
    steps = dpsgd_steps(float(size["epochs"]), float(size["sample_rate"]))
    assert s._steps_range == (steps, steps) and not s._full_batch  # noqa: SLF001
    assert s._line_fit.value == "proportional" and s._fit.value == "inverse_noise"  # noqa: SLF001
    assert s._sweep_eps == (0.3, 0.6)  # noqa: SLF001
    assert _searcher(space, kwargs, epsilon=1.0)._sweep_eps == (0.1, 0.2)  # noqa: SLF001
    assert s.plan_epsilon() <= 3.0
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict) and cfg["sample_rate"] == size["sample_rate"]
    assert cfg["epochs"] == pytest.approx(float(size["epochs"]), rel=1e-9)
    assert s._sigma_f < min(s._sigmas)  # noqa: SLF001


def test_linear_scaling_ablations_differ_from_the_preset_only_as_named() -> None:
    """linear_scaling_quadratic: the refined preset with log-uniform sweeps; _proportional:
    also each sweep's best run. Same space (hence the same plan and σ's)."""
    size = pu.sizing("default")
    refined = pu.method_setup("linear_scaling_refined", size, "digits", 3.0)
    quad = pu.method_setup("linear_scaling_quadratic", size, "digits", 3.0)
    prop = pu.method_setup("linear_scaling_proportional", size, "digits", 3.0)
    for space in (quad[0], prop[0]):  # the lr domains are equal objects, not one object
        assert {k: v for k, v in space.items() if k != "lr"} == {
            k: v for k, v in refined[0].items() if k != "lr"}
        assert (space["lr"].lower, space["lr"].upper) == (1e-3, 10.0)
    assert quad[1] == {"preset": "refined", "sweep_draw": "log_uniform"}
    assert prop[1] == {"preset": "refined", "sweep_draw": "log_uniform",
                       "sweep_estimate": "best"}
    assert _searcher(*quad).privacy_plan() == _searcher(*refined).privacy_plan()
    assert "linear_scaling_refined" in pu.METHODS


def test_linear_scaling_is_the_paper_preset() -> None:
    size = pu.sizing("default")
    space, kwargs = pu.method_setup("linear_scaling", size, "digits", 3.0)
    assert kwargs == {"preset": "paper", "runs_per_sweep": 3, "steps_range": (10, 40),
                      "lr_range": (1e-3, 10.0)}
    s = _searcher(space, kwargs)
    assert s._full_batch and s._line_fit.value == "two_point"  # noqa: SLF001


def test_random_stopping_tnb20_is_random_stopping_with_its_own_law() -> None:
    """random_stopping_tnb20: the truncated negative binomial with η = 2 and E[K] = 20,
    whatever the run's E[K] (--mean-k); the rest is random stopping's setup, and its plan,
    calibrated on the tightest accountant, fits ε = 3 on MNIST-1D's training split."""
    from raydp_hpo.searchers import make_searcher

    size = pu.sizing("default@k=5")
    rs = pu.method_setup("random_stopping", size, "mnist1d", 3.0)
    tnb = pu.method_setup("random_stopping_tnb20", size, "mnist1d", 3.0)
    assert rs[0].keys() == tnb[0].keys() and rs[1] == {"distribution": "geometric", "mean": 5.0}
    assert {k: v for k, v in rs[0].items() if k != "lr"} == {
        k: v for k, v in tnb[0].items() if k != "lr"}
    assert (tnb[0]["lr"].lower, tnb[0]["lr"].upper) == (1e-3, 10.0)
    assert tnb[1] == {"preset": "tnb20"}
    s = make_searcher("random_stopping", param_space=tnb[0], metric="val_accuracy",
                      dataset_size=2819, budget=PrivacyBudget(3.0, 1e-5), seed=0, **tnb[1])
    assert s.plan_epsilon() <= 3.0
    assert "(η=2.0) with E[K]=20.0" in s.privacy_plan().description
