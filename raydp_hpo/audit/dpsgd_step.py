"""The audit of the real DP-SGD training step, end to end.

**The DP-SGD step itself** (:func:`audit_dpsgd_step`): the cheap trials stand in for
DP-SGD in the search audits, so the training code is audited on its own, black-box, with the
same statistics: the trainable's own runner (Poisson batches from the real sampler, clipping,
noise, public normaliser, update) on X and X' = X + one canary, against ε of the
SubsampledGaussian it declares.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydp_hpo.audit.cheap_trial import AuditError
from raydp_hpo.audit.scenarios import SearchOutput, _claims
from raydp_hpo.audit.statistics import AuditResult, _audit_result, _audit_setup

#: Name of the audit of the real DP-SGD training step in reports and ``run_audit``.
DPSGD_STEP = "dpsgd_step"


@dataclass(frozen=True)
class DPSGDStepAudit:
    """Settings of :func:`audit_dpsgd_step` (all public)."""

    #: records in X (all-zero features, label 0); X' adds the canary. Above the sampler's
    #: dense threshold (4096), so batches come from the geometric-gap sampler.
    n: int = 5000
    noise_multiplier: float = 1.0
    sample_rate: float = 0.25
    epochs: int = 1
    max_grad_norm: float = 0.5
    #: the canary's feature: its gradient norm (~70 at the start) is far above the clip norm
    canary: float = 100.0
    #: small, so that the model stays near its zero start and the canary's clipped gradient
    #: keeps its full norm along the audited direction
    lr: float = 1e-3

    def config(self) -> dict[str, Any]:
        return {"model": "linear", "optimizer": "sgd", "sample_rate": self.sample_rate,
                "epochs": self.epochs, "noise_multiplier": self.noise_multiplier,
                "max_grad_norm": self.max_grad_norm, "lr": self.lr}


def audit_dpsgd_step(
    settings: DPSGDStepAudit = DPSGDStepAudit(),
    *,
    runs: int = 2000,
    selection_runs: int | None = None,
    alpha: float = 0.05,
    rng: np.random.Generator | None = None,
    claim: Mapping[str, float] | None = None,
) -> AuditResult:
    """Black-box audit of the DP-SGD training code itself (the cheap trials above stand in for
    it in the search audits): the trainable's own per-model runner
    (``raydp_hpo.trainables.training._Runner``: Poisson batches from
    :class:`~raydp_hpo.trainables.dp_step.PoissonBatches` over the realised records,
    book-keeping clipping fused with :class:`GaussianNoise`, the public normaliser
    q·n_public, the SGD update) trains a zero-initialised linear classifier
    (``"linear"``, 1 feature, 2 classes) for ``epochs`` on X and on X', T = steps releases.

    **Neighbouring datasets**: X = ``n`` records with feature 0 and label 0; X' = X plus one
    canary with feature x_c = ``canary`` (label 0), appended last. The declared public size is
    ``n`` for both. A record with feature 0 has weight gradient exactly 0 (∇_W ℓ = (p − e_y)·x),
    so the weights move only through the canary and the noise. For two classes p − e₀ =
    (−p₁, p₁), so the canary's gradient always points along u = (−1, 1)/√2 in weight space
    (its bias part along the same u); clipped jointly with the bias it contributes
    C·x_c/√(x_c² + 1)·u to the weight sum whenever its norm √2·p₁·√(x_c² + 1) exceeds C.

    **Released statistic** (post-processing of the released weights W_T, W₀ = 0):
    s = −(W_T·u)·normaliser / (lr · C · x_c/√(x_c² + 1)) = Σ_t (b_t + z_t), with b_t ∈ {0, 1}
    the canary's inclusion at step t (Bernoulli(q) on X', 0 on X) and z_t ~ N(0, σ²) — the
    worst-case pair of the subsampled Gaussian mechanism, composed T times. The claim is
    ε(SubsampledGaussian(σ, q, T)) at δ = 1e-5 (minimum of RDP, PLD and profile), the figure
    every DP-SGD trial is charged; the lower bound and its events are as in
    :func:`audit_algorithm`. Gross failures show up as a bound above the claim: noise drawn
    at a tenth of its scale (5.29-5.62 with 2000 runs; ``tests/raydp_hpo/test_audit.py``) or
    no clipping (the canary's gradient is ~140 C: 4.97 with 1000 runs). Subtler ones do not:
    every record in every batch (q = 1 instead of 0.25) gave 3.42 < 4.21, and a normaliser
    off by one record is invisible to any black-box test of this size; those are what the
    sampler's law tests and the normaliser's tests (test_training.py) are for. Every run
    checks that the runner released exactly T noisy gradients. Secrets (sampling and noise
    generators) are fresh per run.
    """
    import torch

    from raydp_hpo.trainables.data import Dataset, DataSplits
    from raydp_hpo.trainables.training import _Runner, declared_privacy

    selection_runs, rng, start = _audit_setup(runs, selection_runs, rng)
    config = settings.config()
    n = settings.n
    features = np.zeros((n + 1, 1), np.float32)
    features[n, 0] = settings.canary
    labels = np.zeros(n + 1, np.int64)
    public = DataSplits(Dataset(features[:n], labels[:n], 2), Dataset(features[:1], labels[:1], 2),
                        Dataset(features[:1], labels[:1], 2))
    privacy, n_view = declared_privacy(config, public)  # public sizes only
    mechanism = privacy.mechanism()
    delta = 1e-5
    claim = _claims(mechanism, delta) if claim is None else claim
    cpu = torch.device("cpu")
    runners = [
        _Runner(config, Dataset(features[:size], labels[:size], 2), privacy, False, 0, cpu,
                seed=secrets.randbits(63), normaliser=privacy.sample_rate * n_view)
        for size in (n, n + 1)  # X, X'
    ]
    c = settings.max_grad_norm
    scale = privacy.sample_rate * n_view / (
        settings.lr * c * settings.canary / math.sqrt(settings.canary**2 + 1))
    direction = torch.tensor([[-1.0], [1.0]]) / math.sqrt(2.0)

    def run(runner: Any) -> SearchOutput:
        with torch.no_grad():
            for param in runner.params:
                param.zero_()
        runner.sampler.manual_seed(int(rng.integers(2**63)))
        if runner.batches is not None:
            runner.batches.reset()  # no batch drawn ahead with the previous seed
        runner.noise.generator.manual_seed(int(rng.integers(2**63)))
        runner.noise.releases, runner.steps_done = 0, 0
        for _ in range(privacy.steps):
            runner.step()
        if runner.noise.releases != privacy.steps:
            raise AuditError(f"the runner released {runner.noise.releases} noisy gradients, "
                             f"declared {mechanism}")
        weight = runner.model.linear.weight.detach()
        return SearchOutput(None, -float((weight * direction).sum()) * scale, 1)

    def outputs(neighbour: int, count: int) -> list[SearchOutput]:
        return [run(runners[neighbour]) for _ in range(count)]

    description = (f"real DP-SGD runner, n={n}, q={privacy.sample_rate:g}, "
                   f"σ={privacy.noise_multiplier:g}, C={c:g}, T={privacy.steps}")
    return _audit_result(DPSGD_STEP, description, claim, outputs, runs=runs,
                         selection_runs=selection_runs, delta=delta, alpha=alpha, start=start)
