"""The options of :class:`~raydp_hpo.searchers.linear_scaling.LinearScalingSearch`: the
variants of Panda et al.'s (2024) rule (:class:`FitVariable`, :class:`LineFit`,
:class:`SweepEstimate`, :class:`SweepDraw`), its named presets (:class:`LinearScalingPreset`,
:data:`PRESETS`) and the defaults it reads from the search space (sample rate, T, learning-rate
range, optimizer) with an error naming the setting to add where the space cannot give one.
None of them changes the plan's privacy argument (see :mod:`raydp_hpo.searchers.linear_scaling`,
which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers.space import finite_values
from raydp_hpo.trial.privacy import Optimizer, dpsgd_steps

__all__ = ["FitVariable", "LineFit", "SweepEstimate", "SweepDraw", "DEFAULT_SWEEP_FRACTIONS",
           "LinearScalingPreset", "PRESETS"]


class FitVariable(Enum):
    """The abscissa of the line fit r = α·x + b.

    ``EPSILON`` (preset ``paper``): x is each run's ε at the budget's δ — the paper's Sec. 4.2 text
    ("fit a line to (ε₁, r(ε₁)), (ε₂, r(ε₂))", ε₁ = 0.1, ε₂ = 0.2). ``MU``: x = μ, as written in
    Algorithm 2 ("given (μ₁, r₁), (μ₂, r₂)"; "r* = αμ_f + b"); full batch only (a DP-SGD run
    has no exact μ). ``INVERSE_NOISE``: x = 1/σ, the run's noise multiplier — the "original
    linear scaling rule" Panda et al. build on (Sec. 2.2: "the optimal learning rate is
    inversely proportional to the noise scale", Malladi et al. 2022); DP-SGD
    (``full_batch=False``) only, where σ is fixed per sweep (in full batch σ = √T/μ varies with
    the T each run draws; at a fixed T, 1/σ ∝ μ: use ``MU``).
    """

    EPSILON = "epsilon"
    MU = "mu"
    INVERSE_NOISE = "inverse_noise"


class LineFit(Enum):
    """How r* is read off the two sweep points (xᵢ, rᵢ).

    ``TWO_POINT`` (preset ``paper``): Panda et al. Alg. 2, the line through both points, r* = α·x_f + b
    (clamped, see ``max_extrapolation``). ``PROPORTIONAL``: the line through the origin,
    r = α·x — Panda et al.'s Prop. 2.1(a) ("fix T, reduce σ, increase η") with the original
    linear scaling rule η* ∝ 1/σ; each sweep gives one estimate of α, rᵢ/xᵢ, and r* is their
    geometric mean times x_f: r* = x_f·(r₁/x₁ · r₂/x₂)^{1/2}. No slope is estimated from two
    noisy points, so nothing is divided by the small x₂ − x₁ (the failure the clamp guards
    against); the extrapolation factor x_f/xᵢ is a public constant.
    """

    TWO_POINT = "two_point"
    PROPORTIONAL = "proportional"


class SweepEstimate(Enum):
    """What a proportional fit reads from the sweeps (``line_fit="proportional"`` only).

    ``BEST`` (preset ``paper``): Alg. 3 — each sweep's best run; α̂ = (Πᵢ rᵢ/xᵢ)^{1/m}.
    ``QUADRATIC``: every completed sweep run's (noisy) score. Under the proportional rule
    every sweep peaks at the same u = log(r/x) = log α, at its own level, so a least-squares
    fit of y = a_sweep + b·u + c·u² (one intercept per sweep, shared b and c) to the 2n
    scores estimates log α by the vertex u* = −b/(2c), clipped to the u's the sweeps tried.
    It needs at least one degree of freedom (≥ m + 3 scores for m sweeps with a score), a
    full-rank design and a peak (c < 0 when maximising, c > 0 when minimising); otherwise it
    falls back to ``BEST``. The argmax of n noisy runs moves with the luck of one run; the
    vertex uses every score, which the plan has already paid for. Measured at ε = 3 (five
    fresh 20-seed runs of ``benchmarks/privacy_utility.py``, DP-SGD, 3 runs per sweep at 0.1ε
    and 0.2ε), paired over the 100 seeds: +0.020 [+0.008, +0.032] test accuracy over ``BEST``
    on MNIST-1D, +0.007 [−0.006, +0.020] on digits.
    """

    BEST = "best"
    QUADRATIC = "quadratic"


class SweepDraw(Enum):
    """The law of r in a sweep run (Alg. 3).

    ``UNIFORM`` (preset ``paper``): the paper's "r uniform in [r_min, r_max]". ``LOG_UNIFORM``:
    log r uniform over the same range — the usual prior for a learning rate spanning several
    decades (with lr ∈ [10⁻³, 10] and T fixed, a uniform r puts 90% of the runs at lr > 1).

    ``STRATIFIED``: log r stratified — the k-th of a sweep's n runs draws log r uniformly from
    the k-th of n equal sub-intervals of [log r_min, log r_max] (one-dimensional Latin
    hypercube sampling, McKay, Beckman & Conover 1979): the same marginal law per run as
    ``LOG_UNIFORM``, but n runs can no longer cluster and leave a decade untried, so every
    sweep spans the range. ``REFINED``: the first sweep ``STRATIFIED`` over the whole range;
    the second sweep ``STRATIFIED`` over a window of ± ``refine_decades`` decades of r centred
    on the first sweep's best run carried to the second sweep's x by the proportional rule,
    r_c = r₁·x₂/x₁ (shifted inside [r_min, r_max] when it overflows; the whole range when
    every first-sweep run failed). Coarse to fine: the cheap first sweep finds the decade,
    the second spends its runs around it. ``line_fit="proportional"`` only. The second sweep
    starts once every first-sweep run has reported. Privacy: the window is a function of the
    released (already charged) first-sweep scores and the searcher's secret draws, and a
    sweep run's guarantee holds for whatever learning rate it trains with (its noise and
    steps are the plan's), so it is post-processing; the plan is unchanged. Measured at ε = 3
    (``benchmarks/privacy_utility.py``, DP-SGD, 3 runs per sweep at 0.1ε and 0.2ε, quadratic
    estimate, ± 1 decade; four fresh 20-seed runs, two pre-registered), paired over the 80
    seeds: +0.027 [+0.015, +0.038] test accuracy over ``LOG_UNIFORM`` on MNIST-1D and +0.039
    [+0.023, +0.056] on digits.
    """

    UNIFORM = "uniform"
    LOG_UNIFORM = "log_uniform"
    STRATIFIED = "stratified"
    REFINED = "refined"


#: Default (ε₁, ε₂) of the sweep runs as fractions of the budget's ε (the benchmark's setting).
DEFAULT_SWEEP_FRACTIONS = (0.1, 0.2)


class LinearScalingPreset(Enum):
    """Named settings of :class:`LinearScalingSearch` (``preset=`` in ``search_kwargs`` or an
    experiment file's ``search.preset``); settings given explicitly override a preset's.

    ``REFINED`` (the constructor's defaults): ``linear_scaling_refined`` of
    ``benchmarks/privacy_utility.py`` — DP-SGD at the space's sample rate and a fixed
    T = ⌈epochs/q⌉, 3 runs per sweep at 0.1·ε and 0.2·ε, the proportional rule in 1/σ, the
    quadratic sweep estimate and coarse-to-fine sweeps (± 1 decade). At ε = 3 it went 93%
    [89%, 96%] (MNIST-1D) and 99% [97%, 101%] (digits) of the way from one-shot random search
    to the non-private-tuning oracle, four fresh 20-seed runs pooled
    (``benchmarks/results/privacy_utility/summary.md``), with 2·3 + 1 = 7 runs of one-shot's
    size; issue #31 reports 102% at 3× one-shot's compute on a held-out tabular task.
    ``PAPER``: Panda et al.'s full-batch rule, the defaults before issue #31 — DP-GD, 5 runs
    per sweep at ε₁ = 0.1 and ε₂ = 0.2 (absolute), r uniform, the line through both sweeps'
    best r clamped to a factor 2 (``max_extrapolation=None``: the paper's unclamped line),
    T ∈ [10, 100]; on the same held-out task 75% at 171× one-shot's gradient evaluations.
    """

    REFINED = "refined"
    PAPER = "paper"


PRESETS: dict[LinearScalingPreset, dict[str, Any]] = {
    LinearScalingPreset.REFINED: {
        "full_batch": False, "runs_per_sweep": 3, "sweep_epsilon_fractions": (0.1, 0.2),
        "fit_variable": "inverse_noise", "line_fit": "proportional", "sweep_draw": "refined",
        "sweep_estimate": "quadratic", "refine_decades": 1.0,
    },
    LinearScalingPreset.PAPER: {
        "full_batch": True, "runs_per_sweep": 5, "sweep_epsilons": (0.1, 0.2),
        "steps_range": (10, 100), "fit_variable": "epsilon", "line_fit": "two_point", "sweep_draw": "uniform",
        "sweep_estimate": "best", "max_extrapolation": 2.0,
    },
}


def _pair(name: str, value: Any) -> tuple[float, float]:
    try:
        first, second = (float(v) for v in value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a pair of numbers, got {value!r}") from None
    return first, second


def _constant(space: Mapping[str, Any], key: str) -> Any:
    """The one value of ``space[key]``; :class:`InvalidParameterError` naming the setting to
    add when it varies."""
    vals = finite_values(key, space[key])
    if vals is None or len(vals) != 1:
        setting = "steps_range=(T, T)" if key == "epochs" else "sample_rate=q"
        values = "a continuous domain" if vals is None else f"values {vals}"
        raise InvalidParameterError(
            f"linear scaling trains every DP-SGD run at one sample rate and one T, but the "
            f"search space's {key!r} varies ({values}): add the setting {setting} "
            f"(search_kwargs / search.settings) or fix {key!r} to a constant"
        )
    return vals[0]


def _sample_rate_from(space: Mapping[str, Any], dataset_size: int, used: set[str]) -> float:
    """DP-SGD's q from the space: its ``sample_rate``, or ``batch_size`` / the declared
    dataset size."""
    for key in ("sample_rate", "batch_size"):
        if key in space:
            value = _constant(space, key)
            used.add(key)
            return float(value) if key == "sample_rate" else float(value) / dataset_size
    raise InvalidParameterError(
        "linear scaling trains with DP-SGD by default and needs its sample rate: add the "
        "setting sample_rate=q (search_kwargs / search.settings), or a constant sample_rate "
        "(or batch_size) to the search space; preset='paper' trains full batch instead"
    )


def _steps_from(space: Mapping[str, Any], q: float, used: set[str]) -> tuple[int, int]:
    """(T, T) with T = ⌈epochs/q⌉ from the space's constant ``epochs``."""
    if "epochs" not in space:
        raise InvalidParameterError(
            "linear scaling trains every DP-SGD run for one number of steps T: add the "
            "setting steps_range=(T, T) (search_kwargs / search.settings), or a constant "
            "epochs to the search space (T = ⌈epochs / sample_rate⌉)"
        )
    epochs = _constant(space, "epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not epochs > 0:
        raise InvalidParameterError(f"search space 'epochs' must be a number > 0, got {epochs!r}")
    used.add("epochs")
    steps = dpsgd_steps(float(epochs), q)
    return steps, steps


def _lr_range_from(space: Mapping[str, Any], lr_key: str, used: set[str]) -> tuple[float, float]:
    """(η_min, η_max) from the space's learning rate (a domain's bounds, a finite set's
    extremes), else (1e-3, 1)."""
    value = space.get(lr_key)
    if value is not None:
        vals = finite_values(lr_key, value)
        if vals is not None and all(isinstance(v, (int, float)) for v in vals):
            used.add(lr_key)
            return float(min(vals)), float(max(vals))
        if isinstance(getattr(value, "lower", None), (int, float)) and isinstance(
                getattr(value, "upper", None), (int, float)):
            used.add(lr_key)
            return float(value.lower), float(value.upper)
    return 1e-3, 1.0


def _optimizer_from(space: Mapping[str, Any], used: set[str]) -> Optimizer:
    """The space's constant DP-SGD optimizer (sgd, momentum or adam), else sgd."""
    vals = finite_values("optimizer", space["optimizer"]) if "optimizer" in space else None
    if vals is not None and len(vals) == 1 and vals[0] in ("sgd", "momentum", "adam"):
        used.add("optimizer")
        return Optimizer(vals[0])
    return Optimizer.SGD
