"""Atomic file writes: the one implementation every module uses.

A reader sees the old file or the new one, never a partial write: the bytes go to a temporary
file in the same folder, are fsync'd, and replace the target with ``os.replace`` (atomic on
POSIX within one file system). :func:`replace_dir` does the same for a folder of files (a
checkpoint), built beside the target and swapped in.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(fh)`` on a temporary file beside ``path``, fsync it, then replace ``path``.

    The temporary file is removed if ``write`` raises; ``path`` is then unchanged.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda fh: fh.write(data))


def replace_dir(path: str | os.PathLike[str], build: Callable[[Path], object]) -> Path:
    """Build a folder with ``build(folder)`` beside ``path``, then swap it in for ``path``.

    ``build`` fills ``<path>.partial``; the old folder is moved to ``<path>.old`` and the new
    one renamed to ``path`` (two ``os.replace`` calls: a crash between them leaves no
    ``path`` but the complete ``<path>.old``), then the old one is removed. A ``build`` that
    raises leaves ``path`` as it was. Returns the resolved ``path``.
    """
    target = Path(path).resolve()
    partial = target.with_name(target.name + ".partial")
    old = target.with_name(target.name + ".old")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        build(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(partial, target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def atomic_write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write ``payload`` as indented JSON (non-JSON values via ``str``) to ``path`` atomically."""
    text = json.dumps(payload, indent=2, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
