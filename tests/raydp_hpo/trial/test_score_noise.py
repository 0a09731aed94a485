"""The selection score's noise: Laplace (default) or analytic-Gaussian (raydp_hpo.trial.privacy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ray import tune

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian, gaussian_delta
from raydp_hpo.accounting.mechanisms import Composition, Gaussian, Laplace, SubsampledGaussian
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers import make_searcher
from raydp_hpo.trial.privacy import ScoreNoise, ScoreRelease, trial_mechanism
from raydp_hpo.trial.settings import RaydpSettings

EPS_S, DELTA_S = 0.1, 1e-6


def test_gaussian_release_is_the_analytic_gaussian_mechanism() -> None:
    """σ_s is calibrate_analytic_gaussian(ε_s, δ_s) at sensitivity 1, the declared mechanism
    is Gaussian(σ_s), and that one release is (ε_s, δ_s)-DP and tight: the exact δ(ε_s; σ_s)
    (Balle & Wang 2018, Thm. 8) is within 1e-6 relative below δ_s, and dp-accounting's PLD ε at
    δ_s is ε_s up to its discretisation (2 %)."""
    r = ScoreRelease(EPS_S, ScoreNoise.GAUSSIAN, DELTA_S)
    sigma = calibrate_analytic_gaussian(EPS_S, DELTA_S)
    assert r.scale == sigma
    assert r.mechanism() == Gaussian(sigma, 1)
    assert r.mechanism(7) == Gaussian(sigma, 7)
    assert DELTA_S * (1 - 1e-6) <= gaussian_delta(sigma, EPS_S) <= DELTA_S
    assert epsilon(r.mechanism(), DELTA_S, Accountant.PLD) == pytest.approx(EPS_S, rel=0.02)
    assert trial_mechanism(SubsampledGaussian(1.0, 0.01, 100), r) == Composition(
        (SubsampledGaussian(1.0, 0.01, 100), Gaussian(sigma)))


def test_laplace_release_is_the_default_and_unchanged() -> None:
    r = ScoreRelease(EPS_S)
    assert r.noise is ScoreNoise.LAPLACE and r.delta is None
    assert r.scale == 1 / EPS_S and r.mechanism() == Laplace(EPS_S)
    # a float keeps meaning a Laplace score (every existing call site)
    training = SubsampledGaussian(1.0, 0.01, 100)
    assert trial_mechanism(training, EPS_S) == trial_mechanism(training, r)


@pytest.mark.parametrize("noise", [ScoreNoise.LAPLACE, ScoreNoise.GAUSSIAN])
def test_draws_have_the_declared_distribution(noise: ScoreNoise) -> None:
    """What draw() adds is the declared noise: sd σ_s (Gaussian) or mean |x| = 1/ε_s (Laplace),
    with the kurtosis of that law (3 vs 6), over 40,000 draws (tolerances ≈ 5 standard
    errors)."""
    r = ScoreRelease(EPS_S, noise, DELTA_S if noise is ScoreNoise.GAUSSIAN else None)
    rng = np.random.default_rng(0)
    x = np.array([r.draw(rng) for _ in range(40_000)])
    assert abs(x.mean()) < 5 * x.std() / math.sqrt(len(x))
    kurtosis = float(np.mean(x**4) / np.mean(x**2) ** 2)
    if noise is ScoreNoise.GAUSSIAN:
        assert x.std() == pytest.approx(r.scale, rel=0.02)
        assert kurtosis == pytest.approx(3.0, abs=0.15)
    else:
        assert np.abs(x).mean() == pytest.approx(1 / EPS_S, rel=0.03)
        assert kurtosis == pytest.approx(6.0, abs=0.8)


def test_many_scored_releases_compose_tighter_with_gaussian() -> None:
    """At equal per-release ε_s = 0.1 (Gaussian at δ_s = 1e-6: σ_s = 36.30), 50 score releases
    cost ε = 3.00 (Laplace) vs 0.77 (Gaussian) under RDP at δ = 1e-5 — the Gaussian composes
    through its RDP α/(2σ²) (Mironov 2017, Prop. 7), the Laplace score through its Prop. 6 RDP."""
    sigma = ScoreRelease(EPS_S, ScoreNoise.GAUSSIAN, DELTA_S).scale
    assert sigma == pytest.approx(36.3047, abs=1e-4)
    lap = epsilon(Laplace(EPS_S, 50), 1e-5, Accountant.RDP)
    gau = epsilon(Gaussian(sigma, 50), 1e-5, Accountant.RDP)
    assert lap == pytest.approx(2.998, abs=0.01)
    assert gau == pytest.approx(0.772, abs=0.01)
    # the Gaussian's RDP at order α is exactly 50·α/(2σ²): ε(δ) ≤ min_α 50α/(2σ²) + ln(1/δ)/(α−1)
    closed = min(50 * a / (2 * sigma**2) + math.log(1 / 1e-5) / (a - 1)
                 for a in np.linspace(1.5, 400, 20_000))
    assert gau <= closed + 1e-9


def test_grid_plan_is_cheaper_with_gaussian_scores() -> None:
    """A 50-point grid (each trial σ = 5, q = 0.01, 1 epoch, plus a score at ε_s = 0.1):
    the composed plan costs ε = 3.08 under RDP at δ = 1e-5 with Laplace scores and 0.98 with
    Gaussian scores at δ_s = 1e-6; the training part alone is the same in both."""
    space = {"lr": tune.choice([10 ** (-3 + 3 * i / 49) for i in range(50)]), "epochs": 1,
             "sample_rate": 0.01, "noise_multiplier": 5.0}
    common = dict(param_space=space, metric="acc", dataset_size=10_000,
                  budget=PrivacyBudget(100.0, 1e-5), seed=0, score_epsilon=EPS_S)
    lap = make_searcher("grid_composed", **common)
    gau = make_searcher("grid_composed", score_noise="gaussian", score_delta=DELTA_S, **common)
    eps_lap = epsilon(lap.composed_mechanism(), 1e-5, Accountant.RDP)
    eps_gau = epsilon(gau.composed_mechanism(), 1e-5, Accountant.RDP)
    assert eps_lap == pytest.approx(3.080, abs=0.01)
    assert eps_gau == pytest.approx(0.976, abs=0.01)
    assert gau.score_release == ScoreRelease(EPS_S, ScoreNoise.GAUSSIAN, DELTA_S)


def test_plan_description_names_the_score_noise() -> None:
    space = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
    s = make_searcher("random_stopping", param_space=space, metric="acc", dataset_size=1000,
                      budget=PrivacyBudget(3.0, 1e-5), mean=3, score_epsilon=EPS_S,
                      score_noise="gaussian", score_delta=DELTA_S)
    assert "Gaussian(ε_s=0.1, δ_s=1e-06: σ_s=36.3)" in s.privacy_plan().description


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"noise": "gauss"}, "unknown score_noise 'gauss'"),
        ({"noise": ScoreNoise.GAUSSIAN}, "needs score_delta"),
        ({"noise": ScoreNoise.LAPLACE, "delta": 1e-6}, "only applies to score_noise='gaussian'"),
        ({"noise": ScoreNoise.GAUSSIAN, "delta": 0.0}, "score_delta must be in (0, 1)"),
        ({"noise": ScoreNoise.GAUSSIAN, "delta": 1.0}, "score_delta must be in (0, 1)"),
        ({"noise": ScoreNoise.GAUSSIAN, "delta": math.nan}, "score_delta"),
        ({"noise": ScoreNoise.GAUSSIAN, "delta": "1e-6"}, "score_delta"),
        ({"noise": ScoreNoise.GAUSSIAN, "delta": True}, "score_delta"),
    ],
)
def test_bad_score_noise_values_are_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(InvalidParameterError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ScoreRelease(EPS_S, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"score_noise": "gaussian"}, "needs score_delta"),
        ({"score_noise": "uniform"}, "unknown score_noise"),
        ({"score_delta": 1e-6}, "only applies"),
        ({"score_noise": "gaussian", "score_delta": 2.0}, "score_delta must be in"),
        ({"score_noise": "gaussian", "score_delta": 1e-6, "score_epsilon": None},
         "needs score_epsilon"),
    ],
)
def test_searcher_refuses_bad_score_noise(kwargs: dict, words: str) -> None:
    """make_searcher refuses before it exists (nothing to leave half-changed)."""
    space = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01}
    with pytest.raises(InvalidParameterError, match=words):
        make_searcher("random_stopping", param_space=space, metric="acc", dataset_size=1000,
                      budget=PrivacyBudget(3.0, 1e-5), mean=3, **kwargs)


def test_raydp_block_carries_and_validates_the_score_noise() -> None:
    block = RaydpSettings.from_config(
        {"raydp": {"score_epsilon": 0.5, "score_noise": "gaussian", "score_delta": 1e-6}})
    assert block.score_release == ScoreRelease(0.5, ScoreNoise.GAUSSIAN, 1e-6)
    assert RaydpSettings(score_epsilon=0.5).score_release == ScoreRelease(0.5)
    assert RaydpSettings().score_release is None
    with pytest.raises(InvalidParameterError, match="needs score_delta"):
        RaydpSettings(score_epsilon=0.5, score_noise="gaussian")
    with pytest.raises(InvalidParameterError, match="need raydp.score_epsilon"):
        RaydpSettings(score_noise="gaussian", score_delta=1e-6)
    with pytest.raises(InvalidParameterError, match="unknown raydp.score_noise"):
        RaydpSettings(score_epsilon=0.5, score_noise="cauchy")
