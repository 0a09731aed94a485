"""Privacy mechanisms as immutable values.

Every privacy-consuming step of a search is described by one of these frozen dataclasses
*before* it runs, computed from configuration alone (never from data). Accountants
(:mod:`raydp_hpo.accounting.rdp`, :mod:`raydp_hpo.accounting.pld`, :mod:`raydp_hpo.accounting`) turn a mechanism into
an (ε, δ) statement; the ledger (:mod:`raydp_hpo.ledger`) admits or refuses it.

All mechanisms are stated for the add/remove-one neighbouring relation with sensitivity 1
(clipping norm C and noise standard deviation σ·C for DP-SGD).

Mechanisms serialise to plain JSON-able dicts (:func:`mechanism_to_dict`,
:func:`mechanism_from_dict`) so the ledger journal can store them exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from raydp_hpo._validation import (
    coerce_enum,
    positive_float,
    positive_int,
    unit_interval_float,
)
from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "Mechanism",
    "SubsampledGaussian",
    "Gaussian",
    "Laplace",
    "PureDP",
    "ApproxDP",
    "Composition",
    "WorstCase",
    "StoppingDistribution",
    "RandomStopping",
    "SubsampledTuning",
    "mechanism_to_dict",
    "mechanism_from_dict",
]


@dataclass(frozen=True)
class SubsampledGaussian:
    """DP-SGD: ``steps`` Poisson-subsampled Gaussian mechanisms (Abadi et al. 2016).

    Each step includes every record independently with probability ``sample_rate`` (q), clips
    per-example gradients to norm C and adds N(0, σ²C²) noise, σ = ``noise_multiplier``.
    RDP by Mironov, Talwar & Zhang (2019), PLD by Koskela et al. / dp-accounting.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", positive_float("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(
            self, "sample_rate", unit_interval_float("sample_rate", self.sample_rate)
        )
        object.__setattr__(self, "steps", positive_int("steps", self.steps))


@dataclass(frozen=True)
class Gaussian:
    """``count`` Gaussian mechanisms with sensitivity 1 and noise N(0, σ²).

    Full-batch DP-GD (sample rate 1, as in Panda et al. 2024) is ``Gaussian(σ, T)``, which is
    exactly μ-GDP with μ = √T / σ (Dong, Roth & Su 2022, Cor. 3.3).
    """

    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", positive_float("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "count", positive_int("count", self.count))


@dataclass(frozen=True)
class Laplace:
    """``count`` Laplace mechanisms with scale Δ/ε (each ε-DP; RDP by Mironov 2017, Prop. 6)."""

    epsilon: float
    count: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_float("epsilon", self.epsilon))
        object.__setattr__(self, "count", positive_int("count", self.count))


@dataclass(frozen=True)
class PureDP:
    """``count`` arbitrary ε-DP mechanisms (e.g. an AboveThreshold round of SVT).

    Only pure ε-DP is assumed, so its RDP is the generic bound
    min(ε, αε²/2) (Mironov 2017, Prop. 3; Bun & Steinke 2016, Prop. 3.3).
    """

    epsilon: float
    count: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_float("epsilon", self.epsilon))
        object.__setattr__(self, "count", positive_int("count", self.count))


@dataclass(frozen=True)
class ApproxDP:
    """``count`` arbitrary (ε, δ)-DP mechanisms.

    (ε, δ)-DP with δ > 0 has no RDP curve; the RDP accountant composes it on the side by basic
    composition (Dwork et al. 2006), the PLD accountant exactly through its worst-case PLD.
    """

    epsilon: float
    delta: float
    count: int = 1

    def __post_init__(self) -> None:
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (
            math.isfinite(eps) and eps >= 0
        ):
            raise InvalidParameterError(f"epsilon must be a finite number >= 0, got epsilon={eps!r}")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", unit_interval_float("delta", self.delta, include_zero=True))
        if self.delta >= 1.0:
            raise InvalidParameterError(f"delta must be < 1, got delta={self.delta!r}")
        object.__setattr__(self, "count", positive_int("count", self.count))


@dataclass(frozen=True)
class Composition:
    """Sequential (possibly adaptive) composition of ``mechanisms``."""

    mechanisms: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        mechs = tuple(self.mechanisms)
        if not mechs:
            raise InvalidParameterError("Composition needs at least one mechanism, got ()")
        for m in mechs:
            _check_mechanism("Composition.mechanisms", m)
        object.__setattr__(self, "mechanisms", mechs)


@dataclass(frozen=True)
class WorstCase:
    """The worst case over ``candidates``: the pointwise maximum of their RDP curves.

    Used as the base mechanism of a selection when the search space varies privacy
    hyperparameters (σ, sample rate, steps): every candidate is (α, max_i ε_i(α))-RDP, so the
    maximum is a valid RDP bound for a base trial drawn from the space (Papernot & Steinke
    2022, Sec. 3.5 "hyperparameters that affect privacy").
    """

    candidates: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        cands = tuple(self.candidates)
        if not cands:
            raise InvalidParameterError("WorstCase needs at least one candidate, got ()")
        for m in cands:
            _check_mechanism("WorstCase.candidates", m)
        object.__setattr__(self, "candidates", cands)


class StoppingDistribution(Enum):
    """Distribution of the secret number of trials K in random stopping.

    Papernot & Steinke (2022), Def. 1 and Sec. 3: the truncated negative binomial family
    D_{η,γ} (η = 1 geometric, η = 0 logarithmic, η ∈ (0, ∞) otherwise) and Poisson; plus
    binomial(m, p) (K ≤ m always: at most m trials), priced by privacy profiles (Koskela,
    Redberg & Wang 2024) and, on RDP, as the m-fold composition it post-processes.
    """

    GEOMETRIC = "geometric"
    TRUNCATED_NEGATIVE_BINOMIAL = "truncated_negative_binomial"
    POISSON = "poisson"
    LOGARITHMIC = "logarithmic"
    BINOMIAL = "binomial"


@dataclass(frozen=True)
class RandomStopping:
    """Papernot–Steinke private selection: run ``base`` K times, release only the best.

    K ~ ``distribution`` with E[K] = ``mean`` (for the truncated negative binomial, ``shape`` is
    η > 0; for the binomial, ``shape`` is the integer number of draws m ≥ ``mean``, and
    p = mean/m). The privacy cost is Papernot & Steinke (2022), Thm. 2 (truncated negative
    binomial, incl. geometric and logarithmic) and Thm. 6 (Poisson); for a pure ε-DP base
    the TNB selection is (2 + η)ε-DP (their Cor. 4; Liu & Talwar 2019 for geometric, 3ε).
    Binomial K: privacy profiles (:mod:`raydp_hpo.accounting.profiles`), and as a valid RDP (and pure)
    bound the m-fold composition of the base: best of K ~ Bin(m, p) runs has the output law of
    "run the base m times, keep each run independently with probability p, release the best
    kept one" (given the count, the kept runs are i.i.d. base runs), a post-processing of the
    m-fold composition (Mironov 2017, Prop. 1 and Lemma 2).
    """

    base: Mechanism
    distribution: StoppingDistribution
    mean: float
    shape: float | None = None

    def __post_init__(self) -> None:
        _check_mechanism("base", self.base)
        dist = coerce_enum(StoppingDistribution, self.distribution, "stopping distribution")
        object.__setattr__(self, "distribution", dist)
        mean = positive_float("mean", self.mean)
        if mean < 1:
            raise InvalidParameterError(
                f"mean (expected number of trials) must be >= 1, got mean={self.mean!r}"
            )
        object.__setattr__(self, "mean", mean)
        if dist is StoppingDistribution.BINOMIAL:
            m = self.shape
            if (
                isinstance(m, bool)
                or not isinstance(m, (int, float))
                or not math.isfinite(m)
                or m != int(m)
                or not mean <= m
            ):
                raise InvalidParameterError(
                    "the binomial distribution needs shape = m, the number of draws, an integer "
                    f">= mean; got shape={m!r} with mean={mean!r}"
                )
            object.__setattr__(self, "shape", float(int(m)))
        elif dist is StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL:
            if self.shape is None:
                raise InvalidParameterError(
                    "the truncated negative binomial needs shape η > 0, got shape=None"
                )
            object.__setattr__(self, "shape", positive_float("shape", self.shape))
        elif self.shape is not None:
            raise InvalidParameterError(
                f"shape is only used by the truncated negative binomial and binomial laws; "
                f"got shape={self.shape!r} with distribution={dist.value!r}"
            )

    @property
    def trials(self) -> int | None:
        """m, the number of draws of a binomial K (``None`` for the other laws)."""
        if self.distribution is StoppingDistribution.BINOMIAL:
            assert self.shape is not None
            return int(self.shape)
        return None

    @property
    def eta(self) -> float:
        """The dp-accounting ``shape`` (η) of the distribution: ∞ for Poisson. The binomial law
        is not in that family: asking its η raises."""
        if self.distribution is StoppingDistribution.BINOMIAL:
            raise InvalidParameterError(
                "a binomial K has no truncated-negative-binomial shape η; use .trials (m)"
            )
        if self.distribution is StoppingDistribution.GEOMETRIC:
            return 1.0
        if self.distribution is StoppingDistribution.LOGARITHMIC:
            return 0.0
        if self.distribution is StoppingDistribution.POISSON:
            return math.inf
        assert self.shape is not None
        return self.shape


@dataclass(frozen=True)
class SubsampledTuning:
    """Koskela & Kulkarni (2023) subsampled hyperparameter tuning.

    X₁ is a Poisson subsample of X with rate q = ``subsample_rate``; ``tuning`` (M₁, typically a
    :class:`RandomStopping`) runs on X₁ and ``final`` (M₂) on X ∖ X₁ with the transferred
    hyperparameters. The RDP of the whole is bounded at integer orders by the theorem of
    Koskela & Kulkarni, "Practical Differentially Private Hyperparameter Tuning with
    Subsampling" (2023, arXiv:2301.11989; the RDP bound for
    M(X) = (M₁(X₁), M₂(M₁(X₁), X ∖ X₁)) stated in their ICLR 2023 TrustML workshop version).
    """

    tuning: Mechanism
    final: Mechanism
    subsample_rate: float

    def __post_init__(self) -> None:
        _check_mechanism("tuning", self.tuning)
        _check_mechanism("final", self.final)
        q = self.subsample_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not (0.0 < q < 1.0):
            raise InvalidParameterError(
                f"subsample_rate must be in (0, 1), got subsample_rate={q!r}"
            )
        object.__setattr__(self, "subsample_rate", float(q))


Mechanism = Union[
    SubsampledGaussian,
    Gaussian,
    Laplace,
    PureDP,
    ApproxDP,
    Composition,
    WorstCase,
    RandomStopping,
    SubsampledTuning,
]

_MECHANISM_TYPES: dict[str, type] = {
    "subsampled_gaussian": SubsampledGaussian,
    "gaussian": Gaussian,
    "laplace": Laplace,
    "pure_dp": PureDP,
    "approx_dp": ApproxDP,
    "composition": Composition,
    "worst_case": WorstCase,
    "random_stopping": RandomStopping,
    "subsampled_tuning": SubsampledTuning,
}
_TYPE_NAMES = {cls: name for name, cls in _MECHANISM_TYPES.items()}


def _check_mechanism(name: str, value: object) -> None:
    if type(value) not in _TYPE_NAMES:
        raise InvalidParameterError(
            f"{name} must be a mechanism ({', '.join(c.__name__ for c in _TYPE_NAMES)}), "
            f"got {value!r}"
        )


def mechanism_to_dict(mechanism: Mechanism) -> dict[str, Any]:
    """Serialise a mechanism to a JSON-able dict (inverse of :func:`mechanism_from_dict`)."""
    _check_mechanism("mechanism", mechanism)
    kind = _TYPE_NAMES[type(mechanism)]
    if isinstance(mechanism, Composition):
        return {"type": kind, "mechanisms": [mechanism_to_dict(m) for m in mechanism.mechanisms]}
    if isinstance(mechanism, WorstCase):
        return {"type": kind, "candidates": [mechanism_to_dict(m) for m in mechanism.candidates]}
    if isinstance(mechanism, RandomStopping):
        return {
            "type": kind,
            "base": mechanism_to_dict(mechanism.base),
            "distribution": mechanism.distribution.value,
            "mean": mechanism.mean,
            "shape": mechanism.shape,
        }
    if isinstance(mechanism, SubsampledTuning):
        return {
            "type": kind,
            "tuning": mechanism_to_dict(mechanism.tuning),
            "final": mechanism_to_dict(mechanism.final),
            "subsample_rate": mechanism.subsample_rate,
        }
    return {"type": kind, **mechanism.__dict__}


def mechanism_from_dict(data: dict[str, Any]) -> Mechanism:
    """Rebuild (and re-validate) a mechanism serialised by :func:`mechanism_to_dict`."""
    if not isinstance(data, dict) or "type" not in data:
        raise InvalidParameterError(f"not a serialised mechanism: {data!r}")
    kind = data["type"]
    fields = {k: v for k, v in data.items() if k != "type"}
    if kind not in _MECHANISM_TYPES:
        raise InvalidParameterError(
            f"unknown mechanism type {kind!r}; known: {', '.join(_MECHANISM_TYPES)}"
        )
    if kind == "composition":
        return Composition(tuple(mechanism_from_dict(m) for m in fields["mechanisms"]))
    if kind == "worst_case":
        return WorstCase(tuple(mechanism_from_dict(m) for m in fields["candidates"]))
    if kind == "random_stopping":
        return RandomStopping(
            base=mechanism_from_dict(fields["base"]),
            distribution=StoppingDistribution(fields["distribution"]),
            mean=fields["mean"],
            shape=fields.get("shape"),
        )
    if kind == "subsampled_tuning":
        return SubsampledTuning(
            tuning=mechanism_from_dict(fields["tuning"]),
            final=mechanism_from_dict(fields["final"]),
            subsample_rate=fields["subsample_rate"],
        )
    try:
        return _MECHANISM_TYPES[kind](**fields)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise InvalidParameterError(f"bad fields for mechanism {kind!r}: {exc}") from None
