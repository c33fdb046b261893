"""Fast exact KAN kernels: the closed-form B-spline basis on uniform grids, the eager kernels and the
autograd functions of either kind of grid, and which one a layer runs.

One KAN layer computes ``y = [silu(x), B(x)] @ [W_base, W_spline * scale]^T`` with ``B`` the order-k
B-splines of each input on its knot vector. Only ``k + 1`` bases are nonzero at any x. On a *uniform* knot
vector their values are fixed polynomials of the position inside the knot interval, so the basis costs a few
elementwise operations instead of the Cox-de Boor recursion over all knots: :class:`UniformGrid` carries what
a kernel needs to know about such a grid, and :func:`uniform_grid` builds it from a knot tensor, or returns
``None`` when the knots are not uniform to within their dtype's rounding. Grid updates fit the knots to the
data, and then :class:`kanlib.knots.KnotGrid` (:func:`kanlib.knots.knot_grid`) carries them: the kernels run
Cox-de Boor's recursion on the few knots that matter (:mod:`kanlib.knots`), the reference
:func:`kanlib.bspline.bspline_basis` up to rounding. Only a grid whose knots are not strictly increasing
leaves the layer on the reference path.

Two modes, one code path each (:func:`kan_linear` picks):

- ``"fast"``: eager PyTorch. Features ``(batch, in, 1 + C)`` from the k + 1 local values by one scatter
  (:func:`features`), one GEMM with the fused weight; backward gathers d loss / d x at the k + 1
  nonzero bases. Layers of at most ``SMALL_OUT`` outputs gather their coefficients at those bases
  instead and never build the features. Temporaries live in reused scratch buffers.
- ``"compiled"``: the features and d/dx are written pointwise, coefficient-major ``(batch, 1 + C, in)``,
  by torch.compile'd kernels (no scatter, so inductor fuses them into one loop); layers with at most
  ``SMALL_OUT`` outputs never materialise the features. Where torch.compile cannot run (no C++ compiler,
  unsupported platform, compile error) the layer falls back to ``"fast"``, with one warning per process.

The compiled kernels are :mod:`kanlib.pointwise`'s; :mod:`kanlib.compiling` compiles them once per layer
shape, says why where it cannot, and pays torch.compile's per-process set-up early.

Both modes save only x and parameter-sized tensors for backward and rebuild the basis there, so a training
step keeps nothing of size ``batch * in * coeff`` alive between forward and backward. Non-finite inputs give
non-finite outputs and gradients on every path, never an exception (a NaN must reach the trainer's
``nan_policy``).
"""

from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from kanlib.bspline import local_bspline
from kanlib.compiling import CompileUnavailable, compiled_or_eager, run_compiled
from kanlib.knots import KnotGrid, check_grid_shape, knot_local
from kanlib.pointwise import KERNELS, base_grad, cardinal_terms, weight_grads

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


def uniform_grid(grid: torch.Tensor, spline_order: int, dtype: torch.dtype | None = None) -> UniformGrid | None:
    """The :class:`UniformGrid` of ``grid: (in, G + 2k + 1)``, or ``None`` if some row is not uniform.

    A row counts as uniform when every knot equals ``first + j * (last - first) / (n - 1)`` to within
    ``4 * eps(grid.dtype) * max|knot|``, i.e. when it is what a uniform grid rounded to the grid's own
    dtype looks like; anything more (a knot moved by 1e-5 of a cell in float32, a float32 grid cast to
    float64) would make the closed form differ from :func:`kanlib.bspline.bspline_basis` by more than
    rounding. ``dtype``: the dtype of ``shift``/``inv_h`` (default the grid's); computed in float64.
    """
    check_grid_shape(grid, spline_order)
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


def _local_basis(x: torch.Tensor, grid, flat: bool = False, derivative: bool = False):
    """``(col, vals, dstate)`` of the k + 1 nonzero bases of each ``x: (batch, in)`` on either kind of grid:
    col and vals ``(batch * in, k + 1)`` as :func:`_local` and :func:`_values` give them; ``dstate`` what
    :func:`_spline_grad_x` needs (the powers of t on a uniform grid, d/dx of the values on other knots)."""
    if isinstance(grid, KnotGrid):
        return knot_local(x, grid, flat, derivative)
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


class _CompiledKAN(torch.autograd.Function):
    """Exact KAN layer on a uniform grid with torch.compile'd pointwise kernels, coefficient-major.

    Same function and saved tensors as :class:`_EagerKAN`. Layers of at most ``SMALL_OUT`` outputs use
    the fused matrix-vector kernels; wider ones build the features pointwise for one ATen GEMM.
    """

    @staticmethod
    def forward(ctx, x, base_weight, spline_weight, spline_scaler, grid, gemm_dtype, paths):
        n_out, n_in, n_coeff = spline_weight.shape
        kernels = KERNELS[type(grid).__name__]
        w = _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major=True)  # (out, (1 + C) * in)
        if n_out <= SMALL_OUT:
            # computed in x's dtype; cast to what the GEMM would return under autocast
            y = run_compiled(kernels.small_out_forward, x, *grid.kernel_args(), w.view(n_out, -1, n_in)).to(gemm_dtype)
        else:
            w = w.to(gemm_dtype)
            feats = run_compiled(kernels.features, x, *grid.kernel_args())
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
            grads = compiled_or_eager(paths, kernels.small_out_backward, grad_y.to(x.dtype), w.view(n_out, -1, n_in),
                                      *consts, spline_weight, spline_scaler, need_x)
            return (*grads, None, None, None)
        grad_y = grad_y.to(gdt)
        if need_x:
            gf = (grad_y @ w).to(x.dtype).view(-1, 1 + n_coeff, n_in)  # (batch, 1 + C, in)
            feats, grad_x = compiled_or_eager(paths, kernels.features_and_grad_x, gf, *consts)
        elif any(need_w):
            feats = compiled_or_eager(paths, kernels.features, *consts)
        if any(need_w):
            gw = (grad_y.t() @ feats.view(x.shape[0], -1).to(gdt)).to(spline_weight.dtype)
        if not any(need_w):
            return grad_x, None, None, None, None, None, None
        gw = gw.view(n_out, 1 + n_coeff, n_in)
        if spline_scaler is None:
            return grad_x, base_grad(gw), gw[:, 1:].transpose(1, 2).contiguous(), None, None, None, None
        grad_base, grad_spline, grad_scaler = compiled_or_eager(paths, weight_grads, gw, spline_weight, spline_scaler)
        return grad_x, grad_base, grad_spline, grad_scaler, None, None, None


def kan_linear(x: torch.Tensor, base_weight: torch.Tensor, spline_weight: torch.Tensor,
               spline_scaler: torch.Tensor | None, grid: UniformGrid | KnotGrid, mode: str, paths: set,
               gemm_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One exact KAN layer: ``(batch, in) -> (batch, out)``.

    x: ``(batch, in)`` in the compute dtype (float32 or float64); base_weight ``(out, in)``, spline_weight
    ``(out, in, C)``, spline_scaler ``(out, in)`` or ``None``, all in x's dtype; ``grid`` from
    :func:`uniform_grid` (the closed form) or :func:`kanlib.knots.knot_grid` (any strictly increasing knots), in
    x's dtype and device (``grid.like(x)``). ``mode``: ``"fast"`` (eager) or ``"compiled"``
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
