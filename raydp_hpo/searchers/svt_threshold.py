"""Constant-overhead SVT hyperparameter tuning: Ding et al., Algorithm 1.

Algorithm 1 (lines cited):

* 1–11: partition D_train into k disjoint parts; for every candidate s ∈ S train one model per
  part (non-private ``Train`` or ``PrivTrain``) and average the validation accuracies:
  u_s = (1/k)·Σᵢ u_s^(i). Here each candidate is ONE trial with data view ``partitions``; the
  trial reports the mean accuracy as the metric. Lemma 2: the ℓ₁ sensitivity of u_s is 1/k
  (adding/removing one training record changes one partition's model, whose accuracy lies in
  [0, 1]). For that every partition's accuracy must lie in [0, 1] on its own: ``train_dp``
  clips each model's correct count to the declared validation size before averaging
  (:func:`~raydp_hpo.trainables.training.validation_count`; clipping only the average is not
  enough when the realised validation split is larger than declared), and the searcher clips
  the reported utility to [0, 1] (a user trainable must report a utility of that form).
* 12–34: AboveThreshold rounds with the elastic step: û = u + step·g + Lap(2/(kϵ));
  for s in order, γ_s ~ Lap(4/(kϵ)); the first s with u_s + γ_s ≥ û is recorded,
  u ← u + g·step, step ← 2·step; if none passes, step ← ⌊step/2⌋; stop when step = 0.
* 35: θ* = PrivateTrain(D_train, S_{s*}, ε, δ): one final DP run on the full data.

Privacy: each round is ϵ-DP (Ding et al., Thm. 3 part I: threshold noise Lap(2Δ/ϵ) and query
noise Lap(4Δ/ϵ) with Δ = 1/k, the AboveThreshold of Dwork et al. 2009). Deviation for a fixed
plan: rounds are capped at T_max, so by basic composition (Ding et al., Thm. 1) the selection
is at most T_max·ϵ-DP with no δ' term (their Thm. 3's δ' only pays for the unbounded number of
rounds); the plan is ``Composition(PureDP(ϵ, count=T_max), final)`` charged up front. When the
cap is hit, the current s* is returned (post-processing).

Selection scores: candidates report their raw partition-averaged utility
(``score_epsilon=None``) because the AboveThreshold noise is what privatises it; the searcher
reads a candidate's utility *only* inside :func:`above_threshold_rounds` (through the noisy
comparisons). Nothing else — release, extras, fallbacks — depends on a raw utility; the
number of rounds run is kept private. The final run's score is read by no selection.

Choosing k, ϵ, g, T_max (measured in benchmarks/svt_diagnosis.py). A round compares
u_s + Lap(4/(kϵ)) with u + step·g + Lap(2/(kϵ)); utilities are accuracies in [0, 1], so with
k·ϵ ≈ 2 (e.g. k = 20, ϵ = 0.1) the query noise has sd 2.8 and s* is close to a uniform pick —
the benchmark's SVT then did no better than one-shot random. Ding et al. (Fig. 3) ask for
k·ϵ ≥ 5. Under RDP a pure ϵ-DP round costs ρ = ϵ²/2, so for a fixed selection budget fewer,
stronger rounds are better than many weak ones; g and u0 should let the threshold
u0 + g·(2^t − 1) reach the top of the utility range within T_max rounds (u0 = chance accuracy
is a public lower bound). Even then a record's influence on a whole partition model (sensitivity
1/k) makes SVT far noisier than a Laplace-noised validation score (sensitivity 1/n_val) unless
the data allow a large k.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher

from raydp_hpo.accounting.mechanisms import Composition, Mechanism, PureDP
from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.searchers.base import (
    RESERVED_KEY,
    DPSearcher,
    Phase,
    PrivacyPlan,
    Release,
    finite_grid,
    plan_epsilon,
)

__all__ = ["SVTThresholdSearch", "above_threshold_rounds"]

PAPER = (
    "Ding, Wu, Xu & Pan, Constant-overhead Differentially Private Hyperparameter Tuning, "
    "Algorithm 1, Lemma 2 (sensitivity 1/k), Theorem 3 (each round eps-DP) with rounds capped "
    "at T_max and basic composition (their Theorem 1)"
)


def above_threshold_rounds(
    utilities: list[float],
    *,
    rng: Any,
    num_partitions: int,
    round_epsilon: float,
    granularity: float,
    u0: float,
    max_rounds: int,
) -> tuple[int | None, int]:
    """Lines 12–34 of Ding et al. Algorithm 1 with at most ``max_rounds`` rounds.

    Returns (index of s* or ``None`` when no candidate ever passed, rounds run).
    """
    scale_threshold = 2.0 / (num_partitions * round_epsilon)
    scale_query = 4.0 / (num_partitions * round_epsilon)
    s_star: int | None = None
    u, step, rounds = u0, 1, 0
    while step != 0 and rounds < max_rounds:
        rounds += 1
        u_hat = u + step * granularity + rng.laplace(0.0, scale_threshold)
        accumulated = False
        # The paper asks whether *some* configuration passes; it does not fix a scan order.
        # A fixed order favours the first candidates whenever the noise dominates (e.g. the
        # smallest learning rate of a sorted grid), so each round scans in a fresh secret
        # random order: data-independent, so AboveThreshold's guarantee is unchanged.
        for s in rng.permutation(len(utilities)):
            s = int(s)
            u_s = utilities[s]
            gamma = rng.laplace(0.0, scale_query)
            if u_s + gamma >= u_hat:
                s_star = s
                u = u + granularity * step
                accumulated = True
                step = 2 * step
                break
        if not accumulated:
            step = step // 2
    return s_star, rounds


class SVTThresholdSearch(DPSearcher):
    """Ding et al. Algorithm 1 over a grid of candidates.

    Args (beyond :class:`~raydp_hpo.searchers.base.DPSearcher`):
        num_partitions: k (the paper suggests k ≥ 5/ϵ).
        round_epsilon: ϵ, the privacy of one AboveThreshold round.
        max_rounds: T_max; the plan charges T_max·ϵ whatever the number of rounds run.
        granularity: g ∈ (0, 1).
        u0: utility lower bound u₀ ∈ [0, 1).
        private_partitions: train the k partition models with DP (``PrivTrain``) instead of
            non-private ``Train``; either way the plan is the same (only the SVT touches u_s).

    Every key must be a constant, ``tune.choice`` or ``tune.grid_search``; candidates are
    their Cartesian product. The metric must be an accuracy in [0, 1] (``mode="min"`` uses
    1 − metric). The final run's noise is calibrated so the whole plan is admissible when the
    space sets none.
    """

    algorithm = "svt_threshold"
    paper = PAPER

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        num_partitions: int = 50,
        round_epsilon: float = 0.05,
        max_rounds: int = 20,
        granularity: float = 0.01,
        u0: float = 0.0,
        private_partitions: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(param_space, **kwargs)
        for name, value in (("num_partitions", num_partitions), ("max_rounds", max_rounds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if not (isinstance(round_epsilon, (int, float)) and round_epsilon > 0):
            raise InvalidParameterError(f"round_epsilon must be > 0, got {round_epsilon=!r}")
        if not (0 < granularity < 1):
            raise InvalidParameterError(f"granularity must be in (0, 1), got {granularity=!r}")
        if not (0 <= u0 < 1):
            raise InvalidParameterError(f"u0 must be in [0, 1), got {u0=!r}")
        if num_partitions > self._dataset_size:
            raise InvalidParameterError(
                f"num_partitions={num_partitions} exceeds dataset_size={self._dataset_size}"
            )
        self._candidates = finite_grid(
            self._space,
            "Ding et al.'s SVT search enumerates candidates: use tune.choice([...]), "
            "tune.grid_search([...]) or a constant",
        )
        self._k_parts = num_partitions
        self._round_eps = float(round_epsilon)
        self._max_rounds = max_rounds
        self._g = float(granularity)
        self._u0 = float(u0)
        self._private_partitions = bool(private_partitions)
        self._svt = PureDP(self._round_eps, count=max_rounds)
        self._sigma: float | None = None
        what = f"SVT search ({max_rounds} rounds × ϵ={round_epsilon:g}) plus the final run"
        if self._needs_noise_calibration():
            self._sigma = self._calibrate_noise(
                lambda s: self._plan_mechanism(self._base_mechanism({"noise_multiplier": s})),
                what=what,
            )
        base = self._base_mechanism(self._noise_extra())
        mech = self._plan_mechanism(base)
        self._require_admissible(mech, what=what)
        final_evals = self._max_gradient_evaluations(self._noise_extra())
        self._plan = self._make_plan(
            mechanism=mech,
            base=base,
            description=(
                f"one Composition charge: PureDP(ϵ={round_epsilon:g}, count=T_max={max_rounds}) "
                f"for the AboveThreshold rounds plus the final DP run; {len(self._candidates)} "
                f"candidates × {num_partitions} partitions "
                f"({'DP' if private_partitions else 'non-private'} partition training, not charged)"
            ),
            # every candidate trains k models on n/k records each (≈ one pass per candidate)
            expected_gradient_evaluations=(len(self._candidates) + 1) * final_evals,
        )
        self._partition_seed = self._secret_view_seed()
        self._candidate_trials: list[str] = []
        self._final: str | None = None
        self._selected: int | None = None
        self._rounds_run: int | None = None

    def _noise_extra(self) -> dict[str, Any] | None:
        return None if self._sigma is None else {"noise_multiplier": self._sigma}

    def _plan_mechanism(self, final: Mechanism) -> Composition:
        return Composition((self._svt, final))

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    @property
    def num_partitions(self) -> int:
        """k, the number of disjoint partitions each candidate is trained on."""
        return self._k_parts

    @property
    def utility_sensitivity(self) -> float:
        """ℓ₁ sensitivity of u_s: 1/k (Ding et al., Lemma 2)."""
        return 1.0 / self._k_parts

    def _with_noise(self, config: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(config)
        if self._sigma is not None:
            out["noise_multiplier"] = self._sigma
        return out

    def _utility(self, trial_id: str) -> float:
        v = self._results.get(trial_id)
        if v is None:  # failed trial: the lowest utility (a public, data-independent value)
            return 0.0
        u = v if self._mode == "max" else 1.0 - v
        return min(max(u, 0.0), 1.0)  # clip so Lemma 2's sensitivity 1/k holds

    def _suggest(self, trial_id: str) -> dict | str | None:
        i = len(self._candidate_trials)
        if i < len(self._candidates):
            config = self._with_noise(self._candidates[i])
            config[RESERVED_KEY] = self._raydp(
                trial_id,
                base=self._plan.base if self._private_partitions else None,
                data_view={
                    "kind": "partitions",
                    "num_partitions": self._k_parts,
                    "seed": self._partition_seed,
                },
                phase=Phase.TUNE,
                # the AboveThreshold noise privatises u_s (Lemma 2, Thm. 3): the candidate
                # reports its raw partition-averaged score, read only by the noisy comparisons
                score_epsilon=None,
                nonprivate=not self._private_partitions,
            )
            self._candidate_trials.append(trial_id)
            return self._issue(trial_id, config)
        if self._final is not None:
            self._finished = True
            return Searcher.FINISHED
        if any(t in self._live for t in self._candidate_trials):
            return None  # the SVT needs every candidate's utility
        utilities = [self._utility(t) for t in self._candidate_trials]
        selected, rounds = above_threshold_rounds(
            utilities,
            rng=self._rng,
            num_partitions=self._k_parts,
            round_epsilon=self._round_eps,
            granularity=self._g,
            u0=self._u0,
            max_rounds=self._max_rounds,
        )
        self._rounds_run = rounds
        self._selected = selected
        # s* = ∅ (nothing ever passed): fall back to a uniformly random candidate — a
        # data-independent choice given the SVT output, hence post-processing (a fixed first
        # candidate would systematically pick one end of a sorted grid).
        index = int(self._rng.integers(len(self._candidates))) if selected is None else selected
        config = self._with_noise(self._candidates[index])
        config[RESERVED_KEY] = self._raydp(
            trial_id,
            base=self._plan.base,
            data_view={"kind": "full"},
            phase=Phase.FINAL,
            score_epsilon=None,  # no selection reads the final run's score
        )
        self._final = trial_id
        return self._issue(trial_id, config)

    def release(self) -> Release:
        extras: dict[str, Any] = {
            "expected_gradient_evaluations": self._plan.expected_gradient_evaluations,
            "svt_selected": self._selected is not None,
            "svt_epsilon_charged": self._round_eps * self._max_rounds,
            "utility_sensitivity": self.utility_sensitivity,
        }
        return self._release_final_run(self._final, extras)

    def svt_epsilon(self) -> float:
        """ε of the plan under the RDP accountant (convenience)."""
        return plan_epsilon(self._plan.mechanism, self._budget.delta)  # type: ignore[arg-type]
