"""KANLinear, KAN and MLP: shapes, the layer's definition, gradients, buffers."""

import pytest
import torch
import torch.nn.functional as F

from kanlib import KAN, MLP, KANLinear, RunConfig, bspline_basis, build_model, count_params
from kanlib.model import RBFKAN, ChebyKAN, _LayerStack


def test_layer_equals_its_definition_per_edge():
    torch.manual_seed(0)
    layer = KANLinear(3, 2, grid_size=4, spline_order=3).double()
    x = torch.rand(7, 3, dtype=torch.float64) * 2 - 1
    y = layer(x)
    B = bspline_basis(x, layer.grid, 3)  # (7, 3, 7)
    want = torch.zeros(7, 2, dtype=torch.float64)
    for o in range(2):
        for i in range(3):
            spline = (B[:, i, :] * layer.spline_weight[o, i]).sum(-1) * layer.spline_scaler[o, i]
            want[:, o] += layer.base_weight[o, i] * F.silu(x[:, i]) + spline
    assert torch.allclose(y, want, atol=1e-12)


def test_shapes_params_and_grid_buffer():
    layer = KANLinear(5, 4, grid_size=6, spline_order=2)
    assert layer(torch.zeros(11, 5)).shape == (11, 4)
    assert layer(torch.zeros(2, 3, 5)).shape == (2, 3, 4)
    assert "grid" in dict(layer.named_buffers())
    assert "grid" in layer.state_dict()
    assert count_params(layer) == 4 * 5 + 4 * 5 * (6 + 2) + 4 * 5
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 5\) input"):
        layer(torch.zeros(3, 4))


def test_gradients_flow_to_every_parameter():
    torch.manual_seed(0)
    model = KAN([2, 5, 1], grid_size=5, spline_order=3).double()
    x = (torch.rand(16, 2, dtype=torch.float64) * 2 - 1).requires_grad_()
    model(x).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    layer = KANLinear(2, 2, grid_size=3).double()
    xin = torch.tensor([[0.13, -0.41], [0.77, 0.29]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (xin,))


def test_kan_fits_a_simple_function():
    torch.manual_seed(0)
    model = KAN([2, 4, 1], grid_size=5)
    x = torch.rand(512, 2) * 2 - 1
    y = (torch.sin(torch.pi * x[:, :1]) + x[:, 1:] ** 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(300):
        loss = F.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.01 < first


def test_mlp_and_build_model():
    mlp = MLP([3, 8, 1])
    assert mlp(torch.zeros(4, 3)).shape == (4, 1)
    assert count_params(mlp) == 3 * 8 + 8 + 8 + 1
    assert isinstance(build_model(RunConfig(model="mlp")), MLP)
    kan = build_model(RunConfig(widths=(2, 7, 1), grid_size=4, spline_order=2))
    assert isinstance(kan, KAN) and [l.out_features for l in kan.layers] == [7, 1]
    assert kan.layers[0].grid.shape == (2, 4 + 2 * 2 + 1)


@pytest.mark.parametrize("make", [lambda: KAN([3, 5, 2], impl="fast"), lambda: KAN([3, 5, 2], impl="reference"),
                                  lambda: RBFKAN([3, 5, 2]), lambda: ChebyKAN([3, 5, 2]), lambda: MLP([3, 5, 2])],
                         ids=["kan-fast", "kan-reference", "rbf", "cheb", "mlp"])
def test_every_stack_takes_leading_dims_and_shares_the_base(make):
    torch.manual_seed(0)
    model = make()
    assert isinstance(model, _LayerStack) and model.widths == [3, 5, 2] and len(model.layers) == 2
    x = torch.rand(4, 6, 3)
    y = model(x)
    assert y.shape == (4, 6, 2)
    torch.testing.assert_close(y, model(x.reshape(24, 3)).reshape(4, 6, 2))  # flattening changes nothing
    if not isinstance(model, MLP):  # the layers' one input check names the expected width
        with pytest.raises(ValueError, match=r"expected \(\.\.\., 3\) input, got \(4, 2\)"):
            model(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="widths needs at least 2 entries"):
        type(model)([3])


def test_mlp_puts_silu_between_layers_only():
    torch.manual_seed(0)
    mlp = MLP([2, 4, 3])
    x = torch.rand(5, 2)
    want = mlp.layers[1](F.silu(mlp.layers[0](x)))
    torch.testing.assert_close(mlp(x), want)


def test_model_module_knows_no_torch_distributed():
    """model.py is layers only: the grid update and extension across ranks live in kanlib.grids."""
    import ast
    import inspect

    import kanlib
    from kanlib import grids, model

    tree = ast.parse(inspect.getsource(model))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.startswith("torch.distributed")], imported
    assert kanlib.update_grid_distributed is grids.update_grid_distributed
