"""One release per run on a PostgreSQL ledger (issue #41's known gap): a run directory copied
mid-run and resumed twice is refused each time (:class:`ReleaseAlreadyPublishedError`),
publishes nothing, and charges nothing — on the old main each resumed copy published a second
release on the run's one charge. Against a REAL throw-away server (``make test-postgres``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.ledger.actor import get_ledger
from raydp_hpo.ledger.filter import PrivacyLedger
from raydp_hpo.tune.tuner import DPTuner
from tests.raydp_hpo.ledger.pg_server import WRITER, PgServer
from tests.raydp_hpo.tune.test_one_release_per_run import (
    BUDGET,
    SPACE,
    CopyRunDir,
    _copies_resumed,
    _data,
)

pytestmark = [pytest.mark.postgres, pytest.mark.ray, pytest.mark.slow]  # one small search


def test_copied_run_dir_resumed_twice_releases_once_on_postgres(
    ray_session: None, server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGUSER", WRITER)
    tag = uuid.uuid4().hex[:6]
    uri = server.uri(f"release-once-{tag}")
    ledger = get_ledger(f"pg-release-once-{tag}", PrivacyBudget(4.0, 1e-5),
                        uri.replace("127.0.0.1", f"{WRITER}@127.0.0.1", 1),
                        namespace="tests-pg")
    copies = [tmp_path / "copy1" / "pg", tmp_path / "copy2" / "pg"]
    try:
        tuner = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=_data(), ledger=ledger, storage_path=tmp_path / "run",
                        experiment="pg", callbacks=[CopyRunDir(tmp_path / "run" / "pg", copies)])
        first = tuner.fit()

        def state() -> tuple[int, float]:
            replay = PrivacyLedger.read_only(uri)
            return len(replay.charges()), replay.spent()

        assert state()[0] == 1
        _copies_resumed(first, copies, state,
                        lambda exp: DPTuner.restore(exp, data=_data(), ledger=ledger))
        assert [r.run for r in PrivacyLedger.read_only(uri).releases()] == [
            f"pg@{tuner.run_id}"]
    finally:
        ledger.kill()
