"""Empirical privacy audit of every search algorithm, end to end, on cheap base mechanisms.

A formula test pins a bound; it cannot see a partition that changes with one record, a secret
drawn from a public seed, or a trial that runs more releases than it declares. This module runs
the *real* searcher code (``raydp_hpo.searchers.make_searcher`` without a seed, driven through
``suggest`` / ``on_trial_complete`` / ``release`` exactly as Ray Tune drives it) on two
neighbouring datasets, many times, and turns the output distributions into a statistically
valid lower bound on ε that must stay below the ε the plan claims (DESIGN.md, "Secrets and
neighbouring datasets", "Trust, but audit").

**Neighbouring datasets** (add/remove one record, the project's adjacency): X has ``n`` training
records with scalar feature 0; X' = X plus one canary record with feature +1, appended last.
Both searchers get the same declared public size ``dataset_size = n``. The validation split is
the same in X and X': ``n_val`` records with features spread over (0, 1] and label 1.

**Cheap trial** (:func:`run_cheap_trial`) in place of DP-SGD, with exactly the trial's declared
privacy parameters: the records it trains on are those of
:func:`raydp_hpo.trainables.training.training_sets` (the view / partition code the DP trainable uses);
the statistic is the clipped sum s = Σ clip(xᵢ, −1, 1) (ℓ₂ sensitivity 1 under add/remove).
Full-batch GD (``optimizer="gd"``) releases s + N(0, σ²) at each of its T steps; other
optimisers release the clipped sum over a Poisson(q) batch plus N(0, σ²) at each gradient
evaluation (Abadi et al. 2016) — either way the run *is* ``privacy.mechanism()``. The model m is
a post-processing (mean of the releases, rescaled by 1/q). Non-private SVT partition trials
(``settings.nonprivate``) use m = s. A validation record v is predicted correctly iff
``lr · m ≥ v``, so the hyperparameter ``lr`` matters and candidate ``lr = 1`` moves from
accuracy 0 to accuracy 1 on a partition when the canary enters it: the largest change Ding et
al.'s Lemma 2 allows (1/k of the partition average). A trial whose score feeds a selection
(``score_epsilon`` set) reports ``(correct + Laplace(1/ε_s)) / n_val`` (or ``+ N(0, σ_s²)``,
σ_s analytic-Gaussian calibrated to (ε_s, δ_s), for ``score_noise="gaussian"``) — a count of sensitivity 1
under one validation record, divided by the public validation size. Every trial counts its
releases and raises :class:`AuditError` unless what ran equals the declared
``trial_mechanism(privacy.mechanism(), ε_s)`` and is covered by its block's ``base``.

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

**Claim**: ε of the plan's mechanism at the budget's δ, the minimum of the RDP, PLD and
privacy-profile accountants — the smallest figure a certificate can print (each is an upper
bound; grid search, which charges trial by trial, is claimed as the composition of its whole
grid).

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

**The DP-SGD step itself** (:func:`audit_dpsgd_step`): the cheap trials stand in for
DP-SGD in the search audits, so the training code is audited on its own, black-box, with the
same statistics: the trainable's own runner (Poisson batches from the real sampler, clipping,
noise, public normaliser, update) on X and X' = X + one canary, against ε of the
SubsampledGaussian it declares.

**Client-level DP FedAvg** (:func:`audit_client_dp_fedavg`): the server release of one round,
on federations with and without one canary client, against ε(Gaussian(σ)); once on the
released model's component along the canary's update, once on its squared norm (which sees a
release whose scale depends on who is present).

**Property checks**: :func:`check_fresh_secrets` (no secret reproducible from public inputs:
two searchers built from identical public inputs and no seed must hold different secrets),
:func:`check_one_record_one_partition` (one added record changes exactly one SVT partition, and
a subsample and its complement by at most that record), :func:`check_train_dp_releases` (a
tiny real :func:`raydp_hpo.trainables.training.train_dp` run's releases equal its declared mechanism).
"""

from __future__ import annotations

import inspect
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
from scipy.stats import beta

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian
from raydp_hpo.accounting.mechanisms import (
    Composition,
    Gaussian,
    Laplace,
    Mechanism,
    SubsampledGaussian,
    mechanism_from_dict,
)
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trial.privacy import NOISY_SCORE_KEY, Optimizer, ScoreNoise, trial_mechanism
from raydp_hpo.trial.settings import RAYDP_KEY, RaydpSettings

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

#: The metric every cheap trial reports (maximised).
METRIC = "score"
#: Feature of the canary record (the largest value a record may take: sensitivity 1).
CANARY = 1.0
#: Largest number of trials one audited search may start (a guard against a runaway searcher).
MAX_TRIALS_PER_SEARCH = 10_000


class AuditError(RayDPHPOError):
    """A search did something the audit cannot account for (a trial that ran a mechanism other
    than the one it declared, a searcher that never finishes, ...)."""


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


def _val_set(n_val: int) -> Any:
    from raydp_hpo.trainables.data import Dataset

    v = np.linspace(1.0 / n_val, 1.0, n_val, dtype=np.float32).reshape(-1, 1)
    return Dataset(v, np.ones(n_val, dtype=np.int64), 2)


def neighbouring_datasets(
    n_train: int, n_val: int, *, train_features: np.ndarray | None = None
) -> tuple[Any, Any]:
    """(X, X'): ``DataSplits`` whose training splits differ by one canary record (feature +1,
    appended last); validation and test splits are identical.

    ``train_features`` (length ``n_train``, values in [−1, 1)) replaces the all-zero training
    records (the partition check uses distinct values to identify records).
    """
    from raydp_hpo.trainables.data import Dataset, DataSplits

    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise InvalidParameterError(f"n_train must be an integer >= 1, got {n_train=!r}")
    if isinstance(n_val, bool) or not isinstance(n_val, int) or n_val < 2:
        raise InvalidParameterError(f"n_val must be an integer >= 2, got {n_val=!r}")
    x = np.zeros(n_train, np.float32) if train_features is None else np.asarray(
        train_features, np.float32
    )
    if x.shape != (n_train,) or np.any(np.abs(x) > 1) or np.any(x == CANARY):
        raise InvalidParameterError(
            f"train_features must have shape ({n_train},), values in [-1, 1) and no {CANARY}"
        )
    y = np.zeros(n_train, np.int64)
    val = _val_set(n_val)
    train = Dataset(x.reshape(-1, 1), y, 2)
    train2 = Dataset(
        np.append(x, np.float32(CANARY)).reshape(-1, 1), np.append(y, np.int64(0)), 2
    )
    return DataSplits(train, val, val), DataSplits(train2, val, val)


# --------------------------------------------------------------------------------------------
# the cheap trial
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheapTrial:
    """Outcome of one cheap trial: its reported score, its model(s) and what it released."""

    score: float
    model: float
    models: tuple[float, ...]
    ran: Mechanism | None  # None: a non-private trial (its outputs go only to the SVT)
    declared: Mechanism | None


def _ran_training(privacy: Any, releases: int) -> Mechanism:
    if privacy.optimizer is Optimizer.GD:
        return Gaussian(privacy.noise_multiplier, releases)
    return SubsampledGaussian(privacy.noise_multiplier, privacy.sample_rate, releases)


def run_cheap_trial(
    config: Mapping[str, Any],
    data: Any,
    *,
    rng: np.random.Generator,
) -> CheapTrial:
    """Run one trial with a cheap mechanism of exactly its declared privacy (module doc): the
    privacy settings and the public validation size come from the DP trainable's own
    :func:`raydp_hpo.trainables.training.declared_privacy` and :func:`~raydp_hpo.trainables.training.public_sizes`.

    Raises :class:`AuditError` when the releases it ran differ from the declared mechanism or
    are not covered by the block's ``base``.
    """
    from raydp_hpo.ledger.coverage import is_covered
    from raydp_hpo.trainables.training import (
        declared_privacy,
        public_sizes,
        training_sets,
        validation_count,
    )

    settings = RaydpSettings.from_config(config)
    lr = float(config.get("lr", 1.0))
    sets = training_sets(data.train, settings)
    _, n_val = public_sizes(settings, data)  # the declared public validation size
    v = np.asarray(data.val.features, np.float64).reshape(-1)
    models: list[float] = []
    ran: Mechanism | None = None
    declared: Mechanism | None = None
    if settings.nonprivate:
        if settings.score_epsilon is not None:
            raise AuditError(f"a non-private trial reports a noisy score: {settings}")
        models = [float(np.clip(np.asarray(t.features, np.float64), -1, 1).sum()) for t in sets]
    else:
        privacy, _ = declared_privacy(config, data)
        evaluations = privacy.steps * privacy.gradient_evaluations_per_step
        sigma, q = privacy.noise_multiplier, privacy.sample_rate
        ran_parts: list[Mechanism] = []
        for t in sets:
            x = np.clip(np.asarray(t.features, np.float64).reshape(-1), -1.0, 1.0)
            if privacy.optimizer is Optimizer.GD:
                noisy = x.sum() + rng.normal(0.0, sigma, evaluations)
                models.append(float(noisy.mean()))
            else:
                mask = rng.random((evaluations, len(x))) < q
                noisy = mask @ x + rng.normal(0.0, sigma, evaluations)
                models.append(float(noisy.mean() / q))
            ran_parts.append(_ran_training(privacy, len(noisy)))
        # each model is its own release stream on disjoint records (parallel composition):
        # every one must be exactly the declared training mechanism
        declared_training = privacy.mechanism()
        for part in ran_parts:
            if part != declared_training:
                raise AuditError(f"trial ran {part} but declared {declared_training}")
        ran = ran_parts[0]
        declared = trial_mechanism(declared_training, settings.score_release)
    # the mean of the models' counts, each clipped to the declared validation size (train_dp's)
    correct = validation_count([int(np.count_nonzero(lr * m >= v)) for m in models], n_val)
    release = settings.score_release
    if release is not None:
        # count of correct predictions (sensitivity 1) + Laplace(1/ε_s) or N(0, σ_s²), over the
        # public size, clipped to [0, 1] (post-processing); what ran is built from the noise
        # actually drawn, independently of the declaration
        if release.noise is ScoreNoise.LAPLACE:
            noisy_count = correct + rng.laplace(0.0, 1.0 / release.epsilon)
            score_ran: Mechanism = Laplace(release.epsilon, count=1)
        else:
            delta_s = math.nan if release.delta is None else release.delta
            sigma_s = calibrate_analytic_gaussian(release.epsilon, delta_s)
            noisy_count = correct + rng.normal(0.0, sigma_s)
            score_ran = Gaussian(sigma_s, count=1)
        score = min(1.0, max(0.0, noisy_count / n_val))
        if ran is None:
            raise AuditError(f"a non-private trial reports a noisy score: {settings}")
        ran = Composition((ran, score_ran))
    else:
        score = correct / n_val
    if declared is not None and ran != declared:
        raise AuditError(f"trial ran {ran} but declared {declared}")
    if ran is not None and settings.base is not None:
        base = mechanism_from_dict(dict(settings.base))
        if not is_covered(ran, base):
            raise AuditError(f"trial ran {ran}, not covered by its plan base {base}")
    return CheapTrial(score, float(np.mean(models)), tuple(models), ran, declared)


# --------------------------------------------------------------------------------------------
# driving a real searcher
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditScenario:
    """One algorithm's audit set-up: the searcher's public arguments and the data sizes.

    ``searcher_kwargs`` are passed to ``make_searcher`` with ``metric``, ``mode="max"``,
    ``dataset_size=n_train`` and ``budget`` — never a seed. ``name`` tells apart two scenarios
    of one algorithm (default: the algorithm's name; see :attr:`label`).
    """

    algorithm: str
    searcher_kwargs: Mapping[str, Any]
    budget: PrivacyBudget
    n_train: int = 100
    n_val: int = 20
    description: str = ""
    train_features: tuple[float, ...] | None = None
    name: str = ""

    @property
    def label(self) -> str:
        """The scenario's name in reports and in :func:`default_scenarios`."""
        return self.name or self.algorithm

    def build_searcher(self) -> Any:
        from raydp_hpo.searchers import make_searcher
        from raydp_hpo.searchers.base import DPSearcher

        kwargs = dict(self.searcher_kwargs)
        if "validation_size" in inspect.signature(DPSearcher.__init__).parameters:
            kwargs.setdefault("validation_size", self.n_val)  # the declared public size
        return make_searcher(
            self.algorithm,
            metric=METRIC,
            mode="max",
            dataset_size=self.n_train,
            budget=self.budget,
            **kwargs,
        )

    def datasets(self) -> tuple[Any, Any]:
        feats = None if self.train_features is None else np.asarray(self.train_features)
        return neighbouring_datasets(self.n_train, self.n_val, train_features=feats)


@dataclass(frozen=True)
class SearchOutput:
    """The public output of one audited search: the released hyperparameters (a sorted tuple
    of items, ``None`` when nothing was selected) and the released model (``nan`` when no
    trained model is released)."""

    hyperparameters: tuple[tuple[str, Any], ...] | None
    model: float
    trials: int


def _key(hyper: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    if hyper is None:
        return None
    out = []
    for k, val in sorted(hyper.items()):
        if isinstance(val, float):
            val = round(val, 12)
        elif isinstance(val, dict):
            val = repr(sorted(val.items()))
        out.append((k, val))
    return tuple(out)


def run_search(
    scenario: AuditScenario,
    data: Any,
    rng: np.random.Generator,
    *,
    searcher: Any | None = None,
    on_config: Callable[[dict[str, Any]], None] | None = None,
) -> SearchOutput:
    """One search, driven as Ray Tune drives it: ``suggest`` until it returns
    ``Searcher.FINISHED`` (or ``None`` while trials are pending), then complete the pending
    trials (cheap trials, in order), repeat; ``release()`` at the end."""
    from ray.tune.search import Searcher

    s = scenario.build_searcher() if searcher is None else searcher
    pending: list[tuple[str, dict[str, Any]]] = []
    models: dict[str, float] = {}
    started, finished = 0, False
    while not finished or pending:
        if not finished:
            if started >= MAX_TRIALS_PER_SEARCH:
                raise AuditError(f"{scenario.label} started {started} trials without finishing")
            trial_id = f"trial_{started:05d}"
            config = s.suggest(trial_id)
            if config == Searcher.FINISHED:
                finished = True
            elif config is not None:
                started += 1
                if on_config is not None:
                    on_config(config)
                pending.append((trial_id, config))
                continue
            elif not pending:
                raise AuditError(f"{scenario.label} returned None with no trial pending")
        for trial_id, config in pending:
            out = run_cheap_trial(config, data, rng=rng)
            models[trial_id] = out.model
            # as train_dp reports it: a released score says the ε_s it was released at
            score_epsilon = RaydpSettings.from_config(config).score_epsilon
            s.on_trial_complete(trial_id, {METRIC: out.score} if score_epsilon is None
                                else {METRIC: out.score, NOISY_SCORE_KEY: score_epsilon})
        pending = []
    release = s.release()
    model = models.get(release.trial_id, math.nan) if release.trial_id is not None else math.nan
    return SearchOutput(_key(release.hyperparameters), float(model), started)


def _fresh_rng() -> np.random.Generator:
    return np.random.default_rng(secrets.randbits(128))


# --------------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------------


def default_scenarios() -> dict[str, AuditScenario]:
    """One scenario per algorithm: two learning rates, full-batch GD trials of
    ``Gaussian(σ=1, 1)`` (linear scaling: its own μ-GDP runs), noisy scores with ε_s = 0.1.
    SVT's final run has σ = 3 so that its claim (2.65) is small enough for the AboveThreshold
    selection itself to be tested: without its noise, "lr = 0.1 released" has probability
    1/2 on X (nothing passes, a uniform fallback) and 0 on X' (lr = 1 passes every round)."""
    from ray import tune

    budget = PrivacyBudget(epsilon=10.0, delta=1e-5)
    gd = {"optimizer": "gd", "epochs": 1, "noise_multiplier": 1.0}
    choice = {"lr": tune.choice([0.1, 1.0]), **gd}
    grid = {"lr": tune.grid_search([0.1, 1.0]), **gd}
    svt_space = {"lr": tune.grid_search([0.1, 1.0]), **gd, "noise_multiplier": 3.0}
    # DP-SGD linear scaling with the proportional transfer (two scenarios share it)
    proportional = {"param_space": {}, "runs_per_sweep": 3, "sweep_epsilons": (0.5, 1.0),
                    "lr_range": (0.1, 1.0), "steps_range": (2, 2), "full_batch": False,
                    "sample_rate": 0.5, "optimizer": "sgd", "fit_variable": "inverse_noise",
                    "line_fit": "proportional", "sweep_draw": "log_uniform",
                    "sweep_estimate": "quadratic"}
    scenarios = [
        AuditScenario("random_stopping", {"param_space": choice, "mean": 3.0}, budget,
                      description="geometric K, E[K]=3"),
        AuditScenario("subsampled_transfer",
                      {"param_space": choice, "mean": 3.0, "subsample_rate": 0.2}, budget,
                      description="q=0.2, geometric K, E[K]=3"),
        AuditScenario("svt_threshold",
                      {"param_space": svt_space, "num_partitions": 5, "round_epsilon": 0.5,
                       "max_rounds": 3, "granularity": 0.05}, budget,
                      description="k=5 partitions, 3 rounds of ϵ=0.5, final run σ=3"),
        AuditScenario("linear_scaling",
                      {"param_space": {}, "preset": "paper", "runs_per_sweep": 2,
                       "sweep_epsilons": (0.5, 1.0), "lr_range": (0.1, 1.0),
                       "steps_range": (1, 3)},
                      PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="2 runs per sweep, T in [1, 3]"),
        # the DP-SGD variant with the proportional transfer: r* = α̂/σ_f, α̂ from a quadratic
        # fit to every released sweep score; the audit checks end to end on neighbouring
        # datasets that it reads nothing else
        AuditScenario("linear_scaling", proportional, PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="DP-SGD q=0.5, T=2, 3 runs per sweep, lr ∝ 1/σ, quadratic peak",
                      name="linear_scaling_proportional"),
        # the same with coarse-to-fine sweeps: the second sweep's lrs are drawn in a window
        # placed by the first sweep's released scores (an adaptive choice the plan must cover)
        AuditScenario("linear_scaling",
                      {**proportional, "sweep_draw": "refined", "refine_decades": 0.25},
                      PrivacyBudget(epsilon=5.0, delta=1e-5),
                      description="as linear_scaling_proportional, second sweep within "
                                  "±0.25 decade of the first's best",
                      name="linear_scaling_refined"),
        AuditScenario("one_shot_random", {"param_space": choice}, budget,
                      description="one run"),
        AuditScenario("grid_composed", {"param_space": grid}, budget,
                      description="2 grid points"),
    ]
    return {s.label: s for s in scenarios}


#: Feature of the records a crafted dataset plants where a partition leak would expose them.
PLANTED = 0.999


def craft_partition_canary(scenario: AuditScenario) -> tuple[AuditScenario, int]:
    """White-box variant of a partition scenario: an adversary who can reproduce a searcher's
    secrets from public inputs builds one searcher, reads the partition view of its first
    candidate, and plants records of feature ``PLANTED`` wherever adding the canary would put
    a record *other than the canary* into some partition's training set. Returns the crafted
    scenario and the number of training sets the canary changes under that view.

    With fresh secrets the crafting searcher's view is independent of the audited runs', so
    the crafted pair is just one more fixed pair of neighbours and every bound stays valid.
    Where one record changes one partition nothing is planted (all records stay 0).
    """
    from ray.tune.search import Searcher

    from raydp_hpo.trainables.training import training_sets

    config = scenario.build_searcher().suggest("craft_00000")
    if config is None or config == Searcher.FINISHED:
        return scenario, 0
    settings = RaydpSettings.from_config(config)
    if (settings.data_view or {}).get("kind") != "partitions":
        return scenario, 0
    n = scenario.n_train
    ids = np.linspace(-0.9, 0.9, n).astype(np.float32).astype(np.float64)  # as stored
    x, x2 = neighbouring_datasets(n, scenario.n_val, train_features=ids)
    gained: set[float] = set()
    for a, b in zip(training_sets(x.train, settings), training_sets(x2.train, settings)):
        gained |= set(_records(b).tolist()) - set(_records(a).tolist())
    gained -= {CANARY}
    # records (other than the canary) that join some training set when the canary is added
    planted = np.where(np.isin(ids, sorted(gained)), PLANTED, 0.0)
    crafted = AuditScenario(
        scenario.algorithm,
        scenario.searcher_kwargs,
        scenario.budget,
        scenario.n_train,
        scenario.n_val,
        scenario.description + ", crafted from a searcher built from the same public inputs",
        tuple(float(f) for f in planted),
        scenario.name,
    )
    c, c2 = crafted.datasets()
    changed = sum(
        not np.array_equal(_records(a), _records(b))
        for a, b in zip(training_sets(c.train, settings), training_sets(c2.train, settings))
    )
    return crafted, int(changed)


def claimed_epsilon(scenario: AuditScenario) -> dict[str, float]:
    """ε the plan claims at the budget's δ: RDP, PLD and privacy profiles (where each works)
    and their minimum — the smallest figure the certificate can print is the one audited."""
    s = scenario.build_searcher()
    mech = s.privacy_plan().mechanism
    if mech is None:  # grid search charges trial by trial: the whole grid's composition
        mech = s.composed_mechanism()
    return _claims(mech, scenario.budget.delta)


def _claims(mech: Mechanism, delta: float) -> dict[str, float]:
    """ε of ``mech`` at ``delta`` by RDP, PLD and privacy profiles (nan where an accountant
    does not apply) and their minimum, ``claim``."""
    out = {"rdp": epsilon(mech, delta, Accountant.RDP)}
    for name, accountant in (("pld", Accountant.PLD), ("profile", Accountant.TIGHTEST)):
        try:
            out[name] = epsilon(mech, delta, accountant)
        except RayDPHPOError:
            out[name] = math.nan
    out["claim"] = min(v for v in out.values() if not math.isnan(v))
    return out


def _audit_setup(
    runs: int, selection_runs: int | None, rng: np.random.Generator | None
) -> tuple[int, np.random.Generator, float]:
    """Checked ``runs``: (selection runs, default runs/2; the generator, default fresh OS
    entropy; the start time)."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise InvalidParameterError(f"runs must be an integer >= 1, got {runs=!r}")
    selection = runs // 2 if selection_runs is None else selection_runs
    return selection, _fresh_rng() if rng is None else rng, time.perf_counter()


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# property checks
# --------------------------------------------------------------------------------------------

#: Attributes of the searchers that hold secrets drawn at construction.
_SECRET_ATTRIBUTES = ("_k", "_subsample_seed", "_partition_seed")


def _secrets_of(searcher: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in vars(searcher).items():
        if name in _SECRET_ATTRIBUTES:
            out[name] = value
        elif isinstance(value, np.random.Generator):  # the stream future secrets come from
            out[name + ".state"] = repr(value.bit_generator.state)
    return out


@dataclass(frozen=True)
class SecretCheck:
    """For each secret: in how many of ``pairs`` pairs of identically built searchers it was
    equal. ``reproducible`` lists the secrets equal in every pair."""

    algorithm: str
    pairs: int
    equal_in: dict[str, int]

    @property
    def reproducible(self) -> list[str]:
        return [k for k, v in self.equal_in.items() if v == self.pairs]

    @property
    def passed(self) -> bool:
        return bool(self.equal_in) and not self.reproducible


def check_fresh_secrets(scenario: AuditScenario, *, pairs: int = 8) -> SecretCheck:
    """Build ``pairs`` pairs of searchers from identical public inputs (no seed) and compare
    their secrets (K, subsample and partition seeds, the state of the RNG that future secret
    draws — SVT noise, sampled configurations — come from). A secret equal in every pair is
    reproducible from the public inputs (probability ≤ max_k P[K=k]^pairs for fresh K)."""
    equal: dict[str, int] = {}
    for _ in range(pairs):
        a, b = _secrets_of(scenario.build_searcher()), _secrets_of(scenario.build_searcher())
        for name in a.keys() | b.keys():
            equal[name] = equal.get(name, 0) + int(a.get(name) == b.get(name))
    return SecretCheck(scenario.label, pairs, equal)


@dataclass(frozen=True)
class PartitionCheck:
    """One record, one partition: how many views were checked and how many broke the rule,
    with the number of changed training sets of each broken partition view."""

    algorithm: str
    views: int
    violations: int
    changed_sets: tuple[int, ...] = ()
    details: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.views > 0 and self.violations == 0


def _records(d: Any) -> np.ndarray:
    return np.sort(np.asarray(d.features, np.float64).reshape(-1))


def check_one_record_one_partition(
    scenario: AuditScenario, *, searches: int = 20
) -> PartitionCheck:
    """Run ``searches`` real searches, and for every data view they emit compare the training
    sets (:func:`raydp_hpo.trainables.training.training_sets`) on X (distinct records) and on
    X' = X + canary under the same view: exactly one training set may change, and only by
    gaining the canary (partitions); a subsample / complement may differ by at most the canary.

    The coupling (same view seed, canary appended last) is the natural one: records are
    assigned to partitions / subsamples independently, so every other record keeps its place.
    """
    from raydp_hpo.trainables.training import training_sets

    n = scenario.n_train
    feats = np.linspace(-0.9, 0.9, n)
    x, x2 = neighbouring_datasets(n, scenario.n_val, train_features=feats)
    views: list[RaydpSettings] = []
    rng = _fresh_rng()
    for _ in range(searches):
        run_search(scenario, x, rng,
                   on_config=lambda c: views.append(RaydpSettings.from_config(c)))
    checked, violations = 0, 0
    changed_counts: list[int] = []
    details: list[str] = []
    for settings in views:
        kind = (settings.data_view or {"kind": "full"}).get("kind")
        a = [_records(d) for d in training_sets(x.train, settings)]
        b = [_records(d) for d in training_sets(x2.train, settings)]
        checked += 1
        changed = [i for i, (u, w) in enumerate(zip(a, b)) if not np.array_equal(u, w)]
        gained_canary_only = all(
            np.array_equal(np.sort(np.append(a[i], CANARY)), b[i]) for i in changed
        )
        ok = gained_canary_only and (
            len(changed) == 1 if kind in ("partitions", "full") else len(changed) <= 1
        )
        if not ok:
            violations += 1
            changed_counts.append(len(changed))
            if len(details) < 5:
                view = {**(settings.data_view or {}), "seed": "<secret>"}
                details.append(
                    f"view {view}: {len(changed)} of {len(a)} training sets "
                    f"changed{'' if gained_canary_only else ' (not only by the canary)'}"
                )
    return PartitionCheck(scenario.label, checked, violations, tuple(changed_counts),
                          tuple(details))


@dataclass(frozen=True)
class ReleaseCheck:
    """A tiny real DP-SGD run: releases per model vs the declared training mechanism."""

    declared: Mechanism
    ran: tuple[Mechanism, ...]

    @property
    def passed(self) -> bool:
        return len(self.ran) > 0 and all(m == self.declared for m in self.ran)


def check_train_dp_releases(*, num_partitions: int = 2) -> ReleaseCheck:
    """Run :func:`raydp_hpo.trainables.training.train_dp` once on 40 records (``num_partitions`` models,
    Poisson-sampled DP-SGD, 1 epoch at q = 0.5) and compare each model's counted noisy
    releases with ``privacy_from_config(config, n).mechanism()``."""
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.trainables.data import Dataset, DataSplits
    from raydp_hpo.trainables.training import declared_privacy, train_dp

    rng = _fresh_rng()
    x = rng.uniform(-1, 1, (40, 1)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    train = Dataset(x, y, 2)
    data = DataSplits(train, train, train)
    config = {
        "model": "mlp",
        "model_kwargs": {"hidden": [4]},
        "optimizer": "sgd",
        "sample_rate": 0.5,
        "epochs": 1,
        "noise_multiplier": 2.0,
        "lr": 0.1,
        RAYDP_KEY: {
            "charge": True,
            "charge_id": "audit/t0",
            "data_view": {"kind": "partitions", "num_partitions": num_partitions,
                          "seed": secrets.randbits(31)},
        },
    }
    ledger = PrivacyLedger(PrivacyBudget(epsilon=50.0, delta=1e-5))
    result = train_dp(config, data, ledger=ledger, device="cpu")
    declared = declared_privacy(config, data)[0].mechanism()
    ran = tuple(
        SubsampledGaussian(log.noise_multiplier, log.sample_rate, log.releases)
        for log in result.releases
    )
    return ReleaseCheck(declared, ran)


# --------------------------------------------------------------------------------------------
# the real DP-SGD step, end to end
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# the client-level DP server step of federated averaging
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# the whole audit
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# a dataset ledger across experiments, the second chosen from the first's release
# --------------------------------------------------------------------------------------------

#: Name of the dataset-ledger audit in :func:`run_audit`.
DATASET_LEDGER = "dataset_ledger"


def _dataset_ledger_experiments() -> tuple[AuditScenario, AuditScenario, AuditScenario]:
    """The first experiment (random stopping, E[K]=3) and the two second experiments an
    adaptive analyst picks between from the first's release: one-shot random search when it
    released lr = 1.0, else random stopping with E[K]=2."""
    from dataclasses import replace

    scenarios = default_scenarios()
    first = scenarios["random_stopping"]
    after_high = scenarios["one_shot_random"]
    after_low = replace(first, searcher_kwargs={**first.searcher_kwargs, "mean": 2.0},
                        description="geometric K, E[K]=2")
    return first, after_high, after_low


def _dataset_ledger(budget: PrivacyBudget) -> Any:
    from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger

    return PrivacyLedger(budget, adaptivity=Adaptivity.EXPERIMENTS,
                         accountant=Accountant.TIGHTEST)


def dataset_ledger_claim(delta: float = 1e-5) -> dict[str, float]:
    """The dataset ledger's budget the audit claims: the larger of what the ledger records
    for the two paths (first then either second experiment), each the real ledger's spend,
    min(RDP filter at δ/2, basic composition of the points) (:mod:`raydp_hpo.ledger.
    experiments`). The filter theorem guarantees the budget whatever path the analyst takes;
    the budget is set to exactly the costlier path, so the claim is as small as can hold."""
    first, after_high, after_low = _dataset_ledger_experiments()
    spends = []
    for second in (after_high, after_low):
        ledger = _dataset_ledger(PrivacyBudget(1e6, delta))
        ledger.charge("first/point", first.build_searcher().privacy_plan().mechanism)
        ledger.charge("second/point", second.build_searcher().privacy_plan().mechanism)
        spends.append(ledger.spent())
    return {"claim": max(spends), "rdp": math.nan, "pld": math.nan, "profile": math.nan}


def run_dataset_ledger(data: Any, rng: np.random.Generator, budget: PrivacyBudget
                       ) -> SearchOutput:
    """Two experiments on one real dataset ledger (``Adaptivity.EXPERIMENTS``), as ``DPTuner``
    runs them: each plan is admitted as the experiment's point before the search runs; the
    second experiment is chosen from the first's released hyperparameters. The output is
    both releases and the second's model (``nan`` when the ledger refused it)."""
    first, after_high, after_low = _dataset_ledger_experiments()
    ledger = _dataset_ledger(budget)
    s1 = first.build_searcher()
    ledger.charge("first/point", s1.privacy_plan().mechanism)
    out1 = run_search(first, data, rng, searcher=s1)
    released_lr = dict(out1.hyperparameters or ()).get("lr")
    second = after_high if released_lr == 1.0 else after_low
    s2 = second.build_searcher()
    if not ledger.try_charge("second/point", s2.privacy_plan().mechanism).admitted:
        return SearchOutput((("first", out1.hyperparameters), ("second", None)), math.nan,
                            out1.trials)
    out2 = run_search(second, data, rng, searcher=s2)
    return SearchOutput((("first", out1.hyperparameters), ("second", out2.hyperparameters)),
                        out2.model, out1.trials + out2.trials)


def audit_dataset_ledger(*, runs: int, selection_runs: int | None = None,
                         alpha: float = 0.05, rng: np.random.Generator | None = None,
                         claim: Mapping[str, float] | None = None) -> AuditResult:
    """The dataset ledger end to end: :func:`run_dataset_ledger` on X and X' (the
    random-stopping scenario's neighbouring datasets), against the ledger's budget
    (:func:`dataset_ledger_claim`): the guarantee of the whole adaptive interaction."""
    selection_runs, rng, start = _audit_setup(runs, selection_runs, rng)
    first, _, _ = _dataset_ledger_experiments()
    x, x2 = first.datasets()
    delta = first.budget.delta
    claim = dataset_ledger_claim(delta) if claim is None else claim
    budget = PrivacyBudget(claim["claim"] * (1 + 1e-9), delta)

    def outputs(neighbour: int, count: int) -> list[SearchOutput]:
        data = x2 if neighbour else x
        return [run_dataset_ledger(data, rng, budget) for _ in range(count)]

    return _audit_result(DATASET_LEDGER, "random stopping E[K]=3, then one-shot if it "
                         "released lr=1 else random stopping E[K]=2, on one dataset ledger",
                         claim, outputs, runs=runs, selection_runs=selection_runs,
                         delta=delta, alpha=alpha, start=start, mean_trials=True)


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
