"""Fixtures for the trainables tests: tiny real data, ledgers, one Ray session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.trainables.data import DataSplits, load_digits, split


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread is far faster on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def digits() -> DataSplits:
    return split(load_digits(), val_fraction=0.1, test_fraction=0.1, seed=0)


@pytest.fixture
def ledger() -> PrivacyLedger:
    return PrivacyLedger(PrivacyBudget(epsilon=50.0, delta=1e-5))

# ray_session: the shared fixture in tests/conftest.py
