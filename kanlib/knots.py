"""The B-spline basis on any strictly increasing knots: what the KAN kernels use once grid updates have fit the
knots to the data.

:class:`KnotGrid` (built by :func:`knot_grid`) carries a layer's knots as the kernels need them. The eager
kernels find x's knot interval by ``searchsorted`` and run de Boor's triangular recursion for the k + 1 bases
nonzero there (:func:`knot_local`); the compiled ones run Cox-de Boor's recursion on the k + 2 knots of each
basis's support, pointwise (:func:`knot_basis`). Both equal the reference :func:`kanlib.bspline.bspline_basis`
on the same knots up to rounding. The layer kernels built on them are in :mod:`kanlib.fast_kan` (eager) and
:mod:`kanlib.pointwise` (compiled).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class KnotGrid(NamedTuple):
    """Any strictly increasing knot vector per input (a grid refit to the data), as the kernels use it.

    Basis j (``0 <= j < grid_size + spline_order``) is the B-spline on knots ``t_j .. t_{j+k+1}`` of its input;
    the kernels evaluate it by Cox-de Boor's recursion restricted to those knots (compiled: every basis
    pointwise; eager: the interval of x found by ``searchsorted`` and the k + 1 bases nonzero there), which is
    :func:`kanlib.bspline.bspline_basis` on the same knots up to rounding.
    """

    padded: torch.Tensor  # (in, n + 2k) the n = G + 2k + 1 knots and k more on each side (eager gathers)
    knots_t: torch.Tensor  # (n, in) the knots, knot-major (compiled kernels)
    inv: torch.Tensor  # (k, n, in): inv[d - 1, l] = 1 / (t_{l+d} - t_l), 0 where l + d >= n
    grid_size: int  # G: intervals inside the interior knots
    spline_order: int  # k

    @property
    def n_coeff(self) -> int:
        """Basis functions per input, ``G + k``."""
        return self.grid_size + self.spline_order

    def like(self, x: torch.Tensor) -> "KnotGrid":
        """This grid with its tensors in x's dtype and on x's device (the kernels compute in x's dtype)."""
        if self.padded.dtype == x.dtype and self.padded.device == x.device:
            return self
        return self._replace(padded=self.padded.to(x), knots_t=self.knots_t.to(x), inv=self.inv.to(x))

    def kernel_args(self) -> tuple:
        """What the compiled kernels take after x: ``(knots_t, inv, n_coeff, k)``."""
        return self.knots_t, self.inv, self.n_coeff, self.spline_order


def knot_grid(grid: torch.Tensor, spline_order: int, dtype: torch.dtype | None = None) -> KnotGrid | None:
    """The :class:`KnotGrid` of ``grid: (in, G + 2k + 1)``, or ``None`` where some row is not strictly
    increasing and finite (repeated knots divide by zero in Cox-de Boor: only the reference path runs there).

    ``dtype``: the dtype of the tables (default the grid's); the reciprocals of the knot spacings are computed
    in float64 from the grid's own knots, then rounded once.
    """
    check_grid_shape(grid, spline_order)
    g = grid.detach().to(torch.float64)
    if not bool(torch.isfinite(g).all()) or not bool((g[:, 1:] > g[:, :-1]).all()):
        return None
    k, n = spline_order, g.shape[1]
    dtype = dtype or grid.dtype
    inv = g.new_zeros(k, n, g.shape[0])
    for d in range(1, k + 1):
        inv[d - 1, : n - d] = (1.0 / (g[:, d:] - g[:, :-d])).t()
    ext = torch.arange(1, k + 1, dtype=torch.float64, device=g.device)
    left = g[:, :1] - (g[:, 1:2] - g[:, :1]) * ext.flip(0)  # only for gathers: their bases are never used
    right = g[:, -1:] + (g[:, -1:] - g[:, -2:-1]) * ext
    padded = torch.cat([left, g, right], dim=1)
    return KnotGrid(padded.to(dtype).contiguous(), g.t().to(dtype).contiguous(), inv.to(dtype).contiguous(),
                    n - 2 * k - 1, k)


def check_grid_shape(grid: torch.Tensor, spline_order: int) -> None:
    """Raise ``ValueError`` unless ``grid`` is a floating-point ``(in, G + 2k + 1)`` knot tensor with ``G >= 1``
    for ``k = spline_order`` (what :func:`knot_grid` and :func:`kanlib.fast_kan.uniform_grid` take)."""
    if grid.dim() != 2 or grid.shape[1] < 2 * spline_order + 2:
        raise ValueError(f"grid must be (in, G + 2k + 1) with G >= 1 for spline_order={spline_order}, "
                         f"got {tuple(grid.shape)}")
    if not grid.dtype.is_floating_point:
        raise ValueError(f"grid must be a floating-point tensor, got {grid.dtype}")


def knot_local(x: torch.Tensor, grid: KnotGrid, flat: bool = False, derivative: bool = False):
    """Columns, values and d/dx of the k + 1 nonzero bases of each ``x: (batch, in)`` on non-uniform knots.

    Returns ``(col, vals, dvals)``, each ``(batch * in, k + 1)``: col the feature column of local value r as
    :func:`kanlib.fast_kan.features` uses (or, with ``flat``, the index of :func:`kanlib.fast_kan.flat_tables`'
    layout), vals the basis values and dvals their derivatives in x (``None`` without ``derivative``). The
    interval ``t_m <= x < t_{m+1}`` comes from ``searchsorted``; local value r is basis ``m - k + r``, by de
    Boor's triangular recursion on the 2k knots ``t_{m-k+1} .. t_{m+k}`` (Cox-de Boor restricted to the bases
    nonzero at x). Non-finite x gives NaN values at valid columns (the reference gives NaN there too), never an
    out-of-range index.
    """
    k = grid.spline_order
    batch, n_in = x.shape
    n_pad = grid.padded.shape[1]
    n = n_pad - 2 * k  # knots
    x = torch.where(torch.isfinite(x), x, math.nan)  # +-inf: NaN values and derivatives, as the reference
    m = torch.searchsorted(grid.padded, x.t().contiguous(), right=True).t().contiguous()  # (batch, in) knots <= x
    m = m.sub_(1 + k).clamp_(-1, n - 1)  # -1 and n - 1: left and right of the grid, where every basis is 0
    m.masked_fill_(torch.isnan(x), k)  # an interval where all k + 1 bases exist, so the NaN reaches the features
    # local knots t_{m-k+1} .. t_{m+k}, row q = t_{m-k+1+q}, gathered from the padded rows
    at = m + (torch.arange(n_in, device=x.device) * n_pad + k)  # (batch, in) index of t_m in padded, flat
    t = torch.take(grid.padded, at.view(1, -1) + torch.arange(1 - k, k + 1, device=x.device).unsqueeze(1))
    xv = x.reshape(1, -1)  # (1, batch * in)
    b = torch.ones_like(xv)  # order 0: only B_m is nonzero, and equals 1
    term = b
    for d in range(1, k + 1):  # b: (d, N), B_{m-d+1+r} of order d - 1
        tr, tl = t[k:k + d], t[k - d:k]  # t_{m+1+r} and t_{m+1+r-d}, r < d
        term = b / (tr - tl)
        b = xv.new_zeros(d + 1, xv.shape[1])
        b[:d] = (tr - xv) * term
        b[1:] += (xv - tl) * term  # (d + 1, N), B_{m-d+r} of order d
    dvals = None
    if derivative:  # dB_j/dx = k (B^{k-1}_j / (t_{j+k} - t_j) - B^{k-1}_{j+1} / (t_{j+k+1} - t_{j+1})): the last terms
        dv = xv.new_zeros(k + 1, xv.shape[1])
        dv[1:] = term
        dv[:k] -= term
        dvals = dv.mul_(k).t().contiguous()
    j = m.view(-1, 1) - k + torch.arange(k + 1, device=x.device)  # (N, k + 1) basis of local value r
    n_coeff = grid.n_coeff
    valid = (j >= 0) & (j < n_coeff)
    if flat:
        i = torch.arange(n_in, device=x.device).repeat(batch).unsqueeze(1)
        col = torch.where(valid, i * n_coeff + j, n_in * n_coeff)
    else:
        col = torch.where(valid, j + 1, 0)
    return col, b.t().contiguous(), dvals


def knot_basis(x, knots_t, inv, n_coeff: int, k: int, derivative: bool):
    """``(batch, C, in)``: ``B_j(x_i)`` (or ``dB_j/dx``) for every basis j, coefficient-major.

    Cox-de Boor's recursion on the k + 2 knots ``t_j .. t_{j+k+1}`` of basis j's support: k + 1 interval
    indicators from k + 2 comparisons, then ``k (k + 1) / 2`` blends, each a few elementwise operations on knot
    rows sliced from the parameter-sized ``knots_t: (n, in)`` and ``inv: (k, n, in)`` (no index depends on x, so
    inductor fuses it all into one loop). ``dB_j/dx = k (B^{k-1}_j inv_k[j] - B^{k-1}_{j+1} inv_k[j+1])``. A
    non-finite x gives NaN (``(x - t) * 0``), as the reference does.
    """
    xs = x.unsqueeze(1)  # (batch, 1, in)
    t = [knots_t[r:r + n_coeff] for r in range(k + 2)]  # t[r]: (C, in), knot j + r of basis j
    ge = [(xs >= t[r]).to(x.dtype) for r in range(k + 2)]
    b = [ge[r] - ge[r + 1] for r in range(k + 1)]  # order 0 on interval j + r: [t_{j+r} <= x < t_{j+r+1}]
    for d in range(1, k if derivative else k + 1):
        # w_r = (x - t_{j+r}) / (t_{j+r+d} - t_{j+r}); the right factor (t_{j+r+d+1} - x) / (t_{j+r+d+1} - t_{j+r+1})
        # is 1 - w_{r+1}: each blend weight is computed once and used twice (half the work, same to rounding)
        w = [(xs - t[r]) * inv[d - 1, r:r + n_coeff] for r in range(k + 2 - d)]
        b = [w[r] * b[r] + (1 - w[r + 1]) * b[r + 1] for r in range(k + 1 - d)]  # order d, knots j + r .. + d + 1
    if derivative:
        return k * (b[0] * inv[k - 1, :n_coeff] - b[1] * inv[k - 1, 1:1 + n_coeff])
    return b[0]
