"""Fixtures for the trainables tests: tiny real data, ledgers, one Ray session."""

from __future__ import annotations

import os
import tempfile

import pytest

from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.ledger import PrivacyLedger
from trainables.data import DataSplits, load_digits, split


@pytest.fixture(scope="session")
def digits() -> DataSplits:
    return split(load_digits(), val_fraction=0.1, test_fraction=0.1, seed=0)


@pytest.fixture
def ledger() -> PrivacyLedger:
    return PrivacyLedger(PrivacyBudget(epsilon=50.0, delta=1e-5))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray runtime for the whole session; shut down only if we started it."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = False
    if not ray.is_initialized():
        tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=tmp,
        )
        started = True
    yield ray
    if started:
        ray.shutdown()
