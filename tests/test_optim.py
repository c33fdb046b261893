"""kanlib.optim.LBFGS: pykan's L-BFGS (torch's algorithm, pykan's settings), its first evaluation taken from the
caller, its reductions over shards, and the config fields that choose it."""

from __future__ import annotations

import math

import pytest
import torch

from kanlib.config import ConfigError, RunConfig
from kanlib.model import KAN
from kanlib.optim import PYKAN_DEFAULTS, LBFGS, _Ops


def _problem(seed: int = 0):
    """A float64 [2, 5, 1] KAN and 400 samples of exp(sin(pi x1) + x2^2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(400, 2, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.exp(torch.sin(math.pi * x[:, 0]) + x[:, 1] ** 2).unsqueeze(1)
    torch.manual_seed(seed)
    return KAN([2, 5, 1], impl="reference").double(), x, y


def _closure(model, x, y, opt=None):
    def closure():
        if opt is not None:
            opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss.detach()
    return closure


def test_pykan_defaults_are_pykans_fit_settings():
    opt = LBFGS(KAN([2, 3, 1]).parameters())
    group = opt.param_groups[0]
    # MultKAN.fit(opt="LBFGS"): lr=1, history_size=10, strong Wolfe, tolerances 1e-32; max_iter 20, max_eval 25
    assert {k: group[k] for k in PYKAN_DEFAULTS} == PYKAN_DEFAULTS
    assert PYKAN_DEFAULTS == dict(lr=1.0, max_iter=20, max_eval=25, history_size=10, tolerance_grad=1e-32,
                                  tolerance_change=1e-32, tolerance_ys=1e-32)


def test_same_iterates_as_torch_lbfgs_with_pykans_settings():
    """torch's LBFGS differs from pykan's only in its fixed ys threshold (1e-10 against 1e-32), which no pair of
    this problem falls between: the iterates must be equal to the bit."""
    ours, x, y = _problem()
    ref, _, _ = _problem()
    opt = LBFGS(ours.parameters())
    topt = torch.optim.LBFGS(ref.parameters(), lr=1.0, max_iter=20, history_size=10, line_search_fn="strong_wolfe",
                             tolerance_grad=1e-32, tolerance_change=1e-32)
    for _ in range(4):
        a = opt.step(_closure(ours, x, y))
        b = topt.step(_closure(ref, x, y, topt))
        assert a == float(b)
        assert 1 < opt.last_evals <= 25
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert opt.state[opt._params[0]]["func_evals"] == topt.state[topt._params[0]]["func_evals"]


def test_first_evaluation_from_the_caller_is_the_same_step():
    """step(closure, loss=...) takes the loss and .grad of the caller's forward and backward instead of calling
    the closure first: same iterates, one closure call fewer."""
    a, x, y = _problem(1)
    b, _, _ = _problem(1)
    oa, ob = LBFGS(a.parameters()), LBFGS(b.parameters())
    calls = {"a": 0, "b": 0}

    def counted(model, key):
        inner = _closure(model, x, y)

        def closure():
            calls[key] += 1
            return inner()
        return closure

    for _ in range(3):
        oa.step(counted(a, "a"))
        b.zero_grad()
        first = _closure(b, x, y)()
        ob.step(counted(b, "b"), loss=float(first))
        assert oa.last_evals == ob.last_evals
    assert calls["a"] == calls["b"] + 3
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_reductions_over_shards_give_the_unsharded_scalars():
    """Under FSDP every scalar of the algorithm is a reduction over the ranks' shards: the sum of the shards'
    dot products and sums, the max of their maxima, the same numbers one vector would give."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(11, generator=g, dtype=torch.float64), torch.randn(11, generator=g, dtype=torch.float64)
    shards = [(a[:6], b[:6]), (a[6:], b[6:])]

    class TwoRanks:
        """Each call returns the reduction of this rank's value with the other rank's (run in lockstep)."""

        def __init__(self):
            self.other = iter([])

        def __call__(self, t, op):
            o = next(self.other)
            return t + o if op == "sum" else torch.maximum(t, o)

    ops = _Ops(TwoRanks())
    local = _Ops(None)
    ops.all_reduce.other = iter([shards[1][0].dot(shards[1][1]), shards[1][0].abs().max(), shards[1][0].abs().sum()])
    assert ops.dot(*shards[0]) == pytest.approx(float(local.dot(a, b)), rel=1e-15)
    assert float(ops.abs_max(shards[0][0])) == float(local.abs_max(a))
    assert ops.abs_sum(shards[0][0]) == pytest.approx(float(local.abs_sum(a)), rel=1e-15)
    assert float(local.abs_max(a[:0])) == 0.0  # an empty shard (FSDP pads small parameters) reduces as 0


def test_lbfgs_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    model, x, y = _problem(2)
    opt = LBFGS(model.parameters())
    opt.step(_closure(model, x, y))
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    twin, _, _ = _problem(2)
    twin.load_state_dict(model.state_dict())
    opt2 = LBFGS(twin.parameters())
    opt2.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    for _ in range(2):
        opt.step(_closure(model, x, y))
        opt2.step(_closure(twin, x, y))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_config_fields_of_the_recipe():
    cfg = RunConfig(task="exp_sin", widths=(2, 5, 1))
    assert (cfg.optimizer, cfg.lr, cfg.lbfgs_max_iter, cfg.lbfgs_history) == ("lbfgs", 1.0, 20, 10)
    assert cfg.global_batch == cfg.n_train  # full batch, as pykan's fit
    with pytest.raises(ConfigError, match="^comm_hook: optimizer='lbfgs' needs"):
        RunConfig(comm_hook="noop", nproc_per_node=2)
    with pytest.raises(ConfigError, match="^comm_hook: optimizer='lbfgs' needs"):
        RunConfig(comm_hook="powersgd", nproc_per_node=2)
    RunConfig(comm_hook="noop", nproc_per_node=2, optimizer="adam")  # Adam's noop twin stays possible
    with pytest.raises(ConfigError, match="^lbfgs_max_iter: must be positive"):
        RunConfig(lbfgs_max_iter=0)
    with pytest.raises(ConfigError, match="^grid_extension: each size must be finer"):
        RunConfig(grid_extension=(10, 8))
    with pytest.raises(ConfigError, match="^grid_extension: each size must be finer"):
        RunConfig(grid_size=5, grid_extension=(5,))
    with pytest.raises(ConfigError, match="^grid_extension: grid extension refines B-spline grids"):
        RunConfig(model="mlp", grid_extension=(10,))
    with pytest.raises(ConfigError, match="^grid_extension_steps: one start step per grid_extension size"):
        RunConfig(grid_extension=(10, 20), grid_extension_steps=(10,))
    with pytest.raises(ConfigError, match=r"^grid_extension_steps: need 0 < s1 < s2 < ... < steps=30"):
        RunConfig(grid_extension=(10, 20), grid_extension_steps=(10, 30))
    with pytest.raises(ConfigError, match="^steps: 2 steps cannot be split between 3 grid sizes"):
        RunConfig(grid_extension=(10, 20), steps=2, warmup_steps=0)
    assert RunConfig.from_cli(["--grid_extension=10,20", "--grid_extension_steps=10,20"]).grid_extension == (10, 20)


def _cliff(w: torch.Tensor) -> torch.Tensor:
    """sum((w - 3)^2) where every |w_i| <= 5, NaN beyond (a loss that overflows past a point, as a KAN's logits do
    when a step is far too long)."""
    loss = ((w - 3) ** 2).sum()
    return torch.where((w.abs() > 5).any(), torch.full_like(loss, math.nan), loss)


def test_line_search_backs_off_from_a_non_finite_trial():
    """The first trial step lands where the loss is NaN (t = lr / |g|_1 = 1: w = 6). torch's line search
    extrapolated from it (every comparison with NaN is false) and its cubic through it gave a NaN step; kanlib's
    counts it as overshooting and bisects back to finite points: the loss falls, nothing is NaN."""
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = LBFGS([w], lr=12.0, max_iter=5)

    def closure():
        loss = _cliff(w)
        loss.backward()
        return loss.detach()

    first = opt.step(closure)
    assert first == 18.0
    w_now = w.detach()
    assert bool(torch.isfinite(w_now).all()) and float(w_now.abs().max()) <= 5, w_now
    after = float(_cliff(w_now))
    assert math.isfinite(after) and after < first
    for _ in range(3):
        opt.step(closure)
    assert float(_cliff(w.detach())) < 1e-12  # the minimum w = (3, 3), inside the cliff


def test_cubic_interpolation_through_an_infinite_loss_is_the_middle():
    from torch.optim.lbfgs import _cubic_interpolate as torch_cubic

    from kanlib.optim import _cubic_interpolate

    assert math.isnan(torch_cubic(0.0, 1.0, torch.tensor(-2.0), 1.0, math.inf, torch.tensor(-1.0)))
    assert _cubic_interpolate(0.0, 1.0, torch.tensor(-2.0), 1.0, math.inf, torch.tensor(-1.0)) == 0.5
    assert _cubic_interpolate(0.0, 1.0, torch.tensor(-2.0), 1.0, math.inf, torch.tensor(math.nan)) == 0.5
    # finite ends: torch's minimiser, unchanged
    finite = (0.0, 1.0, torch.tensor(-2.0), 1.0, 0.5, torch.tensor(1.0))
    assert _cubic_interpolate(*finite) == torch_cubic(*finite)


def test_no_curvature_pair_spans_two_batches():
    """A mini-batch step's first gradient is of other samples than the last step's last one: their difference is
    the batches' difference, not curvature (its pair scaled the next steps by up to 7e5 on digits and led the line
    search to losses of 1e25). With new_batch=True that pair is not formed; pairs within a step are."""
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(64, 2, generator=g, dtype=torch.float64) for _ in range(2)]
    model = torch.nn.Linear(2, 1).double()

    def closure_of(x):
        def closure():
            loss = ((model(x) - x.sum(1, keepdim=True) ** 2) ** 2).mean()
            loss.backward()
            return loss.detach()
        return closure

    opt = LBFGS(model.parameters(), max_iter=1)  # one iteration a step: a pair can only span two steps
    opt.step(closure_of(batches[0]))
    opt.step(closure_of(batches[1]), new_batch=True)
    assert opt.state[opt._params[0]]["old_dirs"] == []
    opt.step(closure_of(batches[1]))  # the same batch again: its pair is curvature, kept
    assert len(opt.state[opt._params[0]]["old_dirs"]) == 1
