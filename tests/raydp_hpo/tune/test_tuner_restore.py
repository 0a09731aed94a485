"""Interrupt + resume: a killed search neither loses nor repeats charges (slow, real Ray)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.tune._interrupted_run import make_data

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]


def _completed(audit: Path) -> int:
    if not audit.exists():
        return 0
    return sum(json.loads(line)["event"] == "complete" for line in audit.read_text().splitlines())


def _wait_until_released(journal: Path, timeout_s: float = 60.0) -> None:
    """Until no live ledger holds ``journal`` (its exclusive lock), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            PrivacyLedger.open(journal).close()
            return
        except RayDPHPOError as exc:
            if "already open" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)

def test_interrupted_search_resumes_without_lost_or_repeated_charges(ray_session, tmp_path):
    experiment = "interrupted"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.raydp_hpo.tune._interrupted_run", str(tmp_path), experiment],
        cwd=REPO, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    audit = tmp_path / experiment / "audit.jsonl"
    try:
        # the driver SIGKILLs itself and its whole Ray as the second trial starts
        # (_interrupted_run.KillWhenTheSecondTrialStarts): the first trial has completed
        assert proc.wait(timeout=240) == -signal.SIGKILL, "the run was not interrupted"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its Ray is left
        proc.wait()
    assert _completed(audit) == 1

    journal = tmp_path / experiment / "ledger.journal"
    records = [json.loads(x) for x in journal.read_text().splitlines()[1:]]
    assert all(r["kind"] == "charge" for r in records), "the run released before the kill"
    before = [r["charge_id"] for r in records]
    assert before, "the first trial's charge must be journaled before it trained"
    assert not (tmp_path / experiment / "public").exists()

    # the killed run's ledger actor is a Ray worker that notices its raylet's death by polling:
    # on a loaded machine it may hold the journal's lock a little longer (a user resuming
    # seconds after a crash would be told the journal is still open, and retry)
    _wait_until_released(journal)

    # the run is continued like a Tune run: from its experiment directory, settings read back
    assert DPTuner.can_restore(tmp_path / experiment)
    result = DPTuner.restore(tmp_path / experiment, data=make_data()).fit()

    ledger = PrivacyLedger.read_only(journal)  # the actor is gone with fit(); the journal stays
    try:
        ids = [c.charge_id for c in ledger.charges()]
        assert ids[: len(before)] == before  # nothing lost, order kept
        assert len(ids) == len(set(ids))  # nothing charged twice under one id
        trial_ids = {i.rsplit("/attempt-", 1)[0] for i in ids}
        # 4 grid points: every trial charged; one retried from scratch may have paid twice
        assert len(trial_ids) == 4 and len(ids) <= 5
        assert result.certificate.within_budget
        assert result.hyperparameters is not None
    finally:
        ledger.close()
