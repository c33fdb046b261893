"""RBF and Chebyshev KAN variants train, build from config, and matched_mlp matches parameter counts."""

from __future__ import annotations

import math

import pytest
import torch

from kanlib.config import RunConfig
from kanlib.model import (KAN, MLP, ChebyKAN, ChebyKANLinear, RBFKAN, RBFKANLinear, build_model,
                          count_params, matched_mlp)


def _task(n=512):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    y = torch.exp(torch.sin(math.pi * x[:, :1]) + x[:, 1:] ** 2)  # the exp_sin task
    return x, y


def _train(model, steps=150, lr=1e-2):
    x, y = _task()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], min(losses[-10:])


@pytest.mark.parametrize("make", [lambda: RBFKAN([2, 8, 1], num_centers=8),
                                  lambda: ChebyKAN([2, 8, 1], degree=5),
                                  lambda: KAN([2, 8, 1], impl="fast")],
                         ids=["rbf", "cheb", "bspline-fast"])
def test_variant_trains(make):
    torch.manual_seed(0)
    first, last = _train(make())
    assert last < 0.1 * first, f"loss {first:.4g} -> {last:.4g}"
    assert last < 0.05, f"final loss {last:.4g}"


def test_build_model_variants():
    rbf = build_model(RunConfig(model="kan_rbf", widths=(2, 6, 1), grid_size=4, spline_order=2))
    assert isinstance(rbf, RBFKAN) and rbf.layers[0].num_centers == 6
    cheb = build_model(RunConfig(model="kan_cheb", widths=(2, 6, 1), grid_size=4, spline_order=2))
    assert isinstance(cheb, ChebyKAN) and cheb.layers[0].degree == 5
    x = torch.rand(7, 2)
    assert rbf(x).shape == (7, 1) and cheb(x).shape == (7, 1)


def test_rbf_basis_values():
    layer = RBFKANLinear(1, 1, num_centers=5, grid_range=(-1.0, 1.0))
    b = layer.basis(torch.tensor([[0.0], [0.25]]))[:, 0]  # (2, 5)
    torch.testing.assert_close(b[0], torch.exp(-torch.tensor([4.0, 1.0, 0.0, 1.0, 4.0])))  # ((x - c) / 0.5)^2
    torch.testing.assert_close(b[1, 2], torch.exp(torch.tensor(-0.25)))  # (0.25 / 0.5)^2


def test_cheb_basis_matches_cosine_form():
    layer = ChebyKANLinear(1, 1, degree=6)
    x = torch.linspace(-2, 2, 41, dtype=torch.float64).unsqueeze(1)
    b = layer.basis(x)[:, 0]  # (41, 7)
    theta = torch.arccos(torch.tanh(x))
    want = torch.cos(torch.arange(7, dtype=torch.float64) * theta)
    torch.testing.assert_close(b, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("precision_model", ["rbf", "cheb"])
def test_variants_bf16_autocast(precision_model):
    torch.manual_seed(0)
    model = RBFKAN([4, 16, 2]) if precision_model == "rbf" else ChebyKAN([4, 16, 2])
    x = torch.rand(128, 4) * 2 - 1
    want = model.double()(x.double())
    model = model.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(x)
        basis = model.layers[1].basis(torch.zeros(3, 16, dtype=torch.bfloat16))
    assert basis.dtype == torch.float32
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel


@pytest.mark.parametrize("widths", [[64, 256, 256, 1], [16, 64, 64, 1], [2, 5, 1], [3, 10, 4, 2]])
def test_matched_mlp_param_count(widths):
    kan = KAN(widths)
    mlp = matched_mlp(kan)
    assert isinstance(mlp, MLP)
    assert mlp.widths[0] == widths[0] and mlp.widths[-1] == widths[-1]
    assert abs(count_params(mlp) - count_params(kan)) <= 0.03 * count_params(kan)
    assert count_params(matched_mlp(widths)) == count_params(mlp)  # widths in: same answer


def test_matched_mlp_for_variants_and_errors():
    for model in (RBFKAN([16, 64, 1]), ChebyKAN([16, 64, 1], degree=3)):
        mlp = matched_mlp(model)
        assert abs(count_params(mlp) - count_params(model)) <= 0.03 * count_params(model)
    with pytest.raises(ValueError, match="no hidden layer"):
        matched_mlp([4, 1])


def test_variant_bad_args():
    with pytest.raises(ValueError, match="num_centers must be >= 2"):
        RBFKANLinear(2, 2, num_centers=1)
    with pytest.raises(ValueError, match="degree must be >= 1"):
        ChebyKANLinear(2, 2, degree=0)
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 3\) input"):
        ChebyKANLinear(3, 2)(torch.zeros(2, 2))
