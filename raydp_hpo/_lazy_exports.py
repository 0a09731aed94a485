"""PEP 562 lazy re-exports for package ``__init__`` modules.

A package lists ``{public name: defining module}``; a name's module is imported on first use,
so importing the package (or one light submodule of it) never loads what it does not use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package re-exporting ``exports`` lazily.

    ``namespace`` is the package's ``globals()``: a resolved name is cached there, so later
    lookups do not come back here.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
