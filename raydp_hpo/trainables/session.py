"""Your own model and training loop under the guarantee: :func:`trial_session`.

A Tune trainable of your own (your model, your Opacus loop) runs one trial inside
``with raydp_hpo.trial_session(config) as trial:``. The session

* reads what the searcher decided (``config["raydp"]`` and the privacy keys of ``config``):
  :attr:`TrialSession.noise_multiplier` σ, :attr:`~TrialSession.sample_rate` q,
  :attr:`~TrialSession.steps` T, :attr:`~TrialSession.max_grad_norm` C, the hyperparameters
  (:attr:`~TrialSession.config`), the trial's secret generators and :attr:`~TrialSession.device`
  (the GPU Ray gave the trial, else the CPU);
* **admits the trial on entry** (the ledger charge or the plan-coverage check of
  :func:`~raydp_hpo.trainables.privacy_gate.admit`), before your code touches data: a refused
  trial raises and trains nothing;
* :meth:`~TrialSession.make_private` wraps your module, optimiser and dataset at exactly the
  charged σ and C, Poisson sampling at exactly the charged q (each record independently, not
  ``1/len(loader)``), the DP-SGD normaliser q·n from the *declared* public size n, and a step
  guard: the optimiser refuses a step beyond T. The engine (:class:`DPEngine`,
  :mod:`raydp_hpo.trainables.native_private`) is the project's own book-keeping DP-SGD step
  where every trainable layer is one it covers (Linear, Conv1d/2d, GroupNorm, LayerNorm), else
  Opacus (both set up in :mod:`raydp_hpo.trainables.session_engines`); the choice is
  :attr:`TrialSession.engine` and one INFO log line, and
  ``make_private(..., engine=DPEngine.OPACUS)`` (or ``NATIVE``) overrides it;
* :meth:`~TrialSession.report_score` releases the noisy validation score from a count of
  correct predictions (Laplace or Gaussian noise from the trial's secret stream,
  :class:`~raydp_hpo.trial.privacy.ScoreRelease`) under the metric key, with the keys the
  searcher and DPTuner read (``score_epsilon``, :data:`SESSION_KEY`);
* :meth:`~TrialSession.save_model` writes the release checkpoint in the documented format of
  :func:`~raydp_hpo.trainables.release.save_user_model` (state dict + ``model_fn`` +
  ``model_kwargs``), which ``DPTuner`` releases for any model.

**Enforcement.** At every report (and before every optimiser step) the session compares what
the engine actually ran with the charge: the optimiser's noise multiplier and clipping norm,
the loader's sample rate, Opacus's accountant history (attached to either engine's
optimiser; each entry's σ and q, the steps it counts) and the steps taken. It also checks
that the DP steps are what trained the model and that they clipped the returned loader's
batches (issue #37: the slips of an honest loop, not only deliberate changes; the checks
are listed in :mod:`raydp_hpo.trainables.session_checks`).

Any difference raises :class:`~raydp_hpo.errors.TrialContractError`:
the trial fails, the searcher counts it as failed (nothing from it is selected), DPTuner
releases nothing from it, and the ledger keeps what was charged on entry. Leaving the block
normally without a score or a saved model is an error too.

**What this does not stop (accident-proofing, not a sandbox).** The trainable runs your code
in your process. Code that means to cheat can rewrite the accountant's history, the loader's
counters or the session's private fields, restore the fingerprinted weights after training
elsewhere (the fingerprint is not a hash an adversary cannot collide), feed a drawn batch's
row count of other records, call ``tune.report`` itself with forged keys, or publish the data
by other channels. The session catches the mistakes an honest loop makes — σ or C changed
after ``make_private``, a loader at another q, extra steps, the original optimiser stepped,
another loader iterated, a missing admission, score or checkpoint — not an adversary inside
the trial.

Outside Ray Tune (a unit test, a notebook) the same session works with ``ledger=`` a
:class:`~raydp_hpo.ledger.filter.PrivacyLedger` and a hand-written ``config["raydp"]``;
reports are then kept in :attr:`TrialSession.results` and the model in
:attr:`TrialSession.checkpoint_dir`.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError, TrialContractError
from raydp_hpo.ledger.ledger_like import LedgerLike
from raydp_hpo.trainables.dp_step.noise import NoiseSource, warn_noise_floor
from raydp_hpo.trainables.dp_step.noise import noise_source as _noise_source
from raydp_hpo.trainables.native_private import (
    DPEngine,
    NativePoissonLoader,
    choose_engine,
    log_choice,
)
from raydp_hpo.trainables.privacy_gate import admit, ledger_delta, resolve_ledger
from raydp_hpo.trainables.release import (
    USER_MODEL_FILE,
    build_user_model,
    program_path,
    save_program,
    save_user_model,
)
from raydp_hpo.trainables.secret_rng import derive_seed, secret_generator
from raydp_hpo.trainables.session_checks import (
    _FAILS,
    _fingerprint,
    _same_tensors,
    check_batch,
)
from raydp_hpo.trainables.session_engines import _RTOL, dataset_of, native_engine, opacus_engine
from raydp_hpo.trial.privacy import (
    NOISY_SCORE_KEY,
    TRIAL_EPSILON_KEY,
    DPSGDPrivacy,
    Optimizer,
    ScoreRelease,
    privacy_from_config,
    trial_mechanism,
)
from raydp_hpo.trial.settings import RaydpSettings

__all__ = ["SESSION_KEY", "DPEngine", "TrialSession", "trial_session"]

#: Result key a session sets on every report: the charge id the trial was admitted under.
#: DPTuner releases a custom trainable's trial only if its result carries it (a trainable
#: that reports without a session was never admitted or checked).
SESSION_KEY = "raydp_session"

ReportFn = Callable[[dict[str, Any], "str | None"], None]


def _in_tune() -> bool:
    """Whether this code runs inside a Ray Tune trial (without importing Ray otherwise)."""
    import sys

    if "ray" not in sys.modules:
        return False
    try:
        from ray.train._internal.session import get_session

        return get_session() is not None
    except Exception:  # pragma: no cover - another Ray layout
        return False


def _tune_report(metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
    from ray import tune

    checkpoint = tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
    tune.report(metrics, checkpoint=checkpoint)


def _unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside the engine's wrapper (``GradSampleModule`` or
    :class:`~raydp_hpo.trainables.native_private.NativePrivateModule`; both keep it as
    ``_module``)."""
    inner = getattr(module, "_module", None)
    return inner if isinstance(inner, nn.Module) else module


class TrialSession:
    """One admitted trial (made by :func:`trial_session`; see the module docstring)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        settings: RaydpSettings,
        privacy: DPSGDPrivacy,
        score: ScoreRelease | None,
        *,
        dataset_size: int,
        validation_size: int | None,
        charge_id: str | None,
        delta: float,
        seed: int,
        device: torch.device,
        report: ReportFn | None,
        checkpoint_dir: Path,
    ) -> None:
        self.config = {k: v for k, v in config.items() if k != "raydp"}
        self.settings = settings
        self.privacy = privacy
        self.score = score
        self.dataset_size = dataset_size
        self.validation_size = validation_size
        self.charge_id = charge_id
        self.delta = delta
        self.device = device
        self.max_grad_norm = float(config.get("max_grad_norm", 1.0))
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise InvalidParameterError(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        #: the secret generators: Poisson batches and DP noise (never logged, never saved)
        # Poisson sampling draws on the CPU (Opacus's sampler), the noise on the device
        self.sampling_generator = secret_generator("cpu", seed, 0, 1)
        self.noise_generator = secret_generator(device, seed, 0, 2)
        self._score_rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        self._report = report
        self.checkpoint_dir = checkpoint_dir
        #: reports made outside Ray Tune (in Tune they go to ``tune.report``)
        self.results: list[dict[str, Any]] = []
        self._optimizer: Any = None
        #: the DP-SGD engine make_private chose (None before make_private)
        self.engine: DPEngine | None = None
        self._loader: Any = None
        self._accountant: Any = None
        self._steps_taken = 0
        #: the trainable weights (make_private's module) and their fingerprint after the last
        #: DP step (or make_private); every fingerprint a DP step left, for save_model
        self._params: list[torch.Tensor] = []
        self._fingerprint: torch.Tensor | None = None
        self._versions: tuple[int, ...] = ()
        self._dp_fingerprints: list[torch.Tensor] = []
        #: the returned loader's batch count at the last DP step (a step needs a fresh batch)
        self._batches_at_step = 0
        #: shape (less the batch dimension) and dtype of each forward argument: the example
        #: input of the exported release (zeros, never a record)
        self._input_spec: tuple[tuple[tuple[int, ...], torch.dtype], ...] = ()
        self._input_hook: Any = None
        self._scored = False
        self._saved = False
        self._open = True

    # ---- what the searcher decided ------------------------------------------------------

    @property
    def noise_multiplier(self) -> float:
        """σ: the noise multiplier charged (Gaussian noise of std σ·C per step)."""
        return self.privacy.noise_multiplier

    @property
    def sample_rate(self) -> float:
        """q: the Poisson sampling rate charged (each record joins a batch w.p. q)."""
        return self.privacy.sample_rate

    @property
    def steps(self) -> int:
        """T: the optimiser steps charged (⌈epochs / q⌉); the wrapped optimiser refuses more."""
        return self.privacy.steps

    @property
    def steps_taken(self) -> int:
        """Optimiser steps run so far (counted by the step guard)."""
        return self._steps_taken

    @property
    def expected_batch_size(self) -> int:
        """q·n over the declared public size n: the DP-SGD normaliser (never ``len(data)``)."""
        return max(1, round(self.sample_rate * self.dataset_size))

    # ---- make_private --------------------------------------------------------------------

    def make_private(self, module: nn.Module, optimizer: torch.optim.Optimizer, data: Any,
                     *, collate_fn: Callable[..., Any] | None = None,
                     engine: DPEngine | str = DPEngine.AUTO,
                     noise_source: NoiseSource | str = NoiseSource.SEEDED,
                     ) -> tuple[nn.Module, Any, Any]:
        """``(module, optimizer, loader)`` made private at exactly the charge.

        ``engine``: :attr:`DPEngine.AUTO` (default) uses the project's own DP-SGD step
        (:attr:`DPEngine.NATIVE`, book-keeping clipping) when every trainable layer of
        ``module`` is one it covers, else Opacus (:attr:`DPEngine.OPACUS`); the choice is
        kept in :attr:`engine` and logged. Both release the same subsampled Gaussian mechanism
        (:mod:`raydp_hpo.trainables.native_private`) and are checked the same way.

        ``data``: a ``torch.utils.data.Dataset`` (preferred), or a ``DataLoader`` whose dataset
        is used: a plain loader must have ``batch_size`` = q·n (the charged expected batch
        over the declared size) and an Opacus ``DPDataLoader`` ``sample_rate`` = q, else it
        is refused (its q would not be the charged one). The returned loader draws Poisson
        batches at q from the trial's secret generator; the optimiser adds N(0, σ²C²) noise
        from the trial's secret noise generator, normalises by q·n and refuses step T + 1.

        ``noise_source``: :attr:`NoiseSource.SEEDED` (default) draws the noise from the trial's
        secret generator, :attr:`NoiseSource.SECURE` from ``os.urandom``; either engine draws
        it in float64 and rounds the release to a grid (:mod:`raydp_hpo.trainables.dp_step.noise`).
        """
        noise_source = _noise_source(noise_source)
        self._require_open("make_private")
        if self.settings.nonprivate:
            raise TrialContractError("a nonprivate trial cannot be made private: it has no σ")
        if self._optimizer is not None:
            raise TrialContractError("make_private was already called in this trial: call it once")
        from opacus.accountants import RDPAccountant
        from opacus.data_loader import DPDataLoader
        from torch.utils.data import DataLoader

        chosen, why = choose_engine(module, engine)
        dataset = dataset_of(self, data, DataLoader, DPDataLoader)
        if collate_fn is None and isinstance(data, DataLoader):
            collate_fn = data.collate_fn if not isinstance(data, DPDataLoader) else None
        params = {id(p) for p in module.parameters()}
        if any(id(p) not in params for g in optimizer.param_groups for p in g["params"]):
            raise InvalidParameterError(
                "the optimizer holds parameters that are not the module's: build it from "
                "module.parameters()"
            )
        module = module.to(self.device)
        build = native_engine if chosen is DPEngine.NATIVE else opacus_engine
        private_module, dp_optimizer, loader = build(self, module, optimizer, dataset, collate_fn,
                                                     noise_source)
        accountant = RDPAccountant()  # Opacus's own, on either engine: the history checked
        dp_optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=self.sample_rate))
        self._guard(dp_optimizer, private_module)
        self._optimizer, self._loader, self._accountant = dp_optimizer, loader, accountant
        self._params = list(module.parameters())
        self._record_fingerprint()
        self._input_hook = module.register_forward_pre_hook(self._note_inputs)
        self.engine = chosen
        log_choice(chosen, why, module)
        warn_noise_floor(self.noise_multiplier, sum(p.numel() for p in module.parameters()
                                                    if p.requires_grad), self.steps, self.delta)
        return private_module, dp_optimizer, loader

    def _loader_rate(self) -> Any:
        """The q the loader samples at now (Opacus: its batch sampler's)."""
        if isinstance(self._loader, NativePoissonLoader):
            return self._loader.sample_rate
        return getattr(getattr(self._loader, "batch_sampler", None), "sample_rate", None)

    def _guard(self, optimizer: Any, private_module: nn.Module) -> None:
        """Wrap ``optimizer.step``: check the engine, the weights and the batch before the
        step, refuse step T + 1, and fingerprint the weights the step leaves.

        The wrapper is a bound method of the optimiser (``types.MethodType``), as torch's
        learning-rate schedulers expect when they wrap ``step`` in turn."""
        import types

        inner_step = optimizer.step

        def step(_optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self._check_engine()
            if self._steps_taken >= self.steps:
                raise TrialContractError(
                    f"step {self._steps_taken + 1} refused: the trial was charged "
                    f"{self.steps} steps (epochs={self.privacy.epochs:g} at q="
                    f"{self.sample_rate:g}); iterate the loader make_private returned and "
                    "stop when trial.steps_taken == trial.steps (its Poisson batches are the "
                    "only ones the charge covers; do not switch to another loader)"
                )
            check_batch(self, private_module)
            before = self._history_steps()
            out = inner_step(*args, **kwargs)
            self._steps_taken += self._history_steps() - before
            self._batches_at_step = self._loader.batches_yielded
            self._record_fingerprint()
            return out

        optimizer.step = types.MethodType(step, optimizer)

    # ---- what trained the model ----------------------------------------------------------

    def _explain(self, err: Exception) -> None:
        """A trial that failed with ``err``: if the weights moved outside the DP optimiser,
        raise the TrialContractError that names that (the likelier cause) from ``err``."""
        if self._optimizer is not None and self._open:
            first = str(err).splitlines()[0] if str(err) else ""
            try:
                self._check_weights(f"the trial failed with {type(err).__name__} ({first}); "
                                    "the cause")
            except TrialContractError as contract:
                raise contract from err

    def _note_inputs(self, _module: nn.Module, args: tuple[Any, ...]) -> None:
        if args and all(isinstance(a, torch.Tensor) and a.dim() > 0 for a in args):
            self._input_spec = tuple((tuple(a.shape[1:]), a.dtype) for a in args)

    def _record_fingerprint(self) -> None:
        """After make_private and each DP step: the weights' fingerprint (kept on the device,
        no synchronisation) and version counters."""
        self._fingerprint = _fingerprint(self._params)
        self._versions = tuple(p._version for p in self._params)
        self._dp_fingerprints.append(self._fingerprint)

    def _check_weights(self, where: str, *, full: bool = True) -> None:
        """Raise unless the trainable weights are those the last DP step (or make_private)
        left: only the optimiser make_private returned may change them. Before a step
        (``full=False``) the tensors' version counters (free: any optimiser's in-place update
        bumps them); at the reports, save_model and the end also the fingerprint (which also
        sees updates through ``.data``)."""
        if self._fingerprint is None:
            return
        moved = tuple(p._version for p in self._params) != self._versions or (
            full and not torch.equal(_fingerprint(self._params), self._fingerprint))
        if moved:
            raise TrialContractError(
                f"{where}: the model's weights changed outside the DP optimizer since "
                f"{'make_private' if self._steps_taken == 0 else f'DP step {self._steps_taken}'}"
                " — stepped the original optimizer? Call step() on the optimizer make_private "
                "returned (`model, optimizer, loader = trial.make_private(...)`), never on the "
                "one you passed in, and change no weights yourself (initialise or load them "
                "before make_private). " + _FAILS
            )

    def _history_steps(self) -> int:
        return sum(int(n) for _, _, n in self._accountant.history) if self._accountant else 0

    def _check_engine(self, where: str | None = None) -> None:
        """Raise :class:`TrialContractError` unless what runs is what was charged."""
        if self._optimizer is None:
            return
        if where is None:
            self._check_weights(f"before DP step {self._steps_taken + 1}", full=False)
        else:
            self._check_weights(where)
        opt, problems = self._optimizer, []
        if not math.isclose(float(opt.noise_multiplier), self.noise_multiplier, rel_tol=_RTOL):
            problems.append(f"optimizer.noise_multiplier={opt.noise_multiplier!r}, charged "
                            f"σ={self.noise_multiplier!r}")
        if not math.isclose(float(opt.max_grad_norm), self.max_grad_norm, rel_tol=_RTOL):
            problems.append(f"optimizer.max_grad_norm={opt.max_grad_norm!r}, charged "
                            f"C={self.max_grad_norm!r}")
        if opt.expected_batch_size != self.expected_batch_size:
            problems.append(f"optimizer.expected_batch_size={opt.expected_batch_size!r}, "
                            f"charged q·n={self.expected_batch_size}")
        rate = self._loader_rate()
        if rate is None or not math.isclose(float(rate), self.sample_rate, rel_tol=_RTOL):
            problems.append(f"loader sample_rate={rate!r}, charged q={self.sample_rate!r}")
        for sigma, q, n in self._accountant.history:
            if not math.isclose(float(sigma), self.noise_multiplier, rel_tol=_RTOL):
                problems.append(f"Opacus's accountant recorded {n} steps at σ={sigma!r}, "
                                f"charged σ={self.noise_multiplier!r}")
            if not math.isclose(float(q), self.sample_rate, rel_tol=_RTOL):
                problems.append(f"Opacus's accountant recorded {n} steps at q={q!r}, "
                                f"charged q={self.sample_rate!r}")
        counted = self._history_steps()
        if counted != self._steps_taken or counted > self.steps:
            problems.append(f"Opacus's accountant counts {counted} steps, the step guard "
                            f"{self._steps_taken}, charged {self.steps}")
        if problems:
            raise TrialContractError(
                "what ran is not what was charged: " + "; ".join(problems)
                + ". σ, C and q are fixed by make_private; do not change them afterwards. "
                "The trial fails and nothing from it is released; its charge stays spent."
            )

    # ---- reports -------------------------------------------------------------------------

    def report(self, **metrics: Any) -> None:
        """An intermediate report (loss, epoch, ...): checked like every report. It may not
        carry the noisy-score keys; the score is :meth:`report_score`, the last report."""
        self._require_open("report")
        if self._scored:
            raise TrialContractError("trial.report after trial.report_score: the score must be "
                                     "the trial's last report")
        reserved = {NOISY_SCORE_KEY, SESSION_KEY, "score_noise"} & metrics.keys()
        if reserved:
            raise TrialContractError(
                f"trial.report may not set {sorted(reserved)}: the noisy score is released by "
                "trial.report_score(correct)"
            )
        self._check_engine("at trial.report")
        self._emit(dict(metrics), None)

    def report_score(self, correct: int, *, metric: str = "val_accuracy", **metrics: Any
                     ) -> float:
        """Release the validation score and report it (the trial's final report).

        ``correct``: the number of correct predictions on the validation split (an integer
        count, clipped to the declared validation size n_val). Released as
        ``(correct + noise) / n_val`` clipped to [0, 1], noise from the trial's secret score
        stream (Laplace(1/ε_s) or the calibrated Gaussian): the mechanism charged on entry.
        ``metric``: the key DPTuner selects on (``DPTuner(metric=...)``; ``"val_accuracy"``,
        the default, is the only one DPTuner accepts for a private score). Returns the released score. With no score release declared
        (a final run: ``score_epsilon=None``) the score is reported without noise, as the
        built-in trainable does; it is read by no selection.
        """
        self._require_open("report_score")
        if self._scored:
            raise TrialContractError("trial.report_score was already called: one score per trial")
        if self._optimizer is None and not self.settings.nonprivate:
            raise TrialContractError(
                "trial.report_score before trial.make_private: the trial must train with the "
                "wrapped module, optimizer and loader"
            )
        if not self._saved:
            raise TrialContractError(
                f"no release checkpoint: call trial.save_model(model, model_fn=...) before "
                f"trial.report_score (DPTuner releases the model from {USER_MODEL_FILE})"
            )
        if isinstance(correct, bool) or not isinstance(correct, (int, np.integer)) or correct < 0:
            raise InvalidParameterError(
                f"correct must be a count of correct validation predictions (an int >= 0), "
                f"got {correct!r}"
            )
        if metric in (NOISY_SCORE_KEY, SESSION_KEY, TRIAL_EPSILON_KEY):
            raise InvalidParameterError(f"metric={metric!r} is a reserved result key")
        self._check_engine("at trial.report_score")
        if self._steps_taken == 0:
            raise TrialContractError(
                "trial.report_score after no DP step (trial.steps_taken = 0): a model the "
                "DP optimizer never stepped is not released. Call optimizer.step() on the "
                "optimizer make_private returned, once per batch of its loader. " + _FAILS
            )
        n_val = self.validation_size
        if n_val is None:
            raise TrialContractError(
                "the validation size is not declared: pass trial_session(config, "
                "validation_size=n_val) or DPTuner(validation_size=...)"
            )
        count = min(int(correct), n_val)
        out = dict(metrics)
        if self.score is not None:
            noisy = count + self.score.draw(self._score_rng)
            value = min(1.0, max(0.0, noisy / n_val))
            out[NOISY_SCORE_KEY] = self.score.epsilon
            out["score_noise"] = self.score.noise.value
        else:
            value = count / n_val
        out[metric] = value
        out["steps"] = self._steps_taken
        out[TRIAL_EPSILON_KEY] = self.trial_epsilon()
        self._scored = True
        self._emit(out, str(self.checkpoint_dir))
        return value

    def trial_epsilon(self) -> float:
        """This trial's own ε under RDP at the budget's δ: its steps so far and its score (not
        the search's ε, which is the certificate's)."""
        mech = self.privacy.mechanism_of_evaluations(max(1, self._steps_taken))
        return float(epsilon(trial_mechanism(mech, self.score), self.delta, Accountant.RDP))

    def _emit(self, metrics: dict[str, Any], checkpoint: str | None) -> None:
        metrics[SESSION_KEY] = self.charge_id or ""
        if self._report is None:
            self.results.append(metrics)
        else:
            self._report(metrics, checkpoint)

    # ---- the release checkpoint ----------------------------------------------------------

    def save_model(self, model: nn.Module, *, model_fn: Any = None,
                   model_kwargs: Mapping[str, Any] | None = None) -> Path:
        """Write the model DPTuner releases if this trial is selected
        (:func:`~raydp_hpo.trainables.release.save_user_model`'s format).

        ``model_fn``: a module-level class or function (or ``"module:callable"``) with
        ``model_fn(**model_kwargs)`` building the architecture; default: the model's class.
        The state dict is that of the module inside the engine's wrapper. Checked now: the
        model must be the one the DP optimiser trained (its weights those of a DP step) and
        the rebuilt model must accept the state dict (a mismatch fails here, not at release).
        Beside it, the rebuilt model is exported with ``torch.export`` (example input: zeros
        of the training batches' shapes, batch dimension dynamic) to ``user_model.pt2``, so
        the release loads in a process that cannot import ``model_fn`` (a class of the
        training script): :func:`~raydp_hpo.trainables.release.load_released_model`. A model
        the exporter cannot trace warns here, naming why; its release keeps the state-dict
        route only.
        """
        self._require_open("save_model")
        if self._scored:
            raise TrialContractError("trial.save_model after trial.report_score: save first")
        inner = _unwrap(model)
        self._check_weights("at trial.save_model")
        if self._params and not _same_tensors(list(inner.parameters()), self._params) and not any(
                torch.equal(_fingerprint(list(inner.parameters())).to(fp.device), fp)
                for fp in self._dp_fingerprints):
            raise TrialContractError(
                "at trial.save_model: the model saved is not the one the DP optimizer "
                "trained (its weights are those of neither make_private nor any DP step): "
                "save the module make_private returned. " + _FAILS
            )
        fn = type(inner) if model_fn is None else model_fn
        kwargs = dict(model_kwargs or {})
        from raydp_hpo.trainables.release import model_fn_reference

        reference = model_fn_reference(fn)
        try:
            # the callable itself where given: in a Ray worker a class of the driver script
            # arrives by value and is not importable as ``__main__:Name`` (the driver imports it)
            rebuilt = build_user_model(reference, kwargs) if isinstance(fn, str) else fn(**kwargs)
            if not isinstance(rebuilt, nn.Module):
                raise TypeError(f"it returned {type(rebuilt).__name__}, not a torch.nn.Module")
            rebuilt.load_state_dict(inner.state_dict())
        except (RayDPHPOError, RuntimeError, TypeError) as err:
            raise TrialContractError(
                f"{reference}(**{kwargs!r}) does not rebuild the trained model ({err}); pass "
                "the model_fn and model_kwargs that build it"
            ) from err
        path = save_user_model(self.checkpoint_dir / USER_MODEL_FILE, inner.state_dict(),
                               model_fn=reference, model_kwargs=kwargs)
        why = save_program(program_path(path), rebuilt, self._input_spec)
        if why is not None:
            where = (" — a class of the training script (__main__), so it loads nowhere else: "
                     "define the model in a module the loading process can import"
                     if reference.startswith("__main__:") else "")
            warnings.warn(
                f"trial.save_model: {type(inner).__name__} cannot be exported with "
                f"torch.export ({why}); the release holds its state_dict only and loads only "
                f"where model_fn {reference!r} can be imported{where}", UserWarning,
                stacklevel=2,
            )
        self._saved = True
        return path

    # ---- helpers -------------------------------------------------------------------------

    @torch.no_grad()
    def count_correct(self, model: nn.Module, loader: Any) -> int:
        """Correct predictions (``argmax`` of the output) of ``model`` over ``loader``'s
        ``(inputs, labels)`` batches, on :attr:`device`: the count for :meth:`report_score`."""
        was_training = model.training
        model.eval()
        correct = 0
        for x, y in loader:
            pred = model(x.to(self.device)).argmax(-1).cpu()
            correct += int((pred == y.cpu()).sum())
        model.train(was_training)
        return correct

    def _require_open(self, what: str) -> None:
        if not self._open:
            raise TrialContractError(
                f"trial.{what} outside its `with raydp_hpo.trial_session(config) as trial:` "
                "block: the trial is admitted and checked only inside it"
            )

    def _close(self) -> None:
        self._open = False
        if self._input_hook is not None:
            self._input_hook.remove()

    def _finish(self) -> None:
        """A block left normally: the score must have been reported."""
        if self._optimizer is not None:
            self._check_weights("at the end of the trial")
        if not self._scored:
            raise TrialContractError(
                "the trial ended without trial.report_score(correct): a trial that releases "
                "no noisy score counts as failed. Call trial.save_model(...) then "
                "trial.report_score(correct_validation_predictions) before leaving the block"
            )


def _declared_size(name: str, from_config: int | None, given: int | None) -> int | None:
    if given is not None and from_config is not None and int(given) != from_config:
        raise InvalidParameterError(
            f"{name}={given} differs from config['raydp'].{name}={from_config} (declared by "
            "the searcher): drop the argument"
        )
    return from_config if from_config is not None else given


@contextlib.contextmanager
def trial_session(
    config: Mapping[str, Any],
    *,
    dataset_size: int | None = None,
    validation_size: int | None = None,
    ledger: LedgerLike | None = None,
    secret_seed: int | None = None,
    device: str | torch.device | None = None,
    report: ReportFn | None = None,
) -> Iterator[TrialSession]:
    """Run one trial of your own under the guarantee (module docstring)::

        def trainable(config):
            with raydp_hpo.trial_session(config) as trial:
                model, optimizer, loader = trial.make_private(model, optimizer, train_set)
                ...  # your loop; trial.steps at most
                trial.save_model(model, model_fn=MyNet, model_kwargs={...})
                trial.report_score(correct)

    ``config``: the trial's config (with the searcher's ``config["raydp"]``).
    ``dataset_size`` / ``validation_size``: the declared public sizes, when the config's
    block does not declare them (DPTuner declares them). ``ledger``: outside Ray, the
    :class:`~raydp_hpo.ledger.filter.PrivacyLedger` to admit against. ``secret_seed``: as
    for ``train_dp`` (default: OS entropy; never a config key). ``report``: where reports go
    (default: ``tune.report`` inside a Tune trial, else :attr:`TrialSession.results`).

    On entry the trial is admitted (charged, or checked against its plan's charge) or the
    call raises and nothing runs. Raises :class:`~raydp_hpo.errors.TrialContractError` for
    every break of the contract (module docstring).
    """
    if "seed" in config:
        raise InvalidParameterError(
            "config key 'seed' is not allowed: a trial's seed drives its DP noise and a config "
            "is logged; pass trial_session(config, secret_seed=...) or nothing"
        )
    settings = RaydpSettings.from_config(config)
    in_tune = _in_tune()
    if not settings.needs_ledger:
        raise TrialContractError(
            "config['raydp'] admits no charge: a trial session needs the searcher's block "
            "(run the trainable under DPTuner) or, outside Tune, a block with charge=True and "
            "charge_id, and ledger=<PrivacyLedger>"
        )
    if settings.nonprivate:
        raise TrialContractError("trial_session runs DP-SGD trials; this block is nonprivate")
    if settings.data_view is not None and settings.data_view.get("kind", "full") != "full":
        raise TrialContractError(
            f"trial_session trains on the full training split; the searcher asked for data "
            f"view {settings.data_view.get('kind')!r} (use the built-in trainable for "
            "subsampled or partitioned searches)"
        )
    n = _declared_size("dataset_size", settings.dataset_size, dataset_size)
    if n is None:
        raise InvalidParameterError(
            "the training-set size is not declared: q and the DP-SGD normaliser come from the "
            "declared public size. Pass trial_session(config, dataset_size=n) or "
            "DPTuner(dataset_size=...)"
        )
    n_val = _declared_size("validation_size", settings.validation_size, validation_size)
    privacy = privacy_from_config(config, int(n))
    if privacy.optimizer in (Optimizer.GD, Optimizer.ADADP):
        raise InvalidParameterError(
            f"optimizer={privacy.optimizer.value!r} is not supported by trial_session "
            "(DP-SGD with Poisson sampling); use sgd, momentum or adam, or the built-in trainable"
        )
    score = settings.score_release
    if score is not None and n_val is None:
        raise InvalidParameterError(
            "the validation size is not declared but the trial releases a noisy score over it: "
            "pass trial_session(config, validation_size=n_val) or DPTuner(validation_size=...)"
        )
    mechanism = trial_mechanism(privacy.mechanism(), score)
    owner = f"{settings.experiment}:{settings.charge_id or settings.covered_by}"
    if in_tune:
        from ray import tune

        owner = f"{settings.experiment}:trial:{tune.get_context().get_trial_id() or 'trial'}"
    ledger = resolve_ledger(settings, ledger)
    charge_id = admit(settings, mechanism, ledger, owner=owner)  # raises: nothing runs
    # ---- admitted ----------------------------------------------------------------------
    delta = float(config.get("target_delta", 0.0)) or ledger_delta(settings, ledger) or 1e-5
    if secret_seed is None:
        seed = secrets.randbits(128)
    else:
        if isinstance(secret_seed, bool) or not isinstance(secret_seed, (int, np.integer)):
            raise InvalidParameterError(f"secret_seed must be an int or None, got {secret_seed!r}")
        seed = derive_seed(int(secret_seed) % 2**128, settings.trial_index or 0)
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if report is None and in_tune:
        report = _tune_report
    tmp = Path(tempfile.mkdtemp(prefix="raydp-trial-"))
    ckpt = tmp / "checkpoint"
    ckpt.mkdir()
    session = TrialSession(
        config, settings, privacy, score, dataset_size=int(n), validation_size=n_val,
        charge_id=charge_id, delta=delta, seed=seed, device=dev, report=report,
        checkpoint_dir=ckpt,
    )
    try:
        yield session
        session._finish()
    except ValueError as err:  # e.g. Opacus's "grad accumulation" after the wrong optimiser
        session._explain(err)
        raise
    finally:
        session._close()
        if report is not None:  # Tune copied the checkpoint at report time
            shutil.rmtree(tmp, ignore_errors=True)
