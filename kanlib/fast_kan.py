"""Fast exact KAN kernels: the closed-form B-spline basis on uniform grids, Cox-de Boor on the few knots that
matter on any other grid, their autograd functions, compiled kernels.

One KAN layer computes ``y = [silu(x), B(x)] @ [W_base, W_spline * scale]^T`` with ``B`` the order-k
B-splines of each input on its knot vector. Only ``k + 1`` bases are nonzero at any x. On a *uniform* knot
vector their values are fixed polynomials of the position inside the knot interval, so the basis costs a few
elementwise operations instead of the Cox-de Boor recursion over all knots: :class:`UniformGrid` carries what
a kernel needs to know about such a grid, and :func:`uniform_grid` builds it from a knot tensor, or returns
``None`` when the knots are not uniform to within their dtype's rounding. Grid updates fit the knots to the
data, and then :class:`KnotGrid` (:func:`knot_grid`) carries them: the kernels run Cox-de Boor's recursion on
the k + 2 knots of each basis's support (or, eagerly, find x's knot interval and run it for the k + 1 bases
nonzero there), the reference :func:`kanlib.bspline.bspline_basis` up to rounding. Only a grid whose knots
are not strictly increasing leaves the layer on the reference path.

Two modes, one code path each (:func:`kan_linear` picks):

- ``"fast"``: eager PyTorch. Features ``(batch, in, 1 + C)`` from the k + 1 local values by one scatter
  (:func:`features`), one GEMM with the fused weight; backward gathers d loss / d x at the k + 1
  nonzero bases. Layers of at most ``SMALL_OUT`` outputs gather their coefficients at those bases
  instead and never build the features. Temporaries live in reused scratch buffers.
- ``"compiled"``: the features and d/dx are written pointwise, coefficient-major ``(batch, 1 + C, in)``,
  by torch.compile'd kernels (no scatter, so inductor fuses them into one loop); layers with at most
  ``SMALL_OUT`` outputs never materialise the features. Where torch.compile cannot run (no C++ compiler,
  unsupported platform, compile error) the layer falls back to ``"fast"``, with one warning per process.

Compiling once: the kernels are compiled per layer shape with static shapes (``fullgraph=True``, so a
graph break or dynamo's recompile limit raises and that call runs eagerly, recorded as "fast"). torch 2.13
keeps compiled kernels on disk by default (FX graph cache ``TORCHINDUCTOR_FX_GRAPH_CACHE`` and AOTAutograd
cache ``TORCHINDUCTOR_AUTOGRAD_CACHE``, both on) under ``TORCHINDUCTOR_CACHE_DIR`` (default
``/tmp/torchinductor_<user>``): a second process with the same folder loads instead of compiling. What it
still pays per process is inductor's import, dynamo's tracing of each kernel and shape, and the CPU
vector-ISA probe; :func:`remember_isa_probes` makes the probe once per host, :func:`prepare_compile`
starts the rest in the background.

Both modes save only x and parameter-sized tensors for backward and rebuild the basis there, so a training
step keeps nothing of size ``batch * in * coeff`` alive between forward and backward. Non-finite inputs give
non-finite outputs and gradients on every path, never an exception (a NaN must reach the trainer's
``nan_policy``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import sys
import threading
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.parallel import DistributedDataParallel as DDP

from kanlib.bspline import local_bspline

SMALL_OUT = 2  # layers with at most this many outputs use matrix-vector kernels (fused when compiled)


# -- the grid ------------------------------------------------------------------------------------
class UniformGrid(NamedTuple):
    """A uniform knot vector per input, as the kernels use it.

    ``u = x * inv_h + shift`` is the position of x in knot intervals from the first knot. Basis j
    (``0 <= j < grid_size + spline_order``) is the cardinal B-spline ``N(u - j)``.
    """

    shift: torch.Tensor  # (in,) -first_knot / spacing, in the compute dtype
    inv_h: torch.Tensor  # (in,) 1 / knot spacing
    cols: torch.Tensor  # (G + 2k + 2, k + 1) int64, see uniform_tables()
    grid_size: int  # G: intervals inside grid_range
    spline_order: int  # k

    @property
    def n_coeff(self) -> int:
        """Basis functions per input, ``G + k``."""
        return self.grid_size + self.spline_order

    def like(self, x: torch.Tensor) -> "UniformGrid":
        """This grid with its tensors in x's dtype and on x's device (the kernels compute in x's dtype)."""
        if self.shift.dtype == x.dtype and self.shift.device == x.device:
            return self
        return self._replace(shift=self.shift.to(x), inv_h=self.inv_h.to(x), cols=self.cols.to(x.device))

    def kernel_args(self) -> tuple:
        """What the compiled kernels take after x: ``(shift, inv_h, n_coeff, cardinal_terms(k))``."""
        return self.shift, self.inv_h, self.n_coeff, cardinal_terms(self.spline_order)


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
    _check_grid_shape(grid, spline_order)
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


def _check_grid_shape(grid: torch.Tensor, spline_order: int) -> None:
    if grid.dim() != 2 or grid.shape[1] < 2 * spline_order + 2:
        raise ValueError(f"grid must be (in, G + 2k + 1) with G >= 1 for spline_order={spline_order}, "
                         f"got {tuple(grid.shape)}")
    if not grid.dtype.is_floating_point:
        raise ValueError(f"grid must be a floating-point tensor, got {grid.dtype}")


def uniform_grid(grid: torch.Tensor, spline_order: int, dtype: torch.dtype | None = None) -> UniformGrid | None:
    """The :class:`UniformGrid` of ``grid: (in, G + 2k + 1)``, or ``None`` if some row is not uniform.

    A row counts as uniform when every knot equals ``first + j * (last - first) / (n - 1)`` to within
    ``4 * eps(grid.dtype) * max|knot|``, i.e. when it is what a uniform grid rounded to the grid's own
    dtype looks like; anything more (a knot moved by 1e-5 of a cell in float32, a float32 grid cast to
    float64) would make the closed form differ from :func:`kanlib.bspline.bspline_basis` by more than
    rounding. ``dtype``: the dtype of ``shift``/``inv_h`` (default the grid's); computed in float64.
    """
    _check_grid_shape(grid, spline_order)
    g = grid.detach().to(torch.float64)
    n = g.shape[1] - 1
    first, last = g[:, :1], g[:, -1:]
    h = (last - first) / n  # (in, 1)
    ideal = first + torch.arange(n + 1, dtype=torch.float64, device=g.device) * h
    tol = 4 * torch.finfo(grid.dtype).eps * g.abs().amax(dim=1, keepdim=True)
    if not bool((h > 0).all()) or not bool(((g - ideal).abs() <= tol).all()):
        return None
    inv_h = 1.0 / h[:, 0]
    dtype = dtype or grid.dtype
    grid_size = n - 2 * spline_order
    return UniformGrid((-first[:, 0] * inv_h).to(dtype), inv_h.to(dtype),
                       uniform_tables(grid_size, spline_order, grid.device), grid_size, spline_order)


@functools.lru_cache(maxsize=None)
def _tables_cpu(grid_size: int, spline_order: int) -> torch.Tensor:
    k, n_coeff = spline_order, grid_size + spline_order
    m = torch.arange(-1, grid_size + 2 * k + 1).unsqueeze(1)  # (G + 2k + 2, 1) knot interval
    j = m - torch.arange(k + 1)  # (G + 2k + 2, k + 1) basis index of local value r
    return torch.where((j >= 0) & (j < n_coeff), j + 1, 0)


_TABLES: dict = {}


def uniform_tables(grid_size: int, spline_order: int, device) -> torch.Tensor:
    """``cols: (G + 2k + 2, k + 1)`` int64: the feature column of local value r in knot interval ``mi``.

    ``mi = clamp(m + 1, 0, G + 2k + 1)`` for ``m = floor(u)`` (0 and ``G + 2k + 1``: left and right of
    the extended grid). Local value r is basis ``j = m - r``; its column in ``[silu, B_0 .. B_{C-1}]``
    is ``j + 1`` when that basis exists, else 0: column 0 holds silu(x), written after the scatter.
    """
    key = (grid_size, spline_order, str(device))
    if key not in _TABLES:
        _TABLES[key] = _tables_cpu(grid_size, spline_order).to(device)
    return _TABLES[key]


def flat_tables(grid_size: int, spline_order: int, n_in: int, device) -> torch.Tensor:
    """``(in * (G + 2k + 2), k + 1)`` int64: for input i in knot interval ``mi`` (row ``i * (G + 2k + 2) + mi``),
    the index of local value r's basis in the flattened ``(in * C,)`` spline coefficients of one output,
    ``i * C + j``, or ``in * C`` (one slot past them, a sink) where that basis does not exist."""
    key = ("flat", grid_size, spline_order, n_in, str(device))
    if key not in _TABLES:
        cols = _tables_cpu(grid_size, spline_order)  # (G + 2k + 2, k + 1): j + 1 or 0
        n_coeff = grid_size + spline_order
        i = torch.arange(n_in).view(-1, 1, 1)
        flat = torch.where(cols > 0, i * n_coeff + cols - 1, n_in * n_coeff)  # (in, G + 2k + 2, k + 1)
        _TABLES[key] = flat.view(-1, spline_order + 1).to(device)
    return _TABLES[key]


@functools.lru_cache(maxsize=None)
def local_poly(spline_order: int) -> torch.Tensor:
    """``(k + 1, 2k + 2)`` float64: ``[t^0 .. t^k] @ M = [values, d/dt values]`` of :func:`local_bspline`.

    Solved exactly (a Vandermonde system on k + 1 points) from the local Cox-de Boor recursion.
    """
    k = spline_order
    ts = (torch.arange(k + 1, dtype=torch.float64) + 0.5) / (k + 1)
    vals, dvals = local_bspline(ts, k)  # (k + 1 points, k + 1)
    return torch.linalg.solve(torch.linalg.vander(ts, N=k + 1), torch.cat([vals, dvals], dim=1))


_POLYS: dict = {}


@functools.lru_cache(maxsize=None)
def cardinal_terms(spline_order: int) -> tuple:
    """The cardinal B-spline in the distance ``s = |v - (k + 1) / 2|`` from its centre, as Python floats.

    ``N(v)`` (support ``[0, k + 1]``) is symmetric and, written with truncated powers from its centre,
    ``N = sum_l c_l * max(o_l - s, 0)^k`` over the ``l`` with ``o_l = (k + 1) / 2 - l > 0`` and
    ``c_l = (-1)^l binom(k + 1, l) / k!`` (for cubics ``((2 - s)_+^3 - 4 (1 - s)_+^3) / 6``): a few
    elementwise operations and no case selection, and the terms cancel by at most a small factor
    (2 for cubics) for the small k of KANs. Returns ``(half, terms)`` with ``terms = ((o_l, c_l), ...)``;
    ``dN/dv = -sign(v - half) k sum_l c_l max(o_l - s, 0)^(k - 1)``. Floats, so torch.compile folds them.
    """
    k = spline_order
    half = (k + 1) / 2
    terms = tuple((half - l, (-1) ** l * math.comb(k + 1, l) / math.factorial(k))
                  for l in range(k + 1) if half - l > 0)
    return half, terms


# -- eager ("fast") kernels ----------------------------------------------------------------------
class _Scratch(threading.local):
    """Reusable CPU buffers for the eager kernels' temporaries, one per name (and thread).

    A training step of a 256x256 layer allocates and frees ~30 MB of temporaries; glibc hands such
    blocks back to the kernel and maps them again at the next step, and the page faults (~10k per
    step) cost as much as a GEMM. Reusing the blocks removes them. Only temporaries that die inside
    one kernel call live here, never a returned or saved tensor. CUDA's caching allocator already
    reuses memory, so there (and for other devices) this is plain ``torch.empty``.
    """

    def __init__(self):
        self.buffers: dict = {}

    def get(self, name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=device)
        numel = math.prod(shape)
        buf = self.buffers.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = self.buffers[(name, dtype)] = torch.empty(numel, dtype=dtype)
        return buf[:numel].view(shape)


_SCRATCH = _Scratch()


def _local(x: torch.Tensor, grid: UniformGrid, flat: bool = False):
    """Columns of the k + 1 nonzero bases of each ``x: (batch, in)`` and the powers of t (scratch buffers).

    Returns ``(col, powers)``: col ``(batch * in, k + 1)`` int64, the feature column of local value r
    (0 for bases that do not exist); powers ``(k + 1, batch * in)``, rows ``1, t, .., t^k`` for ``t``
    the position inside the knot interval. With ``flat``, col holds the indices of :func:`flat_tables`
    instead (x must be ``(batch, in)``). The basis values are ``P @ powers`` with ``P`` from
    :func:`_poly_t`: powers are local-value-major because ``(k + 1, k + 1) @ (k + 1, n)`` is a fast
    wide GEMM where ``(n, k + 1) @ (k + 1, k + 1)`` is a tall-skinny one ~7x slower. Non-finite x gives
    NaN powers at valid columns, never an out-of-range index.
    """
    k1 = grid.spline_order + 1
    n = x.numel()
    # (batch * in,) position in knot intervals
    u = torch.addcmul(grid.shift, x, grid.inv_h, out=_SCRATCH.get("u", x.shape, x.dtype, x.device)).view(-1)
    m = torch.floor(u, out=_SCRATCH.get("m", u.shape, x.dtype, x.device))
    powers = _SCRATCH.get("powers", (k1, n), x.dtype, x.device)  # rows 1, t, .., t^k (pow() is ~10x slower)
    powers[0] = 1
    t = torch.sub(u, m, out=powers[1])  # (batch * in,) in [0, 1); NaN for non-finite x
    # A non-finite u has t = NaN: it goes to an interval where all k + 1 bases exist, so its NaN values
    # reach the features (as in the reference) instead of an out-of-range index.
    inner = float(k1)
    mi = torch.nan_to_num_(m.add_(1), nan=inner, posinf=inner, neginf=inner).clamp_(0, grid.cols.shape[0] - 1)
    mi = _SCRATCH.get("mi", u.shape, torch.int64, x.device).copy_(mi)  # whole numbers >= 0: exact
    table = grid.cols
    if flat:
        n_int = grid.cols.shape[0]
        table = flat_tables(grid.grid_size, grid.spline_order, x.shape[1], x.device)
        mi.view(x.shape).add_(torch.arange(0, x.shape[1] * n_int, n_int, device=x.device))
    col = torch.index_select(table, 0, mi,
                             out=_SCRATCH.get("col", (n, k1), torch.int64, x.device))  # (batch * in, k + 1)
    for q in range(2, k1):
        torch.mul(powers[q - 1], t, out=powers[q])
    return col, powers


def _poly_t(spline_order: int, dtype: torch.dtype, device, derivative: bool) -> torch.Tensor:
    """``(k + 1, k + 1)``, contiguous: ``values = this @ powers`` (or d/du with ``derivative``), from
    :func:`local_poly`, cast and moved once per (dtype, device): a host-to-device copy of pageable memory
    at every layer call would synchronise the CUDA stream."""
    key = (spline_order, dtype, str(device), derivative)
    if key not in _POLYS:
        k1 = spline_order + 1
        poly = local_poly(spline_order)
        _POLYS[key] = (poly[:, k1:] if derivative else poly[:, :k1]).t().contiguous().to(device=device, dtype=dtype)
    return _POLYS[key]


def _values(powers: torch.Tensor, grid: UniformGrid) -> torch.Tensor:
    """``(batch * in, k + 1)`` basis values at the local columns from :func:`_local`'s powers (scratch)."""
    vals_t = torch.mm(_poly_t(grid.spline_order, powers.dtype, powers.device, False), powers,
                      out=_SCRATCH.get("vals_t", powers.shape, powers.dtype, powers.device))  # (k + 1, batch * in)
    vals = _SCRATCH.get("vals", powers.shape[::-1], powers.dtype, powers.device)
    vals.t().copy_(vals_t)  # ~3x faster than vals_t.t().contiguous(), which reads strided
    return vals


def _d_du(picked: torch.Tensor, powers: torch.Tensor, grid: UniformGrid) -> torch.Tensor:
    """``(batch * in,)`` d loss / du from ``picked: (batch * in, k + 1)``, d loss / d the k + 1 local basis
    values: ``sum_r picked_r dvals_r = sum_q t^q (Md^T picked)_q``, Md the derivative's polynomial (scratch)."""
    z = torch.mm(_poly_t(grid.spline_order, powers.dtype, powers.device, True).t(), picked.t(),
                 out=_SCRATCH.get("z", powers.shape, powers.dtype, powers.device))  # (k + 1, batch * in)
    return torch.sum(z.mul_(powers), 0, out=_SCRATCH.get("g_u", (z.shape[1],), powers.dtype, powers.device))


def _knot_local(x: torch.Tensor, grid: KnotGrid, flat: bool = False, derivative: bool = False):
    """Columns, values and d/dx of the k + 1 nonzero bases of each ``x: (batch, in)`` on non-uniform knots.

    Returns ``(col, vals, dvals)``, each ``(batch * in, k + 1)``: col the feature column of local value r as
    :func:`_local`'s (or, with ``flat``, the index of :func:`flat_tables`' layout), vals the basis values and
    dvals their derivatives in x (``None`` without ``derivative``). The interval ``t_m <= x < t_{m+1}`` comes
    from ``searchsorted``; local value r is basis ``m - k + r``, by de Boor's triangular recursion on the 2k
    knots ``t_{m-k+1} .. t_{m+k}`` (Cox-de Boor restricted to the bases nonzero at x). Non-finite x gives NaN
    values at valid columns (the reference gives NaN there too), never an out-of-range index.
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


def _local_basis(x: torch.Tensor, grid, flat: bool = False, derivative: bool = False):
    """``(col, vals, dstate)`` of the k + 1 nonzero bases of each ``x: (batch, in)`` on either kind of grid:
    col and vals ``(batch * in, k + 1)`` as :func:`_local` and :func:`_values` give them; ``dstate`` what
    :func:`_spline_grad_x` needs (the powers of t on a uniform grid, d/dx of the values on other knots)."""
    if isinstance(grid, KnotGrid):
        return _knot_local(x, grid, flat, derivative)
    col, powers = _local(x, grid, flat)
    return col, _values(powers, grid), powers


def _spline_grad_x(g_silu: torch.Tensor, picked: torch.Tensor, dstate, grid, x: torch.Tensor) -> torch.Tensor:
    """``(batch, in)`` d loss / dx: ``g_silu`` (the base branch's) plus the spline branch's, from ``picked:
    (batch * in, k + 1)``, d loss / d the k + 1 local basis values, and :func:`_local_basis`' ``dstate``."""
    if isinstance(grid, KnotGrid):
        return g_silu + torch.linalg.vecdot(picked, dstate).view_as(x)
    return torch.addcmul(g_silu, _d_du(picked, dstate, grid).view_as(x), grid.inv_h)  # du/dx = inv_h


def features(x: torch.Tensor, grid, local=None, scratch: bool = False) -> torch.Tensor:
    """``(batch, in, 1 + C)`` features ``[silu(x_i), B_0(x_i) .. B_{C-1}(x_i)]`` from the k + 1 local values.

    x: ``(batch, in)``; grid: a :class:`UniformGrid` (closed form) or :class:`KnotGrid`. Equal to
    :func:`kanlib.bspline.bspline_basis` (with silu in front) on the same knots. ``local``: :func:`_local_basis`'
    result when the caller already has it; ``scratch``: write into a reused buffer (the caller must drop the
    result before the next kernel call).
    """
    batch, n_in = x.shape
    col, vals, _ = local if local is not None else _local_basis(x, grid)
    shape = (batch * n_in, 1 + grid.n_coeff)
    feats = _SCRATCH.get("feats", shape, x.dtype, x.device).zero_() if scratch else x.new_zeros(shape)
    feats.scatter_(1, col, vals)  # bases that do not exist land in column 0 (contiguous operands: ~2x faster) ...
    feats = feats.view(batch, n_in, 1 + grid.n_coeff)
    # ... which silu(x) overwrites (silu into a strided out is ~5x slower than into a buffer and a copy)
    feats[..., 0] = torch.ops.aten.silu.out(x, out=_SCRATCH.get("silu", x.shape, x.dtype, x.device))
    return feats


def basis(x: torch.Tensor, grid) -> torch.Tensor:
    """``(..., in, C)``: the B-spline basis of ``x: (..., in)`` by the eager kernels (production path).

    Same values as :func:`kanlib.bspline.bspline_basis` on the knots ``grid`` (a :class:`UniformGrid` or
    :class:`KnotGrid`) was built from.
    """
    lead = x.shape[:-1]
    feats = features(x.reshape(-1, x.shape[-1]), grid.like(x))
    return feats[..., 1:].reshape(*lead, x.shape[-1], grid.n_coeff)


def _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major: bool) -> torch.Tensor:
    """``(out, in * (1 + C))``: base weight and scaled spline coefficients side by side, for one GEMM.

    Column layout ``(in, 1 + C)`` (input-major, matching :func:`features`) or, with
    ``coeff_major``, ``(1 + C, in)`` (matching the compiled kernels).
    """
    n_out, n_in, n_coeff = spline_weight.shape
    if coeff_major:
        w = spline_weight.new_empty(n_out, 1 + n_coeff, n_in)
        w[:, 0] = base_weight
        dst = w[:, 1:].transpose(1, 2)  # (out, in, C) view
    else:
        w = spline_weight.new_empty(n_out, n_in, 1 + n_coeff)
        w[..., 0] = base_weight
        dst = w[..., 1:]
    if spline_scaler is None:
        dst.copy_(spline_weight)
    else:  # coefficient-leading views: broadcasting the scaler over an innermost dim of C is ~2x slower
        torch.mul(spline_weight.permute(2, 0, 1), spline_scaler, out=dst.permute(2, 0, 1))
    return w.view(n_out, -1)


def _param_grads(gw, spline_weight, spline_scaler, needs):
    """Gradients of (base, spline, scaler) from ``gw: (out, in, 1 + C)``, the fused weight's gradient
    (which may be a scratch buffer: every returned gradient is a new tensor)."""
    grad_base = gw[..., 0].contiguous() if needs[0] else None
    g_scaled = gw[..., 1:]  # (out, in, C): gradient of the scaled coefficients
    n_coeff = g_scaled.shape[-1]
    if spline_scaler is None:
        return grad_base, (g_scaled.contiguous() if needs[1] else None), None
    grad_spline = torch.mul(g_scaled, spline_scaler.unsqueeze(-1)) if needs[1] else None
    grad_scaler = None
    if needs[2]:  # (out, in): sums of C products as a matrix-vector product, ~1.3x faster than vecdot
        prod = torch.mul(g_scaled, spline_weight,
                         out=_SCRATCH.get("prod", spline_weight.shape, gw.dtype, gw.device)).view(-1, n_coeff)
        grad_scaler = torch.mv(prod, prod.new_ones(n_coeff)).view(spline_scaler.shape)
    return grad_base, grad_spline, grad_scaler


class _EagerKAN(torch.autograd.Function):
    """Exact KAN layer on a uniform grid, eager: ``y = features(x) @ fused_weight^T`` in one GEMM.

    Saves x and the fused ``(out, in * (1 + C))`` weight; backward rebuilds the features (k + 1 nonzeros
    per input) for the weight gradient and gathers d loss / d features at those k + 1 columns for d/dx.
    Every temporary lives in a reused scratch buffer: fresh ones cost ~2000 page faults per training step
    of [64,256,256,1] at batch 512 here, ~270 with the buffers (the saved weight, the returned gradients).
    """

    @staticmethod
    def forward(ctx, x, base_weight, spline_weight, spline_scaler, grid: UniformGrid, gemm_dtype, paths):
        paths.add("fast")
        w = _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major=False).to(gemm_dtype)
        feats = features(x, grid, scratch=True)  # (batch, in, 1 + C), dropped after the GEMM
        y = feats.view(x.shape[0], -1).to(gemm_dtype) @ w.t()  # (batch, out)
        ctx.save_for_backward(x, w, spline_weight, spline_scaler)
        ctx.grid, ctx.gemm_dtype, ctx.paths = grid, gemm_dtype, paths
        return y

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_y):
        x, w, spline_weight, spline_scaler = ctx.saved_tensors
        grid, gdt = ctx.grid, ctx.gemm_dtype
        ctx.paths.add("fast")
        n_out, n_in, n_coeff = spline_weight.shape
        grad_y = grad_y.to(gdt)  # (batch, out)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1:4]
        local = _local_basis(x, grid, derivative=need_x)
        col, _, dstate = local
        grad_x = grad_base = grad_spline = grad_scaler = None
        if need_x:
            gf = torch.mm(grad_y, w, out=_SCRATCH.get("gf", (x.shape[0], w.shape[1]), gdt, x.device))
            gf = gf.to(x.dtype).view(-1, 1 + n_coeff)  # (batch * in, 1 + C)
            # contiguous first: silu_backward on the strided column is ~5x slower
            g_silu = _SCRATCH.get("g_silu", x.shape, x.dtype, x.device)
            torch.ops.aten.silu_backward.grad_input(
                _SCRATCH.get("g_silu_in", x.shape, x.dtype, x.device).copy_(gf[:, 0].view_as(x)), x,
                grad_input=g_silu)  # (batch, in)
            gf[:, 0] = 0  # bases that do not exist point at column 0: they must gather 0
            picked = torch.gather(gf, 1, col, out=_SCRATCH.get("picked", col.shape, x.dtype, x.device))
            grad_x = _spline_grad_x(g_silu, picked, dstate, grid, x)
        if any(need_w):
            feats = features(x, grid, local, scratch=True).view(x.shape[0], -1).to(gdt)
            gw = torch.mm(grad_y.t(), feats, out=_SCRATCH.get("gw", (n_out, feats.shape[1]), gdt, x.device))
            grad_base, grad_spline, grad_scaler = _param_grads(
                gw.to(spline_weight.dtype).view(n_out, n_in, 1 + n_coeff), spline_weight, spline_scaler, need_w)
        return grad_x, grad_base, grad_spline, grad_scaler, None, None, None


class _EagerSmallOutKAN(torch.autograd.Function):
    """Exact KAN layer with at most ``SMALL_OUT`` outputs on a uniform grid, eager, without features.

    Its GEMMs would be matrix-vector products bound by writing and reading the ``(batch, in, 1 + C)``
    features twice a step; instead each output gathers its k + 1 scaled coefficients per input (indices
    of :func:`flat_tables`, a sink slot of weight 0 for bases that do not exist) and takes a dot product
    with the basis values, and backward scatter-adds the coefficient gradients. Same function and
    gradients as :class:`_EagerKAN`; saves x and the parameters.
    """

    @staticmethod
    def _coeffs(spline_weight, spline_scaler):
        """``(out, in * C + 1)``: scaled spline coefficients, flattened, and a trailing 0 (the sink)."""
        n_out = spline_weight.shape[0]
        ws = spline_weight.new_zeros(n_out, spline_weight[0].numel() + 1)
        dst = ws[:, :-1].view_as(spline_weight)
        if spline_scaler is None:
            dst.copy_(spline_weight)
        else:
            torch.mul(spline_weight.permute(2, 0, 1), spline_scaler, out=dst.permute(2, 0, 1))
        return ws

    @staticmethod
    def forward(ctx, x, base_weight, spline_weight, spline_scaler, grid: UniformGrid, gemm_dtype, paths):
        paths.add("fast")
        batch = x.shape[0]
        col, vals, _ = _local_basis(x, grid, flat=True)
        vals = vals.view(batch, -1)  # (batch, in * (k + 1))
        ws = _EagerSmallOutKAN._coeffs(spline_weight, spline_scaler)
        silu = torch.ops.aten.silu.out(x, out=_SCRATCH.get("silu", x.shape, x.dtype, x.device))
        y = silu @ base_weight.t()  # (batch, out)
        g = _SCRATCH.get("coef", col.shape, x.dtype, x.device).view(batch, -1)
        for o in range(y.shape[1]):  # at most SMALL_OUT
            torch.index_select(ws[o], 0, col.view(-1), out=g.view(-1))
            y[:, o] += torch.linalg.vecdot(g, vals)
        ctx.save_for_backward(x, base_weight, spline_weight, spline_scaler, ws)
        ctx.grid, ctx.paths = grid, paths
        return y.to(gemm_dtype)

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_y):
        x, base_weight, spline_weight, spline_scaler, ws = ctx.saved_tensors
        grid = ctx.grid
        ctx.paths.add("fast")
        n_out, n_in, n_coeff = spline_weight.shape
        batch = x.shape[0]
        grad_y = grad_y.to(x.dtype)  # (batch, out)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1:4]
        col, vals, dstate = _local_basis(x, grid, flat=True, derivative=need_x)
        vals = vals.view(batch, -1)  # (batch, in * (k + 1))
        grad_x = grad_base = grad_spline = grad_scaler = None
        if need_x:
            g = _SCRATCH.get("coef", col.shape, x.dtype, x.device).view(batch, -1)
            picked = _SCRATCH.get("picked", col.shape, x.dtype, x.device).view(batch, -1).zero_()
            for o in range(n_out):  # d loss / d local basis values: sum_o grad_y_o * coefficient_o
                torch.index_select(ws[o], 0, col.view(-1), out=g.view(-1))
                picked.addcmul_(g, grad_y[:, o:o + 1])
            g_silu = torch.ops.aten.silu_backward(grad_y @ base_weight, x)  # (batch, in)
            grad_x = _spline_grad_x(g_silu, picked.view_as(col), dstate, grid, x)
        if any(need_w):
            gw = spline_weight.new_empty(n_out, n_in, 1 + n_coeff)  # d loss / d fused weight, as _EagerKAN's
            gw[..., 0] = grad_y.t() @ torch.ops.aten.silu.out(x, out=_SCRATCH.get("silu", x.shape, x.dtype, x.device))
            src = _SCRATCH.get("src", col.shape, x.dtype, x.device).view(batch, -1)
            for o in range(n_out):
                acc = gw.new_zeros(n_in * n_coeff + 1)  # the last slot collects the sink's terms
                acc.scatter_add_(0, col.view(-1), torch.mul(vals, grad_y[:, o:o + 1], out=src).view(-1))
                gw[o, :, 1:] = acc[:-1].view(n_in, n_coeff)
            grad_base, grad_spline, grad_scaler = _param_grads(gw, spline_weight, spline_scaler, need_w)
        return grad_x, grad_base, grad_spline, grad_scaler, None, None, None


# -- compiled kernels: pointwise, coefficient-major (batch, 1 + C, in) ------------------------------
# Plain torch functions; torch.compile turns each into one fused loop. Called eagerly they compute the
# same values (slowly), which is what the fallback does when compilation fails mid-step.
def _cardinal(v: torch.Tensor, spec, derivative: bool) -> torch.Tensor:
    """The cardinal B-spline ``N(v)`` (or ``dN/dv``) elementwise, ``v = u - j`` for basis j.

    By the truncated powers of :func:`cardinal_terms`: no index, so a non-finite v cannot index out
    of range; it gives NaN (``s * 0`` below), which must reach the features.
    """
    half, terms = spec  # from cardinal_terms()
    k = round(2 * half) - 1
    d = v - half
    s = d.abs()
    out = s * 0.0
    for o, c in terms:
        p = (o - s).clamp_min(0.0)  # (o - s)_+
        if derivative:
            # k = 1: the derivative of (o - s)_+ is the step [s < o]; pow(0, 0) would give 1 at s >= o
            q = torch.where(s < o, 1.0, 0.0) if k == 1 else p ** (k - 1)
            out = out + (-k * c) * q
        else:
            out = out + c * p ** k
    if derivative:
        out = torch.where(d < 0, -out, out)  # dN/dv = sign(v - half) dN/ds, right-continuous at the centre
    return out


def _offsets(x, shift, inv_h, n_coeff: int):
    """``(batch, C, in)``: ``u - j`` for every basis j."""
    u = torch.addcmul(shift, x, inv_h).unsqueeze(1)  # (batch, 1, in)
    return u - torch.arange(n_coeff, device=x.device, dtype=x.dtype).unsqueeze(-1)


def _pointwise_features(x, shift, inv_h, n_coeff: int, terms):
    """``(batch, 1 + C, in)`` features ``[silu(x), B_0(x) .. B_{C-1}(x)]``, coefficient-major so the
    innermost loop runs over the inputs and vectorises."""
    return torch.cat([F.silu(x).unsqueeze(1), _cardinal(_offsets(x, shift, inv_h, n_coeff), terms, False)], 1)


def _silu_grad(x):
    """d silu / dx, elementwise."""
    sig = torch.sigmoid(x)
    return sig * (1 + x * (1 - sig))


def _pointwise_grad_x(gf, x, shift, inv_h, n_coeff: int, terms):
    """``(batch, in)`` d loss / dx from ``gf = d loss / d features: (batch, 1 + C, in)``."""
    g_u = (gf[:, 1:] * _cardinal(_offsets(x, shift, inv_h, n_coeff), terms, True)).sum(1)  # d loss / du
    return gf[:, 0] * _silu_grad(x) + g_u * inv_h


def _pointwise_features_and_grad_x(gf, x, shift, inv_h, n_coeff: int, terms):
    """:func:`_pointwise_features` and :func:`_pointwise_grad_x` in one fused pass."""
    return (_pointwise_features(x, shift, inv_h, n_coeff, terms),
            _pointwise_grad_x(gf, x, shift, inv_h, n_coeff, terms))


def _base_grad(gw):
    """``(out, in)`` gradient of base_weight from ``gw: (out, 1 + C, in)``, cloned with the parameter's strides, not
    made ``.contiguous()``: for one output, ``gw[:, 0]`` counts as contiguous with strides ``((1 + C) * in, 1)``, and
    DDP copied it into its bucket with a warning ("Grad strides do not match bucket view strides") every run."""
    return gw[:, 0].clone(memory_format=torch.contiguous_format)


def _weight_grads(gw, spline_weight, spline_scaler):
    """``(out, in)``, ``(out, in, C)``, ``(out, in)`` gradients of base, spline and scaler from the
    coefficient-major fused weight's gradient ``gw: (out, 1 + C, in)``, contiguous in the parameters'
    layout (strided gradients would make gradient accumulation slow)."""
    g_scaled = gw[:, 1:].transpose(1, 2)  # (out, in, C)
    return (_base_grad(gw), (g_scaled * spline_scaler.unsqueeze(-1)).contiguous(),
            (g_scaled * spline_weight).sum(-1))


def _small_out_forward(x, shift, inv_h, n_coeff: int, terms, w3):
    """``(batch, out)`` for a layer with few outputs; w3: ``(out, 1 + C, in)``. The GEMM would be a
    matrix-vector product bound by writing and reading the features; fused, they never exist."""
    f = _pointwise_features(x, shift, inv_h, n_coeff, terms)  # (batch, 1 + C, in), fused away
    return (f.unsqueeze(1) * w3).sum((2, 3))


def _small_out_grads(f, grad_x_of, g, w3, spline_weight, spline_scaler, need_x: bool):
    """The few-output backward from the features ``f: (batch, 1 + C, in)`` (fused away) and ``grad_x_of(gf)``,
    d loss / dx from d loss / d features: ``(grad_x or None, grad_base, grad_spline, grad_scaler or None)``."""
    gw = (g[:, :, None, None] * f.unsqueeze(1)).sum(0)  # (out, 1 + C, in): d loss / d fused weight
    grad_x = None
    if need_x:
        grad_x = grad_x_of((g[:, :, None, None] * w3).sum(1))  # gf: (batch, 1 + C, in), fused away
    if spline_scaler is None:
        return grad_x, _base_grad(gw), gw[:, 1:].transpose(1, 2).contiguous(), None
    return (grad_x, *_weight_grads(gw, spline_weight, spline_scaler))


def _small_out_backward(g, w3, x, shift, inv_h, n_coeff: int, terms, spline_weight, spline_scaler, need_x: bool):
    """Backward of a few-output layer in one fused pass: ``(grad_x or None, grad_base, grad_spline,
    grad_scaler or None)`` from ``g = d loss / d y: (batch, out)``; features never materialised."""
    return _small_out_grads(_pointwise_features(x, shift, inv_h, n_coeff, terms),
                            lambda gf: _pointwise_grad_x(gf, x, shift, inv_h, n_coeff, terms),
                            g, w3, spline_weight, spline_scaler, need_x)


# -- compiled kernels on non-uniform knots (KnotGrid): the same kernels, another basis ---------------
# Separate functions, not a switch inside the ones above: dynamo's recompile limit counts per function, and
# a recipe run meets three grid sizes at two batch shapes on these alone.
def _knot_basis(x, knots_t, inv, n_coeff: int, k: int, derivative: bool):
    """``(batch, C, in)``: ``B_j(x_i)`` (or ``dB_j/dx``) for every basis j, coefficient-major.

    Cox-de Boor's recursion on the k + 2 knots ``t_j .. t_{j+k+1}`` of basis j's support: k + 1 interval
    indicators from k + 2 comparisons, then ``k (k + 1) / 2`` blends, each a few elementwise operations on knot
    rows sliced from the parameter-sized ``knots_t: (n, in)`` and ``inv: (k, n, in)`` (no index depends on x, so
    inductor fuses it all into one loop). ``dB_j/dx = k (B^{k-1}_j inv_k[j] - B^{k-1}_{j+1} inv_k[j+1])``. A non-finite x
    gives NaN (``(x - t) * 0``), as the reference does.
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


def _knot_features(x, knots_t, inv, n_coeff: int, k: int):
    """``(batch, 1 + C, in)`` features ``[silu(x), B_0(x) .. B_{C-1}(x)]`` on non-uniform knots."""
    return torch.cat([F.silu(x).unsqueeze(1), _knot_basis(x, knots_t, inv, n_coeff, k, False)], 1)


def _knot_grad_x(gf, x, knots_t, inv, n_coeff: int, k: int):
    """``(batch, in)`` d loss / dx from ``gf = d loss / d features: (batch, 1 + C, in)``, non-uniform knots."""
    return gf[:, 0] * _silu_grad(x) + (gf[:, 1:] * _knot_basis(x, knots_t, inv, n_coeff, k, True)).sum(1)


def _knot_features_and_grad_x(gf, x, knots_t, inv, n_coeff: int, k: int):
    """:func:`_knot_features` and :func:`_knot_grad_x` in one fused pass."""
    return _knot_features(x, knots_t, inv, n_coeff, k), _knot_grad_x(gf, x, knots_t, inv, n_coeff, k)


def _knot_small_out_forward(x, knots_t, inv, n_coeff: int, k: int, w3):
    """:func:`_small_out_forward` on non-uniform knots."""
    return (_knot_features(x, knots_t, inv, n_coeff, k).unsqueeze(1) * w3).sum((2, 3))


def _knot_small_out_backward(g, w3, x, knots_t, inv, n_coeff: int, k: int, spline_weight, spline_scaler,
                             need_x: bool):
    """:func:`_small_out_backward` on non-uniform knots."""
    return _small_out_grads(_knot_features(x, knots_t, inv, n_coeff, k),
                            lambda gf: _knot_grad_x(gf, x, knots_t, inv, n_coeff, k),
                            g, w3, spline_weight, spline_scaler, need_x)


class _Kernels(NamedTuple):
    """The compiled kernels of one kind of grid (all take ``x`` and then the grid's ``kernel_args()``)."""

    features: object
    features_and_grad_x: object
    small_out_forward: object
    small_out_backward: object


_KERNELS = {
    "UniformGrid": _Kernels(_pointwise_features, _pointwise_features_and_grad_x, _small_out_forward,
                            _small_out_backward),
    "KnotGrid": _Kernels(_knot_features, _knot_features_and_grad_x, _knot_small_out_forward,
                         _knot_small_out_backward),
}


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run a kernel here (recorded per device type; the layer runs eagerly)."""


_COMPILED: dict = {}  # kernel -> its torch.compile wrapper (one per kernel: dynamo caches per shape/device)
_BROKEN: dict = {}  # device type -> why torch.compile failed there; that device's kernels run eagerly
_WARNED: set = set()


def compile_failure(device_type: str) -> str | None:
    """Why torch.compile failed on ``device_type`` in this process, or ``None`` if it has not failed."""
    return _BROKEN.get(device_type)


def _warn_once(key, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _alias_without_spaces(target: str, kind: str) -> str | None:
    """A whitespace-free symbolic link to ``target`` in a private folder of the temporary directory (made
    atomically, so that the ranks of a launch may race), or None where that folder's own path has whitespace."""
    import hashlib
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"kanlib-paths-{os.getuid() if hasattr(os, 'getuid') else 0}")
    if any(c.isspace() for c in base):
        return None
    link = os.path.join(base, f"{kind}-{hashlib.sha1(target.encode()).hexdigest()[:12]}")
    if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(target):
        return link
    os.makedirs(base, mode=0o700, exist_ok=True)
    tmp = f"{link}.{os.getpid()}.{threading.get_ident()}"
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return link


def compile_paths_without_spaces() -> dict:
    """Let inductor's C++ builds run where a path it passes to the compiler has whitespace.

    torch (2.13) writes the CPU compiler's command line as one string and splits it on whitespace, its own
    include and library folders and the output file unquoted: with torch installed under a folder whose path
    has a space (a checkout in ``~/My Projects``, a virtual environment inside it) or an inductor cache folder
    with one, every CPU compile fails ("C++ compile error") and the KAN layers run the eager fast path; a
    default study in such a clone ran every run on ``fast``. This points inductor at whitespace-free symbolic
    links to those folders (``<tmp>/kanlib-paths-<uid>/``; same files, same cache). Returns what it aliased
    (``{"torch": link, "cache": link}``, empty where nothing had whitespace); idempotent; a failure leaves
    things as they were, for the first compile to report."""
    done = {}
    try:
        import torch.utils.cpp_extension as cpp_extension
        from torch._inductor import cpp_builder
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        torch_dir = getattr(cpp_extension, "_TORCH_PATH", "")
        if any(c.isspace() for c in torch_dir):
            link = _alias_without_spaces(torch_dir, "torch")
            if link:
                cpp_extension._TORCH_PATH = link
                cpp_extension.TORCH_LIB_PATH = os.path.join(link, "lib")
                if hasattr(cpp_builder, "_TORCH_PATH"):
                    cpp_builder._TORCH_PATH = link
                    cpp_builder._LINKER_SCRIPT = os.path.join(link, "_inductor", "script.ld")
                done["torch"] = link
        cache = cache_dir()  # creates it, and fixes TORCHINDUCTOR_CACHE_DIR to its absolute path
        if any(c.isspace() for c in cache):
            link = _alias_without_spaces(cache, "inductor-cache")
            if link:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = link
                done["cache"] = link
    except Exception:  # noqa: BLE001 - the first compile reports the real problem
        pass
    return done


_PREPARING: dict = {}


def prepare_compile(device_type: str = "cpu", background: bool = True) -> None:
    """Pay torch.compile's per-process set-up now, in a background thread by default.

    Every fresh process that compiles (even with a warm inductor cache) first imports inductor
    (~0.9 s here) and, for CPU kernels, probes the vector ISAs by compiling and loading small
    libraries in subprocesses (~1.3 s here, mostly waiting). A launcher that calls this at start-up
    overlaps that with its rendezvous and data loading, so that the first compiled step only traces
    and loads cached kernels. Idempotent; errors are left for the first real compile to report.
    Call it before forking worker processes, not while they start.
    """
    if device_type in _PREPARING:
        return

    def work():
        try:
            import torch._inductor.compile_fx  # noqa: F401
            compile_paths_without_spaces()
            if device_type == "cpu":
                remember_isa_probes()
                from torch._inductor.cpu_vec_isa import pick_vec_isa

                pick_vec_isa()
        except Exception:  # noqa: BLE001 - the first compile reports the real problem
            pass

    if background:
        thread = threading.Thread(target=work, name="kanlib-prepare-compile", daemon=True)
        _PREPARING[device_type] = thread
        thread.start()
    else:
        _PREPARING[device_type] = None
        work()


def wait_prepared() -> None:
    """Wait for :func:`prepare_compile`'s background imports to end.

    Call it before this thread imports torch._dynamo or torch._inductor itself: two threads importing
    the same circle of modules at once deadlock on Python's module locks (``_DeadlockError``), which is
    what a run did when it read dynamo's compile time while the thread was still importing inductor.
    """
    for thread in list(_PREPARING.values()):
        if thread is not None and thread is not threading.current_thread():
            thread.join()


ISA_PROBES_NAME = "kanlib-vec-isa-probes.json"


def remember_isa_probes() -> None:
    """Make inductor's CPU vector-ISA probe a one-time cost per host, not per process.

    Before its first CPU kernel every process checks each vector ISA the CPU has (AVX-512, AVX2) by
    building a tiny library (cached on disk) and then loading it in a child Python, one child per ISA:
    about 1.3 s here, paid by every run of a sweep. This wraps that load probe so that a success is
    remembered in ``<inductor cache dir>/kanlib-vec-isa-probes.json``, keyed by host, torch, Python and
    the library's path (which encodes the ISA flags and the compiler), and later processes of the same
    key skip the child. A failure is never remembered (it is probed again), inductor's settings and
    therefore its cache keys are unchanged, and where torch has no such probe this does nothing.
    """
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return
    original = getattr(cpu_vec_isa.VecISA, "_probe_load", None)
    if original is None or getattr(original, "kanlib_remembers", False):
        return
    store = os.path.join(cache_dir(), ISA_PROBES_NAME)
    prefix = f"{socket.gethostname()}|{torch.__version__}|{sys.executable}|"

    def probe_load(self, output_path: str) -> bool:
        key = prefix + output_path
        try:
            with open(store) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}
        if known.get(key) is True and os.path.isfile(output_path):
            return True
        ok = original(self, output_path)
        if ok:
            known[key] = True
            tmp = f"{store}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                os.makedirs(os.path.dirname(store), exist_ok=True)
                with open(tmp, "w") as f:
                    json.dump(known, f)
                os.replace(tmp, store)  # concurrent writers: the last wins, a lost key is probed again
            except OSError:
                pass
        return ok

    probe_load.kanlib_remembers = True
    cpu_vec_isa.VecISA._probe_load = probe_load


def _run_compiled(fn, *args):
    """``torch.compile(fn)(*args)``; raises :class:`CompileUnavailable` where it cannot run.

    A compile error (no C++ compiler, unsupported platform, inductor bug) marks the device type broken
    for the rest of the process, with one warning. Past dynamo's recompile limit (each kernel compiles
    once per shape, static shapes: about 8% faster than dynamic ones here) only that call runs eagerly.
    """
    device_type = next(a for a in args if isinstance(a, torch.Tensor)).device.type
    if device_type in _BROKEN:
        raise CompileUnavailable(_BROKEN[device_type])
    try:
        if fn not in _COMPILED:
            compile_paths_without_spaces()
            if device_type == "cpu":
                remember_isa_probes()
            # fullgraph: a graph break would leave part of the kernel eager without telling anyone, and
            # it makes the recompile limit raise instead of silently running eagerly.
            _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
        return _outside_ddp(_COMPILED[fn], args)
    except Exception as e:  # noqa: BLE001 - any failure of the compiler means "run eagerly"
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
        if type(e).__name__ == "FailOnRecompileLimitHit":
            _warn_once(("limit", fn.__name__), f"kanlib: torch.compile recompile limit reached for "
                       f"{fn.__name__}; new shapes of it run eagerly (raise torch._dynamo.config.recompile_limit)")
            raise CompileUnavailable(reason) from e
        _BROKEN[device_type] = reason
        _warn_once(device_type, f"kanlib: torch.compile unavailable on {device_type} ({reason}); "
                   f"KAN layers there run the eager fast path")
        raise CompileUnavailable(reason) from e


def _outside_ddp(compiled, args):
    """``compiled(*args)`` with no DDP module marked active.

    Inside a DDP forward dynamo hands every frame it compiles to its DDPOptimizer, which splits a model's graph
    at DDP's bucket boundaries and refuses a bucket cap below DDP's first bucket (1 MiB): a kernel first
    compiled in a run with ``bucket_cap_mb=0.01`` failed ("First bucket should be smaller/equal to other
    buckets"), and compiling stayed off for every later run of that worker group. These kernels hold no
    parameters, so there is nothing to split; DDP's own marker is restored at once (a class attribute)."""
    active = getattr(DDP, "_active_ddp_module", None)
    if active is None:
        return compiled(*args)
    DDP._active_ddp_module = None
    try:
        return compiled(*args)
    finally:
        DDP._active_ddp_module = active


def _call(paths: set, fn, *args):
    """``fn(*args)`` compiled where possible, else eagerly (same values); records which one ran."""
    try:
        out = _run_compiled(fn, *args)
        paths.add("compiled")
        return out
    except CompileUnavailable:
        paths.add("fast")
        return fn(*args)


class _CompiledKAN(torch.autograd.Function):
    """Exact KAN layer on a uniform grid with torch.compile'd pointwise kernels, coefficient-major.

    Same function and saved tensors as :class:`_EagerKAN`. Layers of at most ``SMALL_OUT`` outputs use
    the fused matrix-vector kernels; wider ones build the features pointwise for one ATen GEMM.
    """

    @staticmethod
    def forward(ctx, x, base_weight, spline_weight, spline_scaler, grid, gemm_dtype, paths):
        n_out, n_in, n_coeff = spline_weight.shape
        kernels = _KERNELS[type(grid).__name__]
        w = _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major=True)  # (out, (1 + C) * in)
        if n_out <= SMALL_OUT:
            # computed in x's dtype; cast to what the GEMM would return under autocast
            y = _run_compiled(kernels.small_out_forward, x, *grid.kernel_args(), w.view(n_out, -1, n_in)).to(gemm_dtype)
        else:
            w = w.to(gemm_dtype)
            feats = _run_compiled(kernels.features, x, *grid.kernel_args())
            y = feats.view(x.shape[0], -1).to(gemm_dtype) @ w.t()  # (batch, out)
        paths.add("compiled")
        ctx.save_for_backward(x, w, spline_weight, spline_scaler)
        ctx.grid, ctx.gemm_dtype, ctx.paths, ctx.kernels = grid, gemm_dtype, paths, kernels
        return y

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises
    def backward(ctx, grad_y):
        x, w, spline_weight, spline_scaler = ctx.saved_tensors
        grid, gdt, paths, kernels = ctx.grid, ctx.gemm_dtype, ctx.paths, ctx.kernels
        n_out, n_in, n_coeff = spline_weight.shape
        consts = (x, *grid.kernel_args())
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1:4]
        grad_x = gw = feats = None
        if n_out <= SMALL_OUT:  # one fused kernel, features never materialised
            grads = _call(paths, kernels.small_out_backward, grad_y.to(x.dtype), w.view(n_out, -1, n_in), *consts,
                          spline_weight, spline_scaler, need_x)
            return (*grads, None, None, None)
        grad_y = grad_y.to(gdt)
        if need_x:
            gf = (grad_y @ w).to(x.dtype).view(-1, 1 + n_coeff, n_in)  # (batch, 1 + C, in)
            feats, grad_x = _call(paths, kernels.features_and_grad_x, gf, *consts)
        elif any(need_w):
            feats = _call(paths, kernels.features, *consts)
        if any(need_w):
            gw = (grad_y.t() @ feats.view(x.shape[0], -1).to(gdt)).to(spline_weight.dtype)
        if not any(need_w):
            return grad_x, None, None, None, None, None, None
        gw = gw.view(n_out, 1 + n_coeff, n_in)
        if spline_scaler is None:
            return grad_x, _base_grad(gw), gw[:, 1:].transpose(1, 2).contiguous(), None, None, None, None
        grad_base, grad_spline, grad_scaler = _call(paths, _weight_grads, gw, spline_weight, spline_scaler)
        return grad_x, grad_base, grad_spline, grad_scaler, None, None, None


def kan_linear(x: torch.Tensor, base_weight: torch.Tensor, spline_weight: torch.Tensor,
               spline_scaler: torch.Tensor | None, grid: UniformGrid | KnotGrid, mode: str, paths: set,
               gemm_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One exact KAN layer: ``(batch, in) -> (batch, out)``.

    x: ``(batch, in)`` in the compute dtype (float32 or float64); base_weight ``(out, in)``, spline_weight
    ``(out, in, C)``, spline_scaler ``(out, in)`` or ``None``, all in x's dtype; ``grid`` from
    :func:`uniform_grid` (the closed form) or :func:`knot_grid` (any strictly increasing knots), in x's dtype
    and device (``grid.like(x)``). ``mode``: ``"fast"`` (eager) or ``"compiled"``
    (falls back to ``"fast"`` where torch.compile cannot run). ``gemm_dtype``: the dtype of the GEMMs and
    of the output (an autocast dtype; default x's). The path that actually ran, in forward and later in
    backward, is added to ``paths`` (``"compiled"`` or ``"fast"``).
    """
    gemm_dtype = gemm_dtype or x.dtype
    args = (x, base_weight, spline_weight, spline_scaler, grid, gemm_dtype, paths)
    if mode == "compiled":
        try:
            return _CompiledKAN.apply(*args)
        except CompileUnavailable:
            pass  # nothing of the compiled forward ran; the eager one computes the same function
    elif mode != "fast":
        raise ValueError(f"mode: unknown value {mode!r}; choose 'fast' or 'compiled'")
    if spline_weight.shape[0] <= SMALL_OUT:
        return _EagerSmallOutKAN.apply(*args)
    return _EagerKAN.apply(*args)
