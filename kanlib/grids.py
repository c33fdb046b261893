"""The spline grids between training steps: grid extension and pykan's grid-update schedule.

A run trains at ``grid_size``, then at each size of ``grid_extension`` in turn: the *grid stages*, starting at
step 0 and at ``grid_extension_steps`` (or at ``steps`` split evenly, :func:`stage_starts`). At the start of a
stage every layer's splines are refit onto the finer grid by least squares on the step's global batch, all
ranks' samples (:func:`kanlib.model.refine_distributed`): the function is kept, the parameters are new tensors
of the new size, so the trainer wraps the model again (new DDP buckets, new FSDP shards) and makes a new
optimizer (pykan starts a new ``fit`` per grid size). Within each stage the grids are refit to the data every
``grid_update_every`` steps until step ``grid_update_until`` of the stage (pykan: every 5 steps of the first
50 of each ``fit``), except at the run's very first step (:func:`update_due` says why).

The grid size a step trains at depends only on the config and the step: a run resumed from a checkpoint
written after a switch loads the finer model (``KANLinear`` resizes itself to the state it loads), and one
resumed from before a switch refines at the same step, on the same batch, as the uninterrupted run.
"""

from __future__ import annotations

import bisect

import torch

from kanlib.metrics import reset_peak_memory
from kanlib.model import grid_size_of, refine_distributed, update_grid_distributed


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
