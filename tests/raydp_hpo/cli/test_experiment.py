"""Experiment files: parsing and eager validation (each bad-input case), no Ray started."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.experiment import (
    ExperimentFile,
    build_param_space,
    load_data,
    load_experiment,
    parse_experiment,
    validate_search,
)
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import ConfigError
from tests.raydp_hpo.cli.bad_input_catalogue import _DELETE, _set

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "cluster/examples/mnist1d_small.yaml"


@pytest.fixture
def raw() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_file_parses_into_frozen_specs() -> None:
    spec = load_experiment(EXAMPLE)
    assert isinstance(spec, ExperimentFile)
    assert spec.experiment == "mnist1d-small"
    assert spec.budget == PrivacyBudget(8.0, 1e-5)
    assert spec.data.source == "mnist1d" and spec.data.size == 2000
    assert spec.search.algorithm == "random_stopping"
    assert spec.search.settings == {"distribution": "geometric", "mean": 2}
    assert spec.ledger is None
    assert spec.tensorboard is False  # Tune's per-trial TensorBoard files: opt-in
    assert parse_experiment({**yaml.safe_load(EXAMPLE.read_text()), "tensorboard": True}
                            ).tensorboard is True
    assert spec.run_dir == Path(spec.storage_path) / "mnist1d-small"
    with pytest.raises(AttributeError):
        spec.experiment = "x"  # type: ignore[misc]


def test_domains_become_tune_domains(raw: dict[str, Any]) -> None:
    from ray.tune.search.sample import Categorical, Float, Integer

    raw["space"].update(
        a={"uniform": [0, 1]}, b={"randint": [1, 5]}, c={"grid": [1, 2]},
        d={"quniform": [0, 1, 0.1]}, e="constant",
    )
    space = build_param_space(parse_experiment(raw))
    assert isinstance(space["lr"], Float) and isinstance(space["a"], Float)
    assert isinstance(space["b"], Integer)
    assert isinstance(space["batch_size"], Categorical)
    assert space["c"] == {"grid_search": [1, 2]}
    assert space["e"] == "constant" and space["epochs"] == 1
    assert space["model"] == "mlp"


def test_yaml_exponent_without_dot_is_a_number(raw: dict[str, Any]) -> None:
    raw["budget"] = {"epsilon": "4", "delta": "1e-5"}  # what PyYAML gives for 1e-5
    assert parse_experiment(raw).budget == PrivacyBudget(4.0, 1e-5)




@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("budgte", {"epsilon": 1, "delta": 1e-5}, "unknown key 'budgte'.*did you mean 'budget'"),
        ("data.sise", 100, "unknown key 'sise' in data; did you mean 'size'"),
        ("search.setings", {}, "did you mean 'settings'"),
        ("budget.epsilno", 1.0, "did you mean 'epsilon'"),
        ("resources.gpus", 1, "did you mean 'gpu'"),
        ("ledger", {"nme": "x"}, "did you mean 'name'"),
        ("space.lr", {"loguniforn": [0.1, 1]}, "unknown domain 'loguniforn'.*'loguniform'"),
        ("space.lr", {"loguniform": [0, 1]}, "low > 0"),
        ("space.lr", {"uniform": [2, 1]}, "low < high"),
        ("space.lr", {"uniform": [1]}, "list of 2 numbers"),
        ("space.lr", {"choice": []}, "non-empty list"),
        ("space.lr", {"uniform": [0, 1], "x": 1}, "one-key domain"),
        ("space.model", "cnn1d", "reserved"),
        ("space", {}, "at least one key"),
        ("data.source", "mnist", "did you mean 'mnist1d'"),
        ("data.uri", "x.parquet", "only for source 'parquet'"),
        ("data.size", 5, ">= 10"),
        ("data.val_fraction", 0.95, "< 1"),
        ("model.name", "mlpp", "did you mean 'mlp'"),
        ("search.algorithm", "random_stoping", "did you mean 'random_stopping'"),
        ("search.mode", "maximise", "'max' or 'min'"),
        ("budget.epsilon", -1.0, "epsilon"),
        ("budget.delta", 2.0, "delta"),
        ("budget.delta", "tiny", "must be a number"),
        ("resources.cpu", -1, ">= 0"),
        ("split_seed", "zero", "integer"),
        ("secret_seed", -1, ">= 0"),
        ("seed", 0, "no longer accepted.*split_seed.*secret_seed"),
        ("data.declared_train_size", 0, ">= 1"),
        ("experiment", _DELETE, "needs the key 'experiment'"),
        ("storage_path", "s3://bucket/x", "mounted shared file system"),
        ("tensorboard", "yes", "tensorboard must be true or false"),
        ("ledger", {"name": "x", "budget": {"epsilon": 9, "delta": 1e-6}}, "one δ"),
    ],
)
def test_bad_input_names_the_key(raw: dict[str, Any], path: str, value: Any,
                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_experiment(_set(raw, path, value))


def test_parquet_source_needs_its_label_column(raw: dict[str, Any]) -> None:
    """Feature columns are listed only when needed (default: every column but the label);
    both kinds at once and a missing label column are refused."""
    raw["data"] = {"source": "parquet", "uri": "x.parquet", "label_column": "y", **_PQ_SIZES}
    spec = parse_experiment(raw)
    assert spec.data.feature_columns is None and spec.data.feature_column is None
    raw["data"]["feature_columns"] = ["a", "b"]
    spec = parse_experiment(raw)
    assert spec.data.feature_columns == ("a", "b")
    with pytest.raises(ConfigError, match="at most one of data.feature_columns"):
        parse_experiment(_set(raw, "data.feature_column", "x"))
    del raw["data"]["label_column"]
    with pytest.raises(ConfigError, match="needs data.label_column"):
        parse_experiment(raw)


def test_search_validation_before_anything_runs(raw: dict[str, Any]) -> None:
    raw["search"]["settings"] = {"distribution": "geometric", "mean": 2, "meen": 3}
    with pytest.raises(ConfigError, match="meen"):
        validate_search(parse_experiment(raw), 1600)
    raw["search"]["settings"] = {"mean": 50}
    raw["budget"] = {"epsilon": 0.5, "delta": 1e-5}
    with pytest.raises(ValueError, match="too small"):
        validate_search(parse_experiment(raw), 1600)


def test_gaussian_score_noise_in_search_settings(raw: dict[str, Any]) -> None:
    """search.settings.score_noise: gaussian (with its score_delta) reaches the searcher; a
    Gaussian score without δ_s or an unknown noise is refused before anything runs."""
    from raydp_hpo.errors import ConfigError

    raw["search"]["settings"] = {**raw["search"].get("settings", {}), "score_noise": "gaussian",
                                 "score_delta": 1.0e-6}
    validate_search(parse_experiment(raw), 1600)
    del raw["search"]["settings"]["score_delta"]
    with pytest.raises(ConfigError, match="needs score_delta"):
        validate_search(parse_experiment(raw), 1600)
    raw["search"]["settings"]["score_noise"] = "cauchy"
    with pytest.raises(ConfigError, match="unknown score_noise 'cauchy'"):
        validate_search(parse_experiment(raw), 1600)


def test_cli_run_bad_input_exit_code_and_dry_run(raw: dict[str, Any], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**raw, "split_sead": 1}))
    assert main(["run", str(bad)]) == EXIT_BAD_INPUT
    assert "did you mean 'split_seed'" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.yaml")]) == EXIT_BAD_INPUT
    assert main(["run", str(EXAMPLE), "--dry-run", "--storage-path", str(tmp_path)]) == EXIT_OK
    assert not (tmp_path / "mnist1d-small").exists()  # nothing ran
    broken = tmp_path / "broken.yaml"
    broken.write_text("experiment: [unclosed")
    assert main(["run", str(broken)]) == EXIT_BAD_INPUT


def test_no_default_secret_seed_and_never_in_run_metadata(raw: dict[str, Any]) -> None:
    """Experiment files have no default seed: absent or null = OS entropy. A given secret seed
    never reaches run.json (spec.to_dict()) or the spec's repr."""
    spec = parse_experiment(raw)
    assert spec.secret_seed is None and spec.split_seed == 0
    assert parse_experiment({**raw, "secret_seed": None}).secret_seed is None
    secret = parse_experiment({**raw, "secret_seed": 987654321})
    assert secret.secret_seed == 987654321
    assert "987654321" not in repr(secret) and "987654321" not in repr(secret.to_dict())
    assert secret.to_dict()["secret_seed_given"] is True
    from raydp_hpo.cli.config import validate_experiment_file

    assert "987654321" not in repr(validate_experiment_file({**raw, "secret_seed": 987654321}))
    with pytest.raises(ConfigError) as info:  # an error elsewhere does not echo the file
        parse_experiment({**raw, "secret_seed": 987654321, "budget": 8, "model": [1]})
    assert "987654321" not in str(info.value) and "987654321" not in repr(info.value.problems)


def test_budget_belongs_to_the_dataset(raw: dict[str, Any]) -> None:
    """Without a ledger block, experiments on the same data share the dataset's ledger,
    whatever their names; another dataset (or generator setting) gets another ledger."""
    a = parse_experiment(raw)
    b = parse_experiment({**raw, "experiment": "a-new-name-after-a-crash"})
    assert a.ledger_name == b.ledger_name and a.ledger_journal() == b.ledger_journal()
    assert a.ledger_name.startswith("data-mnist1d-")
    other = copy.deepcopy(raw)
    other["data"]["generator_seed"] = 7
    assert parse_experiment(other).ledger_name != a.ledger_name
    named = parse_experiment({**raw, "ledger": {"name": "fresh-budget"}})
    assert named.ledger_name == "fresh-budget"


def test_parquet_fingerprint_is_the_canonical_uri(raw: dict[str, Any], tmp_path: Path) -> None:
    raw["data"] = {"source": "parquet", "uri": str(tmp_path / "d.parquet"),
                   "label_column": "y", "feature_columns": ["a"], **_PQ_SIZES}
    a = parse_experiment(raw)
    raw["data"]["uri"] = "file://" + str(tmp_path / "d.parquet")
    assert parse_experiment(raw).ledger_name == a.ledger_name


def test_declared_public_sizes(raw: dict[str, Any]) -> None:
    spec = parse_experiment(raw)  # mnist1d, 2000 records, 10 % validation, 10 % test
    assert spec.data.public_sizes() == (1600, 200)
    raw["data"]["declared_train_size"] = 1500
    assert parse_experiment(raw).data.public_sizes() == (1500, 200)
    raw["data"] = {"source": "parquet", "uri": "x.parquet", "label_column": "y",
                   "feature_columns": ["a"], **_PQ_SIZES}
    assert parse_experiment(raw).data.public_sizes() == (240, 30)
    assert parse_experiment(raw).data.public_test_size() is None  # not declared
    raw["data"]["declared_test_size"] = 30
    assert parse_experiment(raw).data.public_test_size() == 30
    accepted = {k: v for k, v in raw["data"].items() if k not in _PQ_SIZES}
    raw["data"] = {**accepted, "sizes_public": True}  # the realised sizes, accepted
    assert parse_experiment(raw).data.public_sizes() == (None, None)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("learning_rate", 0.1, "not read by the DP trainable.*did you mean 'lr'"),
    ("lr", "fast", "'lr' must be a positive number"),
    ("optimizer", "sgdd", "'optimizer' must be an optimizer"),
])
def test_space_keys_the_trainable_ignores_are_errors(raw: dict[str, Any], key: str, value: Any,
                                                     message: str) -> None:
    """A release must describe the model that was trained: an unused key or a bad constant
    fails before anything is charged (dry-run and run alike)."""
    raw["space"][key] = value
    with pytest.raises(ConfigError, match=message):
        validate_search(parse_experiment(raw), 1600)


def test_dry_run_runs_the_checks_run_makes(raw: dict[str, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`--dry-run` said "valid" for files that `run` then rejected (noise 0, a continuous
    space for grid search, a key the trainable ignores); now it runs the same checks."""
    cases = [
        ("noise", {"noise_multiplier": 0}, "noise_multiplier"),
        ("grid", {"lr": {"loguniform": [0.1, 1.0]}}, "continuous"),
        ("unused", {"learning_rate": 0.1}, "did you mean 'lr'"),
    ]
    for name, space, message in cases:
        bad = copy.deepcopy(raw)
        bad["space"].update(space)
        if name == "grid":
            bad["search"] = {"algorithm": "grid_composed"}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(bad))
        assert main(["run", str(path), "--dry-run", "--storage-path", str(tmp_path)]) \
            == EXIT_BAD_INPUT, name
        assert message in capsys.readouterr().err


def test_dry_run_prints_the_sizes_to_declare(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A Parquet file without declared sizes is refused (naming what to declare); with
    sizes_public its dry run prints the realised sizes and class count, marked private, so
    that the owner can declare them; declared, the run uses exactly what was declared."""
    _write_parquet(tmp_path / "d.parquet", 300, 0)
    raw = {"experiment": "sizes", "model": "mlp",
           "data": {"source": "parquet", "uri": str(tmp_path / "d.parquet"), "label_column": "y",
                    "val_fraction": 0.2, "test_fraction": 0.1},
           "search": {"algorithm": "one_shot_random"},
           "space": {"lr": 0.1, "epochs": 1, "sample_rate": 0.1, "noise_multiplier": 1.0},
           "budget": {"epsilon": 8.0, "delta": 1e-5}, "storage_path": str(tmp_path / "store")}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    for key in ("data.declared_train_size", "data.declared_validation_size", "data.num_classes",
                "data.sizes_public: true"):
        assert key in err
    raw["data"]["sizes_public"] = True
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    data = load_data(parse_experiment(raw).data, 0)
    assert ("realised sizes (private; declare public values: data.declared_train_size, "
            "data.declared_validation_size, data.declared_test_size, data.num_classes): "
            f"train={len(data.train)}, validation={len(data.val)}, test={len(data.test)}, "
            "classes=3 (max label + 1)") in out
    raw["data"].update(sizes_public=False, **_PQ_SIZES)
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_OK
    assert "public sizes the run uses: train=240, validation=30," in capsys.readouterr().out
    assert not (tmp_path / "store" / "ledgers").exists()  # nothing charged, no journal


def test_path_like_names_duplicates_and_empty_files(raw: dict[str, Any], tmp_path: Path) -> None:
    for name in ("..", "a/b", ".hidden"):
        with pytest.raises(ConfigError, match="plain name"):
            parse_experiment({**raw, "experiment": name})
    dup = tmp_path / "dup.yaml"
    dup.write_text(yaml.safe_dump(raw) + "budget: {epsilon: 100, delta: 1.0e-5}\n")
    with pytest.raises(ConfigError, match="duplicate key 'budget'"):
        load_experiment(dup)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_experiment(empty)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"experiment: caf\xe9\n")
    with pytest.raises(ConfigError, match="latin.yaml.*not UTF-8"):
        load_experiment(latin)


def test_resume_rules_before_anything_runs(raw: dict[str, Any], tmp_path: Path) -> None:
    """A started experiment is continued with --resume, never silently restarted; --resume
    without a run to continue is an error. Neither case loads data or starts Ray."""
    from raydp_hpo.cli.experiment import run_experiment

    spec = parse_experiment({**raw, "storage_path": str(tmp_path)})
    with pytest.raises(ConfigError, match="nothing to resume"):
        run_experiment(spec, resume=True)
    (spec.run_dir / "tune").mkdir(parents=True)
    with pytest.raises(ConfigError, match="--resume"):
        run_experiment(spec)


def test_test_accuracy_epsilon_is_taken_from_the_budget(raw: dict[str, Any]) -> None:
    spec = parse_experiment({**raw, "test_accuracy_epsilon": 0.5})
    assert spec.test_accuracy_epsilon == 0.5
    assert spec.data.public_test_size() == 200  # 10 % of the public 2000 records
    with pytest.raises(ConfigError, match="test_accuracy_epsilon"):
        parse_experiment({**raw, "test_accuracy_epsilon": 8.0})  # the whole budget


def test_every_error_of_a_file_is_reported_at_once_with_its_path(raw: dict[str, Any]) -> None:
    """Five independent mistakes: one ConfigError naming all five paths (before: the first)."""
    raw["budget"] = {"epsilon": 8.0, "delta": 2.0}
    raw["search"]["algorithm"] = "random_stoping"
    raw["space"]["lr"] = {"loguniform": [0, 1]}
    raw["resources"] = {"cpu": -1, "gpu": 0}
    raw["tensorbord"] = True
    with pytest.raises(ConfigError) as info:
        parse_experiment(raw)
    paths = {path for path, _ in info.value.problems}
    assert {"budget.delta", "search.algorithm", "space.lr", "resources.cpu", "tensorbord"} <= paths
    message = str(info.value)
    assert "5 errors" in message
    for words in ("delta", "random_stoping", "space.lr", "resources.cpu", "tensorbord"):
        assert words in message


def test_search_plan_errors_are_reported_together(raw: dict[str, Any], tmp_path: Path) -> None:
    """A space key the trainable ignores and an unknown search setting: both, in one error,
    from --dry-run and from run alike (run before creating any journal)."""
    raw["space"]["not_a_knob"] = 3
    raw["search"]["settings"]["no_such_setting"] = 1
    raw["storage_path"] = str(tmp_path / "store")
    spec = parse_experiment(raw)
    with pytest.raises(ConfigError) as info:
        validate_search(spec, 1600, 200)
    paths = {path for path, _ in info.value.problems}
    assert paths == {"space", "search.settings"}, info.value.problems
    assert "not_a_knob" in str(info.value) and "no_such_setting" in str(info.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--dry-run"]) == EXIT_BAD_INPUT
    assert main(["run", str(path)]) == EXIT_BAD_INPUT
    assert not (tmp_path / "store" / "ledgers").exists()  # nothing charged, no journal


#: Declared public sizes and class count for the Parquet files of these tests (300 rows,
#: 3 classes): a Parquet table's own are private, so an experiment file declares them.
_PQ_SIZES = {"num_classes": 3, "declared_train_size": 240, "declared_validation_size": 30}


def _write_parquet(path: Path, rows: int, seed: int, **extra: Any) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"f0": rng.normal(size=rows), "f1": rng.normal(size=rows),
                             "y": rng.integers(0, 3, size=rows), **extra}), path)


def test_parquet_default_features_and_split_files(raw: dict[str, Any], tmp_path: Path) -> None:
    """Without feature columns every column but the label is a feature; val_uri / test_uri
    are the validation / test splits as they are (uri then gives them none of its records),
    with the same features, and the budget still belongs to uri (same ledger)."""
    from raydp_hpo.cli.experiment import preflight

    for name, rows, seed in (("train", 300, 0), ("val", 40, 1), ("test", 30, 2)):
        _write_parquet(tmp_path / f"{name}.parquet", rows, seed)
    raw["data"] = {"source": "parquet", "uri": str(tmp_path / "train.parquet"),
                   "label_column": "y", "val_fraction": 0.2, "test_fraction": 0.1, **_PQ_SIZES}
    raw["storage_path"] = str(tmp_path / "store")
    raw["budget"]["epsilon"] = 50.0  # a few hundred records: the plan needs more than 8
    split = preflight(parse_experiment(raw))
    assert split.data.train.feature_shape == (2,)
    assert len(split.data.train) + len(split.data.val) + len(split.data.test) == 300
    assert split.data.val.labels.size and split.data.test.labels.size
    ledger = parse_experiment(raw).ledger_name

    both = copy.deepcopy(raw)
    both["data"] = {"source": "parquet", "uri": str(tmp_path / "train.parquet"),
                    "val_uri": str(tmp_path / "val.parquet"),
                    "test_uri": str(tmp_path / "test.parquet"), "label_column": "y",
                    "sizes_public": True}  # the realised sizes, accepted as public
    spec = parse_experiment(both)
    assert (spec.data.val_fraction, spec.data.test_fraction) == (0.0, 0.0)
    assert spec.ledger_name == ledger  # the same dataset budget
    files = preflight(spec)
    assert (len(files.data.train), len(files.data.val), len(files.data.test)) == (300, 40, 30)
    assert (files.train_size, files.validation_size) == (300, 40)  # realised: sizes_public

    only_val = copy.deepcopy(both)
    del only_val["data"]["test_uri"]
    split = preflight(parse_experiment(only_val)).data
    assert len(split.val) == 40 and len(split.train) + len(split.test) == 300
    assert 0 < len(split.test) < 300  # test_fraction 0.1 (default) of uri

    # a split file with other columns is refused by name (default features must agree)
    _write_parquet(tmp_path / "odd.parquet", 40, 3, extra_col=[1.0] * 40)
    both["data"]["val_uri"] = str(tmp_path / "odd.parquet")
    with pytest.raises(ConfigError, match="data.val_uri.*'extra_col'.*feature_columns"):
        preflight(parse_experiment(both))
    both["data"]["feature_columns"] = ["f0", "f1"]  # listing them is the remedy
    assert len(preflight(parse_experiment(both)).data.val) == 40


def test_points_make_one_space_fit_every_searcher(raw: dict[str, Any]) -> None:
    """``points: N`` on a uniform / loguniform domain: a grid of N values (log-spaced for
    loguniform) for grid and SVT search and for privacy keys; other keys are sampled."""
    from ray.tune.search.sample import Categorical, Float

    raw["space"]["lr"] = {"loguniform": [0.01, 1.0], "points": 3}
    raw["space"]["noise_multiplier"] = {"uniform": [1.0, 2.0], "points": 3}
    sampled = build_param_space(parse_experiment(raw))  # random_stopping
    assert isinstance(sampled["lr"], Float)
    assert isinstance(sampled["noise_multiplier"], Categorical)  # a privacy key: finite
    assert sampled["noise_multiplier"].categories == [1.0, 1.5, 2.0]
    validate_search(parse_experiment(raw), 1600, 200)

    raw["search"] = {"algorithm": "grid_composed", "settings": {}}
    grid = build_param_space(parse_experiment(raw))
    assert grid["lr"]["grid_search"] == pytest.approx([0.01, 0.1, 1.0])
    assert grid["noise_multiplier"] == {"grid_search": [1.0, 1.5, 2.0]}
    validate_search(parse_experiment(raw), 1600, 200)
    raw["search"] = {"algorithm": "svt_threshold", "settings": {}}  # enumerates its space too
    assert build_param_space(parse_experiment(raw))["lr"] == grid["lr"]
    raw["search"] = {"algorithm": "grid_composed", "settings": {}}

    del raw["space"]["lr"]["points"]  # a continuous domain: the error says how to fix it
    with pytest.raises(ConfigError, match=r"continuous.*give space.lr a number of points"):
        validate_search(parse_experiment(raw), 1600, 200)


def test_linear_scaling_accepts_the_common_space_with_a_warning(raw: dict[str, Any]) -> None:
    """The example's space (lr, batch size, noise, optimizer) under linear scaling: the keys
    it sets itself are ignored with a warning (before: refused). Its default (refined DP-SGD)
    needs one sample rate, which a batch-size choice does not give: the error says which
    setting to add; with it, the lr range, epochs and optimizer come from the space."""
    from raydp_hpo.errors import ConfigError

    raw["search"] = {"algorithm": "linear_scaling", "settings": {"runs_per_sweep": 2}}
    with pytest.raises(ConfigError, match=r"'batch_size' varies .*add the setting sample_rate"):
        validate_search(parse_experiment(raw), 1600, 200)
    raw["search"]["settings"]["sample_rate"] = 0.05
    with pytest.warns(UserWarning, match="linear scaling sets 'noise_multiplier', 'batch_size' "
                                         "itself"):
        validate_search(parse_experiment(raw), 1600, 200)
    raw["search"] = {"algorithm": "linear_scaling", "preset": "paper",
                     "settings": {"runs_per_sweep": 2}}
    with pytest.warns(UserWarning, match="linear scaling sets .*'batch_size', 'epochs'"):
        validate_search(parse_experiment(raw), 1600, 200)


def test_search_preset_in_an_experiment_file(raw: dict[str, Any]) -> None:
    """search.preset names a preset of the algorithm; settings override its values; an
    unknown preset (with a guess), a preset of an algorithm without presets and a preset given
    twice are refused when the file is parsed; unknown settings are all named at once."""
    from raydp_hpo.errors import ConfigError

    raw["search"] = {"algorithm": "random_stopping", "preset": "tnb20",
                     "settings": {"mean": 4}}
    spec = parse_experiment(raw)
    assert spec.search.settings == {"preset": "tnb20", "mean": 4}
    validate_search(spec, 1600, 200)
    raw["search"]["preset"] = "tnb2"
    with pytest.raises(ConfigError, match=r"search.preset 'tnb2': not a preset of "
                                          r"random_stopping; use one of tnb20; did you mean"):
        parse_experiment(raw)
    raw["search"] = {"algorithm": "grid_composed", "preset": "paper"}
    with pytest.raises(ConfigError, match="grid_composed has no presets"):
        parse_experiment(raw)
    raw["search"] = {"algorithm": "random_stopping", "preset": "tnb20",
                     "settings": {"preset": "tnb20"}}
    with pytest.raises(ConfigError, match="give the preset once"):
        parse_experiment(raw)
    raw["search"] = {"algorithm": "random_stopping", "settings": {"shap": 2, "meen": 3}}
    with pytest.raises(ConfigError, match=r"'shap' \(did you mean 'shape'\?\), 'meen' \(did "
                                          r"you mean 'mean'\?\)"):
        validate_search(parse_experiment(raw), 1600, 200)


def test_no_test_split_is_said_not_nan(raw: dict[str, Any]) -> None:
    """data.test_fraction: 0 (issue #31): a DP test accuracy is refused up front (there is no
    split to release it from), and the summary says there is no test split instead of NaN."""
    from raydp_hpo.accounting.mechanisms import Gaussian
    from raydp_hpo.cli.experiment import RunOutcome, format_summary
    from raydp_hpo.tune.tuner import DPResult, PrivacyCertificate

    raw["data"]["test_fraction"] = 0
    spec = parse_experiment(raw)  # fine without a test accuracy
    with pytest.raises(ConfigError, match=r"no test split \(data.test_fraction: 0\)"):
        parse_experiment({**raw, "test_accuracy_epsilon": 0.5})
    data = load_data(spec.data, spec.split_seed)
    assert len(data.test) == 0
    certificate = PrivacyCertificate("random_stopping", "P&S 2022", "RDP", spec.budget,
                                     (("e/plan", Gaussian(5.0)),), 1.0, 1.0, "l", 1.0, "rdp")
    result = DPResult({"lr": 0.5}, None, None, certificate, None, False)
    text = format_summary(RunOutcome(Path("run"), result, Path("j"), 0,
                                     test_split=len(data.test) > 0))
    assert "no test split" in text and "nan" not in text.lower()
    assert "nan" not in json.dumps(result.private_evaluation()).lower()


@pytest.mark.parametrize("sizes", ["declared", "sizes_public"])
def test_dry_run_auto_choice_is_the_runs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             sizes: str) -> None:
    """The dry run resolved ``search: auto`` without the public class count the run hands
    it, so a row choosing SVT (u₀ = 1/classes) printed another u₀ than the run used. Now the
    preflight passes the count DPTuner passes: declared, or realised under sizes_public."""
    from raydp_hpo.cli.experiment_preflight import preflight
    from raydp_hpo.searchers import auto
    from tests.raydp_hpo.searchers import _auto_tables

    table = _auto_tables.write(tmp_path / "table.json")  # SVT at ε 8 on a finite grid
    monkeypatch.setattr(auto, "auto_table_path", lambda: table)
    _write_parquet(tmp_path / "d.parquet", 300, 0)
    data: dict[str, Any] = {"source": "parquet", "uri": str(tmp_path / "d.parquet"),
                            "label_column": "y", "val_fraction": 0.2, "test_fraction": 0.1}
    data.update(_PQ_SIZES if sizes == "declared" else {"sizes_public": True})
    raw = {"experiment": "auto-svt", "model": "mlp", "data": data,
           "search": {"algorithm": "auto", "settings": {"compute_limit": "inf"}},
           "space": {"lr": {"choice": [0.1, 1.0]}, "epochs": 1, "sample_rate": 0.1},
           "budget": {"epsilon": 8.0, "delta": 1e-5}, "storage_path": str(tmp_path / "store")}
    choice = preflight(parse_experiment(raw)).auto
    assert choice is not None and choice.setting == "svt_k20"
    assert choice.settings["u0"] == pytest.approx(1 / 3, rel=1e-12)  # 3 classes
