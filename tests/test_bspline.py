"""The B-spline basis against an independent textbook Cox-de Boor reference in float64."""

import math

import pytest
import torch

from kanlib import bspline_basis, make_grid


def cox_de_boor(t: list[float], i: int, k: int, x: float) -> float:
    """Textbook recursive B-spline N_{i,k}(x) on knots t (half-open support, 0/0 = 0)."""
    if k == 0:
        return 1.0 if t[i] <= x < t[i + 1] else 0.0
    out = 0.0
    if t[i + k] != t[i]:
        out += (x - t[i]) / (t[i + k] - t[i]) * cox_de_boor(t, i, k - 1, x)
    if t[i + k + 1] != t[i + 1]:
        out += (t[i + k + 1] - x) / (t[i + k + 1] - t[i + 1]) * cox_de_boor(t, i + 1, k - 1, x)
    return out


@pytest.mark.parametrize("grid_size,order", [(3, 1), (5, 2), (5, 3), (8, 3), (4, 4)])
def test_matches_textbook_reference_float64(grid_size, order):
    torch.manual_seed(0)
    in_features = 3
    grid = make_grid(in_features, grid_size, order, (-1.0, 1.0), dtype=torch.float64)
    x = torch.rand(50, in_features, dtype=torch.float64) * 2.4 - 1.2  # some points outside too
    got = bspline_basis(x, grid, order)
    assert got.shape == (50, in_features, grid_size + order)
    knots = grid[0].tolist()
    want = torch.tensor([[[cox_de_boor(knots, j, order, x[b, i].item()) for j in range(grid_size + order)]
                          for i in range(in_features)] for b in range(50)], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


def test_nonuniform_grid_matches_reference():
    order = 3
    knots = sorted([-1.3, -1.1, -1.0, -0.7, -0.1, 0.05, 0.4, 0.9, 1.0, 1.2, 1.5, 1.7])
    grid = torch.tensor([knots], dtype=torch.float64)
    x = torch.linspace(-1.0, 0.99, 37, dtype=torch.float64).unsqueeze(1)
    got = bspline_basis(x, grid, order)
    want = torch.tensor([[[cox_de_boor(knots, j, order, v) for j in range(len(knots) - order - 1)]]
                         for v in x[:, 0].tolist()], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_partition_of_unity_inside_grid(order):
    grid = make_grid(4, 7, order, (-2.0, 3.0), dtype=torch.float64)
    x = torch.rand(200, 4, dtype=torch.float64) * 5 - 2  # inside [-2, 3)
    s = bspline_basis(x, grid, order).sum(-1)
    assert torch.allclose(s, torch.ones_like(s), atol=1e-12)


def test_zero_outside_extended_grid_and_leading_dims():
    grid = make_grid(2, 5, 3)
    x = torch.full((2, 3, 2), 10.0)
    out = bspline_basis(x, grid, 3)
    assert out.shape == (2, 3, 2, 8)
    assert out.abs().max().item() == 0.0


def test_differentiable_gradcheck():
    grid = make_grid(2, 4, 3, dtype=torch.float64)
    # keep away from knots, where the basis is only C^(k-1)
    x = (torch.tensor([[-0.61, 0.33], [0.12, -0.88], [0.71, 0.05]], dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: bspline_basis(v, grid, 3), (x,))


def test_bad_grid_shape_is_named():
    with pytest.raises(ValueError, match="grid must be"):
        bspline_basis(torch.zeros(4, 3), make_grid(2, 5, 3), 3)


def test_uniform_grid_spacing():
    g = make_grid(1, 4, 2, (0.0, 2.0), dtype=torch.float64)[0]
    assert g.tolist() == pytest.approx([-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    assert math.isclose(g[2].item(), 0.0) and math.isclose(g[-3].item(), 2.0)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kernels_basis_on_random_knots_matches_textbook(order):
    """The fast kernels' basis on non-uniform knots (the eager interval search + local recursion, and the compiled
    kernels' pointwise form called eagerly) equals the textbook recursion, and its derivative equals autograd
    through the reference, at random inputs beyond both ends and exactly on every knot."""
    from kanlib import fast_kan, knots

    torch.manual_seed(order)
    n_in, grid_size = 2, 5
    gaps = torch.rand(n_in, grid_size + 2 * order, dtype=torch.float64) * 0.9 + 0.1
    grid = torch.cat([torch.zeros(n_in, 1, dtype=torch.float64), gaps.cumsum(1)], 1) - 2.0
    x = torch.cat([torch.rand(60, n_in, dtype=torch.float64) * (grid[:, -1] - grid[:, 0] + 1) + grid[:, 0] - 0.5,
                   grid.t()])
    kg = knots.knot_grid(grid, order)
    n_coeff = grid_size + order
    want = torch.tensor([[[cox_de_boor(grid[i].tolist(), j, order, x[b, i].item()) for j in range(n_coeff)]
                          for i in range(n_in)] for b in range(x.shape[0])], dtype=torch.float64)
    pointwise = knots.knot_basis(x, kg.knots_t, kg.inv, n_coeff, order, False).transpose(1, 2)
    for got in (fast_kan.basis(x, kg), pointwise):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    xr = x.clone().requires_grad_()
    w = torch.randn(x.shape[0], n_in, n_coeff, dtype=torch.float64)
    (want_dx,) = torch.autograd.grad((bspline_basis(xr, grid, order) * w).sum(), xr)
    d = knots.knot_basis(x, kg.knots_t, kg.inv, n_coeff, order, True).transpose(1, 2)
    torch.testing.assert_close((d * w).sum(-1), want_dx, rtol=1e-12, atol=1e-12)
    col, vals, dvals = knots.knot_local(x, kg, derivative=True)  # the k + 1 local derivatives, gathered
    dense = torch.zeros(x.numel(), 1 + n_coeff, dtype=torch.float64).scatter_(1, col, dvals)[:, 1:]
    torch.testing.assert_close((dense.view_as(w) * w).sum(-1), want_dx, rtol=1e-12, atol=1e-12)


def test_knot_tables_refuse_knots_that_are_not_increasing():
    from kanlib import knots

    grid = make_grid(2, 5, 3, dtype=torch.float64)
    assert knots.knot_grid(grid, 3) is not None
    grid[1, 4] = grid[1, 5]  # repeated: Cox-de Boor divides by zero
    assert knots.knot_grid(grid, 3) is None
    with pytest.raises(ValueError, match=r"grid must be \(in, G \+ 2k \+ 1\)"):
        knots.knot_grid(grid, 6)
