"""Subsampled tuning with transfer: Koskela & Kulkarni (2023).

Algorithm (Koskela & Kulkarni 2023, "Our method", steps 1–4):

1. Poisson-subsample X₁ ⊂ X with rate q (every record independently; secret seed).
2. (θ₁, t₁) = M₁(X₁): Papernot–Steinke random stopping on X₁ (K ~ D secret, best trial).
3. Transfer t₁ → t₂: learning rate × n/m for (momentum) SGD where m = q·n is the expected
   subsample size; unchanged for Adam ("keeping the value of learning rate fixed lead to
   better results"); clipping C, noise σ and sampling ratio γ unchanged.
4. θ₂ = M₂(t₂, X ∖ X₁): one final DP training run on the complement.

Each trial on X₁ keeps the sampling ratio γ and σ and runs ⌈epochs/γ⌉ steps, so its mechanism
is exactly the base trial's ``SubsampledGaussian(σ, γ, ⌈epochs/γ⌉)`` (relative to X₁); the final
run has the same privacy settings. Tuning trials report their validation score with Laplace
noise (the selection reads it), so the tuning base is ``trial_mechanism(base, ε_s)``; the
final run's score is read by no selection and is not noised.

Privacy (add/remove one record; the train/validation split is stable per record, so a record
is either a training or a validation record). The Theorem of Koskela & Kulkarni (2023)
bounds M = (M₁(X₁), M₂(M₁(X₁), X ∖ X₁)) for a record of the set X that is Poisson-subsampled
into X₁; its conditions are that M₁ reads only X₁ and M₂ only X ∖ X₁ and M₁'s output.

* A **training** record: X is the training split; the validation split V is the same for
  both neighbours, so M₁ = random stopping over trials that train on X₁ and score on V is a
  mechanism of X₁ alone, and M₂ (the final run on X ∖ X₁ with the transferred
  hyperparameters) reads X ∖ X₁ and M₁'s output. The theorem applies with
  ``SubsampledTuning(tuning=RandomStopping(trial_mechanism(base, ε_s), D), final=base, q)``
  (the Laplace part does not depend on a training record: keeping it is conservative).
* A **validation** record is never subsampled, so the amplification does not apply to it.
  Only the noisy scores read it: M₁ is then Papernot–Steinke random stopping over
  ``Laplace(ε_s)`` (Thm. 2/6), and the final run reads it only through M₁'s output
  (post-processing).

The charge is the worst case of the two, ``WorstCase((SubsampledTuning(...),
RandomStopping(Laplace(ε_s), D)))``: for every order α the pointwise maximum of the two RDP
curves bounds the Rényi divergence of a neighbouring pair, whichever split its record is in
(:func:`raydp_hpo.accounting.rdp.koskela_kulkarni_rdp` at integer orders). With ``score_epsilon=None``
(validation declared public) the charge is the ``SubsampledTuning`` alone.

Compute: expected gradient evaluations (μ·q·n + n)·epochs against μ·n·epochs for random
stopping on the full data (their bound; the exact expectation uses (1 − q)·n for the final run):
μ/(μq + 1) = 5× fewer at μ = 10, q = 0.1. That is the *formula*; the wall time saved is
smaller, because a tuning trial keeps the number of steps ⌈epochs/γ⌉ and only its expected
batch shrinks by q, while per-step costs (noise over every parameter, the optimiser step,
Poisson sampling, hooks, Python) do not shrink with the batch. Measured
(``benchmarks/subsampled_transfer_cost.py``: μ = 10, q = 0.1, n = 20 001, γ = 0.02, CPU, one
thread): 1.73× (range 1.30–1.79) for the MLP and 2.88× (2.20–5.62) for the 1-D CNN, against
the formula's 5.00×; less at smaller n (1.07× and 1.26× at n = 4 766).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher

from raydp_hpo.accounting.mechanisms import (
    Mechanism,
    StoppingDistribution,
    SubsampledTuning,
    WorstCase,
)
from raydp_hpo.errors import InvalidParameterError, SearchSpaceError
from raydp_hpo.searchers.base import (
    RESERVED_KEY,
    DPSearcher,
    Phase,
    PrivacyPlan,
    Release,
    lr_transfer_factor,
)
from raydp_hpo.searchers.random_stopping import (
    _coerce_distribution,
    sample_stopping_k,
    stopping_mechanism,
)
from raydp_hpo.trial.privacy import privacy_from_config

__all__ = ["DEFAULT_SUBSAMPLE_RATE", "SubsampledTransferSearch"]

#: q when none is given (issue #42's defaults study, setting ``st_q03_k10``; see the class)
DEFAULT_SUBSAMPLE_RATE = 0.3

PAPER = (
    "Koskela & Kulkarni (2023), Practical Differentially Private Hyperparameter Tuning with "
    "Subsampling, Theorem (RDP of M = (M1(X1), M2(M1(X1), X \\ X1))), with M1 the random "
    "stopping of Papernot & Steinke (2022) Thm. 2/6"
)


class SubsampledTransferSearch(DPSearcher):
    """Koskela & Kulkarni (2023): random stopping on a q-subsample, final run on the rest.

    Args (beyond :class:`~raydp_hpo.searchers.base.DPSearcher`):
        subsample_rate: q ∈ (0, 1), the Poisson rate of X₁. Default 0.3, chosen by the
            defaults study (issue #42, rule 7.2 of
            ``benchmarks/results/defaults_study/preregistration.md``): on the worst
            dataset's 10th percentile of per-seed RERR, minimised over ε = 1, 3, 8 on
            MNIST-1D, digits and a tabular task, q = 0.3 (``st_q03_k10``) scored −0.10
            against −0.73 for the former default q = 0.1 (``st_q01_k10``), more than the
            0.05 tie margin (``summary.md`` there). Both are negative: the low tail of
            either falls below one-shot random search somewhere (q = 0.3 on MNIST-1D at
            ε = 1, q = 0.1 on digits at ε = 3); the method's case is its compute (≈ 3.7
            one-shot runs at q = 0.3, ≈ 1.9 at q = 0.1).
        distribution, mean, shape: the law of the secret number of tuning trials K
            (default: geometric, E[K] = 10, the law the study measured).
        lr_key: the learning-rate key transferred × n/m (absent from the space: no transfer).

    ``privacy_plan().base`` is the tuning trials' base (training + ``Laplace(score_epsilon)``);
    the final run is covered by the training mechanism alone (its block's ``base``).

    The space must give ``sample_rate`` (the DP-SGD sampling ratio γ is kept constant in the
    transfer, so it must not depend on the dataset size as ``batch_size`` would).
    """

    algorithm = "subsampled_transfer"
    paper = PAPER

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        subsample_rate: float = DEFAULT_SUBSAMPLE_RATE,
        distribution: StoppingDistribution | str = StoppingDistribution.GEOMETRIC,
        mean: float = 10.0,
        shape: float | None = None,
        lr_key: str = "lr",
        **kwargs: Any,
    ) -> None:
        super().__init__(param_space, **kwargs)
        q = subsample_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q < 1.0:
            raise InvalidParameterError(
                f"subsample_rate must be in (0, 1), got subsample_rate={subsample_rate!r}"
            )
        if "batch_size" in self._space:
            raise SearchSpaceError(
                "search space key 'batch_size': Koskela & Kulkarni keep the sampling ratio γ "
                "constant when transferring from X1 to X \\ X1; give 'sample_rate' "
                "(= batch_size / dataset_size) instead"
            )
        self._q = float(q)
        self._distribution = _coerce_distribution(distribution)
        self._mean = mean
        self._shape = shape
        self._lr_key = lr_key
        stopping_mechanism(
            self._scored(self._base_mechanism(self._probe_extra())),
            self._distribution,
            mean,
            shape,
        )
        self._sigma: float | None = None
        what = f"subsampled tuning with q={q}, E[K]={mean}"
        if self._needs_noise_calibration():
            self._sigma = self._calibrate_noise(
                lambda s: self._plan_mechanism(self._base_mechanism({"noise_multiplier": s})),
                what=what,
            )
        base = self._base_mechanism(self._noise_extra())
        self._final_base = base
        mech = self._plan_mechanism(base)
        self._require_admissible(mech, what=what)
        per_trial = self._max_gradient_evaluations(self._noise_extra())
        self._gradient_extras = {
            "expected_gradient_evaluations": mean * q * per_trial + (1.0 - q) * per_trial,
            "paper_bound_gradient_evaluations": (mean * q + 1.0) * per_trial,
            "random_stopping_full_data_gradient_evaluations": mean * per_trial,
            "saving_factor_vs_random_stopping": mean / (mean * q + 1.0),
        }
        self._plan = self._make_plan(
            mechanism=mech,
            base=self._scored(base),
            description=(
                f"one charge: RandomStopping (K ~ {self._distribution.value}, "
                f"E[K]={mean}) on a q={q} Poisson subsample"
                + self._if_scored(f" (tuning trials + {self._score_text()} noisy score)")
                + ", final run on the complement "
                "(K&K 2023 Theorem, integer RDP orders; privacy profiles by joint convexity, "
                "raydp_hpo.accounting.profiles_subsampled)"
                + self._if_scored(
                    "; worst case with the unamplified noisy scores of a validation record"
                )
            ),
            expected_gradient_evaluations=self._gradient_extras["expected_gradient_evaluations"],
        )
        # secrets, drawn once
        self._k = sample_stopping_k(self._rng, self._distribution, mean, shape)
        self._subsample_seed = self._secret_view_seed()
        self._tuning: list[str] = []
        self._final: str | None = None
        self._selected: str | None = None

    def _probe_extra(self) -> dict[str, Any] | None:
        return {"noise_multiplier": 1.0} if self._needs_noise_calibration() else None

    def _noise_extra(self) -> dict[str, Any] | None:
        return None if self._sigma is None else {"noise_multiplier": self._sigma}

    def _plan_mechanism(self, base: Mechanism) -> Mechanism:
        """``base`` is the training mechanism; tuning trials add their noisy score. The worst
        case of a training record (amplified by subsampling) and a validation record (not
        subsampled: random stopping over the noisy scores alone); see the module docstring."""
        tuning = stopping_mechanism(
            self._scored(base), self._distribution, self._mean, self._shape
        )
        amplified = SubsampledTuning(tuning=tuning, final=base, subsample_rate=self._q)
        if self._score_epsilon is None:
            return amplified
        scores_only = stopping_mechanism(
            self._score_mechanism(), self._distribution, self._mean, self._shape
        )
        return WorstCase((amplified, scores_only))

    def privacy_plan(self) -> PrivacyPlan:
        return self._plan

    def _view(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "rate": self._q, "seed": self._subsample_seed}

    def _suggest(self, trial_id: str) -> dict | str | None:
        if len(self._tuning) < self._k:
            config = self._sample_config()
            if self._sigma is not None:
                config["noise_multiplier"] = self._sigma
            config[RESERVED_KEY] = self._raydp(
                trial_id,
                base=self._plan.base,
                data_view=self._view("subsample"),
                phase=Phase.TUNE,
                score_epsilon=self._score_epsilon,  # the selection reads it
            )
            self._tuning.append(trial_id)
            return self._issue(trial_id, config)
        if self._final is not None or self._k == 0:
            self._finished = True
            return Searcher.FINISHED
        if any(t in self._live for t in self._tuning):
            return None  # wait: the final run needs every tuning result
        best = self._best_of(self._tuning)
        if best is None:  # every tuning trial failed: nothing to transfer
            self._finished = True
            return Searcher.FINISHED
        self._selected = best
        config = self.transfer(self._public_config(best))
        config[RESERVED_KEY] = self._raydp(
            trial_id,
            base=self._final_base,
            data_view=self._view("complement"),
            phase=Phase.FINAL,
            score_epsilon=None,  # no selection reads the final run's score
        )
        self._final = trial_id
        return self._issue(trial_id, config)

    def transfer(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """K&K (2023) transfer t₁ → t₂: learning rate × n/m (m = q·n) for SGD/momentum/GD,
        unchanged for Adam/ADADP; σ, C and the sampling ratio unchanged."""
        out = dict(config)
        if self._lr_key in out:
            optimizer = privacy_from_config(out, self._dataset_size).optimizer
            n = float(self._dataset_size)
            m = self._q * n
            out[self._lr_key] = float(out[self._lr_key]) * lr_transfer_factor(optimizer, n, m)
        return out

    def release(self) -> Release:
        extras: dict[str, Any] = dict(self._gradient_extras)
        if self._k == 0:
            extras["reason"] = "K = 0 was drawn (Poisson or binomial K): no configuration was selected"
            return Release(None, None, self.algorithm, extras)
        if self._final is None:
            extras["reason"] = "no tuning trial reported the metric: nothing was selected"
            return Release(None, None, self.algorithm, extras)
        if self._final not in self._results:
            extras["reason"] = "the final run has not completed yet"
            return Release(self._public_config(self._final), None, self.algorithm, extras)
        if self._results[self._final] is None:
            extras["final_failed"] = True
            return Release(self._public_config(self._final), None, self.algorithm, extras)
        return Release(self._public_config(self._final), self._final, self.algorithm, extras)
