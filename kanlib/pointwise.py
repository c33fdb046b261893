"""The compiled KAN kernels: features, d/dx and the few-output layer, written pointwise and coefficient-major
``(batch, 1 + C, in)`` so that torch.compile fuses each into one loop (no scatter, no index that depends on x).

One set per kind of grid, in :data:`KERNELS`: the closed form on uniform grids (the cardinal B-spline as
truncated powers, :func:`cardinal_terms`) and Cox-de Boor on each basis's knots on any other grid
(:func:`kanlib.knots.knot_basis`). They are plain torch functions: :mod:`kanlib.compiling` compiles them, and
called eagerly they compute the same values (slowly), which is what the fallback does when compilation fails
mid-step. :mod:`kanlib.fast_kan` picks and calls them.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kanlib.knots import knot_basis


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


# -- uniform grids (UniformGrid): the closed form ---------------------------------------------------
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


def base_grad(gw):
    """``(out, in)`` gradient of base_weight from ``gw: (out, 1 + C, in)``, cloned with the parameter's strides, not
    made ``.contiguous()``: for one output, ``gw[:, 0]`` counts as contiguous with strides ``((1 + C) * in, 1)``, and
    DDP copied it into its bucket with a warning ("Grad strides do not match bucket view strides") every run."""
    return gw[:, 0].clone(memory_format=torch.contiguous_format)


def weight_grads(gw, spline_weight, spline_scaler):
    """``(out, in)``, ``(out, in, C)``, ``(out, in)`` gradients of base, spline and scaler from the
    coefficient-major fused weight's gradient ``gw: (out, 1 + C, in)``, contiguous in the parameters'
    layout (strided gradients would make gradient accumulation slow)."""
    g_scaled = gw[:, 1:].transpose(1, 2)  # (out, in, C)
    return (base_grad(gw), (g_scaled * spline_scaler.unsqueeze(-1)).contiguous(),
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
        return grad_x, base_grad(gw), gw[:, 1:].transpose(1, 2).contiguous(), None
    return (grad_x, *weight_grads(gw, spline_weight, spline_scaler))


def _small_out_backward(g, w3, x, shift, inv_h, n_coeff: int, terms, spline_weight, spline_scaler, need_x: bool):
    """Backward of a few-output layer in one fused pass: ``(grad_x or None, grad_base, grad_spline,
    grad_scaler or None)`` from ``g = d loss / d y: (batch, out)``; features never materialised."""
    return _small_out_grads(_pointwise_features(x, shift, inv_h, n_coeff, terms),
                            lambda gf: _pointwise_grad_x(gf, x, shift, inv_h, n_coeff, terms),
                            g, w3, spline_weight, spline_scaler, need_x)


# -- non-uniform knots (KnotGrid): the same kernels, another basis --------------------------------
# Separate functions, not a switch inside the ones above: dynamo's recompile limit counts per function, and
# a recipe run meets three grid sizes at two batch shapes on these alone.
def _knot_features(x, knots_t, inv, n_coeff: int, k: int):
    """``(batch, 1 + C, in)`` features ``[silu(x), B_0(x) .. B_{C-1}(x)]`` on non-uniform knots."""
    return torch.cat([F.silu(x).unsqueeze(1), knot_basis(x, knots_t, inv, n_coeff, k, False)], 1)


def _knot_grad_x(gf, x, knots_t, inv, n_coeff: int, k: int):
    """``(batch, in)`` d loss / dx from ``gf = d loss / d features: (batch, 1 + C, in)``, non-uniform knots."""
    return gf[:, 0] * _silu_grad(x) + (gf[:, 1:] * knot_basis(x, knots_t, inv, n_coeff, k, True)).sum(1)


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


class Kernels(NamedTuple):
    """The compiled kernels of one kind of grid (all take ``x`` and then the grid's ``kernel_args()``)."""

    features: object
    features_and_grad_x: object
    small_out_forward: object
    small_out_backward: object


KERNELS = {
    "UniformGrid": Kernels(_pointwise_features, _pointwise_features_and_grad_x, _small_out_forward,
                           _small_out_backward),
    "KnotGrid": Kernels(_knot_features, _knot_features_and_grad_x, _knot_small_out_forward, _knot_small_out_backward),
}
"""The kernels of each kind of grid, by the name of its class (:class:`kanlib.fast_kan.UniformGrid`,
:class:`kanlib.knots.KnotGrid`)."""
