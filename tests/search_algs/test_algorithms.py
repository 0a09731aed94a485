"""Per-algorithm tests: each plan equals its paper's accounting; errors are clear."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from ray import tune
from ray.tune.search import Searcher

from raydp_hpo.accounting import Accountant, epsilon
from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.mechanisms import (
    SubsampledGaussian,
    WorstCase,
)
from raydp_hpo.rdp import DEFAULT_ORDERS, koskela_kulkarni_rdp, rdp_profile, repeat_and_select_rdp
from search_algs import (
    RandomStoppingSearch,
    SubsampledTransferSearch,
)
from search_algs.random_stopping import sample_stopping_k, stopping_pmf

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
KW = dict(metric="acc", dataset_size=N, budget=BUDGET, seed=1)
FIXED = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01,
         "noise_multiplier": 1.2}


# ----------------------------------------------------------------- random stopping

def test_random_stopping_equals_dp_accounting_repeat_and_select() -> None:
    s = RandomStoppingSearch(FIXED, mean=4, **KW)
    base = SubsampledGaussian(1.2, 0.01, 100)
    assert s.privacy_plan().base == base
    acc = rdp_lib.RdpAccountant(orders=list(DEFAULT_ORDERS))
    event = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.2))
    acc.compose(dp_event.RepeatAndSelectDpEvent(dp_event.SelfComposedDpEvent(event, 100), 4, 1))
    expected = acc.get_epsilon(BUDGET.delta)
    got = epsilon(s.privacy_plan().mechanism, BUDGET.delta, Accountant.RDP)  # type: ignore[arg-type]
    assert got == pytest.approx(expected, rel=1e-6)  # tolerance: SG RDP golden-tested to 1e-9


def test_random_stopping_worst_case_over_privacy_grid() -> None:
    space = {**FIXED, "sample_rate": tune.choice([0.01, 0.02]), "epochs": tune.grid_search([1, 2])}
    s = RandomStoppingSearch(space, mean=2, **{**KW, "budget": PrivacyBudget(20.0, 1e-5)})
    base = s.privacy_plan().base
    assert isinstance(base, WorstCase) and len(base.candidates) == 4
    np.testing.assert_array_equal(
        rdp_profile(s.privacy_plan().mechanism).values,  # type: ignore[arg-type]
        repeat_and_select_rdp(rdp_profile(base).values, 2.0, 1.0),
    )


def test_random_stopping_calibrates_noise_to_budget() -> None:
    s = RandomStoppingSearch({"lr": 0.1, "epochs": 1, "sample_rate": 0.01}, mean=5, **KW)
    eps = s.plan_epsilon()
    assert eps <= BUDGET.epsilon
    assert eps >= 0.97 * BUDGET.epsilon  # σ within 1e-3 relative: ε is not far below


def test_secret_k_not_in_configs_and_k_trials_run() -> None:
    s = RandomStoppingSearch(FIXED, mean=6, **KW)
    k = s._k  # noqa: SLF001 - test inspects the secret
    n = 0
    while (cfg := s.suggest(f"t{n}")) != Searcher.FINISHED:
        assert isinstance(cfg, dict)
        text = json.dumps(cfg, default=str)
        assert "\"k\"" not in text.lower() and "num_trials" not in text
        s.on_trial_complete(f"t{n}", {"acc": 0.1 * n})
        n += 1
    assert n == k
    rel = s.release()
    assert rel.trial_id == f"t{k - 1}" and "raydp" not in rel.hyperparameters  # type: ignore[operator]
    assert "k" not in rel.extras and "num_trials" not in rel.extras


@pytest.mark.parametrize(
    ("dist", "shape"),
    [("geometric", None), ("logarithmic", None), ("truncated_negative_binomial", 0.5),
     ("truncated_negative_binomial", 2.0), ("poisson", None)],
)
def test_stopping_sampler_matches_pmf(dist: str, shape: float | None) -> None:
    rng = np.random.default_rng(0)
    mean = 4.0
    ks = np.array([sample_stopping_k(rng, dist, mean, shape) for _ in range(20_000)])
    # mean within 5 standard errors
    assert abs(ks.mean() - mean) < 5 * ks.std() / math.sqrt(len(ks))
    total = sum(stopping_pmf(k, dist, mean, shape) for k in range(0, 400))
    assert total == pytest.approx(1.0, abs=1e-9)
    for k in (1, 2, 5):  # empirical frequencies within 0.01 of the pmf
        assert (ks == k).mean() == pytest.approx(stopping_pmf(k, dist, mean, shape), abs=0.01)
    if dist != "poisson":
        assert ks.min() >= 1


def test_poisson_k_zero_selects_nothing() -> None:
    for seed in range(200):
        s = RandomStoppingSearch(FIXED, distribution="poisson", mean=1.0, **{**KW, "seed": seed})
        if s._k == 0:  # noqa: SLF001
            assert s.suggest("t0") == Searcher.FINISHED
            rel = s.release()
            assert not rel.selected and rel.trial_id is None and "no configuration" in rel.extras["reason"]
            return
    pytest.fail("no seed gave K = 0 (probability e^-1 each)")


def test_continuous_privacy_domain_refused() -> None:
    with pytest.raises(SearchSpaceError, match="'noise_multiplier'.*continuous"):
        RandomStoppingSearch({**FIXED, "noise_multiplier": tune.uniform(1, 2)}, **KW)
    with pytest.raises(SearchSpaceError, match="'epochs'"):
        RandomStoppingSearch({"lr": 0.1, "sample_rate": 0.01}, **KW)
    with pytest.raises(SearchSpaceError, match="sample_from"):
        RandomStoppingSearch({**FIXED, "x": tune.sample_from(lambda _: 1)}, **KW)


def test_budget_too_small_states_the_smallest_budget() -> None:
    with pytest.raises(InvalidParameterError, match=r"at least ε=\d"):
        RandomStoppingSearch({**FIXED, "noise_multiplier": 0.5}, mean=10, **KW)


# ----------------------------------------------------------------- subsampled transfer

def test_subsampled_transfer_plan_equals_koskela_kulkarni() -> None:
    s = SubsampledTransferSearch(FIXED, subsample_rate=0.1, mean=5, **KW)
    base = SubsampledGaussian(1.2, 0.01, 100)
    tuning = repeat_and_select_rdp(rdp_profile(base).values, 5.0, 1.0)
    expected = koskela_kulkarni_rdp(tuning, rdp_profile(base).values, 0.1)
    got = rdp_profile(s.privacy_plan().mechanism).values  # type: ignore[arg-type]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert s.plan_epsilon() <= BUDGET.epsilon
    ex = s.release().extras
    assert ex["paper_bound_gradient_evaluations"] == pytest.approx((5 * 0.1 * N + N) * 1)
    assert ex["random_stopping_full_data_gradient_evaluations"] == pytest.approx(5 * N * 1)


def _run_transfer(optimizer: str) -> tuple[list[dict], dict]:
    s = SubsampledTransferSearch({**FIXED, "optimizer": optimizer}, subsample_rate=0.1, mean=3, **KW)
    tuning: list[dict] = []
    i = 0
    while True:
        cfg = s.suggest(f"t{i}")
        if cfg is None:  # waiting for live trials: complete them
            for j, c in enumerate(tuning):
                s.on_trial_complete(f"t{j}", {"acc": c["lr"]})
            continue
        assert isinstance(cfg, dict)
        if cfg["raydp"]["phase"] == "final":
            assert s.suggest("x") == Searcher.FINISHED
            return tuning, cfg
        tuning.append(cfg)
        i += 1


@pytest.mark.parametrize(("optimizer", "factor"), [("sgd", 10.0), ("momentum", 10.0), ("adam", 1.0)])
def test_subsampled_transfer_lr_rule_and_views(optimizer: str, factor: float) -> None:
    tuning, final = _run_transfer(optimizer)
    assert all(c["raydp"]["data_view"]["kind"] == "subsample" for c in tuning)
    view = final["raydp"]["data_view"]
    assert view["kind"] == "complement" and view["seed"] == tuning[0]["raydp"]["data_view"]["seed"]
    best = max(tuning, key=lambda c: c["lr"])
    assert final["lr"] == pytest.approx(best["lr"] * factor, rel=1e-12)  # x n/m = 1/q, or x 1
    for key in ("noise_multiplier", "sample_rate", "epochs"):
        assert final[key] == best[key]  # sigma, gamma and steps unchanged


def test_subsampled_transfer_refuses_batch_size() -> None:
    with pytest.raises(SearchSpaceError, match="sample_rate"):
        SubsampledTransferSearch({"lr": 0.1, "epochs": 1, "batch_size": 100}, **KW)
    with pytest.raises(InvalidParameterError, match="subsample_rate"):
        SubsampledTransferSearch(FIXED, subsample_rate=1.0, **KW)
