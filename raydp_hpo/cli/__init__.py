"""The ``raydp-hpo`` command line (:mod:`.main`), experiment files (:mod:`.experiment`,
:mod:`.federated_experiment`), reports (:mod:`.report`) and the built-in demo (:mod:`.demo`).
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo.cli.main import main

_EXPORTS: dict[str, str] = {
    "main": "raydp_hpo.cli.main",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
