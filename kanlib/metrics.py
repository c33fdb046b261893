"""Measurements of a run: phase timing, peak memory, process start, summaries.

Definitions (also in docs/measurement.md):
- step time: wall time of forward + backward + optimizer of one step; a run's step time is the
  median over measured (post-warm-up) steps of the maximum over ranks (the slowest rank sets the pace).
- phases are read with the host clock on CPU and with CUDA events on GPU (one synchronisation per
  step, when the step's times are read), so timing does not serialise the GPU's queue.
- communication timing lives with the communication hooks (kanlib.hooks).
"""

from __future__ import annotations

import os
import resource
import sys
import time

import numpy as np
import torch


class PhaseClock:
    """Marks the boundaries of a step's phases; :meth:`read` gives each phase's duration in seconds.

    ``mark(name)`` ends the phase ``name`` (started at the previous mark, or :meth:`start`). On CUDA
    the marks are events on the current stream, read after one ``synchronize`` in :meth:`read`.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self) -> None:
        self._marks = [("", self._now())]

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def read(self) -> dict[str, float]:
        """Seconds per phase name (a name marked twice accumulates), since :meth:`start`."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self._marks, self._marks[1:]):
            dt = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


_CPU_PEAK_RESET = {"ok": False}  # whether this process's resident high-water mark was reset (per-run peak)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA's allocator statistics; on CPU (Linux) the process's resident
    high-water mark, by writing ``5`` to ``/proc/self/clear_refs`` (which resets ``VmHWM`` and ``ru_maxrss``),
    so a process that runs many runs (a worker group) reports each run's own peak."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _CPU_PEAK_RESET["ok"] = True
    except OSError:  # not Linux, or not allowed: the peak stays the process's since it started
        _CPU_PEAK_RESET["ok"] = False


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory and what it measures: ``cuda_max_allocated`` (the allocator's peak since the last
    reset), ``cpu_peak_rss`` (the process's peak resident set since the last reset, :func:`reset_peak_memory`)
    or ``cpu_peak_rss_process`` (since the process started, where the reset is not possible)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    hwm = _vm_hwm_bytes()
    if hwm is not None and _CPU_PEAK_RESET["ok"]:
        return hwm, "cpu_peak_rss"
    rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return (rss if sys.platform == "darwin" else rss * 1024), "cpu_peak_rss_process"  # macOS: bytes; Linux: KiB


def _vm_hwm_bytes() -> int | None:
    """``VmHWM`` of ``/proc/self/status`` in bytes (None where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_memory(device: torch.device) -> tuple[int | None, int | None]:
    """CUDA: (peak reserved by the allocator, total - free device memory now); None on CPU.

    ``mem_get_info`` counts everything on the device: the CUDA context, NCCL's buffers and other
    processes' memory, which the allocator's statistics do not see.
    """
    if device.type != "cuda":
        return None, None
    free, total = torch.cuda.mem_get_info(device)
    return int(torch.cuda.max_memory_reserved(device)), int(total - free)


def model_state_bytes(model: torch.nn.Module, optimizer_states_per_param: int) -> int:
    """Bytes of parameters, their gradients and the optimizer's per-parameter states (whole model)."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n * (2 + optimizer_states_per_param)


def process_start_time() -> float:
    """Wall-clock time (s since the epoch) this process started (Linux /proc; else now)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))  # 10 ms resolution
    except (OSError, ValueError, IndexError):
        return time.time()


def summarize(values) -> dict:
    """Median, 10th and 90th percentile of a sequence (NaN when empty)."""
    a = np.asarray(list(values), dtype=float)
    if a.size == 0:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan")}
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)),
            "p90": float(np.percentile(a, 90))}
