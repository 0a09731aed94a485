"""The audit of the client-level DP server step of federated averaging.

**Client-level DP FedAvg** (:func:`audit_client_dp_fedavg`): the server release of one round,
on federations with and without one canary client, against ε(Gaussian(σ)); once on the
released model's component along the canary's update, once on its squared norm (which sees a
release whose scale depends on who is present).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from raydp_hpo.audit.scenarios import SearchOutput, _claims
from raydp_hpo.audit.statistics import AuditResult, _audit_result, _audit_setup

#: Name of the audit of client-level DP FedAvg's server release in reports and ``run_audit``.
CLIENT_DP_FEDAVG = "client_dp_fedavg"


class FedStatistic(Enum):
    """The scalar of the released model that :func:`audit_client_dp_fedavg` audits."""

    #: (release · u)·K/C, u the canary's direction: N(0, σ²) on X, N(1, σ²) on X' — the
    #: worst-case pair of the Gaussian mechanism (it tests the clip and the noise scale)
    PROJECTION = "projection"
    #: ‖release‖²·K²/(σ²C²d), ≈ χ²_d/d on both sides when the mechanism is right (the canary
    #: adds 1/(σ²d) to the mean); it tests that the scale of the release does not depend on
    #: who is present (a divisor that counts the clients moves it far from 1)
    SPREAD = "spread"


@dataclass(frozen=True)
class FedAvgAudit:
    """Settings of :func:`audit_client_dp_fedavg` (all public)."""

    #: clients in X, all with update 0; the declared ``ClientDP.num_clients``
    clients: int = 3
    #: coordinates of the model (one float tensor)
    dims: int = 1000
    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    #: the canary client's update norm, far above the clip norm
    canary_norm: float = 10.0


def audit_client_dp_fedavg(
    settings: FedAvgAudit = FedAvgAudit(),
    statistic: FedStatistic = FedStatistic.PROJECTION,
    *,
    runs: int = 2000,
    selection_runs: int | None = None,
    alpha: float = 0.05,
    rng: np.random.Generator | None = None,
    claim: Mapping[str, float] | None = None,
) -> AuditResult:
    """Black-box audit of one round of client-level DP FedAvg's server release,
    :func:`raydp_hpo.trainables.federated.dp_fed_avg` (McMahan et al. 2018), on neighbouring
    federations: X = ``clients`` clients whose updates are 0, X' = X plus one canary client
    whose update has norm ``canary_norm`` along u = (1, …, 1)/√d. The claim is
    ε(Gaussian(σ, 1)) at δ = 1e-5, the figure the client-level ledger is charged per round;
    the lower bound and its events are as in :func:`audit_algorithm`, on the scalar of
    :class:`FedStatistic` (each statistic is its own audit at confidence 1 − α).

    Power, measured: dividing by the number of clients present instead of the declared K
    (the fault fixed in this project) fails the SPREAD audit; noise at a tenth of its scale
    fails the PROJECTION audit (``tests/raydp_hpo/test_audit.py``). Secrets (the noise
    generator) are fresh per run.
    """
    import torch

    from raydp_hpo.trainables import federated

    selection_runs, rng, start = _audit_setup(runs, selection_runs, rng)
    k, d, c, sigma = settings.clients, settings.dims, settings.clip_norm, settings.noise_multiplier
    dp = federated.ClientDP(c, sigma, num_clients=k)
    mechanism = dp.mechanism(1)
    delta = 1e-5
    claim = _claims(mechanism, delta) if claim is None else claim
    u = torch.full((d,), 1.0 / math.sqrt(d), dtype=torch.float64)
    zero = {"w": torch.zeros(d, dtype=torch.float64)}
    federations = ([zero] * k, [zero] * k + [{"w": settings.canary_norm * u}])  # X, X'

    def run(states: list[dict[str, torch.Tensor]]) -> SearchOutput:
        gen = torch.Generator().manual_seed(int(rng.integers(2**63)))
        release = federated.dp_fed_avg(zero, states, dp, gen)["w"]
        if statistic is FedStatistic.PROJECTION:
            value = float(release @ u) * k / c
        else:
            value = float(release @ release) * (k / (sigma * c)) ** 2 / d
        return SearchOutput(None, value, 1)

    def outputs(neighbour: int, count: int) -> list[SearchOutput]:
        return [run(federations[neighbour]) for _ in range(count)]

    description = (f"{statistic.value}, K={k} declared, d={d}, C={c:g}, σ={sigma:g}, "
                   "one round")
    return _audit_result(CLIENT_DP_FEDAVG, description, claim, outputs, runs=runs,
                         selection_runs=selection_runs, delta=delta, alpha=alpha, start=start)
