"""The DDP training loop: ``train(cfg) -> record``.

Entry point for torchrun: ``python -m kanlib.train --key=value ...`` (a single process when
RANK is unset). Rank 0 writes the run's folder ``out_dir/<study>/<run_key>/``: ``config.json``
first, ``steps.csv`` (one row per step, flushed as it comes), ``model.pt`` (final state_dict)
and last ``record.json`` (atomically; its presence marks the run complete).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from kanlib import results
from kanlib.config import RunConfig
from kanlib.data import make_dataset
from kanlib.distributed import DistInfo, setup, synchronize, teardown
from kanlib.metrics import (CommTimer, model_state_bytes, peak_memory_bytes, reset_peak_memory,
                            summarize, timed_allreduce_hook)
from kanlib.model import build_model, count_params

# Per-step quantities gathered from every rank at the end (column order of the gathered tensor).
_PHASES = ("step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_total_s", "loss")


def wrap_ddp(model: torch.nn.Module, cfg: RunConfig, info: DistInfo):
    """Wrap ``model`` in DDP as the config asks and register its communication hook.

    Returns ``(module, comm_timer)``; ``comm_timer`` is None unless ``comm_hook == 'timed'``.
    """
    if not info.distributed:
        return model, None
    ddp = DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph)
    timer = None
    if cfg.comm_hook == "timed":
        timer = CommTimer(info.device)
        ddp.register_comm_hook(timer, timed_allreduce_hook)
    elif cfg.comm_hook == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        ddp.register_comm_hook(None, noop_hook)
    return ddp, timer


def make_optimizer(model: torch.nn.Module, cfg: RunConfig):
    """The optimizer and its number of per-parameter state tensors (for memory accounting)."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr), 2
    return torch.optim.SGD(model.parameters(), lr=cfg.lr), 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device, chunk: int = 8192) -> float:
    """Mean squared error of ``model`` on ``(x, y)``, in chunks."""
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], chunk):
        xb, yb = x[i:i + chunk].to(device), y[i:i + chunk].to(device)
        total += F.mse_loss(model(xb).float(), yb, reduction="sum").item()
    model.train()
    return total / x.shape[0]


def train(cfg: RunConfig) -> dict | None:
    """Run one training run; rank 0 returns the record (other ranks return None)."""
    info = setup(cfg)
    try:
        return _train(cfg, info)
    finally:
        teardown(info)


def _train(cfg: RunConfig, info: DistInfo) -> dict | None:
    started_at = results.now_iso()
    run_dir = cfg.run_dir()
    if info.is_main:
        os.makedirs(run_dir, exist_ok=True)
        results.atomic_write_json(os.path.join(run_dir, results.CONFIG_NAME), cfg.to_dict())
        for stale in (results.RECORD_NAME, results.STEPS_NAME):  # a rerun of an incomplete run starts clean
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(run_dir, stale))

    torch.manual_seed(cfg.seed)  # identical initialisation on every rank (DDP also broadcasts)
    data = make_dataset(cfg)
    model = build_model(cfg).to(info.device)
    n_params = count_params(model)
    module, comm_timer = wrap_ddp(model, cfg, info)
    optimizer, n_opt_states = make_optimizer(model, cfg)
    autocast = torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    writer = results.StepWriter(os.path.join(run_dir, results.STEPS_NAME)) if info.is_main else None
    reset_peak_memory(info.device)

    per_step = torch.zeros(cfg.steps, len(_PHASES), dtype=torch.float64)
    clock = time.perf_counter
    for step in range(cfg.steps):
        x, y = data.shard(step, cfg.global_batch, info.rank, info.world_size)
        x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
        synchronize(info.device)
        t0 = clock()
        with autocast:
            out = module(x)
        loss = F.mse_loss(out.float(), y)
        synchronize(info.device)
        t1 = clock()
        loss.backward()
        synchronize(info.device)
        t2 = clock()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(info.device)
        t3 = clock()
        comm = comm_timer.step_total() if comm_timer is not None else float("nan")
        row = (t3 - t0, t1 - t0, t2 - t1, t3 - t2, comm, loss.item())
        per_step[step] = torch.tensor(row, dtype=torch.float64)
        if writer is not None:
            writer.write({"step": step, "measured": int(step >= cfg.warmup_steps),
                          **dict(zip(_PHASES, row))})
    if writer is not None:
        writer.close()

    # The slowest rank sets the pace: per step, the max of each time over ranks, the mean loss.
    if info.distributed:
        gathered = [torch.zeros_like(per_step) for _ in range(info.world_size)]
        dist.all_gather(gathered, per_step)
        stacked = torch.stack(gathered)  # (world, steps, phases)
        per_step = stacked.max(dim=0).values
        per_step[:, -1] = stacked[:, :, -1].mean(dim=0)
    peak_local, peak_kind = peak_memory_bytes(info.device)
    peak = torch.tensor([float(peak_local)], dtype=torch.float64)
    if info.distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    val_loss = evaluate(model, data.x_val, data.y_val, info.device)
    if not info.is_main:
        return None

    measured = per_step[cfg.warmup_steps:]
    step_stats = summarize(measured[:, 0].tolist())
    med = {name: summarize(measured[:, i].tolist())["median"] for i, name in enumerate(_PHASES)}
    torch.save(model.state_dict(), os.path.join(run_dir, "model.pt"))
    record = {
        **results.provenance(),
        "run_id": results.new_run_id(),
        "run_key": cfg.run_key(),
        **cfg.to_dict(),
        "config_backend": cfg.backend,
        "config_device": cfg.device,
        "world_size": info.world_size,
        "backend": info.backend or "none",
        "device": info.device.type,
        "started_at": started_at,
        "finished_at": results.now_iso(),
        "n_params": n_params,
        "model_state_bytes": model_state_bytes(model, n_opt_states),
        "n_measured_steps": int(measured.shape[0]),
        "step_time_s": step_stats["median"],
        "step_time_s_p10": step_stats["p10"],
        "step_time_s_p90": step_stats["p90"],
        "forward_s": med["forward_s"],
        "backward_s": med["backward_s"],
        "optimizer_s": med["optimizer_s"],
        "comm_total_s": med["comm_total_s"] if comm_timer is not None else None,
        "n_buckets": comm_timer.n_buckets if comm_timer is not None else None,
        "samples_per_s": cfg.global_batch / step_stats["median"],
        "peak_mem_bytes": int(peak.item()),
        "peak_mem_kind": peak_kind,
        "final_train_loss": float(per_step[-1, -1]),
        "final_val_loss": val_loss,
        "status": "ok",
    }
    results.atomic_write_json(os.path.join(run_dir, results.RECORD_NAME), record)
    return record


def main(argv: list[str] | None = None) -> int:
    cfg = RunConfig.from_cli(sys.argv[1:] if argv is None else argv)
    record = train(cfg)
    if record is not None:
        print(f"kanlib: world_size={record['world_size']} step_time_s={record['step_time_s']:.6f} "
              f"samples_per_s={record['samples_per_s']:.1f} final_val_loss={record['final_val_loss']:.6g} "
              f"record={os.path.join(cfg.run_dir(), results.RECORD_NAME)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
