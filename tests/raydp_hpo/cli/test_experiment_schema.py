"""The published JSON Schemas (``raydp-hpo schema [--kind experiment|federated|any]``): every
example experiment and federated experiment file in cluster/examples/ and in the READMEs
validates against its kind's schema and against ``any`` (with the ``jsonschema`` package when
installed, and always through the pydantic models that parse files), and files the parser
refuses for a wrong key or value are refused by them too (every row of the bad-input
catalogue)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from raydp_hpo.cli.config import json_schema
from raydp_hpo.cli.experiment import parse_experiment
from raydp_hpo.cli.federated_experiment import parse_federated
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _yaml_files() -> list[tuple[str, Any]]:
    """Every YAML file of cluster/examples/ and every ```yaml block of the READMEs and
    docs/, parsed."""
    out = []
    for path in sorted((ROOT / "cluster" / "examples").glob("*.yaml")):
        out.append((str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())))
    for readme in (ROOT / "README.md", ROOT / "cluster" / "README.md",
                   *sorted((ROOT / "docs").rglob("*.md"))):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", readme.read_text(), re.S)):
            out.append((f"{readme.relative_to(ROOT)} block {i}", yaml.safe_load(block)))
    return out


def _examples() -> list[tuple[str, dict[str, Any]]]:
    """Every experiment file of cluster/examples/ and every ```yaml block of the READMEs and
    docs/ that is one (federated files, ``kind: federated``, have their own format)."""
    return [(name, raw) for name, raw in _yaml_files()
            if isinstance(raw, dict) and "experiment" in raw and raw.get("kind") != "federated"]


EXAMPLES = _examples()


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The schema as the CLI writes it."""
    out = tmp_path_factory.mktemp("schema") / "experiment.schema.json"
    assert main(["schema", "--output", str(out)]) == EXIT_OK
    return json.loads(out.read_text())


def _schema_errors(schema: dict[str, Any], raw: Any) -> list[str]:
    """jsonschema's errors for ``raw`` ([] when valid); pydantic's when jsonschema is absent."""
    try:
        import jsonschema
    except ImportError:
        try:
            parse_experiment(raw)
        except ConfigError as exc:
            return [message for _, message in exc.problems]
        return []
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(raw)]


def test_there_are_examples_and_the_readme_shows_one() -> None:
    names = [name for name, _ in EXAMPLES]
    assert "cluster/examples/mnist1d_small.yaml" in names
    assert any(name.startswith("docs/") for name in names), names  # the docs show one


@pytest.mark.parametrize(("name", "raw"), EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_examples_validate_against_the_schema(schema: dict[str, Any], name: str,
                                              raw: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:  # _schema_errors falls back to the pydantic models
        pass
    else:
        jsonschema.Draft202012Validator.check_schema(schema)
    assert _schema_errors(schema, raw) == [], name
    parse_experiment(raw)  # and the parser accepts it


@pytest.mark.parametrize(("path", "value"), [
    ("budgte", {"epsilon": 1, "delta": 1e-5}),  # unknown top-level key
    ("data.sise", 100),  # unknown key of the source's block
    ("data.uri", "x.parquet"),  # a parquet key on mnist1d
    ("data.source", "mnist"),  # unknown source
    ("search.algorithm", "random_stoping"),  # unknown algorithm
    ("search.mode", "maximise"),
    ("model.name", "mlpp"),
    ("space.lr", {"loguniforn": [0.1, 1]}),  # unknown domain
    ("space.lr", {"loguniform": [0.1, 1], "points": 1}),
    ("space.model", "cnn1d"),  # reserved key
    ("budget.delta", "tiny"),
    ("resources.cpu", -1),
    ("split_seed", -1),
    ("tensorboard", "yes"),
])
def test_the_schema_refuses_what_the_parser_refuses(schema: dict[str, Any], path: str,
                                                    value: Any) -> None:
    raw = copy.deepcopy(EXAMPLES[0][1])
    node = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    with pytest.raises(ConfigError):
        parse_experiment(raw)
    assert _schema_errors(schema, raw), f"the schema accepts {path}={value!r}"


def test_schema_command_prints_the_schema(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    assert main(["schema"]) == EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    assert printed == json_schema("experiment")
    assert printed["additionalProperties"] is False
    # search: optional since it defaults to {algorithm: auto}, the package default search
    assert set(printed["required"]) == {"experiment", "data", "model", "space", "budget"}
    assert main(["schema", "--output", str(tmp_path)]) == EXIT_BAD_INPUT  # a directory
    assert "is a directory" in capsys.readouterr().err


# -- the bad-input catalogue against the published schema -----------------------------------
#: Catalogue rows the parser refuses for a reason JSON Schema cannot express (each says why).
#: Every other experiment-file row the parser refuses must be refused by the schema too.
SCHEMA_CANNOT_EXPRESS = {
    # JSON has no NaN or infinity: a schema bound cannot refuse YAML's .nan / .inf
    "budget epsilon nan": "non-finite number",
    "budget epsilon inf": "non-finite number",
    # one field against another
    "test epsilon above budget": "cross-field: test_accuracy_epsilon < budget.epsilon",
    "ledger delta differs": "cross-field: ledger.budget.delta == budget.delta",
    "space uniform reversed": "cross-item: low < high",
    "data fractions sum": "cross-field: val_fraction + test_fraction < 1",
    "parquet both column kinds given": "cross-field: feature_columns or feature_column",
    "parquet val_uri with val_fraction": "cross-field: val_uri or val_fraction",
    "parquet val_uri is the training file": "cross-field, after resolving paths: val_uri != uri",
    "parquet test_uri is the training file": "cross-field, after resolving paths: test_uri != uri",
    "test epsilon without a test split": "cross-field: data.test_fraction > 0",
    "parquet test size undeclared": "cross-field: test_accuracy_epsilon needs "
                                    "data.declared_test_size",
}


def _catalogue_files(tmp: Path) -> list[tuple[str, bool, Any]]:
    """(row name, refused by the parser, parsed YAML) of every experiment-file row whose
    file is YAML (rows refused before YAML — not UTF-8, bad syntax — are no schema matter)."""
    from raydp_hpo.cli.experiment import load_experiment
    from tests.raydp_hpo.cli.bad_input_catalogue import BASE, CASES

    out = [("BASE", False, copy.deepcopy(BASE))]
    for case in CASES:
        if case.kind not in ("experiment", "data") or not case.files:
            continue
        text = case.files[0][1]
        if isinstance(text, bytes):
            continue
        text = text.replace("{tmp}", str(tmp)).replace("{data}", str(tmp))
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        (tmp / "exp.yaml").write_text(text, encoding="utf-8")
        try:
            load_experiment(tmp / "exp.yaml")
        except ConfigError:
            out.append((case.name, True, raw))
        else:  # refused later (data, searcher, budget, resources) or not at all
            out.append((case.name, False, raw))
    return out


def test_the_schema_refuses_every_catalogue_row_the_parser_refuses(
        schema: dict[str, Any], tmp_path: Path) -> None:
    """Every constraint the parser enforces that JSON Schema can express is in the published
    schema (budget ε > 0, δ in (0, 1), log-domain low > 0, plain experiment names, ...)."""
    pytest.importorskip("jsonschema")
    _agrees_with_the_parser(schema, _catalogue_files(tmp_path), SCHEMA_CANNOT_EXPRESS)


def _agrees_with_the_parser(schema: dict[str, Any], rows: list[tuple[str, bool, Any]],
                            cannot_express: dict[str, str]) -> None:
    """The schema accepts the valid base file (``rows[0]``) and refuses every row the parser
    refuses, but those in ``cannot_express`` (which the parser must refuse and the schema
    must accept: a row the schema learns to refuse leaves the list)."""
    assert _schema_errors(schema, rows[0][2]) == []  # the valid base file passes
    refused = {name for name, parser_refuses, _ in rows if parser_refuses}
    assert set(cannot_express) <= refused  # the list names real parser refusals
    gaps = [name for name, parser_refuses, raw in rows
            if parser_refuses and name not in cannot_express
            and not _schema_errors(schema, raw)]
    assert gaps == [], f"the schema accepts what the parser refuses: {gaps}"
    listed = [name for name, _, raw in rows
              if name in cannot_express and _schema_errors(schema, raw)]
    assert listed == [], f"the schema refuses these now: drop them from the list: {listed}"


# -- federated experiment files, and the schema of either kind ----------------------------------
def _federated_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every federated experiment file (``kind: federated``) of cluster/examples/ and of the
    READMEs' ```yaml blocks."""
    return [(name, raw) for name, raw in _yaml_files()
            if isinstance(raw, dict) and raw.get("kind") == "federated"]


FEDERATED_EXAMPLES = _federated_examples()


def _written_schema(tmp: Path, kind: str) -> dict[str, Any]:
    out = tmp / f"{kind}.schema.json"
    assert main(["schema", "--kind", kind, "--output", str(out)]) == EXIT_OK
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def federated_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _written_schema(tmp_path_factory.mktemp("schema"), "federated")


@pytest.fixture(scope="module")
def any_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _written_schema(tmp_path_factory.mktemp("schema"), "any")


def _errors(schema: dict[str, Any], raw: Any) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(raw)]


def test_there_is_a_federated_example() -> None:
    assert "cluster/examples/federated_digits.yaml" in [n for n, _ in FEDERATED_EXAMPLES]


@pytest.mark.parametrize(("name", "raw"), FEDERATED_EXAMPLES,
                         ids=[n for n, _ in FEDERATED_EXAMPLES])
def test_federated_examples_validate_against_the_schemas(
        federated_schema: dict[str, Any], any_schema: dict[str, Any], name: str,
        raw: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    for schema in (federated_schema, any_schema):
        jsonschema.Draft202012Validator.check_schema(schema)
        assert _errors(schema, raw) == [], name
    parse_federated(raw)  # and the parser accepts it


@pytest.mark.parametrize(("name", "raw"), EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_experiment_examples_validate_against_the_schema_of_any_file(
        any_schema: dict[str, Any], name: str, raw: dict[str, Any]) -> None:
    assert _errors(any_schema, raw) == [], name


def test_the_schema_of_any_file_tells_the_kinds_apart(
        any_schema: dict[str, Any], federated_schema: dict[str, Any]) -> None:
    """``kind: federated`` picks the federated schema, no ``kind`` the experiment schema: an
    experiment file marked federated, and a federated file without its kind, are refused."""
    experiment, federated = EXAMPLES[0][1], FEDERATED_EXAMPLES[0][1]
    assert _errors(any_schema, {**experiment, "kind": "federated"})
    assert _errors(any_schema, {k: v for k, v in federated.items() if k != "kind"})
    assert federated_schema["required"] == ["kind", "experiment", "data", "clients", "model",
                                            "training"]
    assert federated_schema["additionalProperties"] is False


#: Federated catalogue rows the parser refuses for a reason JSON Schema cannot express.
FEDERATED_SCHEMA_CANNOT_EXPRESS = {
    "fed privacy epsilon nan": "non-finite number",
    "fed model kwargs misspelled": "the model's keyword arguments: checked by building it",
}


def _federated_catalogue_files(tmp: Path) -> list[tuple[str, bool, Any]]:
    """(row name, refused by the parser, parsed YAML) of every federated row (as
    :func:`_catalogue_files` for experiment files)."""
    from raydp_hpo.cli.federated_experiment import load_federated
    from tests.raydp_hpo.cli.bad_input_catalogue import CASES, FED_BASE

    out = [("FED_BASE", False, json.loads(json.dumps(FED_BASE).replace("{tmp}", str(tmp))))]
    for case in CASES:
        if case.kind != "federated":
            continue
        text = str(case.files[0][1]).replace("{tmp}", str(tmp))
        raw = yaml.safe_load(text)
        (tmp / "fed.yaml").write_text(text, encoding="utf-8")
        try:
            load_federated(tmp / "fed.yaml")
        except ConfigError:
            out.append((case.name, True, raw))
        else:
            out.append((case.name, False, raw))
    return out


@pytest.mark.parametrize("kind", ["federated", "any"])
def test_the_schema_refuses_every_federated_catalogue_row_the_parser_refuses(
        kind: str, federated_schema: dict[str, Any], any_schema: dict[str, Any],
        tmp_path: Path) -> None:
    """Every constraint the federated parser enforces that JSON Schema can express is in the
    published schema (``--kind federated``, and ``--kind any`` for a file with ``kind``)."""
    pytest.importorskip("jsonschema")
    schema = federated_schema if kind == "federated" else any_schema
    rows = _federated_catalogue_files(tmp_path)
    refused = {name for name, parser_refuses, _ in rows if parser_refuses}
    assert len(rows) > 40 and refused == {name for name, _, _ in rows[1:]}  # every row
    _agrees_with_the_parser(schema, rows, FEDERATED_SCHEMA_CANNOT_EXPRESS)


def test_the_schema_of_any_file_refuses_every_experiment_row_the_parser_refuses(
        any_schema: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("jsonschema")
    _agrees_with_the_parser(any_schema, _catalogue_files(tmp_path), SCHEMA_CANNOT_EXPRESS)
