"""The privacy contract between a searcher and its trials: ``config["raydp"]``.

A searcher puts one :class:`RaydpSettings` into every trial config it suggests, under the
reserved key ``"raydp"``; the trial's privacy gate (:mod:`raydp_hpo.trainables.privacy_gate`) reads it
with :meth:`RaydpSettings.from_config` before touching any data. Hand-written configs may give
the same block as a plain dict with these keys.

Why an object and not a dict: Ray Tune flattens every dict in a config into separate keys of
every result row, CSV column, ``params.json`` and the dataframes it builds when a run ends.
The eleven keys of this block made that bookkeeping a measurable part of a short trial's cost
(``benchmarks/overhead.py``); as one object it is one value, written as its ``repr``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.ledger.plan_receipt import PlanReceipt

__all__ = ["RaydpSettings", "RAYDP_KEY"]

#: The reserved config key of the block.
RAYDP_KEY = "raydp"


@dataclass(frozen=True)
class RaydpSettings:
    """The validated ``config["raydp"]`` block of one trial.

    Attributes:
        ledger, namespace: the ledger actor the trial checks or charges.
        experiment: the experiment name (prefix of charge ids).
        charge: the trial charges its own mechanism under ``charge_id`` (an attempt suffix is
            added, so a fresh start always pays; see :func:`raydp_hpo.trainables.privacy_gate.admit`).
        covered_by: the plan charge id that covers the trial (its mechanism must be
            RDP-dominated by ``base``, the plan's per-trial mechanism as a dict).
        data_view: which part of the training data the trial sees (``{"kind": "full"}``, a
            subsample, partitions, ...).
        nonprivate: no noise, no clipping; only under a plan that privatises the trial's
            outputs itself (SVT), or for the non-private oracle baseline.
        phase: ``"tune"`` or ``"final"`` (informational).
        score_epsilon: ε of the Laplace-noised final validation score, or ``None`` (the
            score is not read by any selection, or the validation split is public).
        score_noise, score_delta: the score's noise (``"laplace"``, default, or
            ``"gaussian"`` with its δ_s); see :class:`raydp_hpo.trial.privacy.ScoreRelease`
            and :attr:`score_release`. Only read when ``score_epsilon`` is set.
        dataset_size: the declared **public** number of training records n of the whole
            training split (``None``: hand-written configs; the trainable then treats the
            realised size as public and says so). Every size-dependent quantity of a trial
            (q from ``batch_size``, the DP-SGD normaliser q·n) is computed from it, never from
            the realised, private sizes of the training set or of a partition.
        validation_size: the declared public number of validation records; the selection
            score is the noisy count of correct predictions divided by it.
        trial_index: the searcher's 0-based suggestion counter (public). With a user-given
            secret seed, a trial's training randomness is derived from (secret seed, index),
            so runs are reproducible without the seed ever entering a config.
        plan_receipt: where the admitted ``covered_by`` charge lies in the ledger's journal
            (:class:`~raydp_hpo.ledger.plan_receipt.PlanReceipt`), so the trial checks it locally
            instead of by a ledger round trip; only with ``covered_by``.

    The ``repr`` (what Ray Tune writes into ``params.json`` / ``result.json``) withholds the
    ``seed`` of the data view: it selects a secret subsample or partition.
    """

    ledger: str | None = None
    namespace: str = "raydp_hpo"
    experiment: str = "default"
    charge: bool = False
    charge_id: str | None = None
    covered_by: str | None = None
    base: dict[str, Any] | None = None
    data_view: dict[str, Any] | None = None
    nonprivate: bool = False
    phase: str = "tune"
    score_epsilon: float | None = None
    score_noise: str = "laplace"
    score_delta: float | None = None
    dataset_size: int | None = None
    validation_size: int | None = None
    trial_index: int | None = None
    plan_receipt: PlanReceipt | None = None

    def __repr__(self) -> str:
        # Tune formats a trial's config ~10 times (params.json, result rows, trial tables):
        # the text is made once. Every field is set at construction (frozen) and the dict
        # fields are never mutated in place (a new block is a new value).
        cached = self.__dict__.get("_repr")
        if cached is None:
            cached = self._format()
            object.__setattr__(self, "_repr", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_repr"}  # fields only

    def _format(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "data_view" and isinstance(value, Mapping) and "seed" in value:
                value = {**value, "seed": "<secret>"}
            parts.append(f"{f.name}={value!r}")
        return f"RaydpSettings({', '.join(parts)})"

    def __post_init__(self) -> None:
        if self.charge and not self.charge_id:
            raise InvalidParameterError("config['raydp']['charge'] is true but charge_id is empty")
        if self.charge and self.covered_by:
            raise InvalidParameterError("set either raydp.charge or raydp.covered_by, not both")
        if self.covered_by and self.base is None and not self.nonprivate:
            raise InvalidParameterError("raydp.covered_by needs raydp.base (the plan's mechanism)")
        if self.score_epsilon is not None:
            from raydp_hpo._validation import positive_float

            object.__setattr__(
                self, "score_epsilon",
                positive_float("raydp.score_epsilon", self.score_epsilon),
            )
        from raydp_hpo._validation import coerce_enum
        from raydp_hpo.trial.privacy import ScoreNoise, ScoreRelease

        noise = coerce_enum(ScoreNoise, self.score_noise, "raydp.score_noise").value
        object.__setattr__(self, "score_noise", noise)
        if self.score_epsilon is not None:  # validates noise and δ_s together
            ScoreRelease(self.score_epsilon, ScoreNoise(noise), self.score_delta)
        elif noise != ScoreNoise.LAPLACE.value or self.score_delta is not None:
            raise InvalidParameterError(
                f"raydp.score_noise={noise!r} / score_delta={self.score_delta!r} need "
                "raydp.score_epsilon: there is no noisy score without it"
            )
        if self.plan_receipt is not None:
            receipt = PlanReceipt.from_dict(self.plan_receipt)  # a dict from a hand-written block
            if self.covered_by is None:
                raise InvalidParameterError(
                    "raydp.plan_receipt is only for a trial covered by a plan (raydp.covered_by)"
                )
            object.__setattr__(self, "plan_receipt", receipt)
        if self.nonprivate and self.charge:
            raise InvalidParameterError("a nonprivate run cannot charge the ledger")
        from raydp_hpo._validation import positive_int

        for name in ("dataset_size", "validation_size"):  # declared public sizes
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_int(f"raydp.{name}", getattr(self, name)))
        if self.trial_index is not None and (
            isinstance(self.trial_index, bool)
            or not isinstance(self.trial_index, int)
            or self.trial_index < 0
        ):
            raise InvalidParameterError(
                f"raydp.trial_index must be an integer >= 0, got {self.trial_index!r}"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RaydpSettings:
        """The block of ``config``: a :class:`RaydpSettings` as is, or a dict validated into one
        (unknown keys are errors; ``None`` values mean the default). No block: the defaults
        (an unaccounted run)."""
        raw = config.get(RAYDP_KEY) or {}
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, Mapping):
            raise InvalidParameterError(
                f"config['raydp'] must be a RaydpSettings or a dict, got {raw!r}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise InvalidParameterError(
                f"unknown config['raydp'] keys {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**{k: v for k, v in raw.items() if v is not None or k == "ledger"})

    @property
    def score_release(self) -> Any:
        """The :class:`~raydp_hpo.trial.privacy.ScoreRelease` of the trial's selection score,
        or ``None`` when it releases no noisy score (``score_epsilon`` unset)."""
        if self.score_epsilon is None:
            return None
        from raydp_hpo.trial.privacy import ScoreNoise, ScoreRelease

        return ScoreRelease(self.score_epsilon, ScoreNoise(self.score_noise), self.score_delta)

    @property
    def needs_ledger(self) -> bool:
        return self.charge or self.covered_by is not None

    def to_dict(self) -> dict[str, Any]:
        """The block as a plain dict (every key)."""
        return dataclasses.asdict(self)
