"""The README's Python examples run as written, and the figures in their comments hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _block_with(marker: str) -> str:
    found = [b for b in _python_blocks() if marker in b]
    assert len(found) == 1, f"expected one README python block containing {marker!r}"
    return found[0]


def test_the_accounting_and_ledger_example_runs_and_its_figures_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = _block_with("PrivacyLedger(")
    local, _, cluster = block.partition("# Across a Ray cluster")
    assert "get_ledger(" in cluster  # the cluster part needs a cluster and an NFS path
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(local, "README.md", "exec"), scope)  # noqa: S102 - the README's own code

    from raydp_hpo import Accountant, calibrate_analytic_gaussian, epsilon

    assert round(epsilon(scope["trial"], delta=1e-5, accountant=Accountant.RDP), 3) == 2.597
    assert abs(calibrate_analytic_gaussian(1.0, 1e-5) - 3.7306) < 5e-5
    assert abs(scope["search_sigma"] - 0.973) < 1e-3  # type: ignore[operator]
    search = scope["RandomStopping"](  # type: ignore[operator]
        scope["SubsampledGaussian"](scope["search_sigma"], 0.01, 1000),  # type: ignore[operator]
        scope["StoppingDistribution"].GEOMETRIC, mean=10)  # type: ignore[attr-defined]
    assert epsilon(search, 1e-5) <= 3.0
    assert (tmp_path / "ledger.journal").exists()
    assert scope["ledger"].report().spent_epsilon > 0  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.ray
def test_the_dptuner_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            ray_session: object) -> None:
    block = _block_with("None,  # the built-in DP-SGD trainable")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # the example stores its run under ~
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102
    result = scope["result"]
    assert result.certificate.epsilon <= 8.0  # type: ignore[attr-defined]


def test_your_own_training_loop_section_matches_the_example_and_its_count() -> None:
    """The README's custom-trainable block is the trainable of examples/own_mlp_parquet.py
    (run with --smoke by tests/test_examples.py), and it adds at most 8 lines."""
    block = _block_with("trial_session(")
    added = [line for line in block.splitlines() if line.rstrip().endswith("# +")]
    changed = [line for line in block.splitlines() if line.rstrip().endswith("# ~")]
    assert len(added) == 7 and len(changed) == 1 and len(added) + len(changed) <= 8

    def code(line: str) -> str:
        return re.sub(r"\s+#\s*(\+|~|raydp.*)$", "", line).strip()

    example = (README.parent / "examples" / "own_mlp_parquet.py").read_text(encoding="utf-8")
    example_lines = {code(line) for line in example.splitlines()}
    trainable = block.split("tuner = ")[0]
    for line in trainable.splitlines():
        if line.strip():
            assert code(line) in example_lines, line
