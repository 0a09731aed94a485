"""One line per warning on the command line.

A Python warning prints as two lines, the second being the source line that raised it
(``…/cli/main.py:838: EphemeralStorageWarning: … / return int(args.func(args))``), and a fact
the CLI already printed as ``[raydp-hpo] WARNING: …`` (:func:`raydp_hpo._storage.warn_if_ephemeral`
with an ``out``) was shown twice. :func:`one_line_warnings` routes the project's warnings —
its own classes and any raised from inside :mod:`raydp_hpo` — to that one-line format while a
command runs, and drops those the CLI printed already. The warning is still *raised* (filters,
``-W error`` and library users see it as before); only its display changes. Warnings of other
libraries keep Python's format.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from raydp_hpo._storage import printed_through_out
from raydp_hpo.errors import EphemeralStorageWarning

__all__ = ["PREFIX", "one_line_warnings"]

#: How the CLI starts a warning line.
PREFIX = "[raydp-hpo] WARNING: "
#: Warning classes of the project (wherever they are raised from).
_PROJECT_CATEGORIES: tuple[type[Warning], ...] = (EphemeralStorageWarning,)
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _is_project_warning(category: type[Warning], filename: str) -> bool:
    if issubclass(category, _PROJECT_CATEGORIES):
        return True
    try:
        return Path(filename).resolve().is_relative_to(_PACKAGE_DIR)
    except (OSError, ValueError):
        return False


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """While the block runs, each project warning prints once as ``[raydp-hpo] WARNING: …`` on
    stderr (where Python prints warnings: a ``--json`` answer on stdout stays parseable) — none
    if the CLI printed the same message already; other warnings print as Python prints them.
    Filters are unchanged."""
    shown: set[str] = set()
    python_format = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not _is_project_warning(category, filename):
            python_format(message, category, filename, lineno, file, line)
            return
        text = str(message)
        if text in shown or printed_through_out(text):
            return
        shown.add(text)
        print(f"{PREFIX}{text}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
