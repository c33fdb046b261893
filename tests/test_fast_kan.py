"""The fast exact KAN path computes the reference function: values, gradients, fallbacks, bf16."""

from __future__ import annotations

import pytest
import torch

from kanlib.bspline import bspline_basis, make_grid, uniform_bspline_basis
from kanlib.config import RunConfig
from kanlib.model import KAN, KANLinear, build_model


def _pair(in_f, out_f, grid_size, order, dtype=torch.float32, grid_range=(-1.0, 1.0)):
    torch.manual_seed(grid_size * 10 + order)
    ref = KANLinear(in_f, out_f, grid_size, order, grid_range=grid_range, impl="reference").to(dtype)
    # Coefficients of order one, so the spline branch is not drowned by the base branch.
    with torch.no_grad():
        ref.spline_weight.uniform_(-1, 1)
        ref.grid.copy_(make_grid(in_f, grid_size, order, grid_range, dtype=torch.float64))
    fast = KANLinear(in_f, out_f, grid_size, order, grid_range=grid_range, impl="fast").to(dtype)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def _inputs(batch, in_f, dtype, lo=-1.6, hi=1.6):
    # Wider than the extended grid of small grid sizes, so inputs left/right of it are covered.
    g = torch.Generator().manual_seed(1)
    return (torch.rand(batch, in_f, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("grid_size", list(range(3, 21)))
def test_fast_matches_reference_values_and_gradients(grid_size, order):
    ref, fast = _pair(3, 4, grid_size, order)
    x = _inputs(96, 3, torch.float32)
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yf = ref(xr), fast(xf)
    torch.testing.assert_close(yf, yr, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(yr)  # a generic upstream gradient
    gr = torch.autograd.grad((yr * w).sum(), [xr, *ref.parameters()])
    gf = torch.autograd.grad((yf * w).sum(), [xf, *fast.parameters()])
    names = ["x"] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, gr, gf):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("order", [1, 2, 3])
def test_fast_matches_reference_in_float64(order):
    ref, fast = _pair(5, 2, 7, order, dtype=torch.float64, grid_range=(-0.5, 2.0))
    x = _inputs(200, 5, torch.float64, lo=-2.0, hi=3.0).requires_grad_()
    yr, yf = ref(x), fast(x)
    torch.testing.assert_close(yf, yr, rtol=1e-12, atol=1e-12)
    gr = torch.autograd.grad(yr.sum(), [x, *ref.parameters()])
    gf = torch.autograd.grad(yf.sum(), [x, *fast.parameters()])
    for a, b in zip(gr, gf):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)


def test_fast_exact_on_knots_and_grid_ends():
    ref, fast = _pair(1, 3, 5, 3)
    knots = ref.grid[0]
    x = torch.cat([knots, knots + 1e-4, knots - 1e-4, torch.tensor([-5.0, 5.0])]).unsqueeze(1)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_out", [4, 1])  # 1: the fused matrix-vector kernels
def test_compiled_basis_matches_reference(n_out):
    # compile_basis=True builds the features with torch.compile'd pointwise kernels (or, where
    # torch.compile cannot run, falls back to eager): the function must not change.
    ref, _ = _pair(3, n_out, 6, 3)
    fast = KANLinear(3, n_out, 6, 3, impl="fast", compile_basis=True)
    fast.load_state_dict(ref.state_dict())
    x = _inputs(96, 3, torch.float32)
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yf = ref(xr), fast(xf)
    torch.testing.assert_close(yf, yr, rtol=1e-5, atol=1e-5)
    gr = torch.autograd.grad(yr.square().sum(), [xr, *ref.parameters()])
    gf = torch.autograd.grad(yf.square().sum(), [xf, *fast.parameters()])
    for a, b in zip(gr, gf):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_uniform_basis_matches_cox_de_boor():
    for order in (1, 2, 3, 4):
        grid = make_grid(3, 6, order, (-2.0, 1.0), dtype=torch.float64)
        x = _inputs(300, 3, torch.float64, lo=-4.0, hi=3.0)
        torch.testing.assert_close(uniform_bspline_basis(x, grid, order), bspline_basis(x, grid, order),
                                   rtol=1e-12, atol=1e-12)


def test_uniform_basis_rejects_non_uniform_grid():
    grid = make_grid(2, 5, 3)
    grid[:, 4] += 0.05
    with pytest.raises(ValueError, match="uniform grid"):
        uniform_bspline_basis(torch.zeros(4, 2), grid, 3)


def test_non_uniform_grid_falls_back_to_reference():
    ref, fast = _pair(3, 4, 5, 3)
    with torch.no_grad():
        for m in (ref, fast):
            m.grid[:, 6] += 0.07  # an interior knot moves: no longer uniform
            m.refresh_grid()
    assert not fast.grid_is_uniform
    x = _inputs(64, 3, torch.float32)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-6, atol=1e-6)


def test_load_state_dict_refreshes_uniform_flag():
    src = KANLinear(2, 2, impl="fast")
    with torch.no_grad():
        src.grid[:, 3] += 0.1
    dst = KANLinear(2, 2, impl="fast")
    assert dst.grid_is_uniform
    dst.load_state_dict(src.state_dict())
    assert not dst.grid_is_uniform


def test_fast_saves_no_basis_for_backward():
    layer = KANLinear(16, 8, grid_size=10, impl="fast")
    x = torch.rand(64, 16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    biggest = max(t.numel() for t in saved)
    n_coeff = layer.grid_size + layer.spline_order
    # The reference keeps (batch, in, coeff) tensors; the fast path keeps x, the parameters and
    # the fused (out, in * (1 + coeff)) weight: nothing that grows with batch * coeff.
    assert biggest <= max(x.numel(), 8 * 16 * (1 + n_coeff))
    assert biggest < 64 * 16 * n_coeff


def test_bad_impl_and_input_raise():
    with pytest.raises(ValueError, match="impl: unknown value 'turbo'"):
        KANLinear(2, 3, impl="turbo")
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 2\) input"):
        KANLinear(2, 3, impl="fast")(torch.zeros(4, 3))


def test_build_model_passes_kan_impl():
    for impl in ("reference", "fast"):
        model = build_model(RunConfig(model="kan", kan_impl=impl))
        assert isinstance(model, KAN)
        assert all(layer.impl == impl for layer in model.layers)


@pytest.mark.parametrize("impl", ["reference", "fast", "fast-compiled"])
def test_bf16_autocast_error_bound(impl):
    torch.manual_seed(0)
    model = KAN([8, 32, 32, 1], impl=impl.split("-")[0], compile_basis=impl.endswith("compiled"))
    with torch.no_grad():
        for layer in model.layers:
            layer.spline_weight.uniform_(-1, 1)
    x = torch.rand(256, 8) * 2 - 1
    exact = KAN([8, 32, 32, 1], impl="reference").double()
    exact.load_state_dict(model.state_dict())
    want = exact(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(x)
        basis = model.layers[1].basis(x.new_zeros(4, 32, dtype=torch.bfloat16))
    assert got.dtype == torch.bfloat16  # the GEMMs did run in bf16
    assert basis.dtype == torch.float32  # the basis did not
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.3g} under bf16 autocast"
    got.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("compile_basis", [False, True])
def test_fast_without_standalone_scale(compile_basis):
    torch.manual_seed(3)
    ref = KANLinear(4, 3, 5, 2, standalone_scale_spline=False)
    fast = KANLinear(4, 3, 5, 2, standalone_scale_spline=False, impl="fast", compile_basis=compile_basis)
    fast.load_state_dict(ref.state_dict())
    x = _inputs(50, 4, torch.float32)
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yf = ref(xr), fast(xf)
    torch.testing.assert_close(yf, yr, rtol=1e-5, atol=1e-5)
    gr = torch.autograd.grad(yr.sum(), [xr, *ref.parameters()])
    gf = torch.autograd.grad(yf.sum(), [xf, *fast.parameters()])
    for a, b in zip(gr, gf):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
