"""Models for DP trials: MLP, small 1-D / 2-D CNNs and a zero-initialised linear head.

Every model is checked with Opacus' ``ModuleValidator``: layers that mix examples within a
batch (BatchNorm) break per-example clipping and therefore DP, and are rejected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError

__all__ = ["MLP", "CNN1d", "CNN2d", "LinearHead", "build_model", "validate_model", "MODEL_NAMES"]


class MLP(nn.Module):
    """Flatten → [Linear → activation] × len(hidden) → Linear."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        act = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}.get(activation)
        if act is None:
            raise InvalidParameterError(f"activation must be relu, tanh or elu, got {activation!r}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, int(h)), act()]
            width = int(h)
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LinearHead(nn.Module):
    """Linear classifier on fixed features, weights and bias initialised to zero.

    The linear-probing setting of Panda et al. (2024) and Koskela & Kulkarni (2023): with a
    zero start the loss is convex and the model is a deterministic function of the noisy
    gradients only.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.flatten(x))


class CNN1d(nn.Module):
    """Small 1-D CNN for sequences such as MNIST-1D (input (L,) or (C, L)); GroupNorm, not
    BatchNorm, so that per-example gradients stay per-example."""

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, channels: int = 32, groups: int = 4
    ) -> None:
        super().__init__()
        shape = tuple(input_shape)
        self.in_channels, length = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
        self.features = nn.Sequential(
            nn.Conv1d(self.in_channels, channels, 5, padding=2),
            nn.GroupNorm(groups, channels),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 5, padding=2, stride=2),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(channels * ((length + 1) // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(1)
        return self.head(self.features(x))


class CNN2d(nn.Module):
    """Small 2-D CNN for images (input (C, H, W)), tanh + GroupNorm (Papernot et al. 2021
    found bounded activations work better under DP-SGD)."""

    def __init__(
        self, input_shape: Sequence[int], num_classes: int, channels: int = 16, groups: int = 4
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise InvalidParameterError(f"cnn2d needs input_shape (C, H, W), got {input_shape}")
        c, h, w = (int(v) for v in input_shape)
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1),
            nn.GroupNorm(groups, channels),
            nn.Tanh(),
            nn.Conv2d(channels, channels, 3, padding=1, stride=2),
            nn.Tanh(),
            nn.Flatten(),
        )
        self.head = nn.Linear(channels * ((h + 1) // 2) * ((w + 1) // 2), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


MODEL_NAMES = ("mlp", "cnn1d", "cnn2d", "linear")


def validate_model(model: nn.Module) -> nn.Module:
    """Raise :class:`InvalidParameterError` if Opacus cannot train ``model`` privately."""
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        details = "; ".join(str(e) for e in errors)
        raise InvalidParameterError(
            f"model is not compatible with DP-SGD: {details}. Replace BatchNorm with GroupNorm "
            "or LayerNorm (or call opacus.validators.ModuleValidator.fix(model))."
        )
    return model


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, **kwargs: object
) -> nn.Module:
    """Build model ``name`` (one of :data:`MODEL_NAMES`) or a ``torch.nn.Module`` class path
    ``"package.module:Class"`` called as ``Class(input_shape, num_classes, **kwargs)``; the
    result is validated for DP training. Unknown keyword arguments raise (no silent drops)."""
    classes: dict[str, type[nn.Module]] = {
        "mlp": MLP,
        "cnn1d": CNN1d,
        "cnn2d": CNN2d,
        "linear": LinearHead,
    }
    if name in classes:
        cls = classes[name]
    elif isinstance(name, str) and ":" in name:
        import importlib

        module_name, _, attr = name.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
    else:
        raise InvalidParameterError(
            f"unknown model {name!r}; use one of {MODEL_NAMES} or 'package.module:Class'"
        )
    try:
        model = cls(tuple(input_shape), int(num_classes), **kwargs)
    except TypeError as exc:
        raise InvalidParameterError(f"bad arguments for model {name!r}: {exc}") from None
    return validate_model(model)
