"""The fast exact KAN paths compute the reference function: values, gradients, exactness, fallbacks, NaN, bf16."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kanlib import compiling, fast_kan, pointwise
from kanlib.bspline import bspline_basis, make_grid
from kanlib.config import RunConfig
from kanlib.model import KAN, KANLinear, build_model, kernel_paths, reset_kernel_paths

REPO = Path(__file__).resolve().parents[1]
FAST_IMPLS = ["fast", "compiled"]


@pytest.fixture
def fresh_dynamo():
    """An empty dynamo cache, so earlier tests' shapes do not count towards its recompile limit, and no
    once-per-process warning already spent by an earlier test."""
    torch._dynamo.reset()
    compiling._WARNED.clear()
    yield
    torch._dynamo.reset()


def _pair(in_f, out_f, grid_size, order, dtype=torch.float32, grid_range=(-1.0, 1.0), impl="fast"):
    torch.manual_seed(grid_size * 10 + order)
    ref = KANLinear(in_f, out_f, grid_size, order, grid_range=grid_range, impl="reference").to(dtype)
    # Coefficients of order one, so the spline branch is not drowned by the base branch; the grid
    # made in the layer's dtype, as a layer constructed in that dtype would hold it.
    with torch.no_grad():
        ref.spline_weight.uniform_(-1, 1)
        ref.grid.copy_(make_grid(in_f, grid_size, order, grid_range, dtype=dtype))
    fast = KANLinear(in_f, out_f, grid_size, order, grid_range=grid_range, impl=impl).to(dtype)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def _inputs(batch, in_f, dtype, lo=-1.6, hi=1.6):
    # Wider than the extended grid of small grid sizes, so inputs left/right of it are covered.
    g = torch.Generator().manual_seed(1)
    return (torch.rand(batch, in_f, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _grads(model, x, weight=None):
    x = x.clone().requires_grad_()
    y = model(x)
    w = torch.ones_like(y) if weight is None else weight
    return y, torch.autograd.grad((y * w).sum(), [x, *model.parameters()])


def _assert_same(ref, fast, x, rtol, atol, weight=None):
    yr, gr = _grads(ref, x, weight)
    yf, gf = _grads(fast, x, weight)
    torch.testing.assert_close(yf, yr, rtol=rtol, atol=atol)
    names = ["x"] + [n for n, _ in ref.named_parameters()]
    for name, a, b in zip(names, gr, gf):
        torch.testing.assert_close(b, a, rtol=10 * rtol, atol=10 * atol, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("grid_size", list(range(3, 21)))
def test_fast_matches_reference_values_and_gradients(grid_size, order):
    ref, fast = _pair(3, 4, grid_size, order)
    x = _inputs(96, 3, torch.float32)
    _assert_same(ref, fast, x, 1e-5, 1e-5, weight=torch.randn(96, 4, generator=torch.Generator().manual_seed(2)))
    assert kernel_paths(fast) == ["fast"]


@pytest.mark.parametrize("n_out", [1, 2])  # the eager kernel without features
@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("grid_size", [3, 5, 11])
def test_fast_small_output_layers_match_reference(grid_size, order, n_out):
    ref, fast = _pair(6, n_out, grid_size, order)
    x = _inputs(128, 6, torch.float32)
    _assert_same(ref, fast, x, 1e-5, 1e-5, weight=torch.randn(128, n_out, generator=torch.Generator().manual_seed(3)))
    assert kernel_paths(fast) == ["fast"]


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("order", [1, 2, 3])
def test_fast_matches_reference_in_float64(order, impl, fresh_dynamo):
    ref, fast = _pair(5, 2, 7, order, dtype=torch.float64, grid_range=(-0.5, 2.0), impl=impl)
    x = _inputs(200, 5, torch.float64, lo=-2.0, hi=3.0)
    _assert_same(ref, fast, x, 1e-12, 1e-12)
    assert kernel_paths(fast) == [impl] and kernel_paths(ref) == ["reference"]


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_fast_exact_on_knots_and_grid_ends(impl, fresh_dynamo):
    ref, fast = _pair(1, 3, 5, 3, impl=impl)
    knots = ref.grid[0]
    x = torch.cat([knots, knots + 1e-4, knots - 1e-4, torch.tensor([-5.0, 5.0])]).unsqueeze(1)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_out", [4, 1])  # 1: the fused matrix-vector kernels
def test_compiled_matches_reference(n_out, fresh_dynamo):
    ref, _ = _pair(3, n_out, 6, 3)
    fast = KANLinear(3, n_out, 6, 3)  # the default is the compiled path
    assert fast.impl == "compiled"
    fast.load_state_dict(ref.state_dict())
    x = _inputs(96, 3, torch.float32)
    yr, gr = _grads(ref, x, torch.ones(96, n_out))
    yf, gf = _grads(fast, x, torch.ones(96, n_out))
    torch.testing.assert_close(yf, yr, rtol=1e-5, atol=1e-5)
    for a, b in zip(gr, gf):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert kernel_paths(fast) == ["compiled"]  # forward and backward really ran compiled kernels


# -- data-adaptive (non-uniform) knots: the kernels for any knots ------------------------------------------
def _adaptive_pair(in_f, out_f, grid_size, order, impl, seed=0):
    """A float64 reference layer and an ``impl`` one on the same random non-uniform knots (another vector per
    input, neighbouring intervals up to 10x apart), with coefficients of order one."""
    torch.manual_seed(seed)
    ref = KANLinear(in_f, out_f, grid_size, order, impl="reference").double()
    n = grid_size + 2 * order + 1
    gaps = torch.rand(in_f, n - 1, dtype=torch.float64) * 0.9 + 0.1
    knots = torch.cat([torch.zeros(in_f, 1, dtype=torch.float64), gaps.cumsum(1)], 1)
    knots = knots / knots[:, -1:] * 3.0 - 1.5 + 0.2 * torch.rand(in_f, 1, dtype=torch.float64)  # about [-1.5, 1.5]
    with torch.no_grad():
        ref.spline_weight.uniform_(-1, 1)
        ref.grid.copy_(knots)
    fast = KANLinear(in_f, out_f, grid_size, order, impl=impl).double()
    fast.load_state_dict(ref.state_dict())
    assert not fast.grid_is_uniform
    return ref, fast


def _adaptive_inputs(grid, batch, seed=1):
    """``(batch + n_knots, in)``: random inputs beyond both ends of each input's knots, then every knot exactly."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = grid[:, 0] - 0.5, grid[:, -1] + 0.5
    x = torch.rand(batch, grid.shape[0], generator=g, dtype=torch.float64) * (hi - lo) + lo
    return torch.cat([x, grid.t()])


@pytest.mark.parametrize("n_out", [4, 1])  # the features + GEMM kernels, and the few-output kernels
@pytest.mark.parametrize("order", [1, 2, 3])
def test_knot_kernels_match_reference_in_float64(order, n_out):
    """On random non-uniform knots the eager kernels equal Cox-de Boor over all knots to float64 rounding: values
    and gradients in x and in every parameter, at inputs outside the grid and exactly on knots."""
    ref, fast = _adaptive_pair(3, n_out, 7, order, "fast")
    x = _adaptive_inputs(ref.grid, 300)
    weight = torch.randn(x.shape[0], n_out, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _assert_same(ref, fast, x, 1e-12, 1e-12, weight=weight)
    assert kernel_paths(fast) == ["fast"]


def test_compiled_knot_kernels_match_reference_in_float64(fresh_dynamo):
    """The compiled kernels on random non-uniform knots, both families (features + GEMM, few outputs), the
    first order (its slope jumps at the knots) and the cubic."""
    for order, n_out in [(1, 4), (3, 4), (3, 1)]:
        ref, fast = _adaptive_pair(3, n_out, 6, order, "compiled", seed=order)
        x = _adaptive_inputs(ref.grid, 200)
        _assert_same(ref, fast, x, 1e-12, 1e-12)
        assert kernel_paths(fast) == ["compiled"], (order, n_out)


def test_production_basis_matches_cox_de_boor():
    for order in (1, 2, 3, 4):
        grid = make_grid(3, 6, order, (-2.0, 1.0), dtype=torch.float64)
        x = _inputs(300, 3, torch.float64, lo=-4.0, hi=3.0)
        ug = fast_kan.uniform_grid(grid, order)
        torch.testing.assert_close(fast_kan.basis(x, ug), bspline_basis(x, grid, order),
                                   rtol=1e-12, atol=1e-12)
        # the compiled kernels' form of the same basis, called eagerly
        f = pointwise.KERNELS["UniformGrid"].features(x, *ug.kernel_args())
        torch.testing.assert_close(f[:, 1:].transpose(1, 2), bspline_basis(x, grid, order), rtol=1e-12, atol=1e-12)


def test_uniformity_is_rounding_of_the_grid_dtype():
    for dtype in (torch.float32, torch.float64):
        for lo, hi, n, k in [(-1.0, 1.0, 5, 3), (-0.5, 2.0, 7, 1), (0.0, 1e3, 20, 2), (-3e-3, 1e-3, 4, 3)]:
            assert fast_kan.uniform_grid(make_grid(2, n, k, (lo, hi), dtype=dtype), k) is not None, (dtype, lo, hi)
    grid = make_grid(2, 5, 3)
    cell = (grid[0, 1] - grid[0, 0]).item()
    moved = grid.clone()
    moved[1, 6] += 0.5e-4 * cell  # passed the old rtol 1e-4 check; gives ~1e-5 from the reference
    assert fast_kan.uniform_grid(moved, 3) is None
    assert fast_kan.uniform_grid(grid.double(), 3) is None  # float32 knots are not uniform in float64
    with pytest.raises(ValueError, match=r"grid must be \(in, G \+ 2k \+ 1\)"):
        fast_kan.uniform_grid(make_grid(2, 5, 3), 6)


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_nearly_uniform_grid_runs_the_knot_kernels(impl, fresh_dynamo):
    """A knot moved by 5e-5 of a cell: not uniform (the closed form would differ from Cox-de Boor by ~1e-5), so
    the kernels for any knots run, and equal the reference on the moved knots; only knots that are not strictly
    increasing leave the layer on the reference path."""
    ref, fast = _pair(3, 4, 5, 3, impl=impl)
    with torch.no_grad():
        cell = (ref.grid[0, 1] - ref.grid[0, 0]).item()
        for m in (ref, fast):
            m.grid[:, 6] += 0.5e-4 * cell  # an in-place write, noticed without refresh_grid()
    assert not fast.grid_is_uniform
    x = _inputs(64, 3, torch.float32)
    _assert_same(ref, fast, x, 1e-5, 1e-5)
    assert kernel_paths(fast) == [impl]
    with torch.no_grad():
        for m in (ref, fast):
            m.grid[:, 7] = m.grid[:, 6]  # a repeated knot: Cox-de Boor divides by zero there
    reset_kernel_paths(fast)
    torch.testing.assert_close(fast(x), ref(x), rtol=0, atol=0, equal_nan=True)  # the very same computation (NaN)
    assert kernel_paths(fast) == ["reference"]


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_a_float32_layer_moved_to_float64_keeps_the_fast_path(impl):
    """Issue 23: ``.double()`` of a float32-built layer silently dropped to the reference path (its float32 knots are
    not uniform at float64 rounding); the move lays the knots out again at float64, so the fast path keeps running
    and equals the reference on the same grid."""
    torch.manual_seed(0)
    fast = KANLinear(3, 2, impl=impl).double()
    assert fast.grid_is_uniform
    ref = KANLinear(3, 2, impl="reference").double()
    ref.load_state_dict(fast.state_dict())
    x = _inputs(50, 3, torch.float64)
    torch.testing.assert_close(fast(x), ref(x), rtol=0, atol=1e-12)
    assert kernel_paths(fast) == [impl]
    # float32 knots loaded into a float64 layer: not uniform at float64, so the kernels for any knots run them
    rounded = {k: v.double() for k, v in KANLinear(3, 2, impl=impl).state_dict().items()}
    late = KANLinear(3, 2, impl=impl).double()
    late.load_state_dict(rounded)
    assert not late.grid_is_uniform
    ref.load_state_dict(rounded)
    torch.testing.assert_close(late(x), ref(x), rtol=0, atol=1e-12)
    assert kernel_paths(late) == [impl]


def test_load_state_dict_refreshes_uniform_flag():
    src = KANLinear(2, 2, impl="fast")
    with torch.no_grad():
        src.grid[:, 3] += 0.1
    dst = KANLinear(2, 2, impl="fast")
    assert dst.grid_is_uniform
    dst.load_state_dict(src.state_dict())
    assert not dst.grid_is_uniform


def test_kernel_paths_follow_grid_updates_and_reset(fresh_dynamo):
    model = KAN([2, 6, 1])
    x = torch.randn(128, 2)
    assert kernel_paths(model) == []
    model(x).sum().backward()
    assert kernel_paths(model) == ["compiled"]
    model.update_grid(x)  # grid_eps=0.02: data-adaptive, not uniform
    assert not any(layer.grid_is_uniform for layer in model.layers)
    reset_kernel_paths(model)
    assert kernel_paths(model) == []
    model(x).sum().backward()
    assert kernel_paths(model) == ["compiled"]  # the kernels for any knots, not the reference
    assert kernel_paths(torch.nn.Linear(2, 2)) == []


@pytest.mark.parametrize("impl,adaptive", [("reference", False), ("fast", False), ("compiled", False),
                                           ("fast", True), ("compiled", True)])
def test_non_finite_inputs_give_non_finite_outputs(impl, adaptive, fresh_dynamo):
    # lr=100 makes activations NaN; casting NaN to an index used to raise IndexError in the fast path.
    torch.manual_seed(0)
    model = KAN([3, 8, 4, 1], impl=impl)
    x = _inputs(16, 3, torch.float32)
    if adaptive:  # knots fitted to the data: the kernels for any knots, their interval search included
        model.update_grid(_inputs(64, 3, torch.float32, lo=-0.8, hi=0.8))
        assert not any(layer.grid_is_uniform for layer in model.layers)
    x[3, 0], x[7, 1], x[11, 2] = float("nan"), float("inf"), float("-inf")
    x.requires_grad_()
    y = model(x)
    bad = torch.zeros(16, dtype=torch.bool)
    bad[[3, 7, 11]] = True
    assert not torch.isfinite(y[bad]).any()
    assert torch.isfinite(y[~bad]).all()  # the other rows are untouched
    y.sum().backward()
    assert not torch.isfinite(x.grad[bad]).all(dim=1).any()
    for name, p in model.named_parameters():
        assert not torch.isfinite(p.grad).all(), name  # the NaN reaches every weight, and nan_policy
    big = torch.full((2, 3), 1e30, requires_grad=True)  # finite but far outside every grid
    model(big).sum().backward()
    assert big.grad is not None
    if adaptive:
        assert kernel_paths(model) == [impl]


def test_eager_scratch_buffers_shared_by_interleaved_layers():
    """The eager kernels reuse one set of scratch buffers: layers of other shapes and dtypes running
    between a layer's forward and its backward (a deeper stack, a float64 model, a no-grad evaluation)
    must not change any value or gradient."""
    pairs = [_pair(5, 7, 6, 3), _pair(3, 2, 4, 2), _pair(4, 3, 5, 3, dtype=torch.float64)]
    # the first call is the biggest, so the later ones reuse its buffers instead of growing new ones
    xs = [_inputs(100, 5, torch.float32), _inputs(40, 3, torch.float32), _inputs(30, 4, torch.float64)]
    expected = [_grads(ref, x) for (ref, _), x in zip(pairs, xs)]
    inputs = [x.clone().requires_grad_() for x in xs]
    outs = [fast(x) for (_, fast), x in zip(pairs, inputs)]  # every forward, then every backward
    with torch.no_grad():
        pairs[1][1](_inputs(60, 3, torch.float32))  # an evaluation in between
    for (_, fast), x, y, (yr, gr) in zip(reversed(pairs), reversed(inputs), reversed(outs), reversed(expected)):
        got = torch.autograd.grad(y.sum(), [x, *fast.parameters()])
        torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
        for a, b in zip(gr, got):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert all(kernel_paths(fast) == ["fast"] for _, fast in pairs)


def test_fast_saves_no_basis_for_backward():
    for impl in FAST_IMPLS:
        layer = KANLinear(16, 8, grid_size=10, impl=impl)
        x = torch.rand(64, 16, requires_grad=True)
        saved = []

        def pack(t):
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x)
        biggest = max(t.numel() for t in saved)
        n_coeff = layer.grid_size + layer.spline_order
        # The reference keeps (batch, in, coeff) tensors; the fast paths keep x, the parameters and
        # the fused (out, in * (1 + coeff)) weight: nothing that grows with batch * coeff.
        assert biggest <= max(x.numel(), 8 * 16 * (1 + n_coeff)), impl
        assert biggest < 64 * 16 * n_coeff, impl


def test_bad_impl_and_input_raise():
    with pytest.raises(ValueError, match="impl: unknown value 'turbo'"):
        KANLinear(2, 3, impl="turbo")
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 2\) input"):
        KANLinear(2, 3, impl="fast")(torch.zeros(4, 3))
    with pytest.raises(TypeError):
        KANLinear(2, 3, compile_basis=True)  # the old switch is gone: impl="compiled"
    with pytest.raises(ValueError, match="mode: unknown value 'reference'"):
        ug = fast_kan.uniform_grid(make_grid(2, 5, 3), 3)
        fast_kan.kan_linear(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, 8), None, ug, "reference", set())


def test_default_impl_is_compiled_and_build_model_passes_kan_impl():
    assert all(layer.impl == "compiled" for layer in KAN([2, 3, 1]).layers)
    for impl in ("reference", "fast", "compiled"):
        model = build_model(RunConfig(model="kan", kan_impl=impl))
        assert isinstance(model, KAN)
        assert all(layer.impl == impl for layer in model.layers)


@pytest.mark.parametrize("impl", ["reference", "fast", "compiled"])
def test_bf16_autocast_error_bound(impl, fresh_dynamo):
    torch.manual_seed(0)
    model = KAN([8, 32, 32, 1], impl=impl)
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
    assert kernel_paths(model) == [impl]


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_fast_without_standalone_scale(impl, fresh_dynamo):
    torch.manual_seed(3)
    ref = KANLinear(4, 3, 5, 2, standalone_scale_spline=False, impl="reference")
    fast = KANLinear(4, 3, 5, 2, standalone_scale_spline=False, impl=impl)
    fast.load_state_dict(ref.state_dict())
    _assert_same(ref, fast, _inputs(50, 4, torch.float32), 1e-5, 1e-5)


def test_compile_failure_on_one_device_type_leaves_others_compiled(fresh_dynamo, monkeypatch):
    monkeypatch.setitem(compiling._BROKEN, "cuda", "RuntimeError: no compiler")
    layer = KANLinear(3, 4)
    layer(torch.rand(8, 3)).sum().backward()
    assert kernel_paths(layer) == ["compiled"]
    assert compiling.compile_failure("cpu") is None and compiling.compile_failure("cuda") is not None


def test_recompile_limit_falls_back_per_call_and_says_so(fresh_dynamo):
    ref, fast = _pair(3, 4, 5, 3, impl="compiled")
    with torch._dynamo.config.patch(recompile_limit=1), pytest.warns(RuntimeWarning, match="recompile limit"):
        for batch in (8, 9, 10):  # three shapes, room for one
            x = _inputs(batch, 3, torch.float32)
            torch.testing.assert_close(fast(x), ref(x), rtol=1e-5, atol=1e-5)
    assert kernel_paths(fast) == ["compiled", "fast"]
    assert compiling.compile_failure("cpu") is None  # the device is not marked broken


CHILD = textwrap.dedent("""
    import json, sys, warnings
    import torch
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        from kanlib.model import KAN, compile_seconds, kernel_paths
        torch.manual_seed(0)
        model = KAN([3, 16, 16, 1])
        ref = KAN([3, 16, 16, 1], impl="reference")
        ref.load_state_dict(model.state_dict())
        x = torch.rand(64, 3) * 2 - 1
        for _ in range(3):
            model(x).square().mean().backward()
        err = (model(x) - ref(x)).abs().max().item()
    from torch._dynamo.utils import counters
    print(json.dumps({"paths": kernel_paths(model), "err": err, "compile_s": compile_seconds(),
                      "warnings": [str(w.message) for w in caught if "kanlib" in str(w.message)],
                      "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
                      "fx_miss": counters["inductor"]["fxgraph_cache_miss"]}))
""")


def _child(tmp_path, first_on_path: str | None = None, source: str = CHILD, args: tuple = (), **env):
    """Run ``source`` in a fresh Python (this checkout on its path, after ``first_on_path``) with ``args`` and
    ``env``; its last line of output, as JSON."""
    script = tmp_path / "child.py"
    script.write_text(source)
    path = [p for p in (first_on_path, str(REPO), os.environ.get("PYTHONPATH")) if p]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1", **env)
    out = subprocess.run([sys.executable, str(script), *args], env=full, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_no_compiler_falls_back_to_fast_with_one_warning(tmp_path):
    res = _child(tmp_path, CXX=str(tmp_path / "no-such-compiler"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "c"))
    assert res["paths"] == ["fast"]  # and not "compiled": the record must say what ran
    assert res["err"] < 1e-5
    assert len(res["warnings"]) == 1 and "torch.compile unavailable on cpu" in res["warnings"][0]
    assert "\n" not in res["warnings"][0]


@pytest.mark.slow
def test_second_process_loads_compiled_kernels_from_the_cache(tmp_path):
    cache = str(tmp_path / "inductor")
    first = _child(tmp_path, TORCHINDUCTOR_CACHE_DIR=cache)
    second = _child(tmp_path, TORCHINDUCTOR_CACHE_DIR=cache)
    assert first["paths"] == second["paths"] == ["compiled"]
    assert first["fx_miss"] > 0 and first["fx_hit"] == 0
    assert second["fx_miss"] == 0 and second["fx_hit"] == first["fx_miss"]  # nothing compiled again
    assert second["err"] < 1e-5


@pytest.mark.slow
def test_compiled_kernels_build_where_torch_and_the_cache_live_under_paths_with_spaces(tmp_path):
    """torch's inductor splits its compiler command line on whitespace: from a clone at "/tmp/new user/kanlib"
    (its virtual environment inside) every run of a default study ran the eager fast path. Here torch is
    imported through a folder with a space (a symbolic link to the installed package) and the cache has one."""
    site = tmp_path / "my projects" / "site"
    site.mkdir(parents=True)
    os.symlink(os.path.dirname(torch.__file__), site / "torch")
    cache = tmp_path / "inductor cache"
    check = subprocess.run([sys.executable, "-c", "import torch; print(torch.__file__)"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(site)), timeout=120)
    assert check.stdout.startswith(str(site)), check.stdout + check.stderr  # the space is in torch's own path
    res = _child(tmp_path, first_on_path=str(site), TORCHINDUCTOR_CACHE_DIR=str(cache))
    assert res["paths"] == ["compiled"], res["warnings"]
    assert res["warnings"] == [] and res["err"] < 1e-5
    assert res["fx_miss"] > 0 and any(cache.iterdir())  # compiled into the cache asked for, through its alias


DDP_CHILD = textwrap.dedent("""
    import json, sys, warnings
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    warnings.simplefilter("always")
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    from kanlib.model import KAN, kernel_paths
    with warnings.catch_warnings(record=True) as caught:
        model = DDP(KAN([4, 16, 1]), bucket_cap_mb=float(sys.argv[2]))
        x = torch.rand(64, 4) * 2 - 1
        model(x).sum().backward()
    print(json.dumps({"paths": kernel_paths(model), "active": DDP._get_active_ddp_module() is not None,
                      "warnings": [str(w.message) for w in caught if "kanlib" in str(w.message)]}))
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.parametrize("bucket_cap_mb", [0.01, 25.0])
def test_kernels_first_compiled_inside_a_ddp_forward_compile_whatever_the_bucket_size(tmp_path, bucket_cap_mb):
    """Inside a DDP forward dynamo compiles through its DDPOptimizer, which refused buckets below 1 MiB: the first
    run of the communication study's 0.01 MiB buckets turned compiling off for its whole worker group."""
    res = _child(tmp_path, source=DDP_CHILD, args=(str(tmp_path / "store"), str(bucket_cap_mb)),
                 TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert res == {"paths": ["compiled"], "active": False, "warnings": []}


def test_prepare_compile_is_idempotent_and_leaves_compiling_working(fresh_dynamo):
    compiling.prepare_compile("cpu", background=False)
    compiling.prepare_compile("cpu")  # already done: no second thread
    assert "cpu" in compiling._PREPARING and compiling._PREPARING["cpu"] is None
    ref, fast = _pair(2, 3, 4, 2, impl="compiled")
    x = _inputs(16, 2, torch.float32)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-5, atol=1e-5)
    assert kernel_paths(fast) == ["compiled"]


def test_isa_load_probes_are_remembered_per_host_and_failures_are_not(tmp_path, monkeypatch):
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor cache"))
    calls = []

    def fake_probe(self, output_path):  # the child-Python dlopen that every process pays
        calls.append(output_path)
        return "good" in output_path

    monkeypatch.setattr(cpu_vec_isa.VecISA, "_probe_load", fake_probe)
    compiling.remember_isa_probes()
    compiling.remember_isa_probes()  # idempotent: wraps once
    good, bad = tmp_path / "good.so", tmp_path / "bad.so"
    good.write_bytes(b"")
    bad.write_bytes(b"")
    isa = cpu_vec_isa.VecISA()
    assert [isa._probe_load(str(good)) for _ in range(3)] == [True] * 3
    assert [isa._probe_load(str(bad)) for _ in range(2)] == [False] * 2
    assert calls == [str(good), str(bad), str(bad)]  # a success is probed once, a failure every time
    store = tmp_path / "inductor cache" / compiling.ISA_PROBES_NAME
    assert list(json.loads(store.read_text()).values()) == [True]
    good.unlink()  # the library is gone (cache cleaned): probed again, never trusted blindly
    isa._probe_load(str(good))
    assert calls[-1] == str(good) and len(calls) == 4


def test_reading_compile_time_waits_for_the_background_preparation():
    """A fresh process that starts prepare_compile's thread and at once reads dynamo's compile time (what
    every compiled run does at start) must not deadlock on Python's module locks (CI saw a
    ``_DeadlockError`` from torch._inductor's import in that race)."""
    code = (
        "from kanlib import compiling, model\n"
        "compiling.prepare_compile('cpu')\n"
        "print(model.compile_seconds())\n"
    )
    for _ in range(3):
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert float(out.stdout.strip()) == 0.0


@pytest.mark.slow
@pytest.mark.usefixtures("no_process_left")
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_recipe_on_adaptive_grids_runs_no_reference_step(tmp_path, impl):
    """pykan's recipe through the trainer (L-BFGS, grid updates every 2 steps with grid_eps=0.02, grid 5 -> 10):
    the knots stop being uniform at the first update, and every step still runs the fast kernels, as the
    record's per-path step counts say."""
    from runners.launch import run

    cfg = RunConfig(study="recipe", optimizer="lbfgs", lr=1.0, widths=(2, 5, 1), grid_size=5, steps=6,
                    warmup_steps=2, n_train=256, n_val=256, global_batch=256, lbfgs_max_iter=5, eval_every=1,
                    grid_extension=(10,), grid_update_every=2, device="cpu", backend="gloo", threads=1,
                    kan_impl=impl, out_dir=str(tmp_path))
    rec = run(cfg, echo=False, timeout_s=600)
    assert rec["n_grid_updates"] == 2 and rec["final_grid_size"] == 10  # updates at steps 2 and 5, extension at 3
    assert rec["kan_path"] == impl and rec["kan_path_steps"] == {impl: 6}
    state = torch.load(os.path.join(cfg.run_dir(), "model.pt"))
    grids = [v for k, v in state.items() if k.endswith("grid")]
    assert grids and all(fast_kan.uniform_grid(g, 3) is None for g in grids)  # adaptive knots at the end
