"""B-spline bases for KAN layers.

``make_grid`` builds the extended uniform knot vector of a layer; ``bspline_basis`` is the
readable reference (Cox-de Boor recursion over all knots), valid for any knot vector.
"""

from __future__ import annotations

import torch


def make_grid(in_features: int, grid_size: int, spline_order: int,
              grid_range: tuple[float, float] = (-1.0, 1.0),
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Uniform knots on ``grid_range`` extended by ``spline_order`` knots on each side.

    Returns ``(in_features, grid_size + 2 * spline_order + 1)``, one identical row per input.
    """
    lo, hi = grid_range
    h = (hi - lo) / grid_size
    knots = torch.arange(-spline_order, grid_size + spline_order + 1, dtype=torch.float64) * h + lo
    return knots.to(dtype).expand(in_features, -1).contiguous()  # (in, G + 2k + 1)


def bspline_basis(x: torch.Tensor, grid: torch.Tensor, spline_order: int) -> torch.Tensor:
    """B-spline basis of order ``spline_order`` on each input's knot vector (Cox-de Boor).

    x: ``(..., in)``; grid: ``(in, G + 2k + 1)`` non-decreasing knots per input.
    Returns ``(..., in, G + k)``: basis function j of input i at x[..., i]. Inside
    ``[grid[:, k], grid[:, -k-1])`` the values sum to 1 (partition of unity); outside the
    extended grid they are 0. Differentiable in ``x``.
    """
    if grid.dim() != 2 or grid.shape[0] != x.shape[-1]:
        raise ValueError(f"grid must be (in={x.shape[-1]}, n_knots), got {tuple(grid.shape)}")
    if grid.shape[1] < spline_order + 2:
        raise ValueError(f"grid has {grid.shape[1]} knots, need at least spline_order + 2 = {spline_order + 2}")
    g = grid.to(x.dtype)
    xs = x.unsqueeze(-1)  # (..., in, 1)
    bases = ((xs >= g[:, :-1]) & (xs < g[:, 1:])).to(x.dtype)  # (..., in, n_knots - 1)
    for k in range(1, spline_order + 1):
        left = (xs - g[:, : -(k + 1)]) / (g[:, k:-1] - g[:, : -(k + 1)])
        right = (g[:, k + 1:] - xs) / (g[:, k + 1:] - g[:, 1:(-k)])
        bases = left * bases[..., :-1] + right * bases[..., 1:]  # (..., in, n_knots - 1 - k)
    return bases.contiguous()
