"""The DDP training loop: ``train(cfg) -> record``.

Entry point for torchrun: ``python -m kanlib.train --key=value ...`` (a single process when
RANK is unset). Rank 0 writes the run's folder ``out_dir/<study>/<run_key>/``: ``config.json``
first, ``steps.csv`` (one row per step, flushed as it comes), ``model.pt`` (final state_dict)
and last ``record.json`` (atomically; its presence marks the run complete).

Faults (docs/faults.md): every ``checkpoint_every`` steps rank 0 commits a checkpoint
(kanlib.checkpoint) and a restarted or rerun run resumes from the last one; ``steps.csv`` then
keeps the rows before the checkpoint and continues, each row tagged with its ``attempt``
(torchrun's restart count). The record's timing comes from the steps run in the final attempt
only, its warm-up skipped again after a resume (``resumed_from_step``, ``n_measured_steps``).
Each step, outside the timed region, all ranks agree on a non-finite loss anywhere and on a
stop request (SIGTERM): ``nan_policy='skip'`` skips the update on every rank, ``'stop'``
raises :class:`NonFiniteLoss` on every rank; SIGTERM checkpoints and stops every rank at the
same step. ``KANLIB_FAULT`` (kanlib.faults) injects faults for tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from kanlib import checkpoint, faults, results
from kanlib.config import RunConfig
from kanlib.data import make_dataset
from kanlib.distributed import DistInfo, setup, synchronize, teardown
from kanlib.metrics import (CommTimer, model_state_bytes, peak_memory_bytes, reset_peak_memory,
                            summarize, timed_allreduce_hook)
from kanlib.model import build_model, count_params, update_grid_distributed

# Per-step quantities gathered from every rank at the end (column order of the gathered tensor).
_PHASES = ("step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_total_s", "loss")
PREEMPTED_NAME = "preempted.json"


def wrap_ddp(model: torch.nn.Module, cfg: RunConfig, info: DistInfo):
    """Wrap ``model`` in DDP as the config asks and register its communication hook.

    Returns ``(module, comm_timer)``; ``comm_timer`` is None unless ``comm_hook == 'timed'``.
    """
    if not info.distributed:
        return model, None
    ddp = DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph, broadcast_buffers=cfg.broadcast_buffers)
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
    """Run one training run; rank 0 returns the record (other ranks, and a preempted run, None).

    Resumes from the run folder's last committed checkpoint when there is one (see
    kanlib.checkpoint). SIGTERM (preemption) makes every rank stop at the next step boundary,
    together, after a checkpoint; rank 0 then writes ``preempted.json`` in the run folder.
    """
    info = setup(cfg)
    stop = _StopRequest()
    try:
        return _train(cfg, info, stop)
    finally:
        stop.restore()
        teardown(info)


class NonFiniteLoss(RuntimeError):
    """A loss was NaN or infinite on some rank and ``nan_policy='stop'``; raised on every rank."""


class _StopRequest:
    """Turns SIGTERM into a request to stop at the next step boundary (checked by every rank)."""

    def __init__(self):
        self.requested = False
        try:
            self._prev = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._prev = None

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._prev is not None:
            signal.signal(signal.SIGTERM, self._prev)


def _prepare_run_dir(cfg: RunConfig, run_dir: str) -> int | None:
    """Rank 0, before anything else: write config.json, decide fresh start or resume, tidy up.

    A folder with a record is a completed run being rerun: it starts afresh. Otherwise the
    last committed checkpoint (if any) is resumed; uncommitted checkpoint files are removed
    and steps.csv keeps only the rows of steps before the checkpoint. Returns the step to
    resume from, or None for a fresh start.
    """
    os.makedirs(run_dir, exist_ok=True)
    results.atomic_write_json(os.path.join(run_dir, results.CONFIG_NAME), cfg.to_dict())
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, PREEMPTED_NAME))
    steps_path = os.path.join(run_dir, results.STEPS_NAME)
    record_path = os.path.join(run_dir, results.RECORD_NAME)
    if os.path.exists(record_path):
        checkpoint.remove_all(run_dir)
        os.remove(record_path)
    checkpoint.clean_uncommitted(run_dir)
    resume = checkpoint.latest_step(run_dir)
    if resume is None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(steps_path)
    else:
        results.truncate_steps(steps_path, resume)
    return resume


def _agree_flags(local_bad: bool, stop: bool, info: DistInfo) -> tuple[list[int], bool]:
    """All ranks learn together which ranks saw a non-finite loss, and whether any must stop."""
    flags = torch.zeros(info.world_size + 1, dtype=torch.float64)
    flags[info.rank] = float(local_bad)
    flags[-1] = float(stop)
    flags = _all_reduce_cpu(flags, info)
    bad = [r for r in range(info.world_size) if flags[r] > 0]
    return bad, bool(flags[-1] > 0)


def _all_reduce_cpu(t: torch.Tensor, info: DistInfo, op=None) -> torch.Tensor:
    if info.distributed:
        dev = info.device
        tt = t.to(dev)
        dist.all_reduce(tt, op=op or dist.ReduceOp.SUM)
        return tt.cpu()
    return t


def _save_checkpoint(run_dir: str, step: int, model, optimizer, cfg: RunConfig, info: DistInfo,
                     fault_list: list) -> str | None:
    """Collective: gather every rank's RNG states; rank 0 writes the checkpoint of ``step``."""
    rng = checkpoint.rng_state(info.device)
    if info.distributed:
        rngs = [None] * info.world_size
        dist.all_gather_object(rngs, rng)
    else:
        rngs = [rng]
    if not info.is_main:
        return None
    kill = None
    if faults.due(fault_list, "ckptkill", info.rank, step):
        def kill():
            os.kill(os.getpid(), signal.SIGKILL)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rngs,
             "run_key": cfg.run_key(), "world_size": info.world_size}
    return checkpoint.save(run_dir, state, step, before_rename=kill)


def _check_replicas_agree(model: torch.nn.Module, info: DistInfo) -> None:
    """Raise on every rank if the replicas' parameters differ (compares float64 fingerprints:
    sum, sum of squares and an index-weighted sum of all parameters, and finiteness)."""
    if not info.distributed:
        return
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in model.parameters()])
    idx = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
    finite = bool(torch.isfinite(flat).all())
    flat = torch.nan_to_num(flat)
    mine = torch.stack([flat.sum(), (flat * flat).sum(), (flat * idx).sum(),
                        torch.tensor(float(finite), dtype=torch.float64)]).to(info.device)
    everyone = [torch.zeros_like(mine) for _ in range(info.world_size)]
    dist.all_gather(everyone, mine)
    differ = [r for r, t in enumerate(everyone) if not torch.equal(t.cpu(), everyone[0].cpu())]
    if differ:
        raise RuntimeError(f"parameters differ across ranks after training: ranks {differ} disagree with rank 0")


def _train(cfg: RunConfig, info: DistInfo, stop: _StopRequest) -> dict | None:
    started_at = results.now_iso()
    run_dir = cfg.run_dir()
    fault_list = faults.active()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if info.is_main:
        _prepare_run_dir(cfg, run_dir)
    if info.distributed:
        dist.barrier()  # rank 0 has tidied the folder before anyone reads a checkpoint

    torch.manual_seed(cfg.seed)  # identical initialisation on every rank (DDP also broadcasts)
    data = make_dataset(cfg)
    model = build_model(cfg).to(info.device)
    n_params = count_params(model)
    ck = checkpoint.load_latest(run_dir)
    if ck is not None:
        if ck.get("run_key") != cfg.run_key() or ck.get("world_size") != info.world_size:
            raise checkpoint.CheckpointError(
                f"checkpoint {ck['path']}: written by run {ck.get('run_key')} with world size "
                f"{ck.get('world_size')}, not this run {cfg.run_key()} with world size {info.world_size}")
        model.load_state_dict(ck["model"])
    module, comm_timer = wrap_ddp(model, cfg, info)
    optimizer, n_opt_states = make_optimizer(model, cfg)
    start_step = 0
    if ck is not None:
        optimizer.load_state_dict(ck["optimizer"])
        checkpoint.set_rng_state(ck["rng"][info.rank], info.device)
        start_step = int(ck["step"])
    # Every rank must resume from the same step, or the collectives would pair different steps.
    span = _all_reduce_cpu(torch.tensor([start_step, -start_step], dtype=torch.float64), info,
                           dist.ReduceOp.MAX if info.distributed else None)
    if int(span[0]) != -int(span[1]):
        raise checkpoint.CheckpointError(f"ranks resumed from different steps ({-int(span[1])}..{int(span[0])})")
    if ck is not None and info.is_main:
        print(f"kanlib: resumed from step {start_step} ({ck['path']}), attempt {attempt}", flush=True)
    del ck
    autocast = torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")
    writer = results.StepWriter(os.path.join(run_dir, results.STEPS_NAME)) if info.is_main else None
    reset_peak_memory(info.device)

    # Timing comes from the steps of this attempt only; after a resume the warm-up is skipped
    # again (DDP rebuilds its buckets), unless that would leave no step measured.
    measure_from = cfg.warmup_steps + (start_step if start_step else 0)
    if measure_from >= cfg.steps:
        measure_from = max(cfg.warmup_steps, start_step)
    per_step = torch.zeros(cfg.steps - start_step, len(_PHASES), dtype=torch.float64)
    n_skipped = n_grid_updates = 0
    clock = time.perf_counter
    for step in range(start_step, cfg.steps):
        faults.at_step_start(fault_list, info.rank, step)
        x, y = data.shard(step, cfg.global_batch, info.rank, info.world_size)
        x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
        if cfg.grid_update_every and step and step % cfg.grid_update_every == 0:
            # Not timed: refit the grids to every rank's batch; all ranks end bitwise equal.
            update_grid_distributed(model, x)
            n_grid_updates += 1
        synchronize(info.device)
        t0 = clock()
        with autocast:
            out = module(x)
        loss = F.mse_loss(out.float(), y)
        if faults.due(fault_list, "nan", info.rank, step):
            loss = loss * float("nan")
        synchronize(info.device)
        t1 = clock()
        loss.backward()
        synchronize(info.device)
        t2 = clock()
        # Not timed: every rank learns whether any loss was non-finite or any rank must stop.
        bad, stop_now = _agree_flags(not bool(torch.isfinite(loss.detach()).item()), stop.requested, info)
        t_resume = clock()
        if bad:
            if cfg.nan_policy == "stop":
                raise NonFiniteLoss(f"non-finite loss at step {step} on rank(s) {bad}; nan_policy='stop' "
                                    f"stops the run on every rank")
            optimizer.zero_grad(set_to_none=True)  # 'skip': no update on any rank
            n_skipped += 1
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(info.device)
        t3 = clock()
        comm = comm_timer.step_total() if comm_timer is not None else float("nan")
        row = ((t2 - t0) + (t3 - t_resume), t1 - t0, t2 - t1, t3 - t_resume, comm, loss.item())
        per_step[step - start_step] = torch.tensor(row, dtype=torch.float64)
        if writer is not None:
            writer.write({"step": step, "measured": int(step >= measure_from), "attempt": attempt,
                          **dict(zip(_PHASES, row))})
        done = step + 1
        if done < cfg.steps and (stop_now or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
            path = _save_checkpoint(run_dir, done, model, optimizer, cfg, info, fault_list)
            if stop_now:
                if writer is not None:
                    writer.close()
                    results.atomic_write_json(os.path.join(run_dir, PREEMPTED_NAME),
                                              {"step": done, "checkpoint": path, "at": results.now_iso(),
                                               "attempt": attempt})
                    print(f"kanlib: stopped by SIGTERM after step {done}; checkpoint {path}", flush=True)
                return None
    if writer is not None:
        writer.close()

    # The slowest rank sets the pace: per step, the max of each time over ranks, the mean loss.
    if info.distributed:
        gathered = [torch.zeros_like(per_step) for _ in range(info.world_size)]
        dist.all_gather(gathered, per_step)
        stacked = torch.stack(gathered)  # (world, steps, phases)
        per_step = stacked.max(dim=0).values
        per_step[:, -1] = stacked[:, :, -1].mean(dim=0)
    if cfg.comm_hook != "noop":  # without the network the replicas drift apart by design
        _check_replicas_agree(model, info)
    peak_local, peak_kind = peak_memory_bytes(info.device)
    peak = torch.tensor([float(peak_local)], dtype=torch.float64)
    if info.distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    val_loss = evaluate(model, data.x_val, data.y_val, info.device)
    if not info.is_main:
        return None

    measured = per_step[measure_from - start_step:]
    stats = {name: summarize(measured[:, i].tolist()) for i, name in enumerate(_PHASES)}
    step_stats = stats["step_time_s"]
    med = {name: s["median"] for name, s in stats.items()}
    model_path = os.path.join(run_dir, "model.pt")
    torch.save(model.state_dict(), model_path + ".tmp")
    os.replace(model_path + ".tmp", model_path)
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
        "resumed_from_step": start_step,
        "attempt": attempt,
        "n_skipped_steps": n_skipped,
        "n_grid_updates": n_grid_updates,
    }
    results.atomic_write_json(os.path.join(run_dir, results.RECORD_NAME), record)
    checkpoint.remove_all(run_dir)  # complete: model.pt holds the final parameters
    return record


def main(argv: list[str] | None = None) -> int:
    cfg = RunConfig.from_cli(sys.argv[1:] if argv is None else argv)
    record = train(cfg)
    if record is None and os.path.exists(os.path.join(cfg.run_dir(), PREEMPTED_NAME)):
        return 0  # preempted: the checkpoint and preempted.json say where it stopped
    if record is not None:
        print(f"kanlib: world_size={record['world_size']} step_time_s={record['step_time_s']:.6f} "
              f"samples_per_s={record['samples_per_s']:.1f} final_val_loss={record['final_val_loss']:.6g} "
              f"record={os.path.join(cfg.run_dir(), results.RECORD_NAME)}", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Training is over: the process group is destroyed and every file written and closed. Leave
    # without running C++ static destructors, where gloo's background threads now and then abort
    # the exit ("terminate called without an active exception"), turning a finished run into a
    # failed one. Errors still propagate above with their traceback and a non-zero exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
