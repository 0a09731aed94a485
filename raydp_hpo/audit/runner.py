"""The whole audit: one search's lower bound (:func:`audit_algorithm`), every algorithm and
mechanism with the property checks (:func:`run_audit`), and the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raydp_hpo.audit.dataset_ledger import DATASET_LEDGER, audit_dataset_ledger
from raydp_hpo.audit.dpsgd_step import DPSGD_STEP, audit_dpsgd_step
from raydp_hpo.audit.fedavg import CLIENT_DP_FEDAVG, FedStatistic, audit_client_dp_fedavg
from raydp_hpo.audit.properties import (
    PartitionCheck,
    ReleaseCheck,
    SecretCheck,
    check_fresh_secrets,
    check_one_record_one_partition,
    check_train_dp_releases,
)
from raydp_hpo.audit.scenarios import (
    AuditScenario,
    SearchOutput,
    claimed_epsilon,
    default_scenarios,
    run_search,
)
from raydp_hpo.audit.statistics import AuditResult, _audit_result, _audit_setup, format_results
from raydp_hpo.errors import InvalidParameterError


def audit_algorithm(
    scenario: AuditScenario,
    *,
    runs: int,
    selection_runs: int | None = None,
    alpha: float = 0.05,
    rng: np.random.Generator | None = None,
    claim: Mapping[str, float] | None = None,
) -> AuditResult:
    """Audit one algorithm: ``selection_runs`` runs per dataset choose the event of each
    direction, ``runs`` fresh runs per dataset give the Clopper–Pearson bound (confidence
    1 − α overall: α/2 per direction). ``claim`` (keys ``rdp``, ``pld``, ``claim``) replaces
    :func:`claimed_epsilon` of the scenario, e.g. to test a mechanism against another's claim."""
    selection_runs, rng, start = _audit_setup(runs, selection_runs, rng)
    x, x2 = scenario.datasets()
    delta = scenario.budget.delta
    claim = claimed_epsilon(scenario) if claim is None else claim

    def outputs(neighbour: int, count: int) -> list[SearchOutput]:
        data = x2 if neighbour else x
        return [run_search(scenario, data, rng) for _ in range(count)]

    return _audit_result(scenario.label, scenario.description, claim, outputs, runs=runs,
                         selection_runs=selection_runs, delta=delta, alpha=alpha, start=start,
                         mean_trials=True)


@dataclass(frozen=True)
class AuditReport:
    """Everything one audit run found: the per-algorithm bounds and the property checks."""

    results: tuple[AuditResult, ...]
    secrets: tuple[SecretCheck, ...]
    partitions: tuple[PartitionCheck, ...]
    releases: ReleaseCheck | None

    @property
    def failures(self) -> list[str]:
        out = [
            f"{r.algorithm}: ε lower bound {r.lower_bound:.3f} > claimed ε {r.claim:.3f} "
            f"({r.event}, {r.direction}, {r.counts[0]} vs {r.counts[1]} of {r.runs})"
            for r in self.results
            if not r.passed
        ]
        out += [
            f"{c.algorithm}: secrets reproducible from public inputs (equal in all {c.pairs} "
            f"pairs of searchers): {', '.join(c.reproducible) or 'none found'}"
            for c in self.secrets
            if not c.passed
        ]
        out += [
            f"{c.algorithm}: one added record changed more than one training set in "
            f"{c.violations} of {c.views} views (changed sets: "
            f"{sorted(set(c.changed_sets))}); e.g. {c.details[0] if c.details else ''}"
            for c in self.partitions
            if not c.passed
        ]
        if self.releases is not None and not self.releases.passed:
            out.append(
                f"train_dp: ran {self.releases.ran}, declared {self.releases.declared}"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures


#: Algorithms whose trials see a data view other than the full training split.
VIEW_ALGORITHMS = ("svt_threshold", "subsampled_transfer")


def run_audit(
    algorithms: Sequence[str] | None = None,
    *,
    runs: int = 2000,
    selection_runs: int | None = None,
    alpha: float = 0.05,
    properties: bool = True,
    progress: Callable[[str], None] | None = None,
) -> AuditReport:
    """The audit of ``algorithms`` (default: all, the real DP-SGD step :data:`DPSGD_STEP`,
    two experiments on one dataset ledger :data:`DATASET_LEDGER` and client-level DP FedAvg
    :data:`CLIENT_DP_FEDAVG`) on :func:`default_scenarios`: property
    checks first (cheap), then the lower bound of every algorithm, then of the DP-SGD step
    (:func:`audit_dpsgd_step`) and of FedAvg's server release, once per
    :class:`FedStatistic` (:func:`audit_client_dp_fedavg`)."""
    scenarios = default_scenarios()
    mechanisms = (DPSGD_STEP, CLIENT_DP_FEDAVG, DATASET_LEDGER)
    names = [*scenarios, *mechanisms] if algorithms is None else list(algorithms)
    unknown = [a for a in names if a not in scenarios and a not in mechanisms]
    if unknown:
        raise InvalidParameterError(
            f"unknown algorithm(s) {unknown}; use some of {sorted([*scenarios, *mechanisms])}"
        )
    step_audited, fedavg_audited = DPSGD_STEP in names, CLIENT_DP_FEDAVG in names
    ledger_audited = DATASET_LEDGER in names
    names = [a for a in names if a not in mechanisms]
    say = progress or (lambda _msg: None)
    secret_checks: list[SecretCheck] = []
    partition_checks: list[PartitionCheck] = []
    release_check: ReleaseCheck | None = None
    if properties:
        for name in names:
            secret_checks.append(check_fresh_secrets(scenarios[name]))
            if name in VIEW_ALGORITHMS:
                partition_checks.append(check_one_record_one_partition(scenarios[name]))
        release_check = check_train_dp_releases()
        say("property checks done")
    results = []
    for name in names:
        results.append(
            audit_algorithm(scenarios[name], runs=runs, selection_runs=selection_runs,
                            alpha=alpha)
        )
        say(format_results(results[-1:]).splitlines()[-1])
    if step_audited:
        results.append(audit_dpsgd_step(runs=runs, selection_runs=selection_runs, alpha=alpha))
        say(format_results(results[-1:]).splitlines()[-1])
    if ledger_audited:
        results.append(audit_dataset_ledger(runs=runs, selection_runs=selection_runs,
                                            alpha=alpha))
        say(format_results(results[-1:]).splitlines()[-1])
    if fedavg_audited:
        for statistic in FedStatistic:
            results.append(audit_client_dp_fedavg(statistic=statistic, runs=runs,
                                                  selection_runs=selection_runs, alpha=alpha))
            say(format_results(results[-1:]).splitlines()[-1])
    return AuditReport(tuple(results), tuple(secret_checks), tuple(partition_checks),
                       release_check)


def format_report(report: AuditReport) -> str:
    """Markdown: the bounds table, then one line per property check."""
    lines = [format_results(report.results), ""]
    for c in report.secrets:
        lines.append(
            f"- fresh secrets, {c.algorithm}: "
            + ("ok" if c.passed else f"FAIL (equal in all {c.pairs} pairs: "
               f"{', '.join(c.reproducible)})")
        )
    for p in report.partitions:
        lines.append(
            f"- one record, one training set, {p.algorithm}: "
            + ("ok" if p.passed else f"FAIL in {p.violations} of {p.views} views "
               f"(changed sets {sorted(set(p.changed_sets))})")
            + f" ({p.views} views checked)"
        )
    if report.releases is not None:
        lines.append(
            "- train_dp releases = declared mechanism: "
            + ("ok" if report.releases.passed else "FAIL")
            + f" ({len(report.releases.ran)} models, declared {report.releases.declared})"
        )
    return "\n".join(lines)
