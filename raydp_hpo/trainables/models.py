"""Models for DP trials: MLP, small 1-D / 2-D CNNs, a zero-initialised linear head and a
linear head on fixed random-kernel features for 1-D signals (ROCKET-style).

Every model is checked with Opacus' ``ModuleValidator``: layers that mix examples within a
batch (BatchNorm) break per-example clipping and therefore DP, and are rejected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "MLP",
    "CNN1d",
    "CNN2d",
    "LinearHead",
    "RandomKernelFeatures1d",
    "build_model",
    "validate_model",
    "MODEL_NAMES",
]


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


class RandomKernelFeatures1d(nn.Module):
    """Linear classifier on fixed random-convolution features of a 1-D signal (input (L,) or
    (C, L)): ROCKET's features (Dempster, Petitjean & Webb 2020, "ROCKET: exceptionally fast
    and accurate time series classification using random convolutional kernels"), trained
    privately as Tramèr & Boneh (2021, "Differentially private learning needs better features
    (or much more data)") train linear models on fixed ScatterNet features.

    Features. ``num_kernels`` kernels w_j of length ``kernel_length`` with weights drawn
    N(0, 1) and centred to mean 0, biases b_j ~ U(−1, 1), dilations d_j cycling over
    1, 2, 4, …, 2^⌊log₂((L − 1)/(kernel_length − 1))⌋ (ROCKET's exponential dilation range;
    a fixed length as in MiniRocket), zero padding that keeps the length. For
    y_j = (x ⋆_{d_j} w_j) + b_j each kernel gives two features, ROCKET's: the maximum of y_j
    and the proportion of positive values (PPV) of y_j. Max and PPV are invariant to where in
    the signal a pattern sits (up to the padding at the ends), which is what MNIST-1D
    (shifted templates) needs and what an MLP on raw samples has to learn from the data.

    Model. The 2·num_kernels features of ONE record are standardised by their own mean and
    standard deviation (``LayerNorm`` without affine parameters), then a linear layer
    initialised to zero gives the logits: with the features fixed, the loss is convex in the
    only trainable parameters (the linear-probing setting of Panda et al. 2024), and the
    trained model is a deterministic function of the noisy gradients.

    Privacy. The kernels are architecture, not a secret and not learnt: they are drawn from
    a torch generator seeded with the public ``seed`` (the same kernels in every trial and on
    every node with the same torch version; the global RNG is not touched) and kept as
    buffers, so they are part of the released state dict and a released model does not
    depend on redrawing them. Nothing in the features depends on another record: no statistic is
    computed across records — MiniRocket's biases taken from quantiles of training outputs
    and ROCKET's feature standardisation by training means would both depend on the private
    data and are not used. Only the linear layer is trained, by DP-SGD with per-example
    clipping like every model here.
    """

    kernel_weight: torch.Tensor  # (num_kernels, C, kernel_length), grouped by dilation
    kernel_bias: torch.Tensor  # (num_kernels,)

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        num_kernels: int = 128,
        kernel_length: int = 9,
        seed: int = 0,
    ) -> None:
        super().__init__()
        shape = tuple(int(v) for v in input_shape)
        if len(shape) not in (1, 2):
            raise InvalidParameterError(
                f"random_kernels1d needs input_shape (L,) or (C, L), got {input_shape}"
            )
        for name, value, low in (
            ("num_kernels", num_kernels, 1),
            ("kernel_length", kernel_length, 2),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidParameterError(f"{name} must be an int >= {low}, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidParameterError(f"seed must be an int >= 0, got {seed!r}")
        channels, length = (1, shape[0]) if len(shape) == 1 else shape
        ratio = (length - 1) / (kernel_length - 1)
        top = int(math.floor(math.log2(ratio))) if ratio >= 1 else 0
        self.dilations = tuple(2**e for e in range(top + 1))
        self.kernel_length = kernel_length
        generator = torch.Generator().manual_seed(seed)
        weight = torch.randn(num_kernels, channels, kernel_length, generator=generator)
        weight -= weight.mean(dim=(1, 2), keepdim=True)
        bias = torch.rand(num_kernels, generator=generator) * 2 - 1
        # kernel j has dilation dilations[j % D]: stored grouped by dilation (one conv each)
        order = sorted(range(num_kernels), key=lambda j: j % len(self.dilations))
        self.register_buffer("kernel_weight", weight[order].contiguous())
        self.register_buffer("kernel_bias", bias[order].contiguous())
        self.counts = tuple(
            len(range(i, num_kernels, len(self.dilations))) for i in range(len(self.dilations))
        )
        # skip_init: no default initialisation (it would consume the global RNG), then zeros
        self.head = nn.utils.skip_init(nn.Linear, 2 * num_kernels, num_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 2·num_kernels): the max of every kernel's output, then every PPV."""
        if x.dim() == 2:
            x = x.unsqueeze(1)
        maxima, ppv, start = [], [], 0
        for dilation, count in zip(self.dilations, self.counts, strict=True):
            if count == 0:
                continue
            y = nn.functional.conv1d(
                x,
                self.kernel_weight[start : start + count],
                self.kernel_bias[start : start + count],
                padding=(self.kernel_length - 1) * dilation // 2,
                dilation=dilation,
            )
            start += count
            maxima.append(y.amax(dim=-1))
            ppv.append((y > 0).to(y.dtype).mean(dim=-1))
        return torch.cat(maxima + ppv, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = self.features(x)
            z = nn.functional.layer_norm(z, z.shape[-1:])
        return self.head(z)


MODEL_NAMES = ("mlp", "cnn1d", "cnn2d", "linear", "random_kernels1d")


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
        "random_kernels1d": RandomKernelFeatures1d,
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
