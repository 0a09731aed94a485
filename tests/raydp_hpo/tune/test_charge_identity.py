"""One charge per release (issue #41, item 1): every run carries a fresh run id in its charge
ids, so a second ``DPTuner.fit`` under a used experiment name — its run directory deleted, or
another storage path — pays again on the dataset ledger and on a named file ledger, instead of
replaying the first run's charge and releasing a second time for free. Only a resume that
proves it continues the run (the run id its own experiment directory recorded, found on the
ledger) attaches to the earlier charges."""

from __future__ import annotations

import contextlib
import pickle
import shutil
import uuid
from pathlib import Path

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import LedgerMismatchError, ReleaseAlreadyPublishedError
from raydp_hpo.ledger.actor import get_ledger
from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
from raydp_hpo.trainables.data import dataset_ledger_name, load_digits, split
from raydp_hpo.tune.dataset_ledger import create_dataset_ledger
from raydp_hpo.tune.tuner import DPTuner

pytestmark = [pytest.mark.ray]

SPACE = {"lr": tune.loguniform(0.05, 1.0), "epochs": 1, "sample_rate": 0.1,
         "max_grad_norm": 1.0, "model": "mlp", "optimizer": "sgd"}
BUDGET = PrivacyBudget(1.0, 1e-5)


def _data():  # type: ignore[no-untyped-def]
    return split(load_digits(), 0.2, 0.2, seed=0)


def _set_run_id(exp_dir: Path, run_id: str) -> None:
    path = exp_dir / "dptuner.pkl"
    saved = pickle.loads(path.read_bytes())
    saved["run_id"] = run_id
    path.write_bytes(pickle.dumps(saved))


def test_run_ids_are_fresh_and_name_one_run() -> None:
    from raydp_hpo.tune.ledger_rules import charge_prefix, other_runs, require_earlier_charges

    a = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_data(), experiment="same")
    b = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                data=_data(), experiment="same")
    assert a.run_id and b.run_id and a.run_id != b.run_id and len(a.run_id) == 16
    assert charge_prefix("same", a.run_id) == f"same@{a.run_id}"
    assert charge_prefix("same", None) == "same"  # a run from before run ids

    class C:
        def __init__(self, charge_id: str) -> None:
            self.charge_id = charge_id

    charges = [C("same@aa/plan"), C("same@bb/point"), C("same/plan"), C("samex@cc/plan"),
               C("same@aa/t1")]
    assert other_runs(charges, "same", "aa") == ["same@bb", "same"]
    require_earlier_charges(None, "same", charges, where="l", run_id="aa")
    with pytest.raises(LedgerMismatchError, match=r"run cc.*other runs of this name: "
                       r"same@aa, same@bb, same.*resume it with the ledger.*run the "
                       r"experiment again as a new run, which pays again"):
        require_earlier_charges(None, "same", charges, where="l", run_id="cc")


def test_fit_twice_under_one_name_pays_twice_on_the_dataset_ledger(ray_session, tmp_path):
    """The run directory deleted and the same experiment run again: two points on the
    dataset ledger, each carrying its run's id (on the old main: one point, two releases).
    A restore of the second run attaches to its own point (no third charge); a restore whose
    recorded run id is on no point of the ledger is refused, and charges nothing."""
    import ray

    dataset = f"identity-{uuid.uuid4().hex[:6]}"
    journal = create_dataset_ledger(dataset, PrivacyBudget(3.0, 1e-5), tmp_path)
    lines: list[str] = []

    def tuner() -> DPTuner:
        return DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                       data=_data(), dataset=dataset, storage_path=tmp_path,
                       experiment="again", progress=lines.append)

    try:
        first_tuner = tuner()
        first = first_tuner.fit()
        spent_once = PrivacyLedger.read_only(journal).report().spent_epsilon
        shutil.rmtree(first.experiment_path)  # the run directory is gone
        second_tuner = tuner()
        second = second_tuner.fit()
        report = PrivacyLedger.read_only(journal).report()
        ids = [c.charge_id for c in report.charges]
        assert len(ids) == 2, f"two releases, {len(ids)} charge(s): {ids}"
        assert ids == [f"again@{first_tuner.run_id}/point", f"again@{second_tuner.run_id}/point"]
        assert report.adaptivity is Adaptivity.EXPERIMENTS
        # each release is covered by a charge of its own, and the ledger counts both
        assert first.certificate.charges[0][0].startswith(f"again@{first_tuner.run_id}/")
        assert second.certificate.charges[0][0].startswith(f"again@{second_tuner.run_id}/")
        assert report.spent_epsilon > spent_once + 0.5  # the second run paid
        assert any("already run on the ledger" in line and "pays again" in line
                   for line in lines)
        exp = Path(second.experiment_path)
        from raydp_hpo.tune.tuner import recorded_run_id

        assert recorded_run_id(exp) == second_tuner.run_id

        # a resume of its run proves the run, but the run has released: refused before it
        # runs anything (one release per run), nothing charged
        with pytest.raises(ReleaseAlreadyPublishedError, match="already published"):
            DPTuner.restore(exp, data=_data()).fit()
        assert len(PrivacyLedger.read_only(journal).charges()) == 2

        # a run id on no point of the ledger: refused with both choices, nothing charged
        _set_run_id(exp, "0" * 16)
        with pytest.raises(LedgerMismatchError, match=r"holds no point 'again@0{16}/point'.*"
                           r"resume it with the ledger it started on.*run the experiment "
                           r"again as a new run, which pays again"):
            DPTuner.restore(exp, data=_data()).fit()
        assert len(PrivacyLedger.read_only(journal).charges()) == 2
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dataset_ledger_name(dataset), namespace="raydp_hpo"))


def test_fit_twice_under_one_name_pays_twice_on_a_named_ledger(ray_session, tmp_path):
    """Another storage path, the same named ledger (a journal file) and experiment name: two
    plan charges (on the old main the second plan was a replay of the first: two releases
    on one charge). A resume with another run's id is refused."""
    name = f"identity-named-{uuid.uuid4().hex[:6]}"
    ledger = get_ledger(name, PrivacyBudget(4.0, 1e-5), tmp_path / "named.journal",
                        adaptivity=Adaptivity.ADAPTIVE)
    try:
        runs = []
        for storage in ("a", "b"):
            t = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=_data(), ledger=ledger, storage_path=tmp_path / storage,
                        experiment="same-name")
            runs.append((t, t.fit()))
        ids = [c.charge_id for c in ledger.charges()]
        assert len(ids) == 2, f"two releases, {len(ids)} charge(s): {ids}"
        assert ids == [f"same-name@{t.run_id}/plan" for t, _ in runs]
        spent = ledger.spent()
        assert spent > max(r.certificate.epsilon for _, r in runs) * 1.2  # both are counted
        for t, r in runs:
            assert [c for c, _ in r.certificate.charges] == [f"same-name@{t.run_id}/plan"]

        # a's run directory claims b's run: found on the ledger, but not a's own → the
        # certificate would be b's; a run id on no charge of the ledger is refused
        exp_a = tmp_path / "a" / "same-name"
        _set_run_id(exp_a, "f" * 16)
        with pytest.raises(LedgerMismatchError, match=r"run ffffffffffffffff.*holds no charge "
                           r"of this run.*other runs of this name"):
            DPTuner.restore(exp_a, data=_data(), ledger=ledger).fit()
        assert ledger.spent() == spent and len(ledger.charges()) == 2
    finally:
        ledger.kill()
