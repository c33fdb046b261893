"""Data-adaptive grid update: the layer function is kept, and under DDP all ranks end identical."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kanlib.grids import update_grid_distributed
from kanlib.model import KAN, KANLinear

REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from kanlib.grids import update_grid_distributed
    from kanlib.model import KAN

    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # same initial model on every rank, as DDP would broadcast
    model = KAN([3, 8, 2], impl="fast")
    g = torch.Generator().manual_seed(100 + rank)
    n = 300 if rank == 0 else 170  # unequal per-rank batches
    x = torch.randn(n, 3, generator=g) * (0.4 + 0.3 * rank) + 0.2 * rank  # different distributions
    with torch.no_grad():
        update_grid_distributed(model, x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"state": state, "x": x}, f"{out_dir}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_update_grid_keeps_function_in_range():
    torch.manual_seed(0)
    model = KAN([3, 8, 2], impl="fast")
    x = torch.randn(500, 3) * 0.5 + 0.3
    probe = x[:100] * 0.9 + 0.03  # inside the data range
    before = model(probe)
    grids_before = [layer.grid.clone() for layer in model.layers]
    model.update_grid(x)
    after = model(probe)
    for old, layer in zip(grids_before, model.layers):
        assert not torch.equal(old, layer.grid)  # the knots did move to the data
    err = (after - before).abs().max().item()
    assert err < 5e-3 * before.abs().max().item() + 1e-4, f"function changed by {err:.3g}"
    # The refit grid brackets the data of the first layer: quantile-dominated interior knots.
    g = model.layers[0].grid
    k = model.layers[0].spline_order
    assert torch.all(g[:, k] <= x.min(0).values) and torch.all(g[:, -k - 1] >= x.max(0).values)


def test_update_grid_uniform_eps_keeps_fast_path():
    layer = KANLinear(2, 3, impl="fast", grid_eps=1.0)
    layer.update_grid(torch.randn(200, 2))
    assert layer.grid_is_uniform
    layer = KANLinear(2, 3, impl="fast", grid_eps=0.02)
    layer.update_grid(torch.randn(200, 2))
    assert not layer.grid_is_uniform


def test_update_grid_rejects_bad_input():
    layer = KANLinear(2, 3)
    with pytest.raises(ValueError, match=r"update_grid expects \(batch, 2\) inputs"):
        layer.update_grid(torch.zeros(10, 3))
    with pytest.raises(ValueError, match="at least 2 samples"):
        layer.update_grid(torch.zeros(1, 2))
    with pytest.raises(TypeError, match="needs a KAN or KANLinear"):
        update_grid_distributed(torch.nn.Linear(2, 2), torch.zeros(4, 2))


def test_update_grid_distributed_without_process_group_is_local_update():
    torch.manual_seed(0)
    a = KAN([2, 4, 1])
    b = KAN([2, 4, 1])
    b.load_state_dict(a.state_dict())
    x = torch.randn(64, 2)
    update_grid_distributed(a, x)
    b.update_grid(x)
    for (name, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), name


@pytest.mark.slow
def test_update_grid_two_gloo_ranks_agree(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert r0["state"].keys() == r1["state"].keys()
    for name in r0["state"]:
        assert torch.equal(r0["state"][name], r1["state"][name]), f"{name} differs between ranks"

    # The ranks' result is the update on the union of both batches, and it keeps the function.
    torch.manual_seed(0)
    init = KAN([3, 8, 2], impl="fast")
    x_all = torch.cat([r0["x"], r1["x"]])
    single = KAN([3, 8, 2], impl="fast")
    single.load_state_dict(init.state_dict())
    single.update_grid(x_all)
    for name, v in single.state_dict().items():
        torch.testing.assert_close(r0["state"][name], v, rtol=1e-5, atol=1e-6, msg=name)
    updated = KAN([3, 8, 2], impl="fast")
    updated.load_state_dict(r0["state"])
    lo, hi = x_all.min(0).values, x_all.max(0).values
    probe = lo + (hi - lo) * torch.rand(200, 3, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before, after = init(probe), updated(probe)
    err = (after - before).abs().max().item()
    assert err < 1e-2 * before.abs().max().item() + 1e-4, f"function changed by {err:.3g}"
    # Grids were really refit (else the equality above would be trivial).
    assert not torch.equal(init.layers[0].grid, updated.layers[0].grid)


# -- grid extension: KANLinear.refine, KAN.refine, refine_distributed --------------------------------------
def _adapted_layer(seed: int = 0):
    """A float64 layer with random splines on a data-adapted (non-uniform) grid, and its 800 input samples."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = KANLinear(3, 4, grid_size=5, impl="reference").double()
    with torch.no_grad():
        layer.spline_weight.normal_(generator=g)
    x = torch.randn(800, 3, generator=g, dtype=torch.float64) * 0.5
    layer.update_grid(x)
    return layer, x, g


def test_refine_keeps_the_function_within_the_refit_error():
    for size, nested in ((10, True), (13, False)):
        layer, x, g = _adapted_layer()
        lo, hi = x.min(0).values, x.max(0).values
        probe = lo + (hi - lo) * torch.rand(300, 3, generator=g, dtype=torch.float64)  # unseen, inside the data
        with torch.no_grad():
            before, probe_before = layer(x), layer(probe)
        err = layer.refine(x, size)
        with torch.no_grad():
            after, probe_after = layer(x), layer(probe)
        assert layer.grid_size == size and layer.grid.shape == (3, size + 7)
        assert layer.spline_weight.shape == (4, 3, size + 3)
        moved = (after - before).square().mean().sqrt().item()
        moved_probe = (probe_after - probe_before).square().mean().sqrt().item()
        if nested:  # a grid twice as fine holds every knot: the spline is represented exactly
            assert err < 1e-12 and moved < 1e-12 and moved_probe < 1e-12, (err, moved, moved_probe)
        else:  # the error is the least-squares residual: exactly what moved at the samples, no more between them
            assert 1e-6 < err < 0.05 * before.abs().max().item()
            assert moved == pytest.approx(err, rel=1e-9)
            assert moved_probe <= 1.5 * err, (moved_probe, err)


def test_refined_model_keeps_its_function_and_its_fast_path():
    from kanlib.model import grid_size_of, kernel_paths, reset_kernel_paths

    torch.manual_seed(0)
    model = KAN([2, 5, 1], impl="fast", grid_eps=1.0)
    x = torch.rand(1000, 2) * 2 - 1
    with torch.no_grad():
        for layer in model.layers:
            layer.spline_weight.normal_()
    model.update_grid(x)  # uniform knots around every layer's inputs (outside them refining is not exact)
    with torch.no_grad():
        before = model(x)
    for size in (10, 20):
        err = model.refine(x, size)
        assert err < 1e-6, err
    reset_kernel_paths(model)
    with torch.no_grad():
        after = model(x)
    assert grid_size_of(model) == 20 and kernel_paths(model) == ["fast"]  # a uniform grid refines uniformly
    assert (after - before).abs().max().item() < 1e-5 * before.abs().max().item()


def test_a_state_of_another_grid_size_loads():
    """A checkpoint written after a grid extension loads into the model the run builds at grid_size."""
    torch.manual_seed(0)
    fine = KAN([2, 4, 1], impl="fast")
    fine.refine(torch.rand(200, 2) * 2 - 1, 10)
    coarse = KAN([2, 4, 1], impl="fast")
    coarse.load_state_dict(fine.state_dict())
    x = torch.rand(50, 2) * 2 - 1
    with torch.no_grad():
        assert torch.equal(coarse(x), fine(x))
    assert [layer.grid_size for layer in coarse.layers] == [10, 10]


def test_grid_schedule():
    from kanlib.config import RunConfig
    from kanlib.grids import grid_size_at, stage_starts, update_due

    even = RunConfig(steps=150, grid_extension=(10, 20), grid_update_every=5, grid_update_until=30)
    assert stage_starts(even) == [0, 50, 100]
    assert [grid_size_at(even, s) for s in (0, 49, 50, 99, 100, 149)] == [5, 5, 10, 10, 20, 20]
    updates = [s for s in range(150) if update_due(even, s)]
    # every 5 steps of each stage's first 30, never at a stage's first step (module docstring of kanlib.grids)
    assert updates == [5, 10, 15, 20, 25, 55, 60, 65, 70, 75, 105, 110, 115, 120, 125]
    explicit = RunConfig(steps=40, grid_extension=(10,), grid_extension_steps=(12,), grid_update_every=4)
    assert stage_starts(explicit) == [0, 12]
    assert [s for s in range(40) if update_due(explicit, s)] == [4, 8, 16, 20, 24, 28, 32, 36]
    plain = RunConfig(steps=16, grid_update_every=5)  # the trainer's schedule before grid stages: unchanged
    assert [s for s in range(16) if update_due(plain, s)] == [5, 10, 15]
    assert not any(update_due(RunConfig(steps=16), s) for s in range(16))


def _lbfgs_fit(seed: int, update_steps, steps: int = 20, n: int = 500):
    """Test RMSE of [2, 5, 1] on exp_sin after ``steps`` full-batch L-BFGS steps with grid updates before the
    given steps, and the fraction of hidden activations outside the output layer's knots after the first step."""
    import math

    from kanlib.optim import LBFGS

    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2 * n, 2, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.exp(torch.sin(math.pi * x[:, 0]) + x[:, 1] ** 2).unsqueeze(1)
    xt, yt, xv, yv = x[:n], y[:n], x[n:], y[n:]
    torch.manual_seed(seed)
    model = KAN([2, 5, 1], impl="reference").double()
    opt = LBFGS(model.parameters())

    def closure():
        loss = torch.nn.functional.mse_loss(model(xt), yt)
        loss.backward()
        return loss.detach()

    outside = None
    for s in range(steps):
        if s in update_steps:
            model.update_grid(xt)
        opt.step(closure)
        if s == 0:
            with torch.no_grad():
                h, grid = model.layers[0](xt), model.layers[1].grid
                outside = ((h < grid[:, 3]) | (h > grid[:, -4])).double().mean().item()
    with torch.no_grad():
        return math.sqrt(torch.nn.functional.mse_loss(model(xv), yv).item()), outside


def test_a_grid_update_before_the_first_step_is_what_hurt_lbfgs():
    """Issue 26: updates every 5 steps *from step 0* (pykan's schedule) made L-BFGS fits worse than none. The
    step-0 refit fits the output layer's knots to the initial hidden activations; the first L-BFGS step spreads
    them several times wider, leaving about half outside the knots (zero spline), and the fit never recovers.
    kanlib's schedule (kanlib.grids.update_due: never at step 0) fits as well as no update."""
    from kanlib.config import RunConfig
    from kanlib.grids import update_due

    schedule = [s for s in range(20) if update_due(RunConfig(steps=20, grid_update_every=5), s)]
    assert schedule == [5, 10, 15]
    # one thread: float reductions in one order, so the ratios below do not move with the machine's load
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _compare_schedules(schedule)
    finally:
        torch.set_num_threads(threads)


def _compare_schedules(schedule) -> None:
    for seed in (0, 1):
        none, out_none = _lbfgs_fit(seed, ())
        at_zero, out_zero = _lbfgs_fit(seed, range(0, 20, 5))
        ours, out_ours = _lbfgs_fit(seed, schedule)
        assert out_zero > 0.3 and out_none < 0.2 and out_ours == out_none, (out_zero, out_none, out_ours)
        # worse by 9.3x and 2.4-2.5x here (seeds 0, 1; seed 1 moved between 2.40x and 2.46x run to run), where the
        # issue measured 1.3-3.6x: the margin is the cause's, not one host's rounding
        assert at_zero > 1.5 * none and at_zero > 1.5 * ours, (seed, at_zero, none, ours)
        assert ours < 1.5 * none, (seed, ours, none)


REFINE_WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from kanlib.grids import refine_distributed
    from kanlib.model import KAN

    out_dir, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = KAN([3, 8, 2], impl="fast")
    g = torch.Generator().manual_seed(100 + rank)
    n = 300 if rank == 0 else 170  # unequal per-rank batches of different distributions
    x = torch.rand(n, 3, generator=g) * (1.2 + 0.4 * rank) - 0.6 - 0.1 * rank
    if mode == "fsdp":
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    plain, err = refine_distributed(model, x, 10)
    if mode == "fsdp":  # shard the refined model again, as the trainer does, and read it back whole
        for layer in plain.layers:
            fully_shard(layer)
        fully_shard(plain)
    state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
             for k, v in plain.state_dict().items()}
    torch.save({"state": state, "x": x, "err": err}, f"{out_dir}/{mode}{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_refine_on_two_gloo_ranks_leaves_them_equal(tmp_path, mode):
    """Grid extension under DDP (a replicated model) and FSDP (a sharded one): both ranks end with bitwise the
    same model of the new size, the refinement of the union of their batches."""
    script = tmp_path / "worker.py"
    script.write_text(REFINE_WORKER)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), mode],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    r0, r1 = torch.load(tmp_path / f"{mode}0.pt"), torch.load(tmp_path / f"{mode}1.pt")
    for name in r0["state"]:
        assert torch.equal(r0["state"][name], r1["state"][name]), f"{name} differs between ranks"
    assert r0["state"]["layers.0.spline_weight"].shape == (8, 3, 13)
    torch.manual_seed(0)
    single = KAN([3, 8, 2], impl="fast")
    single.refine(torch.cat([r0["x"], r1["x"]]), 10)
    for name, v in single.state_dict().items():
        torch.testing.assert_close(r0["state"][name], v, rtol=1e-5, atol=1e-6, msg=name)
