"""The statistics of the audit: Clopper–Pearson limits, the ε lower bound, the events it is
computed on, and one audit's result from the outputs on neighbouring datasets.

**Lower bound** (:func:`epsilon_lower_bound`): for an output event E and a direction (X, X'),
an (ε, δ)-DP algorithm satisfies P[E | X'] ≤ e^ε P[E | X] + δ, so
ε ≥ ln((P[E | X'] − δ) / P[E | X]). Replacing P[E | X'] by its Clopper–Pearson lower and
P[E | X] by its upper confidence limit, each at level α/4, and taking both directions (X vs X'
and X' vs X), the larger of the two bounds is a valid lower bound with probability ≥ 1 − α
(union bound over the four limits). The event — a released hyperparameter value, nothing
released, or a threshold on the released model — is chosen on a separate set of runs
(:func:`choose_event`), so the bound on the fresh runs stays valid. This is the standard
black-box audit (Jagielski, Ullman & Oprea 2020, "Auditing Differentially Private Machine
Learning: How Private is Private SGD?", Sec. 3; Clopper & Pearson 1934).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
from scipy.stats import beta

from raydp_hpo.audit.scenarios import SearchOutput, _fresh_rng
from raydp_hpo.errors import InvalidParameterError


def _audit_setup(
    runs: int, selection_runs: int | None, rng: np.random.Generator | None
) -> tuple[int, np.random.Generator, float]:
    """Checked ``runs``: (selection runs, default runs/2; the generator, default fresh OS
    entropy; the start time)."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise InvalidParameterError(f"runs must be an integer >= 1, got {runs=!r}")
    selection = runs // 2 if selection_runs is None else selection_runs
    return selection, _fresh_rng() if rng is None else rng, time.perf_counter()


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson limits at level α each: P[p < lower] ≤ α and
    P[p > upper] ≤ α for k successes in n Bernoulli(p) trials (Clopper & Pearson 1934)."""
    if not (0 <= k <= n and n >= 1):
        raise InvalidParameterError(f"need 0 <= k <= n, n >= 1; got {k=}, {n=}")
    if not 0 < alpha < 1:
        raise InvalidParameterError(f"alpha must be in (0, 1), got {alpha=}")
    lower = 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))
    return lower, upper


def epsilon_lower_bound(
    k1: int, n1: int, k0: int, n0: int, *, delta: float, alpha: float
) -> float:
    """ln((p₁_lower − δ) / p₀_upper), each limit at level α/2 (so the bound holds with
    probability ≥ 1 − α); 0 when the event gives no evidence."""
    p1, _ = clopper_pearson(k1, n1, alpha / 2)
    _, p0 = clopper_pearson(k0, n0, alpha / 2)
    if p1 - delta <= p0:
        return 0.0
    return math.log((p1 - delta) / p0)


class EventKind(Enum):
    """Output events the audit tests."""

    HYPERPARAMETERS = "released hyperparameters equal"
    NOTHING = "nothing released"
    MODEL_AT_LEAST = "released model >="
    MODEL_AT_MOST = "released model <="


@dataclass(frozen=True)
class Event:
    kind: EventKind
    value: Any = None

    def __call__(self, out: SearchOutput) -> bool:
        if self.kind is EventKind.NOTHING:
            return out.hyperparameters is None
        if self.kind is EventKind.HYPERPARAMETERS:
            return out.hyperparameters == self.value
        if math.isnan(out.model):
            return False
        if self.kind is EventKind.MODEL_AT_LEAST:
            return out.model >= self.value
        return out.model <= self.value

    def __str__(self) -> str:
        if self.kind is EventKind.NOTHING:
            return self.kind.value
        if self.kind is EventKind.HYPERPARAMETERS:
            return f"{self.kind.value} {dict(self.value)}"
        return f"{self.kind.value} {self.value:.3g}"


def _count(event: Event, outs: Sequence[SearchOutput]) -> int:
    return sum(1 for o in outs if event(o))


#: Number of quantiles of the released model tried as thresholds when choosing an event.
THRESHOLD_QUANTILES = 401


def _event_counts(
    first: Sequence[SearchOutput], second: Sequence[SearchOutput]
) -> list[tuple[Event, int, int]]:
    """Every candidate event with its counts on ``first`` and ``second``: nothing released,
    each released hyperparameter value (when there are at most 20), and ``model ≥ t`` /
    ``model ≤ t`` for t on :data:`THRESHOLD_QUANTILES` quantiles of the released models."""
    both = [*first, *second]
    out = [(e, _count(e, first), _count(e, second)) for e in [Event(EventKind.NOTHING)]]
    hypers = {o.hyperparameters for o in both if o.hyperparameters is not None}
    if len(hypers) <= 20:  # a finite set of released values (continuous ones: models only)
        for h in sorted(hypers, key=repr):
            e = Event(EventKind.HYPERPARAMETERS, h)
            out.append((e, _count(e, first), _count(e, second)))
    pooled = np.array([o.model for o in both if not math.isnan(o.model)])
    if len(pooled):
        sorted_models = [
            np.sort(np.array([o.model for o in outs if not math.isnan(o.model)]))
            for outs in (first, second)
        ]
        for t in np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, THRESHOLD_QUANTILES))):
            t = float(t)
            at_least = [len(m) - int(np.searchsorted(m, t, "left")) for m in sorted_models]
            at_most = [int(np.searchsorted(m, t, "right")) for m in sorted_models]
            out.append((Event(EventKind.MODEL_AT_LEAST, t), at_least[0], at_least[1]))
            out.append((Event(EventKind.MODEL_AT_MOST, t), at_most[0], at_most[1]))
    return out


def choose_event(
    first: Sequence[SearchOutput], second: Sequence[SearchOutput], *, delta: float, alpha: float
) -> tuple[Event, float]:
    """The event E maximising the lower bound of ε for P[E | second] vs P[E | first] on these
    (selection) runs; returns (E, its bound here). Only fresh runs make the bound valid."""
    best, best_lb = Event(EventKind.NOTHING), -1.0
    for e, k_first, k_second in _event_counts(first, second):
        lb = epsilon_lower_bound(
            k_second, len(second), k_first, len(first), delta=delta, alpha=alpha
        )
        if lb > best_lb:
            best, best_lb = e, lb
    return best, best_lb


@dataclass(frozen=True)
class AuditResult:
    """One algorithm's audit: the claim, the lower bound (with its event) and the cost."""

    algorithm: str
    description: str
    claim: float
    claim_rdp: float
    claim_pld: float
    lower_bound: float
    direction: str
    event: str
    counts: tuple[int, int]  # (event count on the numerator dataset, on the other)
    runs: int  # fresh runs per dataset
    selection_runs: int  # runs per dataset used to choose the events
    alpha: float
    seconds: float
    extras: dict[str, Any] = field(default_factory=dict)
    claim_profile: float = math.nan

    @property
    def passed(self) -> bool:
        return self.lower_bound <= self.claim


def _audit_result(
    algorithm: str,
    description: str,
    claim: Mapping[str, float],
    outputs: Callable[[int, int], list[SearchOutput]],
    *,
    runs: int,
    selection_runs: int,
    delta: float,
    alpha: float,
    start: float,
    mean_trials: bool = False,
) -> AuditResult:
    """The audit from ``outputs(neighbour, count)`` (count fresh outputs on X for neighbour
    0, on X' for 1): ``selection_runs`` per dataset choose the event of each direction,
    ``runs`` fresh ones per dataset give the Clopper–Pearson bound at α/2 per direction, and
    the larger of the two bounds is reported against ``claim`` (keys claim, rdp, pld,
    profile). ``start``: ``time.perf_counter()`` when the audit began."""
    sel_x, sel_x2 = outputs(0, selection_runs), outputs(1, selection_runs)
    ev_fwd, _ = choose_event(sel_x, sel_x2, delta=delta, alpha=alpha / 2)  # X' vs X
    ev_bwd, _ = choose_event(sel_x2, sel_x, delta=delta, alpha=alpha / 2)  # X vs X'
    out_x, out_x2 = outputs(0, runs), outputs(1, runs)
    fwd = (_count(ev_fwd, out_x2), _count(ev_fwd, out_x))
    bwd = (_count(ev_bwd, out_x), _count(ev_bwd, out_x2))
    lb_fwd = epsilon_lower_bound(fwd[0], runs, fwd[1], runs, delta=delta, alpha=alpha / 2)
    lb_bwd = epsilon_lower_bound(bwd[0], runs, bwd[1], runs, delta=delta, alpha=alpha / 2)
    if lb_fwd >= lb_bwd:
        lb, direction, event, counts = lb_fwd, "X' vs X", ev_fwd, fwd
    else:
        lb, direction, event, counts = lb_bwd, "X vs X'", ev_bwd, bwd
    extras = ({"mean_trials": float(np.mean([o.trials for o in out_x + out_x2]))}
              if mean_trials else {})
    return AuditResult(
        algorithm=algorithm,
        description=description,
        claim=claim["claim"],
        claim_rdp=claim["rdp"],
        claim_pld=claim["pld"],
        claim_profile=claim["profile"],
        lower_bound=lb,
        direction=direction,
        event=str(event),
        counts=counts,
        runs=runs,
        selection_runs=selection_runs,
        alpha=alpha,
        seconds=time.perf_counter() - start,
        extras=extras,
    )


def format_results(results: Sequence[AuditResult]) -> str:
    """A Markdown table: algorithm, claim, lower bound, event, N, time."""
    lines = [
        "| algorithm | claimed ε (RDP / PLD / profile) | ε lower bound | event (direction, counts) "
        "| N per dataset (+ selection) | time | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        pld, profile = ("n/a" if math.isnan(v) else f"{v:.3f}"
                        for v in (r.claim_pld, r.claim_profile))
        lines.append(
            f"| {r.algorithm} ({r.description}) | {r.claim:.3f} ({r.claim_rdp:.3f} / {pld} / "
            f"{profile}) "
            f"| {r.lower_bound:.3f} | {r.event} ({r.direction}, {r.counts[0]} vs {r.counts[1]}) "
            f"| {r.runs} (+{r.selection_runs}) | {r.seconds:.1f} s "
            f"| {'ok' if r.passed else 'FAIL: bound above claim'} |"
        )
    return "\n".join(lines)
