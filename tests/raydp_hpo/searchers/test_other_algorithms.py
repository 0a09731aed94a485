"""Linear scaling, SVT and baseline accounting tests (tolerances stated inline)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ray import tune
from ray.tune.search import Searcher

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.gdp import gdp_epsilon
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Gaussian,
    Laplace,
    PureDP,
    SubsampledGaussian,
    mechanism_from_dict,
)
from raydp_hpo.accounting.rdp import DEFAULT_ORDERS, rdp_profile
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.ledger.coverage import is_covered
from raydp_hpo.searchers import (
    GridSearchComposed,
    LinearScalingSearch,
    OneShotRandomSearch,
    SVTThresholdSearch,
)
from raydp_hpo.searchers.svt_threshold import above_threshold_rounds
from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON, privacy_from_config, trial_mechanism
from tests.raydp_hpo.searchers._results import complete

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
KW = dict(metric="acc", dataset_size=N, budget=BUDGET, seed=1)
#: linear scaling as before issue #31 (the paper's full-batch rule): tests of that rule and of
#: single options on top of it name the preset; the refined default has tests of its own
LS_KW = {**KW, "preset": "paper"}
GRID = {"lr": tune.choice([0.01, 0.1, 1.0]), "epochs": 1, "sample_rate": 0.01}


def test_linear_scaling_total_mu_and_gdp_budget() -> None:
    """score_epsilon=None (validation split public): exactly Panda et al.'s μ-GDP plan."""
    budget = PrivacyBudget(1.0, 1e-5)
    s = LinearScalingSearch({"momentum": 0.9}, runs_per_sweep=3, score_epsilon=None,
                            **{**LS_KW, "budget": budget})
    mu1, mu2, muf = s._mus[0], s._mus[1], s._mu_f  # noqa: SLF001
    assert s.total_mu == pytest.approx(math.sqrt(3 * mu1**2 + 3 * mu2**2 + muf**2), rel=1e-12)
    assert gdp_epsilon(s.total_mu, budget.delta) <= budget.epsilon
    assert gdp_epsilon(mu1, budget.delta) == pytest.approx(0.1, abs=1e-9)
    assert s.plan_epsilon() <= budget.epsilon  # default admission rule: RDP
    # the plan's RDP is exactly that of one Gaussian with μ_t: α·μ_t²/2 (rel. 1e-12)
    np.testing.assert_allclose(rdp_profile(s.privacy_plan().mechanism).values,  # type: ignore[arg-type]
                               DEFAULT_ORDERS * s.total_mu**2 / 2, rtol=1e-12)


def test_linear_scaling_plan_composes_noisy_sweep_scores() -> None:
    """Each sweep run is training ∘ Laplace(ε_s); the plan holds the 2n Laplace releases as a
    separate component; μ_t covers the Gaussian part only and the whole plan fits (RDP)."""
    budget = PrivacyBudget(1.0, 1e-5)
    kw = {**LS_KW, "budget": budget}
    s = LinearScalingSearch({"momentum": 0.9}, runs_per_sweep=3, **kw)
    public = LinearScalingSearch({"momentum": 0.9}, runs_per_sweep=3, score_epsilon=None, **kw)
    mu1, mu2, muf = s._mus[0], s._mus[1], s._mu_f  # noqa: SLF001
    plan = s.privacy_plan().mechanism
    assert plan == Composition((Gaussian(1 / mu1, 3), Gaussian(1 / mu2, 3),
                                Laplace(DEFAULT_SCORE_EPSILON, 6), Gaussian(1 / muf, 1)))
    assert s.plan_epsilon() <= budget.epsilon
    assert muf < public._mu_f  # noqa: SLF001  # the score releases are paid by the final run
    # RDP: Gaussian part α·μ_t²/2 plus six Laplace(ε_s) curves (rel. 1e-12)
    lap = rdp_profile(Laplace(DEFAULT_SCORE_EPSILON, 6)).values
    np.testing.assert_allclose(rdp_profile(plan).values,  # type: ignore[arg-type]
                               DEFAULT_ORDERS * s.total_mu**2 / 2 + lap, rtol=1e-12)
    cfgs = [s.suggest(f"t{i}") for i in range(6)]
    for i, c in enumerate(cfgs):
        assert isinstance(c, dict) and c["raydp"].score_epsilon == DEFAULT_SCORE_EPSILON
        base = mechanism_from_dict(c["raydp"].base)
        assert base == trial_mechanism(Gaussian(1 / s._mus[i // 3], 1), DEFAULT_SCORE_EPSILON)  # noqa: SLF001
        declared = trial_mechanism(privacy_from_config(c, N).mechanism(), DEFAULT_SCORE_EPSILON)
        assert is_covered(declared, base)
        complete(s, f"t{i}", {"acc": 0.1 * i})
    final = s.suggest("t6")
    assert isinstance(final, dict) and final["raydp"].score_epsilon is None
    assert mechanism_from_dict(final["raydp"].base) == Gaussian(1 / muf, 1)


def test_linear_scaling_subsampled_includes_scores() -> None:
    s = LinearScalingSearch({}, runs_per_sweep=2, full_batch=False, sample_rate=0.01, **LS_KW)
    plan = s.privacy_plan().mechanism
    assert isinstance(plan, Composition) and Laplace(DEFAULT_SCORE_EPSILON, 4) in plan.mechanisms
    assert s.plan_epsilon() <= BUDGET.epsilon


def test_linear_scaling_fit_and_final_run() -> None:
    s = LinearScalingSearch({}, runs_per_sweep=2, steps_range=(10, 100), lr_range=(0.01, 1.0),
                            **{**LS_KW, "budget": PrivacyBudget(1.0, 1e-5)})
    cfgs = [s.suggest(f"t{i}") for i in range(4)]
    assert s.suggest("t4") is None  # waits for the sweeps
    for i, c in enumerate(cfgs):
        assert isinstance(c, dict) and c["optimizer"] == "gd" and "mu" in c
        assert c["lr"] <= 1.0 and 10 <= c["epochs"] <= 100
        complete(s, f"t{i}", {"acc": [0.1, 0.2, 0.3, 0.1][i]})
    final = s.suggest("t4")
    assert isinstance(final, dict) and final["raydp"].phase == "final"
    fit = s._fit_result  # noqa: SLF001
    r1 = cfgs[1]["lr"] * cfgs[1]["epochs"]  # type: ignore[index]
    r2 = cfgs[2]["lr"] * cfgs[2]["epochs"]  # type: ignore[index]
    assert fit["r1"] == pytest.approx(r1, rel=1e-9) and fit["r2"] == pytest.approx(r2, rel=1e-9)
    slope = (r2 - r1) / (0.2 - 0.1)
    line = r1 + slope * (s._final_eps - 0.1)  # noqa: SLF001
    assert fit["r_line"] == pytest.approx(line, rel=1e-9)
    # clamped to the sweeps' support (factor 2 by default), then to [r_min, r_max]
    expected = min(max(line, min(r1, r2) / 2, 0.1), 2 * max(r1, r2), 100.0)
    assert fit["r_star"] == pytest.approx(expected, rel=1e-9)
    assert final["lr"] * final["epochs"] == pytest.approx(expected, rel=1e-9)
    complete(s, "t4", {"acc": 0.5})
    assert s.suggest("t5") == Searcher.FINISHED
    assert s.release().trial_id == "t4"


def _run_sweeps(s: LinearScalingSearch, n: int, pick: str) -> tuple[float, float, dict]:
    """Run both sweeps of ``s`` (n runs each); in sweep 1 the run with the smallest r scores
    best, in sweep 2 the one with the largest (``pick="up"``) or the reverse (``"down"``), so
    the fitted line is as steep as the draws allow. Returns (r₁, r₂, final config)."""
    cfgs = [s.suggest(f"t{i}") for i in range(2 * n)]
    rs = [c["lr"] * c["epochs"] for c in cfgs]  # type: ignore[index]
    sweeps = (rs[:n], rs[n:])
    first, second = (min, max) if pick == "up" else (max, min)
    r1, r2 = first(sweeps[0]), second(sweeps[1])
    for i, r in enumerate(rs):
        complete(s, f"t{i}", {"acc": 0.9 if r in (r1, r2) else 0.1})
    final = s.suggest(f"t{2 * n}")
    assert isinstance(final, dict) and final["raydp"].phase == "final"
    return r1, r2, final


@pytest.mark.parametrize("pick", ["up", "down"])
def test_linear_scaling_does_not_extrapolate_beyond_the_sweeps(pick: str) -> None:
    """Regression (issue 12): a steep fitted line sent r* to r_max (lr = η_max for T_max steps,
    full-batch GD diverged to chance accuracy) or to r_min (no training). r* must stay within a
    factor max_extrapolation = 2 of the sweeps' best r values."""
    # seed 29: the sweeps' best r stay below r_max / 2, so the old clip to [r_min, r_max]
    # alone cannot keep r* within the factor 2 (checked: this test fails on the old code)
    s = LinearScalingSearch({}, runs_per_sweep=3, steps_range=(10, 40), lr_range=(1e-3, 10.0),
                            score_epsilon=None, **{**LS_KW, "seed": 29})
    r1, r2, final = _run_sweeps(s, 3, pick)
    r_star = final["lr"] * final["epochs"]
    assert min(r1, r2) / 2 * (1 - 1e-9) <= r_star <= 2 * max(r1, r2) * (1 + 1e-9)
    # the paper's line would have left that support (else the case tests nothing)
    line = r2 + (r2 - r1) / (0.2 - 0.1) * (s._final_eps - 0.2)  # noqa: SLF001
    assert line > 2 * max(r1, r2) if pick == "up" else line < min(r1, r2) / 2
    assert s._fit_result["clamped"] == 1.0  # noqa: SLF001


def test_linear_scaling_unclamped_option_is_the_paper_rule() -> None:
    """max_extrapolation=None: r* = α·x_f + b, clipped to [r_min, r_max] only (Panda et al.)."""
    s = LinearScalingSearch({}, runs_per_sweep=3, steps_range=(10, 40), lr_range=(1e-3, 10.0),
                            score_epsilon=None, max_extrapolation=None, **LS_KW)
    _, _, final = _run_sweeps(s, 3, "up")
    line = s._fit_result["r_line"]  # noqa: SLF001
    assert final["lr"] * final["epochs"] == pytest.approx(min(max(line, 1e-2), 400.0), rel=1e-9)
    with pytest.raises(InvalidParameterError, match="max_extrapolation"):
        LinearScalingSearch({}, max_extrapolation=0.5, **LS_KW)


def test_linear_scaling_ignores_keys_it_sets_itself_with_a_warning() -> None:
    """One space for every searcher: the noise and the batch in the space are dropped with
    a warning (before: an error) and never reach a trial, whose privacy settings are the
    plan's own; the lr domain gives the lr range (here the fallback's (1e-3, 1) again)."""
    space = {"lr": tune.loguniform(1e-3, 1), "noise_multiplier": 1.0,
             "batch_size": tune.choice([32, 64]), "epochs": 1, "width": 3}
    with pytest.warns(UserWarning, match="sets 'noise_multiplier', 'batch_size', 'epochs' itself"):
        s = LinearScalingSearch(space, runs_per_sweep=2, **LS_KW)
    assert s._lr_range == (1e-3, 1.0)  # noqa: SLF001
    assert s.plan_epsilon() == LinearScalingSearch({"width": 3}, runs_per_sweep=2,
                                                   **LS_KW).plan_epsilon()
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict) and cfg["width"] == 3 and "mu" in cfg
    assert "noise_multiplier" not in cfg and "batch_size" not in cfg
    assert cfg["lr"] != space["lr"] and isinstance(cfg["lr"], float)


def test_linear_scaling_refuses_bad_space_and_small_budget() -> None:
    with pytest.raises(SearchSpaceError, match="fix 'width'"):
        LinearScalingSearch({"width": tune.choice([1, 2])}, **LS_KW)
    with pytest.raises(InvalidParameterError, match=r"at least ε="):
        LinearScalingSearch({}, runs_per_sweep=20, **{**LS_KW, "budget": PrivacyBudget(0.5, 1e-5)})


def test_linear_scaling_subsampled_option() -> None:
    s = LinearScalingSearch({}, runs_per_sweep=2, full_batch=False, sample_rate=0.01, **LS_KW)
    assert s.plan_epsilon() <= BUDGET.epsilon
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict) and cfg["sample_rate"] == 0.01 and "noise_multiplier" in cfg


PROPORTIONAL = dict(full_batch=False, sample_rate=0.1, optimizer="sgd", steps_range=(150, 150),
                    lr_range=(1e-3, 10.0), sweep_epsilons=(0.3, 0.6),
                    fit_variable="inverse_noise", line_fit="proportional")


def test_linear_scaling_proportional_fit_is_the_noise_scaling_rule() -> None:
    """line_fit="proportional", x = 1/σ: each sweep estimates α = rᵢ·σᵢ, r* = α̂/σ_f with α̂
    their geometric mean (Panda et al. Prop. 2.1(a), η* ∝ 1/σ at a fixed T); not clamped to a
    factor of the sweeps' r (the extrapolation factor σᵢ/σ_f is public). Exact to 1e-9."""
    s = LinearScalingSearch({}, runs_per_sweep=3, sweep_draw="log_uniform", **PROPORTIONAL,
                            **{**LS_KW, "dataset_size": 2800})
    r1, r2, final = _run_sweeps(s, 3, "up")
    r1, r2 = r1 / 0.1, r2 / 0.1  # _run_sweeps reads lr·epochs; T = epochs / q steps
    sigma1, sigma2 = s._sigmas  # noqa: SLF001
    sigma_f = final["noise_multiplier"]
    assert sigma_f == s._sigma_f and sigma_f < sigma2 < sigma1  # noqa: SLF001
    expected = math.sqrt(r1 * sigma1 * r2 * sigma2) / sigma_f
    assert final["lr"] * 150 == pytest.approx(min(expected, 1500.0), rel=1e-9)
    assert final["epochs"] == pytest.approx(15.0) and final["sample_rate"] == 0.1
    fit = s._fit_result  # noqa: SLF001
    assert fit["alpha"] == pytest.approx(math.sqrt(r1 * sigma1 * r2 * sigma2), rel=1e-9)
    assert fit["x_final"] == pytest.approx(1 / sigma_f, rel=1e-12)
    # with r₁σ₁ = r₂σ₂ the rule scales r by σ₂/σ_f, beyond the two-point clamp's factor 2
    assert sigma2 / sigma_f > 2
    complete(s, "t6", {"acc": 0.5})
    extras = s.release().extras
    assert extras["line_fit"] == "proportional" and extras["sweep_draw"] == "log_uniform"


def test_linear_scaling_proportional_fit_with_one_failed_sweep() -> None:
    """A sweep whose runs all failed gives no estimate: α̂ is the other sweep's rᵢ·σᵢ."""
    s = LinearScalingSearch({}, runs_per_sweep=2, **PROPORTIONAL, **{**LS_KW, "dataset_size": 2800})
    cfgs = [s.suggest(f"t{i}") for i in range(4)]
    rs = [c["lr"] * c["epochs"] / 0.1 for c in cfgs]  # type: ignore[index]
    for i in range(2):
        s.on_trial_complete(f"t{i}", error=True)
    complete(s, "t2", {"acc": 0.5})
    complete(s, "t3", {"acc": 0.4})
    final = s.suggest("t4")
    assert isinstance(final, dict)
    expected = rs[2] * s._sigmas[1] / s._sigma_f  # noqa: SLF001
    assert final["lr"] * 150 == pytest.approx(min(expected, 1500.0), rel=1e-9)


def _quadratic_search(score_of_u, **extra) -> tuple[LinearScalingSearch, dict, list[float]]:
    """Proportional linear scaling (3 runs per sweep) whose sweep run with u = log(r·σ) scores
    ``score_of_u(u, level)``; returns the searcher, the final config and the sweeps' u's."""
    s = LinearScalingSearch({}, runs_per_sweep=3, sweep_draw="log_uniform",
                            sweep_estimate="quadratic", **PROPORTIONAL,
                            **{**LS_KW, "dataset_size": 2800, **extra})
    cfgs = [s.suggest(f"t{i}") for i in range(6)]
    us = []
    for i, c in enumerate(cfgs):
        u = math.log(c["lr"] * c["epochs"] / 0.1 * c["noise_multiplier"])  # type: ignore[index]
        us.append(u)
        complete(s, f"t{i}", {"acc": score_of_u(u, i // 3)})
    final = s.suggest("t6")
    assert isinstance(final, dict)
    return s, final, us


def test_linear_scaling_quadratic_estimate_finds_the_common_peak() -> None:
    """sweep_estimate="quadratic": scores y = a_sweep − (u − u₀)² with u = log(r·σ) (= log(r/x))
    and a different level per sweep are fitted exactly, so α̂ = exp(u₀) and the final
    r = exp(u₀)/σ_f (rel. 1e-9) — wherever the best single runs happened to fall."""
    probe, _, us = _quadratic_search(lambda u, level: 0.0)
    u0 = (min(us) + max(us)) / 2  # inside the tried range: no clipping
    s, final, _ = _quadratic_search(lambda u, level: (0.3, 0.6)[level] - 0.01 * (u - u0) ** 2)
    assert s._fit_result["quadratic"] == 1.0  # noqa: SLF001
    assert final["lr"] * 150 == pytest.approx(math.exp(u0) / final["noise_multiplier"], rel=1e-9)
    assert s.release().extras["sweep_estimate"] == "quadratic"
    # a peak beyond the tried u's is clipped to the smallest u tried (the sweeps' support)
    s, final, us = _quadratic_search(lambda u, level: -((u - min(us) + 5.0) ** 2))
    expected = math.exp(min(us)) / final["noise_multiplier"]
    assert 0.15 < expected < 1500.0  # within [r_min, r_max]: only the vertex clip acts
    assert final["lr"] * 150 == pytest.approx(expected, rel=1e-9)


def test_linear_scaling_quadratic_estimate_falls_back_without_a_peak() -> None:
    """A valley (c > 0) has no peak to read: the estimate falls back to the sweeps' best runs
    (geometric mean of rᵢσᵢ), exactly as sweep_estimate="best"."""
    s, final, us = _quadratic_search(lambda u, level: (u - 3.0) ** 2)
    assert s._fit_result["quadratic"] == 0.0  # noqa: SLF001
    best = [max(us[:3], key=lambda u: (u - 3.0) ** 2), max(us[3:], key=lambda u: (u - 3.0) ** 2)]
    expected = math.exp(sum(best) / 2) / final["noise_multiplier"]
    assert final["lr"] * 150 == pytest.approx(min(expected, 1500.0), rel=1e-9)
    with pytest.raises(InvalidParameterError, match="needs line_fit='proportional'"):
        LinearScalingSearch({}, sweep_estimate="quadratic", **LS_KW)


def test_linear_scaling_log_uniform_sweep_draw() -> None:
    """sweep_draw="log_uniform": log r uniform over [r_min, r_max]; the paper's uniform r puts
    almost every run in the top decade. 400 draws each; binomial sd of a fraction ≤ 0.025,
    bands at ≥ 4 sd."""
    kw = {**PROPORTIONAL, "sweep_epsilons": (0.3, 0.6)}
    log_s = LinearScalingSearch({}, sweep_draw="log_uniform", **kw, **{**LS_KW, "dataset_size": 2800})
    uni_s = LinearScalingSearch({}, **kw, **{**LS_KW, "dataset_size": 2800})
    r_min, r_max = 0.15, 1500.0
    mid = math.sqrt(r_min * r_max)
    log_draws = np.array([log_s._draw_r(0, 0) for _ in range(400)])  # noqa: SLF001
    uni_draws = np.array([uni_s._draw_r(0, 0) for _ in range(400)])  # noqa: SLF001
    assert np.all((log_draws >= r_min) & (log_draws <= r_max))
    assert 0.4 <= float(np.mean(log_draws < mid)) <= 0.6
    assert float(np.mean(uni_draws < mid)) <= 0.05


def test_linear_scaling_stratified_sweep_draw_puts_one_run_per_stratum() -> None:
    """sweep_draw="stratified": the k-th of n runs draws log r uniformly from the k-th of n
    equal sub-intervals of [log r_min, log r_max] (1-D Latin hypercube). 300 draws per
    stratum: each lies in its stratum (exact), its lower half holds 0.5 ± 0.12 of them
    (binomial sd 0.029, ≥ 4 sd)."""
    s = LinearScalingSearch({}, runs_per_sweep=3, sweep_draw="stratified", **PROPORTIONAL,
                            **{**LS_KW, "dataset_size": 2800})
    lo, hi = math.log(0.15), math.log(1500.0)
    width = (hi - lo) / 3
    for k in range(3):
        logs = np.log([s._draw_r(1, k) for _ in range(300)])  # noqa: SLF001
        assert np.all(logs >= lo + k * width - 1e-9) and np.all(logs <= lo + (k + 1) * width + 1e-9)
        assert 0.38 <= float(np.mean(logs < lo + (k + 0.5) * width)) <= 0.62
    # through suggest: the first sweep's three runs cover the three strata
    cfgs = [s.suggest(f"t{i}") for i in range(3)]
    strata = sorted(int((math.log(c["lr"] * c["epochs"] / 0.1) - lo) // width)  # type: ignore[index]
                    for c in cfgs)
    assert strata == [0, 1, 2]


def _refined(**extra) -> LinearScalingSearch:
    return LinearScalingSearch({}, runs_per_sweep=3, sweep_draw="refined",
                               sweep_estimate="quadratic", **PROPORTIONAL,
                               **{**LS_KW, "dataset_size": 2800, **extra})


@pytest.mark.parametrize(("best_run", "decades"), [(1, 1.0), (0, 1.75)])
def test_linear_scaling_refined_second_sweep_searches_around_the_first(best_run: int,
                                                                        decades: float) -> None:
    """sweep_draw="refined": the second sweep waits for every first-sweep score, then draws
    (stratified) within ± refine_decades of r₁·x₂/x₁ = r₁·σ₁/σ₂ (r₁: the first sweep's best
    run), shifted inside [r_min, r_max] when the window overflows. best_run=1: the middle
    stratum's run wins, the window is [c/10, 10c]; best_run=0: the lowest stratum's run
    (r ≤ r_min·10^(4/3)) wins, so c ≤ 6 and the window [c/10^1.75, 10^1.75·c] starts below
    r_min: it becomes [r_min, 10^3.5·r_min]."""
    for seed in range(1, 6):  # five secret seeds: five draws of both sweeps
        _check_refined_window(_refined(refine_decades=decades, seed=seed), best_run, decades)


def _check_refined_window(s: LinearScalingSearch, best_run: int, decades: float) -> None:
    first = [s.suggest(f"t{i}") for i in range(3)]
    r = [c["lr"] * c["epochs"] / 0.1 for c in first]  # type: ignore[index]
    assert s.suggest("t3") is None  # three first-sweep runs live: no window yet
    order = np.argsort(r)
    for rank, i in enumerate(order):
        complete(s, f"t{i}", {"acc": 0.9 if rank == best_run else 0.1 + 0.1 * rank})
    sigma1, sigma2 = s._sigmas  # noqa: SLF001
    centre = r[order[best_run]] * sigma1 / sigma2
    lo, hi = centre / 10**decades, centre * 10**decades
    assert (lo < 0.15) == (best_run == 0)
    if lo < 0.15:
        lo, hi = 0.15, 0.15 * 10 ** (2 * decades)
    assert lo >= 0.15 and hi <= 1500.0
    second = [s.suggest(f"t{i}") for i in range(3, 6)]
    r2 = np.array([c["lr"] * c["epochs"] / 0.1 for c in second])  # type: ignore[index]
    assert np.all(r2 >= lo * (1 - 1e-9)) and np.all(r2 <= hi * (1 + 1e-9))
    edges = np.exp(np.linspace(math.log(lo), math.log(hi), 4))
    assert sorted(np.searchsorted(edges, r2) - 1) == [0, 1, 2]  # one run per stratum
    for i in range(3, 6):
        complete(s, f"t{i}", {"acc": 0.5})
    assert isinstance(s.suggest("t6"), dict)
    complete(s, "t6", {"acc": 0.5})
    extras = s.release().extras
    assert extras["sweep_draw"] == "refined" and extras["refine_decades"] == decades
    assert extras["refine_centre"] == pytest.approx(centre, rel=1e-9)


def test_linear_scaling_refined_after_a_failed_first_sweep_searches_everywhere() -> None:
    """No first-sweep score, no window: the second sweep is stratified over the whole range."""
    s = _refined()
    for i in range(3):
        assert isinstance(s.suggest(f"t{i}"), dict)
        s.on_trial_complete(f"t{i}", error=True)
    second = [s.suggest(f"t{i}") for i in range(3, 6)]
    logs = sorted(math.log(c["lr"] * c["epochs"] / 0.1) for c in second)  # type: ignore[index]
    width = (math.log(1500.0) - math.log(0.15)) / 3
    assert [int((v - math.log(0.15)) // width) for v in logs] == [0, 1, 2]


def test_linear_scaling_refined_refuses_what_it_cannot_mean() -> None:
    with pytest.raises(InvalidParameterError, match="'refined' needs line_fit='proportional'"):
        LinearScalingSearch({}, sweep_draw="refined", **LS_KW)
    for bad in (0, -1.0, float("nan"), True, "1"):
        with pytest.raises(InvalidParameterError, match="refine_decades must be"):
            _refined(refine_decades=bad)


def test_linear_scaling_refuses_fit_variables_without_a_meaning() -> None:
    """μ is exact only for full-batch runs, 1/σ is fixed per sweep only for DP-SGD: the other
    combinations (μ of a DP-SGD run was NaN and crashed the final run) are refused by name."""
    with pytest.raises(InvalidParameterError, match="fit_variable='mu' needs full_batch=True"):
        LinearScalingSearch({}, full_batch=False, sample_rate=0.1, fit_variable="mu", **LS_KW)
    with pytest.raises(InvalidParameterError, match="'inverse_noise' needs full_batch=False"):
        LinearScalingSearch({}, fit_variable="inverse_noise", **LS_KW)
    with pytest.raises(InvalidParameterError, match="line_fit 'origin'"):
        LinearScalingSearch({}, line_fit="origin", **LS_KW)
    with pytest.raises(InvalidParameterError, match="sweep_draw 'normal'"):
        LinearScalingSearch({}, sweep_draw="normal", **LS_KW)


@pytest.mark.parametrize("score_epsilon", [DEFAULT_SCORE_EPSILON, None])
def test_svt_plan_is_tmax_rounds_plus_final(score_epsilon: float | None) -> None:
    """SVT privatises u_s itself (AboveThreshold): no Laplace score part, whatever ε_s."""
    s = SVTThresholdSearch({**GRID, "noise_multiplier": 1.5}, max_rounds=12, round_epsilon=0.05,
                           num_partitions=20, score_epsilon=score_epsilon, **KW)
    final = SubsampledGaussian(1.5, 0.01, 100)
    assert s.privacy_plan().mechanism == Composition((PureDP(0.05, count=12), final))
    assert s.utility_sensitivity == pytest.approx(1 / 20)
    rdp = rdp_profile(s.privacy_plan().mechanism).values  # type: ignore[arg-type]
    np.testing.assert_allclose(
        rdp, 12 * np.minimum(0.05, DEFAULT_ORDERS * 0.05**2 / 2) + rdp_profile(final).values)


def test_svt_selects_the_clearly_best_candidate() -> None:
    s = SVTThresholdSearch(GRID, max_rounds=40, round_epsilon=0.5, num_partitions=200,
                           granularity=0.01, **{**KW, "budget": PrivacyBudget(50.0, 1e-5)})
    util = {0.01: 0.2, 0.1: 0.9, 1.0: 0.3}
    cfgs = [s.suggest(f"t{i}") for i in range(3)]
    assert s.suggest("t3") is None
    for i, c in enumerate(cfgs):
        assert isinstance(c, dict) and c["raydp"].data_view["kind"] == "partitions"
        assert c["raydp"].nonprivate is True
        assert c["raydp"].score_epsilon is None  # the AboveThreshold noise covers u_s
        complete(s, f"t{i}", {"acc": util[c["lr"]]})
    final = s.suggest("t3")
    assert isinstance(final, dict) and final["raydp"].data_view == {"kind": "full"}
    assert final["lr"] == 0.1  # kϵ = 100: noise scales 0.02/0.04, utility gap 0.6
    assert final["raydp"].score_epsilon is None
    complete(s, "t3", {"acc": 0.9})
    assert s.suggest("t4") == Searcher.FINISHED and s.release().trial_id == "t3"


def test_above_threshold_non_randomized_limit() -> None:
    # negligible noise: u climbs to u* = 0.37 in O(log n) rounds (Ding et al., Lemma 1)
    sel, rounds = above_threshold_rounds([0.1, 0.37], rng=np.random.default_rng(0),
                                         num_partitions=10**9, round_epsilon=1.0,
                                         granularity=0.01, u0=0.0, max_rounds=100)
    assert sel == 1 and rounds <= 3 * math.ceil(math.log2(37)) + 2


def test_above_threshold_scan_order_is_not_biased_to_the_first_candidate() -> None:
    # Equal utilities, overwhelming noise: every candidate must be about equally likely to be
    # selected (a fixed scan order would favour index 0). 400 runs, 4 candidates: each count
    # within 5 binomial standard deviations of 100 (σ ≈ 8.7).
    counts = [0, 0, 0, 0]
    for seed in range(400):
        sel, _ = above_threshold_rounds([0.5] * 4, rng=np.random.default_rng(seed),
                                        num_partitions=1, round_epsilon=0.05,
                                        granularity=0.01, u0=0.0, max_rounds=1)
        if sel is not None:
            counts[sel] += 1
    total = sum(counts)
    assert total > 100
    expected = total / 4
    sd = math.sqrt(total * 0.25 * 0.75)
    assert all(abs(c - expected) < 5 * sd for c in counts), counts


def test_svt_errors() -> None:
    with pytest.raises(SearchSpaceError, match="'lr'.*continuous"):
        SVTThresholdSearch({"lr": tune.uniform(0, 1), "epochs": 1, "sample_rate": 0.01}, **KW)
    with pytest.raises(InvalidParameterError, match="too small"):
        SVTThresholdSearch(GRID, max_rounds=200, round_epsilon=0.1, **KW)


def test_svt_utilities_only_reach_the_noisy_comparisons() -> None:
    """Two runs whose candidate utilities differ but whose SVT outcome is the same produce
    identical suggestions and releases: nothing but above_threshold_rounds reads u_s."""
    outs = []
    for utils in ([0.2, 0.9, 0.3], [0.25, 0.95, 0.1]):
        s = SVTThresholdSearch(GRID, max_rounds=40, round_epsilon=0.5, num_partitions=10_000,
                               **{**KW, "budget": PrivacyBudget(50.0, 1e-5)})
        cfgs = [s.suggest(f"t{i}") for i in range(3)]
        for i in range(3):
            complete(s, f"t{i}", {"acc": utils[i]})
        final = s.suggest("t3")
        complete(s, "t3", {"acc": 0.5})
        rel = s.release()
        outs.append((cfgs, final, rel.hyperparameters, rel.trial_id, rel.extras))
    assert outs[0] == outs[1]


def test_grid_composed_charges_include_the_score() -> None:
    s = GridSearchComposed({**GRID, "noise_multiplier": 1.5}, **{**KW, "budget": PrivacyBudget(20.0, 1e-5)})
    train = SubsampledGaussian(1.5, 0.01, 100)
    assert s.composed_mechanism() == Composition(
        tuple([Composition((train, Laplace(DEFAULT_SCORE_EPSILON)))] * 3))
    c0 = s.suggest("t0")
    assert isinstance(c0, dict) and c0["raydp"].score_epsilon == DEFAULT_SCORE_EPSILON
    public = GridSearchComposed({**GRID, "noise_multiplier": 1.5}, score_epsilon=None,
                                **{**KW, "budget": PrivacyBudget(20.0, 1e-5)})
    assert public.composed_mechanism() == Composition((train,) * 3)  # the old plan
    # calibrated: the score parts are part of the composition that must fit
    a, b = GridSearchComposed(GRID, **KW), GridSearchComposed(GRID, score_epsilon=None, **KW)
    assert a._sigma > b._sigma  # type: ignore[operator]  # noqa: SLF001
    assert epsilon(a.composed_mechanism(), BUDGET.delta, Accountant.RDP) <= BUDGET.epsilon


def test_grid_composed_calibrates_whole_grid_and_stops_on_refusal() -> None:
    s = GridSearchComposed(GRID, **KW)
    comp = s.composed_mechanism()
    assert len(comp.mechanisms) == 3 and s.privacy_plan().mechanism is None
    assert epsilon(comp, BUDGET.delta, Accountant.RDP) <= BUDGET.epsilon
    c0 = s.suggest("t0")
    assert isinstance(c0, dict) and c0["raydp"].charge is True
    complete(s, "t0", {"acc": 0.4})
    s.suggest("t1")
    s.on_trial_complete("t1", None, error=True)  # the ledger refused it
    assert s.suggest("t2") == Searcher.FINISHED
    assert s.release().trial_id == "t0"


def test_one_shot_plan_is_one_run_at_the_budget() -> None:
    s = OneShotRandomSearch({"lr": tune.loguniform(1e-3, 1), "epochs": 2, "sample_rate": 0.01}, **KW)
    plan = s.privacy_plan()
    assert isinstance(plan.mechanism, SubsampledGaussian) and plan.mechanism.steps == 200
    # no selection reads the single run's score: no Laplace part, no noisy score
    public = OneShotRandomSearch({"lr": tune.loguniform(1e-3, 1), "epochs": 2,
                                  "sample_rate": 0.01}, score_epsilon=None, **KW)
    assert public.privacy_plan().mechanism == plan.mechanism
    cfg = s.suggest("t0")
    assert isinstance(cfg, dict) and cfg["raydp"].score_epsilon is None
    assert 0.99 * BUDGET.epsilon <= s.plan_epsilon() <= BUDGET.epsilon  # σ tolerance 1e-3
    with pytest.raises(SearchSpaceError, match="'epochs'.*continuous"):
        OneShotRandomSearch({"epochs": tune.uniform(1, 2), "sample_rate": 0.01}, **KW)


def test_custom_admissible_rule_is_used() -> None:
    def strict(m: object) -> bool:
        return epsilon(m, BUDGET.delta, Accountant.RDP) <= 1.0  # type: ignore[arg-type]

    s = OneShotRandomSearch({"epochs": 1, "sample_rate": 0.01}, admissible=strict, **KW)
    assert s.plan_epsilon() <= 1.0
