"""Client-level DP for federated averaging (raydp_hpo.trainables.federated: ClientDP, dp_fed_avg)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.gdp import gdp_epsilon
from raydp_hpo.accounting.mechanisms import Gaussian
from raydp_hpo.errors import BudgetExhaustedError, InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.data import Dataset, DataSplits
from raydp_hpo.trainables.federated import (
    CHECKPOINT_NAME,
    ClientDP,
    FedSettings,
    dp_fed_avg,
    pathological_split,
    run_federated,
)

SMALL = {"hidden": (8,)}



@pytest.fixture(scope="module")
def small_shards(digits: DataSplits) -> list[Dataset]:
    parts = pathological_split(digits.train.labels, 3, 0.5, np.random.default_rng(0))
    return [digits.train.subset(p[:60]) for p in parts]


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _state(w: float, b: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 2), w, dtype=torch.float64),
            "b": torch.full((2,), b, dtype=torch.float64), "steps": torch.tensor(3)}


def test_dp_fed_avg_clips_each_update_and_averages_unweighted() -> None:
    """Update 1 has norm √(4·3² + 2·0²) = 6 and is clipped to C = 1 (scaled by 1/6); update 2
    has norm √(4·0.1²) = 0.2 and is kept; the result is θ + (Δ̃₁ + Δ̃₂)/2 up to noise of
    sd σC/K = 1e-9·1/2."""
    g = _state(0.0, 0.0)
    dp = ClientDP(1.0, 1e-9, num_clients=2)
    out = dp_fed_avg(g, [_state(3.0, 0.0), _state(0.1, 0.0)], dp, _g())
    expected_w = (3.0 / 6.0 + 0.1) / 2
    assert torch.allclose(out["w"], torch.full((2, 2), expected_w, dtype=torch.float64),
                          atol=1e-7)
    assert torch.allclose(out["b"], torch.zeros(2, dtype=torch.float64), atol=1e-7)
    assert torch.equal(out["steps"], torch.tensor(3))


def test_dp_fed_avg_noise_has_sd_sigma_c_over_k() -> None:
    """No update at all: the change of every coordinate is N(0, (σC/K)²); σ = 2, C = 0.5,
    K = 4 → sd 0.25 (40,000 coordinates, 3 % tolerance ≈ 8 standard errors)."""
    g = {"w": torch.zeros(200, 200)}
    out = dp_fed_avg(g, [g] * 4, ClientDP(0.5, 2.0, num_clients=4), _g(1))
    x = out["w"].double().flatten()
    assert float(x.std()) == pytest.approx(0.25, rel=0.03)
    assert abs(float(x.mean())) < 5 * 0.25 / 200


def test_dp_fed_avg_divides_by_the_declared_number_of_clients_not_the_realised_one() -> None:
    """Neighbouring federations differ by one client. Dividing the noisy sum by the realised
    number of clients made the noise's scale differ between them (σC/4 vs σC/5 here): over
    40,000 coordinates that tells the two apart every time, whatever ε is claimed. With the
    declared K a client whose update is 0 changes nothing: identical releases."""
    g = {"w": torch.zeros(200, 200)}
    dp = ClientDP(0.5, 2.0, num_clients=4)
    four = dp_fed_avg(g, [g] * 4, dp, _g(1))
    five = dp_fed_avg(g, [g] * 5, dp, _g(1))
    assert torch.equal(four["w"], five["w"])


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_dp_fed_avg_a_non_finite_update_adds_exactly_nothing(bad: float) -> None:
    """A diverged client (inf or NaN in its state) contributes 0, like a client that did not
    move: with the same noise draw the released state is the same. Before, it was NaN if and
    only if that client took part."""
    g = _state(0.0, 0.0)
    diverged = _state(bad, 0.0)
    still = _state(0.0, 0.0)
    dp = ClientDP(1.0, 0.5, num_clients=2)
    with_bad = dp_fed_avg(g, [_state(3.0, 0.0), diverged], dp, _g(4))
    without = dp_fed_avg(g, [_state(3.0, 0.0), still], dp, _g(4))
    for key in ("w", "b"):
        assert bool(torch.isfinite(with_bad[key]).all())
        assert torch.equal(with_bad[key], without[key])


def test_client_dp_refuses_bad_values() -> None:
    for bad in (0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(InvalidParameterError, match="clip_norm"):
            ClientDP(bad, 1.0, 3)  # type: ignore[arg-type]
        with pytest.raises(InvalidParameterError, match="noise_multiplier"):
            ClientDP(1.0, bad, 3)  # type: ignore[arg-type]
    for bad_k in (0, -2, 2.5, True, "3", None):
        with pytest.raises(InvalidParameterError, match="num_clients"):
            ClientDP(1.0, 1.0, bad_k)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="client_dp must be a ClientDP"):
        FedSettings(client_dp={"clip_norm": 1.0})  # type: ignore[arg-type]


def test_mechanism_and_its_epsilon() -> None:
    """R rounds at noise multiplier σ are Gaussian(σ, R): exactly (√R/σ)-GDP (Dong, Roth & Su
    2022, Cor. 3.3). σ = 2, R = 10: μ = 1.5811; the exact ε at δ = 1e-5, the root of
    Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ (their Cor. 2.13) found here with scipy, is 7.5113;
    raydp-hpo's GDP figure matches it to 1e-6, PLD to 1e-4 and the RDP figure the ledger
    halts on (8.083) is an upper bound within 8 % of it."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    mech = ClientDP(1.0, 2.0, num_clients=5).mechanism(10)
    assert mech == Gaussian(2.0, 10)
    mu = math.sqrt(10) / 2.0
    exact = brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)
                   - 1e-5, 0.01, 50.0, xtol=1e-12)
    assert exact == pytest.approx(7.5113, abs=1e-4)
    assert gdp_epsilon(mu, 1e-5) == pytest.approx(exact, abs=1e-6)
    assert epsilon(mech, 1e-5, Accountant.PLD) == pytest.approx(exact, abs=1e-4)
    rdp = epsilon(mech, 1e-5, Accountant.RDP)
    assert exact <= rdp <= 1.08 * exact


def test_private_run_is_charged_before_it_runs(
    digits: DataSplits, small_shards: list[Dataset], tmp_path: Path
) -> None:
    settings = FedSettings(rounds=2, batch_size=20, model_kwargs=SMALL,
                           client_dp=ClientDP(clip_norm=1.0, noise_multiplier=2.0,
                                              num_clients=3))
    # no ledger: refused before anything runs
    with pytest.raises(InvalidParameterError, match="needs a ledger"):
        run_federated(small_shards, digits.test, settings, seed=0, checkpoint_dir=tmp_path)
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    # a budget too small: refused, the ledger unchanged, nothing ran
    tiny = PrivacyLedger(PrivacyBudget(1.0, 1e-5))
    with pytest.raises(BudgetExhaustedError):
        run_federated(small_shards, digits.test, settings, seed=0, checkpoint_dir=tmp_path,
                      ledger=tiny, charge_id="fed/run")
    assert tiny.charges() == () and not (tmp_path / CHECKPOINT_NAME).exists()
    # admitted: one charge Gaussian(σ, R) before round 1, then the rounds
    ledger = PrivacyLedger(PrivacyBudget(20.0, 1e-5))
    seen: list[int] = []
    result = run_federated(small_shards, digits.test, settings, seed=0,
                           checkpoint_dir=tmp_path, ledger=ledger, charge_id="fed/run",
                           noise_seed=11, on_round=lambda r, _: seen.append(len(ledger.charges())))
    (charge,) = ledger.charges()
    assert charge.charge_id == "fed/run" and charge.mechanism == Gaussian(2.0, 2)
    assert seen == [1, 1]  # charged before round 1 ran
    assert len(result.accuracy) == 3
    # resuming the finished run replays the charge (not paid twice)
    again = run_federated(small_shards, digits.test, settings, seed=0, checkpoint_dir=tmp_path,
                          ledger=ledger, charge_id="fed/run", noise_seed=11)
    assert len(ledger.charges()) == 1 and again.accuracy == result.accuracy
    # a fresh run (no checkpoint) under a used id would spend unpaid: refused
    with pytest.raises(RayDPHPOError, match="already on the ledger"):
        run_federated(small_shards, digits.test, settings, seed=0, ledger=ledger,
                      charge_id="fed/run")
    # a non-private run with a ledger is a mistake, not silently ignored
    with pytest.raises(InvalidParameterError, match="client_dp is None"):
        run_federated(small_shards, digits.test, FedSettings(rounds=1, model_kwargs=SMALL),
                      seed=0, ledger=ledger, charge_id="x")


def test_adding_a_client_whose_update_is_zero_changes_no_released_model(
    digits: DataSplits, small_shards: list[Dataset]
) -> None:
    """End to end on neighbouring federations: D = 3 clients, D' = D plus a client with 30
    records (fewer than two batches of 20, so ADADP makes no local step and its update is
    exactly 0). Same public seed, same secret noise seed: every released global model must
    be the same, since the added client contributes nothing to the clipped sum and the
    divisor is the declared K = 3. (With the realised count as divisor, D' divided by 4.)"""
    settings = FedSettings(rounds=2, batch_size=20, model_kwargs=SMALL,
                           client_dp=ClientDP(clip_norm=1.0, noise_multiplier=1.0,
                                              num_clients=3))
    idle = digits.train.subset(np.arange(30))

    def run(shards: list[Dataset]) -> dict[str, torch.Tensor]:
        ledger = PrivacyLedger(PrivacyBudget(50.0, 1e-5))
        return run_federated(shards, digits.test, settings, seed=0, ledger=ledger,
                             charge_id="fed", noise_seed=5).state

    d, d_prime = run(small_shards), run([*small_shards, idle])
    assert all(torch.equal(d[k], d_prime[k]) for k in d)


def test_secret_noise_seed_reproduces_and_os_entropy_differs(
    digits: DataSplits, small_shards: list[Dataset]
) -> None:
    """Same public seed and secret noise seed: the same models; no noise seed: fresh OS
    entropy, so two runs differ even with the same public seed."""
    settings = FedSettings(rounds=1, batch_size=20, model_kwargs=SMALL,
                           client_dp=ClientDP(clip_norm=1.0, noise_multiplier=1.0,
                                              num_clients=3))

    def run(charge: str, noise_seed: int | None) -> dict[str, torch.Tensor]:
        ledger = PrivacyLedger(PrivacyBudget(50.0, 1e-5))
        return run_federated(small_shards, digits.test, settings, seed=0, ledger=ledger,
                             charge_id=charge, noise_seed=noise_seed).state

    a, b = run("a", 5), run("b", 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c, d = run("c", None), run("d", None)
    assert any(not torch.equal(c[k], d[k]) for k in c)


def test_every_bit_of_the_noise_seed_matters(
    digits: DataSplits, small_shards: list[Dataset]
) -> None:
    """Noise seeds that agree in their low 32 bits give different noise: torch's CPU
    ``manual_seed`` keeps only those 32 bits, so a noise generator seeded with it has 2³²
    possible streams, few enough to search from a released model."""
    settings = FedSettings(rounds=1, batch_size=20, model_kwargs=SMALL,
                           client_dp=ClientDP(clip_norm=1.0, noise_multiplier=1.0,
                                              num_clients=3))

    def run(charge: str, noise_seed: int) -> dict[str, torch.Tensor]:
        ledger = PrivacyLedger(PrivacyBudget(50.0, 1e-5))
        return run_federated(small_shards, digits.test, settings, seed=0, ledger=ledger,
                             charge_id=charge, noise_seed=noise_seed).state

    a, b = run("a", 5), run("b", 5 + 2**40)
    assert any(not torch.equal(a[k], b[k]) for k in a)
