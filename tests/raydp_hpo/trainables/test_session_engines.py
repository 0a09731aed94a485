"""make_private's two engines (raydp_hpo.trainables.native_private): which one a module gets,
and that the native step releases what Opacus releases (no Ray here)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import raydp_hpo
from raydp_hpo.errors import InvalidParameterError, TrialContractError
from raydp_hpo.trainables.native_private import (
    DPEngine,
    NativeDPOptimizer,
    NativePoissonLoader,
    NativePrivateModule,
    choose_engine,
)
from tests.raydp_hpo.trainables.test_session import TRAIN, _config, _ledger
from tests.raydp_hpo.tune._user_trainables import TinyMLP


class BagOfWords(nn.Module):
    """An embedding layer: Opacus computes its per-sample gradients, book-keeping does not."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x).mean(1))


class SmallCNN(nn.Module):
    """Conv2d + GroupNorm + a Linear on a sequence (T > 1) + a Linear head: every layer type
    book-keeping covers, with more than one position per example."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.mix = nn.Linear(6, 5)  # applied to (N, 4·6, 6): T = 24 positions
        self.head = nn.Linear(4 * 6 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.conv(x)))  # (N, 4, 6, 6)
        h = torch.tanh(self.mix(h.reshape(len(x), 24, 6)))
        return self.head(h.reshape(len(x), -1))


def test_auto_picks_native_for_covered_layers_and_opacus_otherwise(caplog) -> None:
    assert choose_engine(TinyMLP())[0] is DPEngine.NATIVE
    assert choose_engine(SmallCNN())[0] is DPEngine.NATIVE
    engine, why = choose_engine(BagOfWords())
    assert engine is DPEngine.OPACUS and "Embedding" in why
    assert choose_engine(TinyMLP(), DPEngine.OPACUS)[0] is DPEngine.OPACUS
    assert choose_engine(TinyMLP(), "native")[0] is DPEngine.NATIVE
    with pytest.raises(InvalidParameterError, match="engine=NATIVE cannot.*Embedding"):
        choose_engine(BagOfWords(), DPEngine.NATIVE)
    with pytest.raises(InvalidParameterError, match="engine must be a raydp_hpo.DPEngine"):
        choose_engine(TinyMLP(), "fast")
    assert raydp_hpo.DPEngine is DPEngine
    # in a trial: the choice is trial.engine and one log line
    for module, expected in ((TinyMLP(), DPEngine.NATIVE), (BagOfWords(), DPEngine.OPACUS)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="raydp_hpo.trainables.native_private"), \
                pytest.raises(TrialContractError, match="ended without"), \
                raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
            data = (TRAIN if expected is DPEngine.NATIVE
                    else TensorDataset(torch.randint(0, 20, (200, 5)), TRAIN.tensors[1]))
            trial.make_private(module, torch.optim.SGD(module.parameters(), lr=0.1), data)
        assert trial.engine is expected
        assert f"{expected.value} engine for {type(module).__name__}" in caplog.text


def _opacus_clipped(model: nn.Module, x: torch.Tensor, y: torch.Tensor, c: float,
                    normaliser: int) -> list[torch.Tensor]:
    """Opacus's privatised gradient with σ = 0: Σ clip_C(per-sample grad) / normaliser."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0,
                      max_grad_norm=c, expected_batch_size=normaliser, loss_reduction="mean")
    opt.zero_grad()
    nn.functional.cross_entropy(gsm(x), y).backward()
    opt.pre_step()  # clip, sum, (no) noise, scale: what step() applies
    out = [p.grad.detach().clone() for p in model.parameters()]
    gsm._close()
    return out


def _native(model: nn.Module, x: torch.Tensor, y: torch.Tensor, c: float, normaliser: int,
            sigma: float = 0.0, seed: int = 0) -> list[torch.Tensor]:
    module = NativePrivateModule(model)
    opt = NativeDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module,
                            noise_multiplier=sigma, max_grad_norm=c,
                            expected_batch_size=normaliser,
                            generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()  # the user's mean loss
    opt.privatise()
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make, shape, classes", [
    (lambda: TinyMLP(8), (4,), 2),
    (SmallCNN, (1, 6, 6), 3),
])
@pytest.mark.parametrize("c", [0.05, 1.0, 100.0])  # most clipped, some, none
def test_the_native_clipped_sum_equals_opacus(make, shape, classes, c: float) -> None:
    """Noise off, same weights, same batch: the native engine's Σ clip_C(∇ℓ_i)/(q·n) equals
    Opacus's to float32 rounding (rtol 1e-4, atol 1e-6 of gradients of order 1e-2..1)."""
    torch.manual_seed(0)
    model = make()
    x, y = torch.randn(37, *shape), torch.randint(0, classes, (37,))
    x[3] *= 50.0  # one example far outside: clipped even at C = 100 in some layers
    twin = make()
    twin.load_state_dict(model.state_dict())
    ours = _native(model, x, y, c, normaliser=40)
    theirs = _opacus_clipped(twin, x, y, c, normaliser=40)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_native_noise_has_the_charged_scale() -> None:
    """With σ > 0 the native gradient minus the noiseless one is N(0, (σC/(q·n))²) per
    coordinate: over 4 × 2 000 + 4 coordinates its standard deviation is within 5% (≈ 6
    standard errors)."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(2000, 4))
    twin = nn.Sequential(nn.Linear(2000, 4))
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 2000), torch.randint(0, 4, (16,))
    noisy = torch.cat([g.flatten() for g in _native(model, x, y, 0.5, 20, sigma=1.3)])
    clean = torch.cat([g.flatten() for g in _native(twin, x, y, 0.5, 20)])
    std = float((noisy - clean).std())
    assert std == pytest.approx(1.3 * 0.5 / 20, rel=0.05)


def test_the_native_step_refuses_a_forward_it_cannot_attribute() -> None:
    """Two forward passes with gradients before one backward (or none at all): refused with
    the fix, and no step is taken."""
    model = TinyMLP(4)
    module = NativePrivateModule(model)
    opt = NativeDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module,
                            noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=10,
                            generator=torch.Generator())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TrialContractError, match="without a forward and backward"):
        opt.step()
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    module(x)
    nn.functional.cross_entropy(module(x), y).backward()
    with pytest.raises(TrialContractError, match="ran 2x.*engine=raydp_hpo.DPEngine.OPACUS"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # an evaluation pass under no_grad is not recorded
    opt.zero_grad()
    with torch.no_grad():
        module(x)
    nn.functional.cross_entropy(module(x), y).backward()
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_native_loader_draws_poisson_batches_at_q() -> None:
    """Each record joins a batch independently w.p. q: over 2 000 batches of n = 200 at
    q = 0.1 the mean batch size is 20 ± 0.3 (≈ 3 standard errors; fixed seed), ``int(1/q)``
    batches a pass, and a generic dataset (not a TensorDataset) is collated the same way."""
    loader = NativePoissonLoader(TRAIN, 0.1, torch.Generator().manual_seed(0))
    assert len(loader) == 10 and loader.sample_rate == 0.1
    sizes = [len(x) for _ in range(200) for x, _ in loader]
    assert sum(sizes) / len(sizes) == pytest.approx(20.0, abs=0.3)

    class Plain(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 200

        def __getitem__(self, i: int):
            return TRAIN[i]

    a = NativePoissonLoader(Plain(), 0.1, torch.Generator().manual_seed(5))
    b = NativePoissonLoader(TRAIN, 0.1, torch.Generator().manual_seed(5))
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    empty = NativePoissonLoader(Plain(), 1e-9, torch.Generator())
    x, y = next(iter(empty))
    assert x.shape == (0, 4) and y.shape == (0,)


def test_the_native_step_refuses_rows_that_are_not_the_batch_records() -> None:
    """A model that reshapes each record into several rows (here 2 rows of 2 features) would
    clip per half-record: the layers' row count is checked against the loader's last batch."""

    class Halves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.reshape(-1, 2)).reshape(len(x), 4)[:, :2]

    with pytest.raises(TrialContractError, match=r"layers saw \d+ examples but the loader"), \
            raydp_hpo.trial_session(_config(), ledger=_ledger()) as trial:
        model = Halves()
        model, opt, loader = trial.make_private(model, torch.optim.SGD(model.parameters(), 0.1),
                                                TRAIN)
        assert trial.engine is DPEngine.NATIVE
        x, y = next(iter(loader))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert trial.steps_taken == 0
