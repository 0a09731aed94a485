"""One release per run (issue #41's known gap): a run directory copied mid-run and resumed
twice continues ONE run under ONE charge; before release markers, each copy published its own
release (two selected models for one charge), and so did a resume of a run that had released.

Here a Tune callback copies the run directory while the run is still going (at the end of
its search, before its release: what a backup job copying the folder does), the run releases,
and each copy is resumed (``DPTuner.restore``): every one is refused up front with
:class:`ReleaseAlreadyPublishedError`, writes no ``public/``, and the ledger's charges and
spend are unchanged. On the old main each copy's resume published a second release.
Dataset ledger and a named journal-file ledger here; PostgreSQL in
``test_one_release_per_run_postgres.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from ray import tune

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.errors import ReleaseAlreadyPublishedError
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


class CopyRunDir(tune.Callback):
    """Copies the run directory to each of ``targets`` when the search ends, before the
    release (a copy made mid-run)."""

    def __init__(self, run_dir: Path, targets: list[Path]) -> None:
        self.run_dir, self.targets = run_dir, targets

    def on_experiment_end(self, trials: Any, **info: Any) -> None:
        for target in self.targets:
            shutil.copytree(self.run_dir, target)


def _copies_resumed(first: Any, copies: list[Path], state: Any, restore: Any, *,
                    in_place: bool = False) -> None:
    """Each copy, then the released run itself, resumed: refused, nothing written, nothing
    charged (``state()``: the ledger's number of charges and spend). ``in_place``: each copy
    is put where the run was (its directory restored from the copy) and resumed there."""
    before = state()
    original = Path(first.experiment_path)
    released = original.with_name(original.name + ".released")
    if in_place:
        original.rename(released)
    for copy in [*copies, original]:
        exp = copy
        if in_place and copy != original:
            shutil.rmtree(original, ignore_errors=True)
            shutil.copytree(copy, original)
            exp = original
        elif in_place:
            shutil.rmtree(original)
            released.rename(original)
        with pytest.raises(ReleaseAlreadyPublishedError) as info:
            restore(exp).fit()
        msg = str(info.value)
        assert "the release of this run is already published" in msg
        assert f"publishing to {socket.gethostname()}:{original / 'public'}" in msg
        assert "Nothing was run" in msg and "spend is unchanged" in msg
        assert "Use the first release, or start a new run" in msg and "it pays again" in msg
        assert (exp / "public").exists() == (copy == original)  # no second release
        assert state() == before


@pytest.mark.slow  # ~20 s: one search, three refused resumes
def test_copied_run_dir_resumed_twice_releases_once_on_the_dataset_ledger(ray_session,
                                                                           tmp_path: Path):
    import ray

    dataset = f"release-once-{uuid.uuid4().hex[:6]}"
    journal = create_dataset_ledger(dataset, PrivacyBudget(3.0, 1e-5), tmp_path)
    copies = [tmp_path / "copy1" / "once", tmp_path / "copy2" / "once"]
    try:
        tuner = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=_data(), dataset=dataset, storage_path=tmp_path,
                        experiment="once",
                        callbacks=[CopyRunDir(tmp_path / "once", copies)])
        first = tuner.fit()
        assert first.hyperparameters is not None
        assert all((c / "dptuner.pkl").is_file() and not (c / "public").exists()
                   for c in copies)
        led = PrivacyLedger.read_only(journal)
        assert [c.charge_id for c in led.charges()] == [f"once@{tuner.run_id}/point"]
        assert [r.run for r in led.releases()] == [f"once@{tuner.run_id}"]

        def state() -> tuple[int, float]:
            again = PrivacyLedger.read_only(journal)
            return (len(again.charges()), again.spent())

        # the dataset ledger lives under the storage path: each copy is resumed where the run
        # was (the run directory restored from the copy), then the original itself
        _copies_resumed(first, copies, state, lambda exp: DPTuner.restore(exp, data=_data()),
                        in_place=True)
        assert len(PrivacyLedger.read_only(journal).releases()) == 1
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dataset_ledger_name(dataset), namespace="raydp_hpo"))


def test_copied_run_dir_resumed_releases_once_on_a_named_ledger(ray_session, tmp_path: Path):
    name = f"release-once-named-{uuid.uuid4().hex[:6]}"
    journal = tmp_path / "named.journal"
    ledger = get_ledger(name, PrivacyBudget(4.0, 1e-5), journal, adaptivity=Adaptivity.ADAPTIVE)
    copies = [tmp_path / "copy1" / "named", tmp_path / "copy2" / "named"]
    try:
        tuner = DPTuner(None, param_space=SPACE, search="one_shot_random", budget=BUDGET,
                        data=_data(), ledger=ledger, storage_path=tmp_path / "run",
                        experiment="named",
                        callbacks=[CopyRunDir(tmp_path / "run" / "named", copies)])
        first = tuner.fit()
        assert [c.charge_id for c in ledger.charges()] == [f"named@{tuner.run_id}/plan"]
        assert ledger.release_of(f"named@{tuner.run_id}") is not None
        _copies_resumed(first, copies, lambda: (len(ledger.charges()), ledger.spent()),
                        lambda exp: DPTuner.restore(exp, data=_data(), ledger=ledger))
        assert len(ledger.report().releases) == 1
    finally:
        ledger.kill()


def test_a_second_claim_after_training_publishes_nothing(ray_session, tmp_path: Path) -> None:
    """Two copies racing past the up-front check: the one whose claim comes second raises
    before anything of its release is written, and the ledger's spend is unchanged; claims
    racing on the ledger actor: exactly one wins."""
    from raydp_hpo.tune.release_claim import claim_release

    name = f"release-claim-{uuid.uuid4().hex[:6]}"
    ledger = get_ledger(name, PrivacyBudget(4.0, 1e-5), tmp_path / "l.journal")
    try:
        from raydp_hpo.accounting.mechanisms import Gaussian

        ledger.charge("exp@abc/plan", Gaussian(4.0))
        spent = ledger.spent()
        claim_release(ledger, "exp", "exp@abc", tmp_path / "a" / "public")
        with pytest.raises(ReleaseAlreadyPublishedError) as info:
            claim_release(ledger, "exp", "exp@abc", tmp_path / "b" / "public")
        msg = str(info.value)
        assert msg.startswith("experiment 'exp', run abc: the release of this run is already "
                              f"published: recorded on the ledger {name!r} (record 2) at ")
        assert f"{tmp_path / 'a' / 'public'}" in msg
        assert "nothing was written to its public/ folder" in msg
        assert info.value.run == "exp@abc" and info.value.first.seq == 2
        assert ledger.spent() == spent and len(ledger.charges()) == 1
        assert not (tmp_path / "b").exists()
        # eight claims of one run sent to the ledger actor at once: it runs one call at a
        # time, so exactly one is granted and every refusal names that one marker
        import ray

        refs = [ledger.actor.claim_release.remote("exp@def", f"h:/c{k}", "exp", f"t{k}")
                for k in range(8)]
        claims = ray.get(refs)
        assert sum(c.granted for c in claims) == 1
        assert len({c.record.seq for c in claims}) == 1
        assert ledger.spent() == spent and len(ledger.charges()) == 1
    finally:
        ledger.kill()
