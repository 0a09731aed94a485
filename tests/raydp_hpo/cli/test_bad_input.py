"""The bad-input catalogue (issue #11), one test per row of
:data:`tests.raydp_hpo.cli.bad_input_catalogue.CASES`: each malformed input — experiment file,
data file, CLI flags, ``account`` arguments, ledger paths, ledger operations — gets its
documented exit code (or error class), a message with the listed words and no traceback, and
changes no journal (the seeded ledger's bytes are unchanged and no new journal appears).
``benchmarks/bad_input.py`` runs the same rows through the real CLI in subprocesses."""

from __future__ import annotations

import contextlib
import io
import traceback
from pathlib import Path

import pytest

from raydp_hpo.accounting.accountants import Accountant
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.main import main
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from tests.raydp_hpo.cli.bad_input_catalogue import (
    BUDGET,
    CASES,
    Case,
    classify,
    journals_under,
    make_data,
    prepare,
    run_api,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input-data")
    make_data(folder)
    return folder


def _run_cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception:  # noqa: BLE001 - a traceback is what the catalogue looks for
            traceback.print_exc()
            code = 1
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_a_clear_error_and_changes_nothing(case: Case, tmp_path: Path,
                                                        data_dir: Path) -> None:
    argv, journal = prepare(case, tmp_path, data_dir)
    before = journals_under(tmp_path)
    spent_before = PrivacyLedger.read_only(journal).spent()
    if case.kind == "api":
        code, output, error = run_api(case, tmp_path)
        assert error == case.error, (case.name, error, output)
    else:
        code, output = _run_cli(argv)
    outcome, why = classify(case, code, output, before, journals_under(tmp_path))
    assert outcome == "clear", f"{case.name}: {outcome} ({why}); output:\n{output[-2000:]}"
    assert PrivacyLedger.read_only(journal).spent() == spent_before


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"epsilon": -1.0, "delta": 1e-5}, ("epsilon",)),
    ({"epsilon": 1.0, "delta": 1.5}, ("delta",)),
    ({"epsilon": float("nan"), "delta": 1e-5}, ("epsilon",)),
])
def test_bad_budgets_are_refused_by_name(kwargs: dict[str, float],
                                        words: tuple[str, ...]) -> None:
    with pytest.raises(InvalidParameterError) as info:
        PrivacyBudget(**kwargs)
    assert all(w in str(info.value) for w in words)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"adaptivity": Adaptivity.ADAPTIVE, "accountant": Accountant.PLD}, ("fixed",)),
    ({"adaptivity": Adaptivity.ADAPTIVE, "accountant": Accountant.PROFILE}, ("profile", "fixed")),
])
def test_halting_rules_without_a_theorem_are_refused_up_front(tmp_path: Path, kwargs: object,
                                                              words: tuple[str, ...]) -> None:
    journal = tmp_path / "ledger.journal"
    with pytest.raises(InvalidParameterError) as info:
        PrivacyLedger(PrivacyBudget(*BUDGET), journal, **kwargs)  # type: ignore[arg-type]
    assert all(w in str(info.value) for w in words)
    assert not journal.exists()  # nothing was created
