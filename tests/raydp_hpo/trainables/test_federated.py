"""Federated averaging with adaptive (non-private ADADP) client learning rates."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trainables.data import Dataset, DataSplits
from raydp_hpo.trainables.federated import (
    CHECKPOINT_NAME,
    ClientOptimizer,
    FedSettings,
    adadp_step,
    fed_avg,
    pathological_split,
    run_federated,
    run_federated_ray,
)

SMALL = {"hidden": (16,)}



# -- fed_avg --------------------------------------------------------------------------------


def _state(value: float) -> dict[str, torch.Tensor]:
    return {
        "w": torch.full((3, 2), value),
        "b": torch.full((2,), -value, dtype=torch.float64),
        "steps": torch.tensor(7),
    }


def test_fed_avg_of_identical_models_is_the_identity() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    state = model.state_dict()
    out = fed_avg([state, state, state], [5, 1, 100])
    assert out.keys() == state.keys()
    for k in state:
        assert torch.equal(out[k], state[k])


def test_fed_avg_weights_by_client_size() -> None:
    out = fed_avg([_state(1.0), _state(2.0), _state(10.0)], [1, 3, 0])
    assert torch.allclose(out["w"], torch.full((3, 2), (1 + 3 * 2) / 4))
    assert out["b"].dtype == torch.float64
    assert torch.allclose(out["b"], torch.full((2,), -(1 + 3 * 2) / 4, dtype=torch.float64))
    assert int(out["steps"]) == 7  # integer buffers agree and are copied


@pytest.mark.parametrize(
    ("states", "weights"),
    [
        ([], []),
        ([_state(1.0)], [1, 2]),
        ([_state(1.0), _state(2.0)], [0, 0]),
        ([_state(1.0), _state(2.0)], [1, math.nan]),
        ([_state(1.0), _state(2.0)], [1, -1]),
        ([_state(1.0), {"w": torch.zeros(3, 2)}], [1, 1]),
        ([_state(1.0), {**_state(2.0), "steps": torch.tensor(8)}], [1, 1]),
    ],
)
def test_fed_avg_refuses_bad_input(states: list, weights: list) -> None:
    with pytest.raises(InvalidParameterError):
        fed_avg(states, weights)


# -- the pathological split -----------------------------------------------------------------


def _labels(n_per_class: int = 400, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(1).permutation(np.repeat(np.arange(classes), n_per_class))


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 1.0])
def test_split_assigns_every_record_once(p: float) -> None:
    y = _labels()
    parts = pathological_split(y, 5, p, np.random.default_rng(0))
    assert len(parts) == 5
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))


def test_split_is_pathological_at_p0() -> None:
    y = _labels()
    parts = pathological_split(y, 5, 0.0, np.random.default_rng(0))
    for k, idx in enumerate(parts):
        assert set(np.unique(y[idx])) == {2 * k, 2 * k + 1}
        assert len(idx) == 800


def test_split_is_iid_like_at_p1() -> None:
    y = _labels()
    parts = pathological_split(y, 5, 1.0, np.random.default_rng(0))
    for idx in parts:
        assert len(idx) == 800  # dealt round-robin: equal shards
        hist = np.bincount(y[idx], minlength=10) / len(idx)
        # each class has 10 %; a multivariate hypergeometric count of 800 draws has standard
        # deviation < sqrt(800·0.1·0.9) ≈ 8.5 records ≈ 1.1 %: allow 5 %, over 4 sigma
        assert np.all(np.abs(hist - 0.1) < 0.05), hist


def test_split_interpolates() -> None:
    y = _labels()
    p = 0.5
    parts = pathological_split(y, 5, p, np.random.default_rng(0))
    foreign = sum(int(np.sum(y[idx] // 2 != k)) for k, idx in enumerate(parts))
    # round(p·n) random records, each dealt to a client not owning its class w.p. ≈ 4/5
    expected = p * len(y) * 4 / 5
    assert abs(foreign - expected) < 0.05 * expected


@pytest.mark.parametrize(("k", "p"), [(0, 0.5), (11, 0.5), (5, -0.1), (5, 1.5)])
def test_split_refuses_bad_arguments(k: int, p: float) -> None:
    with pytest.raises(InvalidParameterError):
        pathological_split(_labels(), k, p, np.random.default_rng(0))


# -- the ADADP client step ------------------------------------------------------------------


def _softmax_grads(
    w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form gradient of the mean cross-entropy of a linear softmax model."""
    p = torch.softmax(x @ w.T + b, dim=1)
    r = (p - nn.functional.one_hot(y, w.shape[0]).to(p.dtype)) / len(y)
    return r.T @ x, r.sum(0)


def _reference(model: nn.Linear, b1: tuple, b2: tuple, lr: float) -> tuple[list, float]:
    """θ̂_{ℓ+1} and err of Algorithm 2 (no clipping, no noise) by hand."""
    w, b = model.weight.detach().double(), model.bias.detach().double()
    x1, y1 = b1[0].double(), b1[1]
    x2, y2 = b2[0].double(), b2[1]
    gw1, gb1 = _softmax_grads(w, b, x1, y1)
    full = [w - lr * gw1, b - lr * gb1]
    hw, hb = w - lr / 2 * gw1, b - lr / 2 * gb1
    gw2, gb2 = _softmax_grads(hw, hb, x2, y2)
    hat = [hw - lr / 2 * gw2, hb - lr / 2 * gb2]
    err = math.sqrt(
        sum(float((((f - h) / f.abs().clamp(min=1.0)) ** 2).sum()) for f, h in zip(full, hat))
    )
    return hat, err


def _tiny() -> tuple[nn.Linear, tuple, tuple]:
    torch.manual_seed(3)
    model = nn.Linear(4, 3)
    x = torch.randn(16, 4) * 3
    y = torch.randint(0, 3, (16,))
    return model, (x[:8], y[:8]), (x[8:], y[8:])


LRS = (1e-3, 0.057, 0.062, 5.0)  # err ≈ 0.0017, 0.098, 0.107, 2.9 on _tiny()


@pytest.mark.parametrize("lr", LRS)
def test_adadp_step_matches_algorithm_2_with_acceptance(lr: float) -> None:
    model, b1, b2 = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    hat, err = _reference(model, b1, b2, lr)
    out = adadp_step(model, b1, b2, lr, tol=0.1, alpha_min=0.9, alpha_max=1.1)
    assert out.err == pytest.approx(err, rel=1e-4)
    assert out.lr == pytest.approx(min(max(0.1 / err, 0.9), 1.1) * lr, rel=1e-4)
    assert out.accepted == (err < 0.1)
    after = [p.detach() for p in model.parameters()]
    if out.accepted:
        for a, h in zip(after, hat):
            assert torch.allclose(a.double(), h, atol=1e-6)
    else:  # rejected: θ stays θ_ℓ exactly, but η still adapts (shrinks)
        for a, b in zip(after, before):
            assert torch.equal(a, b)
        assert out.lr < lr


def test_adadp_step_covers_both_branches() -> None:
    """The parametrisation above exercises accepted and rejected steps, each both with η
    clamped (α_max, α_min) and with η ← tol/err·η strictly between the clamps."""
    model, b1, b2 = _tiny()
    e0, e1, e2, e3 = (_reference(model, b1, b2, lr)[1] for lr in LRS)
    assert 0.1 / e0 > 1.1 and 1.0 < 0.1 / e1 < 1.1  # accepted
    assert 0.9 < 0.1 / e2 < 1.0 and 0.1 / e3 < 0.9  # rejected


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"optimizer": "adadp"},
        {"lr": 0.0},
        {"lr": math.inf},
        {"rounds": 0},
        {"batch_size": 2.5},
        {"local_epochs": True},
        {"alpha_min": 1.0},
        {"alpha_max": 0.95},
        {"tol": 0.0},
    ],
)
def test_settings_refuse_bad_values(kwargs: dict) -> None:
    with pytest.raises(InvalidParameterError):
        FedSettings(**kwargs)


# -- whole runs on digits -------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(digits: DataSplits) -> list[Dataset]:
    parts = pathological_split(digits.train.labels, 5, 1.0, np.random.default_rng(0))
    return [digits.train.subset(i) for i in parts]


@pytest.mark.parametrize(
    ("optimizer", "lr"),
    [(ClientOptimizer.ADADP, 0.1), (ClientOptimizer.SGD, 0.1), (ClientOptimizer.ADAM, 3e-3)],
)
def test_rounds_on_digits_improve_accuracy(
    digits: DataSplits, shards: list[Dataset], optimizer: ClientOptimizer, lr: float
) -> None:
    settings = FedSettings(
        optimizer=optimizer, lr=lr, rounds=2, batch_size=10, model_kwargs={"hidden": (64,)}
    )
    result = run_federated(shards, digits.test, settings, seed=0)
    assert len(result.accuracy) == 3
    assert result.accuracy[0] < 0.3  # an untrained 10-class model
    assert result.accuracy[-1] > result.accuracy[0] + 0.3
    assert len(result.client_lr) == 2 and len(result.client_lr[0]) == 5
    if optimizer is ClientOptimizer.ADADP:
        assert sum(result.accepted) > 0
        assert result.client_lr[-1] != [lr] * 5  # η adapted per client
    else:
        assert result.accepted == result.rejected == [0, 0]
        assert result.client_lr[-1] == [lr] * 5


def test_run_is_reproducible_and_resumes_from_checkpoint(
    digits: DataSplits, shards: list[Dataset], tmp_path: Path
) -> None:
    small = [d.subset(np.arange(60)) for d in shards[:3]]
    settings = FedSettings(rounds=3, batch_size=10, model_kwargs=SMALL)
    full = run_federated(small, digits.test, settings, seed=5)
    again = run_federated(small, digits.test, settings, seed=5)
    assert full.accuracy == again.accuracy and full.client_lr == again.client_lr

    two = FedSettings(rounds=2, batch_size=10, model_kwargs=SMALL)
    run_federated(small, digits.test, two, seed=5, checkpoint_dir=tmp_path)
    assert (tmp_path / CHECKPOINT_NAME).exists()
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]  # no temp file left
    seen: list[int] = []
    resumed = run_federated(
        small, digits.test, settings, seed=5, checkpoint_dir=tmp_path,
        on_round=lambda r, _: seen.append(r),
    )
    assert seen == [3]  # rounds 1 and 2 came from the checkpoint
    assert resumed.accuracy == full.accuracy
    assert resumed.client_lr == full.client_lr
    for k in full.state:
        assert torch.equal(resumed.state[k], full.state[k])

    with pytest.raises(RayDPHPOError, match="other settings or seed"):
        run_federated(small, digits.test, settings, seed=6, checkpoint_dir=tmp_path)


# -- Ray ------------------------------------------------------------------------------------


@pytest.mark.ray
def test_ray_clients_match_in_process_run(
    ray_session: None, digits: DataSplits, shards: list[Dataset], tmp_path: Path
) -> None:
    """Actors only change where clients run: same seeds, same rounds as in-process (up to
    float rounding across processes); the per-round checkpoint is written. Resume logic is
    shared with run_federated and tested there."""
    small = [d.subset(np.arange(40)) for d in shards[:2]]
    settings = FedSettings(rounds=2, batch_size=10, model_kwargs=SMALL)
    local = run_federated(small, digits.test, settings, seed=1)
    remote = run_federated_ray(
        small, digits.test, settings, seed=1, num_cpus=0.5, checkpoint_dir=tmp_path
    )
    assert len(remote.accuracy) == 3
    assert (tmp_path / CHECKPOINT_NAME).exists()
    assert np.allclose(remote.client_lr, local.client_lr, rtol=1e-5)
    for k in local.state:
        assert torch.allclose(remote.state[k], local.state[k], atol=1e-5)


def test_main_runs_and_refuses_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from raydp_hpo.trainables.federated import main

    assert main(["--rounds", "1", "--hidden", "8", "--batch-size", "50"]) == 0
    assert "round    1  test accuracy" in capsys.readouterr().out
    assert main(["--lr", "-1"]) == 2
    assert "lr must be finite and > 0" in capsys.readouterr().err


def test_server_averages_weighted_by_shard_size(digits: DataSplits) -> None:
    """Full-batch SGD (|B| > N_k) makes each client's update independent of its minibatch
    order, so one round with clients of 20 and 60 records must equal the (20, 60)-weighted
    average of the two single-client runs from the same initial model (same seed)."""
    a, b = digits.train.subset(np.arange(20)), digits.train.subset(np.arange(20, 80))
    settings = FedSettings(optimizer=ClientOptimizer.SGD, lr=0.5, rounds=1, batch_size=100,
                           model_kwargs=SMALL)
    both = run_federated([a, b], digits.test, settings, seed=3).state
    alone = [run_federated([d], digits.test, settings, seed=3).state for d in (a, b)]
    weighted, plain = fed_avg(alone, [20, 60]), fed_avg(alone, [1, 1])
    assert any(not torch.allclose(weighted[k], plain[k], atol=1e-4) for k in weighted)
    for k in both:
        assert torch.allclose(both[k], weighted[k], atol=1e-6)
