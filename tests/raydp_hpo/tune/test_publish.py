"""Publication of exactly the public part (no Ray): DPResult.save_public, the experiment
folder's public/ writer, `raydp-hpo publish`, and the guard against machine paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.trainables.models import build_model
from raydp_hpo.trainables.release import (
    RELEASED_MODEL_FILE,
    load_released_model,
    save_released_model,
)
from raydp_hpo.tune import publish
from raydp_hpo.tune.tuner import DPResult, PrivacyCertificate

PUBLIC_FILES = {"release.json", "certificate.json", "released_model.pt"}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def assert_no_machine_paths(folder: Path, *private: Path) -> None:
    """Every string of every JSON file in ``folder``: not absolute, and naming neither the
    home directory nor a private folder (the storage path, the experiment folder)."""
    needles = [str(Path.home()), *(str(p) for p in private)]
    for path in folder.glob("*.json"):
        for text in _strings(json.loads(path.read_text())):
            assert not text.startswith("/"), (path.name, text)
            assert not any(n in text for n in needles), (path.name, text)


def _certificate() -> PrivacyCertificate:
    return PrivacyCertificate(
        algorithm="random_stopping", paper="Papernot & Steinke 2022", description="RDP",
        budget=PrivacyBudget(4.0, 1e-5), charges=(("exp/plan", SubsampledGaussian(1.0, 0.1, 10)),),
        epsilon_rdp=1.5, epsilon_pld=1.4, ledger_name="exp", ledger_spent_epsilon=1.4,
        ledger_halting_rule="fixed_plan/profile", public=(("training-set size", "100"),),
        epsilon_profile=1.3,
    )


def _experiment(storage: Path, hyperparameters: dict[str, Any] | None = None,
                released: bool = True) -> DPResult:
    """A finished experiment folder as DPTuner leaves it: public/ (its writer), private files
    beside it, and the DPResult pointing at them."""
    exp = storage / "exp"
    (exp / "tune").mkdir(parents=True)
    (exp / "tune" / "result.json").write_text('{"val_accuracy": 0.5}')
    (exp / "ledger.journal").write_text("private")
    model_path = None
    if released:
        model = build_model("mlp", (8,), 3, hidden=[4])
        model_path = str(save_released_model(
            exp / "public" / RELEASED_MODEL_FILE, model, model_name="mlp",
            model_kwargs={"hidden": [4]}, feature_shape=(8,), num_classes=3))
    result = DPResult(
        hyperparameters=({"lr": 0.3, "epochs": 1} if hyperparameters is None else hyperparameters)
        if released else None,
        model=None, model_path=model_path, certificate=_certificate(), test_accuracy=0.9,
        budget_exhausted=False, experiment_path=str(exp),
        private_trials=[{"trial_id": "t1", "metrics": {"val_accuracy": 0.5}}],
    )
    publish.write_public_files(exp / "public", result.public(), result.model_path,
                               private=(exp, storage), strict=False)  # as DPTuner does
    publish.write_private_note(exp)
    return result


def test_the_model_file_name_is_the_release_modules() -> None:
    assert publish.MODEL_FILE == RELEASED_MODEL_FILE


def test_save_public_writes_exactly_the_public_files_without_machine_paths(tmp_path: Path
                                                                          ) -> None:
    storage = tmp_path / "storage"
    result = _experiment(storage)
    exp = Path(result.experiment_path)
    # the experiment folder says what is private, and public/ holds exactly the public part
    assert "everything in this experiment folder except public/" in (
        exp / publish.PRIVATE_NOTE_FILE).read_text()
    assert {p.name for p in (exp / "public").iterdir()} == PUBLIC_FILES

    out = tmp_path / "to-publish"
    written = result.save_public(out)
    assert {p.name for p in written} == {p.name for p in out.iterdir()} == PUBLIC_FILES
    assert_no_machine_paths(out, storage.resolve(), exp.resolve())
    assert_no_machine_paths(exp / "public", storage.resolve(), exp.resolve())
    release = json.loads((out / "release.json").read_text())
    assert release["hyperparameters"] == {"lr": 0.3, "epochs": 1}
    assert release["model_file"] == "released_model.pt"
    assert release["files"] == ["release.json", "certificate.json", "released_model.pt"]
    assert json.loads((out / "certificate.json").read_text()) == _certificate().to_dict()
    assert release["certificate"] == _certificate().to_dict()
    # nothing private: no trial, no trial count, no unnoised test accuracy, no model_path
    text = (out / "release.json").read_text()
    assert '"val_accuracy"' not in text and '"test_accuracy"' not in text and '"t1"' not in text
    assert "model_path" not in release
    # the model is the released one, byte for byte, and loads from the published folder
    assert (out / "released_model.pt").read_bytes() == Path(result.model_path).read_bytes()
    assert sum(p.numel() for p in load_released_model(out / "released_model.pt").parameters()
               ) == 8 * 4 + 4 + 4 * 3 + 3


def test_save_public_refuses_private_or_used_folders_and_writes_nothing(tmp_path: Path) -> None:
    result = _experiment(tmp_path / "storage")
    exp = Path(result.experiment_path)
    before = sorted(p.relative_to(exp) for p in exp.rglob("*"))
    for inside in (exp, exp / "public", exp / "tune" / "out", exp / "new"):
        with pytest.raises(InvalidParameterError, match="inside the experiment folder"):
            result.save_public(inside)
    assert sorted(p.relative_to(exp) for p in exp.rglob("*")) == before
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(InvalidParameterError, match="already holds files"):
        result.save_public(used)
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    with pytest.raises(InvalidParameterError, match="is a file"):
        result.save_public(used / "notes.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert {p.name for p in result.save_public(empty)} == PUBLIC_FILES  # an empty one is fine
    with pytest.raises(InvalidParameterError, match="already holds files"):
        result.save_public(empty)  # not twice into the same folder


def test_nothing_released_publishes_the_certificate_alone(tmp_path: Path) -> None:
    result = _experiment(tmp_path / "storage", released=False)
    written = result.save_public(tmp_path / "out")
    assert {p.name for p in written} == {"release.json", "certificate.json"}
    release = json.loads((tmp_path / "out" / "release.json").read_text())
    assert release["hyperparameters"] is None and release["model_file"] is None


def test_a_release_naming_machine_paths_is_refused(tmp_path: Path) -> None:
    """A search-space constant holding a path of this machine would be released as a
    hyperparameter: save_public refuses (writing nothing); DPTuner's own public/ keeps it."""
    storage = tmp_path / "storage"
    result = _experiment(storage, hyperparameters={"lr": 0.3, "data": str(storage / "x.csv")})
    with pytest.raises(InvalidParameterError, match=r"paths of this machine.*hyperparameters\.data"):
        result.save_public(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert publish.machine_paths({"a": ["~/x", "C:\\data", "rel/path", "ε/δ"]}) == [
        "$.a[0]='~/x'", "$.a[1]='C:\\\\data'"]


def test_cli_publish_copies_the_public_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    result = _experiment(tmp_path / "storage")
    exp = Path(result.experiment_path)
    out = tmp_path / "cli-out"
    assert main(["publish", str(exp), str(out)]) == EXIT_OK
    assert "published 3 files" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == PUBLIC_FILES
    for name in PUBLIC_FILES:  # the same function as DPResult.save_public: the same bytes
        assert (out / name).read_bytes() == (exp / "public" / name).read_bytes()
    assert main(["publish", str(exp), str(out)]) == EXIT_BAD_INPUT  # holds files now
    assert "already holds files" in capsys.readouterr().err
    assert main(["publish", str(exp), str(exp / "pub")]) == EXIT_BAD_INPUT
    assert "inside the experiment folder" in capsys.readouterr().err
    assert not (exp / "pub").exists()
    assert main(["publish", str(tmp_path), str(tmp_path / "x")]) == EXIT_BAD_INPUT
    assert "not a finished experiment folder" in capsys.readouterr().err


def test_cli_publish_an_older_run_dir_drops_its_machine_path(tmp_path: Path) -> None:
    """Run dirs written before public/ kept release.json beside the private files, with the
    absolute model_path: publishing one writes the same public files, without that path."""
    run = tmp_path / "old-run"
    run.mkdir()
    model = build_model("mlp", (8,), 3, hidden=[4])
    model_path = save_released_model(run / RELEASED_MODEL_FILE, model, model_name="mlp",
                                     model_kwargs={"hidden": [4]}, feature_shape=(8,),
                                     num_classes=3)
    (run / "release.json").write_text(json.dumps({
        "hyperparameters": {"lr": 0.5}, "model_path": str(model_path), "budget_exhausted": False,
        "certificate": _certificate().to_dict(), "dp_test_accuracy": None}))
    out = tmp_path / "out"
    assert main(["publish", str(run), str(out)]) == EXIT_OK
    assert {p.name for p in out.iterdir()} == PUBLIC_FILES
    assert_no_machine_paths(out, run.resolve())
    assert (out / RELEASED_MODEL_FILE).read_bytes() == Path(model_path).read_bytes()


def test_cli_summary_says_what_to_publish_and_what_is_private(tmp_path: Path) -> None:
    """The summary of `raydp-hpo run` names public/ as the folder to publish and the rest of
    the run dir as private (before: it listed release.json, with its machine path, and
    certificate.json at the top of the run dir)."""
    from raydp_hpo.cli.experiment import RunOutcome, format_summary

    result = _experiment(tmp_path / "storage")
    exp = Path(result.experiment_path)
    text = format_summary(RunOutcome(run_dir=exp, result=result, journal=exp / "ledger.journal",
                                     trial_errors=0))
    assert (f"Publish: {exp / 'public'} (release.json, certificate.json, released_model.pt)"
            in text)
    assert f"raydp-hpo publish {exp} OUT_DIR" in text
    assert f"Run dir: {exp} — PRIVATE except public/" in text
    assert {p.name for p in (exp / "public").iterdir()} == PUBLIC_FILES  # what it says is there


def test_find_release_reads_public_then_older_run_dirs(tmp_path: Path) -> None:
    """`run` (already released?) and `report` find the release in public/, and in the top of
    run dirs written before it."""
    result = _experiment(tmp_path / "storage")
    exp = Path(result.experiment_path)
    assert publish.find_release(exp) == exp / "public" / "release.json"
    old = tmp_path / "old"
    old.mkdir()
    assert publish.find_release(old) is None
    (old / "release.json").write_text("{}")
    assert publish.find_release(old) == old / "release.json"
