"""The DP step's pieces: Gaussian noise and its public normaliser, Poisson batches, clipping."""

from __future__ import annotations

import copy
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.trainables import dp_step
from raydp_hpo.trainables.dp_step import (
    BookKeepingClipper,
    GaussianNoise,
    NormStrategy,
    OpacusClipper,
    StandardNormal64,
    _bernoulli_by_gaps,
    bk_unsupported_reason,
    make_clipper,
    poisson_batch,
    supports_bk,
)
from raydp_hpo.trainables.dp_step.noise import snap_grid
from raydp_hpo.trainables.models import MODEL_NAMES, build_model

CUDA = torch.cuda.is_available()


def _params_with_grads(seed: int = 0) -> list[nn.Parameter]:
    torch.manual_seed(seed)
    model = build_model("cnn1d", (40,), 10)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


# -- A. Gaussian noise ------------------------------------------------------------------


def _expected_releases(seed: int, grads: list[torch.Tensor], std: float, normaliser: float,
                       releases: int = 1) -> list[list[torch.Tensor]]:
    """What consecutive releases must be (issue 40): one flat float64 N(0, 1) draw of every
    parameter's values from the generator's stream (StandardNormal64), times std, plus
    g/normaliser in float64, rounded to the grid λ = snap_grid(std), cast to float32; g is
    each release's input (the previous release for a gradient still in the buffer)."""
    normal = StandardNormal64(torch.Generator().manual_seed(seed))
    sizes = [g.numel() for g in grads]
    lam = snap_grid(std)
    out = []
    for _ in range(releases):
        flat = normal.fill_(torch.empty(sum(sizes), dtype=torch.float64)).mul_(std)
        grads = [(n.view_as(g) + (g / normaliser).double()).div_(lam).round_().mul_(lam).float()
                 for n, g in zip(flat.split(sizes), grads)]
        out.append(grads)
    return out


def test_noise_is_one_flat_draw_split_in_parameter_order():
    """N(0, (σC/normaliser)²) drawn once for all parameters with the generator, split in
    parameter order, plus g/normaliser (formed in float64, rounded to the public grid):
    (g + N(0, σ²C²))/normaliser in law, one draw."""
    params = _params_with_grads()
    grads = [p.grad.clone() for p in params]
    sigma, clip, normaliser = 1.3, 0.7, 0.05 * 4000
    GaussianNoise(sigma, clip, normaliser, torch.Generator().manual_seed(3)).privatise(params)
    (expected,) = _expected_releases(3, grads, sigma * clip / normaliser, normaliser)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)


def test_noise_divides_by_the_public_normaliser_and_counts_releases():
    params = _params_with_grads()
    grads = [p.grad.clone() for p in params]
    noise = GaussianNoise(0.0, 1.0, 37.5, torch.Generator().manual_seed(0))
    noise.privatise(params)
    noise.privatise(params)
    assert noise.releases == 2
    for p, g in zip(params, grads):
        torch.testing.assert_close(p.grad, g / 37.5**2, rtol=1e-6, atol=0)


def test_noise_buffer_is_reused_and_a_gradient_still_in_it_is_copied_first():
    """Release after release for the same parameters the noise goes into the same buffer
    (each p.grad is the same tensor again, as PyTorch's own .grad buffers are), with the
    values of consecutive flat draws; privatising a gradient that is still the last
    release's (it lives in the buffer) adds the new noise to its old values, not to the
    new draw."""
    params = _params_with_grads()
    grads = [p.grad.clone() for p in params]
    sigma, clip, normaliser = 0.9, 1.1, 64.0
    noise = GaussianNoise(sigma, clip, normaliser, torch.Generator().manual_seed(5))
    expected1, expected2 = _expected_releases(5, grads, sigma * clip / normaliser, normaliser,
                                              releases=2)
    noise.privatise(params)
    first = [p.grad for p in params]
    for p, e in zip(params, expected1):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)
    noise.privatise(params)  # p.grad is the buffer itself here
    for p, e, f in zip(params, expected2, first):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)
        assert p.grad is f  # the same buffer view again
    assert noise.releases == 2


def test_noise_has_the_declared_standard_deviation():
    p = nn.Parameter(torch.zeros(200_000))
    p.grad = torch.zeros_like(p)
    GaussianNoise(2.0, 0.5, 4.0, torch.Generator().manual_seed(1)).privatise([p])
    # std of the mean-zero output: σC/normaliser = 0.25; 200k draws: s.e. of s ≈ 0.25/632.
    assert float(p.grad.std()) == pytest.approx(0.25, rel=0.01)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "128"])
def test_normaliser_must_be_a_positive_finite_number(bad):
    with pytest.raises(InvalidParameterError, match="normaliser"):
        GaussianNoise(1.0, 1.0, bad, torch.Generator())


@pytest.mark.parametrize(("sigma", "clip"), [(-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0)])
def test_noise_multiplier_and_clip_norm_are_checked(sigma, clip):
    with pytest.raises(InvalidParameterError):
        GaussianNoise(sigma, clip, 10.0, torch.Generator())


def test_refused_privatise_changes_nothing():
    params = _params_with_grads()
    params[-1].grad = None
    grads = [None if p.grad is None else p.grad.clone() for p in params]
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    noise = GaussianNoise(1.0, 1.0, 10.0, gen)
    with pytest.raises(RayDPHPOError, match="p.grad"):
        noise.privatise(params)
    assert noise.releases == 0 and torch.equal(gen.get_state(), state)
    for p, g in zip(params[:-1], grads[:-1]):
        assert torch.equal(p.grad, g)


def test_generator_on_another_device_is_refused_before_any_draw():
    p = nn.Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    with pytest.raises(RayDPHPOError, match="Generator"):
        GaussianNoise(1.0, 1.0, 10.0, gen).privatise([p])
    assert torch.equal(gen.get_state(), state)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (the device path is exercised on CPU only)")
def test_noise_is_drawn_on_the_gpu_with_a_gpu_generator():
    params = [nn.Parameter(torch.zeros(1000, device="cuda"))]
    params[0].grad = torch.zeros_like(params[0])
    gen = torch.Generator(device="cuda").manual_seed(0)
    GaussianNoise(1.0, 1.0, 1.0, gen).privatise(params)
    assert params[0].grad.device.type == "cuda"
    assert float(params[0].grad.std()) == pytest.approx(1.0, rel=0.15)


# -- B. Poisson batches in O(batch) ---------------------------------------------------------
# Law tests at level 1e-3 with fixed seeds (so deterministic: they pass or fail every time).
# Each would reject a sampler whose size law or per-index law were off by a few percent.

P_MIN = 1e-3


def _binomial_chisquare(sizes: np.ndarray, n: int, q: float) -> float:
    """p-value of Pearson's χ² for ``sizes`` against Binomial(n, q), tail bins merged."""
    ks = np.arange(n + 1)
    pmf = stats.binom.pmf(ks, n, q)
    expected = pmf * len(sizes)
    keep = expected >= 5
    lo, hi = ks[keep][0], ks[keep][-1]
    edges = np.r_[-0.5, np.arange(lo, hi) + 0.5, n + 0.5]
    observed, _ = np.histogram(sizes, bins=edges)
    exp_binned = np.diff(stats.binom.cdf(edges, n, q)) * len(sizes)
    return float(stats.chisquare(observed, exp_binned).pvalue)


@pytest.mark.parametrize(
    ("n", "q"),
    [
        (5000, 0.01),  # gap sampler, small batches
        (60_000, 128 / 60_000),  # MNIST-sized, batch 128
        (8000, 0.2),  # gap sampler, large q: Var differs from Poisson(nq)'s by 25 %, so a
        #               Poisson-size mutant fails here
        (3000, 0.05),  # dense path (n ≤ 4096)
    ],
)
def test_poisson_batch_size_is_binomial_and_every_index_has_rate_q(n, q):
    """Sizes vs Binomial(n, q) (χ²), and per-index inclusion counts: under Poisson sampling
    count_i ~ Binomial(R, q) independently, so Σ (c_i − Rq)²/(Rq(1 − q)) is ≈ χ²(n), and
    every count lies in Binomial(R, q) quantiles at level 1e-3/n each (Bonferroni)."""
    gen = torch.Generator().manual_seed(11)
    rounds = 2000
    counts = np.zeros(n)
    sizes = np.empty(rounds, dtype=int)
    for r in range(rounds):
        idx = poisson_batch(n, q, gen)
        assert idx.dtype == torch.int64
        assert bool((idx[1:] > idx[:-1]).all())  # sorted, distinct
        sizes[r] = len(idx)
        counts[idx.numpy()] += 1
    assert _binomial_chisquare(sizes, n, q) > P_MIN
    # Variance: (R − 1)s²/σ² ≈ χ²(R − 1) with σ² = nq(1 − q) (sizes are ≈ normal here).
    var_stat = (rounds - 1) * sizes.var(ddof=1) / (n * q * (1 - q))
    assert P_MIN / 2 < stats.chi2.cdf(var_stat, rounds - 1) < 1 - P_MIN / 2
    stat = float(((counts - rounds * q) ** 2).sum() / (rounds * q * (1 - q)))
    assert stats.chi2.sf(stat, n) > P_MIN and stats.chi2.cdf(stat, n) > P_MIN
    lo = stats.binom.ppf(P_MIN / (2 * n), rounds, q)
    hi = stats.binom.isf(P_MIN / (2 * n), rounds, q)
    assert lo <= counts.min() and counts.max() <= hi, (counts.min(), counts.max(), lo, hi)


@pytest.mark.parametrize("chunk", [None, 2])
def test_gap_sampler_has_the_joint_law_of_independent_inclusions(chunk):
    """n = 6, q = 0.3: each of the 2⁶ subsets S must come out with probability
    q^|S| (1 − q)^(6 − |S|) (χ², 20 000 draws; smallest expected count ≈ 15). ``chunk=2``
    draws two gaps at a time, so most batches go through the continuation path."""
    n, q, draws = 6, 0.3, 20_000
    gen = torch.Generator().manual_seed(3)
    tally: Counter[tuple[int, ...]] = Counter()
    for _ in range(draws):
        idx = _bernoulli_by_gaps(n, q, gen, chunk=chunk)
        assert idx.dtype == torch.int64
        tally[tuple(idx.tolist())] += 1
    subsets = [s for k in range(n + 1) for s in itertools.combinations(range(n), k)]
    assert set(tally) <= set(subsets)  # sorted, distinct, inside {0, …, n − 1}
    expected = [draws * q ** len(s) * (1 - q) ** (n - len(s)) for s in subsets]
    assert stats.chisquare([tally[s] for s in subsets], expected).pvalue > P_MIN


def test_gap_sampler_never_repeats_a_record_and_an_infinite_gap_ends_the_batch(monkeypatch):
    """torch's geometric sampler gives a gap of 0 for a uniform of exactly 1 (possible on CUDA,
    whose uniforms lie in (0, 1]) and an infinite gap for exactly 0 (CPU, [0, 1)). Forced here:
    the zero gaps must not repeat a record (that would double its weight in the sum), the
    infinite one must end the batch."""

    def fake_geometric(self, p, *, generator=None):
        pattern = torch.tensor([0.0, 2.0, 0.0, 3.0, math.inf], dtype=self.dtype)
        return self.copy_(pattern.repeat(len(self) // 5 + 1)[: len(self)])

    monkeypatch.setattr(torch.Tensor, "geometric_", fake_geometric)
    idx = _bernoulli_by_gaps(20, 0.3, torch.Generator().manual_seed(0), chunk=7)
    assert idx.tolist() == [0, 2, 3, 6]  # gaps 1, 2, 1, 3 (zeros raised to 1), then inf


def test_poisson_batch_edge_cases_and_refusals():
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(poisson_batch(7, 1.0, gen), torch.arange(7))
    assert poisson_batch(np.int64(5000), np.float64(0.01), gen).dtype == torch.int64  # numpy ok
    assert poisson_batch(0, 0.5, gen).numel() == 0
    for n, q in [(-1, 0.5), (10, 0.0), (10, 1.5), (10, math.nan), (2.5, 0.1), (10, True),
                 (2**53, 0.01)]:
        with pytest.raises(InvalidParameterError):
            poisson_batch(n, q, gen)  # type: ignore[arg-type]


def test_poisson_batch_is_reproducible_from_the_generator_state():
    a = poisson_batch(100_000, 0.003, torch.Generator().manual_seed(9))
    b = poisson_batch(100_000, 0.003, torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [None, 2])
def test_block_sampler_batches_have_the_joint_law_and_are_independent(chunk):
    """Batches drawn a block ahead: n = 3, q = 0.3, pairs of consecutive batches (blocks of
    5, so pairs also straddle two blocks) must come out with the product law
    P(S)·P(S') over all 8 × 8 pairs of subsets (χ², 40 000 pairs; smallest expected count
    ≈ 17), i.e. each batch has the Poisson law and consecutive batches are independent.
    ``chunk=2`` sends most rows through the continuation."""
    n, q, pairs, block = 3, 0.3, 40_000, 5
    gen = torch.Generator().manual_seed(4)
    batches = []
    while len(batches) < 2 * pairs:
        batches += dp_step._bernoulli_by_gaps_block(n, q, gen, block, chunk=chunk)
    tally: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter(
        (tuple(a.tolist()), tuple(b.tolist())) for a, b in zip(batches[0::2], batches[1::2])
    )
    subsets = [s for k in range(n + 1) for s in itertools.combinations(range(n), k)]
    cells = list(itertools.product(subsets, subsets))
    assert set(tally) <= set(cells)  # sorted, distinct, inside {0, …, n − 1}

    def law(s):
        return q ** len(s) * (1 - q) ** (n - len(s))

    expected = [pairs * law(a) * law(b) for a, b in cells]
    assert stats.chisquare([tally[c] for c in cells], expected).pvalue > P_MIN


def test_block_sampler_batch_sizes_are_binomial_at_a_realistic_size():
    """n = 60 000, q = 128/n through PoissonBatches (the gap path, blocks of 32): the sizes of
    3 200 batches are Binomial(n, q) (χ² on 8 equiprobable-ish bins) and every index stays
    inside {0, …, n − 1}, sorted and distinct."""
    n, q = 60_000, 128 / 60_000
    sampler = dp_step.PoissonBatches(n, q, torch.Generator().manual_seed(6))
    sizes = []
    for _ in range(3_200):
        idx = sampler.next()
        assert idx.dtype == torch.int64
        if idx.numel():
            assert int(idx[0]) >= 0 and int(idx[-1]) < n and bool((idx.diff() > 0).all())
        sizes.append(idx.numel())
    edges = [-0.5, *stats.binom.ppf([i / 8 for i in range(1, 8)], n, q), n + 0.5]
    observed = np.histogram(sizes, bins=edges)[0]
    expected = len(sizes) * np.diff(stats.binom.cdf(np.floor(edges), n, q))
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > P_MIN


def test_block_sampler_resumed_from_its_state_draws_what_an_uninterrupted_one_draws():
    """State = the generator's state + the batches drawn ahead: restored into a fresh sampler
    mid-block, the next batches are exactly the uninterrupted sampler's."""
    n, q = 50_000, 0.002
    straight = dp_step.PoissonBatches(n, q, torch.Generator().manual_seed(1), block=4)
    first = dp_step.PoissonBatches(n, q, torch.Generator().manual_seed(1), block=4)
    expected = [straight.next() for _ in range(11)]
    got = [first.next() for _ in range(6)]
    saved_rng, pending = first.generator.get_state(), first.state()
    assert len(pending["pending"]) == 2  # 6 of the 8 drawn in two blocks are used
    resumed = dp_step.PoissonBatches(n, q, torch.Generator().manual_seed(99), block=4)
    resumed.generator.set_state(saved_rng)
    resumed.load(pending)
    got += [resumed.next() for _ in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    resumed.reset()
    assert not resumed.state()["pending"]
    # batches drawn for another n (or q) are dropped, not reused
    other = dp_step.PoissonBatches(n - 1, q, torch.Generator().manual_seed(1), block=4)
    other.load(pending)
    assert not other.state()["pending"]


def test_block_sampler_caps_the_positions_of_one_block():
    """A large expected batch draws fewer steps per block (at most ~2^20 gap positions), not
    32 blocks of the full size."""
    n, q = 10_000_000, 0.25
    sampler = dp_step.PoissonBatches(n, q, torch.Generator().manual_seed(0))
    sampler.next()
    chunk = dp_step._gap_chunk(n, q)
    assert len(sampler.state()["pending"]) == max(1, 2**20 // chunk) - 1


def test_block_sampler_raises_zero_gaps_and_stops_at_an_infinite_one(monkeypatch):
    """The block path clamps a zero gap to 1 (no record twice) and an infinite gap ends its
    row, as the single-batch sampler does; the integer conversion never sees inf."""

    def fake_geometric(self, p, *, generator=None):
        pattern = torch.tensor([0.0, 2.0, 0.0, 3.0, math.inf], dtype=self.dtype)
        flat = pattern.repeat(self.numel() // 5 + 1)[: self.numel()]
        return self.copy_(flat.view(self.shape))

    monkeypatch.setattr(torch.Tensor, "geometric_", fake_geometric)
    rows = dp_step._bernoulli_by_gaps_block(20, 0.3, torch.Generator().manual_seed(0), 2, chunk=5)
    assert [r.tolist() for r in rows] == [[0, 2, 3, 6], [0, 2, 3, 6]]


def test_block_sampler_small_sets_draw_each_batch_and_bad_settings_are_refused():
    gen = torch.Generator().manual_seed(0)
    dense = dp_step.PoissonBatches(100, 0.3, gen)
    state = gen.get_state()
    dense.next()
    assert not dense.state()["pending"] and not torch.equal(gen.get_state(), state)  # when asked
    assert dp_step.PoissonBatches(7, 1.0, gen).next().tolist() == list(range(7))
    for n, q, block in [(-1, 0.1, 4), (10, 0.0, 4), (10, 1.5, 4), (2.5, 0.1, 4),
                        (2**53, 0.01, 4), (10_000, 0.01, 0), (10_000, 0.01, True)]:
        with pytest.raises(InvalidParameterError):
            dp_step.PoissonBatches(n, q, gen, block=block)


# -- C. Book-keeping clipping for Linear, Conv1d/2d, GroupNorm, LayerNorm ---------------------
# Every path is checked against the slow reference: one forward/backward per example, clip,
# sum. Tolerance: ‖ours − reference‖ / ‖reference‖ ≤ 1e-5 per parameter (float32; measured
# ≤ 1.1e-6 over every model and path). Clip norms: one that clips every example, one none.

REL_TOL = 1e-5
CLIPS = (0.05, 1e6)
SHAPES = {"mlp": (12,), "linear": (12,), "cnn1d": (40,), "cnn2d": (3, 9, 11),
          "random_kernels1d": (40,)}


def _reference_clipped_sums(model: nn.Module, x, y) -> dict[float, list[torch.Tensor]]:
    """Σ_i clip_C(∇ℓ_i) for each C in CLIPS, one forward/backward per example (the slow,
    obviously correct reference; Opacus' factor C/(‖v‖ + 1e-6))."""
    params = [p for p in model.parameters() if p.requires_grad]
    per_example = []
    for i in range(len(x)):
        loss = nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum")
        per_example.append(torch.autograd.grad(loss, params))
    sums = {}
    for clip in CLIPS:
        total = [torch.zeros_like(p) for p in params]
        for grads in per_example:
            norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
            for t, g in zip(total, grads):
                t += min(1.0, clip / (norm + 1e-6)) * g
        sums[clip] = total
    return sums


def _without_bias(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(getattr(m, "bias", None), nn.Parameter):
            m.bias = None
    return model


def _random_model(name: str, shape, bias: bool, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model(name, shape, 5)
    if not bias:
        _without_bias(model)
    with torch.no_grad():
        for p in model.parameters():  # away from the zero/one initialisations (LinearHead, norms)
            p.normal_(0.0, 0.3)
    return model


def _assert_same_sums(model: nn.Module, make_clipper_for, x, y) -> None:
    """Both clip norms, each against the reference on a copy taken before any hook is added."""
    references = _reference_clipped_sums(copy.deepcopy(model), x, y)
    clipper = make_clipper_for(model)
    params = [p for p in model.parameters() if p.requires_grad]
    for clip, reference in references.items():
        loss, count = clipper.clipped_sum(x, y, clip)
        assert count == len(x)
        assert len(params) == len(reference)
        for p, ref in zip(params, reference):
            rel = float((p.grad - ref).norm() / ref.norm().clamp(min=1e-12))
            assert rel <= REL_TOL, (clip, tuple(p.shape), rel)


def _batch(shape, n: int = 9, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=gen), torch.randint(0, 5, (n,), generator=gen)


@pytest.mark.parametrize("name", list(MODEL_NAMES))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "path", ["bk-auto", "bk-tuned", "bk-ghost", "bk-materialise", "bk-grouped", "opacus"]
)
def test_every_clipping_path_matches_per_example_reference(name, bias, path):
    model = _random_model(name, SHAPES[name], bias)
    x, y = _batch(SHAPES[name])
    if path == "opacus":
        _assert_same_sums(model, OpacusClipper, x, y)
    else:
        strategy = NormStrategy(path.removeprefix("bk-"))
        _assert_same_sums(model, lambda m: BookKeepingClipper(m, strategy), x, y)


@pytest.mark.parametrize("name", list(MODEL_NAMES))
def test_auto_mode_uses_book_keeping_for_every_built_in_model(name):
    model = build_model(name, SHAPES[name], 5)
    assert supports_bk(model)
    assert isinstance(make_clipper(model, "auto"), BookKeepingClipper)


def test_book_keeping_handles_multichannel_cnn1d_and_frozen_parameters():
    model = _random_model("cnn1d", (3, 17), bias=True)
    model.features[0].weight.requires_grad_(False)
    model.features[1].bias.requires_grad_(False)
    x, y = _batch((3, 17))
    _assert_same_sums(model, BookKeepingClipper, x, y)


class _OddConvs(nn.Module):
    """Strides, dilations, tuple/'same'/'valid' padding, LayerNorm and Linear on sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2))
        self.c2 = nn.Conv1d(30, 4, 3, padding="same", dilation=2, bias=False)
        self.ln = nn.LayerNorm(4)
        self.lin = nn.Linear(4, 5)
        self.c3 = nn.Conv2d(3, 2, 3, padding="valid", stride=2)
        self.gn = nn.GroupNorm(1, 2, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x)).flatten(1, 2)  # (N, 30, W)
        h = self.ln(torch.tanh(self.c2(h)).transpose(1, 2))  # (N, W, 4)
        side = torch.tanh(self.gn(self.c3(x))).flatten(1)[:, :5]  # (N, 2·4·3) → 5 logits
        return self.lin(h).mean(1) + side


@pytest.mark.parametrize("strategy", list(NormStrategy))
def test_book_keeping_covers_strides_dilations_paddings_and_sequence_layers(strategy):
    torch.manual_seed(2)
    model = _OddConvs()
    x = torch.randn(7, 3, 9, 7)
    y = torch.randint(0, 5, (7,))
    _assert_same_sums(model, lambda m: BookKeepingClipper(m, strategy), x, y)


class _EvenSame(nn.Module):
    """'same' padding with even kernels: torch pads one more on the right than on the left."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(2, 3, 4, padding="same")
        self.c2 = nn.Conv2d(3, 2, (2, 3), padding="same", dilation=(3, 1))
        self.lin = nn.Linear(2 * 9, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x)).unsqueeze(2)  # (N, 3, 1, 9)
        return self.lin(torch.tanh(self.c2(h)).flatten(1))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("strategy", list(NormStrategy))
def test_book_keeping_pads_same_convolutions_with_even_kernels_like_torch(strategy):
    torch.manual_seed(3)
    model = _EvenSame()
    x, y = torch.randn(6, 2, 9), torch.randint(0, 5, (6,))
    _assert_same_sums(model, lambda m: BookKeepingClipper(m, strategy), x, y)


def test_tied_weights_are_refused_and_auto_falls_back_to_opacus():
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight  # one parameter, two layers: per-layer norms would be wrong
    model = nn.Sequential(first, nn.Tanh(), second)
    assert not supports_bk(model)
    with pytest.raises(RayDPHPOError, match="shared"):
        BookKeepingClipper(model)
    assert isinstance(make_clipper(model, "auto"), OpacusClipper)


@pytest.mark.parametrize(
    ("layer", "why"),
    [
        (nn.Conv1d(4, 4, 3, groups=2), "groups=2"),
        (nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
        (nn.Conv3d(1, 2, 3), "Conv3d"),
        (nn.Embedding(10, 3), "Embedding"),
    ],
)
def test_uncovered_layers_are_refused_and_auto_falls_back_to_opacus(layer, why):
    model = nn.Sequential(layer, nn.Flatten(), nn.LazyLinear(5))
    assert bk_unsupported_reason(layer) is not None and why in bk_unsupported_reason(layer)
    assert not supports_bk(model)
    with pytest.raises(RayDPHPOError, match="opacus"):
        make_clipper(model, "bk")
    assert isinstance(make_clipper(model, "auto"), OpacusClipper)


def test_auto_fallback_to_opacus_still_clips_correctly():
    model = nn.Sequential(nn.Conv1d(4, 4, 3, groups=2), nn.Flatten(), nn.Linear(4 * 6, 5))
    x, y = _batch((4, 8))

    def auto(m: nn.Module):
        clipper = make_clipper(m, "auto")
        assert isinstance(clipper, OpacusClipper)
        return clipper

    _assert_same_sums(model, auto, x, y)


class _Twice(nn.Module):
    """One Linear layer applied twice in a forward pass (book-keeping must refuse it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


def test_a_layer_run_twice_is_refused_without_touching_gradients():
    model = _Twice()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    x, y = _batch((5,))
    with pytest.raises(RayDPHPOError, match="once per forward"):
        BookKeepingClipper(model).clipped_sum(x, y, 1.0)
    assert all(bool((p.grad == 7.0).all()) for p in model.parameters())


class _Raises(nn.Module):
    """A Linear layer followed by a failure: the forward pass raises after the layer ran."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        self.lin(x)
        raise ValueError("boom")


def test_layer_recording_sees_what_a_forward_hook_sees_and_restores_every_forward():
    """The recording shadows each layer's forward for one pass only: afterwards the class's
    forward (or an instance's own) is back, also after a forward pass that raised; user
    hooks run as usual; the records are each layer's input and output, as a hook sees them."""
    torch.manual_seed(0)
    model = build_model("mlp", (6,), 3)
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    own = layers[1].forward  # an instance-level forward (bound method of the class)
    layers[1].forward = own
    seen = []
    layers[0].register_forward_hook(lambda m, inp, out: seen.append((inp[0], out)))
    x = torch.randn(4, 6)
    records = dp_step._record_layers(model, layers, x)
    assert [len(records[m]) for m in layers] == [1, 1, 1]
    assert records[None][0][0] is x
    torch.testing.assert_close(records[None][0][1], model(x), rtol=0, atol=0)
    torch.testing.assert_close(records[layers[0]][0][0], seen[0][0], rtol=0, atol=0)
    assert records[layers[0]][0][1] is seen[0][1]
    assert not records[layers[0]][0][0].requires_grad and records[layers[2]][0][1].requires_grad
    assert "forward" not in layers[0].__dict__ and "forward" not in layers[2].__dict__
    assert layers[1].__dict__["forward"] is own

    failing = _Raises()
    with pytest.raises(ValueError, match="boom"):
        dp_step._record_layers(failing, [failing.lin], torch.randn(2, 5))
    assert "forward" not in failing.lin.__dict__


class _KeywordInput(nn.Module):
    """A Linear layer called with its input as a keyword, then one called positionally through
    its forward directly (no __call__, so no hook would see it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.b.forward(torch.tanh(self.a(input=x)))


def test_layer_recording_takes_keyword_input_refuses_none_and_restores_duplicates():
    model = _KeywordInput()
    x = torch.randn(4, 5)
    records = dp_step._record_layers(model, [model.a, model.b, model.a], x)
    assert [len(records[m]) for m in (model.a, model.b)] == [1, 1]
    torch.testing.assert_close(records[model.a][0][0], x, rtol=0, atol=0)
    assert "forward" not in model.a.__dict__ and "forward" not in model.b.__dict__

    class _NoInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 5)

        def forward(self, x):
            return self.lin.forward(**{"wrong": x})

    bad = _NoInput()
    with pytest.raises(RayDPHPOError, match="first positional argument"):
        dp_step._record_layers(bad, [bad.lin], x)
    assert "forward" not in bad.lin.__dict__


def _mlp_after_one_fused_step(noise_type: type[GaussianNoise] = GaussianNoise):
    """(clipper, params, x, y, noise) of a small MLP after one privatised_gradient."""
    torch.manual_seed(0)
    model = build_model("mlp", (12,), 5)
    clipper = BookKeepingClipper(model)
    params = list(model.parameters())
    x, y = _batch((12,))
    noise = noise_type(1.0, 1.0, 6.0, torch.Generator().manual_seed(3))
    clipper.privatised_gradient(x, y, 1.0, noise, params)
    return clipper, params, x, y, noise


def test_a_release_that_fails_midway_leaves_no_gradient_behind():
    """After a first release every p.grad lives in the reused noise buffer; a second release
    that fails after its draw must not leave fresh noise plus part of a sum looking like a
    gradient: every p.grad is None, no release is counted, and the next release works."""
    clipper, params, x, y, noise = _mlp_after_one_fused_step()

    def failing(into, alpha):
        raise RuntimeError("write failed")

    with pytest.raises(RuntimeError, match="write failed"):
        noise.privatise_with(params, failing)
    assert noise.releases == 1 and all(p.grad is None for p in params)
    clipper.privatised_gradient(x, y, 1.0, noise, params)
    assert noise.releases == 2 and all(p.grad is not None for p in params)


def test_fused_path_notices_a_layer_frozen_after_a_fused_step():
    """The fusion test is cached per parameter list; freezing a layer afterwards must make
    the same list fall back (it is no longer the clipper's trainable set), not reuse the
    cached answer."""
    clipper, params, x, y, noise = _mlp_after_one_fused_step(_CountingNoise)
    params[0].requires_grad_(False)
    clipper.privatised_gradient(x, y, 1.0, noise, params)
    assert noise.calls == ["privatise_with", "privatise"]


class _CountingNoise(GaussianNoise):
    """GaussianNoise that counts which of its two entry points ran."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[str] = []

    def privatise(self, params):
        self.calls.append("privatise")
        super().privatise(params)

    def privatise_with(self, params, write):
        self.calls.append("privatise_with")
        super().privatise_with(params, write)


def _privatised_both_ways(model_for, clipper_for, x, y, params_of=None, expect_fused=True):
    """p.grad after ``privatised_gradient`` and after ``clipped_sum`` + ``privatise`` on
    identical models and generator states; also each noise's release count and generator
    state afterwards. ``expect_fused``: whether ``privatised_gradient`` must take the fused
    path (``privatise_with``) rather than fall back to ``privatise``."""
    out = []
    for fused in (True, False):
        model = model_for()
        clipper = clipper_for(model)
        params = (params_of or (lambda m: [p for p in m.parameters() if p.requires_grad]))(model)
        noise = _CountingNoise(1.3, 0.5, 6.0, torch.Generator().manual_seed(8))
        if fused:
            clipper.privatised_gradient(x, y, 0.5, noise, params)
            assert noise.calls == ["privatise_with" if expect_fused else "privatise"]
        else:
            clipper.clipped_sum(x, y, 0.5)
            noise.privatise(params)
        out.append(([p.grad.clone() for p in params], noise.releases,
                     noise.generator.get_state()))
    return out


@pytest.mark.parametrize("name", list(MODEL_NAMES))
@pytest.mark.parametrize("path", ["bk-auto", "bk-ghost", "bk-materialise", "bk-grouped", "opacus"])
def test_fused_privatised_gradient_is_clipped_sum_plus_the_same_noise(name, path):
    """The fused path (noise drawn first, each layer's clipped sum accumulated into it) releases
    what clipped_sum + privatise release from the same generator state, up to float32
    rounding, with one release and the same number of draws."""
    shape = SHAPES[name]
    x, y = _batch(shape)

    def clipper_for(m):
        return OpacusClipper(m) if path == "opacus" else BookKeepingClipper(
            m, NormStrategy(path.removeprefix("bk-")))

    (fused, r1, s1), (plain, r2, s2) = _privatised_both_ways(
        lambda: _random_model(name, shape, bias=True), clipper_for, x, y,
        expect_fused=path != "opacus")
    assert r1 == r2 == 1 and torch.equal(s1, s2)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_path_falls_back_when_params_are_not_the_clippers_own():
    """A parameter list that is a subset (or has another order) of the clipper's: a subset
    falls back to clipped_sum + privatise; another order is fused, with the noise still drawn
    in the order given."""
    shape = SHAPES["mlp"]
    x, y = _batch(shape)
    for params_of, expect_fused in ((lambda m: list(m.parameters())[:2], False),
                                    (lambda m: list(m.parameters())[::-1], True)):
        (fused, _, s1), (plain, _, s2) = _privatised_both_ways(
            lambda: _random_model("mlp", shape, bias=True), BookKeepingClipper, x, y, params_of,
            expect_fused)
        assert torch.equal(s1, s2)
        for a, b in zip(fused, plain):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_path_on_an_empty_batch_releases_the_noise_alone():
    shape = SHAPES["cnn1d"]
    x, y = torch.zeros(0, *shape), torch.zeros(0, dtype=torch.int64)
    (fused, r1, _), (plain, r2, _) = _privatised_both_ways(
        lambda: _random_model("cnn1d", shape, bias=True), BookKeepingClipper, x, y)
    assert r1 == r2 == 1
    for a, b in zip(fused, plain):
        assert torch.equal(a, b) and float(a.abs().sum()) > 0


def test_fused_path_refuses_a_bad_batch_before_drawing_any_noise():
    model = _Twice()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    gen = torch.Generator().manual_seed(2)
    state = gen.get_state()
    noise = GaussianNoise(1.0, 1.0, 5.0, gen)
    x, y = _batch((5,))
    with pytest.raises(RayDPHPOError, match="once per forward"):
        BookKeepingClipper(model).privatised_gradient(x, y, 1.0, noise, list(model.parameters()))
    assert noise.releases == 0 and torch.equal(gen.get_state(), state)
    assert all(bool((p.grad == 7.0).all()) for p in model.parameters())


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        nn.Conv2d(2, 3, 3, padding="valid", stride=2),
        nn.Conv2d(1, 2, 3, padding=1),
    ],
)
def test_unfolded_input_is_torchs_im2col(conv):
    """_conv_unfold (stacked strided slices) equals nn.functional.unfold, exactly."""
    x = torch.randn(4, conv.in_channels, 9, 8)
    padding = conv.padding if not isinstance(conv.padding, str) else 0
    reference = nn.functional.unfold(x, conv.kernel_size, conv.dilation, padding, conv.stride)
    assert torch.equal(dp_step._conv_unfold(conv, x), reference)


@pytest.mark.parametrize(
    "conv",
    [nn.Conv1d(1, 4, 5, padding=2), nn.Conv1d(1, 4, 3), nn.Conv1d(3, 4, 5, stride=2, padding=2)],
)
def test_unfolded_conv1d_input_is_a_dense_copy(conv):
    """One input channel with stride 1 makes the windows viewable (strides (L, 1, 1)), and
    reshape then returned that overlapping view instead of a copy: bmm on it fell back to a
    loop over the examples (cnn1d's first layer, B = 256: ~1 ms of a ~9.5 ms DP step). The
    unfolded input is a dense (N, C·k, T) tensor, equal to torch's im2col."""
    x = torch.randn(6, conv.in_channels, 40)
    unfolded = dp_step._conv_unfold(conv, x)
    assert unfolded.is_contiguous()
    reference = nn.functional.unfold(x.unsqueeze(-2), (1, conv.kernel_size[0]),
                                     padding=(0, conv.padding[0]), stride=(1, conv.stride[0]))
    assert torch.equal(unfolded, reference)


def test_tuned_times_only_the_cheap_candidates_on_public_tensors():
    """TUNED keeps, per layer, one of the strategies within a factor 4 of the fewest
    operations, chosen on public random tensors: data full of NaN still yields a choice (the
    values are never read), and the choice is kept for the next steps."""
    torch.manual_seed(0)
    model = build_model("cnn2d", SHAPES["cnn2d"], 5)
    conv2 = model.features[3]  # T = 196, p = 16, d = 144: the ghost norm costs ~11x more
    assert dp_step._candidate_strategies(196, 16, 144, conv=True) == [
        NormStrategy.MATERIALISE, NormStrategy.GROUPED]
    x = torch.full((6, 16, 28, 28), float("nan"))
    g = torch.full((6, 16, 14, 14), float("nan"))
    assert dp_step._fastest_strategy(conv2, x, g, [NormStrategy.MATERIALISE,
                                                   NormStrategy.GROUPED]) in (
        NormStrategy.MATERIALISE, NormStrategy.GROUPED)
    clipper = BookKeepingClipper(model, NormStrategy.TUNED)
    xb, yb = _batch(SHAPES["cnn2d"])
    clipper.clipped_sum(xb, yb, 1.0)
    first = dict(clipper.strategies)
    assert first[conv2] in (NormStrategy.MATERIALISE, NormStrategy.GROUPED)
    assert all(s not in (NormStrategy.AUTO, NormStrategy.TUNED) for s in first.values())
    clipper.clipped_sum(xb, yb, 1.0)
    assert clipper.strategies == first


def test_auto_is_a_fixed_rule_so_the_same_seed_gives_the_same_bits():
    """AUTO picks by rule (no timing): MATERIALISE for 1-D and stride-1 convolutions, GROUPED
    for a strided Conv2d, GHOST only at under half the operations; two clippers on the same
    model and batch give bit-identical sums."""
    cnn1d, cnn2d = build_model("cnn1d", SHAPES["cnn1d"], 5), build_model("cnn2d", SHAPES["cnn2d"], 5)
    rule = dp_step._auto_strategy
    assert rule(cnn1d.features[0], 40, 32, 5) is NormStrategy.MATERIALISE
    assert rule(cnn1d.features[3], 20, 32, 160) is NormStrategy.MATERIALISE  # stride 2, 1-D
    assert rule(cnn2d.features[0], 784, 16, 9) is NormStrategy.MATERIALISE
    assert rule(cnn2d.features[3], 196, 16, 144) is NormStrategy.GROUPED  # stride 2, 2-D
    assert rule(nn.Conv1d(64, 64, 9, padding=4), 2, 64, 576) is NormStrategy.GHOST
    assert rule(nn.Linear(8, 8), 3, 8, 8) is NormStrategy.GHOST  # 3·16 < 64
    assert rule(nn.Linear(8, 8), 5, 8, 8) is NormStrategy.MATERIALISE
    for name in ("cnn1d", "cnn2d"):
        x, y = _batch(SHAPES[name], n=16)
        sums = []
        for _ in range(2):
            model = _random_model(name, SHAPES[name], bias=True)
            BookKeepingClipper(model).clipped_sum(x, y, 0.5)
            sums.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(a, b) for a, b in zip(*sums))


@pytest.mark.parametrize("name", list(MODEL_NAMES))
@pytest.mark.parametrize(
    "path", ["bk-auto", "bk-tuned", "bk-ghost", "bk-materialise", "bk-grouped", "opacus"]
)
def test_a_record_whose_gradient_overflows_adds_exactly_nothing(name, path):
    """A record with features near the float32 maximum overflows the forward pass (NaN
    logits): before, the clipped sum, and so the released noisy gradient, was NaN iff the
    record was in the batch, which no noise hides. Now it contributes 0: with the same noise
    draw, the released gradient with the record equals the one without it (neighbouring
    batches, end to end through clipping and noise)."""
    shape = SHAPES[name]
    x, y = _batch(shape)
    x_bad = torch.cat([x, torch.full((1, *shape), 3.0e38)])
    y_bad = torch.cat([y, torch.tensor([1])])
    probe = _random_model(name, shape, bias=True)
    with torch.no_grad():  # the record really overflows: the test can fail without the fix
        assert not bool(torch.isfinite(probe(x_bad[-1:])).all())

    def make(model: nn.Module):
        if path == "opacus":
            return OpacusClipper(model)
        return BookKeepingClipper(model, NormStrategy(path.removeprefix("bk-")))

    for fused in (False, True):
        sums = []
        for xs, ys in ((x, y), (x_bad, y_bad)):
            model = _random_model(name, shape, bias=True)
            params = list(model.parameters())
            noise = GaussianNoise(1.0, 0.7, 9.0, torch.Generator().manual_seed(5))
            if fused:
                make(model).privatised_gradient(xs, ys, 0.7, noise, params)
            else:
                make(model).clipped_sum(xs, ys, 0.7)
                noise.privatise(params)
            sums.append([p.grad.clone() for p in params])
        for clean, with_bad in zip(*sums):
            assert bool(torch.isfinite(with_bad).all())
            torch.testing.assert_close(with_bad, clean, rtol=1e-5, atol=1e-6)


def test_empty_batch_gives_zero_gradients():
    model = _random_model("cnn2d", SHAPES["cnn2d"], bias=True)
    loss, count = BookKeepingClipper(model).clipped_sum(
        torch.zeros(0, *SHAPES["cnn2d"]), torch.zeros(0, dtype=torch.int64), 1.0
    )
    assert (loss, count) == (0.0, 0)
    assert all(bool((p.grad == 0).all()) for p in model.parameters())
