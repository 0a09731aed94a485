"""Poisson sampling of DP-SGD batches: :func:`poisson_batch` (one batch in O(|B|) work, from
geometric gaps between the selected records; the proof that the law is Poisson sampling's is
in its docstring) and :class:`PoissonBatches` (what training uses: the same independent
batches drawn a block of steps at a time).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from raydp_hpo.errors import InvalidParameterError

_DENSE_POISSON_MAX_N = 4096  # poisson_batch: below this, one uniform per record is cheaper
_MAX_POISSON_N = 2**53  # poisson_batch: its float64 positions are exact integers below this
_POISSON_BLOCK = 32  # PoissonBatches: batches drawn per block
_POISSON_BLOCK_VALUES = 2**20  # PoissonBatches: at most this many gap positions per block


def poisson_batch(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """A Poisson sample of {0, …, n−1} with rate q, as sorted int64 indices, in O(|B|) work.

    Poisson sampling puts each record in the batch independently with probability q: the
    indicators X_0, …, X_{n−1} are i.i.d. Bernoulli(q). This draws the same law from the gaps
    between selected records instead of one uniform per record.

    Proof that the laws agree: extend the indicators to an infinite i.i.d. Bernoulli(q)
    sequence X_0, X_1, … (those past n − 1 are never looked at). Let P_1 < P_2 < … be the
    positions of its ones, counted from 1, and G_j = P_j − P_{j−1} (P_0 = 0). For every
    k_1, …, k_m ≥ 1 the event {G_1 = k_1, …, G_m = k_m} fixes the first P_m = Σ k_j
    indicators (k_j − 1 zeros, then a one, m times), so it has probability
    Π_j (1 − q)^{k_j − 1} q: the gaps are i.i.d. Geometric(q) on {1, 2, …}. Conversely, i.i.d.
    Geometric(q) gaps G_j define positions P_m = G_1 + … + G_m whose indicator sequence has, for
    every finite prefix x_0 … x_{L−1}, the probability q^{#ones}(1 − q)^{#zeros} (sum the gap
    law over the gap sequences consistent with the prefix), i.e. it is i.i.d. Bernoulli(q).
    The batch {P_j − 1 : P_j ≤ n} is therefore exactly a Poisson sample of {0, …, n−1}. It is
    sorted and duplicate-free by construction, with no rejection step.

    The gaps are drawn in chunks of ⌈nq + 6√(nq(1−q))⌉ + 16 (one ``geometric_`` call; a second
    chunk, continuing from the last position, is needed only when the first ends at or before
    n, i.e. more than that many records were selected: probability below 1e-9). Expected work
    O(nq). q = 1 gives every index without drawing; n ≤ 4096 or q > 1/4 uses one uniform per
    record (the definition of Poisson sampling; cheaper there).

    The law is exact up to the floating-point arithmetic of ``torch``'s geometric sampler,
    ⌈log U / log(1 − q)⌉ with U a 53-bit uniform. On CPU U ∈ [0, 1): every U > 0 gives a gap
    ≥ 1 (the ratio of two negative numbers, rounded up) and U = 0 an infinite one, so every
    later position is inf > n and the batch ends there. CUDA's uniforms may lie in (0, 1],
    where U = 1 would give a gap of 0 and repeat a record (its weight doubled in the sum:
    sensitivity 2C), so every gap is clamped to ≥ 1, which changes nothing for any other U.
    Each of these events has probability 2⁻⁵³ per gap drawn (about 1e-14 per step at
    B = 128), far below any δ. Positions are float64 integers, exact below 2⁵³ (n ≥ 2⁵³ is
    refused). ``tests/raydp_hpo/trainables/test_dp_step.py`` tests the size distribution, the
    per-index inclusion frequencies, the joint law of the gap sampler over all subsets of a
    small set, and both edge events (forced). All draws use ``generator`` and happen on its
    device, where the indices are returned.
    """
    n, q = _poisson_args(n, q)
    device = torch.device(generator.device)
    if q == 1.0 or n == 0:
        return torch.arange(n, dtype=torch.int64, device=device)
    if _dense_poisson(n, q):
        mask = torch.rand(n, generator=generator, device=device) < q
        return torch.nonzero(mask).flatten()
    return _bernoulli_by_gaps(n, q, generator)


def _poisson_args(n: int, q: float) -> tuple[int, float]:
    """``(n, q)`` as (int, float) after the checks every Poisson sampler makes: n an int in
    [0, 2⁵³) (float64 positions are exact below 2⁵³), q in (0, 1]."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
    if isinstance(q, bool) or not (isinstance(q, numbers.Real) and 0.0 < q <= 1.0):
        raise InvalidParameterError(f"sample rate q must be in (0, 1], got {q!r}")
    if n >= _MAX_POISSON_N:
        raise InvalidParameterError(f"n must be below 2**53 for exact positions, got {n}")
    return int(n), float(q)


def _dense_poisson(n: int, q: float) -> bool:
    """Whether one uniform per record is cheaper than geometric gaps (small n or large q)."""
    return n <= _DENSE_POISSON_MAX_N or q > 0.25


def _gap_chunk(n: int, q: float) -> int:
    """Gaps drawn per call: ⌈nq + 6√(nq(1−q))⌉ + 16, more than the batch size except with
    probability below 1e-9."""
    mean = n * q
    return math.ceil(mean + 6.0 * math.sqrt(mean * (1.0 - q))) + 16


def _geometric_gaps(shape: tuple[int, ...], q: float, generator: torch.Generator) -> torch.Tensor:
    """i.i.d. Geometric(q) gaps on {1, 2, …} (float64, on the generator's device). Clamped to
    ≥ 1: a gap of 0 would repeat a record (sensitivity 2C); inf (U = 0) ends the batch."""
    gaps = torch.empty(shape, dtype=torch.float64, device=torch.device(generator.device))
    return gaps.geometric_(q, generator=generator).clamp_(min=1.0)


def _bernoulli_by_gaps(
    n: int, q: float, generator: torch.Generator, chunk: int | None = None, start: float = 0.0
) -> torch.Tensor:
    """{P_j − 1 : P_j ≤ n} for P_j the partial sums of i.i.d. Geometric(q) gaps on {1, 2, …}:
    a Poisson sample of {0, …, n−1} with rate q, sorted (proof in :func:`poisson_batch`).
    ``chunk``: gaps drawn per call (default :func:`_gap_chunk`; tests pass a small one to
    exercise the continuation). ``start``: positions continue from this one (the records
    0, …, start − 1 were decided elsewhere; :func:`_bernoulli_by_gaps_block`'s continuation)."""
    if chunk is None:
        chunk = _gap_chunk(n, q)
    parts: list[torch.Tensor] = []
    last = float(start)  # position of the last selected record so far (0: none yet)
    while True:
        positions = _geometric_gaps((chunk,), q, generator).cumsum_(0)
        if last:
            positions.add_(last)
        inside = int(torch.searchsorted(positions, float(n), right=True))  # #{P_j ≤ n}
        parts.append(positions[:inside])
        if inside < chunk:
            break
        last = float(positions[-1])
    selected = parts[0] if len(parts) == 1 else torch.cat(parts)
    return selected.to(torch.int64).sub_(1)


def _bernoulli_by_gaps_block(
    n: int, q: float, generator: torch.Generator, steps: int, chunk: int | None = None
) -> list[torch.Tensor]:
    """``steps`` independent Poisson samples of {0, …, n−1} with rate q, each sorted: row s of
    one (steps × chunk) draw of i.i.d. Geometric(q) gaps gives batch s exactly as
    :func:`_bernoulli_by_gaps` would from its own first chunk (cumulative sums along the row,
    the positions ≤ n kept). A row whose chunk ends at or before n (at least ``chunk``
    records selected; probability below 1e-9 with the default chunk) is continued by
    :func:`_bernoulli_by_gaps` from its last position, with fresh gaps drawn after the block.

    The law is the one :func:`poisson_batch` proves for a single batch, for every row: each
    row's gaps are i.i.d. Geometric(q) (the rows of one i.i.d. draw, then fresh draws for a
    continuation), and no row's gaps are used by another, so the batches are independent.
    Only the order in which the generator's values are consumed changes. The point is cost:
    the handful of small tensor operations a batch needs (draw, clamp, cumulative sum,
    search, conversion) run once per block, not once per step (in a DP-SGD step each small
    operation costs several µs: issue 15). Returns views into one int64 block (a continued
    row is a separate tensor).
    """
    if chunk is None:
        chunk = _gap_chunk(n, q)
    device = torch.device(generator.device)
    positions = _geometric_gaps((steps, chunk), q, generator).cumsum_(1)
    bound = torch.full((steps, 1), float(n), dtype=torch.float64, device=device)
    inside = torch.searchsorted(positions, bound, right=True).view(-1).tolist()  # #{P_j ≤ n}
    last = positions[:, -1].tolist()
    # inf and every position past n are never read; bounded so the integer conversion is defined
    selected = positions.clamp_(max=float(n) + 1.0).to(torch.int64).sub_(1)
    batches = []
    for row, (count, end) in enumerate(zip(inside, last)):
        batch = selected[row, :count]
        if count == chunk:  # every gap of the row fell inside: continue after its last record
            batch = torch.cat([batch, _bernoulli_by_gaps(n, q, generator, chunk, start=end)])
        batches.append(batch)
    return batches


class PoissonBatches:
    """Poisson batches of {0, …, n−1} with rate q for DP-SGD, one per :meth:`next` call, drawn
    ``block`` steps ahead (:func:`_bernoulli_by_gaps_block`): the law of
    :func:`poisson_batch` for every batch, independent batches, at a fraction of the
    per-step cost. Where :func:`poisson_batch` uses one uniform per record (n ≤ 4096 or
    q > 1/4) each batch is drawn when asked for.

    The batches drawn but not yet used are part of the sampler's state (:meth:`state`,
    :meth:`load`): a trial restored from a checkpoint uses them, so a resumed run takes
    exactly the batches an uninterrupted one would. :meth:`reset` drops them (after the
    generator was reseeded). ``generator`` is secret: the batches are the subsampling of the
    subsampled Gaussian mechanism.
    """

    def __init__(
        self, n: int, q: float, generator: torch.Generator, block: int = _POISSON_BLOCK
    ) -> None:
        n, q = _poisson_args(n, q)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise InvalidParameterError(f"block must be an int >= 1, got {block!r}")
        self.n, self.q = n, q
        self.generator: torch.Generator = generator
        self.block: int = block
        # where poisson_batch draws without gaps (every record, or one uniform per record)
        self._ahead: bool = not (q == 1.0 or _dense_poisson(n, q))
        self._pending: deque[torch.Tensor] = deque()

    def next(self) -> torch.Tensor:
        """The next batch: sorted int64 indices on the generator's device."""
        if not self._ahead:
            return poisson_batch(self.n, self.q, self.generator)
        if not self._pending:
            # at most ~2^20 positions per block (8 MiB of float64), whatever n·q
            steps = max(1, min(self.block, _POISSON_BLOCK_VALUES // _gap_chunk(self.n, self.q)))
            self._pending.extend(_bernoulli_by_gaps_block(self.n, self.q, self.generator, steps))
        return self._pending.popleft()

    def reset(self) -> None:
        """Drop the batches drawn ahead (the next call draws a new block)."""
        self._pending.clear()

    def state(self) -> dict[str, Any]:
        """The batches drawn ahead and not yet used, as compact copies, with the (n, q) they
        were drawn for (the generator's own state is saved by its owner)."""
        return {"n": self.n, "q": self.q, "pending": [b.clone() for b in self._pending]}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`'s batches (moved to the generator's device). Batches drawn for
        another n or q, or none at all (``{}``), leave nothing pending (the next call draws a
        new block): stale ones would index records that do not exist or leave new ones out."""
        self._pending.clear()
        if int(state.get("n", -1)) != self.n or float(state.get("q", -1.0)) != self.q:
            return
        device = torch.device(self.generator.device)
        self._pending.extend(
            torch.as_tensor(b, dtype=torch.int64).to(device) for b in state.get("pending", [])
        )
