"""The total privacy budget (ε, δ) of a DP hyperparameter search."""

from __future__ import annotations

from dataclasses import dataclass

from raydp_hpo._validation import open_unit_float, positive_float

__all__ = ["PrivacyBudget"]


@dataclass(frozen=True)
class PrivacyBudget:
    """A total (ε, δ)-DP budget: everything a search does must fit inside it.

    Args:
        epsilon: ε > 0, finite.
        delta: δ in (0, 1). Choose δ well below 1/n for a dataset of n records.

    >>> PrivacyBudget(epsilon=3.0, delta=1e-5)
    PrivacyBudget(epsilon=3.0, delta=1e-05)
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_float("epsilon", self.epsilon))
        object.__setattr__(self, "delta", open_unit_float("delta", self.delta))

    def to_dict(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> PrivacyBudget:
        return cls(epsilon=data["epsilon"], delta=data["delta"])
