"""B-spline bases for KAN layers: the readable reference.

``make_grid`` builds the extended uniform knot vector of a layer; ``bspline_basis`` is the reference
(Cox-de Boor recursion over all knots), valid for any knot vector; ``local_bspline`` is the same
recursion for the ``k + 1`` nonzero bases on a uniform grid, from which :mod:`kanlib.fast_kan` derives
its closed forms (and against which the production basis :func:`kanlib.fast_kan.uniform_basis` is tested).
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


# On a uniform knot vector t_j = t_0 + j h, with u = (x - t_0) / h, m = floor(u) and t = u - m in
# [0, 1), the nonzero order-k B-splines are B_{m-r}(x) for r = 0..k, and B_{m-r}(x) = P_{k,r}(t), a fixed
# degree-k polynomial (a piece of the cardinal B-spline). The local Cox-de Boor recursion on (t, r)
# below computes exactly those k + 1 values.


def local_bspline(t: torch.Tensor, spline_order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and ``d/dt`` of the ``spline_order + 1`` nonzero uniform B-splines at fraction ``t``.

    t: ``(...)`` in ``[0, 1)``. Returns ``(values, dvalues)``, each ``(..., k + 1)``: entry ``r`` is
    ``B_{m-r}`` (the basis function whose support starts ``r`` intervals left of the one holding x)
    and its derivative with respect to ``t`` (multiply by ``1 / h`` for ``d/dx``).
    """
    k = spline_order
    b = [torch.ones_like(t)]  # order 0: only B_m is nonzero, and equals 1
    prev = b
    for d in range(1, k + 1):
        prev = b
        inv_d = 1.0 / d
        nb = []
        for r in range(d + 1):
            # B^d_{m-r} = (t + r)/d * B^{d-1}_{m-r} + (d + 1 - r - t)/d * B^{d-1}_{m-r+1}
            term = None
            if r < d:
                term = (t + r) * prev[r]
            if r > 0:
                other = (d + 1 - r - t) * prev[r - 1]
                term = other if term is None else term + other
            nb.append(term * inv_d)
        b = nb
    # d/du B^k_{m-r} = B^{k-1}_{m-r} - B^{k-1}_{m-r+1}  (and du/dt = 1)
    if k == 0:
        db = [torch.zeros_like(t)]
    else:
        db = []
        for r in range(k + 1):
            v = prev[r] if r < k else None
            if r > 0:
                v = -prev[r - 1] if v is None else v - prev[r - 1]
            db.append(v)
    return torch.stack(b, -1), torch.stack(db, -1)
