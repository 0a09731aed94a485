"""Connecting to Ray: the one ``ensure_ray`` used by the tuner, the CLI and experiments."""

from __future__ import annotations

import os
from pathlib import Path


def ensure_ray(num_cpus: int | None = None, temp_dir: str | None = None) -> bool:
    """Connect to ``RAY_ADDRESS`` when set, else start a local Ray (``num_cpus`` CPUs, default
    every core; ``temp_dir`` default Ray's /tmp/ray). Returns True if this call started Ray
    (the caller then shuts it down, so nothing is left behind); False if Ray was already
    initialised or an existing cluster was joined."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             _temp_dir=None if temp_dir is None else str(Path(temp_dir).expanduser().resolve()))
    return True
