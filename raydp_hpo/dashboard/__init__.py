"""``raydp-hpo dashboard``: a read-only web view of privacy budgets (Ledgers, a ledger's
charges and spend over time, an experiment's certificate and release), over journal folders and
PostgreSQL databases. Needs the optional extra: ``pip install 'raydp-hpo[dashboard]'``
(Starlette, uvicorn, Jinja2, Plotly); the web libraries are imported only when it runs.

* :mod:`.data` reads ledgers (as ``ledger show`` / ``ledger verify``) and experiments
  (``public/`` only), read-only and without web dependencies;
* :mod:`.app` is the Starlette application (HTML pages and ``/api/…`` JSON);
* :mod:`.server` is the command (bind, token, uvicorn).
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are re-exports)
from __future__ import annotations

from typing import TYPE_CHECKING

from raydp_hpo._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from raydp_hpo.dashboard.app import build_app
    from raydp_hpo.dashboard.data import Catalogue

_EXPORTS: dict[str, str] = {
    "build_app": "raydp_hpo.dashboard.app",
    "Catalogue": "raydp_hpo.dashboard.data",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
