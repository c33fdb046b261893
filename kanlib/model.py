"""KAN layers and models, and the MLP baseline. Pure ``nn.Module``, no I/O.

The one exception to "no torch.distributed" is :func:`update_grid_distributed` (at the end),
which imports it lazily: a grid update must see every rank's data to leave the ranks identical.

Layers: :class:`KANLinear` (exact B-spline; ``impl="reference"`` or ``"fast"``),
:class:`RBFKANLinear` (Gaussian RBFs), :class:`ChebyKANLinear` (Chebyshev polynomials);
stacks :class:`KAN`, :class:`RBFKAN`, :class:`ChebyKAN`; baseline :class:`MLP` and
:func:`matched_mlp`.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from kanlib.bspline import (bspline_basis, grid_uniform_params, local_bspline_poly, make_grid,
                            symmetric_bspline_pieces, uniform_bspline_tables)

KAN_IMPLS = ("reference", "fast")
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision inputs (bases are always computed in float32), else x's dtype."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The active autocast dtype on ``device_type``, or ``None`` when autocast is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def _fused_weight(base_weight: torch.Tensor, spline_weight: torch.Tensor,
                  spline_scaler: torch.Tensor | None, coeff_major: bool = False) -> torch.Tensor:
    """``(out, in * (1 + coeff))``: the base weight and the scaled spline coefficients side by side.

    Column layout ``(in, 1 + coeff)`` (per input: base, then its coefficients), matching
    :func:`_fast_features`; with ``coeff_major`` it is ``(1 + coeff, in)``, matching
    :func:`_pointwise_features`. Either way one GEMM gives base + spline.
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
    else:
        torch.mul(spline_weight, spline_scaler.unsqueeze(-1), out=dst)
    return w.view(n_out, -1)


def _horner(s: torch.Tensor, c) -> torch.Tensor:
    """``sum_p c[p] s^p`` for Python-float coefficients ``c`` (constants under torch.compile)."""
    if len(c) == 1:
        return torch.full_like(s, c[0])
    out = s * c[-1] + c[-2]
    for q in range(len(c) - 3, -1, -1):
        out = out * s + c[q]
    return out


def _symmetric_pieces(v: torch.Tensor, pieces, derivative: bool) -> torch.Tensor:
    """The cardinal B-spline ``N(v)`` (or ``dN/dv``) elementwise; ``v = u - j`` for basis j.

    No scatter, so torch.compile fuses it into one loop; the symmetric pieces in ``s = |v - c|``
    (:func:`kanlib.bspline.symmetric_bspline_pieces`) halve the polynomial work.
    """
    half, bounds, vals, dvals = pieces
    d = v - half
    s = d.abs()
    coeffs = dvals if derivative else vals
    out = torch.zeros_like(s)
    for q in reversed(range(len(bounds))):
        out = torch.where(s < bounds[q], _horner(s, coeffs[q]), out)
    if derivative:
        out = torch.where(d < 0, -out, out)
    return out


def _fast_features(x, shift, inv_h, cols, poly, with_grad: bool):
    """Features ``[silu(x_i), B_0(x_i) .. B_{C-1}(x_i)]`` per input from the k + 1 nonzero bases.

    x: ``(batch, in)``; shift, inv_h: ``(in,)`` with ``u = x * inv_h + shift`` the position in knot
    intervals from the first knot; cols: ``(G + 2k + 2, k + 1)`` from
    :func:`kanlib.bspline.uniform_bspline_tables`; poly: ``(k + 1, 2k + 2)`` from
    :func:`kanlib.bspline.local_bspline_poly`. Returns ``(feats, col, dvals)``: feats
    ``(batch, in, 1 + C)``; col ``(batch, in, k + 1)`` the column of each nonzero basis (0 for
    bases that do not exist); dvals ``(batch, in, k + 1)`` their d/du (only when ``with_grad``).
    """
    batch, n_in = x.shape
    k1 = poly.shape[0]
    n_coeff = cols.shape[0] - k1 - 1  # rows = G + 2k + 2 and C = G + k
    u = torch.addcmul(shift, x, inv_h)  # (batch, in)
    m = torch.floor(u)
    t = u - m  # fractional position in [0, 1)
    mi = (m + 1).clamp_(0, cols.shape[0] - 1).to(torch.int64).view(-1)  # (batch * in,) interval index
    col = cols.index_select(0, mi).view(batch, n_in, k1)  # (batch, in, k + 1)
    powers = [torch.ones_like(t), t]
    for _ in range(2, k1):
        powers.append(powers[-1] * t)
    pw = torch.stack(powers[:k1], 0).view(k1, -1)  # (k + 1, batch * in), contiguous rows
    vd = pw.t() @ (poly if with_grad else poly[:, :k1])  # (batch * in, k + 1 [+ k + 1])
    vd = vd.view(batch, n_in, -1)
    feats = x.new_zeros(batch, n_in, 1 + n_coeff)
    feats.scatter_(-1, col, vd[..., :k1])  # missing bases land in column 0 ...
    feats[..., 0] = F.silu(x)  # ... which silu(x) overwrites
    return feats, col, (vd[..., k1:] if with_grad else None)


def _pointwise_features(x, shift, inv_h, n_coeff: int, pieces):
    """``(batch, 1 + C, in)`` features ``[silu(x), B_0(x) .. B_{C-1}(x)]`` written pointwise (for compile).

    Coefficient-major, so the innermost loop runs over the inputs and vectorises.
    """
    u = torch.addcmul(shift, x, inv_h).unsqueeze(1)  # (batch, 1, in)
    v = u - torch.arange(n_coeff, device=x.device, dtype=x.dtype).unsqueeze(-1)  # (batch, C, in)
    return torch.cat([F.silu(x).unsqueeze(1), _symmetric_pieces(v, pieces, False)], dim=1)


def _pointwise_grad_x(gf, x, shift, inv_h, n_coeff: int, pieces):
    """``(batch, in)`` d loss / dx from ``gf = d loss / d features: (batch, 1 + C, in)`` (for compile)."""
    u = torch.addcmul(shift, x, inv_h).unsqueeze(1)
    v = u - torch.arange(n_coeff, device=x.device, dtype=x.dtype).unsqueeze(-1)  # (batch, C, in)
    g_u = (gf[:, 1:] * _symmetric_pieces(v, pieces, True)).sum(1)  # (batch, in): d loss / du
    sig = torch.sigmoid(x)
    return gf[:, 0] * (sig * (1 + x * (1 - sig))) + g_u * inv_h


def _pointwise_features_and_grad_x(gf, x, shift, inv_h, n_coeff: int, pieces):
    """Both :func:`_pointwise_features` and :func:`_pointwise_grad_x` in one fused pass (for compile)."""
    return (_pointwise_features(x, shift, inv_h, n_coeff, pieces),
            _pointwise_grad_x(gf, x, shift, inv_h, n_coeff, pieces))


def _weight_grads(gw, spline_weight, spline_scaler):
    """Gradients of base weight, spline weight and scale from ``gw: (out, 1 + C, in)`` (for compile).

    gw is the gradient of the coefficient-major fused weight; returns ``(out, in)``,
    ``(out, in, C)`` and ``(out, in)`` tensors, contiguous in the parameters' layout.
    """
    g_scaled = gw[:, 1:].transpose(1, 2)  # (out, in, C)
    return (gw[:, 0].contiguous(), (g_scaled * spline_scaler.unsqueeze(-1)).contiguous(),
            (g_scaled * spline_weight).sum(-1))


def _small_out_forward(x, shift, inv_h, n_coeff: int, pieces, w3):
    """``(batch, out)`` for a layer with few outputs, features never materialised (for compile).

    w3: ``(out, 1 + C, in)`` coefficient-major fused weight. For ``out`` of 1 or 2 the GEMM is
    a matrix-vector product, bound by writing and reading the ``(batch, 1 + C, in)`` features;
    fusing their computation into the reduction avoids that traffic.
    """
    f = _pointwise_features(x, shift, inv_h, n_coeff, pieces)  # (batch, 1 + C, in), fused away
    return (f.unsqueeze(1) * w3).sum((2, 3))


def _small_out_grad_x(g, w3, x, shift, inv_h, n_coeff: int, pieces):
    """``(batch, in)`` d loss / dx for a few-output layer; g: ``(batch, out)`` (for compile)."""
    gf = (g[:, :, None, None] * w3).sum(1)  # (batch, 1 + C, in), fused away
    return _pointwise_grad_x(gf, x, shift, inv_h, n_coeff, pieces)


def _small_out_grad_w(g, x, shift, inv_h, n_coeff: int, pieces):
    """``(out, 1 + C, in)`` d loss / d fused weight for a few-output layer (for compile)."""
    f = _pointwise_features(x, shift, inv_h, n_coeff, pieces)
    return (g[:, :, None, None] * f.unsqueeze(1)).sum(0)


# Layers with at most this many outputs use the fused matrix-vector kernels above when compiled.
SMALL_OUT = 2

_COMPILED: dict = {}


def _compiled(fn):
    """``torch.compile(fn)``, or ``None`` when torch.compile is unavailable or failed before."""
    if fn not in _COMPILED:
        try:
            # Static shapes: about 8% faster than dynamic ones here. Each (batch, layer shape) compiles
            # once; past torch._dynamo.config.recompile_limit (default 8) new shapes run eagerly.
            _COMPILED[fn] = torch.compile(fn, dynamic=False)
        except Exception as e:  # e.g. a build of torch without dynamo
            warnings.warn(f"torch.compile unavailable ({e}); the fast KAN path runs eagerly")
            _COMPILED[fn] = None
    return _COMPILED[fn]


def _run_compiled(fn, *args):
    """Run the compiled ``fn``; on a compile/runtime failure disable it and return ``None``."""
    cfn = _compiled(fn)
    if cfn is None:
        return None
    try:
        return cfn(*args)
    except Exception as e:  # e.g. no C++ compiler for inductor: fall back to eager, once
        warnings.warn(f"torch.compile of {fn.__name__} failed ({type(e).__name__}: {e}); "
                      "the fast KAN path runs eagerly")
        _COMPILED[fn] = None
        return None


def _call(fn, *args):
    """``fn(*args)`` compiled when possible, else eagerly (same result, slower)."""
    out = _run_compiled(fn, *args)
    return fn(*args) if out is None else out


class _FastKANFunction(torch.autograd.Function):
    """Fused exact KAN layer on a uniform grid; saves x, the fused weight and the parameters.

    forward: ``y = [silu(x), B(x)] @ [W_base, W_spline * scale]^T`` as one GEMM. backward
    recomputes the features (cheap: k + 1 nonzeros per input) instead of keeping the
    ``(batch, in, coeff)`` basis alive between forward and backward. The fused weight
    ``(out, in * (1 + C))`` is saved: parameter-sized, independent of the batch.
    ``compiled``: build the features and d/dx with torch.compile'd pointwise kernels
    (:func:`_pointwise_features`, :func:`_pointwise_grad_x`) instead of the eager scatter/gather.
    """

    @staticmethod
    def forward(ctx, x, base_weight, spline_weight, spline_scaler, shift, inv_h, cols, poly, gemm_dtype,
                pieces, compiled):
        n_out, n_in, n_coeff = spline_weight.shape
        small = compiled and n_out <= SMALL_OUT
        y = feats = None
        if small:
            w = _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major=True)
            y = _run_compiled(_small_out_forward, x, shift, inv_h, n_coeff, pieces, w.view(n_out, -1, n_in))
            small = y is not None
            if small:
                y = y.to(gemm_dtype)  # computed in x's dtype; match what the GEMM would return
        elif compiled:  # (batch, 1 + C, in) coefficient-major
            feats = _run_compiled(_pointwise_features, x, shift, inv_h, n_coeff, pieces)
        compiled = small or feats is not None
        if y is None:
            if feats is None:  # eager: (batch, in, 1 + C)
                feats, _, _ = _fast_features(x, shift, inv_h, cols, poly, with_grad=False)
            w = _fused_weight(base_weight, spline_weight, spline_scaler, coeff_major=compiled).to(gemm_dtype)
            y = feats.view(x.shape[0], -1).to(gemm_dtype) @ w.t()  # (batch, out)
        ctx.save_for_backward(x, w, spline_weight, spline_scaler, shift, inv_h, cols, poly)
        ctx.gemm_dtype, ctx.pieces, ctx.compiled, ctx.small = gemm_dtype, pieces, compiled, small
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, w, spline_weight, spline_scaler, shift, inv_h, cols, poly = ctx.saved_tensors
        gdt = ctx.gemm_dtype
        n_out, n_in, n_coeff = spline_weight.shape
        grad_y = grad_y.to(gdt)  # (batch, out)
        need_x = ctx.needs_input_grad[0]
        grad_x = grad_base = grad_spline = grad_scaler = None
        feats = gw = None
        if ctx.small:  # fused matrix-vector kernels, features never materialised
            g = grad_y.to(x.dtype)
            if need_x:
                grad_x = _call(_small_out_grad_x, g, w.view(n_out, -1, n_in), x, shift, inv_h, n_coeff, ctx.pieces)
            if any(ctx.needs_input_grad[1:4]):
                gw = _call(_small_out_grad_w, g, x, shift, inv_h, n_coeff, ctx.pieces).to(spline_weight.dtype)
        elif ctx.compiled:  # same layout as forward
            if need_x:
                gf = (grad_y @ w).to(x.dtype).view(-1, 1 + n_coeff, n_in)  # (batch, 1 + C, in)
                feats, grad_x = _call(_pointwise_features_and_grad_x, gf, x, shift, inv_h, n_coeff, ctx.pieces)
            else:
                feats = _call(_pointwise_features, x, shift, inv_h, n_coeff, ctx.pieces)
        else:
            feats, col, dvals = _fast_features(x, shift, inv_h, cols, poly, with_grad=need_x)
            if need_x:
                gf = (grad_y @ w).to(x.dtype).view(-1, n_in, 1 + n_coeff)  # (batch, in, 1 + C)
                grad_x = torch.ops.aten.silu_backward(gf[..., 0], x)  # (batch, in)
                gf[..., 0] = 0  # bases that do not exist point at column 0: they must gather 0
                g_u = (torch.gather(gf, -1, col) * dvals).sum(-1)  # (batch, in): d loss / du
                grad_x = torch.addcmul(grad_x, g_u, inv_h)  # du/dx = inv_h
        if any(ctx.needs_input_grad[1:4]):
            if gw is None:
                gw = (grad_y.t() @ feats.view(x.shape[0], -1).to(gdt)).to(spline_weight.dtype)  # (out, in*(1+C))
            if ctx.compiled and spline_scaler is not None:
                # One fused pass back to the parameters' (out, in, C) layout; strided gradients
                # would make the gradient accumulation slow.
                grads = _call(_weight_grads, gw.view(n_out, 1 + n_coeff, n_in), spline_weight, spline_scaler)
                return grad_x, *grads, None, None, None, None, None, None, None
            if ctx.compiled:
                gw = gw.view(n_out, 1 + n_coeff, n_in)
                grad_base, g_scaled = gw[:, 0].contiguous(), gw[:, 1:].transpose(1, 2).contiguous()
            else:
                gw = gw.view(n_out, n_in, 1 + n_coeff)
                grad_base, g_scaled = gw[..., 0], gw[..., 1:]
            # g_scaled: (out, in, C), the gradient of the scaled coefficients
            if spline_scaler is None:
                grad_spline = g_scaled
            else:
                if ctx.needs_input_grad[2]:
                    grad_spline = g_scaled * spline_scaler.unsqueeze(-1)
                if ctx.needs_input_grad[3]:
                    grad_scaler = torch.linalg.vecdot(g_scaled, spline_weight)  # (out, in)
        return grad_x, grad_base, grad_spline, grad_scaler, None, None, None, None, None, None, None


class KANLinear(nn.Module):
    """Exact B-spline KAN layer: ``y = silu(x) @ W_base^T + B(x) @ (W_spline * scale)^T``.

    Each edge (i -> o) carries ``w_base[o, i] * silu(x_i) + scale[o, i] * sum_j c[o, i, j] B_j(x_i)``
    with ``B_j`` the order-``spline_order`` B-splines on a uniform grid of ``grid_size``
    intervals on ``grid_range``, extended by ``spline_order`` knots on each side. The grid is a
    registered buffer (DDP broadcasts it, ``state_dict`` saves it).

    ``impl="reference"`` evaluates the basis by the Cox-de Boor recursion over all knots and
    runs two GEMMs. ``impl="fast"`` computes the same function exactly (same outputs and
    gradients to float rounding) with the closed form of uniform B-splines (k + 1 nonzero bases
    per input), one fused GEMM over ``[silu(x), basis]`` and a custom autograd function that
    saves only x, the parameters and the fused ``(out, in * (1 + coeff))`` weight, rebuilding
    the basis in backward. ``compile_basis=True`` (fast only) builds the basis and its
    derivative with torch.compile'd pointwise kernels, and fuses layers of at most
    ``SMALL_OUT`` outputs into matrix-vector kernels; it is the fastest path after a one-off
    compilation per layer shape, and runs eagerly (with a warning) where torch.compile fails.

    The closed form needs a uniform grid per input: the initial grid, or one refit by
    :meth:`update_grid` with ``grid_eps=1`` (per-input ranges are fine). With ``grid_eps < 1``
    the refit grid is non-uniform and the fast path falls back to the reference computation
    (``grid_is_uniform`` says which). Under bf16/fp16 autocast the basis is computed in float32
    and only the GEMMs run in the autocast dtype.

    x: ``(batch, in_features)`` -> ``(batch, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, grid_size: int = 5,
                 spline_order: int = 3, grid_range: tuple[float, float] = (-1.0, 1.0),
                 scale_noise: float = 0.1, scale_base: float = 1.0, scale_spline: float = 1.0,
                 standalone_scale_spline: bool = True, impl: str = "reference", grid_eps: float = 0.02,
                 compile_basis: bool = False):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        if grid_size <= 0 or spline_order <= 0:
            raise ValueError(f"grid_size and spline_order must be positive, got {grid_size}, {spline_order}")
        if impl not in KAN_IMPLS:
            raise ValueError(f"impl: unknown value {impl!r}; choose one of {', '.join(KAN_IMPLS)}")
        if not 0.0 <= grid_eps <= 1.0:
            raise ValueError(f"grid_eps must be in [0, 1], got {grid_eps}")
        self.in_features = in_features
        self.out_features = out_features
        self.grid_size = grid_size
        self.spline_order = spline_order
        self.impl = impl
        self.grid_eps = grid_eps
        self.compile_basis = compile_basis
        self.register_buffer("grid", make_grid(in_features, grid_size, spline_order, grid_range))
        # Closed-form parameters of a uniform grid; derived from ``grid`` by refresh_grid().
        # u = x * inv_h + shift is the position of x in knot intervals from the first knot.
        self.register_buffer("shift", torch.zeros(in_features), persistent=False)
        self.register_buffer("inv_h", torch.ones(in_features), persistent=False)
        cols, _ = uniform_bspline_tables(grid_size, spline_order)
        self.register_buffer("_cols", cols, persistent=False)  # (G + 2k + 2, k + 1) int64
        self.register_buffer("_poly", local_bspline_poly(spline_order).float(), persistent=False)
        # The same splines as symmetric pieces with Python-float coefficients (compile constants).
        half, bounds, vals, dvals = symmetric_bspline_pieces(spline_order)
        self._pieces = (half, tuple(bounds), tuple(map(tuple, vals)), tuple(map(tuple, dvals)))
        self.grid_is_uniform = False
        self.refresh_grid()
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh_grid())
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

    @torch.no_grad()
    def refresh_grid(self) -> None:
        """Recompute the uniform-grid flag and closed-form parameters from ``self.grid``.

        Called by ``__init__``, :meth:`update_grid` and ``load_state_dict``; call it yourself
        after writing to ``self.grid`` in any other way.
        """
        params = grid_uniform_params(self.grid)
        self.grid_is_uniform = params is not None
        self._poly.copy_(local_bspline_poly(self.spline_order))  # from float64, into the buffer's dtype
        if params is not None:
            knot0, inv_h = params  # float64
            self.shift.copy_(-knot0 * inv_h)
            self.inv_h.copy_(inv_h)

    def _apply(self, fn, recurse=True):
        # .to(dtype/device) casts the cached closed-form buffers too; recompute them from the grid
        # so a float64 layer gets float64-accurate knot positions.
        out = super()._apply(fn, recurse)
        self.refresh_grid()
        return out

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, in, grid_size + spline_order)``, in float32 for half inputs."""
        return bspline_basis(x.to(_compute_dtype(x)), self.grid, self.spline_order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected (..., {self.in_features}) input, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).to(_compute_dtype(x))  # bases in >= float32
        if self.impl == "fast" and self.grid_is_uniform:
            y = self._forward_fast(x)
        else:
            y = self._forward_reference(x)
        return y.reshape(*lead, self.out_features)

    def _forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)``; the readable two-GEMM form."""
        base = F.linear(F.silu(x), self.base_weight)  # (batch, out)
        spline = F.linear(self.basis(x).flatten(1),  # (batch, in * coeff)
                          self.scaled_spline_weight.flatten(1))  # (batch, out)
        return base + spline

    def _forward_fast(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)``; closed-form basis, one fused GEMM."""
        gemm_dtype = _autocast_dtype(x.device.type) or x.dtype
        w_dtype = x.dtype
        with torch.autocast(x.device.type, enabled=False):
            return _FastKANFunction.apply(
                x, self.base_weight.to(w_dtype), self.spline_weight.to(w_dtype),
                None if self.spline_scaler is None else self.spline_scaler.to(w_dtype),
                self.shift.to(x.dtype), self.inv_h.to(x.dtype), self._cols, self._poly.to(x.dtype),
                gemm_dtype, self._pieces, self.compile_basis)

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, margin: float = 0.01) -> None:
        """Refit the knots to the inputs ``x`` and the coefficients so the layer function is kept.

        x: ``(batch, in)``. The new interior knots are ``grid_eps * uniform + (1 - grid_eps) *
        quantiles`` of each input's samples, the uniform grid spanning
        ``[min - margin, max + margin]``, extended by ``spline_order`` knots of the uniform step on
        each side (efficient-kan's rule). The scaled spline coefficients are then the least-squares
        fit (in float64) of the old spline outputs on ``x`` in the new basis; dividing by the
        per-edge scale gives ``spline_weight`` (edges whose scale is exactly 0 get 0). The base
        branch is untouched. Deterministic: the same ``x`` gives bitwise the same result.
        """
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"update_grid expects (batch, {self.in_features}) inputs, got {tuple(x.shape)}")
        if x.shape[0] < 2:
            raise ValueError(f"update_grid needs at least 2 samples, got {x.shape[0]}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError("update_grid got non-finite inputs")
        k, n = self.spline_order, self.grid_size
        xd = x.to(torch.float64)
        grid_old = self.grid.to(torch.float64)
        coeff = self.scaled_spline_weight.to(torch.float64).permute(1, 2, 0)  # (in, C, out)
        target = bspline_basis(xd, grid_old, k).permute(1, 0, 2) @ coeff  # (in, batch, out)

        xs = torch.sort(xd, dim=0).values  # (batch, in)
        q = torch.linspace(0, x.shape[0] - 1, n + 1, device=x.device).round().to(torch.int64)
        adaptive = xs[q]  # (G + 1, in)
        step = (xs[-1] - xs[0] + 2 * margin) / n  # (in,)
        if not bool((step > 0).all()):
            raise ValueError("update_grid: an input is constant over x and margin is 0; use margin > 0")
        ar = torch.arange(n + 1, dtype=torch.float64, device=x.device).unsqueeze(1)
        uniform = ar * step + (xs[0] - margin)  # (G + 1, in)
        interior = self.grid_eps * uniform + (1 - self.grid_eps) * adaptive
        left = interior[:1] - step * torch.arange(k, 0, -1, dtype=torch.float64, device=x.device).unsqueeze(1)
        right = interior[-1:] + step * torch.arange(1, k + 1, dtype=torch.float64, device=x.device).unsqueeze(1)
        grid_new = torch.cat([left, interior, right], dim=0).t().contiguous()  # (in, G + 2k + 1)
        self.grid.copy_(grid_new.to(self.grid.dtype))

        A = bspline_basis(xd, self.grid.to(torch.float64), k).permute(1, 0, 2)  # (in, batch, C)
        sol = torch.linalg.lstsq(A.cpu(), target.cpu()).solution.to(x.device)  # (in, C, out)
        scaled = sol.permute(2, 0, 1)  # (out, in, C)
        if self.spline_scaler is None:
            new_w = scaled
        else:
            s = self.spline_scaler.to(torch.float64).unsqueeze(-1)
            new_w = torch.where(s != 0, scaled / torch.where(s != 0, s, 1.0), 0.0)
        self.spline_weight.copy_(new_w.to(self.spline_weight.dtype))
        self.refresh_grid()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"grid_size={self.grid_size}, spline_order={self.spline_order}, impl={self.impl!r}")


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

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, margin: float = 0.01) -> None:
        """Refit every layer's grid to the inputs it sees for ``x: (batch, in)``, layer by layer."""
        for layer in self.layers:
            layer.update_grid(x, margin)
            x = layer(x)


class RBFKANLinear(nn.Module):
    """FastKAN-style layer: Gaussian RBFs instead of B-splines, plus the SiLU base branch.

    ``y = [silu(x), phi(x)] @ [W_base, W_rbf]^T + bias`` with
    ``phi_j(x_i) = exp(-((x_i - c_j) / h)^2)``, ``num_centers`` centres ``c_j`` evenly spaced on
    ``grid_range`` and ``h`` their spacing (FastKAN's choice). The base and RBF branches share
    one GEMM. The RBFs are computed in float32 under autocast.

    x: ``(batch, in_features)`` -> ``(batch, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, num_centers: int = 8,
                 grid_range: tuple[float, float] = (-1.0, 1.0), scale_noise: float = 0.1):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        if num_centers < 2:
            raise ValueError(f"num_centers must be >= 2, got {num_centers}")
        lo, hi = grid_range
        if not lo < hi:
            raise ValueError(f"grid_range needs low < high, got {grid_range}")
        self.in_features, self.out_features, self.num_centers = in_features, out_features, num_centers
        self.register_buffer("centers", torch.linspace(lo, hi, num_centers))  # (n,)
        self.inv_width = (num_centers - 1) / (hi - lo)  # 1 / centre spacing
        self.base_weight = nn.Parameter(torch.empty(out_features, in_features))
        self.rbf_weight = nn.Parameter(torch.empty(out_features, in_features, num_centers))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.kaiming_uniform_(self.base_weight, a=math.sqrt(5))
        with torch.no_grad():
            self.rbf_weight.normal_(0.0, scale_noise)

    # Gaussians below exp(-RBF_CUTOFF) ~ 1e-26 are set to 0: otherwise inputs far from a centre
    # give denormal floats, which make the GEMMs (on x86) about 10x slower.
    RBF_CUTOFF = 60.0

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, in, num_centers)`` Gaussian bumps, float32 for half inputs."""
        x = x.to(_compute_dtype(x))
        d2 = ((x.unsqueeze(-1) - self.centers.to(x.dtype)) * self.inv_width).square()  # (batch, in, n)
        # clamp first: exp must not produce denormals either (slow, and they would be discarded).
        return torch.where(d2 < self.RBF_CUTOFF, torch.exp(-d2.clamp(max=self.RBF_CUTOFF)), 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected (..., {self.in_features}) input, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).to(_compute_dtype(x))
        feats = torch.cat([F.silu(x).unsqueeze(-1), self.basis(x)], dim=-1)  # (batch, in, 1 + n)
        w = torch.cat([self.base_weight.unsqueeze(-1), self.rbf_weight], dim=-1)  # (out, in, 1 + n)
        y = F.linear(feats.flatten(1), w.flatten(1), self.bias)  # (batch, out)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, num_centers={self.num_centers}"


class ChebyKANLinear(nn.Module):
    """ChebyKAN-style layer: Chebyshev polynomials of ``tanh(x)`` up to ``degree``.

    ``y[o] = sum_i sum_{d=0..degree} c[o, i, d] T_d(tanh(x_i))``, ``T_d`` by the recurrence
    ``T_{d+1} = 2 t T_d - T_{d-1}`` (no arccos, so gradients stay finite where tanh saturates).
    ``T_0 = 1`` makes a separate bias unnecessary. Computed in float32 under autocast.

    x: ``(batch, in_features)`` -> ``(batch, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, degree: int = 7):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        if degree < 1:
            raise ValueError(f"degree must be >= 1, got {degree}")
        self.in_features, self.out_features, self.degree = in_features, out_features, degree
        self.cheb_weight = nn.Parameter(torch.empty(out_features, in_features, degree + 1))
        with torch.no_grad():
            self.cheb_weight.normal_(0.0, 1.0 / (in_features * (degree + 1)))

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, in, degree + 1)``: ``T_0 .. T_degree`` at ``tanh(x)``."""
        t = torch.tanh(x.to(_compute_dtype(x)))
        polys = [torch.ones_like(t), t]
        for _ in range(2, self.degree + 1):
            polys.append(2 * t * polys[-1] - polys[-2])
        return torch.stack(polys, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected (..., {self.in_features}) input, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        y = F.linear(self.basis(x).flatten(1), self.cheb_weight.flatten(1))  # (batch, out)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, degree={self.degree}"


class _LayerStack(nn.Module):
    def __init__(self, widths, make_layer):
        super().__init__()
        widths = list(widths)
        if len(widths) < 2:
            raise ValueError(f"widths needs at least 2 entries, got {widths}")
        self.widths = widths
        self.layers = nn.ModuleList(make_layer(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class RBFKAN(_LayerStack):
    """A stack of :class:`RBFKANLinear`. x: ``(batch, widths[0])`` -> ``(batch, widths[-1])``."""

    def __init__(self, widths, num_centers: int = 8, grid_range: tuple[float, float] = (-1.0, 1.0)):
        super().__init__(widths, lambda a, b: RBFKANLinear(a, b, num_centers, grid_range))


class ChebyKAN(_LayerStack):
    """A stack of :class:`ChebyKANLinear`. x: ``(batch, widths[0])`` -> ``(batch, widths[-1])``."""

    def __init__(self, widths, degree: int = 7):
        super().__init__(widths, lambda a, b: ChebyKANLinear(a, b, degree))


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


def _mlp_params(widths) -> int:
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def matched_mlp(kan_model_or_widths, grid_size: int = 5, spline_order: int = 3) -> MLP:
    """An :class:`MLP` with the KAN's input/output widths whose parameter count is closest to the KAN's.

    kan_model_or_widths: a model (any ``nn.Module`` with a ``widths`` attribute, e.g. :class:`KAN`,
    :class:`RBFKAN`, :class:`ChebyKAN`; its trainable parameters are counted) or a list of widths
    (then a B-spline :class:`KAN` with ``grid_size``/``spline_order`` is the target). Every hidden
    width is scaled by the same factor ``s`` (rounded, at least 1); the ``s`` whose MLP has the
    parameter count nearest to the target is returned.
    """
    if isinstance(kan_model_or_widths, nn.Module):
        widths = list(getattr(kan_model_or_widths, "widths", []))
        if len(widths) < 2:
            raise ValueError("matched_mlp: the model has no `widths` attribute of at least 2 entries")
        target = count_params(kan_model_or_widths)
    else:
        widths = [int(w) for w in kan_model_or_widths]
        target = count_params(KAN(widths, grid_size, spline_order))
    if len(widths) < 3:
        raise ValueError(f"matched_mlp: widths {widths} have no hidden layer to scale")
    hidden = widths[1:-1]
    top = max(hidden)

    def scaled(n_top: int) -> list[int]:
        return [widths[0]] + [max(1, round(h * n_top / top)) for h in hidden] + [widths[-1]]

    best, best_err, n_top = None, None, 1
    while True:  # parameter count grows with n_top; stop once past the target
        cand = scaled(n_top)
        err = abs(_mlp_params(cand) - target)
        if best_err is None or err < best_err:
            best, best_err = cand, err
        if _mlp_params(cand) > target:
            break
        n_top += 1
    return MLP(best)


def build_model(cfg) -> nn.Module:
    """The model a :class:`kanlib.config.RunConfig` asks for.

    kan: B-spline :class:`KAN` with ``cfg.kan_impl`` (compiled = fast with compiled basis kernels); kan_rbf: :class:`RBFKAN` with
    ``grid_size + spline_order`` centres on ``grid_range``; kan_cheb: :class:`ChebyKAN` of degree
    ``grid_size + spline_order - 1``. Both variants thus carry the B-spline KAN's number of
    coefficients per edge.
    """
    if cfg.model == "mlp":
        return MLP(cfg.widths)
    if cfg.model == "kan":
        impl = "fast" if cfg.kan_impl == "compiled" else cfg.kan_impl
        return KAN(cfg.widths, cfg.grid_size, cfg.spline_order, cfg.grid_range, impl=impl,
                   compile_basis=cfg.kan_impl == "compiled", grid_eps=cfg.grid_eps)
    if cfg.model == "kan_rbf":
        return RBFKAN(cfg.widths, cfg.grid_size + cfg.spline_order, cfg.grid_range)
    if cfg.model == "kan_cheb":
        return ChebyKAN(cfg.widths, cfg.grid_size + cfg.spline_order - 1)
    raise ValueError(f"model: {cfg.model!r} is not built by this version")


def _gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x: (n_rank, in)`` in rank order; row counts may differ by rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s.item()) for s in sizes]
    padded = x.new_zeros(max(sizes), *x.shape[1:])
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0)  # (sum n_rank, in)


@torch.no_grad()
def update_grid_distributed(model: nn.Module, x: torch.Tensor, margin: float = 0.01) -> None:
    """Refit the spline grids of ``model`` to the inputs of all ranks; every rank ends identical.

    model: a :class:`KAN` or :class:`KANLinear` (or a DDP wrapper of one: its ``.module`` is
    used); x: ``(batch_rank, in)``, this rank's batch. With ``torch.distributed`` initialised
    and more than one rank, the batches of all ranks are all-gathered (their sizes may
    differ), every rank runs the same deterministic :meth:`KAN.update_grid` on the union, and
    the refit grids and spline weights are then broadcast from rank 0 so the ranks hold
    bitwise-equal parameters and buffers even if a kernel were not bitwise reproducible.
    Without distributed (or with one rank) it is ``model.update_grid(x, margin)``.
    Every rank must call it (collective). Call it inside or outside ``torch.no_grad``.
    """
    import torch.distributed as dist

    module = getattr(model, "module", model)
    if not hasattr(module, "update_grid"):
        raise TypeError(f"update_grid_distributed needs a KAN or KANLinear, got {type(module).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be (batch, in), got {tuple(x.shape)}")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    x_all = _gather_rows(x.detach()) if distributed else x.detach()
    module.update_grid(x_all, margin)
    if distributed:
        layers = [m for m in module.modules() if isinstance(m, KANLinear)]
        for layer in layers:
            dist.broadcast(layer.grid, src=0)
            dist.broadcast(layer.spline_weight.data, src=0)
            layer.refresh_grid()


def kernel_paths(model: nn.Module) -> list[str]:
    """The B-spline kernel paths the KAN layers of ``model`` run (sorted; empty for other models):
    ``compiled``, ``fast`` (closed form, eager) or ``reference``."""
    paths = set()
    for m in model.modules():
        if isinstance(m, KANLinear):
            if m.impl == "reference" or not m.grid_is_uniform:
                paths.add("reference")
            elif m.compile_basis and all(v is not None for v in _COMPILED.values()):
                paths.add("compiled")
            else:
                paths.add("fast")
    return sorted(paths)


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile (dynamo's own accounting; 0 without compile)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return 0.0
    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
