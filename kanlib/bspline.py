"""B-spline bases for KAN layers.

``make_grid`` builds the extended uniform knot vector of a layer; ``bspline_basis`` is the
readable reference (Cox-de Boor recursion over all knots), valid for any knot vector.

The rest serves the fast path on uniform grids, where only ``k + 1`` bases are nonzero at any
x: ``grid_uniform_params`` (is a grid uniform, and its first knot and spacing),
``local_bspline``/``local_bspline_poly`` (the k + 1 local polynomial pieces),
``uniform_bspline_local``/``uniform_bspline_tables`` (where those values go) and
``uniform_bspline_basis`` (the dense basis by the closed form, equal to ``bspline_basis``),
``symmetric_bspline_pieces`` (the cardinal B-spline in the distance from its centre, the form
the compiled kernels use).
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


# ---------------------------------------------------------------------------------------
# Fast path for uniform grids: only spline_order + 1 basis functions are nonzero at any x.
#
# On a uniform knot vector t_j = t_0 + j h, with u = (x - t_0) / h, m = floor(u) and
# t = u - m in [0, 1), the nonzero order-k B-splines are B_{m-r}(x) for r = 0..k, and
# B_{m-r}(x) = P_{k,r}(t), a fixed degree-k polynomial (a piece of the cardinal B-spline).
# The local Cox-de Boor recursion on (t, r) below computes exactly those k + 1 values.
# ---------------------------------------------------------------------------------------


def grid_uniform_params(grid: torch.Tensor, rtol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor] | None:
    """First knot and inverse spacing of each row of ``grid`` if every row is uniform, else ``None``.

    grid: ``(in, n_knots)``. Returns ``(knot0, inv_h)``, each ``(in,)`` float32, or ``None`` when
    some row's spacings differ by more than ``rtol`` times its mean spacing (a non-uniform grid,
    e.g. after a data-adaptive grid update with ``grid_eps < 1``).
    """
    if grid.dim() != 2 or grid.shape[1] < 2:
        raise ValueError(f"grid must be (in, n_knots >= 2), got {tuple(grid.shape)}")
    g = grid.detach().to(torch.float64)
    d = g[:, 1:] - g[:, :-1]  # (in, n_knots - 1)
    h = (g[:, -1] - g[:, 0]) / (g.shape[1] - 1)  # (in,)
    if not bool((h > 0).all()):
        return None
    if not bool(((d - h.unsqueeze(1)).abs() <= rtol * h.unsqueeze(1)).all()):
        return None
    return g[:, 0], 1.0 / h


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


def uniform_bspline_local(x: torch.Tensor, knot0: torch.Tensor, inv_h: torch.Tensor,
                          grid_size: int, spline_order: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nonzero basis values of ``x`` on per-input uniform grids, and where they go.

    x: ``(batch, in)``; knot0, inv_h: ``(in,)`` first knot and inverse spacing of each input's
    extended grid (``grid_size + 2 * spline_order + 1`` knots). Returns ``(idx, values, dvalues)``,
    each ``(batch, in, k + 1)``: ``values[..., r]`` is basis function ``idx[..., r]`` (in
    ``0 .. grid_size + k - 1``) at x, ``dvalues`` its derivative in x. Entries that fall outside
    the basis (left/right of the extended grid, or the missing functions near its ends) have
    value and derivative 0 and a clamped, valid index, so they can be scatter-added or gathered.
    """
    k = spline_order
    n_coeff = grid_size + k
    u = (x - knot0) * inv_h  # (batch, in) position in knot intervals from the first knot
    m = torch.floor(u)
    t = u - m
    vals, dvals = local_bspline(t, k)  # (batch, in, k + 1)
    j = m.to(torch.int64).unsqueeze(-1) - torch.arange(k + 1, device=x.device)  # (batch, in, k + 1)
    # x in [t_0, t_{G+2k}) <=> 0 <= m <= G + 2k - 1; basis indices exist for 0 <= j < G + k.
    keep = (j >= 0) & (j < n_coeff)
    keep &= ((m >= 0) & (m <= grid_size + 2 * k - 1)).unsqueeze(-1)
    keepf = keep.to(vals.dtype)
    idx = j.clamp(0, n_coeff - 1)
    return idx, vals * keepf, dvals * (keepf * inv_h.unsqueeze(-1))


def uniform_bspline_basis(x: torch.Tensor, grid: torch.Tensor, spline_order: int) -> torch.Tensor:
    """Dense basis on a uniform grid by the closed form; same values as :func:`bspline_basis`.

    x: ``(..., in)``; grid: ``(in, G + 2k + 1)`` uniform knots per input. Returns
    ``(..., in, G + k)``. Raises ``ValueError`` if the grid is not uniform.
    """
    if grid.dim() != 2 or grid.shape[0] != x.shape[-1]:
        raise ValueError(f"grid must be (in={x.shape[-1]}, n_knots), got {tuple(grid.shape)}")
    params = grid_uniform_params(grid)
    if params is None:
        raise ValueError("uniform_bspline_basis needs a uniform grid; use bspline_basis for this one")
    grid_size = grid.shape[1] - 1 - 2 * spline_order
    if grid_size <= 0:
        raise ValueError(f"grid has {grid.shape[1]} knots, too few for spline_order={spline_order}")
    knot0, inv_h = (p.to(device=x.device, dtype=x.dtype) for p in params)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    idx, vals, _ = uniform_bspline_local(x2, knot0, inv_h, grid_size, spline_order)
    out = x2.new_zeros(x2.shape[0], x2.shape[1], grid_size + spline_order)
    out.scatter_add_(-1, idx, vals)  # (batch, in, G + k)
    return out.reshape(*lead, x.shape[-1], grid_size + spline_order)


def local_bspline_poly(spline_order: int) -> torch.Tensor:
    """Power-basis coefficients of the local B-spline pieces and their derivatives, float64.

    Returns ``M`` of shape ``(k + 1, 2 * (k + 1))`` with ``[t^0 .. t^k] @ M = [values, d/dt values]``
    of :func:`local_bspline` (solved exactly from k + 1 sample points, a Vandermonde system).
    """
    k = spline_order
    ts = (torch.arange(k + 1, dtype=torch.float64) + 0.5) / (k + 1)  # k + 1 distinct points in (0, 1)
    vals, dvals = local_bspline(ts, k)  # (k + 1, k + 1)
    v = torch.linalg.vander(ts, N=k + 1)  # (k + 1 points, k + 1 powers)
    return torch.linalg.solve(v, torch.cat([vals, dvals], dim=1))  # (k + 1, 2k + 2)


def uniform_bspline_tables(grid_size: int, spline_order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column and mask tables indexed by the knot interval, for a scatter into ``[silu, basis]`` rows.

    Interval index ``mi = clamp(m + 1, 0, G + 2k + 1)`` (0 and ``G + 2k + 1`` stand for left and
    right of the extended grid). Returns ``(cols, keep)``, each ``(G + 2k + 2, k + 1)``:
    ``cols[mi, r] = j + 1`` for basis ``j = m - r`` when it exists (``0 <= j < G + k``), else 0
    (column 0 holds silu(x) and is written after the scatter, which discards those values);
    ``keep`` is 1.0 where the basis exists, else 0.0.
    """
    k = spline_order
    n_coeff = grid_size + k
    m = torch.arange(-1, grid_size + 2 * k + 1).unsqueeze(1)  # (G + 2k + 2, 1)
    j = m - torch.arange(k + 1)  # (G + 2k + 2, k + 1)
    keep = (j >= 0) & (j < n_coeff)
    return torch.where(keep, j + 1, 0), keep.to(torch.float64)


def symmetric_bspline_pieces(spline_order: int) -> tuple[float, list[float], list[list[float]], list[list[float]]]:
    """The cardinal B-spline written in the distance ``s = |v - (k + 1) / 2|`` from its centre.

    The order-k cardinal B-spline ``N(v)`` (support ``[0, k + 1]``, ``B_j(x) = N(u - j)`` on a
    uniform grid) is symmetric, so ``floor(k / 2) + 1`` polynomial pieces in ``s`` describe it.
    Returns ``(half_width, bounds, vals, dvals)``: ``N = 0`` for ``s >= half_width = (k + 1) / 2``;
    piece ``q`` holds for ``s < bounds[q]`` (the first such q); ``vals[q]`` are its power
    coefficients in ``s`` and ``dvals[q]`` those of ``dN/ds`` (so ``dN/dv = sign(v - c) dN/ds``).
    Solved in float64 from :func:`local_bspline` at sample points, like :func:`local_bspline_poly`.
    """
    k = spline_order
    half = (k + 1) / 2
    first = 0.5 if k % 2 == 0 else 1.0  # pieces change where v is an integer
    bounds = [first + q for q in range(k // 2 + 1)]
    bounds[-1] = half
    lows = [0.0] + bounds[:-1]
    vals, dvals = [], []
    for lo, hi in zip(lows, bounds):
        ss = lo + (hi - lo) * (torch.arange(k + 1, dtype=torch.float64) + 0.5) / (k + 1)  # (k + 1,)
        v = half + ss  # right half of the support
        r = torch.floor(v)
        t = v - r
        piece_vals, piece_d = local_bspline(t, k)  # (k + 1 points, k + 1 pieces); N(v) = P_{r'}(t)
        # u - j = v lies in interval r of the support: that is local piece r' = r (B_{m-r'} with m - j = r).
        idx = r.to(torch.int64).unsqueeze(1)
        n_v = piece_vals.gather(1, idx).squeeze(1)
        dn_v = piece_d.gather(1, idx).squeeze(1)
        vand = torch.linalg.vander(ss, N=k + 1)
        vals.append(torch.linalg.solve(vand, n_v).tolist())
        dvals.append(torch.linalg.solve(vand, dn_v).tolist())
    return half, bounds, vals, dvals
