"""Atomic file writes: the one implementation every module uses.

A reader sees the old file or the new one, never a partial write: the bytes go to a temporary
file in the same folder, are fsync'd, and replace the target with ``os.replace`` (atomic on
POSIX within one file system).
"""

from __future__ import annotations

import json
import os
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


def atomic_write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write ``payload`` as indented JSON (non-JSON values via ``str``) to ``path`` atomically."""
    text = json.dumps(payload, indent=2, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
