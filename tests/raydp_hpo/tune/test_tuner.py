"""DPTuner end to end with a real Tuner, ledger actor and DP trainable (few, marked `ray`)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from ray import tune

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import (
    InvalidParameterError,
    LedgerMismatchError,
    RayDPHPOError,
    ReleaseAlreadyPublishedError,
    SearchFailedError,
    TrialContractError,
)
from raydp_hpo.ledger.actor import get_ledger
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.searchers import OneShotRandomSearch
from raydp_hpo.trainables.data import load_mnist1d, split
from raydp_hpo.trainables.release import load_released_model
from raydp_hpo.trainables.training import load_checkpoint
from raydp_hpo.tune.tuner import DPTuner

pytestmark = [pytest.mark.ray]

SPACE = {
    "lr": tune.loguniform(0.05, 1.0),
    "epochs": 1,
    "sample_rate": 0.1,
    "max_grad_norm": 1.0,
    "model": "mlp",
    "optimizer": "sgd",
}


@pytest.fixture(scope="module")
def data():
    return split(load_mnist1d(num_samples=1200, seed=3), 0.2, 0.2, seed=0)


def test_random_stopping_end_to_end(ray_session, data, tmp_path: Path) -> None:
    budget = PrivacyBudget(4.0, 1e-5)
    lines: list[str] = []
    tuner = DPTuner(None, param_space=SPACE, search="random_stopping", budget=budget,
                    data=data, search_kwargs={"mean": 2.0}, progress=lines.append,
                    tune_config=tune.TuneConfig(max_concurrent_trials=2, mode="max"),
                    run_config=tune.RunConfig(name=f"rs-{uuid.uuid4().hex[:6]}",
                                              storage_path=str(tmp_path)), fresh_budget=True)
    result = tuner.fit()
    assert result.experiment_path == str(tuner.experiment_path)
    assert tuner.experiment_path.parent == tmp_path.resolve()  # from the RunConfig
    # Tune's ResultGrid, private: one result per trial run, never in the release
    grid = result.private_result_grid
    assert isinstance(grid, tune.ResultGrid) and len(grid) == len(result.private_trials)
    # progress came from the Tune callback: the last line has the ledger's final spend
    assert lines and f"ledger ε spent {result.certificate.ledger_spent_epsilon:.4f} / 4" \
        in lines[-1]
    trial_files = list((Path(result.experiment_path) / "tune").rglob("*"))
    assert any(p.name == "result.json" for p in trial_files)  # Tune's JSON and CSV logs stay
    assert not any(p.name.startswith("events.out.tfevents") for p in trial_files)  # no TB
    cert = result.certificate
    # exactly one charge: the whole Papernot–Steinke plan, admitted before any trial
    assert len(cert.charges) == 1 and cert.charges[0][0].endswith("/plan")
    assert cert.within_budget and cert.epsilon <= budget.epsilon
    assert cert.epsilon_rdp == pytest.approx(
        epsilon(cert.charges[0][1], budget.delta, Accountant.RDP), rel=1e-12
    )
    # random stopping is also accounted by privacy profiles (KRW 2024): never above RDP here,
    # and the certificate reports the tightest of the three valid bounds
    assert cert.epsilon_profile <= cert.epsilon_rdp
    assert cert.epsilon == min(cert.epsilon_rdp, cert.epsilon_pld, cert.epsilon_profile)
    if result.hyperparameters is not None:
        assert "raydp" not in result.hyperparameters and "seed" not in result.hyperparameters
        assert result.model is not None
    public = json.loads((Path(result.experiment_path) / "public" / "release.json").read_text())
    # the release holds no per-trial metrics, no trial count and no path of this machine
    assert set(public) == {"selected", "reason", "hyperparameters", "model_file",
                           "budget_exhausted", "certificate", "dp_test_accuracy", "files",
                           "note"}
    if result.hyperparameters is not None:
        # the released file is the model alone, never the trial's checkpoint (which holds the
        # secret noise generator's state and unnoised metrics)
        assert public["model_file"] == "released_model.pt"
        assert Path(result.model_path).parent == Path(result.experiment_path) / "public"
        payload = torch.load(result.model_path, map_location="cpu", weights_only=True)
        assert set(payload) == {"format", "model", "model_kwargs", "feature_shape",
                                "num_classes", "state_dict"}
        reloaded = load_released_model(result.model_path)
        for (name, a), (_, b) in zip(reloaded.state_dict().items(),
                                     result.model.state_dict().items(), strict=True):
            assert torch.equal(a, b), name
        assert result.private_checkpoint_path is not None
        assert "noise_rng" in load_checkpoint(result.private_checkpoint_path)["runners"][0]
    assert public["dp_test_accuracy"] is None  # not asked for: no DP test accuracy
    # the unnoised test accuracy is not in the file to publish, but in a private one beside it
    private = json.loads((Path(result.experiment_path) / "evaluation_private.json").read_text())
    assert private["test_accuracy"] == result.test_accuracy
    assert private["covered_by_certificate"] is False and "PRIVATE" in private["note"]
    # the certificate states the privacy unit and everything it treats as public
    assert "adding or removing one record" in public["certificate"]["privacy_unit"]
    treated = public["certificate"]["treated_as_public"]
    # split() of MNIST-1D (public size) declares the split sizes: none is read off the data
    assert treated["training-set size"].startswith(f"{data.declared_sizes.train} (declared")
    assert treated["validation-set size"].startswith(f"{data.declared_sizes.validation} (decl")


def test_unknown_space_key_is_refused_before_any_charge(ray_session, data, tmp_path: Path
                                                        ) -> None:
    """`learning_rate` is not read by the trainable: training would use the default lr and the
    release would publish a value that trained nothing. Refused before the plan charge."""
    tuner = DPTuner(None, param_space={**SPACE, "learning_rate": 0.1}, search="random_stopping",
                    budget=PrivacyBudget(4.0, 1e-5), data=data, storage_path=tmp_path,
                    search_kwargs={"mean": 2.0}, fresh_budget=True)
    with pytest.raises(InvalidParameterError, match="did you mean 'lr'"):
        tuner.fit()
    journal = tmp_path / tuner.experiment / "ledger.journal"
    assert not journal.exists() or PrivacyLedger.read_only(journal).charges() == ()


def test_failed_final_model_means_no_release(ray_session, data, tmp_path: Path) -> None:
    """The one trial crashes after its charge (a model that cannot be built): nothing is
    released, the spend stays on the certificate, release.json says why, and fit raises
    SearchFailedError (issue #41: a failed search never looks like a finished one)."""
    space = {**SPACE, "model_kwargs": tune.choice([{"hidden": ["not-a-width"]}])}
    with pytest.raises(SearchFailedError, match="the final run failed") as caught:
        DPTuner(None, param_space=space, search="one_shot_random",
                budget=PrivacyBudget(2.0, 1e-5), data=data, storage_path=tmp_path,
                experiment=f"fail-{uuid.uuid4().hex[:6]}", fresh_budget=True).fit()
    result = caught.value.result
    assert result.hyperparameters is None and result.model is None
    assert result.extras["final_failed"] is True
    assert len(result.certificate.charges) == 1 and result.certificate.epsilon > 0
    public = json.loads((Path(result.experiment_path) / "public" / "release.json").read_text())
    assert public["hyperparameters"] is None and public["selected"] is False
    assert public["reason"] == "the final run failed, so no trained model can be released"


def test_default_storage_public_folder_and_publication(ray_session, data, tmp_path: Path,
                                                      monkeypatch, capsys) -> None:
    """No storage_path: the experiment goes to $RAYDP_HPO_STORAGE (default ~/raydp_results),
    `ledger list` finds its dedicated journal there, public/ holds exactly what may be
    published with no path of this machine, and save_public / `raydp-hpo publish` copy it."""
    from raydp_hpo.cli.main import main

    storage = tmp_path / "store"
    monkeypatch.setenv("RAYDP_HPO_STORAGE", str(storage))
    name = f"pub-{uuid.uuid4().hex[:6]}"
    result = DPTuner(None, param_space=SPACE, search="one_shot_random",
                     budget=PrivacyBudget(2.0, 1e-5), data=data, experiment=name, fresh_budget=True).fit()
    exp = storage.resolve() / name
    assert result.experiment_path == str(exp) and result.hyperparameters is not None
    assert main(["ledger", "list"]) == 0
    assert str(exp / "ledger.journal") in capsys.readouterr().out
    files = {"release.json", "certificate.json", "released_model.pt"}
    assert {p.name for p in (exp / "public").iterdir()} == files
    assert (exp / "PRIVATE_README.txt").is_file() and (exp / "tune").is_dir()
    assert Path(result.model_path) == exp / "public" / "released_model.pt"
    out = tmp_path / "published"
    assert {p.name for p in result.save_public(out)} == files
    assert main(["publish", str(exp), str(tmp_path / "cli")]) == 0
    for folder in (exp / "public", out, tmp_path / "cli"):
        for path in folder.glob("*.json"):
            stack = [json.loads(path.read_text())]
            while stack:  # every string of the JSON: no machine path
                item = stack.pop()
                if isinstance(item, dict):
                    stack.extend([*item.keys(), *item.values()])
                elif isinstance(item, list):
                    stack.extend(item)
                elif isinstance(item, str):
                    assert not item.startswith("/") and str(Path.home()) not in item, item
                    assert str(storage) not in item and str(tmp_path) not in item, item
        assert (folder / "released_model.pt").read_bytes() == Path(result.model_path
                                                                   ).read_bytes()
    with pytest.raises(InvalidParameterError, match="inside the experiment folder"):
        result.save_public(exp / "public-copy")


def test_the_release_is_the_moving_average_with_ema_decay(ray_session, data, tmp_path: Path
                                                          ) -> None:
    """With ``ema_decay`` the released model is the trial's moving average of the iterates
    (what it was scored and evaluated on), not its last iterate, and the private test
    accuracy is that model's."""
    from raydp_hpo.trainables.training import count_correct, released_model_state

    result = DPTuner(None, param_space={**SPACE, "ema_decay": 0.9}, search="one_shot_random",
                     budget=PrivacyBudget(2.0, 1e-5), data=data,
                     storage_path=tmp_path, experiment=f"ema-{uuid.uuid4().hex[:6]}", fresh_budget=True).fit()
    assert result.model is not None and result.private_checkpoint_path is not None
    runner = load_checkpoint(result.private_checkpoint_path)["runners"][0]
    released = released_model_state(runner)
    for name, value in result.model.state_dict().items():
        assert torch.equal(value, released[name]), name
    assert not all(torch.equal(runner["model"][k], released[k]) for k in released)
    assert result.test_accuracy == pytest.approx(
        count_correct(result.model, data.test) / len(data.test), abs=1e-12)


def test_tensorboard_is_opt_in(ray_session, data, tmp_path: Path) -> None:
    space = {**SPACE, "lr": tune.grid_search([0.1, 0.3]), "noise_multiplier": 3.0}
    result = DPTuner(None, param_space=space, search="grid_composed",
                     budget=PrivacyBudget(8.0, 1e-5), data=data,
                     storage_path=tmp_path, experiment=f"tb-{uuid.uuid4().hex[:6]}",
                     tensorboard=True, fresh_budget=True).fit()
    events = list((Path(result.experiment_path) / "tune").rglob("events.out.tfevents*"))
    assert len(events) == 2  # one event file per trial, as plain Tune writes


def test_budget_too_small_fails_before_any_trial(ray_session, data, tmp_path: Path) -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    ledger = get_ledger(name, PrivacyBudget(0.05, 1e-5), tmp_path / "shared.journal",
                        namespace="tests")
    try:
        with pytest.raises(InvalidParameterError, match="budget"):
            DPTuner(None, param_space={**SPACE, "noise_multiplier": 1.0}, search="random_stopping",
                    budget=PrivacyBudget(0.05, 1e-5), data=data, storage_path=tmp_path,
                    ledger=ledger, search_kwargs={"mean": 5.0}).fit()
        assert ledger.charges() == ()
        assert not (tmp_path / "tune").exists()
    finally:
        ledger.kill()


def test_grid_search_halts_when_ledger_refuses(ray_session, data, tmp_path: Path) -> None:
    # A shared ledger with less budget than the grid needs: the grid composes every trial,
    # so the ledger refuses part-way and the search ends cleanly with the budget spent.
    name = f"grid-{uuid.uuid4().hex[:6]}"
    ledger = get_ledger(name, PrivacyBudget(2.0, 1e-5), tmp_path / "grid.journal",
                        namespace="tests")
    try:
        space = {**SPACE, "lr": tune.grid_search([0.1, 0.3, 1.0]), "noise_multiplier": 1.6}
        tuner = DPTuner(None, param_space=space, search="grid_composed",
                        budget=PrivacyBudget(50.0, 1e-5), data=data,
                        storage_path=tmp_path, ledger=ledger, max_concurrent_trials=1)
        result = tuner.fit()
        assert ledger.spent() <= 2.0
        admitted = len(ledger.charges())
        assert 1 <= admitted < 3
        assert result.budget_exhausted
        assert result.certificate.epsilon <= 2.0 + 1e-9
    finally:
        ledger.kill()


def test_selection_on_unprivatised_metric_is_refused(ray_session, data, tmp_path: Path) -> None:
    tuner = DPTuner(None, param_space=SPACE, search="random_stopping",
                    budget=PrivacyBudget(4.0, 1e-5), metric="loss",
                    mode="min", data=data, storage_path=tmp_path, search_kwargs={"mean": 2.0}, fresh_budget=True)
    with pytest.raises(InvalidParameterError, match="val_accuracy"):
        tuner.fit()
    # the dedicated ledger actor is gone with fit(); its journal is the record
    journal = tmp_path / tuner.experiment / "ledger.journal"
    # refused before the plan charge (the actor may not even have written its journal yet)
    assert not journal.exists() or PrivacyLedger.read_only(journal).charges() == ()
    with pytest.raises(RayDPHPOError, match="no ledger named"):
        get_ledger(f"ledger-{tuner.experiment}", namespace="raydp_hpo")


ALGORITHM_CASES = {
    "subsampled_transfer": (SPACE, {"mean": 2.0, "subsample_rate": 0.3}),
    "svt_threshold": (
        {**SPACE, "lr": tune.grid_search([0.1, 0.5])},
        {"num_partitions": 3, "max_rounds": 2, "round_epsilon": 0.5},
    ),
    # the default since issue #31 (refined DP-SGD: q, T and the optimizer from the space)
    "linear_scaling": (
        {"max_grad_norm": 1.0, "model": "mlp", "sample_rate": 0.25, "epochs": 1,
         "optimizer": "sgd"},
        {"runs_per_sweep": 1, "sweep_epsilons": (0.3, 0.6)},
    ),
    "linear_scaling_paper": (
        {"max_grad_norm": 1.0, "model": "mlp"},
        {"preset": "paper", "runs_per_sweep": 1, "sweep_epsilons": (0.3, 0.6),
         "steps_range": (2, 4)},
    ),
    "one_shot_random": (SPACE, {}),
}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CASES))
def test_each_algorithm_in_a_real_tuner(ray_session, data, tmp_path: Path, algorithm) -> None:
    space, kwargs = ALGORITHM_CASES[algorithm]
    budget = PrivacyBudget(6.0, 1e-5)
    tuner = DPTuner(None, param_space=space, search=algorithm.removesuffix("_paper"),
                    budget=budget,
                    data=data, storage_path=tmp_path,
                    experiment=f"{algorithm}-{uuid.uuid4().hex[:6]}", search_kwargs=kwargs,
                    max_concurrent_trials=2, fresh_budget=True)
    result = tuner.fit()
    cert = result.certificate
    assert cert.within_budget
    # everything charged is exactly the searcher's plan (one up-front charge)
    assert len(cert.charges) == 1 and cert.charges[0][0].endswith("/plan")
    assert result.hyperparameters is not None and result.model is not None
    assert not any(t["error"] for t in result.private_trials), result.private_trials


def test_resume_replays_the_plan_charge(ray_session, data, tmp_path: Path) -> None:
    # Resuming must judge the plan as the dedicated ledger's first charge again (not count the
    # already-charged plan twice, which would refuse it or calibrate a different plan).
    experiment = f"resume-{uuid.uuid4().hex[:6]}"

    def make() -> DPTuner:
        return DPTuner(None, param_space=SPACE, search="random_stopping",
                       budget=PrivacyBudget(4.0, 1e-5), data=data,
                       storage_path=tmp_path, experiment=experiment, search_kwargs={"mean": 2.0}, fresh_budget=True)

    first = make().fit()
    with pytest.raises(InvalidParameterError, match="already exists"):
        make().fit()  # a second fresh run of the same experiment is refused
    assert DPTuner.can_restore(first.experiment_path)
    # the run released: a resume of it is refused up front (one release per run; an
    # interrupted run's resume replays the plan: test_tuner_restore.py)
    journal = Path(first.experiment_path) / "ledger.journal"
    with pytest.raises(ReleaseAlreadyPublishedError, match="already published"):
        DPTuner.restore(first.experiment_path, data=data).fit()
    assert [c.charge_id for c in PrivacyLedger.read_only(journal).charges()] == [
        c for c, _ in first.certificate.charges]
    # issue #31: the journal and its seal moved away, a resume would charge the plan afresh on
    # a new ledger: it is refused, naming the journal, before the ledger's actor starts
    journal = Path(first.experiment_path) / "ledger.journal"
    seal = journal.with_name(journal.name + ".seal")
    journal.rename(tmp_path / "moved.journal")
    seal.rename(tmp_path / "moved.journal.seal")
    with pytest.raises(LedgerMismatchError, match=f"cannot resume .*{journal}.*does not exist"):
        DPTuner.restore(first.experiment_path, data=data).fit()
    assert not journal.exists() and not seal.exists()  # no fresh ledger was started


def test_runs_inside_a_ray_task(ray_session, tmp_path: Path) -> None:
    import ray

    @ray.remote(num_cpus=0)  # the driver task must not hold the CPUs its trials need
    def search(storage: str) -> tuple[float, float, bool]:
        from raydp_hpo.accounting.budget import PrivacyBudget
        from raydp_hpo.trainables.data import load_mnist1d, split
        from raydp_hpo.tune.tuner import DPTuner

        data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
        result = DPTuner(None, param_space=SPACE, search="one_shot_random",
                         budget=PrivacyBudget(2.0, 1e-5), data=data,
                         storage_path=storage, fresh_budget=True).fit()
        cert = result.certificate
        return cert.epsilon, cert.budget.epsilon, result.model is not None

    eps, budget_eps, has_model = ray.get(search.remote(str(tmp_path)), timeout=600)
    assert 0 < eps <= budget_eps and has_model


def test_dedicated_ledger_that_cannot_start_runs_nothing(ray_session, data, tmp_path: Path) -> None:
    """Tune starts while a freshly created dedicated ledger comes up; if it never does (here: a
    journal left with another budget), every admission fails, nothing trains, and fit() says
    why. The journal is untouched."""
    from raydp_hpo.accounting.mechanisms import SubsampledGaussian

    experiment = f"stale-{uuid.uuid4().hex[:6]}"
    journal = tmp_path / experiment / "ledger.journal"
    journal.parent.mkdir(parents=True)
    with PrivacyLedger(PrivacyBudget(1.0, 1e-5), journal) as stale:
        stale.charge("old", SubsampledGaussian(2.0, 0.01, 10))
    before = journal.read_bytes()
    space = {**SPACE, "lr": tune.grid_search([0.1, 0.3, 1.0]), "noise_multiplier": 1.6}
    tuner = DPTuner(None, param_space=space, search="grid_composed",
                    budget=PrivacyBudget(8.0, 1e-5), data=data,
                    storage_path=tmp_path, experiment=experiment, max_concurrent_trials=1, fresh_budget=True)
    with pytest.raises(RayDPHPOError, match="failed to start: .*LedgerMismatchError.*budget"):
        tuner.fit()
    assert journal.read_bytes() == before
    results = [json.loads(line) for p in (tmp_path / experiment / "tune").rglob("result.json")
               for line in p.read_text().splitlines() if line.strip()]
    assert all("val_accuracy" not in r for r in results)  # no trial trained


def test_fixed_plan_calibrates_on_the_tightest_valid_bound(ray_session, data, tmp_path: Path
                                                           ) -> None:
    """A one-shot run is a fixed plan: its noise is calibrated on min(RDP, PLD), so its PLD ε
    meets the budget (within the calibration tolerance) instead of wasting ~15 % of it, as an
    RDP-only calibration did (RDP 3.0 → PLD ≈ 2.55 at these settings)."""
    budget = PrivacyBudget(3.0, 1e-5)
    result = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=budget,
                     data=data, storage_path=tmp_path,
                     experiment=f"best-{uuid.uuid4().hex[:6]}", fresh_budget=True).fit()
    (_, plan), = result.certificate.charges
    assert result.certificate.ledger_halting_rule == "fixed_plan/tightest"
    eps_pld = epsilon(plan, budget.delta, Accountant.PLD)
    assert 0.97 * budget.epsilon <= min(eps_pld, result.certificate.epsilon_rdp) <= budget.epsilon
    assert result.certificate.epsilon_rdp > budget.epsilon  # RDP alone would have refused it


def test_dp_test_accuracy_is_its_own_charge(ray_session, data, tmp_path: Path) -> None:
    """test_accuracy_epsilon: the released model's test accuracy is released by the Laplace
    mechanism on the correct count, charged to the ledger and listed in the certificate, with
    the search calibrated to the rest of the budget."""
    from raydp_hpo.accounting.mechanisms import Laplace

    budget = PrivacyBudget(3.0, 1e-5)
    # a searcher constructed without space, ledger or sizes: DPTuner hands them over (with the
    # search's share of the budget, ε − ε_t) and names its charges
    searcher = OneShotRandomSearch(None, metric="val_accuracy", ledger_name="not-this-one")
    result = DPTuner(None, param_space=SPACE, search=searcher, budget=budget, data=data,
                     storage_path=tmp_path, experiment=f"dptest-{uuid.uuid4().hex[:6]}",
                     test_accuracy_epsilon=0.5, fresh_budget=True).fit()
    assert searcher.budget == PrivacyBudget(2.5, 1e-5)
    assert searcher._ledger_name == result.certificate.ledger_name
    assert [cid for cid, _ in result.certificate.charges][0].endswith("/plan")
    ids = [cid for cid, _ in result.certificate.charges]
    assert ids[-1].endswith("/test_accuracy")
    assert result.certificate.charges[-1][1] == Laplace(0.5)
    assert result.dp_test_accuracy is not None and 0.0 <= result.dp_test_accuracy <= 1.0
    assert result.certificate.epsilon <= budget.epsilon
    public = json.loads((Path(result.experiment_path) / "public" / "release.json").read_text())
    assert public["dp_test_accuracy"]["covered_by_certificate"] is True
    assert public["dp_test_accuracy"]["epsilon"] == 0.5
    with pytest.raises(InvalidParameterError, match="leaves nothing"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=budget,
                data=data, test_accuracy_epsilon=3.0, fresh_budget=True)


def test_resumed_dedicated_ledger_keeps_its_journal_accountant(tmp_path):
    """An experiment started when fixed plans halted on BEST resumes on BEST (a valid, looser
    bound) instead of failing on the new PROFILE default; a fresh journal gets PROFILE."""
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
    from raydp_hpo.tune.tuner import _resumed_accountant

    journal = tmp_path / "ledger.journal"
    assert _resumed_accountant(journal, Adaptivity.FIXED_PLAN) is Accountant.PROFILE
    PrivacyLedger(
        PrivacyBudget(3.0, 1e-5), journal, adaptivity=Adaptivity.FIXED_PLAN,
        accountant=Accountant.BEST,
    ).close()
    assert _resumed_accountant(journal, Adaptivity.FIXED_PLAN) is Accountant.BEST
    # a different halting rule is not silently adopted: the actor reports the mismatch
    assert _resumed_accountant(journal, Adaptivity.ADAPTIVE) is Accountant.RDP


def flaky_trainable(config: dict) -> None:
    """Passes the real privacy gate (a self-charging trial: a fresh attempt id per start),
    then fails on its first attempt."""
    from raydp_hpo.trainables.privacy_gate import RaydpSettings, admit
    from raydp_hpo.trial.privacy import privacy_from_config

    settings = RaydpSettings.from_config(config)
    charged = admit(settings, privacy_from_config(config, 1000).mechanism(), None, owner="test")
    marker = Path(config["marker_dir"]) / str(settings.charge_id).replace("/", "_")
    if not marker.exists():
        marker.write_text(str(charged))
        raise RuntimeError("the first attempt fails after its charge")
    tune.report({"val_accuracy": 0.5})


def test_a_retried_trial_pays_again(ray_session, data, tmp_path: Path) -> None:
    """max_failures=1 (from the RunConfig): the trial's first attempt charged and failed, Tune
    retried it from scratch, and the retry charged again under a new attempt id."""
    space = {**SPACE, "lr": tune.grid_search([0.1]), "noise_multiplier": 3.0,
             "marker_dir": str(tmp_path)}
    name = f"retry-{uuid.uuid4().hex[:6]}"
    tuner = DPTuner(tune.with_resources(flaky_trainable, {"cpu": 1}), param_space=space,
                    search="grid_composed", budget=PrivacyBudget(8.0, 1e-5), data=data,
                    storage_path=tmp_path, experiment=name,
                    run_config=tune.RunConfig(failure_config=tune.FailureConfig(max_failures=1)),
                    fresh_budget=True)
    # the trainable reports no noisy score (it is glue, not a trial_session): a contract error
    # after the run, which carries the result with the certificate of what was charged
    with pytest.raises(TrialContractError, match="no trial reported a noisy score") as caught:
        tuner.fit()
    result = caught.value.result
    ids = [cid for cid, _ in result.certificate.charges]
    assert len(ids) == 2 and {i.rsplit("/", 1)[1] for i in ids} == {"attempt-0", "attempt-1"}
    assert len({i.rsplit("/", 1)[0] for i in ids}) == 1  # one trial, two paid attempts
    assert result.certificate.epsilon_rdp == pytest.approx(
        epsilon([m for _, m in result.certificate.charges], 1e-5, Accountant.RDP))
    assert not any(t["error"] for t in result.private_trials)


def test_a_ledger_refusal_is_logged_without_a_traceback(caplog) -> None:
    """Issue #31: a grid the ledger stops mid-search printed Tune's "Trial task failed"
    record with a full traceback for the refused trial (the documented halting rule, nothing
    charged). The refusal is one line naming it; any other trial error keeps its traceback."""
    import logging

    from ray.exceptions import RayTaskError

    from raydp_hpo.errors import BudgetExhaustedError
    from raydp_hpo.tune.run_output import (
        _TUNE_CONTROLLER_LOGGER,
        _ledger_refusals_without_traceback,
    )

    refused = RayTaskError("train", "Traceback ...",
                           BudgetExhaustedError("g/t1", 1.7, 1.3, 1.5, 1e-5))
    refused = refused.as_instanceof_cause()
    crash = RayTaskError("train", "Traceback ...", ZeroDivisionError("boom"))
    logger = logging.getLogger(_TUNE_CONTROLLER_LOGGER)
    with caplog.at_level(logging.INFO, logger=_TUNE_CONTROLLER_LOGGER), \
            _ledger_refusals_without_traceback():
        logger.error("Trial task failed for trial t1", exc_info=refused)
        logger.error("Trial task failed for trial t2", exc_info=crash)
    first, second = caplog.records
    assert first.exc_info is None and first.levelname == "WARNING"
    assert "refused by the ledger" in first.getMessage() and "'g/t1'" in first.getMessage()
    assert "Traceback" not in caplog.text.split("t2")[0]
    assert second.exc_info is not None  # a real crash keeps its traceback
    assert not logger.filters  # removed after the search


def test_resume_needs_the_experiments_charges_on_its_ledger(tmp_path: Path) -> None:
    """require_earlier_charges (issue #31): a missing journal, or one without a charge of the
    experiment, is refused by name and read only (nothing created); one with them passes."""
    from raydp_hpo.accounting.mechanisms import SubsampledGaussian
    from raydp_hpo.tune.tuner import require_earlier_charges

    journal = tmp_path / "ledger.journal"
    with pytest.raises(LedgerMismatchError, match=f"{journal}, which does not exist"):
        require_earlier_charges(journal, "exp")
    assert not journal.exists()
    with PrivacyLedger(PrivacyBudget(3.0, 1e-5), journal) as ledger:
        ledger.charge("other/plan", SubsampledGaussian(2.0, 0.01, 10))
    before = journal.read_bytes()
    with pytest.raises(LedgerMismatchError, match="holds no charge of this run .*'exp/'"):
        require_earlier_charges(journal, "exp")
    with pytest.raises(LedgerMismatchError, match="'exp/'"):
        require_earlier_charges(journal, "exp", ())  # a live ledger's charges
    with PrivacyLedger.open(journal) as ledger:
        ledger.charge("exp/plan", SubsampledGaussian(2.0, 0.01, 10))
        charges = ledger.charges()
    require_earlier_charges(journal, "exp")
    require_earlier_charges(None, "exp", charges, where="the shared ledger 'x'")
    assert journal.read_bytes().startswith(before)
