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
