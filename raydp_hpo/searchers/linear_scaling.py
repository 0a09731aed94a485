"""Two-point linear scaling: Panda et al. (2024), "A New Linear Scaling Rule for Private
Adaptive Hyperparameter Optimization", Algorithms 1–3 and Theorem 4.1.

* Alg. 3 (sweep): n runs at privacy μ, each with r = η·T drawn uniformly from
  [r_min, r_max] = [η_min·T_min, η_max·T_max]; keep the best-performing r.
* Alg. 2: one sweep at μ₁ (best r₁), one at μ₂ (best r₂); fit the line r = α·x + b through
  (x₁, r₁), (x₂, r₂); r* = α·x_f + b; final run (Alg. 1) with r*, μ_f.
* Alg. 1: decompose r into (η, T) without exceeding T_max or η_max (the paper's method 2:
  "sample T uniformly, then η = r/T"), calibrate σ for (μ, T), train full batch.
* Thm. 4.1: the whole is μ_t-GDP with μ_t = √(n·μ₁² + n·μ₂² + μ_f²) (Dong, Roth & Su 2022,
  Cor. 3.3); (ε, δ) by their Cor. 2.13.

Defaults (issue #31): the refined DP-SGD variant — ``LinearScalingPreset.REFINED``, measured
best by ``benchmarks/privacy_utility.py`` (DP-SGD at a fixed T, ``line_fit="proportional"``,
``sweep_estimate="quadratic"``, ``sweep_draw="refined"``, sweeps at fractions 0.1 and 0.2 of
the budget's ε); the sample rate, T, learning-rate range and optimizer come from the search
space unless set. ``preset="paper"`` is the paper's full-batch rule below (the defaults before).

Full batch (the paper's setting, ``preset="paper"``): trials get ``optimizer="gd"`` and ``mu``; the
trainable sets σ = √T/μ, so a run is ``Gaussian(√T/μ, T)``, exactly μ-GDP for every T. The
plan writes each run as ``Gaussian(1/μ, 1)`` — the same RDP curve and the same μ for every T —
so the plan is fixed although T is chosen adaptively:
``Composition(Gaussian(1/μ₁, n), Gaussian(1/μ₂, n), Gaussian(1/μ_f, 1))``.

Noisy selection scores: Alg. 3 keeps the best r of each sweep, i.e. it selects on every sweep
run's validation score, so each sweep run reports its score with Laplace noise and is
``trial_mechanism(run, ε_s) = Composition((run, Laplace(ε_s)))``. Laplace is not Gaussian-DP,
so the plan composes the 2n score releases as a separate ``Laplace(ε_s, count=2n)``
component: ``Composition(sweep₁, sweep₂, Laplace(ε_s, 2n), final)``. The μ-GDP bookkeeping of
Panda et al. (μ₁, μ₂, μ_f, μ_t) covers only the Gaussian (training) parts; admissibility —
and hence μ_f — is decided on the whole composition (RDP by default), so training plus score
releases fit the budget together. The final run's score is read by no selection (no noise).

Subsampled option (``full_batch=False``): DP-SGD at a fixed sample rate; σᵢ is calibrated so
that ``SubsampledGaussian(σᵢ, q, T_max)`` has the sweep's εᵢ (runs with T < T_max are
dominated), and the plan composes these upper bounds.

Robust extrapolation (a deviation from Alg. 2, on by default for the two-point line). Each sweep's best r is the best
of n noisy runs, so the two points of the fit are noisy too; the slope α = (r₂ − r₁)/(x₂ − x₁)
is divided by a small Δx (0.1 in ε) and multiplied by the long lever x_f − x₂ (≈ 2.3 at a total
ε = 3), so r* lands far outside anything a sweep tried: above it, a learning rate at which
full-batch GD diverges; below it, one that never moves off the initialisation — both give
chance accuracy (seen in the privacy-utility benchmark: one MNIST-1D seed at 0.102, digits at
ε = 3 0.39 ± 0.37). Rule: r* is clamped to what the sweeps support,

    r* ∈ [min(r₁, r₂) / c, c · max(r₁, r₂)] ∩ [r_min, r_max],   c = ``max_extrapolation`` ≥ 1,

i.e. at most a factor c beyond the best r of either sweep (c = 2 by default: the final run,
with less noise, may take a somewhat larger step than the ε₂ sweep's best, as the linear rule
predicts, but not an unvalidated order of magnitude). ``max_extrapolation=None`` restores the
paper's unclamped rule (clipped to [r_min, r_max] only). When a sweep failed entirely the
other's best r is used and, when both failed, the data-independent √(r_min·r_max), as before.

Proportional fit (``line_fit="proportional"``, the default; preset ``paper``: two-point). Even clamped, the two-point
slope is the difference of two best-of-n draws divided by a small Δx. Panda et al. build their
rule on Prop. 2.1(a) — at a fixed T, a larger ε means a smaller σ and a proportionally larger
η, "the optimal learning rate is inversely proportional to the noise scale" (the original
linear scaling rule, Malladi et al. 2022, their Sec. 2.2). That is the line r = α·x through
the origin with x = 1/σ (``fit_variable="inverse_noise"``, DP-SGD at a fixed T:
``full_batch=False``, ``steps_range=(T, T)``). Each sweep estimates α by rᵢ/xᵢ; r* = x_f·α̂
with α̂ their geometric mean (one of them when the other sweep failed). Measured on MNIST-1D
with ``random_kernels1d`` (benchmarks/results/lr_noise_landscape/lr_noise_landscape.md: DP-SGD, q = 0.1, T = 150,
3 seeds, 19 log-spaced η): the best η falls from 2.15 at σ = 4 to 1.0 at σ = 8 and 0.46 at
σ = 16, and on digits (64-unit MLP) from 0.68 to 0.46 and 0.15 — η* ∝ σ^(−1.1) over
σ ∈ [4, 16] on both, on a grid of 1/6 decade — but flatter below (MNIST-1D: 2.15 at σ = 2
too; digits: 1.0). Transferred from a sweep at σ ≈ 8 to a final σ ≈ 2.2, the rule overshoots
the best η by a factor ≈ 1.7 on both, where both curves are within 0.03 of their peak.
``sweep_draw="log_uniform"`` spreads the few sweep runs over the decades of η instead of
putting most of them in its top decade (uniform r).

Privacy impact: none. r* is a deterministic function of (r₁, r₂) — the r of the best run of
each sweep, chosen by the sweep runs' scores, which were already paid for in the plan
(their training in sweep₁/sweep₂, their noisy scores in ``Laplace(ε_s, 2n)``; with
``score_epsilon=None`` the validation split is declared public) — and of public constants
(x₁, x₂, x_f, c, r_min, r_max; x = 1/σ is public: the σ's are the plan's). The clamp and the
proportional fit read no other result and no data, so they are post-processing of the sweeps'
output (Dwork & Roth 2014, Prop. 2.1) and the plan, μ_t and every ε printed are unchanged. The
sweep draw law is public and its draws come from the searcher's secret generator, whatever
the law. With ``sweep_estimate="quadratic"`` r* is a function of every sweep run's r and
released score instead of the two best ones: the same released quantities, already in the
plan, so the same argument holds. With ``sweep_draw="refined"`` the second sweep's r's are
drawn in a window placed by the first sweep's released scores: each sweep run's noise, steps
and score release are fixed by the plan before any data is touched and its guarantee holds for
any learning rate, chosen adaptively or not: the composition theorems hold for adaptively
chosen mechanisms (Dwork & Roth 2014, Sec. 3.5; for RDP Mironov 2017, Prop. 1; for dominating
pairs and PLDs Zhu, Dong & Wang 2022, Thm. 10) as long as each one's dominating pair is fixed
in advance — here the plan's — so again nothing printed changes.

Longer than ~600 lines because it is one algorithm and one theorem (Panda et al. 2024, Thm.
4.1); splitting would separate the privacy argument from the code it covers. The rule's
variants, presets and the defaults read from the search space, which the argument does not
depend on, are in :mod:`~raydp_hpo.searchers.linear_scaling_options` (re-exported here).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from ray.tune.search import Searcher

from raydp_hpo._validation import coerce_enum, positive_float
from raydp_hpo.accounting.accountants import Accountant, calibrate_noise
from raydp_hpo.accounting.gdp import compose_mu, gdp_epsilon, gdp_mu
from raydp_hpo.accounting.mechanisms import Composition, Gaussian, Mechanism, SubsampledGaussian
from raydp_hpo.errors import BudgetTooSmallError, InvalidParameterError, SearchSpaceError
from raydp_hpo.searchers.base import (
    PRIVACY_KEYS,
    RESERVED_KEY,
    DPSearcher,
    Phase,
    PrivacyPlan,
    Release,
    finite_values,
    plan_epsilon,
)
from raydp_hpo.searchers.linear_scaling_options import (  # noqa: F401 (re-exported)
    DEFAULT_SWEEP_FRACTIONS,
    PRESETS,
    FitVariable,
    LinearScalingPreset,
    LineFit,
    SweepDraw,
    SweepEstimate,
    _constant,
    _lr_range_from,
    _optimizer_from,
    _pair,
    _sample_rate_from,
    _steps_from,
)
from raydp_hpo.trial.privacy import Optimizer

__all__ = ["LinearScalingSearch", "LinearScalingPreset", "PRESETS", "FitVariable", "LineFit",
           "SweepDraw", "SweepEstimate"]

PAPER = (
    "Panda et al. (2024), A New Linear Scaling Rule for Private Adaptive Hyperparameter "
    "Optimization, Algorithms 1-3 and Theorem 4.1 (mu_t = sqrt(n mu1^2 + n mu2^2 + mu_f^2)); "
    "GDP composition and conversion: Dong, Roth & Su (2022), Cor. 3.3 and 2.13"
)


class LinearScalingSearch(DPSearcher):
    """Panda et al. (2024) Algorithm 2 as a Ray Tune searcher.

    Args (beyond :class:`~raydp_hpo.searchers.base.DPSearcher`); the defaults are
    :class:`LinearScalingPreset` ``REFINED``, ``preset="paper"`` the paper's full-batch rule:
        preset: a :class:`LinearScalingPreset` (or its value); the settings given explicitly
            override its values.
        runs_per_sweep: n, runs per sweep (Alg. 3); default 3 (paper: 5).
        sweep_epsilons: (ε₁, ε₂), the per-run ε of the two sweeps at ``budget.delta``
            (paper 0.1, 0.2); μᵢ = gdp_mu(εᵢ, δ).
        sweep_epsilon_fractions: (ε₁, ε₂) as fractions of the budget's ε instead (default,
            when neither is given: 0.1 and 0.2); not with ``sweep_epsilons``.
        lr_range: (η_min, η_max); default: the bounds of the space's ``lr_key`` entry, else
            (1e-3, 1).
        steps_range: (T_min, T_max); default: DP-SGD (T, T) with T = ⌈epochs/q⌉ from the
            space's constant ``epochs``; full batch (10, 100).
        lr_key: config key of the learning rate η.
        full_batch: full-batch DP-GD (the paper) or DP-SGD at ``sample_rate`` (default).
        sample_rate: DP-SGD sample rate q; default: the space's constant ``sample_rate``, or
            its constant ``batch_size`` over ``dataset_size`` (an error names this setting
            when the space has neither).
        optimizer: optimizer for ``full_batch=False`` (sgd/momentum/adam); default: the
            space's constant ``optimizer`` if one of these, else sgd.
        fit_variable: abscissa of the line fit (see :class:`FitVariable`).
        max_extrapolation: c ≥ 1, r* is clamped to [min(r₁, r₂)/c, c·max(r₁, r₂)] (see the
            module docstring; post-processing, no privacy cost); ``None``: the paper's
            unclamped line (clipped to [r_min, r_max] only). Two-point line only: the
            proportional fit estimates no slope.
        line_fit: the line through both sweep points (paper) or through the origin (default;
            see :class:`LineFit`).
        sweep_draw: the law of r in a sweep run (see :class:`SweepDraw`).
        sweep_estimate: what the proportional fit reads from the sweeps, each sweep's best
            run (paper) or a quadratic fit to every sweep score (default; see
            :class:`SweepEstimate`).
        refine_decades: half-width, in decades of r, of the second sweep's window with
            ``sweep_draw="refined"`` (see :class:`SweepDraw`); ignored otherwise.

    The space holds only the other (fixed) hyperparameters as constants: Alg. 3 searches r
    alone. Keys it sets itself (``lr_key`` and the privacy keys: noise, batch, epochs,
    optimizer) never reach a trial: they supply the defaults above where used and are
    otherwise ignored with a warning, so one space serves every searcher. In full batch, μ_f
    is the largest value such that the plan is admissible and μ_t meets the budget
    under exact GDP conversion; it must be at least μ₂ (else the budget is refused). With
    ``score_epsilon`` set, the admissibility of the whole plan (including the 2n
    ``Laplace(score_epsilon)`` score releases) lowers μ_f further; μ_t (:attr:`total_mu`) is
    then the GDP parameter of the Gaussian part only, not a guarantee of the whole plan.
    """

    algorithm = "linear_scaling"
    paper = PAPER
    _requires_epochs = False
    preset_type = LinearScalingPreset
    presets = PRESETS
    _alternative_settings = (frozenset({"sweep_epsilons", "sweep_epsilon_fractions"}),)

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        runs_per_sweep: int = 3,
        sweep_epsilons: tuple[float, float] | None = None,
        sweep_epsilon_fractions: tuple[float, float] | None = None,
        lr_range: tuple[float, float] | None = None,
        steps_range: tuple[int, int] | None = None,
        lr_key: str = "lr",
        full_batch: bool = False,
        sample_rate: float | None = None,
        optimizer: Optimizer | str | None = None,
        fit_variable: FitVariable | str = FitVariable.INVERSE_NOISE,
        max_extrapolation: float | None = 2.0,
        line_fit: LineFit | str = LineFit.PROPORTIONAL,
        sweep_draw: SweepDraw | str = SweepDraw.REFINED,
        sweep_estimate: SweepEstimate | str = SweepEstimate.QUADRATIC,
        refine_decades: float = 1.0,
        **kwargs: Any,
    ) -> None:
        space = dict(param_space) if isinstance(param_space, Mapping) else {}
        own = [k for k in (*PRIVACY_KEYS, lr_key) if k in space]
        # One space for every searcher: keys this algorithm sets itself never reach a trial
        # (so the plan below is what the trials run); they only supply defaults below.
        super().__init__(
            {k: v for k, v in space.items() if k not in own}
            if isinstance(param_space, Mapping) else param_space,
            **kwargs,
        )
        for key, value in self._space.items():
            vals = finite_values(key, value)
            if vals is None or len(vals) != 1:
                raise SearchSpaceError(
                    f"search space key {key!r} varies; Panda et al. (2024) Alg. 3 searches only "
                    f"r = η·T — fix {key!r} to a constant"
                )
        full_batch = bool(full_batch)
        used: set[str] = set()
        if not full_batch and sample_rate is None:
            sample_rate = _sample_rate_from(space, self._dataset_size, used)
        if not full_batch and (isinstance(sample_rate, bool)
                               or not isinstance(sample_rate, (int, float))
                               or not 0 < sample_rate < 1):
            raise InvalidParameterError(
                f"full_batch=False needs sample_rate in (0, 1), got {sample_rate=!r}"
            )
        q = 1.0 if full_batch else float(sample_rate)  # type: ignore[arg-type]
        if steps_range is None:
            steps_range = (10, 100) if full_batch else _steps_from(space, q, used)
        if lr_range is None:
            lr_range = _lr_range_from(space, lr_key, used)
        if optimizer is None:
            optimizer = Optimizer.GD if full_batch else _optimizer_from(space, used)
        ignored = [k for k in own if k not in used]
        if ignored:
            warnings.warn(
                f"linear scaling sets {', '.join(map(repr, ignored))} itself (r = η·T, the noise "
                "per sweep, the batch); it ignores them in the search space (set them with "
                "lr_range / steps_range / sweep_epsilons / sample_rate)",
                UserWarning, stacklevel=3,
            )
        if isinstance(runs_per_sweep, bool) or not isinstance(runs_per_sweep, int) or runs_per_sweep < 1:
            raise InvalidParameterError(f"runs_per_sweep must be an integer >= 1, got {runs_per_sweep=!r}")
        eps1, eps2 = self._sweep_epsilons(sweep_epsilons, sweep_epsilon_fractions)
        lr_min, lr_max = (float(x) for x in lr_range)
        if not (0 < lr_min <= lr_max):
            raise InvalidParameterError(f"lr_range must satisfy 0 < min <= max, got {lr_range=!r}")
        t_min, t_max = steps_range
        if not (isinstance(t_min, int) and isinstance(t_max, int) and 1 <= t_min <= t_max):
            raise InvalidParameterError(
                f"steps_range must be integers 1 <= T_min <= T_max, got {steps_range=!r}"
            )
        self._optimizer = Optimizer.GD if full_batch else Optimizer(str(getattr(optimizer, "value", optimizer)).lower())
        if not full_batch and self._optimizer in (Optimizer.GD, Optimizer.ADADP):
            raise InvalidParameterError(
                f"optimizer must be sgd, momentum or adam with full_batch=False, got {optimizer!r}"
            )
        if max_extrapolation is not None and (
            isinstance(max_extrapolation, bool)
            or not isinstance(max_extrapolation, (int, float))
            or not math.isfinite(max_extrapolation)
            or max_extrapolation < 1
        ):
            raise InvalidParameterError(
                f"max_extrapolation must be a finite number >= 1 (or None for the paper's "
                f"unclamped line), got {max_extrapolation=!r}"
            )
        self._max_extrapolation = None if max_extrapolation is None else float(max_extrapolation)
        self._n = runs_per_sweep
        self._full_batch = full_batch
        self._q = q
        self._lr_key = lr_key
        self._lr_range = (lr_min, lr_max)
        self._steps_range = (t_min, t_max)
        self._r_range = (lr_min * t_min, lr_max * t_max)
        self._fit = coerce_enum(FitVariable, fit_variable, "fit_variable")
        self._line_fit = coerce_enum(LineFit, line_fit, "line_fit")
        self._sweep_draw = coerce_enum(SweepDraw, sweep_draw, "sweep_draw")
        self._sweep_estimate = coerce_enum(SweepEstimate, sweep_estimate, "sweep_estimate")
        if (self._sweep_estimate is SweepEstimate.QUADRATIC
                and self._line_fit is not LineFit.PROPORTIONAL):
            raise InvalidParameterError(
                "sweep_estimate='quadratic' needs line_fit='proportional' (it estimates the "
                "common peak of the sweeps in log(r/x)); the two-point line reads each sweep's "
                "best run: add sweep_estimate='best' (or use preset='paper')"
            )
        if self._sweep_draw is SweepDraw.REFINED and self._line_fit is not LineFit.PROPORTIONAL:
            raise InvalidParameterError(
                "sweep_draw='refined' needs line_fit='proportional' (it carries the first "
                "sweep's best r to the second sweep by r ∝ x); the two-point line fits a slope "
                "to two independent sweeps: use 'uniform', 'log_uniform' or 'stratified' (or "
                "preset='paper')"
            )
        self._refine_decades = positive_float("refine_decades", refine_decades)
        if self._full_batch and self._fit is FitVariable.INVERSE_NOISE:
            raise InvalidParameterError(
                "fit_variable='inverse_noise' needs full_batch=False (DP-SGD at a fixed σ per "
                "sweep); in full batch σ = √T/μ changes with each run's T — use "
                "fit_variable='mu' (1/σ ∝ μ at a fixed T), or preset='paper' for the paper's "
                "full-batch rule"
            )
        if not self._full_batch and self._fit is FitVariable.MU:
            raise InvalidParameterError(
                "fit_variable='mu' needs full_batch=True: a DP-SGD run (full_batch=False) has "
                "no exact μ; use fit_variable='epsilon' or 'inverse_noise'"
            )
        delta = self._budget.delta
        self._sweep_eps = (eps1, eps2)
        self._mus = (gdp_mu(eps1, delta), gdp_mu(eps2, delta))
        self._mu_total_target = gdp_mu(self._budget.epsilon, delta)

        if self._full_batch:
            self._sigmas: tuple[float, float] | None = None
            self._mu_f, self._sigma_f = self._choose_final_full_batch(), None
            final_eps = gdp_epsilon(self._mu_f, delta)
        else:
            self._sigmas = tuple(  # type: ignore[assignment]
                calibrate_noise(e, delta, self._q, t_max, Accountant.RDP)
                for e in self._sweep_eps
            )
            self._sigma_f = self._choose_final_subsampled()
            self._mu_f = math.nan
            final_eps = plan_epsilon(SubsampledGaussian(self._sigma_f, self._q, t_max), delta)
        self._final_eps = final_eps
        mech = self._plan_mechanism()
        self._require_admissible(mech, what="linear scaling")
        per_run = t_max * self._q * self._dataset_size
        self._plan = self._make_plan(
            mechanism=mech,
            base=self._final_run_mechanism(),
            description=(
                f"one Composition charge: {self._n} runs at ε={eps1:g}, {self._n} at ε={eps2:g} "
                f"and a final run at ε={final_eps:.4g} (each at δ={delta:g})"
                + self._if_scored(f", plus {2 * self._n} noisy sweep scores {self._score_text()}")
                + (
                    f"; μ_t = {self.total_mu:.4g} of the Gaussian part (Panda et al. Thm. 4.1)"
                    if self._full_batch
                    else ""
                )
            ),
            expected_gradient_evaluations=(2 * self._n + 1) * per_run,
        )
        self._sweeps: tuple[list[str], list[str]] = ([], [])
        self._r_of: dict[str, float] = {}
        self._final: str | None = None
        self._fit_result: dict[str, float] = {}

    def _sweep_epsilons(
        self,
        absolute: tuple[float, float] | None,
        fractions: tuple[float, float] | None,
    ) -> tuple[float, float]:
        """(ε₁, ε₂) of the sweep runs: ``absolute``, or ``fractions`` of the budget's ε
        (default 0.1 and 0.2), rounded to 12 digits so that 0.1·3 is 0.3 exactly."""
        if absolute is not None and fractions is not None:
            raise InvalidParameterError(
                "give sweep_epsilons (each sweep run's ε) or sweep_epsilon_fractions (fractions "
                f"of the budget's ε), not both; got {absolute=!r}, {fractions=!r}"
            )
        if absolute is None:
            pair = _pair("sweep_epsilon_fractions", DEFAULT_SWEEP_FRACTIONS
                         if fractions is None else fractions)
            if not 0 < pair[0] < pair[1] < 1:
                raise InvalidParameterError(
                    "sweep_epsilon_fractions must satisfy 0 < f1 < f2 < 1 (fractions of the "
                    f"budget's ε), got {fractions=!r}"
                )
            eps = self._budget.epsilon
            return round(pair[0] * eps, 12), round(pair[1] * eps, 12)
        eps1, eps2 = _pair("sweep_epsilons", absolute)
        if not (0 < eps1 < eps2):
            raise InvalidParameterError(
                f"sweep_epsilons must satisfy 0 < ε1 < ε2, got sweep_epsilons={absolute!r}"
            )
        return eps1, eps2

    # ------------------------------------------------------------------ plan

    def _run_mechanism(self, level: int) -> Mechanism:
        if self._full_batch:
            return Gaussian(1.0 / self._mus[level], 1)
        assert self._sigmas is not None
        return SubsampledGaussian(self._sigmas[level], self._q, self._steps_range[1])

    def _final_run_mechanism(self, value: float | None = None) -> Mechanism:
        if self._full_batch:
            return Gaussian(1.0 / (self._mu_f if value is None else value), 1)
        sigma = self._sigma_f if value is None else value
        return SubsampledGaussian(sigma, self._q, self._steps_range[1])  # type: ignore[arg-type]

    def _sweep_mechanism(self, level: int) -> Mechanism:
        m = self._run_mechanism(level)
        if isinstance(m, Gaussian):
            return Gaussian(m.noise_multiplier, self._n)
        return Composition(tuple([m] * self._n))

    def _sweep_run_base(self, level: int) -> Mechanism:
        """What one sweep run executes: its training plus its noisy selection score."""
        return self._scored(self._run_mechanism(level))

    def _plan_mechanism(self, final_value: float | None = None) -> Composition:
        """Composition(sweep₁, sweep₂, [Laplace(ε_s, 2n)], final): the Gaussian parts are
        Panda et al.'s μ-GDP runs; the Laplace part is the sweep runs' noisy scores."""
        parts: list[Mechanism] = [self._sweep_mechanism(0), self._sweep_mechanism(1)]
        if self._score_epsilon is not None:
            parts.append(self._score_mechanism(2 * self._n))
        parts.append(self._final_run_mechanism(final_value))
        return Composition(tuple(parts))

    def _too_small(self, smallest_final: float) -> BudgetTooSmallError:
        eps = plan_epsilon(self._plan_mechanism(smallest_final), self._budget.delta)
        return BudgetTooSmallError(
            f"budget ε={self._budget.epsilon:g} at δ={self._budget.delta:g} is too small for "
            f"linear scaling with {self._n} runs per sweep at ε={self._sweep_eps}: the final run "
            f"would be less private-expensive than the second sweep. Use a budget of at least "
            f"ε={eps:.4g}, fewer runs per sweep or smaller sweep_epsilons"
            + ("." if self._score_epsilon is None else " or a smaller score_epsilon.")
        )

    def _choose_final_full_batch(self) -> float:
        mu1, mu2 = self._mus
        rest = self._mu_total_target**2 - self._n * (mu1**2 + mu2**2)
        if rest <= mu2**2:
            raise self._too_small(mu2)
        hi = math.sqrt(rest)  # exact GDP: μ_t = gdp_mu(ε, δ)
        if self._admissible(self._plan_mechanism(hi)):
            return hi
        lo = mu2
        if not self._admissible(self._plan_mechanism(lo)):
            raise self._too_small(mu2)
        while hi - lo > 1e-6 * hi:  # largest admissible μ_f (rounded down)
            mid = (lo + hi) / 2.0
            if self._admissible(self._plan_mechanism(mid)):
                lo = mid
            else:
                hi = mid
        return lo

    def _choose_final_subsampled(self) -> float:
        assert self._sigmas is not None
        sigma2 = self._sigmas[1]
        if not self._admissible(self._plan_mechanism(sigma2)):
            raise self._too_small(sigma2)
        # smallest σ_f with an admissible plan; ≤ σ₂ because σ₂ itself is admissible
        return min(
            sigma2,
            self._calibrate_noise(self._plan_mechanism, what="the final run of linear scaling"),
        )

    @property
    def total_mu(self) -> float:
        """μ_t = √(n·μ₁² + n·μ₂² + μ_f²) (Panda et al. 2024, Thm. 4.1); full batch only.

        This is the GDP parameter of the Gaussian (training) part of the plan; with
        ``score_epsilon`` set, the plan also holds 2n ``Laplace(score_epsilon)`` score
        releases that are not GDP-accounted here (the plan's RDP covers them)."""
        if not self._full_batch:
            raise InvalidParameterError("total_mu is defined for full-batch linear scaling only")
        mu1, mu2 = self._mus
        return compose_mu([mu1] * self._n + [mu2] * self._n + [self._mu_f])

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    # ------------------------------------------------------------------ search

    def decompose(self, r: float) -> tuple[float, int]:
        """Alg. 1, "decompose r into η, T without exceeding T_max or η_max": the paper's
        method 2 — T uniform over the integers keeping η = r/T within [η_min, η_max]."""
        lr_min, lr_max = self._lr_range
        t_min, t_max = self._steps_range
        lo = max(t_min, math.ceil(r / lr_max - 1e-12))
        hi = min(t_max, math.floor(r / lr_min + 1e-12))
        if lo > hi:  # r outside [r_min, r_max] (cannot happen after clipping); stay in range
            lo = hi = min(max(lo, t_min), t_max)
        steps = int(self._rng.integers(lo, hi + 1))
        return min(r / steps, lr_max), steps

    def _config(self, trial_id: str, r: float, level: int | None) -> dict[str, Any]:
        lr, steps = self.decompose(r)
        # every other key is a constant (checked in __init__): its one value, also where the
        # space spells it as a choice / grid of one (the CLI's model_kwargs), never the domain
        config = {k: finite_values(k, v)[0] for k, v in self._space.items()}  # type: ignore[index]
        config[self._lr_key] = lr
        config["optimizer"] = self._optimizer.value
        if self._full_batch:
            config["epochs"] = steps
            config["mu"] = self._mus[level] if level is not None else self._mu_f
        else:
            assert self._sigmas is not None
            config["sample_rate"] = self._q
            config["epochs"] = steps * self._q
            config["noise_multiplier"] = (
                self._sigmas[level] if level is not None else self._sigma_f
            )
        base = self._sweep_run_base(level) if level is not None else self._final_run_mechanism()
        config[RESERVED_KEY] = self._raydp(
            trial_id,
            base=base,
            data_view={"kind": "full"},
            phase=Phase.TUNE if level is not None else Phase.FINAL,
            # sweep scores feed Alg. 3's selection; the final run's score is read by nobody
            score_epsilon=self._score_epsilon if level is not None else None,
        )
        self._r_of[trial_id] = r
        return config

    def _suggest(self, trial_id: str) -> dict | str | None:
        for level in (0, 1):
            if len(self._sweeps[level]) < self._n:
                if (level == 1 and self._sweep_draw is SweepDraw.REFINED
                        and any(t in self._live for t in self._sweeps[0])):
                    return None  # the second sweep's window needs every first-sweep score
                r = self._draw_r(level, len(self._sweeps[level]))
                self._sweeps[level].append(trial_id)
                return self._issue(trial_id, self._config(trial_id, r, level))
        if self._final is not None:
            self._finished = True
            return Searcher.FINISHED
        if any(t in self._live for t in (*self._sweeps[0], *self._sweeps[1])):
            return None  # the final run needs both sweeps
        r_star = self._extrapolate()
        self._final = trial_id
        return self._issue(trial_id, self._config(trial_id, r_star, None))

    def _draw_r(self, level: int, k: int) -> float:
        """Alg. 3's r of the k-th run of sweep ``level``: uniform over [r_min, r_max] (the
        paper), log-uniform, log-stratified or refined (:class:`SweepDraw`); a public law,
        drawn from the searcher's secret generator."""
        r_min, r_max = self._r_range
        if self._sweep_draw is SweepDraw.UNIFORM:
            return float(self._rng.uniform(r_min, r_max))
        lo, hi = math.log(r_min), math.log(r_max)
        if self._sweep_draw is SweepDraw.LOG_UNIFORM:
            return float(math.exp(self._rng.uniform(lo, hi)))
        if self._sweep_draw is SweepDraw.REFINED and level == 1:
            lo, hi = self._refined_window()
        stratum = (k + self._rng.uniform(0.0, 1.0)) / self._n
        return float(min(max(math.exp(lo + (hi - lo) * stratum), r_min), r_max))

    def _refined_window(self) -> tuple[float, float]:
        """:class:`SweepDraw` ``REFINED``: the second sweep's [log r lo, log r hi], ± w
        decades around log(r₁·x₂/x₁) (r₁ the first sweep's best run), shifted inside
        [log r_min, log r_max] and cut to it; the whole range when the first sweep has no
        best run. Post-processing of released first-sweep scores."""
        lo, hi = math.log(self._r_range[0]), math.log(self._r_range[1])
        best = self._best_of(self._sweeps[0])
        if best is None:
            return lo, hi
        centre = math.log(self._r_of[best] * self._x(1) / self._x(0))
        half = self._refine_decades * math.log(10.0)
        w_lo, w_hi = centre - half, centre + half
        if w_lo < lo:
            w_lo, w_hi = lo, min(hi, lo + 2 * half)
        elif w_hi > hi:
            w_lo, w_hi = max(lo, hi - 2 * half), hi
        self._fit_result["refine_centre"] = math.exp(centre)
        return w_lo, w_hi

    def _x(self, level: int | None) -> float:
        if self._fit is FitVariable.MU:
            return self._mus[level] if level is not None else self._mu_f
        if self._fit is FitVariable.INVERSE_NOISE:
            assert self._sigmas is not None and self._sigma_f is not None
            return 1.0 / (self._sigmas[level] if level is not None else self._sigma_f)
        if level is not None:
            return self._sweep_eps[level]
        return self._final_eps

    def _extrapolate(self) -> float:
        """Alg. 2: r = α·x + b through (x₁, r₁), (x₂, r₂); r* = α·x_f + b, clamped to
        [min(r₁, r₂)/c, c·max(r₁, r₂)] (c = ``max_extrapolation``; the module docstring's
        robust rule, post-processing) and clipped to [r_min, r_max] (the T_max/η_max limits
        of Alg. 1). With ``line_fit="proportional"``: r* = x_f·(Πᵢ rᵢ/xᵢ)^{1/m} over the m
        sweeps that produced a best run (:class:`LineFit`), or, with
        ``sweep_estimate="quadratic"``, α̂ = exp(u*) from :meth:`_quadratic_log_alpha` when it
        finds a peak; then the same clip."""
        best = [self._best_of(s) for s in self._sweeps]
        rs = [self._r_of[b] if b is not None else None for b in best]
        r_min, r_max = self._r_range
        if self._line_fit is LineFit.PROPORTIONAL and any(r is not None for r in rs):
            # r = α·x through the origin: α̂ = geometric mean of rᵢ/xᵢ over the sweeps that
            # produced a best run; r* = α̂·x_f (the clamp is for a fitted slope: not used)
            xf = self._x(None)
            ratios = [r / self._x(level) for level, r in enumerate(rs) if r is not None]
            alpha = math.exp(sum(math.log(a) for a in ratios) / len(ratios))
            # keep what the second sweep's draw recorded (SweepDraw.REFINED)
            self._fit_result = {k: v for k, v in self._fit_result.items() if k == "refine_centre"}
            if self._sweep_estimate is SweepEstimate.QUADRATIC:
                vertex = self._quadratic_log_alpha()
                self._fit_result["quadratic"] = float(vertex is not None)
                if vertex is not None:
                    alpha = math.exp(vertex)
            r_star = alpha * xf
            self._fit_result.update({"alpha": alpha, "x_final": xf, "r_line": r_star})
            for level, r in enumerate(rs):
                if r is not None:
                    self._fit_result[f"r{level + 1}"] = r
                    self._fit_result[f"x{level + 1}"] = self._x(level)
        elif rs[0] is not None and rs[1] is not None:
            x1, x2, xf = self._x(0), self._x(1), self._x(None)
            slope = (rs[1] - rs[0]) / (x2 - x1)
            intercept = rs[0] - slope * x1
            r_star = slope * xf + intercept
            self._fit_result = {
                "r1": rs[0],
                "r2": rs[1],
                "slope": slope,
                "intercept": intercept,
                "x1": x1,
                "x2": x2,
                "x_final": xf,
                "r_line": r_star,
            }
            c = self._max_extrapolation
            if c is not None:
                lo, hi = min(rs[0], rs[1]) / c, c * max(rs[0], rs[1])
                r_star = min(max(r_star, lo), hi)
                self._fit_result["clamped"] = float(r_star != self._fit_result["r_line"])
        elif rs[0] is not None or rs[1] is not None:  # one sweep failed: keep the other's r
            r_star = rs[0] if rs[0] is not None else rs[1]  # type: ignore[assignment]
        else:  # every sweep run failed: a data-independent default
            r_star = math.sqrt(r_min * r_max)
        r_star = min(max(float(r_star), r_min), r_max)  # type: ignore[arg-type]
        self._fit_result["r_star"] = r_star
        return r_star

    def _quadratic_log_alpha(self) -> float | None:
        """:class:`SweepEstimate` ``QUADRATIC``: the vertex u* of the least-squares fit
        y = a_sweep + b·u + c·u², u = log(r/x), over every completed sweep run's score,
        clipped to [min u, max u]; ``None`` (fall back to the best runs) when the fit has no
        degree of freedom, is rank-deficient or has no peak. Post-processing of the released
        scores and of the r's the searcher drew (module docstring)."""
        rows: list[tuple[int, float, float]] = []
        for level, ids in enumerate(self._sweeps):
            for tid in ids:
                value = self._results.get(tid)
                if value is not None:
                    u = math.log(self._r_of[tid] / self._x(level))
                    rows.append((level, u, value if self._mode == "max" else -value))
        levels = sorted({level for level, _, _ in rows})
        if len(rows) < len(levels) + 3:
            return None
        design = np.array([[float(level == lv) for lv in levels] + [u, u * u]
                           for level, u, _ in rows])
        y = np.array([v for _, _, v in rows])
        coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
        b, c = float(coef[-2]), float(coef[-1])
        if rank < design.shape[1] or not (math.isfinite(b) and math.isfinite(c)) or c >= 0:
            return None
        us = [u for _, u, _ in rows]
        return min(max(-b / (2.0 * c), min(us)), max(us))

    def release(self) -> Release:
        extras: dict[str, Any] = {
            "expected_gradient_evaluations": self._plan.expected_gradient_evaluations,
            "sweep_epsilons": self._sweep_eps,
            "final_epsilon": self._final_eps,
            "fit_variable": self._fit.value,
            "line_fit": self._line_fit.value,
            "sweep_draw": self._sweep_draw.value,
            "sweep_estimate": self._sweep_estimate.value,
            **({"refine_decades": self._refine_decades}
               if self._sweep_draw is SweepDraw.REFINED else {}),
            "max_extrapolation": self._max_extrapolation,
            **self._fit_result,
        }
        if self._full_batch:
            extras.update({"mu1": self._mus[0], "mu2": self._mus[1], "mu_f": self._mu_f,
                           "mu_total": self.total_mu})
        return self._release_final_run(self._final, extras)
