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


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    """A throw-away PostgreSQL server for one test module (``tests/raydp_hpo/ledger/
    pg_server.py``), cleaned up after it; the module's tests are skipped where none can start.
    A module that needs another set-up defines its own ``server``."""
    from tests.raydp_hpo.ledger.pg_server import running_server

    with running_server() as srv:
        yield srv


@pytest.fixture(scope="session", autouse=True)
def _default_storage_in_a_tmp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """DPTuner and experiment files store under ~/raydp_results by default: runs of the suite
    that give no storage path go to a tmp dir instead ($RAYDP_HPO_STORAGE), not the user's
    home. Tests of the default itself unset or replace the variable."""
    if os.environ.get("RAYDP_HPO_STORAGE"):
        yield
        return
    os.environ["RAYDP_HPO_STORAGE"] = str(tmp_path_factory.mktemp("raydp_results"))
    try:
        yield
    finally:
        os.environ.pop("RAYDP_HPO_STORAGE", None)
