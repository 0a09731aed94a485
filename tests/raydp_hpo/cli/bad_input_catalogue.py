"""The bad-input catalogue (issue #11): one row per malformed input, shared by the test suite
(tests/raydp_hpo/cli/test_bad_input.py, in-process) and by benchmarks/bad_input.py (the real CLI in
subprocesses). Do not copy these rows elsewhere: import them.

A row is a :class:`Case`: the input (CLI arguments, with the files they name: experiment or
federated experiment file text, data files, journals), the documented exit code (2 bad input,
3 budget cannot pay), the words the message must contain (the bad value, and what to do),
and — checked for every row — the seeded ledger journal's bytes unchanged and no new journal
anywhere. Ledger operations that
have no CLI (charging a closed ledger, ...) are rows of kind ``api``: a Python action against a
live journaled ledger, with the error class it must raise.

Outcomes (:func:`classify`): ``clear`` (the documented exit code, every word in the output, no
traceback, nothing charged), ``vague`` (a traceback, a wrong non-zero code, or a missing word),
``silent`` (exit 0: accepted), ``hang`` (timed out; the benchmark only).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXIT_BAD_INPUT, EXIT_BUDGET = 2, 3

#: The valid experiment every experiment row mutates (small: a dry run takes ~1 s once warm).
BASE: dict[str, Any] = {
    "experiment": "bad-input",
    "split_seed": 0,
    "data": {"source": "mnist1d", "size": 400, "generator_seed": 1,
             "val_fraction": 0.2, "test_fraction": 0.1},
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "search": {"algorithm": "random_stopping",
               "settings": {"distribution": "geometric", "mean": 2},
               "metric": "val_accuracy", "mode": "max", "max_concurrent_trials": 1},
    "space": {"lr": {"loguniform": [0.1, 1.0]}, "batch_size": {"choice": [32, 64]},
              "epochs": 1, "noise_multiplier": 1.0, "max_grad_norm": 1.0},
    "budget": {"epsilon": 8.0, "delta": 1e-5},
    "resources": {"cpu": 1, "gpu": 0},
    "storage_path": "{tmp}/store",
}

#: The valid federated experiment file every ``federated`` row mutates (run with --dry-run:
#: validated in full, nothing trained).
FED_BASE: dict[str, Any] = {
    "kind": "federated",
    "experiment": "bad-input-fed",
    "seed": 0,
    "data": {"source": "digits", "test_fraction": 0.2, "split_seed": 0},
    "clients": {"count": 5, "random_fraction": 0.0, "partition_seed": 0},
    "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
    "training": {"optimizer": "adadp", "lr": 0.1, "rounds": 1, "local_epochs": 1,
                 "batch_size": 10, "tol": 0.1},
    "ray": False,
    "storage_path": "{tmp}/store",
}
FED_PRIVACY: dict[str, Any] = {"clip_norm": 1.0, "noise_multiplier": 2.0,
                               "budget": {"epsilon": 8.0, "delta": 1e-5}}

_DELETE = object()


def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return out


@dataclass(frozen=True)
class Case:
    """One malformed input. ``argv`` and file texts may use ``{tmp}`` (the case's folder),
    ``{journal}`` (a seeded ledger journal, one charge) and ``{data}`` (a folder of Parquet
    files, see :func:`make_data`)."""

    name: str
    kind: str  # experiment | federated | cli | account | ledger | data | api
    argv: tuple[str, ...] = ()
    files: tuple[tuple[str, str | bytes], ...] = ()
    exit_code: int = EXIT_BAD_INPUT
    words: tuple[str, ...] = ()
    api: str | None = None  # name of an action in API_ACTIONS (kind "api")
    error: str | None = None  # error class name an api row must raise
    tags: tuple[str, ...] = field(default=())


def _exp(name: str, *changes: tuple[str, Any], words: tuple[str, ...],
         exit_code: int = EXIT_BAD_INPUT, run: bool = False) -> Case:
    raw = BASE
    for path, value in changes:
        raw = _set(raw, path, value)
    text = yaml.safe_dump(raw, sort_keys=False)
    argv = ("run", "{tmp}/exp.yaml") + (() if run else ("--dry-run",))
    return Case(name, "experiment", argv, (("exp.yaml", text),), exit_code, words)


def _fed(name: str, *changes: tuple[str, Any], words: tuple[str, ...]) -> Case:
    raw = FED_BASE
    for path, value in changes:
        raw = _set(raw, path, value)
    return Case(name, "federated", ("federated", "--config", "{tmp}/fed.yaml", "--dry-run"),
                (("fed.yaml", yaml.safe_dump(raw, sort_keys=False)),), EXIT_BAD_INPUT, words)


def _fed_text(name: str, text: str, words: tuple[str, ...]) -> Case:
    return Case(name, "federated", ("federated", "--config", "{tmp}/fed.yaml", "--dry-run"),
                (("fed.yaml", text),), EXIT_BAD_INPUT, words)


def _text(name: str, text: str | bytes, words: tuple[str, ...], *,
          argv: tuple[str, ...] = ("run", "{tmp}/exp.yaml", "--dry-run")) -> Case:
    return Case(name, "experiment", argv, (("exp.yaml", text),), EXIT_BAD_INPUT, words)


def _pq(name: str, data: dict[str, Any], words: tuple[str, ...],
        top: tuple[tuple[str, Any], ...] = ()) -> Case:
    changes = tuple((f"data.{k}", v) for k, v in data.items()) + top
    # the public sizes and class count of make_data's 80-row, 3-class files, declared (a
    # Parquet table's own are private): each row then fails on its own fault
    raw = _set(BASE, "data", {"source": "parquet", "val_fraction": 0.2, "test_fraction": 0.1,
                              "num_classes": 3, "declared_train_size": 56,
                              "declared_validation_size": 16})
    for path, value in changes:
        raw = _set(raw, path, value)
    return Case(name, "data", ("run", "{tmp}/exp.yaml", "--dry-run"),
                (("exp.yaml", yaml.safe_dump(raw, sort_keys=False)),), EXIT_BAD_INPUT, words)


def _acc(name: str, *args: str, words: tuple[str, ...]) -> Case:
    return Case(name, "account", ("account", *args), (), EXIT_BAD_INPUT, words)


def _led(name: str, *args: str, words: tuple[str, ...],
         files: tuple[tuple[str, str | bytes], ...] = ()) -> Case:
    return Case(name, "ledger", ("ledger", *args), files, EXIT_BAD_INPUT, words)


def _cli(name: str, *args: str, words: tuple[str, ...]) -> Case:
    return Case(name, "cli", tuple(args), (), EXIT_BAD_INPUT, words)


def _api(name: str, action: str, error: str, words: tuple[str, ...]) -> Case:
    exit_code = EXIT_BUDGET if error == "BudgetExhaustedError" else EXIT_BAD_INPUT
    return Case(name, "api", (), (), exit_code, words, api=action, error=error)


_D = _DELETE
CASES: list[Case] = [
    # -- budgets and deltas -------------------------------------------------------------------
    _exp("budget epsilon negative", ("budget.epsilon", -1.0), words=("budget", "epsilon", "-1")),
    _exp("budget epsilon zero", ("budget.epsilon", 0), words=("epsilon", "0")),
    _exp("budget epsilon nan", ("budget.epsilon", float("nan")), words=("budget.epsilon",)),
    _exp("budget epsilon inf", ("budget.epsilon", float("inf")), words=("budget.epsilon", "inf")),
    _exp("budget epsilon text", ("budget.epsilon", "lots"), words=("budget.epsilon", "lots")),
    _exp("budget epsilon bool", ("budget.epsilon", True), words=("budget.epsilon", "True")),
    _exp("budget delta above 1", ("budget.delta", 2.0), words=("delta", "2")),
    _exp("budget delta zero", ("budget.delta", 0.0), words=("delta", "0")),
    _exp("budget delta negative", ("budget.delta", -1e-5), words=("delta", "-1e-05")),
    _exp("budget delta text", ("budget.delta", "tiny"), words=("budget.delta", "tiny")),
    _exp("budget delta missing", ("budget.delta", _D), words=("budget", "delta")),
    _exp("budget not a mapping", ("budget", 8), words=("budget", "mapping", "8")),
    _exp("budget misspelled key", ("budget.epsilno", 1.0), words=("epsilno", "epsilon")),
    _exp("budget missing", ("budget", _D), words=("budget",)),
    _exp("budget too small for the plan", ("budget.epsilon", 0.01),
         words=("budget", "0.01"), exit_code=EXIT_BUDGET),
    _exp("test epsilon above budget", ("test_accuracy_epsilon", 9.0),
         words=("test_accuracy_epsilon", "9")),
    _exp("test epsilon negative", ("test_accuracy_epsilon", -0.1),
         words=("test_accuracy_epsilon", "-0.1")),
    _exp("ledger delta differs", ("ledger", {"name": "x",
                                             "budget": {"epsilon": 9, "delta": 1e-6}}),
         words=("ledger.budget.delta", "1e-06")),
    _exp("ledger budget bad", ("ledger", {"name": "x", "budget": {"epsilon": -2, "delta": 1e-5}}),
         words=("ledger.budget", "-2")),
    # -- search spaces --------------------------------------------------------------------------
    _exp("space empty", ("space", {}), words=("space", "at least one key")),
    _exp("space not a mapping", ("space", [1, 2]), words=("space", "mapping")),
    _exp("space unknown domain", ("space.lr", {"loguniforn": [0.1, 1]}),
         words=("loguniforn", "loguniform")),
    _exp("space loguniform at zero", ("space.lr", {"loguniform": [0, 1]}),
         words=("space.lr", "low > 0")),
    _exp("space uniform reversed", ("space.lr", {"uniform": [2, 1]}),
         words=("space.lr", "low < high")),
    _exp("space uniform arity", ("space.lr", {"uniform": [1]}), words=("space.lr", "2 numbers")),
    _exp("space choice empty", ("space.batch_size", {"choice": []}),
         words=("space.batch_size", "non-empty")),
    _exp("space randint floats", ("space.batch_size", {"randint": [1.5, 4]}),
         words=("space.batch_size", "1.5")),
    _exp("space randn sd zero", ("space.lr", {"randn": [0.5, 0]}),
         words=("space.lr", "standard deviation")),
    _exp("space two-key domain", ("space.lr", {"uniform": [0, 1], "x": 1}),
         words=("space.lr", "one-key")),
    _exp("space reserved model", ("space.model", "cnn1d"), words=("space.model", "reserved")),
    _exp("space unknown knob", ("space.not_a_knob", 3), words=("not_a_knob",)),
    _exp("space noise zero", ("space.noise_multiplier", 0.0),
         words=("noise_multiplier", "0")),
    _exp("space noise negative", ("space.noise_multiplier", -1.0),
         words=("noise_multiplier", "-1")),
    _exp("space lr negative", ("space.lr", -0.5), words=("lr", "-0.5")),
    _exp("space batch size zero", ("space.batch_size", 0), words=("batch_size", "0")),
    _exp("space epochs zero", ("space.epochs", 0), words=("epochs", "0")),
    _exp("space clip norm negative", ("space.max_grad_norm", -1.0),
         words=("max_grad_norm", "-1")),
    _exp("space grid for grid search continuous",
         ("search", {"algorithm": "grid_composed", "settings": {}}),
         words=("grid", "lr", "points")),
    _exp("space points on a choice", ("space.batch_size", {"choice": [32, 64], "points": 3}),
         words=("space.batch_size.points", "choice")),
    _exp("space one point", ("space.lr", {"loguniform": [0.1, 1.0], "points": 1}),
         words=("space.lr.points", ">= 2", "1")),
    # -- algorithm settings ---------------------------------------------------------------------
    _exp("algorithm misspelled", ("search.algorithm", "random_stoping"),
         words=("random_stoping", "random_stopping")),
    # (a missing algorithm is no error: it defaults to auto, the package default search)
    _exp("algorithm null", ("search.algorithm", None), words=("search", "algorithm")),
    _exp("search mode", ("search.mode", "maximise"), words=("maximise", "'max' or 'min'")),
    _exp("search metric empty", ("search.metric", ""), words=("search.metric",)),
    _exp("search concurrency zero", ("search.max_concurrent_trials", 0),
         words=("max_concurrent_trials", "0")),
    _exp("search settings not a mapping", ("search.settings", [1]),
         words=("search.settings", "mapping")),
    _exp("search setting unknown", ("search.settings.no_such", 1), words=("no_such",)),
    _exp("search setting mean below 1", ("search.settings.mean", 0.5), words=("mean", "0.5")),
    _exp("search setting distribution", ("search.settings.distribution", "zipf"),
         words=("zipf",)),
    _exp("search setting mean text", ("search.settings.mean", "two"), words=("mean", "two")),
    _exp("search misspelled key", ("search.setings", {}), words=("setings", "settings")),
    # -- model ----------------------------------------------------------------------------------
    _exp("model unknown", ("model.name", "mlpp"), words=("mlpp", "mlp")),
    _exp("model kwargs not a mapping", ("model.kwargs", [1]), words=("model.kwargs", "mapping")),
    _exp("model missing", ("model", _D), words=("model",)),
    # -- data -----------------------------------------------------------------------------------
    _exp("data source unknown", ("data.source", "mnist"), words=("mnist", "mnist1d")),
    _exp("data size too small", ("data.size", 5), words=("data.size", "5")),
    _exp("data fraction 1", ("data.val_fraction", 1.0), words=("data.val_fraction", "1")),
    _exp("data fractions sum", ("data.val_fraction", 0.6), ("data.test_fraction", 0.5),
         words=("val_fraction", "test_fraction")),
    _exp("data uri on mnist1d", ("data.uri", "x.parquet"), words=("data.uri", "parquet")),
    _exp("data declared size zero", ("data.declared_train_size", 0),
         words=("declared_train_size", "0")),
    _exp("data misspelled key", ("data.sise", 100), words=("sise", "size")),
    _exp("data missing", ("data", _D), words=("data",)),
    _pq("parquet missing file", {"uri": "{data}/nope.parquet", "label_column": "y",
                                 "feature_columns": ["f0", "f1"]},
        words=("nope.parquet", "not found")),
    _pq("parquet missing label column", {"uri": "{data}/good.parquet", "label_column": "label",
                                         "feature_columns": ["f0", "f1"]},
        words=("label", "missing")),
    _pq("parquet missing feature column", {"uri": "{data}/good.parquet", "label_column": "y",
                                           "feature_columns": ["f0", "f9"]},
        words=("f9", "missing")),
    _pq("parquet one class", {"uri": "{data}/oneclass.parquet", "label_column": "y",
                              "feature_columns": ["f0", "f1"]},
        words=("y", "single class")),
    _pq("parquet NaN labels", {"uri": "{data}/nanlabel.parquet", "label_column": "y",
                               "feature_columns": ["f0", "f1"]},
        words=("y", "NaN")),
    _pq("parquet NaN features", {"uri": "{data}/nanfeat.parquet", "label_column": "y",
                                 "feature_columns": ["f0", "f1"]},
        words=("f0", "NaN")),
    _pq("parquet text labels", {"uri": "{data}/strlabel.parquet", "label_column": "y",
                                "feature_columns": ["f0", "f1"]},
        words=("y",)),
    _pq("parquet negative labels", {"uri": "{data}/neglabel.parquet", "label_column": "y",
                                    "feature_columns": ["f0", "f1"]},
        words=("y", "-1")),
    _pq("parquet empty", {"uri": "{data}/empty.parquet", "label_column": "y",
                          "feature_columns": ["f0", "f1"]},
        words=("empty.parquet", "no rows")),
    _pq("parquet not parquet", {"uri": "{data}/text.parquet", "label_column": "y",
                                "feature_columns": ["f0", "f1"]},
        words=("text.parquet",)),
    _pq("parquet both column kinds given", {"uri": "{data}/good.parquet", "label_column": "y",
                                            "feature_columns": ["f0"], "feature_column": "f1"},
        words=("feature_columns", "feature_column", "at most one")),
    _pq("parquet default features not numeric", {"uri": "{data}/strfeat.parquet",
                                                 "label_column": "y"},
        words=("'colour'", "numeric", "feature_columns")),
    _pq("parquet val_uri with val_fraction", {"uri": "{data}/good.parquet", "label_column": "y",
                                              "val_uri": "{data}/good.parquet"},
        words=("val_uri", "val_fraction")),
    _pq("parquet val_uri missing file", {"uri": "{data}/good.parquet", "label_column": "y",
                                         "val_fraction": _DELETE,
                                         "val_uri": "{data}/nope_val.parquet"},
        words=("nope_val.parquet", "data.val_uri")),
    _pq("parquet test_uri other columns", {"uri": "{data}/good.parquet", "label_column": "y",
                                           "test_fraction": _DELETE,
                                           "test_uri": "{data}/othercols.parquet"},
        words=("data.test_uri", "'g1'", "feature_columns")),
    _pq("parquet num_classes too small", {"uri": "{data}/good.parquet", "label_column": "y",
                                          "feature_columns": ["f0", "f1"], "num_classes": 2},
        words=("num_classes", "2")),
    # -- resources ------------------------------------------------------------------------------
    _exp("resources negative cpu", ("resources.cpu", -1), words=("resources.cpu", "-1")),
    _exp("resources text gpu", ("resources.gpu", "one"), words=("resources.gpu", "one")),
    _exp("resources misspelled", ("resources.gpus", 1), words=("gpus", "gpu")),
    _exp("resources not a mapping", ("resources", 4), words=("resources", "mapping")),
    _exp("resources more cpus than the machine", ("resources.cpu", 4096),
         words=("resources.cpu", "4096")),
    _exp("resources gpu on a cpu-only machine", ("resources.gpu", 64),
         words=("resources.gpu", "64")),
    # -- names and paths ------------------------------------------------------------------------
    _exp("experiment dot-dot", ("experiment", ".."), words=("'..'", "plain name")),
    _exp("experiment with slash", ("experiment", "a/b"), words=("a/b", "plain name")),
    _exp("experiment empty", ("experiment", ""), words=("experiment",)),
    _exp("experiment missing", ("experiment", _D), words=("experiment",)),
    _exp("storage path URL", ("storage_path", "s3://bucket/x"), words=("s3://bucket/x",)),
    _exp("ledger name empty", ("ledger", {"name": ""}), words=("ledger.name",)),
    _exp("ledger misspelled", ("ledger", {"nme": "x"}), words=("nme", "name")),
    _exp("split seed text", ("split_seed", "zero"), words=("split_seed", "zero")),
    _exp("secret seed negative", ("secret_seed", -1), words=("secret_seed", "-1")),
    _exp("old seed key", ("seed", 0), words=("seed", "split_seed")),
    _exp("tensorboard text", ("tensorboard", "yes"), words=("tensorboard", "yes")),
    _exp("unknown top-level key", ("budgte", {"epsilon": 1, "delta": 1e-5}),
         words=("budgte", "budget")),
    _exp("several errors at once", ("budget.delta", 2.0), ("space.lr", {"uniform": [2, 1]}),
         ("resources.cpu", -1), words=("3 errors", "budget", "space.lr", "resources.cpu")),
    # -- YAML syntax and file-level -------------------------------------------------------------
    _text("yaml empty file", "", words=("exp.yaml", "empty")),
    _text("yaml only a comment", "# nothing\n", words=("exp.yaml", "empty")),
    _text("yaml syntax error", "experiment: [unclosed\n", words=("exp.yaml", "YAML")),
    _text("yaml tab indentation", "data:\n\tsource: mnist1d\n", words=("exp.yaml", "YAML")),
    _text("yaml a list", "- a\n- b\n", words=("mapping",)),
    _text("yaml a scalar", "42\n", words=("mapping", "42")),
    _text("yaml duplicate key", "budget: {epsilon: 1, delta: 1.0e-5}\n"
          "budget: {epsilon: 9, delta: 1.0e-5}\n", words=("duplicate", "budget", "line 2")),
    _text("yaml python tag", "experiment: !!python/object:os.system x\n",
          words=("exp.yaml", "YAML")),
    _text("not utf-8", b"experiment: caf\xe9\n", words=("exp.yaml", "UTF-8")),
    _text("binary file", b"\x00\x01\x02\xff\xfe", words=("exp.yaml",)),
    _text("experiment file missing", "", words=("missing.yaml", "does not exist"),
          argv=("run", "{tmp}/missing.yaml", "--dry-run")),
    _text("experiment file is a directory", "", words=("is a directory",),
          argv=("run", "{tmp}", "--dry-run")),
    # -- CLI flags ------------------------------------------------------------------------------
    _cli("no subcommand", words=("usage",)),
    _cli("unknown subcommand", "frobnicate", words=("frobnicate",)),
    _cli("unknown flag", "account", "--noise", "1", words=("--noise",)),
    _cli("run without a file", "run", words=("experiment",)),
    _cli("run num-cpus text", "run", "x.yaml", "--num-cpus", "many", words=("many",)),
    _cli("run num-cpus zero", "run", "{tmp}/exp.yaml", "--num-cpus", "0",
         words=("--num-cpus", "0")),
    _cli("run progress interval negative", "run", "{tmp}/exp.yaml", "--progress-interval", "-1",
         words=("--progress-interval", "-1")),
    _cli("report missing run dir", "report", "{tmp}/no-run", words=("no-run",)),
    _cli("audit runs zero", "audit", "--runs", "0", words=("runs", "0")),
    _cli("audit alpha above 1", "audit", "--alpha", "1.5", words=("alpha", "1.5")),
    _cli("audit unknown algorithm", "audit", "--algorithm", "nope", words=("nope",)),
    _cli("dashboard missing location", "dashboard", "{tmp}/no-store",
         words=("no-store", "does not exist", "storage path")),
    _cli("dashboard port out of range", "dashboard", "{tmp}", "--port", "70000",
         words=("--port", "70000")),
    _cli("dashboard short token", "dashboard", "{tmp}", "--token", "abc",
         words=("--token", "16 characters")),
    _cli("dashboard password in the URI", "dashboard", "postgresql://u:pw@localhost/db",
         words=("password", "PGPASSWORD")),
    # -- account arguments ----------------------------------------------------------------------
    _acc("account no arguments", words=("--noise-multiplier",)),
    _acc("account negative noise", "--noise-multiplier", "-1", "--sample-rate", "0.01",
         "--steps", "100", "--delta", "1e-5", words=("--noise-multiplier", "-1")),
    _acc("account sample rate above 1", "--noise-multiplier", "1", "--sample-rate", "2",
         "--steps", "100", "--delta", "1e-5", words=("--sample-rate", "2")),
    _acc("account steps zero", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "0", "--delta", "1e-5", words=("steps", "0")),
    _acc("account steps text", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "ten", "--delta", "1e-5", words=("ten",)),
    _acc("account delta missing", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "100", words=("--delta",)),
    _acc("account delta above 1", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "100", "--delta", "1.5", words=("delta", "1.5")),
    _acc("account nan noise", "--noise-multiplier", "nan", "--sample-rate", "0.01",
         "--steps", "100", "--delta", "1e-5", words=("--noise-multiplier", "nan")),
    _acc("account laplace without epsilon", "--mechanism", "laplace", "--sensitivity", "1",
         words=("--epsilon",)),
    _acc("account laplace negative sensitivity", "--mechanism", "laplace", "--epsilon", "1",
         "--sensitivity", "-1", words=("sensitivity", "-1")),
    _acc("account gaussian without delta", "--mechanism", "gaussian", "--epsilon", "1",
         "--sensitivity", "1", words=("--delta",)),
    _acc("account unknown mechanism", "--mechanism", "exponential", words=("exponential",)),
    _acc("account search without mean", "--search", "random_stopping", "--noise-multiplier",
         "1", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5",
         words=("--mean",)),
    _acc("account search mean below 1", "--search", "random_stopping", "--mean", "0.5",
         "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100", "--delta",
         "1e-5", words=("mean", "0.5")),
    _acc("account search bad distribution", "--search", "random_stopping", "--mean", "2",
         "--distribution", "zipf", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "100", "--delta", "1e-5", words=("zipf",)),
    # -- ledger names and paths -----------------------------------------------------------------
    _led("ledger show a directory", "show", "{tmp}", words=("directory",)),
    _led("ledger show missing", "show", "{tmp}/none.journal", words=("none.journal",)),
    _led("ledger verify missing", "verify", "{tmp}/none.journal", words=("none.journal",)),
    _led("ledger show empty file", "show", "{tmp}/empty.journal", words=("empty",),
         files=(("empty.journal", ""),)),
    _led("ledger show not a journal", "show", "{tmp}/text.journal",
         words=("text.journal", "line 1"), files=(("text.journal", "hello\n"),)),
    _led("ledger show binary", "show", "{tmp}/bin.journal", words=("bin.journal",),
         files=(("bin.journal", b"\xff\xfe\x00\n"),)),
    _led("ledger verify forged record", "verify", "{tmp}/forged.journal",
         words=("forged.journal", "line 3"), files=(("forged.journal", "@forged"),)),
    _led("ledger verify flipped byte", "verify", "{tmp}/flipped.journal",
         words=("flipped.journal", "line 2"), files=(("flipped.journal", "@flipped"),)),
    _led("ledger verify cut in the middle", "verify", "{tmp}/cut.journal",
         words=("cut.journal", "seal"), files=(("cut.journal", "@cut"),)),
    _led("ledger list missing dir", "list", "{tmp}/nowhere", words=("nowhere",)),
    _led("ledger show json missing", "show", "{tmp}/none.journal", "--json",
         words=("none.journal",)),
    # -- ledger operations (Python API) ---------------------------------------------------------
    _api("charge beyond the budget", "exhaust", "BudgetExhaustedError",
         ("budget exhausted", "Nothing was charged")),
    _api("charge a count beyond the budget", "exhaust_count", "BudgetExhaustedError",
         ("remaining",)),
    _api("same id, other mechanism", "conflict", "ChargeConflictError", ("seed",)),
    _api("mechanism is not a mechanism", "not_a_mechanism", "InvalidParameterError",
         ("mechanism",)),
    _api("charge id empty", "empty_id", "InvalidParameterError", ("charge_id",)),
    _api("charge id not a string", "int_id", "InvalidParameterError", ("charge_id", "7")),
    _api("charge after close", "closed", "LedgerClosedError", ("closed",)),
    _api("second live ledger", "second_writer", "RayDPHPOError", ("seed.journal",)),
    _api("reopen with another budget", "other_budget", "LedgerMismatchError",
         ("seed.journal", "budget")),
    _api("journal deleted under a live ledger", "deleted", "JournalReplacedError",
         ("deleted",)),
    _api("journal replaced under a live ledger", "replaced", "JournalReplacedError",
         ("replaced",)),
    _api("approx-DP charge on the adaptive filter", "approx_adaptive", "InvalidParameterError",
         ("FIXED_PLAN",)),
    _api("PLD halting without a fixed plan", "pld_adaptive", "InvalidParameterError",
         ("fixed",)),
    # -- sizes read from private data (issue #31) -------------------------------------------
    _pq("parquet sizes undeclared", {"uri": "{data}/good.parquet", "label_column": "y",
                                     "declared_train_size": _DELETE,
                                     "declared_validation_size": _DELETE},
        words=("data.declared_train_size", "data.declared_validation_size", "sizes_public")),
    _pq("parquet num_classes undeclared", {"uri": "{data}/good.parquet", "label_column": "y",
                                           "num_classes": _DELETE},
        words=("data.num_classes", "sizes_public")),
    _pq("parquet sizes_public not a bool", {"uri": "{data}/good.parquet", "label_column": "y",
                                            "sizes_public": "maybe"},
        words=("sizes_public", "maybe")),
    _pq("parquet test size undeclared", {"uri": "{data}/good.parquet", "label_column": "y"},
        words=("test_accuracy_epsilon", "data.declared_test_size", "sizes_public"),
        top=(("test_accuracy_epsilon", 0.5),)),
    # -- issue #31: inputs that were accepted silently or reported badly ------------------------
    _led("ledger verify both seal slots damaged", "verify", "{tmp}/sealbroken.journal",
         words=("sealbroken.journal.seal", "no valid slot"),
         files=(("sealbroken.journal", "@sealbroken"),)),
    # argparse read "-1e-5" (not a plain "-1") as an option: "expected one argument"
    _acc("account delta negative exponent", "--noise-multiplier", "1", "--sample-rate", "0.01",
         "--steps", "100", "--delta", "-1e-5", words=("--delta", "'-1e-5'", "(0, 1)")),
    _acc("account epsilon negative exponent", "--mechanism", "laplace", "--epsilon", "-1e-3",
         words=("--epsilon", "'-1e-3'", "> 0")),
    _acc("account sensitivity negative infinity", "--mechanism", "laplace", "--epsilon", "1",
         "--sensitivity", "-inf", words=("--sensitivity", "'-inf'", "> 0")),
    _acc("account delta zero", "--mechanism", "gaussian", "--epsilon", "1", "--delta", "0",
         words=("--delta", "'0'", "(0, 1)")),
    _cli("run progress interval negative exponent", "run", "{tmp}/exp.yaml",
         "--progress-interval", "-1e-3", words=("--progress-interval", "'-1e-3'", "> 0")),
    _exp("data source key misspelled", ("data.sorce", "mnist1d"), ("data.source", _D),
         words=("data.sorce is not a key", "did you mean 'source'", "needs the key 'source'")),
    _pq("parquet val_uri is the training file", {"uri": "{data}/good.parquet",
                                                 "label_column": "y", "val_fraction": _DELETE,
                                                 "val_uri": "{data}/./good.parquet"},
        words=("data.val_uri", "same file as data.uri", "disjoint")),
    _pq("parquet test_uri is the training file", {"uri": "{data}/good.parquet",
                                                  "label_column": "y", "test_fraction": _DELETE,
                                                  "test_uri": "file://{data}/good.parquet"},
        words=("data.test_uri", "same file as data.uri", "disjoint")),
    _exp("test epsilon without a test split", ("data.test_fraction", 0),
         ("test_accuracy_epsilon", 0.5), words=("test_accuracy_epsilon", "no test split")),
    # the whole grid's cost is known before any charge: 3 trials ran, then the ledger stopped it
    _exp("grid of 10000 points the budget cannot pay",
         ("search", {"algorithm": "grid_composed", "settings": {}}),
         ("space.lr", {"loguniform": [0.01, 1.0], "points": 100}),
         ("space.max_grad_norm", {"uniform": [0.5, 2.0], "points": 100}),
         ("space.batch_size", 32),
         words=("the budget cannot pay", "10000 grid points", "ε=8"), exit_code=EXIT_BUDGET),
    # a started run (its tune/ dir) whose ledger journal and seal were moved away: resuming
    # re-charged the whole plan on a fresh ledger
    Case("resume after the journal was moved", "experiment",
         ("run", "{tmp}/exp.yaml", "--resume"),
         (("exp.yaml", yaml.safe_dump(BASE, sort_keys=False)),
          ("store/bad-input/tune/.started", ""),
          ("store/bad-input/run.json", '{"experiment": "bad-input", "status": "failed"}')),
         EXIT_BAD_INPUT,
         ("cannot resume", "'bad-input'", "store/ledgers/data-mnist1d-", "does not exist")),
    Case("resume on a ledger without its charges", "experiment",
         ("run", "{tmp}/exp.yaml", "--resume"),
         (("exp.yaml", yaml.safe_dump(_set(BASE, "ledger", {"name": "seeded",
                                                            "journal": "{journal}"}),
                                      sort_keys=False)),
          ("store/bad-input/tune/.started", "")),
         EXIT_BAD_INPUT, ("cannot resume", "seed.journal", "holds no charge", "'bad-input/'")),
    # -- federated experiment files (raydp-hpo federated --config) ------------------------------
    _fed("fed unknown top-level key", ("trainng", {}), words=("trainng", "training")),
    _fed("fed kind wrong", ("kind", "experiment"), words=("kind", "'experiment'", "federated")),
    _fed("fed kind missing", ("kind", _D), words=("kind",)),
    _fed("fed experiment dot-dot", ("experiment", ".."), words=("'..'", "plain name")),
    _fed("fed experiment with slash", ("experiment", "a/b"), words=("a/b", "plain name")),
    _fed("fed experiment empty", ("experiment", ""), words=("experiment",)),
    _fed("fed seed negative", ("seed", -1), words=("seed", "-1")),
    _fed("fed data source unknown", ("data.source", "cifar10"),
         words=("data.source", "cifar10", "digits, mnist1d")),
    _fed("fed data source misspelled", ("data.source", "digit"),
         words=("data.source", "'digit'", "did you mean 'digits'")),
    _fed("fed data size on digits", ("data.size", 500), words=("data.size", "mnist1d")),
    _fed("fed data size too small", ("data.source", "mnist1d"), ("data.size", 5),
         words=("data.size", ">= 10")),
    _fed("fed data misspelled", ("data.sorce", "digits"), words=("sorce", "source")),
    _fed("fed test fraction one", ("data.test_fraction", 1.0),
         words=("data.test_fraction", "(0, 1)")),
    _fed("fed clients zero", ("clients.count", 0), words=("clients.count", ">= 1")),
    _fed("fed clients above the classes", ("clients.count", 11),
         words=("clients.count=11", "10 classes")),
    _fed("fed clients not an integer", ("clients.count", 2.5),
         words=("clients.count", "integer", "2.5")),
    _fed("fed clients missing", ("clients", _D), words=("clients",)),
    _fed("fed random fraction above one", ("clients.random_fraction", 1.5),
         words=("clients.random_fraction", "[0, 1]")),
    _fed("fed model unknown", ("model.name", "transformer"),
         words=("model / training", "transformer")),
    _fed("fed model kwargs misspelled", ("model.kwargs", {"hiden": [8]}),
         words=("model / training", "hiden")),
    _fed("fed model not a mapping", ("model", [1]), words=("model", "mapping")),
    _fed("fed optimizer unknown", ("training.optimizer", "rmsprop"),
         words=("training.optimizer", "rmsprop", "adadp, sgd, adam")),
    _fed("fed lr negative", ("training.lr", -0.1), words=("training.lr", "> 0")),
    _fed("fed rounds zero", ("training.rounds", 0), words=("training.rounds", ">= 1")),
    _fed("fed alpha max below one", ("training.alpha_max", 0.95),
         words=("training.alpha_max", "> 1")),
    _fed("fed alpha min one", ("training.alpha_min", 1.0),
         words=("training.alpha_min", "(0, 1)")),
    _fed("fed tol text", ("training.tol", "x"), words=("training.tol", "number")),
    _fed("fed training misspelled", ("training.epochs", 1),
         words=("'epochs'", "training", "local_epochs")),
    _fed("fed ray text", ("ray", "yes"), words=("ray", "true or false")),
    _fed("fed cpus per client zero", ("cpus_per_client", 0), words=("cpus_per_client", "> 0")),
    _fed("fed storage path URL", ("storage_path", "s3://bucket/x"), words=("s3://bucket/x",)),
    _fed("fed privacy misspelled", ("privacy", {**FED_PRIVACY, "clip": 1.0}),
         words=("'clip'", "privacy", "clip_norm")),
    _fed("fed privacy budget missing",
         ("privacy", {"clip_norm": 1.0, "noise_multiplier": 2.0}),
         words=("privacy", "'budget'")),
    _fed("fed privacy clip zero", ("privacy", {**FED_PRIVACY, "clip_norm": 0}),
         words=("privacy.clip_norm", "> 0")),
    _fed("fed privacy noise negative", ("privacy", {**FED_PRIVACY, "noise_multiplier": -1}),
         words=("privacy.noise_multiplier", "> 0")),
    _fed("fed privacy delta above one",
         ("privacy", {**FED_PRIVACY, "budget": {"epsilon": 8.0, "delta": 2.0}}),
         words=("privacy.budget.delta", "< 1")),
    _fed("fed privacy delta missing",
         ("privacy", {**FED_PRIVACY, "budget": {"epsilon": 8.0}}),
         words=("privacy.budget", "'delta'")),
    _fed("fed privacy epsilon nan",
         ("privacy", {**FED_PRIVACY, "budget": {"epsilon": float("nan"), "delta": 1e-5}}),
         words=("privacy.budget.epsilon",)),
    _fed("fed several errors at once", ("training.lr", -1), ("ray", "yes"),
         ("clients.count", 0), words=("3 errors", "training.lr", "ray", "clients.count")),
    _fed_text("fed yaml empty file", "", words=("fed.yaml", "empty")),
    _fed_text("fed yaml a list", "- a\n- b\n", words=("mapping",)),
    _fed_text("fed yaml duplicate key", "kind: federated\nkind: federated\n",
              words=("duplicate key 'kind'",)),
]

assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"

# -- the files a case needs ---------------------------------------------------------------------
BUDGET = (3.0, 1e-5)


def _seed_ledger(path: Path) -> Any:
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import SubsampledGaussian
    from raydp_hpo.ledger.filter import PrivacyLedger

    ledger = PrivacyLedger(PrivacyBudget(*BUDGET), path)
    ledger.charge("seed", SubsampledGaussian(1.0, 0.01, 100), owner="setup")
    return ledger


def _special_journal(kind: str, path: Path) -> None:
    """A damaged copy of a 3-charge journal: forged (record 2 rewritten, chain kept),
    flipped (a byte of record 1), cut (records 2-3 removed at a line boundary), sealbroken
    (the journal intact, both slots of its seal damaged)."""
    from raydp_hpo.accounting.mechanisms import Gaussian

    ledger = _seed_ledger(path)
    ledger.charge("two", Gaussian(50.0))
    ledger.charge("three", Gaussian(60.0))
    ledger.close()
    lines = path.read_bytes().splitlines(keepends=True)
    if kind == "@forged":
        lines[2] = lines[2].replace(b'"two"', b'"tw0"')
    elif kind == "@flipped":
        lines[1] = lines[1].replace(b'"seed"', b'"seeD"')
    elif kind == "@cut":
        lines = lines[:2]
    elif kind == "@sealbroken":  # the journal intact, both seal slots damaged
        from raydp_hpo.ledger.journal import seal_path

        seal = bytearray(seal_path(path).read_bytes())
        for k in range(0, len(seal), 256):
            seal[k + 10] ^= 0x01
        seal_path(path).write_bytes(bytes(seal))
    path.write_bytes(b"".join(lines))


def make_data(folder: Path) -> None:
    """The Parquet files the data rows name (80 rows, features f0, f1, label y)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = 80
    f0, f1 = rng.normal(size=n), rng.normal(size=n)
    y = rng.integers(0, 3, size=n)

    def write(name: str, **cols: Any) -> None:
        pq.write_table(pa.table(cols), folder / name)

    write("good.parquet", f0=f0, f1=f1, y=y)
    write("oneclass.parquet", f0=f0, f1=f1, y=np.zeros(n, dtype=np.int64))
    write("nanlabel.parquet", f0=f0, f1=f1, y=np.where(np.arange(n) == 5, np.nan, y * 1.0))
    write("nanfeat.parquet", f0=np.where(np.arange(n) == 7, np.nan, f0), f1=f1, y=y)
    write("strlabel.parquet", f0=f0, f1=f1, y=np.array(["a", "b"] * (n // 2)))
    write("neglabel.parquet", f0=f0, f1=f1, y=np.where(np.arange(n) == 3, -1, y))
    write("empty.parquet", f0=f0[:0], f1=f1[:0], y=y[:0])
    write("strfeat.parquet", f0=f0, colour=np.array(["a", "b"] * (n // 2)), y=y)
    write("othercols.parquet", f0=f0, g1=f1, y=y)
    (folder / "text.parquet").write_text("not parquet\n")


def prepare(case: Case, tmp: Path, data: Path) -> tuple[list[str], Path]:
    """Write the case's files into ``tmp`` (and the seeded journal); return the argv and the
    seeded journal's path."""
    tmp.mkdir(parents=True, exist_ok=True)
    journal = tmp / "seed.journal"
    if not journal.exists():
        _seed_ledger(journal).close()

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp)).replace("{journal}", str(journal)).replace(
            "{data}", str(data))

    for name, content in case.files:
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str) and content.startswith("@"):
            _special_journal(content, target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(fill(content), encoding="utf-8")
    if case.kind in ("cli",) and not (tmp / "exp.yaml").exists():
        (tmp / "exp.yaml").write_text(fill(yaml.safe_dump(BASE, sort_keys=False)))
    return [fill(a) for a in case.argv], journal


def journals_under(tmp: Path) -> dict[Path, bytes]:
    """Every journal-like file under ``tmp`` with its bytes (the seeded one included)."""
    return {p: p.read_bytes() for p in sorted(tmp.rglob("*.journal")) if p.is_file()}


def classify(case: Case, code: int | None, output: str, before: dict[Path, bytes],
             after: dict[Path, bytes]) -> tuple[str, str]:
    """(outcome, why) for one run of ``case``: clear / vague / silent / hang."""
    if code is None:
        return "hang", "timed out"
    if after != before:
        changed = sorted(str(p) for p in set(before) | set(after)
                         if before.get(p) != after.get(p))
        return "vague", f"journals changed: {changed}"
    if code == 0:
        return "silent", "exit 0 (accepted)"
    if "Traceback (most recent call last)" in output:
        return "vague", "traceback"
    if code != case.exit_code:
        return "vague", f"exit {code}, documented {case.exit_code}"
    missing = [w for w in case.words if w not in output]
    if missing:
        return "vague", f"message lacks {missing}"
    return "clear", ""


# -- ledger operations (kind "api") ---------------------------------------------------------------
def _api_action(name: str, journal: Path) -> Callable[[Any], Any]:
    import os

    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import ApproxDP, Gaussian, Laplace, SubsampledGaussian
    from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger

    trial = SubsampledGaussian(1.0, 0.01, 100)

    def closed(led: Any) -> Any:
        led.close()
        return led.charge("after-close", trial)

    def deleted(led: Any) -> Any:
        keep = journal.with_name("kept-inode")
        os.link(journal, keep)
        os.unlink(journal)
        try:
            return led.charge("after-delete", trial)
        finally:
            os.replace(keep, journal)  # the same file back under its name

    def replaced(led: Any) -> Any:
        copy_path = journal.with_name("copy.tmp")
        copy_path.write_bytes(journal.read_bytes())
        os.replace(copy_path, journal)
        return led.charge("after-replace", trial)

    actions: dict[str, Callable[[Any], Any]] = {
        "exhaust": lambda led: led.charge("big", Gaussian(0.3, 10)),
        "exhaust_count": lambda led: led.charge("many", Laplace(0.5, count=10)),
        "conflict": lambda led: led.charge("seed", Gaussian(5.0)),
        "not_a_mechanism": lambda led: led.charge("x", "gaussian"),
        "empty_id": lambda led: led.charge("", trial),
        "int_id": lambda led: led.charge(7, trial),
        "closed": closed,
        "second_writer": lambda led: PrivacyLedger(PrivacyBudget(*BUDGET), journal),
        "other_budget": lambda led: (led.close(),
                                     PrivacyLedger(PrivacyBudget(9.0, 1e-5), journal)),
        "deleted": deleted,
        "replaced": replaced,
        "approx_adaptive": lambda led: led.charge("ad", ApproxDP(0.1, 1e-7)),
        "pld_adaptive": lambda led: PrivacyLedger(
            PrivacyBudget(*BUDGET), journal.with_name("new.journal"),
            adaptivity=Adaptivity.ADAPTIVE, accountant=Accountant.PLD),
    }
    return actions[name]


def run_api(case: Case, tmp: Path) -> tuple[int, str, str | None]:
    """Run an ``api`` row against a live ledger on the seeded journal (in this process):
    (exit code as the CLI would map it, message, error class name)."""
    from raydp_hpo.errors import BudgetExhaustedError, RayDPHPOError
    from raydp_hpo.ledger.filter import PrivacyLedger

    assert case.api is not None
    journal = tmp / "seed.journal"
    ledger = PrivacyLedger.open(journal)
    try:
        _api_action(case.api, journal)(ledger)
    except BudgetExhaustedError as exc:
        return EXIT_BUDGET, str(exc), type(exc).__name__
    except RayDPHPOError as exc:
        return EXIT_BAD_INPUT, str(exc), type(exc).__name__
    finally:
        ledger.close()
    return 0, "", None


def api_main(argv: list[str]) -> int:
    """``python -m tests.raydp_hpo.cli.bad_input_catalogue CASE_NAME TMP`` (the benchmark's
    subprocess for an api row): prints the error, exits as the CLI would."""
    case = next(c for c in CASES if c.name == argv[0])
    tmp = Path(argv[1])
    code, message, error = run_api(case, tmp)
    if code:
        print(f"raydp-hpo: error: {error}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(api_main(sys.argv[1:]))
