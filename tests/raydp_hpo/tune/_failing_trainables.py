"""Trainables of a user's own whose every trial dies of an ordinary exception after its
charge (issue #41 item 6, issue #37): importable by Ray's workers."""

from __future__ import annotations

from torch import nn
from torch.utils.data import DataLoader

import raydp_hpo
from tests.raydp_hpo.tune._user_trainables import N, TinyMLP, tensors


class WithUnusedLayer(nn.Module):
    """A layer defined but never used in ``forward`` (a common leftover): its parameters get
    no per-sample gradient, and Opacus's optimizer refuses the step with its own ValueError
    ("Per sample gradient is not initialized")."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.unused = nn.Linear(8, 2)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.net(x)


def trainable(config: dict) -> None:
    """``config["variant"]``: ``value_error`` (a bug in the user's loop), ``report_dict``
    (``trial.report({...})``, Tune's habit), ``opacus_value_error`` (Opacus's own ValueError,
    a model it cannot make private, on the Opacus engine)."""
    variant = config["variant"]
    with raydp_hpo.trial_session(config) as trial:
        import torch

        model: nn.Module = WithUnusedLayer() if variant == "opacus_value_error" else TinyMLP(8)
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
        model, opt, loader = trial.make_private(model, opt, tensors(N, 0), engine="opacus")
        if variant == "opacus_value_error":
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()  # Opacus: ValueError, no per-sample gradient for `unused`
        if variant == "report_dict":
            trial.report({"loss": 1.0})  # type: ignore[call-arg]
        if variant == "value_error":
            raise ValueError("could not convert string to float: 'n/a'")
        trial.report_score(trial.count_correct(model, DataLoader(tensors(50, 1), batch_size=50)))
