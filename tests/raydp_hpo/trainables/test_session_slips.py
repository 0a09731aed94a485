"""The ordinary slips of a user's own loop (issue #37): each fails its trial with a
``TrialContractError`` that names the fix, on both engines, and nothing from it is released.

The deliberate changes (σ, C, q lowered after make_private, extra steps) are in
test_session.py; these are the habits of an Opacus user: stepping the original optimiser,
iterating another loader, training on every record at each step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import raydp_hpo
from raydp_hpo.errors import TrialContractError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.session import DPEngine, TrialSession
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY
from tests.raydp_hpo.trainables.test_session import ENGINES, TRAIN, VAL, _config, _ledger
from tests.raydp_hpo.tune._user_trainables import TinyMLP

Loop = Callable[[TrialSession, DPEngine], None]


def _finish(trial: TrialSession, model: nn.Module) -> None:
    trial.save_model(model, model_kwargs={"width": 8})
    trial.report_score(trial.count_correct(model, DataLoader(VAL, batch_size=25)))


def _slip(loop: Loop, engine: DPEngine, match: str) -> TrialSession:
    """Run ``loop`` in a trial: it must fail with ``match``, release no score and leave the
    charge spent."""
    ledger: PrivacyLedger = _ledger()
    with pytest.raises(TrialContractError, match=match), \
            raydp_hpo.trial_session(_config(), ledger=ledger, secret_seed=1) as trial:
        loop(trial, engine)
    assert not any(NOISY_SCORE_KEY in r for r in trial.results)
    assert [c.charge_id for c in ledger.charges()] == ["exp/t1/attempt-0"]
    return trial


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


# ---- slip 1: the original optimiser stepped ---------------------------------------------


def _original_optimizer(trial: TrialSession, engine: DPEngine) -> None:
    """``model, dp_optimizer, loader = make_private(...)`` then ``optimizer.step()``: the
    weights move with no clipping and no noise (ε = ∞), the DP optimiser never steps."""
    model = TinyMLP(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, dp_optimizer, loader = trial.make_private(model, optimizer, TRAIN, engine=engine)
    for x, y in loader:
        dp_optimizer.zero_grad()
        _loss(model, x, y).backward()
        optimizer.step()  # the slip: the original optimiser
    _finish(trial, model)


@pytest.mark.parametrize("engine", ENGINES)
def test_stepping_the_original_optimizer_fails_the_trial(engine: DPEngine) -> None:
    trial = _slip(_original_optimizer, engine,
                  r"at trial.save_model: the model's weights changed outside the DP optimizer "
                  r"since make_private — stepped the original optimizer\?")
    assert trial.steps_taken == 0


def _only_the_original_optimizer(trial: TrialSession, engine: DPEngine) -> None:
    """The returned optimiser never used at all: ``optimizer.zero_grad()`` and
    ``optimizer.step()`` on the original one (Opacus then refuses the second backward pass
    with its own ValueError, which the session explains)."""
    model = TinyMLP(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, _dp_optimizer, loader = trial.make_private(model, optimizer, TRAIN, engine=engine)
    for x, y in loader:
        optimizer.zero_grad()
        _loss(model, x, y).backward()
        optimizer.step()
    _finish(trial, model)


@pytest.mark.parametrize("engine", ENGINES)
def test_only_the_original_optimizer_fails_the_trial_naming_it(engine: DPEngine) -> None:
    trial = _slip(_only_the_original_optimizer, engine,
                  r"the model's weights changed outside the DP optimizer since make_private — "
                  r"stepped the original optimizer\?")
    assert trial.steps_taken == 0


def _both_optimizers(trial: TrialSession, engine: DPEngine) -> None:
    """A DP step and then an extra step of the original optimiser on the same gradient."""
    model = TinyMLP(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, dp_optimizer, loader = trial.make_private(model, optimizer, TRAIN, engine=engine)
    for x, y in loader:
        dp_optimizer.zero_grad()
        _loss(model, x, y).backward()
        dp_optimizer.step()
        optimizer.step()  # the slip: a second, unnoised update
    _finish(trial, model)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_extra_step_of_the_original_optimizer_fails_the_next_dp_step(engine: DPEngine
                                                                        ) -> None:
    trial = _slip(_both_optimizers, engine,
                  r"before DP step 2: the model's weights changed outside the DP optimizer "
                  r"since DP step 1 — stepped the original optimizer\?")
    assert trial.steps_taken == 1


def test_a_trial_with_no_dp_step_releases_nothing() -> None:
    def no_training(trial: TrialSession, engine: DPEngine) -> None:
        model = TinyMLP(8)
        model, _, _ = trial.make_private(model, torch.optim.SGD(model.parameters(), lr=0.5),
                                         TRAIN, engine=engine)
        _finish(trial, model)

    _slip(no_training, DPEngine.AUTO, r"report_score after no DP step \(trial.steps_taken = 0\)")


def test_a_saved_model_the_dp_optimizer_did_not_train_is_refused() -> None:
    def other_model(trial: TrialSession, engine: DPEngine) -> None:
        model = TinyMLP(8)
        model, opt, loader = trial.make_private(model, torch.optim.SGD(model.parameters(),
                                                                       lr=0.5), TRAIN)
        for x, y in loader:
            opt.zero_grad()
            _loss(model, x, y).backward()
            opt.step()
        _finish(trial, TinyMLP(8))  # a fresh model, not the trained one

    _slip(other_model, DPEngine.AUTO, r"the model saved is not the one the DP optimizer trained")


# ---- slips 2-4: batches from somewhere else ---------------------------------------------

_NO_BATCH = (r"step 1 refused: the loader make_private returned has drawn no batch since the "
             r"previous step")


def _dp_loop(trial: TrialSession, engine: DPEngine, data, batches) -> None:
    model = TinyMLP(8)
    model, optimizer, _ = trial.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5), data, engine=engine)
    steps = 0
    while steps < trial.steps:
        for x, y in batches:
            if steps == trial.steps:
                break
            optimizer.zero_grad()
            _loss(model, x, y).backward()
            optimizer.step()
            steps += 1
    _finish(trial, model)


@pytest.mark.parametrize("engine", ENGINES)
def test_iterating_your_own_full_batch_loader_fails_the_trial(engine: DPEngine) -> None:
    full = DataLoader(TRAIN, batch_size=len(TRAIN))
    _slip(lambda t, e: _dp_loop(t, e, TRAIN, full), engine, _NO_BATCH)


@pytest.mark.parametrize("engine", ENGINES)
def test_all_records_at_every_step_fail_the_trial(engine: DPEngine) -> None:
    _slip(lambda t, e: _dp_loop(t, e, TRAIN, [TRAIN.tensors]), engine, _NO_BATCH)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_original_loader_stopped_at_trial_steps_fails_the_trial(engine: DPEngine) -> None:
    """The right-size loader passed to make_private (accepted: its batch is q·n), then the loop
    iterates that original loader — fixed shuffled batches, not Poisson sampling."""
    original = DataLoader(TRAIN, batch_size=20, shuffle=True)
    _slip(lambda t, e: _dp_loop(t, e, original, original), engine, _NO_BATCH)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_returned_loader_drawn_but_every_record_trained_fails_the_trial(engine: DPEngine
                                                                            ) -> None:
    """The returned loader is iterated, but each step trains on the whole training set: the
    rows clipped are not the batch drawn."""
    def loop(trial: TrialSession, engine: DPEngine) -> None:
        model = TinyMLP(8)
        model, optimizer, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.5), TRAIN, engine=engine)
        for _batch in loader:
            optimizer.zero_grad()
            _loss(model, *TRAIN.tensors).backward()
            optimizer.step()
        _finish(trial, model)

    match = (r"per-sample gradients are of 200 examples but the loader's last Poisson batch"
             if engine is DPEngine.OPACUS else
             r"layers saw 200 examples but the loader's last Poisson batch has \d+: train each "
             r"step on the batch the loader make_private returned yielded last")
    _slip(loop, engine, match)


def test_the_step_limit_message_names_the_returned_loader() -> None:
    def over(trial: TrialSession, engine: DPEngine) -> None:
        model = TinyMLP(8)
        model, optimizer, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.5), TRAIN, engine=engine)
        while True:
            for x, y in loader:
                optimizer.zero_grad()
                _loss(model, x, y).backward()
                optimizer.step()

    _slip(over, DPEngine.AUTO, r"step 21 refused: .*iterate the loader make_private returned "
                               r"and stop when trial.steps_taken == trial.steps")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_honest_loop_with_evaluation_between_steps_passes(engine: DPEngine) -> None:
    """No false alarm: evaluation passes (no_grad), extra draws of the returned loader, an
    empty Poisson batch and a learning-rate scheduler change no check."""
    with raydp_hpo.trial_session(_config(), ledger=_ledger(), secret_seed=2) as trial:
        model = TinyMLP(8)
        model, optimizer, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.5), TRAIN, engine=engine)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)
        while trial.steps_taken < trial.steps:
            for x, y in loader:
                if trial.steps_taken == trial.steps:
                    break
                optimizer.zero_grad()
                _loss(model, x, y).backward()
                optimizer.step()
                scheduler.step()
            trial.report(train_correct=trial.count_correct(model, DataLoader(VAL)))
        _finish(trial, model)
    assert trial.results[-1]["steps"] == trial.steps == 20


def test_a_hand_written_update_through_data_is_caught_by_the_fingerprint() -> None:
    """``p.data`` updates bump no version counter: the fingerprint catches them at
    save_model (version counters alone would not)."""
    def by_hand(trial: TrialSession, engine: DPEngine) -> None:
        model = TinyMLP(8)
        model, optimizer, loader = trial.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.5), TRAIN, engine=engine)
        for x, y in loader:
            optimizer.zero_grad()
            _loss(model, x, y).backward()
            optimizer.step()
        for p in model.parameters():
            p.data -= 0.01 * p.data.sign()
        _finish(trial, model)

    _slip(by_hand, DPEngine.AUTO, r"at trial.save_model: the model's weights changed outside "
                                  r"the DP optimizer since DP step 10")
