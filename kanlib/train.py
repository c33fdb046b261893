"""The data-parallel training loop: ``train(cfg) -> RunRecord``.

Entry point for torchrun: ``python -m kanlib.train --key=value ...`` (a single process when RANK is
unset; kanlib.train_cli reads the command line). Rank 0 writes the run's folder ``out_dir/<study>/<run_key>/``
(kanlib.records): ``config.json`` first (kanlib.checkpoint.prepare_run_dir), ``steps.csv`` (one
:class:`~kanlib.records.StepRow` per step, flushed as it comes), ``model.pt`` and last ``record.json``
(atomically; its presence marks the run complete).

:func:`train` reads top to bottom: :func:`start_or_resume`, then per step :func:`train_step` (returns the
step's row) and :func:`checkpoint_or_stop`, then :func:`finish` (returns the record). Faults
(docs/faults.md): checkpoints every ``checkpoint_every`` steps and a resume from the last one;
SIGTERM stops every rank at the same step after a checkpoint; a non-finite loss on any rank is seen
by every rank as non-finite averaged gradients (no extra collective; the no-op hook, which averages
nothing, agrees through one) and handled by ``nan_policy``. ``KANLIB_FAULT`` (kanlib.faults) injects
faults for tests.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from kanlib.metrics import process_start_time

_PROCESS_START = process_start_time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from kanlib import checkpoint, distributed, faults, grids, hooks, manifest, optim, records, train_cli  # noqa: E402
from kanlib.config import RunConfig  # noqa: E402
from kanlib.data import make_dataset, training_dtype  # noqa: E402
from kanlib.distributed import AsyncFlag, DistInfo  # noqa: E402
from kanlib.metrics import (InterferenceProbe, PhaseClock, combine_interference, device_memory,  # noqa: E402
                            measure_step_tensor_peak, model_state_bytes, peak_memory_bytes, release_host_memory,
                            reset_peak_memory, steady_host_allocator, summarize)
from kanlib.model import build_model, compile_seconds, count_params, kernel_paths, reset_kernel_paths  # noqa: E402
from kanlib.records import RunRecord, StepRow  # noqa: E402


class NonFiniteLoss(RuntimeError):
    """A loss was NaN or infinite on some rank and ``nan_policy='stop'`` (raised on every rank), or a
    run ended with non-finite losses or skipped most of its steps."""


@dataclass
class Run:
    """Everything a run holds between its steps."""

    cfg: RunConfig
    info: DistInfo
    run_dir: str
    model: torch.nn.Module
    module: torch.nn.Module  # what the step calls: the DDP / FSDP wrapper, or the model itself
    optimizer: torch.optim.Optimizer
    n_opt_states: int
    data: object
    comm: hooks.CommStats | None
    stop_flag: AsyncFlag
    writer: records.StepWriter | None
    start_step: int
    measure_from: int
    attempt: int
    started_at: str
    first_step_at: float = math.nan
    rows: list[StepRow] = field(default_factory=list)
    comm_s: list[float] = field(default_factory=list)
    emulated_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)  # start of a step to the start of the next, pauses excluded
    step_started: float | None = None  # perf_counter at the start of the step in flight
    paused_s: float = 0.0  # evaluation and checkpoint time within the step in flight
    n_skipped: int = 0
    n_grid_updates: int = 0
    kan_path_steps: dict = field(default_factory=dict)  # KAN kernel path -> steps of this attempt that ran it
    evals: list[int] = field(default_factory=list)  # loss-and-gradient evaluations of each step of this attempt
    train_wall_s: float = 0.0
    target_at: tuple[int, float] | None = None  # (steps done, training wall time) when the target was reached
    stop_now: bool = False  # a stop (SIGTERM) was agreed at the end of the last step
    stop_every: int = 1  # steps between agreements on a stop request (set after warm-up)
    faults: list = field(default_factory=list)
    wall_by_rank: torch.Tensor | None = None  # (world, steps) every rank's wall_s, set by _combine_steps
    params: list = field(default_factory=list)  # the model's parameters, listed once
    clock: PhaseClock | None = None
    autocast: object = None
    group: distributed.Group | None = None
    probe: InterferenceProbe | None = None  # what else ran on this rank's CPUs (and GPU) over the measured steps
    compile_before: float = 0.0  # seconds this process had spent compiling before the run (compile_s is the rest)


def train(cfg: RunConfig, group: distributed.Group | None = None) -> RunRecord | None:
    """Run one training run; rank 0 returns the record (other ranks, and a preempted run, None).

    ``group``: the processes of a worker group that runs many runs one after another (kanlib.worker): the
    run uses its process group and stop request and leaves them as they are. Without one, the run sets up
    its own process group and tears it down at the end."""
    if cfg.model == "kan" and cfg.kan_impl == "compiled":
        from kanlib.compiling import prepare_compile

        prepare_compile(distributed.resolve_device(cfg.device))  # overlaps inductor's set-up with the rendezvous
    with contextlib.nullcontext(group) if group is not None else distributed.own_group(cfg) as group:
        run = start_or_resume(cfg, group)
        try:
            for step in range(run.start_step, cfg.steps):
                row = train_step(run, step, group.stop)
                reached = evaluate_and_check_target(run, row)
                if checkpoint_or_stop(run, row):
                    return None  # preempted: checkpointed, every rank stops here
                if reached:
                    break
            return finish(run)
        finally:
            release(run)


# -- start ---------------------------------------------------------------------------------------------
def start_or_resume(cfg: RunConfig, group: distributed.Group) -> Run:
    """Prepare the run folder (rank 0), build data and model, wrap them for data parallelism, and restore
    the last committed checkpoint when there is one; every rank checks it resumes from the same step."""
    info = group.info
    started_at = records.now_iso()
    compile_before = compile_seconds()
    steady_host_allocator()  # once per process: a step's host memory stays mapped from run to run (metrics)
    reset_peak_memory(info.device)  # this run's peak, not an earlier run's of the same process
    run_dir = cfg.run_dir()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if info.is_main:
        checkpoint.prepare_run_dir(run_dir, cfg.to_dict())
    distributed.barrier(info)  # rank 0 has tidied the folder before anyone reads a checkpoint
    torch.manual_seed(cfg.seed)  # identical initialisation on every rank (DDP also broadcasts)
    data = make_dataset(cfg)
    model = build_model(cfg).to(info.device, training_dtype(cfg.precision))  # float64 parameters under fp64
    ck = checkpoint.load_latest(run_dir)
    if ck is not None:
        if ck.get("run_key") != cfg.run_key() or ck.get("world_size") != info.world_size:
            raise checkpoint.CheckpointError(
                f"checkpoint {ck['path']}: written by run {ck.get('run_key')} with world size "
                f"{ck.get('world_size')}, not this run {cfg.run_key()} with world size {info.world_size}")
        model.load_state_dict(ck["model"])
    module, comm = wrap(model, cfg, info)
    optimizer, n_opt_states = make_optimizer(model, cfg)
    start_step = 0
    if ck is not None:
        checkpoint.load_optimizer(model, optimizer, ck["optimizer"], _fsdp(cfg, info), info)
        checkpoint.set_rng_state(ck["rng"][info.rank], info.device)
        start_step = int(ck["step"])
    steps = distributed.all_gather(torch.tensor([start_step], dtype=torch.int64), info).view(-1).tolist()
    if len(set(steps)) != 1:
        raise checkpoint.CheckpointError(f"ranks resumed from different steps: {steps}")
    if ck is not None and info.is_main:
        print(f"kanlib: resumed from step {start_step} ({ck['path']}), attempt {attempt}", flush=True)
    # Timing comes from the steps of this attempt only; after a resume the warm-up is skipped again
    # (DDP rebuilds its buckets, kernels compile), unless that would leave no step measured.
    measure_from = cfg.warmup_steps + start_step
    if measure_from >= cfg.steps:
        measure_from = max(cfg.warmup_steps, start_step)
    writer = records.StepWriter(os.path.join(run_dir, records.STEPS_NAME)) if info.is_main else None
    autocast = (torch.autocast(info.device.type, dtype=torch.bfloat16) if cfg.precision == "bf16"
                else contextlib.nullcontext())
    return Run(cfg, info, run_dir, model, module, optimizer, n_opt_states, data, comm, AsyncFlag(info), writer,
               start_step, measure_from, attempt, started_at, faults=faults.active(cfg.run_key()),
               train_wall_s=float(ck.get("train_wall_s", 0.0)) if ck is not None else 0.0,
               params=list(model.parameters()), clock=PhaseClock(info.device), autocast=autocast, group=group,
               compile_before=compile_before, probe=InterferenceProbe(info.device))


def wrap(model: torch.nn.Module, cfg: RunConfig, info: DistInfo):
    """The model wrapped as ``cfg.parallelism`` asks (DDP with its communication hook, or FSDP).

    Returns ``(module, comm_stats)``; ``comm_stats`` is None unless the hook times its buckets.
    """
    if not info.distributed:
        return model, None
    if cfg.parallelism == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in getattr(model, "layers", []):
            fully_shard(layer)
        return fully_shard(model), None
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph, **_buffer_sync(cfg.broadcast_buffers))
    return ddp, hooks.register(ddp, cfg, info.device)


def _buffer_sync(enabled: bool) -> dict:
    """DDP's per-forward buffer broadcast switch: ``forward_sync_buffers`` where torch has it (it replaces
    the deprecated ``broadcast_buffers``; both keep the one broadcast at construction), else the old name."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    return {name: enabled}


def make_optimizer(model: torch.nn.Module, cfg: RunConfig):
    """The optimizer and its number of per-parameter state tensors (for memory accounting)."""
    if cfg.optimizer == "lbfgs":
        return optim.make_lbfgs(model, cfg), optim.state_tensors(cfg)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr), 2
    return torch.optim.SGD(model.parameters(), lr=cfg.lr), 0


def learning_rate(cfg: RunConfig, step: int) -> float:
    """``cfg.lr`` scaled by ``cfg.lr_rule`` for the global batch, with linear warm-up over ``lr_warmup_steps``."""
    lr = cfg.lr
    if cfg.lr_rule == "linear":
        lr *= cfg.global_batch / cfg.lr_base_batch
    elif cfg.lr_rule == "sqrt":
        lr *= math.sqrt(cfg.global_batch / cfg.lr_base_batch)
    if cfg.lr_warmup_steps and step < cfg.lr_warmup_steps:
        lr *= (step + 1) / cfg.lr_warmup_steps
    return lr


# -- one step ------------------------------------------------------------------------------------------
def train_step(run: Run, step: int, sigterm: distributed.StopRequest) -> StepRow:
    """Forward, backward (``grad_accum_steps`` micro-batches, gradients communicated on the last) and the
    optimizer update of ``step``, timed by phase; returns the step's row (rank 0 also writes it)."""
    cfg, info = run.cfg, run.info
    _close_step(run)
    if step == run.start_step:
        run.first_step_at = time.time()
    faults.at_step_start(run.faults, info.rank, step)
    agree = (step + 1) % run.stop_every == 0
    if agree:
        run.stop_flag.start(sigterm.requested)  # agreed at the end of the step, overlapped with it
    x, y = run.data.shard(step, cfg.global_batch, info.rank, info.world_size)
    x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
    if grids.before_step(run, step, x):  # not timed; a grid extension gave the model new parameters
        if run.comm is not None:
            run.comm.close()
        run.module, run.comm = wrap(run.model, cfg, info)
        run.optimizer, run.n_opt_states = make_optimizer(run.model, cfg)
        run.params = list(run.model.parameters())
    reset_kernel_paths(run.model)  # from here: the kernel paths this step runs (the grid work above is not a step)
    lr = learning_rate(cfg, step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    if step == run.measure_from:
        run.probe.start()  # the interference window is the measured steps
    clock = run.clock
    clock.start()
    k = cfg.grad_accum_steps
    micro = list(zip(x.chunk(k), y.chunk(k))) if k > 1 else [(x, y)]

    def forward_backward() -> torch.Tensor:
        """This rank's loss of the step's batch, and its gradients (communicated on the last micro-batch)."""
        losses = []
        for i, (xb, yb) in enumerate(micro):
            # DDP all-reduces on the last micro-batch only; one process (no DDP wrapper) has nothing to hold back
            sync = run.module.no_sync() if i < k - 1 and hasattr(run.module, "no_sync") else contextlib.nullcontext()
            with sync:
                with run.autocast:
                    out = run.module(xb)
                loss = run.data.loss(out, yb)
                if run.faults and faults.due(run.faults, "nan", info.rank, step):
                    loss = loss * float("nan")
                clock.mark("forward")
                (loss / k if k > 1 else loss).backward()
                clock.mark("backward")
            losses.append(loss.detach())
        return torch.stack(losses).mean() if k > 1 else losses[0]

    loss = forward_backward()
    finite = _gradients_finite(run, loss)
    lbfgs = isinstance(run.optimizer, optim.LBFGS)
    if finite and lbfgs:  # its line search evaluates the batch again, every rank the same number of times
        optim.lbfgs_step(run.optimizer, forward_backward, loss, info, clock,
                         new_batch=cfg.global_batch < run.data.n_train)
    elif finite:
        run.optimizer.step()
    elif not _agreed_after_timing(run):
        _handle_non_finite(run, step, loss)
    run.optimizer.zero_grad(set_to_none=True)
    clock.mark("optimizer")
    phases = clock.read()
    if _agreed_after_timing(run) and _non_finite_anywhere(run, finite):
        _handle_non_finite(run, step, loss)
    comm = run.comm.end_step() if run.comm is not None else (math.nan, math.nan)  # (in flight, emulated) s
    loss_value = float(loss.item())
    run.evals.append(run.optimizer.last_evals if lbfgs and finite else 1)
    for path in kernel_paths(run.model):
        run.kan_path_steps[path] = run.kan_path_steps.get(path, 0) + 1
    stop_now = run.stop_flag.result() if agree else False
    row = StepRow(step=step, measured=int(step >= run.measure_from), attempt=run.attempt, time_unix_s=time.time(),
                  step_time_s=sum(phases.values()), forward_s=phases["forward"], backward_s=phases["backward"],
                  optimizer_s=phases["optimizer"], comm_total_s=comm[0], loss=loss_value, lr=lr)
    run.rows.append(row)
    run.emulated_s.append(comm[1])
    run.stop_now = stop_now
    if step + 1 == run.measure_from:  # warm-up over: compilation and bucket rebuilds leave the window
        reset_peak_memory(info.device)
        run.stop_every = _stop_interval(run)
    return row


STOP_LATENCY_S = 0.5  # how long a SIGTERM may wait for the ranks to agree on it, at most about


def _stop_interval(run: Run) -> int:
    """Steps between stop agreements for the measured steps: about every ``STOP_LATENCY_S`` of training, so
    the agreement's small collective costs nothing measurable on short steps (agreed every 50 ms, it cost
    3-5% of a 5 ms step on 2 gloo processes here, benchmarks/loop_overhead.py) and a preemption still stops
    within ~0.5 s (plus one step), far inside torchrun's 15 s grace before SIGKILL. Rank 0's warm-up step
    time decides, broadcast so every rank agrees."""
    walls = run.wall_s[1:] or run.wall_s or [STOP_LATENCY_S]
    mine = torch.tensor([sorted(walls)[len(walls) // 2]], dtype=torch.float64)
    t = float(distributed.broadcast(mine, run.info).item())
    return max(1, min(1000, int(STOP_LATENCY_S / max(t, 1e-6))))


def _close_step(run: Run) -> None:
    """End the wall-clock span of the step in flight (if any) and start the next: a step's wall time runs
    from its start to the next step's start, evaluations and checkpoints (``paused_s``) excluded."""
    now = time.perf_counter()
    if run.step_started is not None:
        wall = now - run.step_started - run.paused_s
        run.wall_s.append(wall)
        run.train_wall_s += wall
    run.step_started, run.paused_s = now, 0.0


@contextlib.contextmanager
def _paused(run: Run):
    """Time spent inside is not training time (evaluation, checkpoints)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        run.paused_s += time.perf_counter() - t0


def _gradients_finite(run: Run, loss: torch.Tensor) -> bool:
    """Whether this step's update may be applied.

    After DDP's all-reduce every rank holds the same averaged gradients, so a non-finite loss on any
    rank shows as non-finite gradients on every rank: no collective is needed. FSDP's sharded gradients
    (each rank sees its own shard) are agreed with one small collective. Under the no-op hook each rank
    decides on its own gradients (its replica drifts from the others by design) and the ranks agree after
    the timed region (:func:`_non_finite_anywhere`): a collective inside it would be time the timed twin
    does not spend, biasing exposed communication = T_hook - T_noop low.
    """
    local_ok = math.isfinite(float(loss)) and _all_finite([_local(p.grad) for p in run.params if p.grad is not None])
    if run.info.distributed and run.cfg.parallelism == "fsdp":
        bad = distributed.all_reduce(torch.tensor([0.0 if local_ok else 1.0]), run.info, "max")
        return bool(bad.item() == 0)
    return local_ok


_ONE: dict = {}  # device -> a 1.0 scale for the fused check below


def _all_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every element of ``grads`` is finite, by GradScaler's fused check (one pass per device and
    dtype, scale 1.0 so the gradients keep their values): about 4x cheaper than norms here (6 vs 26 us for
    9 small tensors), which on a 5 ms step is the difference between 0.5% and 2% of it."""
    groups: dict = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    found = []
    for (device, _), gs in groups.items():
        if device not in _ONE:
            _ONE[device] = torch.ones(1, device=device)
        flag = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, _ONE[device])
        found.append(flag)
    return not any(bool(f.item()) for f in found)


def _agreed_after_timing(run: Run) -> bool:
    """Whether the ranks agree on non-finite losses after the timed region (the no-op hook's runs)."""
    return run.info.distributed and run.cfg.comm_hook == "noop" and run.cfg.parallelism == "ddp"


def _non_finite_anywhere(run: Run, local_ok: bool) -> bool:
    """One small collective, outside the timed region: did any rank see a non-finite loss or gradient?"""
    bad = distributed.all_reduce(torch.tensor([0.0 if local_ok else 1.0]), run.info, "max")
    return bool(bad.item() > 0)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP-sharded) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def _handle_non_finite(run: Run, step: int, loss: torch.Tensor) -> None:
    """Every rank is here together: find which ranks' losses were non-finite, then stop or skip."""
    mine = torch.tensor([0.0 if bool(torch.isfinite(loss)) else 1.0])
    flags = distributed.all_gather(mine, run.info).view(-1)
    bad = [r for r in range(run.info.world_size) if flags[r] > 0]
    if run.cfg.nan_policy == "stop":
        raise NonFiniteLoss(f"non-finite loss at step {step} on rank(s) {bad}; nan_policy='stop' stops the run "
                            f"on every rank")
    run.n_skipped += 1  # 'skip': no update on any rank


# -- between steps -------------------------------------------------------------------------------------
def checkpoint_or_stop(run: Run, row: StepRow) -> bool:
    """Write the step's row; checkpoint when due or when a stop was agreed. True: the run stops here."""
    cfg, info = run.cfg, run.info
    if run.writer is not None:
        run.writer.write(row)
    done = row.step + 1
    if done >= cfg.steps or not (run.stop_now or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
        return False
    with _paused(run):
        path = _save_checkpoint(run, done)
        distributed.barrier(info)  # the others wait here, not in the next step's all-reduce
    if not run.stop_now:
        return False
    if run.writer is not None:
        run.writer.close()
        records.atomic_write_json(os.path.join(run.run_dir, records.PREEMPTED_NAME),
                                  {"step": done, "checkpoint": path, "at": records.now_iso(), "attempt": run.attempt})
        print(f"kanlib: stopped by SIGTERM after step {done}; checkpoint {path}", flush=True)
    return True


def evaluate_and_check_target(run: Run, row: StepRow) -> bool:
    """Every ``eval_every`` steps (outside the timed region): evaluate, record the curve point, and say
    whether the validation loss reached ``target_val_loss`` (rank 0's value decides for all)."""
    cfg = run.cfg
    done = row.step + 1
    if not cfg.eval_every or done % cfg.eval_every or done >= cfg.steps:
        return False
    training_s = run.train_wall_s + (time.perf_counter() - run.step_started - run.paused_s)
    with _paused(run):
        ev = _evaluate(run)  # every rank: FSDP's forward is collective
        row.val_loss = ev["val_loss"]
        row.val_accuracy = ev["val_accuracy"] if ev["val_accuracy"] is not None else math.nan
        reached = bool(cfg.target_val_loss) and ev["val_loss"] <= cfg.target_val_loss
        reached = bool(distributed.broadcast(torch.tensor([float(reached)]), run.info).item() > 0)
    if reached and run.target_at is None:
        run.target_at = (done, training_s)
    return reached


def _evaluate(run: Run) -> dict:
    """The validation loss (and accuracy), in padded chunks of the training micro-batch: the shapes the
    compiled kernels already have, so evaluating compiles nothing new (3 of 10 kernels of a 3-layer KAN)."""
    micro = run.cfg.local_batch // run.cfg.grad_accum_steps
    return run.data.evaluate(run.model, run.info.device, chunk=max(1, micro), pad=True)


def _save_checkpoint(run: Run, step: int) -> str | None:
    """Collective: gather every rank's RNG states; rank 0 writes the checkpoint of ``step``."""
    info = run.info
    rng = checkpoint.rng_state(info.device)
    if info.distributed:
        rngs = [None] * info.world_size
        dist.all_gather_object(rngs, rng)
    else:
        rngs = [rng]
    model_state, optim_state = checkpoint.full_states(run.model, run.optimizer, _fsdp(run.cfg, info), info)
    if not info.is_main:
        return None
    kill = None
    if faults.due(run.faults, "ckptkill", info.rank, step):
        def kill():
            os.kill(os.getpid(), signal.SIGKILL)
    # the training wall time so far (the step in flight included), carried into a resumed attempt so that its
    # time_to_target_s counts every attempt's training, not the last one's only
    trained_s = run.train_wall_s + (time.perf_counter() - run.step_started - run.paused_s)
    state = {"model": model_state, "optimizer": optim_state, "rng": rngs,
             "run_key": run.cfg.run_key(), "world_size": info.world_size, "train_wall_s": float(trained_s)}
    return checkpoint.save(run.run_dir, state, step, before_rename=kill)


# -- finish --------------------------------------------------------------------------------------------
def finish(run: Run) -> RunRecord | None:
    """Combine every rank's per-step times (the slowest rank sets the pace), check the replicas agree and
    the losses are finite, evaluate, and (rank 0) write ``model.pt`` and ``record.json``."""
    cfg, info = run.cfg, run.info
    _close_step(run)
    mine = run.probe.stop() if run.probe.started else {}
    if run.writer is not None:
        run.writer.close()
    gathered = distributed.all_gather_objects((mine, distributed.CPUS_SHARED), info)
    interference = combine_interference([m for m, _ in gathered])
    interference["cpus_shared"] = any(shared for _, shared in gathered)
    combined = _combine_steps(run)  # {field: (steps,)}, each combined over ranks by its rule
    if cfg.comm_hook != "noop" and cfg.parallelism == "ddp":  # without the network replicas drift apart
        _check_replicas_agree(run.model, info)
    peak_local, peak_kind = peak_memory_bytes(info.device)
    reserved, used = device_memory(info.device)
    mem = distributed.all_reduce(torch.tensor([float(peak_local), float(reserved or 0), float(used or 0)],
                                              dtype=torch.float64), info, "max").tolist()
    final = _evaluate(run)
    tensor_peak = measure_step_tensor_peak(run)  # one more step, untimed and profiled; the model is put back
    if cfg.target_val_loss and run.target_at is None and final["val_loss"] <= cfg.target_val_loss:
        run.target_at = (len(run.rows) + run.start_step, run.train_wall_s)  # reached at the last step
    state = checkpoint.full_model_state(run.model, _fsdp(cfg, info))  # collective under FSDP
    _check_losses(run, combined["loss"], final["val_loss"])
    if not info.is_main:
        return None
    first = run.measure_from - run.start_step
    measured = {n: v[first:].tolist() for n, v in combined.items()}
    stats = {n: summarize(v) for n, v in measured.items()}
    model_path = os.path.join(run.run_dir, records.MODEL_NAME)
    torch.save(state, model_path + ".tmp")
    os.replace(model_path + ".tmp", model_path)
    step_time = stats["step_time_s"]["median"]
    wall = float(run.wall_by_rank[:, first:].sum(dim=1).max())  # the slowest rank's measured span
    timed_comm = run.comm is not None
    target = {}
    if cfg.target_val_loss:
        reached = run.target_at is not None
        target = {"reached_target": reached,
                  "steps_to_target": run.target_at[0] if reached else None,
                  "samples_to_target": run.target_at[0] * cfg.global_batch if reached else None,
                  "time_to_target_s": run.target_at[1] if reached else None}
    rec = RunRecord(
        provenance=records.provenance(), config=cfg.to_dict(), run_id=records.new_run_id(), run_key=cfg.run_key(),
        data_sha256=cfg.key_inputs().get("data_sha256"),
        config_backend=cfg.backend, config_device=cfg.device, backend=info.backend or "none",
        device=info.device.type, world_size=info.world_size, started_at=run.started_at,
        finished_at=records.now_iso(), n_params=count_params(run.model),
        model_state_bytes=model_state_bytes(run.model, run.n_opt_states),
        kan_path="+".join(sorted({*run.kan_path_steps, *kernel_paths(run.model)})),
        kan_path_steps=dict(sorted(run.kan_path_steps.items())) or None, n_measured_steps=len(measured["step_time_s"]),
        step_time_s=step_time, step_time_s_p10=stats["step_time_s"]["p10"],
        step_time_s_p90=stats["step_time_s"]["p90"], forward_s=stats["forward_s"]["median"],
        backward_s=stats["backward_s"]["median"], optimizer_s=stats["optimizer_s"]["median"],
        samples_per_s=cfg.global_batch / step_time,
        wall_samples_per_s=cfg.global_batch * len(measured["wall_s"]) / wall if wall > 0 else math.nan,
        comm_total_s=stats["comm_total_s"]["median"] if timed_comm else None,
        n_buckets=run.comm.n_buckets if timed_comm else None,
        bucket_bytes=list(run.comm.bucket_bytes) if timed_comm else None,
        wire_bytes=list(run.comm.wire_bytes) if timed_comm else None,
        messages_per_bucket=list(run.comm.messages_per_bucket) if timed_comm else None,
        powersgd_stats=_powersgd_stats(run.comm),
        emulated_s=stats["emulated_s"]["median"] if cfg.emulated_link else None,
        compile_s=compile_seconds() - run.compile_before,
        time_to_first_step_s=run.first_step_at - (run.group.started_at or _PROCESS_START),
        launch_id=run.group.launch_id, runs_before_in_launch=run.group.runs_before,
        peak_mem_bytes=int(mem[0]), peak_mem_kind=peak_kind, tensor_peak_bytes=tensor_peak,
        peak_reserved_bytes=int(mem[1]) if reserved is not None else None,
        device_used_bytes=int(mem[2]) if used is not None else None,
        final_train_loss=float(combined["loss"][-1]), final_val_loss=final["val_loss"],
        final_val_accuracy=final["val_accuracy"], chance_accuracy=run.data.chance_accuracy,
        target_mean=run.data.y_mean, target_std=run.data.y_std, param_dtype=str(run.params[0].dtype).split(".")[-1],
        resumed_from_step=run.start_step, attempt=run.attempt, n_skipped_steps=run.n_skipped,
        n_grid_updates=run.n_grid_updates, earlier_attempts=manifest.earlier_attempts(run.run_dir),
        **optim.record_fields(run.evals, first, run.model), **interference, **target,
        host_malloc=steady_host_allocator())
    records.atomic_write_json(os.path.join(run.run_dir, records.RECORD_NAME), rec)
    checkpoint.remove_all(run.run_dir)  # complete: model.pt holds the final parameters
    return rec


def release(run: Run) -> None:
    """Free what the run holds beyond its objects (the emulated link's thread, cached device memory), so the
    next run of a worker group starts from the same state as in a fresh process."""
    if run.comm is not None:
        run.comm.close()
    if run.writer is not None:
        run.writer.close()
    run.module = run.model = run.optimizer = run.data = run.comm = None
    run.params.clear()
    gc.collect()
    if run.info.device.type == "cuda":
        torch.cuda.empty_cache()
    release_host_memory()


def _powersgd_stats(comm) -> dict | None:
    """torch's PowerSGD statistics (compress rate, elements before and after compression), or None."""
    if comm is None or comm.powersgd is None:
        return None
    rate, before, after = comm.powersgd.state.compression_stats()
    return {"compress_rate": float(rate), "numel_before": int(before), "numel_after": int(after)}


# The per-step values combined over ranks at the end, each by its rule: the StepRow fields that say how
# (``reduce`` metadata), and two per-step lists kept beside the rows (a step's wall time is known only when
# the next step starts; the emulated link's delay comes from the hook), both ruled by the slowest rank.
_BESIDE_ROWS = {"emulated_s": "max", "wall_s": "max"}


def _combine_steps(run: Run) -> dict[str, torch.Tensor]:
    """Every rank's per-step values of this attempt, gathered once (on the device) and combined over ranks:
    ``{name: (steps,) float64}``."""
    rules = {n: how for how in ("max", "mean") for n in records.StepRow.reduced(how)} | _BESIDE_ROWS
    local = torch.tensor([[{"emulated_s": e, "wall_s": w}[n] if n in _BESIDE_ROWS else getattr(r, n) for n in rules]
                          for r, e, w in zip(run.rows, run.emulated_s, run.wall_s)], dtype=torch.float64)
    per_rank = distributed.all_gather(local, run.info)  # (world, steps, fields)
    # The wall time of the measured span is each rank's own sum, the slowest rank's counting: the sum of
    # per-step maxima would add every step's jitter between the ranks (about 25% on 5 ms steps here).
    run.wall_by_rank = per_rank[:, :, list(rules).index("wall_s")]  # (world, steps)
    return {n: (per_rank[:, :, i].max(dim=0).values if how == "max" else per_rank[:, :, i].mean(dim=0))
            for i, (n, how) in enumerate(rules.items())}


def _fsdp(cfg: RunConfig, info: DistInfo) -> bool:
    return cfg.parallelism == "fsdp" and info.distributed


def _check_losses(run: Run, losses: torch.Tensor, val_loss: float) -> None:
    """A run whose last losses are non-finite, or that skipped most of its steps, did not train."""
    n = len(run.rows)
    last = losses[-min(3, n):]
    if not bool(torch.isfinite(last).all()) or not math.isfinite(val_loss):
        raise NonFiniteLoss(f"the run ended with non-finite losses (last training losses {last.tolist()}, "
                            f"validation loss {val_loss}); it did not train")
    if run.n_skipped * 2 > n:
        raise NonFiniteLoss(f"nan_policy='skip' skipped {run.n_skipped} of {n} steps: the run did not train")


def _check_replicas_agree(model: torch.nn.Module, info: DistInfo) -> None:
    """Raise on every rank if the replicas' parameters differ (compares float64 fingerprints: sum, sum of
    squares and an index-weighted sum of all parameters, and finiteness)."""
    if not info.distributed:
        return
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in model.parameters()])
    idx = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
    finite = float(bool(torch.isfinite(flat).all()))
    flat = torch.nan_to_num(flat)
    mine = torch.stack([flat.sum(), (flat * flat).sum(), (flat * idx).sum(), torch.tensor(finite, dtype=torch.float64)])
    everyone = distributed.all_gather(mine, info)
    differ = [r for r in range(info.world_size) if not torch.equal(everyone[r], everyone[0])]
    if differ:
        raise RuntimeError(f"parameters differ across ranks after training: ranks {differ} disagree with rank 0")


def main(argv: list[str] | None = None) -> int:
    """``python -m kanlib.train --key=value ...``: one run of the config the arguments give (kanlib.train_cli)."""
    return train_cli.main(sys.argv[1:] if argv is None else argv, train)


if __name__ == "__main__":
    code = main()
    # Training is over: the process group is destroyed and every file written and closed. Leave
    # without running C++ static destructors, where gloo's background threads now and then abort
    # the exit ("terminate called without an active exception"), turning a finished run into a
    # failed one. Errors still propagate above with their traceback and a non-zero exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
