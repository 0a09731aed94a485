"""The budget belongs to the data: DPTuner charges the dataset's ledger by default, the same
one ``raydp-hpo run`` charges (issue #31); a fresh per-experiment budget is explicit."""

from __future__ import annotations

import contextlib
import logging
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.config.data import DigitsData, Mnist1dData, ParquetData
from raydp_hpo.errors import BudgetTooSmallError, InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.experiments import experiment_delta
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.trainables.data import (
    Dataset,
    DataSplits,
    dataset_ledger_name,
    load_digits,
    load_mnist1d,
    load_parquet,
    split,
)
from raydp_hpo.tune.dataset_ledger import create_dataset_ledger, dataset_ledger_journal
from raydp_hpo.tune.dataset_points import DatasetPlace
from raydp_hpo.tune.tuner import DPTuner

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(2.0, 1e-5)


def _unnamed() -> DataSplits:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    return split(Dataset(x, (x[:, 0] > 0).astype(np.int64), 2), 0.2, 0.2)


def test_loaders_name_their_data_as_experiment_files_do(tmp_path: Path) -> None:
    """The Python loaders and experiment files name the same data the same way, so DPTuner
    and `raydp-hpo run` on it charge one ledger."""
    mnist = split(load_mnist1d(num_samples=200, seed=3), 0.2, 0.2)
    assert mnist.name == "mnist1d:size=200:generator_seed=3"
    assert dataset_ledger_name(mnist.name) == Mnist1dData(
        source="mnist1d", size=200, generator_seed=3).ledger_name()
    digits = split(load_digits())
    assert digits.name == "digits" == DigitsData(source="digits").fingerprint()
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [0.1, 0.2, 0.3, 0.4], "y": [0, 1, 0, 1]}), path)
    table = load_parquet(str(path), label_column="y")
    assert table.name == f"parquet:file://{path.resolve()}"
    assert table.name == ParquetData(
        source="parquet", uri=str(path), label_column="y", sizes_public=True).fingerprint()
    # every split and subset keeps the name: the budget is the whole dataset's
    assert {mnist.train.name, mnist.val.name, mnist.test.name} == {mnist.name}


def test_the_default_ledger_is_the_datasets(tmp_path: Path) -> None:
    data = split(load_mnist1d(num_samples=200, seed=3), 0.2, 0.2)
    tuner = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=tmp_path)
    assert tuner.ledger_name == dataset_ledger_name(data.name)
    named = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=_unnamed(), storage_path=tmp_path, dataset="census-2024",
                    sizes_public=True)
    assert named.ledger_name == dataset_ledger_name("census-2024")
    assert named.ledger_name.startswith("data-census-2024-")
    fresh = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=data, storage_path=tmp_path, experiment="own", fresh_budget=True)
    assert fresh.ledger_name == "ledger-own"


def test_unnamed_data_needs_a_choice_of_budget() -> None:
    with pytest.raises(InvalidParameterError, match="whose budget") as err:
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed())
    for hint in ("dataset=", "ledger=", "fresh_budget=True"):
        assert hint in str(err.value)
    for clash in ({"dataset": "x", "fresh_budget": True},):
        with pytest.raises(InvalidParameterError, match="give one of them"):
            DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                    data=_unnamed(), **clash)
    with pytest.raises(InvalidParameterError, match="fresh_budget must be"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed(), fresh_budget="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="dataset must be"):
        DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_unnamed(), dataset="  ")


@pytest.mark.ray
def test_two_experiments_on_one_dataset_spend_one_budget(ray_session, tmp_path: Path,
                                                         caplog) -> None:
    """The budget belongs to the data: with no ledger argument, a first experiment on a fresh
    dataset creates its ledger (its budget is the total) and is charged as its point: the
    certified ε is what the ledger records as spent (issue #30's ≥ 0.98). A second experiment
    on the same data gets only what is left — where each used to get a fresh ε of its own. A third asks for a fresh budget explicitly: it runs, is
    logged, and leaves the dataset's ledger alone."""
    import ray

    data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
    dataset = f"test-data-{uuid.uuid4().hex[:6]}"  # one ledger actor per test run
    journal = dataset_ledger_journal(tmp_path, dataset)
    lines: list[str] = []
    try:
        first = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=data, dataset=dataset, storage_path=tmp_path,
                        progress=lines.append).fit()
        assert any("new dataset ledger" in line for line in lines)
        report = PrivacyLedger.read_only(journal).report()
        assert report.adaptivity is Adaptivity.EXPERIMENTS
        assert [c.charge_id for c in report.charges] == [f"{first.certificate.charges[0][0]}"
                                                         .replace("/plan", "/point")]
        cert = first.certificate
        assert cert.dataset_ledger is not None and cert.dataset_ledger[0] == \
            dataset_ledger_name(dataset)
        assert cert.budget.delta == pytest.approx(experiment_delta(BUDGET.delta, 1), rel=1e-12)
        assert 0.98 * report.spent_epsilon <= cert.epsilon <= BUDGET.epsilon
        # only what the first left (ε ≈ 4e-5 since the first is priced at δ₁ = 0.78δ within
        # the calibration's tolerance of the whole ε: issue #38): its noise calibrated to it,
        # and said so — or, when even σ = 1e4 cannot fit that, refused before anything ran
        try:
            second = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                             data=data, dataset=dataset, storage_path=tmp_path,
                             progress=lines.append).fit()
        except BudgetTooSmallError as exc:
            assert "what the dataset has left" in str(exc)
            assert len(PrivacyLedger.read_only(journal).report().charges) == 1
        else:
            report = PrivacyLedger.read_only(journal).report()
            assert len(report.charges) == 2 and report.spent_epsilon <= BUDGET.epsilon
            assert second.certificate.epsilon <= BUDGET.epsilon - cert.epsilon + 1e-6
            assert second.hyperparameters["noise_multiplier"] > 10 * \
                first.hyperparameters["noise_multiplier"]
            assert any("what the dataset has left" in line for line in lines)
        before = journal.read_bytes()
        with caplog.at_level(logging.WARNING, logger="raydp_hpo.tune.tuner"):
            own = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                          data=data, storage_path=tmp_path, fresh_budget=True).fit()
        assert any("fresh budget of its own" in r.message for r in caplog.records)
        assert own.certificate.ledger_name.startswith("ledger-")
        assert own.certificate.dataset_ledger is None
        assert journal.read_bytes() == before
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dataset_ledger_name(dataset), namespace="raydp_hpo"))


@pytest.mark.slow
@pytest.mark.ray
def test_experiments_on_a_dataset_ledger_compose_within_its_budget(ray_session,
                                                                    tmp_path: Path) -> None:
    """A dataset ledger created with ε = 3 (create_dataset_ledger), then four experiments of
    ε = 1 (random stopping, one-shot, a grid whose trials charge themselves, one-shot): each
    is one charge there, the spend never exceeds 3, and each experiment's certificate is its
    own point (its ε at its δ share). What was admitted certifies at least 0.9 × the
    recorded spend; what did not fit was refused before it ran."""
    import ray

    data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
    dataset = f"test-data-{uuid.uuid4().hex[:6]}"
    journal = create_dataset_ledger(dataset, PrivacyBudget(3.0, 1e-5), tmp_path)
    grid = {**SPACE, "lr": tune.grid_search([0.1, 0.5]), "noise_multiplier": 3.0}
    runs = [("random_stopping", SPACE, {"mean": 2.0}), ("one_shot_random", SPACE, {}),
            ("grid_composed", grid, {}), ("one_shot_random", SPACE, {})]
    certified, refused = [], 0
    try:
        for k, (search, space, kwargs) in enumerate(runs, start=1):
            before = journal.read_bytes()
            try:
                result = DPTuner(None, param_space=space, search=search,
                                 budget=PrivacyBudget(1.0, 1e-5), data=data, dataset=dataset,
                                 storage_path=tmp_path, search_kwargs=kwargs).fit()
            except RayDPHPOError:
                refused += 1
                assert journal.read_bytes() == before
                continue
            cert = result.certificate
            assert cert.epsilon <= 1.0 + 1e-9 and cert.within_budget
            assert cert.budget.delta <= experiment_delta(1e-5, k)
            certified.append(cert.epsilon)
        report = PrivacyLedger.read_only(journal).report()
        assert len(report.charges) == len(certified) >= 3
        assert report.spent_epsilon <= 3.0
        assert sum(certified) >= 0.9 * report.spent_epsilon
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dataset_ledger_name(dataset), namespace="raydp_hpo"))


def test_an_experiment_is_calibrated_as_its_point_and_resumes_as_the_same_point() -> None:
    """Without Ray, on a real dataset ledger (``PrivacyLedger``, what the actor serves): the
    experiment takes the next δ share, its searcher calibrates σ so that its plan is
    admitted there as one point, its own ledger gets exactly that point, and a resume (the
    point already charged) reproduces the same plan — a replay, not a second charge. Another
    experiment admitted in between makes the charge fail loudly, with nothing charged."""
    from raydp_hpo.accounting.accountants import Accountant, epsilon
    from raydp_hpo.accounting.budget import PrivacyBudget as Budget

    data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
    class Named(PrivacyLedger):  # the actor handle's one extra: its name
        name = "data-x"

    ledger = Named(Budget(3.0, 1e-5), adaptivity=Adaptivity.EXPERIMENTS,
                   accountant=Accountant.TIGHTEST)
    ledger.charge("earlier/point", SubsampledGaussian(1.0, 0.02, 300))

    def plan(resume: bool, run_id: str | None = None):
        tuner = DPTuner(None, param_space=SPACE, search="random_stopping", budget=BUDGET,
                        data=data, dataset="x", experiment="exp", search_kwargs={"mean": 2.0})
        if run_id is not None:  # a resume continues the run its experiment dir records
            tuner._set_run_id(run_id)
        # what DPTuner.fit does on a dataset ledger, up to the Tune run
        place = tuner._place = DatasetPlace.take(ledger, tuner._point_request(), resume=resume)
        tuner._budget = tuner._search_budget = place.budget
        assert place.plan_rule is not None  # its plan is its point: calibrated to fit there
        searcher = tuner._build_searcher(None, Adaptivity.FIXED_PLAN)
        p = searcher.privacy_plan()
        return place, place.point(p, searcher), p.mechanism

    place, point, mechanism = plan(resume=False)
    # another run, planned at the same time as the same (2nd) charge: a race
    racing, racing_point, _ = plan(resume=False)
    assert place.slot.k == 2 and place.slot.delta == experiment_delta(1e-5, 2)
    assert point.mechanism == mechanism and ledger.would_admit(mechanism)
    figure = epsilon(mechanism, place.slot.delta, Accountant.TIGHTEST)
    assert point.budget.epsilon == pytest.approx(figure, rel=1e-6)  # its own ledger's budget
    assert figure <= BUDGET.epsilon
    place.reserve(point)
    run_id = place.request.charge_prefix.removeprefix("exp@")
    assert [c.charge_id for c in ledger.charges()] == ["earlier/point", f"exp@{run_id}/point"]
    # the point is on the ledger: k and prior as before
    again, again_point, same = plan(resume=True, run_id=run_id)
    assert again.slot.k == 2 and same == mechanism and again_point == point
    again.reserve(again_point)  # a replay
    assert len(ledger.charges()) == 2
    # the race: another experiment was admitted between its planning and its charge
    ledger.charge("sneaked/point", SubsampledGaussian(50.0, 0.01, 10))
    before = ledger.charges()
    with pytest.raises(RayDPHPOError, match="run this experiment again"):
        racing.reserve(racing_point)
    assert ledger.charges() == before


def test_a_grid_is_charged_as_its_whole_composition_when_the_dataset_can_pay_it() -> None:
    """A grid's trials charge themselves, but its configuration is fixed up front: its point
    on the dataset ledger is the whole grid's composition (its tightest figure, nothing more),
    not the experiment's whole ε; when the dataset cannot pay the whole grid, it reserves
    what basic composition has left and its own ledger stops the grid within it."""
    from raydp_hpo.accounting.accountants import Accountant, epsilon
    from raydp_hpo.accounting.budget import PrivacyBudget as Budget
    from raydp_hpo.accounting.mechanisms import ApproxDP

    data = split(load_mnist1d(num_samples=600, seed=5), 0.2, 0.2, seed=0)
    grid = {**SPACE, "lr": tune.grid_search([0.1, 0.5]), "noise_multiplier": 3.0}

    class Named(PrivacyLedger):
        name = "data-x"

    def point(total: float):
        ledger = Named(Budget(total, 1e-5), adaptivity=Adaptivity.EXPERIMENTS,
                       accountant=Accountant.TIGHTEST)
        tuner = DPTuner(None, param_space=grid, search="grid_composed",
                        budget=Budget(8.0, 1e-5), data=data, dataset="x", experiment="g")
        place = tuner._place = DatasetPlace.take(ledger, tuner._point_request(), resume=False)
        tuner._budget = tuner._search_budget = place.budget
        searcher = tuner._build_searcher(None, Adaptivity.FIXED_PLAN)
        return searcher, place.point(searcher.privacy_plan(), searcher)

    searcher, whole_grid = point(8.0)
    assert whole_grid.mechanism == searcher.composed_mechanism()
    whole = epsilon(whole_grid.mechanism, experiment_delta(1e-5, 1), Accountant.TIGHTEST)
    assert whole_grid.budget.epsilon == pytest.approx(whole, rel=1e-6) and whole < 8.0
    _, reserved = point(0.95 * whole)  # the dataset cannot pay the whole grid
    assert isinstance(reserved.mechanism, ApproxDP)
    assert reserved.mechanism.epsilon == pytest.approx(0.95 * whole)
    assert reserved.budget.epsilon == reserved.mechanism.epsilon
