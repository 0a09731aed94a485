"""raydp_hpo.trial_session: a user's own Opacus loop, admitted and checked (no Ray here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import raydp_hpo
from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Composition, Laplace, SubsampledGaussian
from raydp_hpo.errors import InvalidParameterError, TrialContractError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.release import USER_MODEL_FILE, load_released_model
from raydp_hpo.trainables.session import SESSION_KEY, DPEngine
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY
from tests.raydp_hpo.tune._user_trainables import N_VAL, N, TinyMLP, tensors

TRAIN, VAL = tensors(N, 0), tensors(N_VAL, 1)


def _config(**raydp) -> dict:
    block = {"charge": True, "charge_id": "exp/t1", "experiment": "exp", "score_epsilon": 0.5,
             "dataset_size": N, "validation_size": N_VAL, **raydp}
    return {"lr": 0.5, "epochs": 2, "batch_size": 20, "noise_multiplier": 1.1,
            "max_grad_norm": 1.0, "raydp": block}


def _ledger() -> PrivacyLedger:
    return PrivacyLedger(PrivacyBudget(20.0, 1e-5))


#: both engines of make_private (TinyMLP's Linear layers allow the native one)
ENGINES = [DPEngine.OPACUS, DPEngine.NATIVE]


def _train(trial, *, tamper=None, extra_steps: int = 0, save: bool = True, score: bool = True,
           engine: DPEngine = DPEngine.AUTO):
    model = TinyMLP(8)
    opt = torch.optim.SGD(model.parameters(), lr=trial.config["lr"])
    model, opt, loader = trial.make_private(model, opt, TRAIN, engine=engine)
    if tamper is not None:
        tamper(model, opt, loader)
    steps = 0
    while steps < trial.steps + extra_steps:
        for x, y in loader:
            if steps >= trial.steps + extra_steps:
                break
            opt.zero_grad()
            x, y = x.to(trial.device), y.to(trial.device)  # the device Ray gave the trial
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
        trial.report(epoch_steps=steps)
    if save:
        trial.save_model(model, model_kwargs={"width": 8})
    if score:
        trial.report_score(trial.count_correct(model, DataLoader(VAL, batch_size=25)))


@pytest.mark.parametrize("engine", ENGINES)
def test_happy_path_charges_the_plan_and_reports_the_keys(engine: DPEngine) -> None:
    ledger = _ledger()
    with raydp_hpo.trial_session(_config(), ledger=ledger, secret_seed=3) as trial:
        assert (trial.sample_rate, trial.steps, trial.expected_batch_size) == (0.1, 20, 20)
        _train(trial, engine=engine)
    assert trial.engine is engine
    final = trial.results[-1]
    assert final[NOISY_SCORE_KEY] == 0.5 and 0.0 <= final["val_accuracy"] <= 1.0
    assert final[SESSION_KEY] == trial.charge_id == "exp/t1/attempt-0"
    assert final["steps"] == 20
    # the ledger holds exactly the declared mechanism: DP-SGD(σ, q, T) then Laplace(ε_s)
    (charge,) = ledger.charges()
    assert charge.mechanism == Composition((SubsampledGaussian(1.1, 0.1, 20), Laplace(0.5)))
    # Opacus's own accountant history is the charge
    assert trial._accountant.history == [(1.1, 0.1, 20)]
    model = load_released_model(trial.checkpoint_dir / USER_MODEL_FILE)
    assert isinstance(model, TinyMLP) and model.net[0].out_features == 8


@pytest.mark.parametrize("engine", ENGINES)
def test_the_same_secret_seed_gives_the_same_run(engine: DPEngine) -> None:
    scores = []
    for _ in range(2):
        with raydp_hpo.trial_session(_config(), ledger=_ledger(), secret_seed=7) as trial:
            torch.manual_seed(0)  # the initialisation is public
            _train(trial, engine=engine)
        scores.append(trial.results[-1]["val_accuracy"])
    assert scores[0] == scores[1]


def _violation(match: str, **train_kwargs) -> PrivacyLedger:
    """``train_kwargs`` may name the ``engine`` (default: AUTO, the native one here)."""
    ledger = _ledger()
    with pytest.raises(TrialContractError, match=match), \
            raydp_hpo.trial_session(_config(), ledger=ledger) as trial:
        _train(trial, **train_kwargs)
    assert not any(NOISY_SCORE_KEY in r for r in trial.results)  # no score left the trial
    assert [c.charge_id for c in ledger.charges()] == ["exp/t1/attempt-0"]  # still charged
    return ledger


@pytest.mark.parametrize("engine", ENGINES)
def test_sigma_lowered_after_make_private_fails_the_trial(engine: DPEngine) -> None:
    def lower(model, opt, loader):
        opt.noise_multiplier = 1.1 / 4

    _violation(r"noise_multiplier=0.275.*charged σ=1.1", tamper=lower, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_clipping_norm_changed_after_make_private_fails_the_trial(engine: DPEngine) -> None:
    def loosen(model, opt, loader):
        opt.max_grad_norm = 10.0

    _violation(r"max_grad_norm=10.0", tamper=loosen, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_step_beyond_the_charge_is_refused(engine: DPEngine) -> None:
    _violation(r"step 21 refused: the trial was charged 20 steps", extra_steps=5, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_sigma_changed_after_the_last_step_fails_the_report(engine: DPEngine) -> None:
    """The history check at the report, not only the step guard: σ changed after the last
    step (so no step saw it) still fails the trial at its score."""
    ledger = _ledger()
    with pytest.raises(TrialContractError, match=r"noise_multiplier=0.55"), \
            raydp_hpo.trial_session(_config(), ledger=ledger) as trial:
        _train(trial, engine=engine, score=False)
        trial._optimizer.noise_multiplier = 0.55
        trial.report_score(10)
    assert not any(NOISY_SCORE_KEY in r for r in trial.results)
    assert [c.charge_id for c in ledger.charges()] == ["exp/t1/attempt-0"]


def test_a_loader_whose_q_differs_is_refused() -> None:
    ledger = _ledger()
    with pytest.raises(TrialContractError, match=r"batch_size=33 .* charged q=0.1"), \
            raydp_hpo.trial_session(_config(), ledger=ledger) as trial:
        model = TinyMLP()
        trial.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DataLoader(TRAIN, batch_size=33))
    from opacus.data_loader import DPDataLoader

    with pytest.raises(TrialContractError, match=r"q=0.0303.* charged q=0.1"), \
            raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        model = TinyMLP()
        trial.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DPDataLoader(TRAIN, sample_rate=0.0303))
    # the loader's rate changed after make_private: caught at the next step, either engine
    def resample(model, opt, loader):
        loader.batch_sampler.sample_rate = 0.5

    _violation(r"loader sample_rate=0.5, charged q=0.1", tamper=resample,
               engine=DPEngine.OPACUS)

    def resample_native(model, opt, loader):
        loader.batches.q = 0.5

    _violation(r"loader sample_rate=0.5, charged q=0.1", tamper=resample_native,
               engine=DPEngine.NATIVE)


def test_a_missing_score_or_checkpoint_is_an_error() -> None:
    _violation(r"ended without trial.report_score", score=False)
    _violation(r"no release checkpoint: call trial.save_model", save=False)


def test_no_admission_no_trial() -> None:
    """A block that admits nothing is refused before any code runs; a report outside the
    block (after its admission ended) is an error."""
    config = _config()
    config.pop("raydp")
    with pytest.raises(TrialContractError, match="admits no charge"), \
            raydp_hpo.trial_session(config):
        pytest.fail("the block must not run")
    tiny = PrivacyLedger(PrivacyBudget(0.5, 1e-5))
    from raydp_hpo.errors import BudgetExhaustedError

    with pytest.raises(BudgetExhaustedError), raydp_hpo.trial_session(_config(), ledger=tiny):
        pytest.fail("a refused trial must not run")
    assert list(tiny.charges()) == []
    with raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        _train(trial)
    with pytest.raises(TrialContractError, match="outside its `with"):
        trial.report(loss=1.0)


def test_reserved_keys_and_undeclared_sizes_are_errors() -> None:
    with raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        with pytest.raises(TrialContractError, match="score_epsilon"):
            trial.report(score_epsilon=0.5, val_accuracy=0.9)
        _train(trial)
    config = _config(dataset_size=None)
    with pytest.raises(InvalidParameterError, match="dataset_size=n"), \
            raydp_hpo.trial_session(config, ledger=_ledger()):
        pytest.fail("an undeclared size must be refused before the block")


def test_a_model_fn_that_does_not_rebuild_the_model_is_refused() -> None:
    with pytest.raises(TrialContractError, match="does not rebuild"), \
            raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        model = TinyMLP(8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt, loader = trial.make_private(model, opt, TRAIN)
        trial.save_model(model, model_kwargs={"width": 5})


def test_the_trial_runs_on_its_device() -> None:
    """The model, its noise and its gradients live on ``trial.device`` (the GPU Ray gives the
    trial when there is one; the CPU here); Poisson sampling draws on the CPU."""
    with raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        _train(trial)
        assert trial.noise_generator.device.type == trial.device.type
        assert trial.sampling_generator.device.type == "cpu"
        assert next(trial._optimizer.original_optimizer.param_groups[0]["params"].__iter__()
                    ).device.type == trial.device.type
    assert trial.results[-1]["steps"] == 20


def test_trial_epsilon_matches_an_independent_accountant() -> None:
    """The trial's own ε (RDP) agrees with Opacus's RDP accountant for the DP-SGD part."""
    config = _config(score_epsilon=None)
    with raydp_hpo.trial_session(config, ledger=_ledger()) as trial:
        _train(trial)
    ours = epsilon(SubsampledGaussian(1.1, 0.1, 20), 1e-5, Accountant.RDP)
    theirs = trial._accountant.get_epsilon(1e-5)
    assert trial.results[-1]["trial_epsilon_rdp"] == pytest.approx(ours, rel=1e-9)
    assert ours == pytest.approx(theirs, rel=0.01)  # different α grids: 0.15% apart


@pytest.mark.parametrize("engine", ENGINES)
def test_a_learning_rate_scheduler_wraps_the_guarded_optimizer(engine: DPEngine) -> None:
    """torch's schedulers wrap ``optimizer.step`` (they need a bound method): the guard still
    counts the steps and refuses step T + 1 underneath the scheduler."""
    with pytest.raises(TrialContractError, match="step 21 refused"), \
            raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        model = TinyMLP(8)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model, opt, loader = trial.make_private(model, opt, TRAIN, engine=engine)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
        for _ in range(3):
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                scheduler.step()
    assert trial.steps_taken == 20
    assert scheduler.get_last_lr() == [0.5 * 0.5**4]
