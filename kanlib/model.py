"""KAN layers and models, and the MLP baseline. Pure ``nn.Module``: no I/O, no torch.distributed (the grid
update and extension across ranks are :mod:`kanlib.grids`').

Layers (each takes ``(..., in)`` and returns ``(..., out)``; :class:`_Layer` checks and flattens once):
:class:`KANLinear` (exact B-spline; ``impl`` "compiled", "fast" or "reference"), :class:`RBFKANLinear`
(Gaussian RBFs), :class:`ChebyKANLinear` (Chebyshev polynomials). Stacks (:class:`_LayerStack`):
:class:`KAN`, :class:`RBFKAN`, :class:`ChebyKAN` and the baseline :class:`MLP`; :func:`matched_mlp`.
The fast B-spline kernels live in :mod:`kanlib.fast_kan` (on data-adaptive knots
:mod:`kanlib.knots`); :func:`kernel_paths` says which ran.
"""

from __future__ import annotations

import math
from typing import get_args

import torch
import torch.nn.functional as F
from torch import nn

from kanlib import fast_kan
from kanlib.bspline import bspline_basis, make_grid
from kanlib.compiling import wait_prepared
from kanlib.config import KanImpl
from kanlib.knots import KnotGrid, knot_grid

KAN_IMPLS = get_args(KanImpl)  # the strings of RunConfig.kan_impl, defined once in kanlib.config
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision inputs (bases are always computed in float32), else x's dtype."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The active autocast dtype on ``device_type``, or ``None`` when autocast is off."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class _Layer(nn.Module):
    """Base of the KAN layers: checks ``x: (..., in_features)``, flattens it to ``(batch, in)`` for
    :meth:`forward_2d` and gives the result back as ``(..., out_features)``."""

    in_features: int
    out_features: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"expected (..., {self.in_features}) input, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        y = self.forward_2d(x.reshape(-1, self.in_features))  # (batch, out)
        return y.reshape(*lead, self.out_features)

    def forward_2d(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class KANLinear(_Layer):
    """Exact B-spline KAN layer: ``y = silu(x) @ W_base^T + B(x) @ (W_spline * scale)^T``.

    Each edge (i -> o) carries ``w_base[o, i] * silu(x_i) + scale[o, i] * sum_j c[o, i, j] B_j(x_i)``
    with ``B_j`` the order-``spline_order`` B-splines on a uniform grid of ``grid_size`` intervals on
    ``grid_range``, extended by ``spline_order`` knots on each side. The grid is a registered buffer
    (``state_dict`` saves it). DDP does not need to broadcast it (the trainer sets
    ``broadcast_buffers=False``): it changes only in grid updates, which leave every rank equal.

    ``impl`` picks how the layer computes, always the same function:

    - ``"compiled"`` (default): the closed form of uniform B-splines with torch.compile'd pointwise
      kernels (:mod:`kanlib.fast_kan`), the fastest exact path after a one-off compilation per layer
      shape (cached on disk across processes by inductor). Where torch.compile cannot run it falls
      back to ``"fast"`` with one warning per process.
    - ``"fast"``: the same closed form in eager PyTorch (k + 1 nonzero bases per input, one scatter, one
      fused GEMM over ``[silu(x), basis]``); for platforms without a compiler.
    - ``"reference"``: the Cox-de Boor recursion over all knots and two GEMMs; the readable definition.

    The fast paths save only x and parameter-sized tensors for backward (the basis is rebuilt there).
    On a grid uniform to within its dtype's rounding (:func:`kanlib.fast_kan.uniform_grid`: the initial
    grid, or one refit by :meth:`update_grid` with ``grid_eps=1``) they use the uniform closed form; on any
    other strictly increasing knots (``grid_eps < 1``, hand-edited knots) Cox-de Boor on the knots of each
    basis's support (:func:`kanlib.knots.knot_grid`). Only knots that are not strictly increasing leave
    the layer on the reference computation; :func:`kernel_paths` reports what actually ran. Under bf16/fp16
    autocast the basis is computed in float32 and only the GEMMs run in the autocast dtype. Non-finite inputs
    give non-finite outputs.

    x: ``(..., in_features)`` -> ``(..., out_features)``.
    """

    def __init__(self, in_features: int, out_features: int, grid_size: int = 5,
                 spline_order: int = 3, grid_range: tuple[float, float] = (-1.0, 1.0),
                 scale_noise: float = 0.1, scale_base: float = 1.0, scale_spline: float = 1.0,
                 standalone_scale_spline: bool = True, impl: str = "compiled", grid_eps: float = 0.02):
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
        self.register_buffer("grid", make_grid(in_features, grid_size, spline_order, grid_range))
        self.paths_run: set[str] = set()  # kernel paths executed since construction / reset_kernel_paths
        self._uniform: fast_kan.UniformGrid | None = None
        self._knots: KnotGrid | None = None  # where the grid is not uniform
        self._grid_seen = None
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

    @property
    def grid_is_uniform(self) -> bool:
        """Whether the grid is uniform to within its dtype's rounding (the fast paths can run)."""
        self._check_grid()
        return self._uniform is not None

    @torch.no_grad()
    def refresh_grid(self) -> None:
        """Recompute the kernels' constants from ``self.grid``: the closed form's
        (:class:`kanlib.fast_kan.UniformGrid`) on a uniform grid, else the knot tables
        (:class:`kanlib.knots.KnotGrid`; ``None`` for knots that are not strictly increasing).

        Called by ``__init__``, :meth:`update_grid`, ``load_state_dict`` and ``.to()``; an in-place write
        to ``self.grid`` is also noticed (by its version counter) at the next forward.
        """
        self._uniform = fast_kan.uniform_grid(self.grid, self.spline_order)
        self._knots = None if self._uniform is not None else knot_grid(self.grid, self.spline_order)
        self._grid_seen = (self.grid.data_ptr(), self.grid._version)

    def _check_grid(self) -> None:
        if self._grid_seen != (self.grid.data_ptr(), self.grid._version):
            self.refresh_grid()

    def _apply(self, fn, recurse=True):
        # .to(dtype/device) moves the grid: recompute the constants from it, in its new dtype.
        self._check_grid()
        was_uniform, old_dtype = self._uniform is not None, self.grid.dtype
        out = super()._apply(fn, recurse)
        new_dtype = self.grid.dtype
        if (was_uniform and new_dtype != old_dtype and new_dtype.is_floating_point
                and torch.finfo(new_dtype).eps < torch.finfo(old_dtype).eps):
            # A uniform float32 grid cast to float64 is uniform only to float32's rounding, which the float64 check
            # refuses, and the layer fell silently to the reference path (issue 23): lay its knots out again,
            # uniform at the new precision between the same end knots, so the fast path keeps running.
            with torch.no_grad():
                g = self.grid
                n = g.shape[1] - 1
                steps = torch.arange(n + 1, dtype=new_dtype, device=g.device)
                g.copy_(g[:, :1] + steps * (g[:, -1:] - g[:, :1]) / n)
        self.refresh_grid()
        return out

    def basis(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, in, grid_size + spline_order)`` by the reference recursion,
        in float32 for half inputs."""
        return bspline_basis(x.to(_compute_dtype(x)), self.grid, self.spline_order)

    def forward_2d(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)`` by the path ``impl`` asks for, where it can run."""
        x = x.to(_compute_dtype(x))  # bases in >= float32
        self._check_grid()
        grid = self._uniform or self._knots
        if self.impl == "reference" or grid is None:
            self.paths_run.add("reference")
            return self._forward_reference(x)
        grid = grid.like(x)
        gemm_dtype = _autocast_dtype(x.device.type) or x.dtype
        with torch.autocast(x.device.type, enabled=False):
            return fast_kan.kan_linear(
                x, self.base_weight.to(x.dtype), self.spline_weight.to(x.dtype),
                None if self.spline_scaler is None else self.spline_scaler.to(x.dtype),
                grid, self.impl, self.paths_run, gemm_dtype)

    def _forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)``; the readable two-GEMM form."""
        base = F.linear(F.silu(x), self.base_weight)  # (batch, out)
        spline = F.linear(self.basis(x).flatten(1),  # (batch, in * coeff)
                          self.scaled_spline_weight.flatten(1))  # (batch, out)
        return base + spline

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

    @torch.no_grad()
    def refine(self, x: torch.Tensor, grid_size: int) -> float:
        """Move the layer onto a grid of ``grid_size`` intervals, keeping its function (pykan's ``refine``).

        x: ``(batch, in)``, samples of the layer's inputs. The new interior knots interpolate the current ones
        linearly at ``grid_size + 1`` evenly spaced fractional positions (pykan's rule: a grid twice as fine
        holds every current knot, and a uniform grid stays uniform, so the closed form keeps running), extended
        by ``spline_order`` knots of the new mean interval on each side. The scaled coefficients are the
        least-squares fit (float64) of the current spline outputs at the samples and at ``4 * grid_size``
        evenly spaced points of the interior (so that every new basis is determined even where no sample
        falls); where the new spline space contains the current spline (a grid twice as fine) the fit is
        exact. ``grid`` and ``spline_weight`` become new tensors of the new size, so wrappers (DDP, FSDP) and
        optimizers must be rebuilt. Returns the refit error: the root mean square, over the samples and the
        outputs, of the change of the layer's output (its spline branch; the base branch is untouched).
        """
        if grid_size < 1:
            raise ValueError(f"grid_size must be positive, got {grid_size}")
        if x.dim() != 2 or x.shape[1] != self.in_features or x.shape[0] < 1:
            raise ValueError(f"refine expects (batch >= 1, {self.in_features}) inputs, got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError("refine got non-finite inputs")
        k, n = self.spline_order, self.grid_size
        dev, f64 = x.device, torch.float64
        old = self.grid.to(f64)  # (in, G + 2k + 1)
        coeff = self.scaled_spline_weight.to(f64).permute(1, 2, 0)  # (in, C, out)
        interior = old[:, k:n + k + 1]  # (in, G + 1)
        h = (interior[:, -1:] - interior[:, :1]) / grid_size  # (in, 1) the new mean interval
        if self.grid_is_uniform:  # closed form, as make_grid: uniform to the last bit, for the fast paths
            grid_new = interior[:, :1] + torch.arange(-k, grid_size + k + 1, dtype=f64, device=dev) * h
            knots = grid_new[:, k:grid_size + k + 1]
        else:
            pos = torch.linspace(0, n, grid_size + 1, dtype=f64, device=dev)  # fractional knot indices
            lo = pos.floor().clamp(max=n - 1).long()
            frac = pos - lo
            knots = interior[:, lo] * (1 - frac) + interior[:, lo + 1] * frac  # (in, G' + 1)
            ext = torch.arange(1, k + 1, dtype=f64, device=dev)
            grid_new = torch.cat([knots[:, :1] - h * ext.flip(0), knots, knots[:, -1:] + h * ext], dim=1)

        u = torch.linspace(0, 1, 4 * grid_size + 1, dtype=f64, device=dev).unsqueeze(1)  # (P, 1)
        fill = (knots[:, 0] + u * (knots[:, -1] - knots[:, 0]))  # (P, in): points inside the new interior
        xd = torch.cat([x.to(f64), fill])  # (batch + P, in)
        target = bspline_basis(xd, old, k).permute(1, 0, 2) @ coeff  # (in, batch + P, out)
        A = bspline_basis(xd, grid_new, k).permute(1, 0, 2)  # (in, batch + P, C')
        scaled = torch.linalg.lstsq(A.cpu(), target.cpu()).solution.to(dev).permute(2, 0, 1)  # (out, in, C')
        if self.spline_scaler is None:
            new_w = scaled
        else:
            s = self.spline_scaler.to(f64).unsqueeze(-1)
            new_w = torch.where(s != 0, scaled / torch.where(s != 0, s, 1.0), 0.0)
        new_w = new_w.to(self.spline_weight.dtype)
        kept = new_w.to(f64) * (1.0 if self.spline_scaler is None else self.spline_scaler.to(f64).unsqueeze(-1))
        m = x.shape[0]
        moved = (A[:, :m] @ kept.permute(1, 2, 0) - target[:, :m]).sum(dim=0)  # (batch, out)
        self._resize(grid_new.to(self.grid.dtype), new_w)
        return float(moved.square().mean().sqrt())

    def _resize(self, grid: torch.Tensor, spline_weight: torch.Tensor) -> None:
        """Take ``grid: (in, G + 2k + 1)`` and ``spline_weight: (out, in, G + k)`` of another grid size G."""
        self.grid = grid  # a registered buffer: state_dict keeps saving it
        self.spline_weight = nn.Parameter(spline_weight, requires_grad=self.spline_weight.requires_grad)
        self.grid_size = grid.shape[1] - 2 * self.spline_order - 1
        self.refresh_grid()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state of another grid size (a checkpoint written after a grid extension) resizes the layer first.
        grid = state_dict.get(prefix + "grid")
        if (isinstance(grid, torch.Tensor) and grid.dim() == 2 and grid.shape[0] == self.in_features
                and grid.shape[1] != self.grid.shape[1] and grid.shape[1] > 2 * self.spline_order + 1):
            n = grid.shape[1] - 2 * self.spline_order - 1
            self._resize(self.grid.new_empty(grid.shape),
                         self.spline_weight.new_empty(self.out_features, self.in_features, n + self.spline_order))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"grid_size={self.grid_size}, spline_order={self.spline_order}, impl={self.impl!r}")


class RBFKANLinear(_Layer):
    """FastKAN-style layer: Gaussian RBFs instead of B-splines, plus the SiLU base branch.

    ``y = [silu(x), phi(x)] @ [W_base, W_rbf]^T + bias`` with
    ``phi_j(x_i) = exp(-((x_i - c_j) / h)^2)``, ``num_centers`` centres ``c_j`` evenly spaced on
    ``grid_range`` and ``h`` their spacing (FastKAN's choice). The base and RBF branches share
    one GEMM. The RBFs are computed in float32 under autocast.

    x: ``(..., in_features)`` -> ``(..., out_features)``.
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

    def forward_2d(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)``."""
        x = x.to(_compute_dtype(x))
        feats = torch.cat([F.silu(x).unsqueeze(-1), self.basis(x)], dim=-1)  # (batch, in, 1 + n)
        w = torch.cat([self.base_weight.unsqueeze(-1), self.rbf_weight], dim=-1)  # (out, in, 1 + n)
        return F.linear(feats.flatten(1), w.flatten(1), self.bias)  # (batch, out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, num_centers={self.num_centers}"


class ChebyKANLinear(_Layer):
    """ChebyKAN-style layer: Chebyshev polynomials of ``tanh(x)`` up to ``degree``.

    ``y[o] = sum_i sum_{d=0..degree} c[o, i, d] T_d(tanh(x_i))``, ``T_d`` by the recurrence
    ``T_{d+1} = 2 t T_d - T_{d-1}`` (no arccos, so gradients stay finite where tanh saturates).
    ``T_0 = 1`` makes a separate bias unnecessary. Computed in float32 under autocast.

    x: ``(..., in_features)`` -> ``(..., out_features)``.
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

    def forward_2d(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``(batch, in)`` -> ``(batch, out)``."""
        return F.linear(self.basis(x).flatten(1), self.cheb_weight.flatten(1))  # (batch, out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, degree={self.degree}"


class _LayerStack(nn.Module):
    """Layers ``make_layer(widths[i], widths[i + 1])`` applied in turn, ``activation`` between them.

    ``widths = [in, hidden..., out]``; x: ``(..., in)`` -> ``(..., out)``. The base of :class:`KAN`,
    :class:`RBFKAN`, :class:`ChebyKAN` and :class:`MLP`.
    """

    def __init__(self, widths, make_layer, activation=None):
        super().__init__()
        widths = [int(w) for w in widths]
        if len(widths) < 2:
            raise ValueError(f"widths needs at least 2 entries, got {widths}")
        self.widths = widths
        self.layers = nn.ModuleList(make_layer(a, b) for a, b in zip(widths, widths[1:]))
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i and self.activation is not None:
                x = self.activation(x)
            x = layer(x)
        return x


class KAN(_LayerStack):
    """A stack of :class:`KANLinear`. ``widths = [in, hidden..., out]``; x: ``(..., in)`` -> ``(..., out)``.

    ``layer_kwargs`` go to every layer (``impl``, ``grid_eps``, ``scale_noise``, ...).
    """

    def __init__(self, widths, grid_size: int = 5, spline_order: int = 3,
                 grid_range: tuple[float, float] = (-1.0, 1.0), **layer_kwargs):
        super().__init__(widths, lambda a, b: KANLinear(a, b, grid_size=grid_size, spline_order=spline_order,
                                                        grid_range=grid_range, **layer_kwargs))

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, margin: float = 0.01) -> None:
        """Refit every layer's grid to the inputs it sees for ``x: (batch, in)``, layer by layer."""
        for layer in self.layers:
            layer.update_grid(x, margin)
            x = layer(x)


    @torch.no_grad()
    def refine(self, x: torch.Tensor, grid_size: int) -> float:
        """Every layer onto a grid of ``grid_size`` intervals (:meth:`KANLinear.refine`), each fit on the inputs
        the current model gives it for ``x: (batch, in)`` (pykan's ``initialize_from_another_model``). Returns the
        largest layer's refit error."""
        inputs = []
        for layer in self.layers:
            inputs.append(x)
            x = layer(x)
        return max(layer.refine(xi, grid_size) for layer, xi in zip(self.layers, inputs))


class RBFKAN(_LayerStack):
    """A stack of :class:`RBFKANLinear`. x: ``(..., widths[0])`` -> ``(..., widths[-1])``."""

    def __init__(self, widths, num_centers: int = 8, grid_range: tuple[float, float] = (-1.0, 1.0)):
        super().__init__(widths, lambda a, b: RBFKANLinear(a, b, num_centers, grid_range))


class ChebyKAN(_LayerStack):
    """A stack of :class:`ChebyKANLinear`. x: ``(..., widths[0])`` -> ``(..., widths[-1])``."""

    def __init__(self, widths, degree: int = 7):
        super().__init__(widths, lambda a, b: ChebyKANLinear(a, b, degree))


class MLP(_LayerStack):
    """Plain MLP baseline: Linear layers with SiLU between them. x: ``(..., in)`` -> ``(..., out)``."""

    def __init__(self, widths):
        super().__init__(widths, nn.Linear, activation=nn.SiLU())


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

    kan: B-spline :class:`KAN` with ``impl=cfg.kan_impl`` (the same strings) and ``cfg.grid_eps``;
    kan_rbf: :class:`RBFKAN` with ``grid_size + spline_order`` centres on ``grid_range``; kan_cheb:
    :class:`ChebyKAN` of degree ``grid_size + spline_order - 1``. Both variants thus carry the B-spline
    KAN's number of coefficients per edge.
    """
    if cfg.model == "mlp":
        return MLP(cfg.widths)
    if cfg.model == "kan":
        return KAN(cfg.widths, cfg.grid_size, cfg.spline_order, cfg.grid_range, impl=cfg.kan_impl,
                   grid_eps=cfg.grid_eps)
    if cfg.model == "kan_rbf":
        return RBFKAN(cfg.widths, cfg.grid_size + cfg.spline_order, cfg.grid_range)
    if cfg.model == "kan_cheb":
        return ChebyKAN(cfg.widths, cfg.grid_size + cfg.spline_order - 1)
    raise ValueError(f"model: {cfg.model!r} is not built by this version")


def grid_size_of(model: nn.Module) -> int | None:
    """The grid size of the first B-spline layer of ``model`` (or of the module it wraps); None without one."""
    for m in getattr(model, "module", model).modules():
        if isinstance(m, KANLinear):
            return m.grid_size
    return None


def kernel_paths(model: nn.Module) -> list[str]:
    """The B-spline kernel paths the KAN layers of ``model`` actually executed, forward or backward,
    since construction or :func:`reset_kernel_paths`: a sorted subset of ``["compiled", "fast",
    "reference"]`` (empty for models without :class:`KANLinear` or before the first forward).

    "compiled" means torch.compile'd kernels ran; "fast" the eager kernels (asked for, or the fallback
    where torch.compile failed), on uniform and on data-adaptive grids alike; "reference" the Cox-de Boor
    path over all knots (asked for, or knots that are not strictly increasing).
    """
    return sorted(set().union(*(m.paths_run for m in model.modules() if isinstance(m, KANLinear))))


def reset_kernel_paths(model: nn.Module) -> None:
    """Forget the paths :func:`kernel_paths` reports (e.g. after a warm-up, or to watch one step)."""
    for m in model.modules():
        if isinstance(m, KANLinear):
            m.paths_run.clear()


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile (dynamo's own accounting; 0 without compile).

    With a warm inductor cache (``TORCHINDUCTOR_CACHE_DIR``, FX graph and AOTAutograd caches on by
    default) this is dynamo's tracing plus cache loads, not a full compilation.
    """
    wait_prepared()  # never import dynamo while prepare_compile's thread imports inductor
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return 0.0
    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
