"""Where results and ledger journals live by default, and a warning for places that vanish.

A ledger journal is the privacy record: a budget whose journal is deleted resets, which is a
privacy breach. So the default storage is a durable folder in the user's home,
``~/raydp_results`` (like Tune's ``~/ray_results``), overridable with the environment variable
``RAYDP_HPO_STORAGE`` — never the working directory, which inside a Ray Job is Ray's temporary
copy of the job's files (``.../runtime_resources/working_dir_files/_ray_pkg_*``), deleted later.

:func:`ephemeral_reason` says why a path is likely to be deleted (under the temporary directory,
``/tmp``, ``/var/tmp``, a Ray working dir or the current Ray session dir);
:func:`warn_if_ephemeral` raises an :class:`~raydp_hpo.errors.EphemeralStorageWarning` for it
(once per path and process) and returns the message for a CLI to print;
:func:`printed_through_out` tells a CLI's warning display that a message was printed already.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from raydp_hpo.errors import EphemeralStorageWarning

__all__ = [
    "STORAGE_ENV",
    "default_storage_path",
    "ephemeral_reason",
    "warn_if_ephemeral",
    "legacy_storage_paths",
    "printed_through_out",
]

#: Environment variable that overrides the default storage folder.
STORAGE_ENV = "RAYDP_HPO_STORAGE"
#: The default storage folder's name in the home directory (and, before, in the cwd).
DEFAULT_STORAGE_NAME = "raydp_results"
#: Path parts that mark Ray's per-job copies of a working dir (deleted with the job / session).
_RAY_WORKING_DIR_MARKS = ("runtime_resources", "_ray_pkg_")

_warned: set[str] = set()
_printed: set[str] = set()  # messages an ``out`` printed (the CLI shows each fact once)


def default_storage_path() -> Path:
    """``$RAYDP_HPO_STORAGE`` when set (and not empty), else ``~/raydp_results``; resolved."""
    configured = os.environ.get(STORAGE_ENV, "").strip()
    base = Path(configured) if configured else Path.home() / DEFAULT_STORAGE_NAME
    return base.expanduser().resolve()


def legacy_storage_paths() -> list[Path]:
    """Where earlier versions (and explicit settings) put results by default: ``~/raydp_results``
    and the working directory's ``./raydp_results`` — searched by ``raydp-hpo ledger list``."""
    return [(Path.home() / DEFAULT_STORAGE_NAME).resolve(),
            (Path.cwd() / DEFAULT_STORAGE_NAME).resolve()]


def _ray_session_dir() -> Path | None:
    """The current Ray session dir, when this process has Ray initialised (never imports or
    starts Ray)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        node = ray._private.worker._global_node
        return None if node is None else Path(node.get_session_dir_path()).resolve()
    except Exception:  # an internal API that moved: no session dir known, no warning from it
        return None


def _temporary_roots() -> list[Path]:
    roots = {Path(tempfile.gettempdir()).resolve(), Path("/tmp").resolve(),
             Path("/var/tmp").resolve()}
    return sorted(roots)


def ephemeral_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is likely to be deleted (a temporary directory, a Ray working dir or
    session dir), or ``None`` when it looks durable. Looks only at the path; touches nothing."""
    resolved = Path(path).expanduser().resolve()
    marks = [m for m in _RAY_WORKING_DIR_MARKS if any(m in part for part in resolved.parts)]
    if marks:
        return (f"it is inside a Ray working dir (a path part contains {marks[0]!r}): Ray's "
                "temporary copy of a job's files, deleted with the job or session")
    session = _ray_session_dir()
    if session is not None and resolved.is_relative_to(session):
        return f"it is inside the current Ray session dir {session}, deleted with the session"
    for root in _temporary_roots():
        if resolved.is_relative_to(root):
            return f"it is under the temporary directory {root}, which the system may clear"
    return None


def warn_if_ephemeral(path: str | os.PathLike[str], what: str,
                      out: Callable[[str], None] | None = None) -> str | None:
    """Warn (:class:`EphemeralStorageWarning`, once per path in this process) when
    ``path`` is likely to be deleted; ``out`` (a CLI's print) gets a ``[raydp-hpo]`` line every
    time. Returns the message, or ``None`` when the path looks durable."""
    reason = ephemeral_reason(path)
    if reason is None:
        return None
    resolved = str(Path(path).expanduser().resolve())
    message = (
        f"{what} {resolved} may be deleted: {reason}. A deleted ledger journal resets the "
        f"privacy budget; put it on durable storage (default ~/{DEFAULT_STORAGE_NAME}, or set "
        f"${STORAGE_ENV} / storage_path)"
    )
    if out is not None:
        out(f"[raydp-hpo] WARNING: {message}")
        _printed.add(message)
    if resolved not in _warned:
        _warned.add(resolved)
        warnings.warn(message, EphemeralStorageWarning, stacklevel=3)
    return message


def printed_through_out(message: str) -> bool:
    """Whether :func:`warn_if_ephemeral` printed ``message`` through an ``out`` in this
    process (so the CLI does not show its Python warning a second time)."""
    return message in _printed
