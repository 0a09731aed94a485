"""The Tune-shaped DPTuner API without Ray: keywords, Tune configs taken or refused, restore.

Every refusal happens in the constructor, before Ray starts: ``ray.init`` is replaced by a
function that fails the test if anything calls it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
from ray.tune.search import BasicVariantGenerator
from ray.tune.stopper import MaximumIterationStopper

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.ledger.filter import Adaptivity
from raydp_hpo.searchers import OneShotRandomSearch, RandomStoppingSearch
from raydp_hpo.trainables.data import Dataset, DataSplits, PublicSizes, split
from raydp_hpo.tune.config import DEFAULT_MAX_CONCURRENT_TRIALS
from raydp_hpo.tune.result import DPResult, completed_release
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.searchers._results import complete

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(4.0, 1e-5)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    # public_size: the total is declared public, so split() declares the split sizes
    return split(Dataset(rng.normal(size=(500, 4)).astype(np.float32),
                         rng.integers(0, 2, size=500), 2, public_size=500), 0.2, 0.2)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Ray must not start while DPTuner's arguments are checked")

    monkeypatch.setattr(ray, "init", refuse)


def make(data, **kwargs) -> DPTuner:
    args = {"param_space": SPACE, "search": "random_stopping", "budget": BUDGET, "data": data,
            "fresh_budget": not {"ledger", "dataset"} & kwargs.keys(), **kwargs}
    return DPTuner(None, **args)


def test_everything_after_the_trainable_is_a_keyword(data) -> None:
    with pytest.raises(TypeError, match="positional"):
        DPTuner(None, SPACE, "random_stopping", BUDGET, data=data, fresh_budget=True)  # type: ignore[misc]
    tuner = make(data)
    assert tuner._max_concurrent == DEFAULT_MAX_CONCURRENT_TRIALS
    assert tuner._max_failures == 0 and tuner._reuse_actors is True
    assert (tuner._metric, tuner._mode) == ("val_accuracy", "max")


# ------------------------------------------------------------------ refused Tune settings

REFUSED = {
    "scheduler ASHA": ({"tune_config": tune.TuneConfig(scheduler=ASHAScheduler())},
                       "tune_config.scheduler='AsyncHyperBandScheduler'.*unreleased per-trial metrics"),
    "scheduler median": ({"tune_config": tune.TuneConfig(scheduler=MedianStoppingRule())},
                         "tune_config.scheduler='MedianStoppingRule'.*paid"),
    "search_alg": ({"tune_config": tune.TuneConfig(search_alg=BasicVariantGenerator())},
                   "tune_config.search_alg='BasicVariantGenerator'.*search="),
    "num_samples": ({"tune_config": tune.TuneConfig(num_samples=20)},
                    "tune_config.num_samples=20.*privacy plan decides how many trials"),
    "time_budget_s": ({"tune_config": tune.TuneConfig(time_budget_s=60)},
                      "tune_config.time_budget_s=60.*paid in full"),
    "metric conflict": ({"tune_config": tune.TuneConfig(metric="loss"), "metric": "val_accuracy"},
                        "tune_config.metric='loss' conflicts with DPTuner\\(metric="),
    "mode conflict": ({"tune_config": tune.TuneConfig(mode="min"), "mode": "max"},
                      "tune_config.mode='min' conflicts"),
    "concurrency conflict": ({"tune_config": tune.TuneConfig(max_concurrent_trials=3),
                              "max_concurrent_trials": 4}, "max_concurrent_trials=3 conflicts"),
    "stop dict": ({"run_config": tune.RunConfig(stop={"training_iteration": 2})},
                  "run_config.stop=.*ends trials early"),
    "stopper": ({"run_config": tune.RunConfig(stop=MaximumIterationStopper(2))},
                "run_config.stop=.*ledger refuses"),
    "fail_fast": ({"run_config": tune.RunConfig(
        failure_config=tune.FailureConfig(fail_fast=True))},
        "run_config.failure_config.fail_fast=True.*truncation of the plan"),
    "checkpoint score": ({"run_config": tune.RunConfig(checkpoint_config=tune.CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="val_accuracy"))},
        "checkpoint_score_attribute='val_accuracy'.*unreleased per-trial metric"),
    "name conflict": ({"run_config": tune.RunConfig(name="a"), "experiment": "b"},
                      "run_config.name='a' conflicts with DPTuner\\(experiment='b'\\)"),
    "Train's RunConfig": ({"run_config": ray.train.RunConfig()}, "ray.train.RunConfig is Ray"),
    "not a TuneConfig": ({"tune_config": {"num_samples": 3}}, "must be a ray.tune.TuneConfig"),
    "retries under a plan": ({"max_failures": 1}, "max_failures=1 is refused.*plan charge"),
    "retries via RunConfig": ({"run_config": tune.RunConfig(
        failure_config=tune.FailureConfig(max_failures=2))}, "max_failures=2 is refused"),
    "unlimited retries": ({"search": "grid_composed", "max_failures": -1},
                          "max_failures must be an integer >= 0"),
    "unknown search": ({"search": "asha"}, "search='asha' is neither.*random_stopping"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_before_ray_starts(data, case: str) -> None:
    kwargs, message = REFUSED[case]
    with pytest.raises(InvalidParameterError, match=message):
        make(data, **kwargs)


def test_storage_filesystem_is_refused(data) -> None:
    import pyarrow.fs

    with pytest.raises(InvalidParameterError, match="storage_filesystem.*local"):
        make(data, run_config=tune.RunConfig(storage_filesystem=pyarrow.fs.LocalFileSystem()))


def test_metric_conflicting_with_the_constructed_searcher_is_refused(data) -> None:
    searcher = RandomStoppingSearch(None, metric="val_accuracy", mode="max", mean=2.0)
    with pytest.raises(InvalidParameterError, match="mode='min' conflicts with the searcher"):
        make(data, search=searcher, tune_config=tune.TuneConfig(mode="min"))


# ------------------------------------------------------------------ taken Tune settings

def test_safe_settings_are_taken_from_the_configs(data, tmp_path: Path) -> None:
    mine, theirs = tune.Callback(), tune.Callback()
    tuner = make(
        data,
        search="grid_composed",
        param_space={**SPACE, "lr": tune.grid_search([0.1, 0.2]), "noise_multiplier": 2.0},
        callbacks=[mine],
        tune_config=tune.TuneConfig(scheduler=FIFOScheduler(), max_concurrent_trials=5,
                                    metric="val_accuracy", mode="max", num_samples=-1),
        run_config=tune.RunConfig(
            name="from-run-config", storage_path=str(tmp_path), verbose=0, callbacks=[theirs],
            failure_config=tune.FailureConfig(max_failures=2),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )
    assert tuner.experiment == "from-run-config"
    assert tuner.experiment_path == tmp_path.resolve() / "from-run-config"
    assert tuner._max_concurrent == 5 and tuner._verbose == 0
    assert tuner._max_failures == 2  # every trial charges itself: each retry pays again
    # a retry's charge exists because a trial failed: only the RDP filter is valid for that
    assert tuner._dedicated_adaptivity() is Adaptivity.ADAPTIVE
    no_retries = make(data, search="grid_composed",
                      param_space={**SPACE, "lr": tune.grid_search([0.1, 0.2]),
                                   "noise_multiplier": 2.0}, storage_path=tmp_path)
    assert no_retries._dedicated_adaptivity() is Adaptivity.FIXED_PLAN
    assert tuner._callbacks == [mine, theirs]
    assert tuner._settings.checkpoint_config.num_to_keep == 2


def test_a_value_given_twice_alike_is_accepted(data, tmp_path: Path) -> None:
    tuner = make(data, storage_path=tmp_path, experiment="same", max_concurrent_trials=3,
                 tune_config=tune.TuneConfig(max_concurrent_trials=3),
                 run_config=tune.RunConfig(name="same", storage_path=str(tmp_path)))
    assert tuner.experiment == "same" and tuner._max_concurrent == 3


def test_constructed_searcher_lends_its_space_and_metric(data) -> None:
    searcher = OneShotRandomSearch(SPACE, metric="val_accuracy", mode="max", dataset_size=300,
                                   budget=BUDGET)
    tuner = DPTuner(None, search=searcher, budget=BUDGET, data=data, fresh_budget=True)
    assert tuner._space == SPACE and tuner._metric == "val_accuracy"
    equal = pickle.loads(pickle.dumps(SPACE))  # equal values, other Domain objects
    assert DPTuner(None, param_space=equal, search=searcher, budget=BUDGET, data=data,
                   fresh_budget=True)
    with pytest.raises(InvalidParameterError, match="give the space once"):
        DPTuner(None, param_space={**SPACE, "epochs": 2}, search=searcher, budget=BUDGET,
                data=data, fresh_budget=True)
    with pytest.raises(InvalidParameterError, match="param_space is missing"):
        DPTuner(None, search="one_shot_random", budget=BUDGET, data=data, fresh_budget=True)


# ------------------------------------------------------------------ restore / can_restore

def _started(tuner: DPTuner) -> Path:
    """What fit() leaves before Tune runs: the restore file, and Tune's state file."""
    exp_dir = tuner.experiment_path
    tuner._write_restore_file(exp_dir)
    (exp_dir / "tune").mkdir(parents=True)
    (exp_dir / "tune" / "tuner.pkl").write_bytes(b"")  # what tune.Tuner.can_restore looks for
    return exp_dir


def test_can_restore_needs_the_restore_file_and_tune_state(data, tmp_path: Path) -> None:
    assert not DPTuner.can_restore(tmp_path / "nothing")
    tuner = make(data, storage_path=tmp_path, experiment="e1", search_kwargs={"mean": 2.0})
    exp_dir = _started(tuner)
    assert DPTuner.can_restore(exp_dir) and DPTuner.can_restore(str(exp_dir))
    (exp_dir / "dptuner.pkl").unlink()
    assert not DPTuner.can_restore(exp_dir)  # Tune's state alone is not a DPTuner run
    with pytest.raises(InvalidParameterError, match="nothing to restore"):
        DPTuner.restore(exp_dir, data=data)


def test_restore_rebuilds_the_settings_but_no_secret(data, tmp_path: Path) -> None:
    tuner = make(data, storage_path=tmp_path, experiment="e2", search_kwargs={"mean": 2.0},
                 secret_seed=123456789, dataset_size=300, max_concurrent_trials=1,
                 tune_config=tune.TuneConfig(mode="max"))
    exp_dir = _started(tuner)
    raw = (exp_dir / "dptuner.pkl").read_bytes()
    assert b"123456789" not in raw and pickle.loads(raw)["args"]["dataset_size"] == 300
    restored = DPTuner.restore(exp_dir, data=data)
    assert restored._resume is True and restored.experiment == "e2"
    assert restored.experiment_path == exp_dir
    assert restored._secret_seed is None  # the secret seed is passed again, never stored
    assert pickle.dumps(restored._space) == pickle.dumps(tuner._space)
    for attr in ("_budget", "_metric", "_mode", "_search", "_search_kwargs",
                 "_dataset_size", "_max_concurrent", "_max_failures", "_reuse_actors"):
        assert getattr(restored, attr) == getattr(tuner, attr), attr
    assert DPTuner.restore(exp_dir, data=data, secret_seed=123456789)._secret_seed == 123456789


def test_restore_asks_again_for_a_constructed_searcher(data, tmp_path: Path) -> None:
    searcher = RandomStoppingSearch(None, metric="val_accuracy", mean=2.0)
    exp_dir = _started(make(data, storage_path=tmp_path, experiment="e3", search=searcher))
    with pytest.raises(InvalidParameterError, match="RandomStoppingSearch.*pass search="):
        DPTuner.restore(exp_dir, data=data)
    again = RandomStoppingSearch(None, metric="val_accuracy", mean=2.0)
    assert DPTuner.restore(exp_dir, data=data, search=again)._search is again
    # a searcher built with its space (equal, not the same objects) is accepted as well
    own = RandomStoppingSearch(dict(pickle.loads(pickle.dumps(SPACE))), metric="val_accuracy",
                               mean=2.0, dataset_size=300, budget=BUDGET)
    assert DPTuner.restore(exp_dir, data=data, search=own)._search is own


# ------------------------------------------------------------------ the result

def test_private_result_grid_is_not_released() -> None:
    from raydp_hpo.tune.tuner import PrivacyCertificate

    cert = PrivacyCertificate("a", "p", "d", BUDGET, (), 0.0, 0.0, "l", 0.0, "fixed_plan/rdp")
    grid = object()
    result = DPResult(None, None, None, cert, None, False, private_result_grid=grid)
    assert result.private_result_grid is grid
    assert "private_result_grid" not in result.public() and "grid" not in repr(result)


# ------------------------------------------------------------------ searcher hand-over

def test_a_space_error_surfaces_from_the_hand_over(data) -> None:
    searcher = OneShotRandomSearch(None, metric="val_accuracy")
    assert not searcher.has_space
    with pytest.raises(SearchSpaceError, match="needs 'epochs'"):
        searcher.set_search_properties("val_accuracy", "max", {"lr": 0.1}, dataset_size=300,
                                       budget=BUDGET)
    assert not searcher.has_space  # still waiting for a space: the hand-over can be retried
    assert searcher.set_search_properties("val_accuracy", "max", SPACE, dataset_size=300,
                                          budget=BUDGET)
    assert searcher.has_space and searcher.privacy_plan().algorithm == "one_shot_random"


def test_the_certificate_says_whether_the_number_of_classes_was_declared(data, tmp_path) -> None:
    from raydp_hpo.trainables.data import Dataset, DataSplits

    def undeclared(d: Dataset) -> Dataset:
        return Dataset(d.features, d.labels, d.num_classes, num_classes_declared=False)

    declared = dict(make(data, storage_path=tmp_path)._release_builder()
                    .public_quantities())
    assert declared["number of classes"] == f"{data.train.num_classes} (declared)"
    read_off = DataSplits(undeclared(data.train), undeclared(data.val), undeclared(data.test))
    with pytest.warns(UserWarning, match="sizes_public=True"):
        tuner = make(read_off, storage_path=tmp_path, sizes_public=True)
    public = dict(tuner._release_builder().public_quantities())
    assert "treated as public" in public["number of classes"]


def test_a_search_cut_short_releases_nothing() -> None:
    """Tune returns normally when a run is interrupted (SIGINT): random stopping's best of the
    first J < K trials is not the charged mechanism's output, and a later resume would select
    a second time. Nothing is released until the search has finished with no trial running."""
    space = {"lr": tune.loguniform(1e-3, 1.0), "epochs": 1, "sample_rate": 0.01,
             "noise_multiplier": 2.0}
    searcher = next(
        s for seed in range(200)
        if (s := RandomStoppingSearch(space, metric="val_accuracy", dataset_size=1000,
                                      budget=PrivacyBudget(50.0, 1e-5), seed=seed, mean=5))._k >= 3
    )
    for i in range(3):
        assert isinstance(searcher.suggest(f"t{i}"), dict)
    complete(searcher, "t0", {"val_accuracy": 0.9})
    cut = completed_release(searcher)
    assert cut.hyperparameters is None and cut.trial_id is None and cut.extras["interrupted"]
    assert not searcher.search_completed()
    # the rest of the K trials run and finish (a resumed run): one release, of all K
    complete(searcher, "t1", {"val_accuracy": 0.5})
    complete(searcher, "t2", {"val_accuracy": 0.5})
    i = 3
    while isinstance(searcher.suggest(f"t{i}"), dict):
        assert not completed_release(searcher).hyperparameters  # t{i} still running
        complete(searcher, f"t{i}", {"val_accuracy": 0.1})
        i += 1
    assert i == searcher._k and searcher.search_completed()
    done = completed_release(searcher)
    assert done.trial_id == "t0" and done.hyperparameters is not None


# ------------------------------------------------------------------ public sizes (issue #31)

def _hand_built(data) -> DataSplits:
    """The same records with no declared sizes (a Parquet table's splits, or hand-built ones)."""
    return DataSplits(data.train, data.val, data.test)


def test_sizes_read_from_private_data_are_refused(data, tmp_path) -> None:
    """Without declared sizes DPTuner used the realised split sizes as public normalisers
    (one validation record moved the score by more than its noise covers). Now a run that
    needs one refuses, naming each missing size but not its private realised value."""
    private = _hand_built(data)
    with pytest.raises(InvalidParameterError) as caught:
        make(private, storage_path=tmp_path, test_accuracy_epsilon=0.5)
    message = str(caught.value)
    for name in ("dataset_size", "validation_size", "test_size", "sizes_public=True"):
        assert name in message
    for realised in {len(private.train), len(private.val), len(private.test)}:
        assert str(realised) not in message  # private: never printed
    # which sizes a run needs: the validation size only when a selection reads private scores
    with pytest.raises(InvalidParameterError) as caught:
        make(private, search_kwargs={"score_epsilon": None})
    assert "dataset_size" in str(caught.value) and "validation_size" not in str(caught.value)
    with pytest.raises(InvalidParameterError, match="validation_size"):
        make(private, dataset_size=300)  # random stopping reads noisy scores
    with pytest.raises(InvalidParameterError, match="validation_size"):
        make(private, dataset_size=300, search="svt_threshold")  # SVT's utility over n_val
    one_shot = make(private, dataset_size=300, search="one_shot_random")  # reads no score
    assert one_shot._dataset_size == 300
    # declared ones are used as they are
    declared = make(private, dataset_size=300, validation_size=100)
    assert (declared._dataset_size, declared._validation_size) == (300, 100)
    # a number of classes read off the labels is refused the same way
    read_off = DataSplits(*(Dataset(d.features, d.labels, d.num_classes,
                                    num_classes_declared=False)
                            for d in (private.train, private.val, private.test)))
    with pytest.raises(InvalidParameterError, match="num_classes"):
        make(read_off, dataset_size=300, validation_size=100)


def test_sizes_public_accepts_the_realised_sizes_and_says_so(data, tmp_path) -> None:
    private = _hand_built(data)
    with pytest.warns(UserWarning, match="realised training-set, validation-set size"):
        tuner = make(private, storage_path=tmp_path, sizes_public=True)
    public = dict(tuner._release_builder().public_quantities())
    assert public["training-set size"] == (f"{len(private.train)} (taken from the data and "
                                           "treated as public: sizes_public=True)")
    assert public["validation-set size"].startswith(f"{len(private.val)} (taken from the data")
    with pytest.raises(InvalidParameterError, match="sizes_public must be True or False"):
        make(private, sizes_public="yes")


def test_a_searchers_own_sizes_are_declarations(data) -> None:
    """A searcher constructed with its own dataset_size declares it (its trials get it);
    DPTuner keywords that contradict it are refused."""
    searcher = OneShotRandomSearch(SPACE, metric="val_accuracy", mode="max", dataset_size=321,
                                   budget=BUDGET)
    tuner = DPTuner(None, search=searcher, budget=BUDGET, data=_hand_built(data),
                    fresh_budget=True)
    assert tuner._dataset_size == 321
    public = dict(tuner._release_builder().public_quantities())
    assert "declared by the searcher" in public["training-set size"]
    with pytest.raises(InvalidParameterError, match="conflicts with the searcher's own"):
        DPTuner(None, search=searcher, budget=BUDGET, data=data, dataset_size=300,
                fresh_budget=True)


def _neighbours() -> tuple[Dataset, Dataset]:
    """Two add/remove-one neighbouring datasets of the same declared public size N = 500: the
    second has one record more, one that split() puts into the validation split."""
    from raydp_hpo.trainables.data import record_uniforms

    rng = np.random.default_rng(7)
    x = rng.normal(size=(500, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=500)
    extra = rng.normal(size=(50, 4)).astype(np.float32)
    candidates = Dataset(extra, np.zeros(50, dtype=np.int64), 2)
    index = int(np.flatnonzero(record_uniforms(candidates, 0) < 0.2)[0])  # a validation record
    bigger = Dataset(np.concatenate([x, extra[index:index + 1]]),
                     np.concatenate([y, [0]]).astype(np.int64), 2, public_size=500)
    return Dataset(x, y.astype(np.int64), 2, public_size=500), bigger


def _trial_normalisers(tuner: DPTuner, data) -> tuple[float, float, int]:
    """(q, DP-SGD normaliser q·n_view, score normaliser n_val) of the first trial the run's
    searcher suggests, as the built-in trainable computes them from its config and data."""
    from raydp_hpo.trainables.training import declared_privacy, public_sizes
    from raydp_hpo.trial.settings import RaydpSettings

    searcher = tuner._build_searcher(None, Adaptivity.FIXED_PLAN)
    config = searcher.suggest("t0")
    privacy, n_view = declared_privacy(config, data)
    _, n_val = public_sizes(RaydpSettings.from_config(config), data)
    return privacy.sample_rate, privacy.sample_rate * n_view, n_val


def test_declared_sizes_make_every_normaliser_independent_of_the_split(tmp_path) -> None:
    """Two neighbouring datasets (one validation record more) split with declared sizes give
    the same q (from batch_size), DP-SGD normaliser and score normaliser; with the realised
    sizes accepted as public (sizes_public=True, the old default) the score normaliser moves."""
    small, big = _neighbours()
    a, b = split(small, 0.2, 0.2), split(big, 0.2, 0.2)
    realised = [(len(d.train), len(d.val), len(d.test)) for d in (a, b)]
    assert realised[1][1] == realised[0][1] + 1  # the neighbours' validation splits differ
    assert a.declared_sizes == b.declared_sizes == PublicSizes(300, 100, 100)
    space = {**SPACE, "batch_size": 30, "noise_multiplier": 3.0}
    del space["sample_rate"]
    kwargs = {"param_space": space, "storage_path": tmp_path, "secret_seed": 1,
              "search_kwargs": {"mean": 2.0}}
    declared = [_trial_normalisers(make(d, **kwargs), d) for d in (a, b)]
    assert declared[0] == declared[1] == (30 / 300, 30.0, 100)  # exact: public numbers only
    with pytest.warns(UserWarning):
        accepted = [_trial_normalisers(make(_hand_built(d), sizes_public=True, **kwargs), d)
                    for d in (a, b)]
    assert accepted[0][2] != accepted[1][2]  # the realised n_val: it depends on the record
