"""The package layout: sub-packages are the architecture, the old top-level names are shims."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11; the other checks run everywhere

ROOT = Path(__file__).resolve().parents[1]
SHIMS = {
    "search_algs": ("raydp_hpo.searchers", ["base", "baselines", "linear_scaling",
                                            "random_stopping", "subsampled_transfer",
                                            "svt_threshold"]),
    "trainables": ("raydp_hpo.trainables", ["data", "dp_step", "federated", "models",
                                            "privacy_gate", "training", "tune_trainable"]),
}


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_a_shim_module_is_the_moved_module_itself(old: str) -> None:
    new, modules = SHIMS[old]
    for name in modules:
        assert importlib.import_module(f"{old}.{name}") is importlib.import_module(f"{new}.{name}")
    package = importlib.import_module(old)
    moved = importlib.import_module(new)
    for name in getattr(moved, "__all__", []):
        assert getattr(package, name) is getattr(moved, name)


def test_every_moved_module_has_a_shim_and_nothing_else_is_in_the_shim_folders() -> None:
    for old, (new, modules) in SHIMS.items():
        folder = ROOT / new.replace(".", "/")
        moved = sorted([p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
                       + [p.parent.name for p in folder.glob("*/__init__.py")])  # dp_step/
        # modules added after the move (release, secret_rng) never had an old name
        assert set(modules) <= set(moved), f"{old} shims a module {new} does not have"
        shims = sorted(p.stem for p in (ROOT / old).glob("*.py") if p.stem != "__init__")
        assert shims == sorted(modules)
        for path in (ROOT / old).glob("*.py"):
            assert "_SHIM_" in path.read_text(), f"{path} is not a shim"


def test_pip_install_creates_no_generic_top_level_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == ["raydp_hpo*"]
    assert not (ROOT / "cluster" / "__init__.py").exists()
