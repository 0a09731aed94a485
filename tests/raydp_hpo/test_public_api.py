"""The public API: typed for users (mypy sees real types), and lazy at run time.

* Importing a package loads nothing it does not use: ``raydp_hpo`` neither torch, Ray Tune nor
  dp-accounting; the core, the searchers and the trainables not dp-accounting (RDP has its
  own port, :mod:`raydp_hpo.accounting._rdp_kernels`). Checked in fresh interpreters.
* The ``TYPE_CHECKING`` imports of the lazy packages name exactly their lazy exports.
* mypy accepts ``tests/typecheck/`` (public API use and both ledgers as ``LedgerLike``) and
  rejects a file that misuses them, so the check can fail.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` are in ``sys.modules`` after running ``code`` in a fresh Python."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, check=True, capture_output=True, text=True,
        timeout=120,
    ).stdout.strip()
    return [m for m in out.splitlines()[-1].split(",") if m] if out else []


HEAVY = ("torch", "ray.tune", "dp_accounting")


def test_importing_raydp_hpo_loads_no_torch_tune_or_dp_accounting() -> None:
    assert _loaded_after("import raydp_hpo; dir(raydp_hpo); raydp_hpo.PrivacyBudget", HEAVY) == []


@pytest.mark.parametrize(
    "module",
    ["raydp_hpo.accounting.accountants", "raydp_hpo.ledger.filter", "raydp_hpo.ledger.ledger_like", "raydp_hpo.searchers",
     "raydp_hpo.trainables", "raydp_hpo.trainables.privacy_gate"],
)
def test_core_searchers_and_trainables_do_not_import_dp_accounting(module: str) -> None:
    assert _loaded_after(f"import {module}", ("dp_accounting",)) == []


def test_rdp_figures_and_stopping_draws_leave_dp_accounting_unloaded() -> None:
    code = textwrap.dedent(
        """
        import numpy as np
        from raydp_hpo.accounting.accountants import Accountant, calibrate_noise, epsilon
        from raydp_hpo.accounting.mechanisms import RandomStopping, SubsampledGaussian
        from raydp_hpo.searchers.random_stopping import sample_stopping_k, stopping_pmf
        m = SubsampledGaussian(1.1, 0.01, 100)
        epsilon([m, RandomStopping(m, "truncated_negative_binomial", 5.0, 0.5)], 1e-5,
                Accountant.RDP)
        calibrate_noise(3.0, 1e-5, 0.01, 100, Accountant.RDP)
        sample_stopping_k(np.random.default_rng(0), "logarithmic", 5.0)
        stopping_pmf(3, "truncated_negative_binomial", 5.0, 0.5)
        """
    )
    assert _loaded_after(code, ("dp_accounting",)) == []
    pld = code + "\nepsilon(m, 1e-5, Accountant.PLD)\n"
    assert _loaded_after(pld, ("dp_accounting",)) == ["dp_accounting"]  # the probe can fail


def _type_checking_imports(package: str) -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` in ``package/__init__``."""
    init = importlib.import_module(package).__file__
    assert init is not None
    tree = ast.parse(Path(init).read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                for alias in imp.names:
                    found[alias.asname or alias.name] = imp.module
    return found


@pytest.mark.parametrize("package", ["raydp_hpo", "raydp_hpo.trainables", "raydp_hpo.accounting",
                                     "raydp_hpo.ledger", "raydp_hpo.trial", "raydp_hpo.tune",
                                     "raydp_hpo.cli"])
def test_type_checking_imports_are_exactly_the_lazy_exports(package: str) -> None:
    exports = importlib.import_module(package)._EXPORTS
    assert _type_checking_imports(package) == exports


def test_every_lazy_export_resolves_to_its_module() -> None:
    import raydp_hpo

    for name, module in raydp_hpo._EXPORTS.items():
        assert getattr(raydp_hpo, name) is getattr(importlib.import_module(module), name)
    assert sorted(raydp_hpo.__all__) == sorted(raydp_hpo._EXPORTS)


BAD = '''
from typing_extensions import assert_type

from raydp_hpo import LedgerLike, PrivacyBudget, SubsampledGaussian, epsilon
from raydp_hpo.accounting.mechanisms import Mechanism


class NoAdmission:
    """A ledger that cannot answer would_admit."""

    @property
    def budget(self) -> PrivacyBudget:
        return PrivacyBudget(1.0, 1e-5)

    def spent(self) -> float:
        return 0.0


def not_a_ledger() -> LedgerLike:
    return NoAdmission()  # BAD-LEDGER


assert_type(epsilon(SubsampledGaussian(1.0, 0.1, 10), 1e-5), str)  # BAD-TYPE
'''


def test_mypy_accepts_the_typecheck_files_and_rejects_misuse(tmp_path: Path) -> None:
    """One mypy run (project settings, the repository's cache): ``tests/typecheck`` clean,
    both planted errors in a bad file reported. About 15 s with a cold cache."""
    pytest.importorskip("mypy")
    bad = tmp_path / "bad_use.py"
    bad.write_text(BAD)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "tests/typecheck", str(bad)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not [e for e in errors if "bad_use.py" not in e], proc.stdout  # typecheck/ is clean
    lines = BAD.splitlines()
    flagged = {lines[int(e.split(":")[1]) - 1].split("# ")[-1] for e in errors}
    assert flagged == {"BAD-LEDGER", "BAD-TYPE"}, proc.stdout
