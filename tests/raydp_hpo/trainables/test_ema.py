"""The moving average of the weights (``ema_decay``): its recursion against an independent
computation from the iterates, what is released and evaluated, resume, bad values refused
before any charge, and no change to what is charged."""

from __future__ import annotations

import pytest
import torch

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trainables.data import load_mnist1d, split
from raydp_hpo.trainables.models import build_model
from raydp_hpo.trainables.training import (
    _Runner,
    count_correct,
    declared_privacy,
    ema_decay_at,
    load_checkpoint,
    released_model_state,
    train_dp,
    validate_trial_space,
)

from .test_training import SEED  # the seed _interrupted_after_epoch_1 trains with
from .test_training import _config as base_config
from .test_training import _interrupted_after_epoch_1 as interrupted_after_epoch_1


def _config(**over):
    return base_config(**{"epochs": 2, "raydp": {"charge": True, "charge_id": "exp/ema"},
                          **over})


def test_decay_warms_up_then_is_the_configured_one():
    assert ema_decay_at(0.95, 1) == pytest.approx(2 / 11, rel=1e-12)
    assert ema_decay_at(0.95, 10) == pytest.approx(11 / 20, rel=1e-12)
    assert ema_decay_at(0.95, 170) == pytest.approx(171 / 180, rel=1e-12)  # < 0.95 still
    assert ema_decay_at(0.95, 171) == 0.95
    assert ema_decay_at(0.95, 10_000) == 0.95


def test_the_average_is_the_recursion_over_the_iterates():
    """A runner's average after T steps against the recursion recomputed in float64 from the
    iterates recorded after every step of the same run."""
    data = split(load_mnist1d(num_samples=600, seed=0), 0.2, 0.2, seed=0)
    config = {"lr": 0.3, "epochs": 2, "sample_rate": 0.2, "noise_multiplier": 1.0,
              "max_grad_norm": 1.0, "ema_decay": 0.8, "model": "mlp",
              "model_kwargs": {"hidden": [16]}}
    privacy, n_view = declared_privacy(config, data)
    runner = _Runner(config, data.train, privacy, False, 0, torch.device("cpu"), seed=5,
                     normaliser=privacy.sample_rate * n_view)
    average = [p.detach().double().clone() for p in runner.params]  # w̄_0 = w_0
    for t in range(1, privacy.steps + 1):
        runner.step()
        beta = min(0.8, (1 + t) / (10 + t))
        average = [beta * a + (1 - beta) * p.detach().double()
                   for a, p in zip(average, runner.params)]
    assert privacy.steps >= 10
    assert runner.ema is not None
    for ours, ref in zip(runner.ema, average):
        torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6)
    # and the live weights are the last iterate, not the average
    assert not torch.allclose(runner.params[0].detach().double(), average[0])


def test_released_and_evaluated_weights_are_the_average(ledger, digits):
    """Same secret seed: the same iterates with or without the average (it only reads them),
    so the training losses agree; the release is the average, and the reported test accuracy
    is the released model's."""
    plain = train_dp(_config(), digits, ledger=ledger, secret_seed=SEED)
    averaged = train_dp(_config(ema_decay=0.9, raydp={"charge": True, "charge_id": "exp/e2"}),
                        digits, ledger=ledger, secret_seed=SEED)
    assert [h["loss"] for h in plain.history] == [h["loss"] for h in averaged.history]
    assert averaged.mechanism == plain.mechanism  # nothing more is charged
    assert plain.models[0].keys() == averaged.models[0].keys()
    assert not any(torch.equal(plain.models[0][k], averaged.models[0][k]) for k in plain.models[0])
    model = build_model("mlp", digits.test.feature_shape, digits.test.num_classes, hidden=[32])
    model.load_state_dict(averaged.models[0])
    acc = count_correct(model, digits.test) / len(digits.test)
    assert averaged.metrics["test_accuracy"] == pytest.approx(acc, abs=1e-12)


def test_resume_with_the_average_equals_the_uninterrupted_run(ledger, digits, tmp_path):
    cfg = _config(epochs=3, ema_decay=0.9)
    full = train_dp(cfg, digits, ledger=ledger, secret_seed=SEED)
    ckpt = tmp_path / "ckpt"
    interrupted_after_epoch_1(cfg, digits, ledger, ckpt)
    assert load_checkpoint(ckpt)["runners"][0]["ema"] is not None
    resumed = train_dp(cfg, digits, ledger=ledger, secret_seed=SEED, resume_from=ckpt,
                       checkpoint_dir=ckpt)
    for a, b in zip(full.models[0].values(), resumed.models[0].values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # what DPTuner releases from the final checkpoint is the average, not the last iterate
    final = load_checkpoint(ckpt)["runners"][0]
    released = released_model_state(final)
    assert released.keys() == full.models[0].keys()
    for k in released:
        torch.testing.assert_close(released[k], full.models[0][k], rtol=0, atol=0)
    assert not all(torch.equal(final["model"][k], released[k]) for k in released)
    # a checkpoint without an average cannot resume a config that asks for one
    plain_ckpt = tmp_path / "plain"
    interrupted_after_epoch_1(_config(epochs=3), digits, ledger, plain_ckpt)
    with pytest.raises(RayDPHPOError, match="moving average"):
        train_dp(cfg, digits, ledger=ledger, secret_seed=SEED, resume_from=plain_ckpt)


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), True, "0.9"])
def test_bad_decay_is_refused_before_any_charge(ledger, digits, bad):
    before = ledger.charges()
    with pytest.raises(InvalidParameterError, match="ema_decay"):
        train_dp(_config(ema_decay=bad), digits, ledger=ledger, secret_seed=SEED)
    assert ledger.charges() == before
    with pytest.raises(InvalidParameterError, match="ema_decay"):
        validate_trial_space({"lr": 0.1, "ema_decay": bad})


def test_the_search_space_accepts_the_key_and_hints_it():
    from ray import tune

    validate_trial_space({"lr": 0.1, "ema_decay": 0.0})
    validate_trial_space({"lr": 0.1, "ema_decay": tune.choice([0.0, 0.9, 0.99])})
    with pytest.raises(InvalidParameterError, match="did you mean 'ema_decay'"):
        validate_trial_space({"lr": 0.1, "ema": 0.9})
