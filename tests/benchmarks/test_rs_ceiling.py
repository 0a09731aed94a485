"""The estimators of ``benchmarks/rs_ceiling.py`` on hand-made cells (no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import privacy_utility as pu  # noqa: E402
import rs_ceiling as rc  # noqa: E402


def test_lr_grid_holds_the_benchmarks_oracle_grid() -> None:
    size = pu.sizing("default")
    lrs = rc.lr_grid(*size["lr_range"])
    assert len(lrs) == 25 and lrs[0] == size["lr_range"][0] and lrs[-1] == size["lr_range"][1]
    assert all(g in lrs for g in size["grid"])


@pytest.mark.parametrize(("law", "mean"), [("geometric", 10.0), ("logarithmic", 5.0),
                                           ("poisson", 3.0)])
def test_k_table_is_the_searchers_law(law: str, mean: float) -> None:
    ks, pmf = rc._k_table(law, mean)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert float(ks @ pmf) == pytest.approx(mean, rel=1e-6)  # the tail cut is < 1e-9


def test_simulated_equals_perfect_without_seed_luck_or_score_noise() -> None:
    # every seed of an lr gives the same accuracy and the score is (almost) exact: the
    # selection finds the best of the K draws, which is the perfect-search figure
    curve = np.linspace(0.1, 0.5, 9)
    val = test = np.repeat(curve[:, None], 3, axis=1)
    ks, pmf = rc._k_table("geometric", 4.0)
    acc, perfect, p0 = rc.simulate(val, test, ks, pmf, 1e-12, np.random.default_rng(0), 20_000)
    assert acc == pytest.approx(perfect, abs=1e-12)
    assert p0 == 0.0
    # E[max of K uniform draws] by the exact formula, K from the same table
    n = len(curve)
    exact = sum(p * sum(curve[i] * (((i + 1) / n) ** k - (i / n) ** k) for i in range(n))
                for k, p in zip(ks, pmf, strict=True) if k >= 1)
    assert perfect == pytest.approx(exact, abs=0.003)  # Monte Carlo, 20000 draws


def test_one_draw_releases_the_mean_cell() -> None:
    rng = np.random.default_rng(1)
    val, test = rng.random((5, 4)), rng.random((5, 4))
    ks, pmf = np.array([1]), np.array([1.0])  # K = 1 always
    acc, _, _ = rc.simulate(val, test, ks, pmf, 0.05, rng, 40_000)
    assert acc == pytest.approx(test.mean(), abs=0.006)  # SE ≈ 0.29/√40000 = 0.0015


def test_k_zero_releases_nothing_and_is_counted() -> None:
    val = test = np.full((3, 2), 0.4)
    acc, _, p0 = rc.simulate(val, test, np.array([0, 1]), np.array([0.25, 0.75]), 0.01,
                             np.random.default_rng(2), 40_000)
    assert p0 == pytest.approx(0.25, abs=0.01)
    assert acc == pytest.approx(0.4)  # the mean is over the draws that released a model


def test_oracle_takes_the_test_accuracy_of_the_best_validation_point() -> None:
    val = np.array([[0.2, 0.2], [0.6, 0.6], [0.4, 0.4]])
    test = np.array([[0.9, 0.9], [0.3, 0.5], [0.1, 0.1]])
    got = rc.oracle(val, test, [0, 1, 2], np.random.default_rng(3), 40_000)
    assert got == pytest.approx(0.4, abs=0.01)  # point 1, its two seeds equally likely
    assert rc.oracle(val, test, [0, 2], np.random.default_rng(3), 100) == pytest.approx(0.1)
