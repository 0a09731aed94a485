"""The ``raydp-hpo`` command line (:mod:`.main`), experiment files (:mod:`.experiment`,
:mod:`.federated_experiment`), reports (:mod:`.report`) and the built-in demo (:mod:`.demo`).
"""

from __future__ import annotations

from raydp_hpo._lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "main": "raydp_hpo.cli.main",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
