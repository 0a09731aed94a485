"""Shared fixtures: one local Ray runtime per test session, started only if a test needs it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray runtime (2 CPUs) with its own temp dir; shut down only if we started it."""
    import ray

    if ray.is_initialized():
        yield
        return
    tmp = tempfile.mkdtemp(prefix="rdh", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tmp,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}},
    )
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
