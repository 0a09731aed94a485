"""Experiment files: ``raydp-hpo run EXPERIMENT.yaml``.

An experiment file is a YAML mapping, validated in full *before* anything runs (no Ray, no
ledger, no data loaded) by :class:`raydp_hpo.cli.config.ExperimentFile` (its keys, with
comments, are in :mod:`raydp_hpo.cli.config.experiment`; ``raydp-hpo schema`` prints the JSON
Schema). The validated, frozen model is what this module runs: there is no second spec
hierarchy. An unknown or misspelled key or value is an error that names its path and
suggests the closest valid one, and every error of a file is reported at once. What needs
the data, the trainable or the searcher is checked next, by :func:`preflight`.

**One space for every searcher.** A continuous ``uniform`` / ``loguniform`` domain with
``points: N`` becomes a grid of N values from low to high (log-spaced for loguniform) where a
finite set is needed: for every key under grid and SVT search, which enumerate the space, and
for the privacy keys (noise, batch size, epochs, ...) under every searcher, which charge the
worst case over their values; elsewhere it is sampled as usual. The points are a function of
the file alone (public). Linear scaling sets ``lr``, the steps and the noise itself and
ignores those keys with a warning. A ``grid_composed`` search whose whole grid the budget
cannot pay is refused before any charge (``--dry-run`` too, exit 3).

**The budget belongs to the data.** Without a ``ledger:`` block an experiment charges the
dataset's default ledger, named from a fingerprint of the data source (the ``fingerprint()``
of :mod:`raydp_hpo.cli.config.data`'s models: the built-in dataset and its generator
settings, or the canonical Parquet URI) and journaled under ``<storage_path>/ledgers/``. A second experiment
on the same data — a re-run under a new name after a crash, say — spends from the same budget
instead of getting a fresh one. The first experiment on a dataset creates its ledger with its
``budget`` (logged); later ones attach to it, their own ``budget`` being a cap on what they
spend. A fresh budget on the same data is an explicit, logged act: name another ledger in
``ledger:``. Every ledger this command creates, the dataset's or a named one (journal file or
PostgreSQL), composes whole experiments (:mod:`raydp_hpo.ledger.experiments`: each experiment
is priced by its tightest figure at its δ share, or the RDP filter admits it); an existing
ledger keeps the rule its header states. Every run gets a fresh random run id that all its
charges carry (``<experiment>@<run id>/...``), so running a file again — its run directory
deleted, another storage path, another machine — is a new run that pays again (said on the
progress lines), never a second release of one charge. A crashed run continues with
``raydp-hpo run --resume`` (same experiment name), which first checks that the ledger it
attaches to holds the earlier charges of that very run (the run id recorded in its run
directory): a moved or replaced journal, or a ledger holding only another run of the name, is
refused, never silently a fresh budget or another run's charge.
Parquet ``val_uri`` / ``test_uri`` files are private data of the same dataset: they are
accounted on the ledger of ``uri``. Use a validation or test file with one training file only,
or name one shared ``ledger:`` for every experiment that reads it.

:func:`run_experiment` executes a validated file: connects to ``RAY_ADDRESS`` when set (a cluster, or
the cluster a ``ray job submit`` job runs on), else starts a local Ray; runs
:class:`~raydp_hpo.tune.tuner.DPTuner` with a progress monitor. The run dir
``<storage_path>/<experiment>`` is private except its ``public/`` folder, which DPTuner fills
with exactly what may be published (``release.json``, ``certificate.json``,
``released_model.pt``; :mod:`raydp_hpo.tune.publish`); ``run.json`` and the rest stay private.
A storage path or ledger journal in a temporary directory or a Ray working dir is warned
about (a deleted journal resets the budget).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_json
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo._storage import warn_if_ephemeral
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.cli.config import (
    ExperimentFile,
    load_yaml,
    run_dir_of,
    validate_experiment_file,
)
from raydp_hpo.cli.config.data import DATA_SOURCES
from raydp_hpo.cli.config.search import DOMAIN_KINDS
from raydp_hpo.cli.experiment_preflight import (
    build_param_space,
    check_resources,
    describe_sizes,
    load_data,
    preflight,
    validate_search,
)
from raydp_hpo.errors import ConfigError, SearchFailedError

__all__ = [
    "ExperimentFile",
    "RunOutcome",
    "load_experiment",
    "parse_experiment",
    "build_param_space",
    "load_data",
    "validate_search",
    "preflight",
    "describe_sizes",
    "run_experiment",
    "run_dir_of",
    "DATA_SOURCES",
    "DOMAIN_KINDS",
]


def parse_experiment(raw: Any, *, source_path: str | None = None) -> ExperimentFile:
    """Validate a parsed experiment mapping; raises one :class:`ConfigError` listing every
    error found (``problems``: (path, message) pairs), not just the first."""
    what = f"experiment file {source_path!r}" if source_path else "the experiment"
    return validate_experiment_file(raw, what)


def load_experiment(path: str | os.PathLike[str]) -> ExperimentFile:
    """Read and validate an experiment YAML file (raises :class:`ConfigError`)."""
    p = Path(path)
    raw = load_yaml(p, "experiment file", "see the schema in "
                      "raydp_hpo/cli/config/experiment.py ('raydp-hpo schema' prints it as "
                      "JSON Schema) or cluster/examples/")
    return parse_experiment(raw, source_path=str(p.resolve()))


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_experiment` produced (``result`` is the :class:`DPResult`)."""

    run_dir: Path
    result: Any
    journal: Path | str
    trial_errors: int
    test_split: bool = True  # False: no test records (test_fraction 0), nothing evaluated


def _dataset_ledger_budget(spec: ExperimentFile, out: Callable[[str], None]) -> PrivacyBudget:
    """The total budget of the ledger this experiment charges (see the module docstring)."""
    journal = spec.ledger_journal()
    if spec.ledger is not None:
        out(f"[raydp-hpo] ledger {spec.ledger.name!r} named explicitly (journal {journal}); "
            f"the dataset's default ledger is {spec.data.ledger_name()!r}")
        return spec.ledger_budget
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_budget

    return dataset_ledger_budget(Path(journal), spec.budget, spec.data.fingerprint(), out)


def bind_data_to_postgres_ledger(spec: ExperimentFile, budget: PrivacyBudget,
                                 out: Callable[[str], None] = print) -> None:
    """For a PostgreSQL ledger: create it (the settings the ledger actor uses) and bind the
    data source's fingerprint to it in the registry (:func:`raydp_hpo.ledger.pg.register_dataset`).
    Data already bound to another ledger is refused (:class:`LedgerMismatchError`) before
    anything is charged: a second budget for registered data is an administrator's act.
    Nothing to do for a journal file."""
    from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
    from raydp_hpo.ledger.pg import is_postgres_uri, register_dataset
    from raydp_hpo.tune.dataset_ledger import dataset_ledger_rule

    uri = spec.ledger_journal()
    if not isinstance(uri, str) or not is_postgres_uri(uri):
        return
    adaptivity, accountant = dataset_ledger_rule(uri)  # the rule the ledger actor then uses
    PrivacyLedger(budget, uri, adaptivity=adaptivity, accountant=accountant,
                  curve_check=CurveCheck.ON_DEMAND).close()
    register_dataset(uri, spec.data.fingerprint())
    out(f"[raydp-hpo] data {spec.data.fingerprint()} is bound to ledger {uri}")


def _require_earlier_charges(spec: ExperimentFile, run_dir: Path) -> None:
    """A resume attaches to ``spec.ledger_journal()``: refuse unless that journal holds the
    experiment's earlier charges (:func:`raydp_hpo.tune.tuner.require_earlier_charges`);
    the message also names the journal ``run.json`` recorded, when it is another."""
    import json

    from raydp_hpo.errors import LedgerMismatchError
    from raydp_hpo.tune.tuner import recorded_run_id, require_earlier_charges

    journal = spec.ledger_journal()
    try:
        # the run id its own run directory recorded: only that run's charges are its own
        require_earlier_charges(journal, spec.experiment, run_id=recorded_run_id(run_dir))
    except LedgerMismatchError as exc:
        try:
            recorded = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get(
                "ledger_journal")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded and str(recorded) != str(journal) and (
                isinstance(journal, str) or Path(recorded) != journal):
            raise LedgerMismatchError(
                f"{exc} (its run.json records that it charged the journal {recorded}: "
                "resume with the storage_path / ledger it started with)") from None
        raise


def run_experiment(spec: ExperimentFile, *, progress_interval_s: float = 5.0,
                   out: Callable[[str], None] = print, resume: bool = False,
                   num_cpus: int | None = None, ray_temp_dir: str | None = None) -> RunOutcome:
    """Run a validated spec end to end (see the module docstring). ``resume=True`` continues
    an interrupted run of the same experiment (its charges are already on the ledger).
    A local Ray started here (``num_cpus``, ``ray_temp_dir``) is shut down before returning."""
    started = False

    def start_ray() -> None:
        nonlocal started
        started = ensure_ray(num_cpus, ray_temp_dir)

    try:
        return _run_experiment(spec, progress_interval_s, out, resume, start_ray)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run_experiment(spec: ExperimentFile, progress_interval_s: float,
                    out: Callable[[str], None], resume: bool,
                    start_ray: Callable[[], None]) -> RunOutcome:
    from raydp_hpo.ledger.actor import get_ledger
    from raydp_hpo.tune.dataset_ledger import check_data_registry, dataset_ledger_rule
    from raydp_hpo.tune.ledger_rules import charge_prefix
    from raydp_hpo.tune.publish import find_release
    from raydp_hpo.tune.tuner import DPTuner, recorded_run_id

    run_dir = spec.run_dir
    if find_release(run_dir) is not None:
        raise ConfigError(
            f"experiment {spec.experiment!r} already has a release in {run_dir}; pick a new "
            "experiment name (a finished experiment is never re-run)"
        )
    started = (run_dir / "tune").exists()
    if started and not resume:
        raise ConfigError(
            f"experiment {spec.experiment!r} was started before ({run_dir}); continue it with "
            "'raydp-hpo run --resume' (what it charged stays charged), or pick a new name — a "
            "new experiment spends from the same dataset budget"
        )
    if resume and not started:
        raise ConfigError(
            f"nothing to resume: experiment {spec.experiment!r} has no run in {run_dir}; run "
            "it without --resume"
        )
    if resume:  # before Ray and the ledger actor, which would create a fresh journal
        _require_earlier_charges(spec, run_dir)
        from raydp_hpo.tune.release_claim import refuse_if_released

        # one release per run: a run (or a copy of its directory) that released runs no more
        refuse_if_released(None, spec.ledger_journal(), spec.experiment,
                           charge_prefix(spec.experiment, recorded_run_id(run_dir)))
    checked = preflight(spec)  # every check, all errors at once: before Ray and any ledger
    data = checked.data
    train_size, val_size = spec.data.public_sizes()
    ledger_budget = _dataset_ledger_budget(spec, out)
    warn_if_ephemeral(spec.storage, "storage_path", out)
    # the organisation's registry (RAYDP_HPO_REGISTRY), whatever ledger this run names
    check_data_registry([spec.data.fingerprint()], spec.ledger_journal(), out)
    bind_data_to_postgres_ledger(spec, ledger_budget, out)  # before Ray and any charge
    if isinstance(spec.ledger_journal(), Path):  # a PostgreSQL ledger is no local file
        warn_if_ephemeral(spec.ledger_journal(), "ledger journal", out)
    start_ray()
    import ray

    check_resources(spec, ray.cluster_resources(), "the Ray cluster")  # before any charge
    # every ledger this command charges receives whole experiments, so a new one composes
    # them (raydp_hpo.ledger.experiments), named or not, file or PostgreSQL; an existing one
    # keeps the rule its header states (before issue #38 a named one halted on the RDP filter)
    journal_or_uri = spec.ledger_journal()
    adaptivity, accountant = dataset_ledger_rule(
        journal_or_uri if isinstance(journal_or_uri, str) else Path(journal_or_uri))
    ledger = get_ledger(
        spec.ledger_name,
        ledger_budget,
        spec.ledger_journal(),
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        adaptivity=adaptivity,
        accountant=accountant,
    )
    tuner = DPTuner(
        None,
        param_space=build_param_space(spec),
        search=spec.search.algorithm,
        budget=spec.budget,
        metric=spec.search.metric,
        mode=spec.search.mode,
        data=data,
        resources=spec.resources.as_dict(),
        storage_path=spec.storage,
        ledger=ledger,
        experiment=spec.experiment,
        namespace=spec.ledger.namespace if spec.ledger else "raydp_hpo",
        search_kwargs=dict(spec.search.settings),
        max_concurrent_trials=spec.search.max_concurrent_trials,
        secret_seed=spec.secret_seed,
        dataset_size=train_size,
        validation_size=val_size,
        test_accuracy_epsilon=spec.test_accuracy_epsilon,
        test_size=spec.data.public_test_size() if spec.test_accuracy_epsilon else None,
        sizes_public=spec.data.sizes_accepted,
        tensorboard=spec.tensorboard,
        progress=out,
        progress_interval_s=progress_interval_s,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = spec.ledger_journal()
    # a new run's fresh id, or the one the continued run recorded (checked on the ledger above)
    run_id = recorded_run_id(run_dir) if resume else tuner.run_id
    meta = {
        "experiment": spec.experiment,
        "spec": spec.to_dict(),
        "ledger_name": spec.ledger_name,
        "ledger_journal": str(journal),  # a resume proves its charges are there
        "run_id": run_id,  # fresh per run: a re-run under this name pays again
        "charge_prefix": f"{charge_prefix(spec.experiment, run_id)}/",
        "started": time.time(),
        "status": "running",
    }
    atomic_write_json(run_dir / "run.json", meta)
    out(f"[raydp-hpo] experiment {spec.experiment}: {spec.search.algorithm}, budget "
        f"ε={spec.budget.epsilon:g} δ={spec.budget.delta:g}, run dir {run_dir}")
    try:
        result = tuner.fit(resume=resume)
    except SearchFailedError as exc:  # the certificate is written: nothing was selected
        meta.update(status="nothing_selected", reason=exc.reason, error=str(exc)[:500],
                    finished=time.time(), selected=False)
        atomic_write_json(run_dir / "run.json", meta)
        raise
    except BaseException as exc:
        meta.update(status="failed", error=repr(exc)[:500], finished=time.time())
        atomic_write_json(run_dir / "run.json", meta)
        raise
    # DPTuner wrote the release into run_dir/public/ (release.json, certificate.json, model)
    errors = sum(1 for t in result.private_trials if t.get("error"))
    meta.update(
        status="budget_exhausted" if result.budget_exhausted else "finished",
        finished=time.time(),
        selected=result.hyperparameters is not None,
    )
    atomic_write_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir=run_dir, result=result, journal=journal, trial_errors=errors,
                      test_split=len(data.test) > 0)


def format_summary(outcome: RunOutcome) -> str:
    """The final summary: the release (public, covered by the certificate), the certificate,
    and, apart, the noiseless test accuracy (an evaluation NOT covered by the certificate)."""
    r = outcome.result
    lines = ["", "=" * 72, "Released (public, covered by the certificate)"]
    if r.hyperparameters is None:
        reason = (r.extras or {}).get("reason", "no configuration was selected")
        lines.append(f"  nothing is released: {reason}")
        lines.append(f"  privacy spent all the same: ε={r.certificate.epsilon:.4f} "
                     f"(δ={r.certificate.budget.delta:g})")
    else:
        for key, value in sorted(r.hyperparameters.items()):
            lines.append(f"  {key:<18} {value}")
        if r.dp_test_accuracy is not None:
            lines.append(f"  test accuracy      {r.dp_test_accuracy:.4f}  (DP: Laplace, "
                         f"ε={r.dp_test_accuracy_epsilon:g}, in the certificate)")
    lines.append(r.certificate.format())
    if r.hyperparameters is not None and not outcome.test_split:
        lines.append("Evaluation: there is no test split (data.test_fraction: 0), so the "
                     "released model was not evaluated; set data.test_fraction (or "
                     "data.test_uri) for a test accuracy")
    elif r.hyperparameters is not None:
        acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
        lines.append("Evaluation (NOT covered by the certificate: computed without noise on the "
                     "private test split; publish it only if that split is public)")
        lines.append(f"  test accuracy      {acc}")
    lines.append(f"Publish: {outcome.run_dir / 'public'} (release.json, certificate.json"
                 + (", released_model.pt" if r.model_path is not None else "")
                 + f"), as it is, or: raydp-hpo publish {outcome.run_dir} OUT_DIR")
    lines.append(f"Run dir: {outcome.run_dir} — PRIVATE except public/ (never publish the Tune "
                 "dir tune/, the ledger journal, audit.jsonl, evaluation_private.json, run.json, "
                 "the progress lines above)")
    return "\n".join(lines)
