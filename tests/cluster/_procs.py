"""Find and stop exactly the processes of a Ray cluster this test session started."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def pids_of_cluster(*markers: str) -> list[int]:
    """PIDs whose command line contains one of ``markers`` (our unique temp dir, our GCS
    port), and their descendants — never anything else."""
    roots: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in markers):
            roots.append(int(entry.name))
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen or pid == me:
            continue
        seen.add(pid)
        stack.extend(_children(pid))
    return sorted(seen)


def stop_cluster(*markers: str, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, the processes of the cluster identified by ``markers``."""
    pids = pids_of_cluster(*markers)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and "zombie" not in _state(p)]
        if not alive:
            return
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        code = (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "zombie"
    return "zombie" if code == "Z" else "alive"
