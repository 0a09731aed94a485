"""Compatibility shim (_SHIM_): ``trainables`` moved to :mod:`raydp_hpo.trainables`.

The design card names ``trainables/`` as a top-level package. It now lives inside ``raydp_hpo`` so
that ``pip install raydp-hpo`` creates no generic top-level package; this shim keeps
``import trainables`` and ``from trainables.<module> import ...`` working in a source checkout (for
example a ``ray job submit`` working_dir). It is not installed. Each ``trainables.<module>`` *is*
the module object of ``raydp_hpo.trainables.<module>``, so classes, isinstance checks and pickles are shared.
"""

from __future__ import annotations

import importlib
from typing import Any

_target = importlib.import_module("raydp_hpo.trainables")
__all__ = list(getattr(_target, "__all__", []))


def __getattr__(name: str) -> Any:
    return getattr(_target, name)
