"""DDP communication hooks: how a run's gradient buckets are communicated, and timed.

:func:`register` installs what ``cfg.comm_hook`` asks for on a DDP module and returns a
:class:`CommStats` (None for DDP's built-in all-reduce, which nothing times):

- ``timed``: all-reduce (average) each bucket and time it;
- ``noop``: no network at all (``debugging_hooks.noop_hook``), for exposed communication.

Timing: each bucket's communication is an interval from its launch to its completion (CUDA events
on GPU, the host clock when the future completes on CPU). Buckets queue behind each other, so a
step's communication time is the *union* of its buckets' intervals, not their sum (k buckets ready
together would otherwise count about k(k+1)/2 transfer times).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class CommStats:
    """Per-step timing of a DDP module's bucket communication (hook state).

    :meth:`end_step` returns the step's communication time (the union of its bucket intervals) and
    resets; ``n_buckets`` and ``bucket_bytes`` describe the buckets of the last complete step.
    """

    def __init__(self, device: torch.device, process_group=None):
        self.device = device
        self.process_group = process_group
        self._host: list[tuple[float, float]] = []  # (start, end) host seconds, CPU path
        self._events: list[tuple] = []  # (start, end) CUDA events
        self._bytes: list[int] = []
        self._emulated = 0.0  # seconds an emulated link added this step
        self.n_buckets = 0
        self.bucket_bytes: list[int] = []

    def end_step(self) -> tuple[float, float]:
        """``(in_flight_s, emulated_s)`` of the step: the union of its bucket communication intervals,
        and the delay an emulated link added to them (0 without emulation); resets the step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if self._events:
                ref = self._events[0][0]
                spans = [(ref.elapsed_time(s) / 1e3, ref.elapsed_time(e) / 1e3) for s, e in self._events]
            else:
                spans = []
        else:
            spans = self._host
        total = union_length(spans)
        if self._bytes:
            self.n_buckets, self.bucket_bytes = len(self._bytes), list(self._bytes)
        self._host, self._events, self._bytes = [], [], []
        emulated, self._emulated = self._emulated, 0.0
        return total, emulated


def union_length(spans) -> float:
    """Total length covered by the intervals ``spans`` (``(start, end)`` pairs), overlaps counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(spans):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def timed_allreduce_hook(state: CommStats, bucket):
    """All-reduce (average) a gradient bucket and record its launch-to-completion interval."""
    group = state.process_group or dist.group.WORLD
    world = dist.get_world_size(group)
    tensor = bucket.buffer().div_(world)
    state._bytes.append(tensor.numel() * tensor.element_size())
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
            state._host.append((t0, time.perf_counter()))
            return f.value()[0]
    return fut.then(done)


def register(ddp, cfg, device: torch.device) -> CommStats | None:
    """Install ``cfg.comm_hook`` on ``ddp``; returns the hook's :class:`CommStats` (None when untimed)."""
    if cfg.comm_hook == "default":
        return None
    if cfg.comm_hook == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        ddp.register_comm_hook(None, noop_hook)
        return None
    if cfg.comm_hook == "timed":
        stats = CommStats(device)
        ddp.register_comm_hook(stats, timed_allreduce_hook)
        return stats
    raise NotImplementedError(f"comm_hook: {cfg.comm_hook!r} is not implemented by this version")
