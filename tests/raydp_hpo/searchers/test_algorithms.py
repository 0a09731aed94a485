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

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Laplace,
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
    SubsampledTuning,
    WorstCase,
    mechanism_from_dict,
)
from raydp_hpo.accounting.rdp import (
    DEFAULT_ORDERS,
    koskela_kulkarni_rdp,
    rdp_profile,
    repeat_and_select_rdp,
)
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.ledger.coverage import is_covered
from raydp_hpo.searchers import (
    RandomStoppingSearch,
    SubsampledTransferSearch,
)
from raydp_hpo.searchers.random_stopping import (
    DEFAULT_DISTRIBUTION,
    DEFAULT_SHAPE,
    sample_stopping_k,
    stopping_pmf,
)
from raydp_hpo.trial.privacy import DEFAULT_SCORE_EPSILON, trial_mechanism
from tests.raydp_hpo.searchers._results import complete

N = 10_000
BUDGET = PrivacyBudget(epsilon=3.0, delta=1e-5)
KW = dict(metric="acc", dataset_size=N, budget=BUDGET, seed=1)
FIXED = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01,
         "noise_multiplier": 1.2}


# ----------------------------------------------------------------- random stopping

@pytest.mark.parametrize("law", ["default", "geometric"])
@pytest.mark.parametrize("score_epsilon", [DEFAULT_SCORE_EPSILON, 0.5, None])
def test_random_stopping_equals_dp_accounting_repeat_and_select(
    score_epsilon: float | None, law: str,
) -> None:
    """P&S's base Q outputs model AND score: Q = training ∘ Laplace(ε_s) (None: training).
    The default law (no ``distribution`` given) and the geometric law given explicitly."""
    given = {} if law == "default" else {"distribution": "geometric"}
    s = RandomStoppingSearch(FIXED, mean=4, score_epsilon=score_epsilon, **given, **KW)
    train = SubsampledGaussian(1.2, 0.01, 100)
    base = train if score_epsilon is None else Composition((train, Laplace(score_epsilon)))
    assert s.privacy_plan().base == base
    expected_plan = (RandomStopping(base, DEFAULT_DISTRIBUTION, 4, DEFAULT_SHAPE) if given == {}
                     else RandomStopping(base, StoppingDistribution.GEOMETRIC, 4))
    assert s.privacy_plan().mechanism == expected_plan
    acc = rdp_lib.RdpAccountant(orders=list(DEFAULT_ORDERS))
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.2)), 100
    )
    if score_epsilon is not None:  # Laplace with sensitivity 1 and scale 1/ε_s
        event = dp_event.ComposedDpEvent([event, dp_event.LaplaceDpEvent(1.0 / score_epsilon)])
    # dp-accounting's shape: η of the truncated negative binomial (1 geometric, ∞ Poisson)
    acc.compose(dp_event.RepeatAndSelectDpEvent(event, 4, expected_plan.eta))
    expected = acc.get_epsilon(BUDGET.delta)
    got = epsilon(s.privacy_plan().mechanism, BUDGET.delta, Accountant.RDP)  # type: ignore[arg-type]
    assert got == pytest.approx(expected, rel=1e-6)  # tolerance: SG RDP golden-tested to 1e-9


def test_random_stopping_score_part_costs_privacy() -> None:
    with_score = RandomStoppingSearch(FIXED, mean=4, **KW).plan_epsilon()
    public_val = RandomStoppingSearch(FIXED, mean=4, score_epsilon=None, **KW).plan_epsilon()
    assert with_score > public_val
    # calibrated noise: the score part forces more training noise for the same budget
    space = {"lr": 0.1, "epochs": 1, "sample_rate": 0.01}
    a = RandomStoppingSearch(space, mean=5, **KW)
    b = RandomStoppingSearch(space, mean=5, score_epsilon=None, **KW)
    assert a._calibrated_sigma > b._calibrated_sigma  # type: ignore[operator]  # noqa: SLF001
    assert a.plan_epsilon() <= BUDGET.epsilon and b.plan_epsilon() <= BUDGET.epsilon
    cfg = a.suggest("t0")
    assert isinstance(cfg, dict) and cfg["raydp"].score_epsilon == DEFAULT_SCORE_EPSILON


def test_random_stopping_worst_case_over_privacy_grid() -> None:
    space = {**FIXED, "sample_rate": tune.choice([0.01, 0.02]), "epochs": tune.grid_search([1, 2])}
    s = RandomStoppingSearch(space, mean=2, **{**KW, "budget": PrivacyBudget(20.0, 1e-5)})
    base = s.privacy_plan().base
    assert isinstance(base, Composition)
    worst, score = base.mechanisms
    assert isinstance(worst, WorstCase) and len(worst.candidates) == 4
    assert score == Laplace(DEFAULT_SCORE_EPSILON)
    # every grid point's declared trial mechanism is covered by the base
    for p in s._privacies():  # noqa: SLF001
        assert is_covered(trial_mechanism(p.mechanism(), DEFAULT_SCORE_EPSILON), base)
    # the score part is really in the base: the worst candidate with a larger score is not
    assert not is_covered(trial_mechanism(worst, 2 * DEFAULT_SCORE_EPSILON), base)
    np.testing.assert_array_equal(
        rdp_profile(s.privacy_plan().mechanism).values,  # type: ignore[arg-type]
        repeat_and_select_rdp(rdp_profile(base).values, 2.0,  # the default law's η
                              RandomStopping(base, DEFAULT_DISTRIBUTION, 2.0, DEFAULT_SHAPE).eta),
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
        complete(s, f"t{n}", {"acc": 0.1 * n})
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

@pytest.mark.parametrize("score_epsilon", [DEFAULT_SCORE_EPSILON, None])
def test_subsampled_transfer_plan_equals_koskela_kulkarni(score_epsilon: float | None) -> None:
    s = SubsampledTransferSearch(FIXED, subsample_rate=0.1, mean=5, score_epsilon=score_epsilon,
                                 **KW)
    base = SubsampledGaussian(1.2, 0.01, 100)
    tuning_base = trial_mechanism(base, score_epsilon)  # tuning trials release noisy scores
    assert s.privacy_plan().base == tuning_base
    amplified = SubsampledTuning(
        RandomStopping(tuning_base, StoppingDistribution.GEOMETRIC, 5), base, 0.1)
    tuning = repeat_and_select_rdp(rdp_profile(tuning_base).values, 5.0, 1.0)
    expected = koskela_kulkarni_rdp(tuning, rdp_profile(base).values, 0.1)  # final: no score
    if score_epsilon is None:
        assert s.privacy_plan().mechanism == amplified
    else:
        # A validation record is never subsampled: its cost, random stopping over the noisy
        # scores alone, is not amplified; the plan is the worst case of the two kinds of record.
        scores_only = RandomStopping(Laplace(score_epsilon), StoppingDistribution.GEOMETRIC, 5)
        assert s.privacy_plan().mechanism == WorstCase((amplified, scores_only))
        unamplified = repeat_and_select_rdp(rdp_profile(Laplace(score_epsilon)).values, 5.0, 1.0)
        expected = np.maximum(expected, unamplified)
    got = rdp_profile(s.privacy_plan().mechanism).values  # type: ignore[arg-type]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert s.plan_epsilon() <= BUDGET.epsilon
    ex = s.release().extras
    assert ex["paper_bound_gradient_evaluations"] == pytest.approx((5 * 0.1 * N + N) * 1)
    assert ex["random_stopping_full_data_gradient_evaluations"] == pytest.approx(5 * N * 1)


def test_subsampled_transfer_defaults_are_the_studys_choice() -> None:
    """No settings: q = 0.3 with geometric K, E[K] = 10 (``st_q03_k10``, issue #42's study)."""
    s = SubsampledTransferSearch(FIXED, score_epsilon=None, **KW)
    base = SubsampledGaussian(1.2, 0.01, 100)
    assert s.privacy_plan().mechanism == SubsampledTuning(
        RandomStopping(base, StoppingDistribution.GEOMETRIC, 10), base, 0.3)


def _run_transfer(optimizer: str) -> tuple[list[dict], dict]:
    s = SubsampledTransferSearch({**FIXED, "optimizer": optimizer}, subsample_rate=0.1, mean=3, **KW)
    tuning: list[dict] = []
    i = 0
    while True:
        cfg = s.suggest(f"t{i}")
        if cfg is None:  # waiting for live trials: complete them
            for j, c in enumerate(tuning):
                complete(s, f"t{j}", {"acc": c["lr"]})
            continue
        assert isinstance(cfg, dict)
        if cfg["raydp"].phase == "final":
            assert s.suggest("x") == Searcher.FINISHED
            return tuning, cfg
        tuning.append(cfg)
        i += 1


@pytest.mark.parametrize(("optimizer", "factor"), [("sgd", 10.0), ("momentum", 10.0), ("adam", 1.0)])
def test_subsampled_transfer_lr_rule_and_views(optimizer: str, factor: float) -> None:
    tuning, final = _run_transfer(optimizer)
    assert all(c["raydp"].data_view["kind"] == "subsample" for c in tuning)
    assert all(c["raydp"].score_epsilon == DEFAULT_SCORE_EPSILON for c in tuning)
    assert final["raydp"].score_epsilon is None  # no selection reads the final score
    train = SubsampledGaussian(1.2, 0.01, 100)
    assert mechanism_from_dict(final["raydp"].base) == train
    assert mechanism_from_dict(tuning[0]["raydp"].base) == trial_mechanism(
        train, DEFAULT_SCORE_EPSILON)
    view = final["raydp"].data_view
    assert view["kind"] == "complement" and view["seed"] == tuning[0]["raydp"].data_view["seed"]
    best = max(tuning, key=lambda c: c["lr"])
    assert final["lr"] == pytest.approx(best["lr"] * factor, rel=1e-12)  # x n/m = 1/q, or x 1
    for key in ("noise_multiplier", "sample_rate", "epochs"):
        assert final[key] == best[key]  # sigma, gamma and steps unchanged


def test_subsampled_transfer_refuses_batch_size() -> None:
    with pytest.raises(SearchSpaceError, match="sample_rate"):
        SubsampledTransferSearch({"lr": 0.1, "epochs": 1, "batch_size": 100}, **KW)
    with pytest.raises(InvalidParameterError, match="subsample_rate"):
        SubsampledTransferSearch(FIXED, subsample_rate=1.0, **KW)


def test_a_score_not_released_with_its_declared_noise_is_not_read() -> None:
    """A trial that is to release its score at ε_s must say so in its result (the built-in
    trainable does); a raw score (a user trainable reporting its validation accuracy) or one
    released at another ε_s is not selected on: the trial counts as failed."""
    from raydp_hpo.trial.privacy import NOISY_SCORE_KEY

    s = next(x for seed in range(200)
             if (x := RandomStoppingSearch(FIXED, mean=4, **{**KW, "seed": seed}))._k >= 3)
    eps_s = s.suggest("t0")["raydp"].score_epsilon
    assert eps_s is not None
    s.suggest("t1")
    s.suggest("t2")
    s.on_trial_complete("t0", {"acc": 0.99})  # raw
    s.on_trial_complete("t1", {"acc": 0.98, NOISY_SCORE_KEY: eps_s * 10})  # other ε_s
    s.on_trial_complete("t2", {"acc": 0.10, NOISY_SCORE_KEY: eps_s})
    assert s._results == {"t0": None, "t1": None, "t2": 0.10}
