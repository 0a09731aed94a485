"""Griffe extension: the docstrings' Sphinx roles as code in the API reference.

The docstrings name other objects the Sphinx way (``:class:`~raydp_hpo.errors.ConfigError```,
``:meth:`fit```), which Markdown would print as ``:class:~raydp_hpo...``. This shows each as
inline code of the name it displays in Sphinx (``ConfigError``, ``fit``), and turns the
reStructuredText literal-block marker ``::`` at the end of a paragraph into ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|obj|exc|const|ref):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class RstRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_as_code, obj.docstring.value)
