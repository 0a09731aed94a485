"""Empirical privacy audit of every search algorithm, end to end, on cheap base mechanisms.

A formula test pins a bound; it cannot see a partition that changes with one record, a secret
drawn from a public seed, or a trial that runs more releases than it declares. This package runs
the *real* searcher code (``raydp_hpo.searchers.make_searcher`` without a seed, driven through
``suggest`` / ``on_trial_complete`` / ``release`` exactly as Ray Tune drives it) on two
neighbouring datasets, many times, and turns the output distributions into a statistically
valid lower bound on ε that must stay below the ε the plan claims (DESIGN.md, "Secrets and
neighbouring datasets", "Trust, but audit").

**Power and limits.** A black-box bound from N runs per dataset cannot exceed about
ln(N / ln(4/α)) (all runs in the event on one side, none on the other), and one canary with
an event on one released scalar sees only part of a plan's worst case, so the bounds sit well
below the claims (2000 runs: 0.23–2.0 against 2.65–6.6 for the searches, 0.52–0.88 against 4.21
for the DP-SGD step and 1.48–1.67 against 4.38 for FedAvg's projection, over this project's
audits; ``benchmarks/results/privacy_audit/privacy_audit.md``).
The audit therefore catches gross violations — a mechanism several times weaker than declared
(``tests/raydp_hpo/test_audit.py`` audits σ = 0.1 runs against the σ = 2 claim), a canary
that moves every partition, a secret fixed by public inputs — not a claim that is a few per
cent too small; that is what the formula tests against independent references are for.

The package, one concern a module:

* :mod:`.cheap_trial`: the neighbouring datasets X, X' = X + one canary, and the cheap trial
  that runs exactly a trial's declared mechanism in place of DP-SGD;
* :mod:`.scenarios`: one search driven as Ray Tune drives it, the audited scenarios and the ε
  each claims;
* :mod:`.statistics`: Clopper–Pearson limits, the ε lower bound and the events it is taken on;
* :mod:`.properties`: fresh secrets, one record in one partition, a real run's releases;
* :mod:`.dpsgd_step`, :mod:`.fedavg`, :mod:`.dataset_ledger`: the real DP-SGD step, FedAvg's
  server release and two experiments on one dataset ledger, each audited black-box;
* :mod:`.runner`: the whole audit and its report.
"""

# ruff: noqa: F401  (the imports below are the package's names)
from __future__ import annotations

from raydp_hpo.audit.cheap_trial import (
    CANARY,
    METRIC,
    AuditError,
    CheapTrial,
    neighbouring_datasets,
    run_cheap_trial,
)
from raydp_hpo.audit.dataset_ledger import (
    DATASET_LEDGER,
    _dataset_ledger_experiments,
    audit_dataset_ledger,
    dataset_ledger_claim,
    run_dataset_ledger,
)
from raydp_hpo.audit.dpsgd_step import DPSGD_STEP, DPSGDStepAudit, audit_dpsgd_step
from raydp_hpo.audit.fedavg import (
    CLIENT_DP_FEDAVG,
    FedAvgAudit,
    FedStatistic,
    audit_client_dp_fedavg,
)
from raydp_hpo.audit.properties import (
    PLANTED,
    PartitionCheck,
    ReleaseCheck,
    SecretCheck,
    check_fresh_secrets,
    check_one_record_one_partition,
    check_train_dp_releases,
    craft_partition_canary,
)
from raydp_hpo.audit.runner import (
    VIEW_ALGORITHMS,
    AuditReport,
    audit_algorithm,
    format_report,
    run_audit,
)
from raydp_hpo.audit.scenarios import (
    MAX_TRIALS_PER_SEARCH,
    AuditScenario,
    SearchOutput,
    claimed_epsilon,
    default_scenarios,
    run_search,
)
from raydp_hpo.audit.statistics import (
    THRESHOLD_QUANTILES,
    AuditResult,
    Event,
    EventKind,
    choose_event,
    clopper_pearson,
    epsilon_lower_bound,
    format_results,
)

__all__ = [
    "AuditError",
    "AuditScenario",
    "AuditResult",
    "CheapTrial",
    "SearchOutput",
    "Event",
    "EventKind",
    "SecretCheck",
    "PartitionCheck",
    "ReleaseCheck",
    "METRIC",
    "neighbouring_datasets",
    "run_cheap_trial",
    "run_search",
    "default_scenarios",
    "clopper_pearson",
    "epsilon_lower_bound",
    "choose_event",
    "audit_algorithm",
    "claimed_epsilon",
    "check_fresh_secrets",
    "check_one_record_one_partition",
    "check_train_dp_releases",
    "format_results",
    "format_report",
    "craft_partition_canary",
    "AuditReport",
    "run_audit",
    "DPSGD_STEP",
    "DPSGDStepAudit",
    "audit_dpsgd_step",
    "CLIENT_DP_FEDAVG",
    "FedAvgAudit",
    "FedStatistic",
    "audit_client_dp_fedavg",
]

