"""Measurements of a run: phase timing, communication timing hooks, peak memory, summaries.

Definitions (also in docs/measurement.md):
- step time: wall time of forward + backward + optimizer of one step, the device synchronised
  before each clock read; a run's step time is the median over measured (post-warm-up) steps
  of the maximum over ranks (the slowest rank sets the pace).
- total communication (``comm_total_s``): per step, the sum over DDP buckets of the time from
  launching the bucket's all-reduce to its completion (CUDA events on GPU, host clock when the
  future completes on CPU). It includes time queued behind earlier buckets.
- exposed communication: ``T_allreduce - T_noop`` from two runs of one config, the second with
  a no-op hook that keeps bucketing and removes only the network (see kanlib.results).
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


class CommTimer:
    """DDP communication-hook state that all-reduces each bucket and times it.

    Register with ``ddp.register_comm_hook(CommTimer(device), timed_allreduce_hook)``;
    :meth:`step_total` returns the summed bucket time of the step and resets.
    """

    def __init__(self, device: torch.device, process_group=None):
        self.device = device
        self.process_group = process_group
        self._host: list[float] = []  # seconds, CPU path
        self._events: list[tuple] = []  # (start, end) CUDA events
        self.n_buckets = 0

    def step_total(self) -> float:
        """Sum of bucket all-reduce times since the last call, in seconds."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            total = sum(s.elapsed_time(e) for s, e in self._events) / 1e3
        else:
            total = sum(self._host)
        self.n_buckets = max(self.n_buckets, len(self._host) + len(self._events))
        self._host, self._events = [], []
        return total


def timed_allreduce_hook(state: CommTimer, bucket):
    """All-reduce (average) a gradient bucket and record how long it took."""
    group = state.process_group or dist.group.WORLD
    world = dist.get_world_size(group)
    tensor = bucket.buffer().div_(world)
    if state.device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            end = torch.cuda.Event(enable_timing=True)
            end.record()  # runs on the stream that waited for the all-reduce
            state._events.append((start, end))
            return f.value()[0]
    else:
        t0 = time.perf_counter()
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            state._host.append(time.perf_counter() - t0)
            return f.value()[0]
    return fut.then(done)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA only; CPU reports the process's peak RSS)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory and what it measures: CUDA max allocated, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return (rss if sys.platform == "darwin" else rss * 1024), "cpu_peak_rss"  # macOS: bytes; Linux: KiB


def model_state_bytes(model: torch.nn.Module, optimizer_states_per_param: int) -> int:
    """Bytes of parameters, their gradients and the optimizer's per-parameter states."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n * (2 + optimizer_states_per_param)


def summarize(values) -> dict:
    """Median, 10th and 90th percentile of a sequence (NaN when empty)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan")}
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)),
            "p90": float(np.percentile(a, 90))}
