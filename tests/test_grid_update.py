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

from kanlib.model import KAN, KANLinear, update_grid_distributed

REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from kanlib.model import KAN, update_grid_distributed

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
