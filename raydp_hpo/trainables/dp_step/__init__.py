"""Per-example clipping and Gaussian noise: the privatised gradient of one DP-SGD step.

For a Poisson batch B (each record in independently with probability q) the privatised
gradient is (Abadi et al. 2016, Alg. 1; Opacus' convention for the normalisation)

    g̃ = ( Σ_{i∈B} clip_C(∇ℓ_i) + N(0, σ²C²·I) ) / (q·n_pub),   clip_C(v) = v · min(1, C/‖v‖),

with n_pub a declared public size (never the realised n, which differs between neighbours),
whose release is one subsampled Gaussian mechanism with noise multiplier σ.

Two implementations of Σ clip_C(∇ℓ_i), both checked against a one-example-at-a-time
reference in ``tests/raydp_hpo/trainables/test_dp_step.py``:

* :class:`BookKeepingClipper` ("book-keeping", Bu et al. 2023, "Differentially private
  optimization on large model at small cost") — models whose trainable parameters all live in
  ``nn.Linear``, ``nn.Conv1d``/``nn.Conv2d`` (groups = 1, zero padding) and
  ``nn.GroupNorm``/``nn.LayerNorm`` layers: every model of :mod:`raydp_hpo.trainables.models`. One
  backward pass to the layer outputs gives each layer's output gradient g; with a the layer's
  input (unfolded into patches a_t for a convolution, t over output positions), the
  per-example weight gradient is Σ_t g_t a_tᵀ, whose squared norm is either
  Σ_{t,t'} (g_t·g_t')(a_t·a_t') (ghost norm; ‖g‖²‖a‖² when T = 1, Goodfellow 2015) or taken
  from the materialised per-example gradient (from the unfolded input and one batched
  matmul, or for a convolution from one grouped-convolution weight backward), chosen per
  layer by :attr:`NormStrategy.AUTO`'s fixed rule (deterministic) or, with
  :attr:`NormStrategy.TUNED`, by timing them on the first batch (public random tensors of the
  same shapes); the methods agree up to floating-point rounding. Affine
  normalisation parameters have per-example gradients Σ g ⊙ x̂ and Σ g. The clipped sum
  Σ_i c_i ∇ℓ_i, c_i = min(1, C/(‖∇ℓ_i‖ + 10⁻⁶)), is then formed from the same g and a.
* :class:`OpacusClipper` — any model Opacus supports: per-example gradients from
  ``opacus.GradSampleModule`` (hooks), then clip and sum. :func:`make_clipper` in ``"auto"``
  mode falls back to it for a layer book-keeping does not cover.

**Non-finite per-example gradients.** An example whose computed squared gradient norm is
inf or NaN (its activations overflowed, e.g. a record with features near the float32 maximum)
contributes exactly 0 to the sum, in both clippers: its rows are zeroed with ``torch.where``
before the sum, because c_i · NaN would stay NaN. Without this, one such record makes the
released gradient NaN if and only if it is present: no noise hides that. Each example's
contribution is then clip_C(∇ℓ_i) or 0, still of norm ≤ C, so the sensitivity C of the sum
under add/remove-one is unchanged (``tests/raydp_hpo/trainables/test_dp_step.py`` checks the
clipped sum with and without such a record).

:class:`GaussianNoise` adds the noise and counts every release so that tests can compare what
actually ran with the declared mechanism. :func:`poisson_batch` draws the Poisson batch in
O(batch) rather than O(n), from geometric gaps between the selected records;
:class:`PoissonBatches` (what training uses) draws the same independent batches a block of
steps at a time, so the few small tensor operations a batch needs run once per block.

The package, one concern a module: :mod:`.clipping` (the interface both clippers share),
:mod:`.bookkeeping` with :mod:`.layers` and :mod:`.strategies` (book-keeping clipping),
:mod:`.opacus_clipper`, :mod:`.noise` and :mod:`.sampling`. Every name of the former single
module ``dp_step.py`` is importable from here.
"""

# ruff: noqa: F401  (the imports below are the package's names, private ones included)
from __future__ import annotations

from raydp_hpo.trainables.dp_step.bookkeeping import (
    _MISSING,
    _TUNING_ROUNDS,
    _TUNING_WARMUP,
    BookKeepingClipper,
    _bk_refusals,
    _fastest_strategy,
    _record_layers,
    bk_unsupported_reason,
    make_clipper,
    shadowed_forwards,
    supports_bk,
)
from raydp_hpo.trainables.dp_step.clipping import _EPS, _Clipper, _row_sq_norms, _zero_rows
from raydp_hpo.trainables.dp_step.layers import (
    _BK_TYPES,
    _CONV_TYPES,
    _NORM_TYPES,
    _AffineNormGrad,
    _conv_pad,
    _conv_per_example_weight_grad,
    _conv_unfold,
    _GhostGrad,
    _GradSink,
    _layer_grad,
    _layer_shape,
    _LayerGrad,
    _MaterialisedGrad,
    _matrix_layer_grad,
    _OuterProductGrad,
)
from raydp_hpo.trainables.dp_step.noise import (
    SNAP_BITS,
    SUPPORT_BOUND,
    GaussianNoise,
    NoiseFloorWarning,
    NoiseSource,
    StandardNormal64,
    _same_device,
    exact_gaussian_release,
    noise_floor_delta,
    noise_source,
    snap_grid,
    warn_noise_floor,
)
from raydp_hpo.trainables.dp_step.opacus_clipper import OpacusClipper
from raydp_hpo.trainables.dp_step.sampling import (
    _DENSE_POISSON_MAX_N,
    _MAX_POISSON_N,
    _POISSON_BLOCK,
    _POISSON_BLOCK_VALUES,
    PoissonBatches,
    _bernoulli_by_gaps,
    _bernoulli_by_gaps_block,
    _dense_poisson,
    _gap_chunk,
    _geometric_gaps,
    _poisson_args,
    poisson_batch,
)
from raydp_hpo.trainables.dp_step.strategies import (
    _TUNED_CANDIDATE_FACTOR,
    NormStrategy,
    _auto_strategy,
    _candidate_strategies,
    _operation_counts,
)

__all__ = [
    "BookKeepingClipper",
    "OpacusClipper",
    "GaussianNoise",
    "NoiseSource",
    "StandardNormal64",
    "exact_gaussian_release",
    "noise_floor_delta",
    "make_clipper",
    "NormStrategy",
    "poisson_batch",
    "PoissonBatches",
    "supports_bk",
    "bk_unsupported_reason",
]
