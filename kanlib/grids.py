"""The spline grids between training steps: grid extension and pykan's grid-update schedule.

A run trains at ``grid_size``, then at each size of ``grid_extension`` in turn: the *grid stages*, starting at
step 0 and at ``grid_extension_steps`` (or at ``steps`` split evenly, :func:`stage_starts`). At the start of a
stage every layer's splines are refit onto the finer grid by least squares on the step's global batch, all
ranks' samples (:func:`refine_distributed`): the function is kept, the parameters are new tensors
of the new size, so the trainer wraps the model again (new DDP buckets, new FSDP shards) and makes a new
optimizer (pykan starts a new ``fit`` per grid size). Within each stage the grids are refit to the data every
``grid_update_every`` steps until step ``grid_update_until`` of the stage (pykan: every 5 steps of the first
50 of each ``fit``), except at the run's very first step (:func:`update_due` says why).

The grid size a step trains at depends only on the config and the step: a run resumed from a checkpoint
written after a switch loads the finer model (``KANLinear`` resizes itself to the state it loads), and one
resumed from before a switch refines at the same step, on the same batch, as the uninterrupted run.

The refits themselves are the layers' (:meth:`kanlib.model.KAN.update_grid`, :meth:`kanlib.model.KAN.refine`);
this module runs them across ranks (:func:`update_grid_distributed`, :func:`refine_distributed`): every rank
refits on the samples of all ranks, and the ranks end bitwise equal, under DDP and FSDP.
"""

from __future__ import annotations

import bisect

import torch
import torch.distributed as dist
from torch import nn

from kanlib.metrics import reset_peak_memory
from kanlib.model import KAN, KANLinear, grid_size_of


def stage_starts(cfg) -> list[int]:
    """The first step of each grid stage: ``[0]`` without grid extension, else ``[0, s_1, ...]`` (explicit
    ``grid_extension_steps``, or ``round(i * steps / stages)``)."""
    if not cfg.grid_extension:
        return [0]
    if cfg.grid_extension_steps:
        return [0, *cfg.grid_extension_steps]
    n = len(cfg.grid_extension) + 1
    return [round(i * cfg.steps / n) for i in range(n)]


def _stage(cfg, step: int) -> tuple[int, int]:
    """``(stage index, first step of the stage)`` of ``step``."""
    starts = stage_starts(cfg)
    i = bisect.bisect_right(starts, step) - 1
    return i, starts[i]


def grid_size_at(cfg, step: int) -> int:
    """The grid size step ``step`` trains at."""
    return (cfg.grid_size, *cfg.grid_extension)[_stage(cfg, step)[0]]


def update_due(cfg, step: int) -> bool:
    """Whether the grids are refit to the data before ``step``: at steps ``r = grid_update_every, 2 *
    grid_update_every, ...`` of each stage while ``r < grid_update_until`` (0: through the stage).

    Not at ``r = 0``. At the run's first step the hidden layers' inputs are those of the initialisation:
    on exp_sin with [2, 5, 1] they span about 0.4, and a few times that after the first L-BFGS step. A
    refit there (pykan's schedule updates at its step 0) fits the second layer's knots to that narrow
    range; the inputs then leave it, where the splines are zero, and the fit ends up to 10x worse than
    with no update at all (docs/measurement.md). At the start of a later stage the grid has just been
    refined onto the trained model's inputs, so a refit there would only move knots of an unchanged
    function.
    """
    every = cfg.grid_update_every
    if not every or cfg.model != "kan":
        return False
    r = step - _stage(cfg, step)[1]
    return r > 0 and r % every == 0 and (not cfg.grid_update_until or r < cfg.grid_update_until)


def before_step(run, step: int, x: torch.Tensor) -> bool:
    """The grid work due before ``step`` (every rank, with its shard ``x: (local_batch, in)`` of the step's
    batch; collective, not timed): extend the grid when the step starts a finer stage, then refit the grids
    to the data when :func:`update_due`. Returns True when the model's parameters were replaced (an extension):
    ``run.model`` is then an unwrapped model the caller wraps again and gives a new optimizer."""
    cfg = run.cfg
    if cfg.model != "kan":
        return False
    extended = False
    want = grid_size_at(cfg, step)
    have = grid_size_of(run.model)
    if have != want:
        run.model, err = refine_distributed(run.model, x, want)
        extended = True
        if run.info.is_main:
            print(f"kanlib: grid {have} -> {want} at step {step} (refit error {err:.3g}, RMS of the layers' "
                  f"output change on the batch)", flush=True)
    if update_due(cfg, step):
        update_grid_distributed(run.model, x)  # every rank ends bitwise equal
        run.n_grid_updates += 1
    if (extended or update_due(cfg, step)) and step >= run.measure_from:
        reset_peak_memory(run.info.device)  # the refit's float64 temporaries are not training memory
    return extended


# -- the grid work across ranks: every rank refits on all ranks' samples and ends bitwise equal --------
def _gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x: (n_rank, in)`` in rank order; row counts may differ by rank."""
    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s.item()) for s in sizes]
    padded = x.new_zeros(max(sizes), *x.shape[1:])
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0)  # (sum n_rank, in)


@torch.no_grad()
def update_grid_distributed(model: nn.Module, x: torch.Tensor, margin: float = 0.01) -> None:
    """Refit the spline grids of ``model`` to the inputs of all ranks; every rank ends identical.

    model: a :class:`KAN` or :class:`KANLinear` (or a DDP wrapper of one: its ``.module`` is
    used); x: ``(batch_rank, in)``, this rank's batch. With ``torch.distributed`` initialised
    and more than one rank, the batches of all ranks are all-gathered (their sizes may
    differ), every rank runs the same deterministic :meth:`KAN.update_grid` on the union, and
    the refit grids and spline weights are then broadcast from rank 0 so the ranks hold
    bitwise-equal parameters and buffers even if a kernel were not bitwise reproducible.
    Without distributed (or with one rank) it is ``model.update_grid(x, margin)``.
    Every rank must call it (collective). Call it inside or outside ``torch.no_grad``.
    """
    module = getattr(model, "module", model)
    if not hasattr(module, "update_grid"):
        raise TypeError(f"update_grid_distributed needs a KAN or KANLinear, got {type(module).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be (batch, in), got {tuple(x.shape)}")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    x_all = _gather_rows(x.detach()) if distributed else x.detach()
    if _sharded(module):
        _update_grid_sharded(module, x_all, margin)
        return
    module.update_grid(x_all, margin)
    if distributed:
        layers = [m for m in module.modules() if isinstance(m, KANLinear)]
        for layer in layers:
            dist.broadcast(layer.grid, src=0)
            dist.broadcast(layer.spline_weight.data, src=0)
            layer.refresh_grid()


@torch.no_grad()
def refine_distributed(model: nn.Module, x: torch.Tensor, grid_size: int) -> tuple[nn.Module, float]:
    """Grid extension on every rank: ``model`` onto grids of ``grid_size`` intervals (:meth:`KAN.refine`), fit on
    the inputs of all ranks; returns ``(plain, refit_error)``.

    model: a :class:`KAN` (or a DDP wrapper of one, or an FSDP-sharded one); x: ``(batch_rank, in)``, this
    rank's batch, all-gathered as in :func:`update_grid_distributed`. Every rank refits the same deterministic
    way on the union, then the refit parameters and grids are broadcast from rank 0, so the ranks end bitwise
    equal. The result ``plain`` is an unwrapped :class:`KAN` of the new size: the model itself (DDP, one
    process; its parameters replaced) or, under FSDP, a new one built from the gathered full parameters. Its
    parameters are new tensors: the caller wraps it again and makes a new optimizer. Collective.
    """
    module = getattr(model, "module", model)
    if not isinstance(module, KAN):
        raise TypeError(f"refine_distributed needs a KAN, got {type(module).__name__}")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    x_all = _gather_rows(x.detach()) if distributed else x.detach()
    plain = _plain_copy(module) if _sharded(module) else module
    err = plain.refine(x_all, grid_size)
    if distributed:
        for t in [*plain.parameters(), *plain.buffers()]:
            dist.broadcast(t.data, src=0)
        for layer in plain.layers:
            layer.refresh_grid()
    return plain, err


def _plain_copy(module: KAN) -> KAN:
    """An unsharded :class:`KAN` holding the full parameters and grids of an FSDP-sharded one (collective)."""
    from torch.distributed.tensor import DTensor

    first = module.layers[0]
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves the RNG as it was
        plain = KAN(module.widths, first.grid_size, first.spline_order, impl=first.impl, grid_eps=first.grid_eps,
                    standalone_scale_spline=first.spline_scaler is not None)
    plain = plain.to(first.grid.device, first.grid.dtype)
    for name, p in module.named_parameters():
        plain.get_parameter(name).copy_(p.full_tensor() if isinstance(p, DTensor) else p)
    for name, b in module.named_buffers():
        plain.get_buffer(name).copy_(b.full_tensor() if isinstance(b, DTensor) else b)
    for layer in plain.layers:
        layer.refresh_grid()
    return plain


def _sharded(module: nn.Module) -> bool:
    """Whether FSDP has sharded the parameters of ``module`` (they are DTensors)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())


@torch.no_grad()
def _update_grid_sharded(module: nn.Module, x: torch.Tensor, margin: float) -> None:
    """Grid update under FSDP: each layer's full parameters are gathered, refit by the same deterministic
    :meth:`KANLinear.update_grid` on a plain copy (inputs propagated through the refit layers as
    :meth:`KAN.update_grid` does), and every rank's shard is cut from rank 0's result (``distribute_tensor``
    scatters from rank 0), so the shards stay one consistent model. The grids are buffers, replicated by
    FSDP: every rank writes the same refit grid. Collective: every rank must call it."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    layers = [module] if isinstance(module, KANLinear) else [m for m in module.modules() if isinstance(m, KANLinear)]
    for layer in layers:
        full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in layer.named_parameters(recurse=False)}
        plain = KANLinear(layer.in_features, layer.out_features, layer.grid_size, layer.spline_order,
                          impl="reference", grid_eps=layer.grid_eps,
                          standalone_scale_spline=layer.spline_scaler is not None).to(x.device, full["base_weight"].dtype)
        for n, v in full.items():
            getattr(plain, n).copy_(v)
        plain.grid.copy_(layer.grid)
        plain.refresh_grid()
        plain.update_grid(x, margin)
        layer.grid.copy_(plain.grid)
        for n, p in layer.named_parameters(recurse=False):
            new = getattr(plain, n).detach()
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(new, p.device_mesh, p.placements).to_local())
            else:
                p.copy_(new)
        layer.refresh_grid()
        x = plain(x)  # the next layer's inputs come from this refit layer
