"""The four experiments of the study, each a function returning the list of RunConfigs to run.

Every point is repeated ``repeats`` times (separate processes, ``repeat`` = 0..repeats-1).
``base`` carries everything a study does not vary (model, task, steps, out_dir, ...).
"""

from __future__ import annotations

from kanlib.config import ConfigError, RunConfig


def _split(world_size: int, procs_per_node: int | None) -> tuple[int, int]:
    """World size as nodes x processes per node (all on one node unless ``procs_per_node`` > 0)."""
    if not procs_per_node:
        return 1, world_size
    if world_size % procs_per_node and world_size > procs_per_node:
        raise ConfigError(f"procs_per_node: world size {world_size} is not a multiple of {procs_per_node}")
    return max(1, world_size // procs_per_node), min(world_size, procs_per_node)


def _repeat(cfgs: list[RunConfig], repeats: int) -> list[RunConfig]:
    if repeats <= 0:
        raise ConfigError(f"repeats: must be positive, got {repeats}")
    return [c.replace(repeat=r) for r in range(repeats) for c in cfgs]


def strong_scaling(world_sizes, base: RunConfig, repeats: int = 1, procs_per_node: int | None = None):
    """Fixed global batch (``base.global_batch``), growing world size."""
    cfgs = []
    for n in world_sizes:
        nodes, ppn = _split(n, procs_per_node)
        cfgs.append(base.replace(study="strong_scaling", nnodes=nodes, nproc_per_node=ppn))
    return _repeat(cfgs, repeats)


def weak_scaling(world_sizes, base: RunConfig, per_process_batches=(64,), repeats: int = 1,
                 procs_per_node: int | None = None):
    """Fixed per-process batch, growing world size (global batch = per-process batch x N)."""
    cfgs = []
    for b in per_process_batches:
        for n in world_sizes:
            nodes, ppn = _split(n, procs_per_node)
            cfgs.append(base.replace(study="weak_scaling", nnodes=nodes, nproc_per_node=ppn,
                                     global_batch=b * n, n_train=max(base.n_train, b * n)))
    return _repeat(cfgs, repeats)


def communication(world_sizes, base: RunConfig, bucket_caps_mb=(25.0,), nccl_algos=("",), repeats: int = 1,
                  procs_per_node: int | None = None):
    """For each world size, bucket size and NCCL algorithm: one run with the timed all-reduce and
    one with the no-op hook, so exposed communication = T_allreduce - T_noop (kanlib.results)."""
    cfgs = []
    for algo in nccl_algos:
        for cap in bucket_caps_mb:
            for n in world_sizes:
                nodes, ppn = _split(n, procs_per_node)
                for hook in ("timed", "noop"):
                    cfgs.append(base.replace(study="communication", nnodes=nodes, nproc_per_node=ppn,
                                             bucket_cap_mb=float(cap), nccl_algo=algo, comm_hook=hook))
    return _repeat(cfgs, repeats)


def model_size(width_list, base: RunConfig, grid_sizes=(5,), depths=None, with_mlp: bool = True,
               repeats: int = 1, world_size: int = 1):
    """A sweep over hidden width, depth and grid size; each KAN beside an MLP with a matched
    parameter count (kanlib.model.matched_mlp), same data and batch.

    ``width_list``: hidden widths; ``depths``: numbers of hidden layers (default: that of ``base``).
    """
    from kanlib.model import KAN, matched_mlp

    depths = depths or (len(base.widths) - 2,)
    d_in, d_out = base.widths[0], base.widths[-1]
    cfgs = []
    for depth in depths:
        for w in width_list:
            widths = (d_in, *([int(w)] * depth), d_out)
            for g in grid_sizes:
                kan = base.replace(study="model_size", model="kan", widths=widths, grid_size=int(g),
                                   nproc_per_node=world_size)
                cfgs.append(kan)
                if with_mlp:
                    mlp = matched_mlp(KAN(widths, grid_size=int(g), spline_order=base.spline_order))
                    cfgs.append(kan.replace(model="mlp", widths=tuple(mlp.widths), grid_size=base.grid_size))
    # an MLP matched to several grid sizes can repeat: keep each config once
    seen, unique = set(), []
    for c in cfgs:
        if c.run_key() not in seen:
            seen.add(c.run_key())
            unique.append(c)
    return _repeat(unique, repeats)
