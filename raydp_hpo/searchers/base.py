"""Common base of every differentially private searcher: the plan, the release, the lifecycle.

A :class:`DPSearcher` is a Ray Tune :class:`~ray.tune.search.Searcher` that states its *whole*
privacy cost as a :class:`PrivacyPlan` before any trial runs. The orchestrator (``DPTuner``)
charges ``plan.mechanism`` to the privacy ledger under the id ``f"{experiment}/plan"`` and only
then starts Ray Tune with ``search_alg=searcher, num_samples=-1``.

Searchers talk to trials only through the trial config: the sampled hyperparameters plus the
reserved key ``"raydp"``, a :class:`~raydp_hpo.trial.settings.RaydpSettings` (see
:meth:`DPSearcher.suggest`). They never import ``trainables``.

Privacy-relevant hyperparameters (those read by :func:`raydp_hpo.trial.privacy.
privacy_from_config`: ``noise_multiplier``, ``target_epsilon``, ``target_delta``, ``mu``,
``sample_rate``, ``batch_size``, ``epochs``, ``optimizer``) may vary in the space only over a
finite set (``tune.choice``, ``tune.grid_search`` or a constant). Where they vary, a trial's
base mechanism is :class:`~raydp_hpo.accounting.mechanisms.WorstCase` over their grid (pointwise maximum
of RDP curves; Papernot & Steinke 2022, Sec. 3.5). When the space sets no noise at all, the
searcher calibrates one ``noise_multiplier`` so that the plan is admissible.

**Selection scores are releases.** Every trial whose validation score feeds a selection gets
``config["raydp"].score_epsilon = ε_s`` (the searcher's ``score_epsilon``): it reports its
final score with Laplace noise and its mechanism is ``trial_mechanism(training, ε_s)``
(:mod:`raydp_hpo.trial.privacy`), so every base and plan that covers such a trial contains the
``Laplace(ε_s)`` part. Trials whose score no selection reads (final runs) or whose score the
searcher privatises itself (SVT candidates) get ``score_epsilon=None``.

This module holds the lifecycle (:class:`DPSearcher`); its neighbours hold one concern each
and their names are re-exported here, where they were first defined: the plan and release
types (:mod:`~raydp_hpo.searchers.plan`), search-space checks
(:mod:`~raydp_hpo.searchers.space`), settings and presets (:mod:`~raydp_hpo.searchers.settings`),
noise-calibration bracketing (:mod:`~raydp_hpo.searchers.calibration`) and the learning-rate
transfer rule (:mod:`~raydp_hpo.searchers.lr_transfer`).
"""

from __future__ import annotations

import abc
import itertools
import math
import pickle
import secrets
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar

import numpy as np
from ray.tune.search import Searcher
from ray.tune.search.sample import Domain

from raydp_hpo._atomic_io import atomic_write_bytes
from raydp_hpo._validation import coerce_enum, positive_float, positive_int
from raydp_hpo.accounting.accountants import smallest_noise_multiplier
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Mechanism, WorstCase, mechanism_to_dict
from raydp_hpo.errors import BudgetTooSmallError, InvalidParameterError, SearchSpaceError
from raydp_hpo.ledger.plan_receipt import PlanReceipt
from raydp_hpo.searchers.calibration import (  # noqa: F401 (_BRACKET_STEP, _guided_bracket: re-exported)
    _BRACKET_STEP,
    _SIGMA_FLOOR,
    CALIBRATION_RTOL,
    MAX_NOISE_MULTIPLIER,
    _bracketed_by_rdp,
    _guided_bracket,
    plan_epsilon,
)
from raydp_hpo.searchers.lr_transfer import lr_transfer_factor  # noqa: F401 (re-exported)
from raydp_hpo.searchers.plan import (
    NOISE_KEYS,
    PRIVACY_KEYS,
    RESERVED_KEY,
    TUNER_ASSIGNED,
    TUNER_DEFAULTS,
    Admissible,
    Phase,
    PrivacyPlan,
    Release,
)
from raydp_hpo.searchers.settings import (  # noqa: F401 (the settings helpers: re-exported)
    _KEYWORD_KINDS,
    _deferring_init,
    _init_settings,
    _with_guess,
    check_settings,
    resolve_preset,
    searcher_settings,
)
from raydp_hpo.searchers.space import (  # noqa: F401 (finite_grid, _contains_domain: re-exported)
    _check_space,
    _contains_domain,
    finite_grid,
    finite_values,
    is_grid,
)
from raydp_hpo.trial.privacy import (
    DEFAULT_SCORE_EPSILON,
    NOISY_SCORE_KEY,
    DPSGDPrivacy,
    ScoreNoise,
    ScoreRelease,
    privacy_from_config,
    trial_mechanism,
)
from raydp_hpo.trial.settings import RaydpSettings

__all__ = [
    "RESERVED_KEY",
    "PRIVACY_KEYS",
    "NOISE_KEYS",
    "Admissible",
    "PrivacyPlan",
    "Release",
    "DPSearcher",
    "Phase",
    "searcher_settings",
    "check_settings",
    "resolve_preset",
]

# --------------------------------------------------------------------------------------------
# the base class
# --------------------------------------------------------------------------------------------


class DPSearcher(Searcher, abc.ABC):
    """Abstract base of every DP searcher in ``search_algs``.

    Lifecycle (call order, as driven by ``DPTuner`` and Ray Tune):

    0. The space comes with the constructor, or later through Tune's
       ``set_search_properties(metric, mode, config, **spec)`` (how ``DPTuner`` hands over its
       ``param_space``): a searcher built with ``param_space=None`` keeps its arguments and
       runs step 1 there, with ``config`` as the space, ``spec`` filling the arguments the
       constructor did not get (:data:`TUNER_DEFAULTS`: declared sizes, budget, secret seed,
       the ledger's admission rule). Either way ``DPTuner`` assigns ``ledger_name``,
       ``namespace`` and ``experiment`` (:data:`TUNER_ASSIGNED`) through the same call.
    1. ``__init__`` validates the space and the budget eagerly and fixes the plan; a space the
       algorithm cannot use raises :class:`~raydp_hpo.errors.SearchSpaceError`, a budget too
       small for the plan raises :class:`~raydp_hpo.errors.InvalidParameterError` stating the
       smallest budget that works. All secret randomness (K, subsample and partition seeds,
       SVT noise) is drawn here or later from the searcher's own RNG — OS entropy unless the
       caller passes a secret seed — never from the data.
    2. ``privacy_plan()`` (pure, repeatable) is charged to the ledger by the orchestrator
       *before* the first ``suggest``.
    3. Ray Tune calls ``suggest(trial_id)`` repeatedly; it returns a config, ``None`` ("not
       now": only while some suggested trial is still running) or ``Searcher.FINISHED``.
    4. ``on_trial_complete(trial_id, result, error)`` once per trial (``error=True`` after
       Ray's retries are used up: the trial still spent privacy and is never retried here).
    5. ``release()`` after the run: the public output.

    ``save``/``restore`` pickle the mutable state (including the RNG and secret draws), so
    ``Tuner.restore`` resumes the search exactly; restoring into a searcher whose plan differs
    raises. The saved file contains secrets (K, seeds, per-trial metrics): it is a private
    artefact like Tune's experiment directory.

    Concurrency contract: Ray Tune calls a searcher from its single controller thread only;
    instances are not thread-safe and must not be shared between experiments.

    Args:
        param_space: flat dict of ``ray.tune`` Domains, ``tune.grid_search`` dicts or
            constants. The searcher samples every Domain itself with its own RNG. ``None``:
            given later by ``set_search_properties`` (lifecycle step 0).
        metric: the reported metric to optimise.
        mode: ``"max"`` or ``"min"``.
        dataset_size: the declared **public** number of training records n (q from
            ``batch_size``, public normalisers and compute estimates use it; the realised size
            of the private training set is never used).
        validation_size: the declared public number of validation records (the score
            normaliser of the trials; ``None``: the trainable's data decides, treated public).
        budget: the total privacy budget of the search.
        seed: **secret** seed of the searcher's RNG. ``None`` (the default) draws it from OS
            entropy (:mod:`secrets`): the searcher's secret draws (random stopping's K,
            subsample and partition seeds, SVT noise) are what its guarantee relies on, and a
            seed anyone knows would make them public. Pass one only to reproduce a run, and
            keep it like the data; it is never written to a release, certificate or report.
        ledger_name: name of the ledger actor trials charge/check against.
        namespace: Ray namespace of the ledger actor.
        experiment: experiment name; prefixes every charge id.
        admissible: ``admissible(mechanism) -> bool`` decides whether a plan fits the budget
            (the orchestrator passes the ledger's actual rule). Default: ε under the RDP
            accountant at ``budget.delta`` is at most ``budget.epsilon``.
        score_epsilon: ε_s of the Laplace-noised validation score each trial that feeds a
            selection reports (default :data:`~raydp_hpo.trial.privacy.DEFAULT_SCORE_EPSILON`);
            its cost ``Laplace(ε_s)`` is part of every such trial's mechanism and of the plan.
            ``None`` declares the validation split **public**: per-trial scores are then
            reported and selected on without noise and are not charged — use it only when
            the validation data is not part of the private dataset.
        score_noise: :class:`~raydp_hpo.trial.privacy.ScoreNoise` of the score (or its value):
            ``LAPLACE`` (default) adds Laplace(1/ε_s), mechanism ``Laplace(ε_s)``;
            ``GAUSSIAN`` adds N(0, σ_s²) with σ_s calibrated by the analytic Gaussian
            mechanism to (ε_s, ``score_delta``), mechanism ``Gaussian(σ_s)``, which the RDP and
            PLD accountants compose with DP-SGD far more tightly over many scored trials.
        score_delta: δ_s of the Gaussian score (required for ``GAUSSIAN``, refused otherwise).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every searcher's ``__init__`` accepts ``param_space=None`` (lifecycle step 0)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_defers_space", False):
            cls.__init__ = _deferring_init(init)  # type: ignore[method-assign]

    #: short name of the algorithm (set by subclasses)
    algorithm: str = ""
    #: citation (set by subclasses)
    paper: str = ""
    #: whether the space must give ``epochs`` (False where the searcher sets it itself)
    _requires_epochs: bool = True
    #: the Enum of this algorithm's named presets (``None``: it has none); a ``preset=``
    #: setting names one, and settings given explicitly override its values
    #: (:func:`resolve_preset`)
    preset_type: ClassVar[type[Enum] | None] = None
    #: the constructor settings of each preset (keys of :attr:`preset_type`)
    presets: ClassVar[Mapping[Any, Mapping[str, Any]]] = {}
    #: groups of settings that are alternatives to each other: one of them given explicitly
    #: drops the others from a preset (e.g. absolute ε's instead of fractions of the budget)
    _alternative_settings: ClassVar[tuple[frozenset[str], ...]] = ()

    def __init__(
        self,
        param_space: Mapping[str, Any],
        *,
        metric: str,
        mode: str = "max",
        dataset_size: int,
        budget: PrivacyBudget,
        seed: int | None = None,
        validation_size: int | None = None,
        ledger_name: str | None = None,
        namespace: str = "raydp_hpo",
        experiment: str = "raydp",
        admissible: Admissible | None = None,
        score_epsilon: float | None = DEFAULT_SCORE_EPSILON,
        score_noise: ScoreNoise | str = ScoreNoise.LAPLACE,
        score_delta: float | None = None,
    ) -> None:
        score: ScoreRelease | None = None
        noise = coerce_enum(ScoreNoise, score_noise, "score_noise")
        if score_epsilon is not None:
            score_epsilon = positive_float("score_epsilon", score_epsilon)
            score = ScoreRelease(score_epsilon, noise, score_delta)
        elif ScoreRelease(1.0, noise, score_delta).noise is not ScoreNoise.LAPLACE:
            raise InvalidParameterError(
                f"score_noise={score_noise!r} needs score_epsilon: with score_epsilon=None the "
                "validation split is declared public and no score noise is added"
            )
        if not isinstance(metric, str) or not metric:
            raise InvalidParameterError(f"metric must be a non-empty string, got {metric=!r}")
        if mode not in ("max", "min"):
            raise InvalidParameterError(f"mode must be 'max' or 'min', got {mode=!r}")
        if not isinstance(budget, PrivacyBudget):
            raise InvalidParameterError(f"budget must be a PrivacyBudget, got {budget=!r}")
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
            raise InvalidParameterError(
                f"dataset_size must be an integer >= 1, got {dataset_size=!r}"
            )
        if not isinstance(experiment, str) or not experiment:
            raise InvalidParameterError(f"experiment must be a non-empty string, got {experiment=!r}")
        if validation_size is not None:
            validation_size = positive_int("validation_size", validation_size)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise InvalidParameterError(f"seed must be an int or None, got {seed=!r}")
        super().__init__(metric=metric, mode=mode)
        self._space = _check_space(param_space, requires_epochs=self._requires_epochs)
        self._dataset_size = dataset_size
        self._validation_size = validation_size
        self._budget = budget
        # Secret by default: 128 bits of OS entropy (no default seed anywhere).
        self._rng = np.random.default_rng(secrets.randbits(128) if seed is None else int(seed))
        self._ledger_name = ledger_name
        self._namespace = namespace
        self._experiment = experiment
        self._admissible: Admissible = admissible or self._default_admissible
        self._score_epsilon: float | None = score_epsilon
        self._score: ScoreRelease | None = score
        # mutable search state (saved/restored)
        self._configs: dict[str, dict[str, Any]] = {}
        self._results: dict[str, float | None] = {}  # None: failed / no metric
        self._live: set[str] = set()
        self._finished = False

    #: Where the admitted plan charge lies in the ledger's journal, set by the orchestrator
    #: once the plan is admitted; plan-covered trials get it with their config and check it
    #: locally instead of by a ledger round trip (:mod:`raydp_hpo.ledger.plan_receipt`).
    plan_receipt: PlanReceipt | None = None

    # ---------------------------------------------------------------- properties

    @property
    def budget(self) -> PrivacyBudget:
        return self._budget

    @property
    def dataset_size(self) -> int:
        return self._dataset_size

    @property
    def score_epsilon(self) -> float | None:
        """ε_s of the noisy selection score (``None``: validation split declared public)."""
        return self._score_epsilon

    @property
    def score_release(self) -> ScoreRelease | None:
        """How each scored trial privatises its score (``None``: validation split public)."""
        return self._score

    def _scored(self, training: Mechanism) -> Mechanism:
        """The mechanism of a trial whose score feeds a selection: training + its score
        release (``Laplace(ε_s)`` or ``Gaussian(σ_s)``)."""
        return trial_mechanism(training, self._score)

    def _score_mechanism(self, count: int = 1) -> Mechanism:
        """``count`` score releases alone (needs ``score_epsilon`` set)."""
        if self._score is None:
            raise InvalidParameterError("no score release: score_epsilon is None")
        return self._score.mechanism(count)

    def _score_text(self) -> str:
        """The score release for plan descriptions ("" when none)."""
        return "" if self._score is None else self._score.describe()

    def _if_scored(self, text: str) -> str:
        """``text`` when trials release noisy scores, else "" (for plan descriptions)."""
        return "" if self._score_epsilon is None else text

    def _make_plan(
        self,
        *,
        mechanism: Mechanism | None,
        base: Mechanism | None,
        description: str,
        expected_gradient_evaluations: float,
        per_trial_charges: bool = False,
    ) -> PrivacyPlan:
        """This searcher's :class:`PrivacyPlan`, with its ``algorithm`` and ``paper``: the one
        place a plan is built, so every searcher states its cost the same way."""
        return PrivacyPlan(
            mechanism=mechanism,
            base=base,
            per_trial_charges=per_trial_charges,
            algorithm=self.algorithm,
            paper=self.paper,
            description=description,
            expected_gradient_evaluations=float(expected_gradient_evaluations),
        )

    @property
    def plan_charge_id(self) -> str:
        """The ledger charge id of the plan: ``f"{experiment}/plan"``."""
        return f"{self._experiment}/plan"

    def charge_id(self, trial_id: str) -> str:
        return f"{self._experiment}/{trial_id}"

    # ---------------------------------------------------------------- admissibility

    def _default_admissible(self, mechanism: Mechanism) -> bool:
        return plan_epsilon(mechanism, self._budget.delta) <= self._budget.epsilon

    def plan_epsilon(self) -> float:
        """ε of the plan under the RDP accountant at ``budget.delta`` (``nan`` if no plan)."""
        mech = self.privacy_plan().mechanism
        return math.nan if mech is None else plan_epsilon(mech, self._budget.delta)

    # ---------------------------------------------------------------- privacy grid

    def _privacy_grid(self, extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Cartesian product of the finite values of every privacy key in the space.

        Raises SearchSpaceError for a continuous domain on a privacy key.
        """
        keys: list[str] = []
        values: list[list[Any]] = []
        for key in PRIVACY_KEYS:
            if key not in self._space:
                continue
            vals = finite_values(key, self._space[key])
            if vals is None:
                raise SearchSpaceError(
                    f"search space key {key!r} changes the privacy cost and is a continuous "
                    "domain; use tune.choice([...]), tune.grid_search([...]) or a constant so "
                    "that the worst case over its values can be charged"
                )
            keys.append(key)
            values.append(vals)
        grid = [dict(zip(keys, combo)) for combo in itertools.product(*values)]
        if extra:
            grid = [{**g, **extra} for g in grid]
        return grid

    def _privacies(self, extra: Mapping[str, Any] | None = None) -> list[DPSGDPrivacy]:
        out = []
        for combo in self._privacy_grid(extra):
            try:
                out.append(privacy_from_config(combo, self._dataset_size))
            except InvalidParameterError as exc:
                raise SearchSpaceError(f"privacy settings {combo} are invalid: {exc}") from None
        return out

    def _base_mechanism(self, extra: Mapping[str, Any] | None = None) -> Mechanism:
        """The trial base: the mechanism of the privacy grid, or WorstCase over it."""
        mechs: list[Mechanism] = []
        for p in self._privacies(extra):
            m = p.mechanism()
            if m not in mechs:
                mechs.append(m)
        return mechs[0] if len(mechs) == 1 else WorstCase(tuple(mechs))

    def _max_gradient_evaluations(self, extra: Mapping[str, Any] | None = None) -> float:
        """Largest expected number of per-example gradient evaluations of one trial on the
        full data: steps · q · n · (2 for ADADP), maximised over the privacy grid."""
        return max(
            p.expected_gradient_evaluations(self._dataset_size) for p in self._privacies(extra)
        )

    def _needs_noise_calibration(self) -> bool:
        return not any(k in self._space for k in NOISE_KEYS)

    def _calibrate_noise(
        self, plan_of_sigma: Callable[[float], Mechanism], *, what: str
    ) -> float:
        """Smallest σ (relative tolerance :data:`CALIBRATION_RTOL`) with
        ``admissible(plan_of_sigma(σ))``.

        The returned σ is always one at which the plan was found admissible ("round toward more
        privacy"), and σ/(1 + rtol) was found not admissible (or σ is at the 1e-2 floor), so it
        is within rtol of the smallest admissible σ. Admissibility must be monotone in σ.
        ``plan_of_sigma`` must return the *whole* plan, including the ``Laplace(ε_s)`` score
        parts of trials whose scores feed a selection (:meth:`_scored`): σ only buys down the
        training part, so a score part that alone exceeds the budget is reported as such.

        Cost: the rule may be expensive (``DPTuner`` admits fixed plans on the tightest valid
        bound, whose privacy-profile figure costs ~0.1–0.5 s per σ). The search is therefore
        bracketed by the σ calibrated on RDP alone (cheap, cached): when the rule admits it,
        it is an upper bracket (the tightest bound never exceeds RDP), the rule is asked at
        σ_RDP/(1 + rtol) (if refused, σ_RDP is the answer: an RDP rule costs one extra call),
        then lower by factors of :data:`_BRACKET_STEP` until refused, then bisected in log σ:
        about 10 calls of the rule in all. A rule with a ``figure(mechanism) -> ε`` method
        (``DPTuner``'s) guides a secant instead (about 5 calls; ``fits`` still decides every
        end of the bracket). Otherwise (a shared ledger's rule can be stricter
        than RDP) the generic doubling-and-bisection search from σ = 1 runs.
        """

        def fits(s: float) -> bool:
            return self._admissible(plan_of_sigma(s))

        rule_figure = getattr(self._admissible, "figure", None)
        figure = None if rule_figure is None else (lambda s: rule_figure(plan_of_sigma(s)))
        sigma = _bracketed_by_rdp(
            fits,
            lambda s: plan_epsilon(plan_of_sigma(s), self._budget.delta),
            self._budget,
            figure,
        )
        if sigma is None:
            sigma = smallest_noise_multiplier(
                fits,
                max_noise_multiplier=MAX_NOISE_MULTIPLIER,
                tolerance=CALIBRATION_RTOL,
                floor=_SIGMA_FLOOR,
                refine_below_floor=False,
            )
        if sigma is None:
            score = (
                ""
                if self._score_epsilon is None
                else f" (the noisy selection scores alone cost score_epsilon="
                f"{self._score_epsilon:g} per scored trial: lower score_epsilon)"
            )
            raise BudgetTooSmallError(
                f"budget ε={self._budget.epsilon:g}, δ={self._budget.delta:g} is too small "
                f"for {what}: even noise_multiplier={MAX_NOISE_MULTIPLIER:g} does not fit"
                f"{score}. Raise the budget or cut epochs / sample rate / expected trials."
            )
        return sigma

    def _require_admissible(self, mechanism: Mechanism, *, what: str) -> None:
        """Raise :class:`BudgetTooSmallError` unless the admission rule admits ``mechanism``,
        priced by the rule that refused: a rule with an ``explain(mechanism)`` method
        (``DPTuner``'s: the ledger's halting rule) names itself and the ε it gives the plan
        (the smallest budget that would pass it); the default rule is RDP at the budget's δ."""
        if self._admissible(mechanism):
            return
        explain = getattr(self._admissible, "explain", None)
        refusal = None if explain is None else explain(mechanism)
        if refusal is None:
            rule, eps = "RDP accountant", plan_epsilon(mechanism, self._budget.delta)
            rule_text = f"the plan needs ε={eps:.4g} at that δ ({rule})"
            fix = f"Use a budget of at least ε={eps:.4g}"
        else:
            rule_text, fix = refusal
        raise BudgetTooSmallError(
            f"budget ε={self._budget.epsilon:g} at δ={self._budget.delta:g} is too small "
            f"for {what}: {rule_text}. {fix}, or more noise / fewer epochs / fewer trials."
        )

    # ---------------------------------------------------------------- sampling

    def _sample_value(self, key: str, value: Any) -> Any:
        if is_grid(value):
            options = value["grid_search"]
            return options[int(self._rng.integers(len(options)))]
        if isinstance(value, Domain):
            out = value.sample(random_state=self._rng)
            if isinstance(out, list):
                out = out[0]
            return out.item() if isinstance(out, np.generic) else out
        return value

    def _secret_view_seed(self) -> int:
        """A 128-bit seed for a data view (subsample, partitions) from the searcher's secret
        stream: the view's draws then depend on 128 secret bits, as the DP noise's do
        (:mod:`raydp_hpo.trainables.secret_rng`), not on 31 that could be enumerated."""
        return int.from_bytes(self._rng.bytes(16), "little")

    def _sample_config(self, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        return {k: self._sample_value(k, v) for k, v in self._space.items() if k not in skip}

    def _raydp(
        self,
        trial_id: str,
        *,
        base: Mechanism | None,
        data_view: dict[str, Any],
        phase: str,
        score_epsilon: float | None,
        charge: bool = False,
        covered: bool = True,
        nonprivate: bool = False,
    ) -> RaydpSettings:
        return RaydpSettings(
            ledger=self._ledger_name,
            namespace=self._namespace,
            experiment=self._experiment,
            charge=charge,
            charge_id=self.charge_id(trial_id),
            covered_by=self.plan_charge_id if covered else None,
            base=None if base is None else mechanism_to_dict(base),
            data_view=data_view,
            nonprivate=nonprivate,
            phase=phase,
            score_epsilon=score_epsilon,
            # the searcher's noise kind goes with every score it reads (None: no score)
            score_noise=(ScoreNoise.LAPLACE if score_epsilon is None or self._score is None
                         else self._score.noise).value,
            score_delta=None if score_epsilon is None or self._score is None
            else self._score.delta,
            dataset_size=self._dataset_size,
            validation_size=self._validation_size,
            trial_index=len(self._configs),
            plan_receipt=self.plan_receipt if covered else None,
        )

    def _issue(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        self._configs[trial_id] = config
        self._live.add(trial_id)
        return config

    # ---------------------------------------------------------------- Ray Tune API

    @property
    def has_space(self) -> bool:
        """Whether the space is set (and the plan fixed): False until ``set_search_properties``
        gives the space to a searcher built with ``param_space=None``."""
        return "_deferred" not in self.__dict__

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        """Tune's hand-over of metric, mode and space (lifecycle step 0).

        A searcher built without a space is constructed here with ``config`` as the space
        (errors in the space or budget raise as from the constructor); one built with a space
        refuses another (returns ``False``, as Tune's searchers do). A ``metric`` / ``mode``
        other than the searcher's is refused. The :data:`TUNER_ASSIGNED` keys of ``spec`` are
        assigned either way; other keys (Tune's own spec) are ignored.
        """
        assigned = {k: spec[k] for k in TUNER_ASSIGNED if spec.get(k) is not None}
        deferred = self.__dict__.get("_deferred")
        if deferred is not None:
            if not config:
                return False
            args, kwargs = deferred
            kwargs = dict(kwargs)
            for key, value in (("metric", metric), ("mode", mode)):
                if value:
                    if kwargs.get(key) not in (None, value):
                        return False
                    kwargs[key] = value
            for key in TUNER_DEFAULTS:
                if spec.get(key) is not None and key not in kwargs:
                    kwargs[key] = spec[key]
            kwargs.update(assigned)
            del self.__dict__["_deferred"]
            try:
                type(self).__init__(self, dict(config), *args, **kwargs)
            except BaseException:
                self.__dict__["_deferred"] = deferred
                raise
            return True
        if config:
            return False
        if metric and self._metric and metric != self._metric:
            return False
        if mode and self._mode and mode != self._mode:
            return False
        for key, value in assigned.items():
            setattr(self, f"_{key}", value)
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if trial_id in self._configs:  # Ray asks again for a known id: same config
            return self._configs[trial_id]
        if self._finished:
            return Searcher.FINISHED  # type: ignore[return-value]  # Ray's sentinel is a str
        return self._suggest(trial_id)  # type: ignore[return-value]

    @abc.abstractmethod
    def _suggest(self, trial_id: str) -> dict | str | None:
        """Algorithm-specific suggestion (the trial id is new)."""

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if trial_id not in self._configs or trial_id in self._results:
            return
        self._live.discard(trial_id)
        value: float | None = None
        declared = getattr(self._configs[trial_id].get(RESERVED_KEY), "score_epsilon", None)
        if declared is not None and (result is None or result.get(NOISY_SCORE_KEY) != declared):
            # The trial was to release its score with noise at ε_s = declared; a result that
            # does not say so (a user trainable reporting its raw validation accuracy) is not
            # read: the selection would be on private data the plan does not cover. The trial
            # counts as failed (which depends on the trainable's code, not on the data).
            result = None
        if not error and result is not None and self._metric in result:
            try:
                value = float(result[self._metric])
            except (TypeError, ValueError):
                value = None
            if value is not None and not math.isfinite(value):
                value = None
        self._results[trial_id] = value
        self._on_complete(trial_id, value)

    def _on_complete(self, trial_id: str, value: float | None) -> None:  # noqa: B027
        """Hook for subclasses (called once per completed trial)."""

    def _better(self, a: float, b: float) -> bool:
        return a > b if self._mode == "max" else a < b

    def _best_of(self, trial_ids: list[str]) -> str | None:
        best: str | None = None
        for tid in trial_ids:
            v = self._results.get(tid)
            if v is None:
                continue
            if best is None or self._better(v, self._results[best]):  # type: ignore[arg-type]
                best = tid
        return best

    def _public_config(self, trial_id: str) -> dict[str, Any]:
        return {k: v for k, v in self._configs[trial_id].items() if k != RESERVED_KEY}

    # ---------------------------------------------------------------- plan / release

    @abc.abstractmethod
    def privacy_plan(self) -> PrivacyPlan:
        """The fixed privacy plan (pure; the same object every call)."""

    def _release_final_run(self, final: str | None, extras: dict[str, Any]) -> Release:
        """Release of a search that ends in a final run: its public config and, if the run
        completed, its trial id (whose model is released)."""
        if final is None:
            extras["reason"] = "the final run was not started"
            return Release(None, None, self.algorithm, extras)
        hyper = self._public_config(final)
        if self._results.get(final) is None:
            extras["final_failed"] = final in self._results
            return Release(hyper, None, self.algorithm, extras)
        return Release(hyper, final, self.algorithm, extras)

    @abc.abstractmethod
    def release(self) -> Release:
        """The public output (call after the run; only for a :meth:`search_completed`)."""

    def search_completed(self) -> bool:
        """Whether the search ran to its end: it answered ``FINISHED`` and no trial it
        suggested is still running.

        Only a completed search has a release. The analyses cover the whole plan's output:
        the best of the first J < K trials of random stopping is not what Papernot & Steinke
        (2022) bound (J is chosen by whoever stopped the run, possibly after watching
        progress), and releasing it and later, after a resume, the best of all K would be two
        selections on one charge. An interrupted search releases nothing; resuming it and
        letting it finish releases once.
        """
        return bool(self._finished) and not self._live

    # ---------------------------------------------------------------- save / restore

    _NOT_SAVED = frozenset({"_admissible"})

    def get_state(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._NOT_SAVED}

    def set_state(self, state: dict[str, Any]) -> None:
        own_score = self.__dict__.get("_score_epsilon")
        if "_score_epsilon" in state and state["_score_epsilon"] != own_score:
            raise InvalidParameterError(
                "cannot restore: the saved searcher has score_epsilon="
                f"{state['_score_epsilon']!r}, this one score_epsilon={own_score!r}; "
                "construct the searcher with the same arguments as the saved one"
            )
        own_release = self.__dict__.get("_score")
        if "_score" in state and state["_score"] != own_release:
            raise InvalidParameterError(
                f"cannot restore: the saved searcher's score release is {state['_score']!r}, "
                f"this one's {own_release!r}; construct the searcher with the same "
                "score_noise / score_delta as the saved one"
            )
        saved_plan = state.get("_plan")
        own_plan = self.__dict__.get("_plan")
        if own_plan is not None and saved_plan is not None and saved_plan != own_plan:
            raise InvalidParameterError(
                "cannot restore: the saved searcher has a different privacy plan "
                f"({saved_plan.description!r}) than this one ({own_plan.description!r}); "
                "construct the searcher with the same arguments as the saved one"
            )
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        atomic_write_bytes(checkpoint_path, pickle.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            state = pickle.load(fh)  # noqa: S301 - our own private checkpoint
        self.set_state(state)

