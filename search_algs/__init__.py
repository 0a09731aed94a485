"""Compatibility shim (_SHIM_): ``search_algs`` moved to :mod:`raydp_hpo.searchers`.

The design card names ``search_algs/`` as a top-level package. It now lives inside ``raydp_hpo`` so
that ``pip install raydp-hpo`` creates no generic top-level package; this shim keeps
``import search_algs`` and ``from search_algs.<module> import ...`` working in a source checkout (for
example a ``ray job submit`` working_dir). It is not installed. Each ``search_algs.<module>`` *is*
the module object of ``raydp_hpo.searchers.<module>``, so classes, isinstance checks and pickles are shared.
"""

from __future__ import annotations

import importlib
from typing import Any

_target = importlib.import_module("raydp_hpo.searchers")
__all__ = list(getattr(_target, "__all__", []))


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
