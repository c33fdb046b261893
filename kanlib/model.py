"""KAN layers and models, and the MLP baseline. Pure ``nn.Module``: no torch.distributed, no I/O."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kanlib.bspline import bspline_basis, make_grid


class KANLinear(nn.Module):
    """Exact B-spline KAN layer: ``y = silu(x) @ W_base^T + B(x) @ (W_spline * scale)^T``.

    Each edge (i -> o) carries ``w_base[o, i] * silu(x_i) + scale[o, i] * sum_j c[o, i, j] B_j(x_i)``
    with ``B_j`` the order-``spline_order`` B-splines on a uniform grid of ``grid_size``
    intervals on ``grid_range``, extended by ``spline_order`` knots on each side. The grid is a
    registered buffer (DDP broadcasts it, ``state_dict`` saves it).

    x: ``(batch, in_features)`` -> ``(batch, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, grid_size: int = 5,
                 spline_order: int = 3, grid_range: tuple[float, float] = (-1.0, 1.0),
                 scale_noise: float = 0.1, scale_base: float = 1.0, scale_spline: float = 1.0,
                 standalone_scale_spline: bool = True):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        if grid_size <= 0 or spline_order <= 0:
            raise ValueError(f"grid_size and spline_order must be positive, got {grid_size}, {spline_order}")
        self.in_features = in_features
        self.out_features = out_features
        self.grid_size = grid_size
        self.spline_order = spline_order
        self.register_buffer("grid", make_grid(in_features, grid_size, spline_order, grid_range))
        n_coeff = grid_size + spline_order
        self.base_weight = nn.Parameter(torch.empty(out_features, in_features))
        self.spline_weight = nn.Parameter(torch.empty(out_features, in_features, n_coeff))
        self.spline_scaler = (nn.Parameter(torch.empty(out_features, in_features))
                              if standalone_scale_spline else None)
        self.scale_noise, self.scale_base, self.scale_spline = scale_noise, scale_base, scale_spline
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5) * self.scale_base)
        with torch.no_grad():
            # Small random spline coefficients: the layer starts close to its base branch.
            self.spline_weight.uniform_(-1, 1).mul_(self.scale_noise / self.grid_size)
        if self.spline_scaler is not None:
            nn.init.kaiming_uniform_(self.spline_scaler, a=math.sqrt(5) * self.scale_spline)

    @property
    def scaled_spline_weight(self) -> torch.Tensor:
        """``(out, in, grid_size + spline_order)`` coefficients times the per-edge scale."""
        if self.spline_scaler is None:
            return self.spline_weight
        return self.spline_weight * self.spline_scaler.unsqueeze(-1)

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, in, grid_size + spline_order)``."""
        return bspline_basis(x, self.grid, self.spline_order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected (..., {self.in_features}) input, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        base = F.linear(F.silu(x), self.base_weight)  # (batch, out)
        spline = F.linear(self.basis(x).flatten(1),  # (batch, in * coeff)
                          self.scaled_spline_weight.flatten(1))  # (batch, out)
        return (base + spline).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"grid_size={self.grid_size}, spline_order={self.spline_order}")


class KAN(nn.Module):
    """A stack of KAN layers. ``widths = [in, hidden..., out]``; x: ``(batch, in)`` -> ``(batch, out)``."""

    def __init__(self, widths, grid_size: int = 5, spline_order: int = 3,
                 grid_range: tuple[float, float] = (-1.0, 1.0), layer=KANLinear, **layer_kwargs):
        super().__init__()
        widths = list(widths)
        if len(widths) < 2:
            raise ValueError(f"widths needs at least 2 entries, got {widths}")
        self.widths = widths
        self.layers = nn.ModuleList(
            layer(a, b, grid_size=grid_size, spline_order=spline_order, grid_range=grid_range, **layer_kwargs)
            for a, b in zip(widths, widths[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(nn.Module):
    """Plain MLP baseline: Linear layers with SiLU between them. x: ``(batch, in)`` -> ``(batch, out)``."""

    def __init__(self, widths):
        super().__init__()
        widths = list(widths)
        if len(widths) < 2:
            raise ValueError(f"widths needs at least 2 entries, got {widths}")
        self.widths = widths
        mods: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            mods.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                mods.append(nn.SiLU())
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_model(cfg) -> nn.Module:
    """The model a :class:`kanlib.config.RunConfig` asks for."""
    if cfg.model == "mlp":
        return MLP(cfg.widths)
    if cfg.model == "kan":
        return KAN(cfg.widths, cfg.grid_size, cfg.spline_order, cfg.grid_range)
    raise ValueError(f"model: {cfg.model!r} is not built by this version")
