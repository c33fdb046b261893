"""Measurements of a run: phase timing, peak memory, process start, summaries.

Definitions (also in docs/measurement.md):
- step time: wall time of forward + backward + optimizer of one step; a run's step time is the
  median over measured (post-warm-up) steps of the maximum over ranks (the slowest rank sets the pace).
- phases are read with the host clock on CPU and with CUDA events on GPU (one synchronisation per
  step, when the step's times are read), so timing does not serialise the GPU's queue.
- communication timing lives with the communication hooks (kanlib.hooks).
"""

from __future__ import annotations

import contextlib
import functools
import operator
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


# The host allocator (glibc malloc) on its defaults serves each block above a threshold (at most 32 MiB, moving as
# blocks are freed) with a fresh mapping, returns it to the kernel when freed, and trims the heap's top: such a step's
# tensors are faulted in again, page by page, every step. On a 2-core VM a one-process KAN step at 2048 samples ran
# at 31-34 or 36-51 ms from one run to the next in one worker, as the threshold moved, and at a global batch of 8192
# (tensors above 32 MiB) at 200 ms with 3.1 million page faults a run against 129 ms from the heap: the one-process
# baseline, and with it every efficiency, measured the allocator. ``steady`` serves every block from the heap and does
# not trim it during a run, as CUDA's caching allocator keeps a step's memory. KANLIB_HOST_MALLOC=system leaves
# glibc's defaults. docs/measurement.md, benchmarks/host_malloc.py.
HOST_MALLOC_ENV = "KANLIB_HOST_MALLOC"
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4  # mallopt parameters (malloc.h)
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: never trim the heap's top on its own
_HOST_MALLOC: dict = {"mode": None, "libc": None}


def _libc():
    """glibc through ctypes, or None (not Linux, musl, or a libc without mallopt)."""
    if _HOST_MALLOC["libc"] is None:
        lib = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                cand = ctypes.CDLL("libc.so.6")
                if hasattr(cand, "mallopt") and hasattr(cand, "malloc_trim"):
                    lib = cand
            except OSError:
                pass
        _HOST_MALLOC["libc"] = lib
    return _HOST_MALLOC["libc"] or None


def steady_host_allocator() -> str:
    """Serve every block of this process from glibc malloc's heap, untrimmed during a run (once; later calls return the
    mode; the heap is trimmed between runs by :func:`release_host_memory`): returns
    ``steady`` when applied, ``system`` where KANLIB_HOST_MALLOC=system asks to leave the defaults or there is no
    glibc (the record's ``host_malloc``). Unknown values of the variable raise, naming it."""
    if _HOST_MALLOC["mode"] is not None:
        return _HOST_MALLOC["mode"]
    want = os.environ.get(HOST_MALLOC_ENV, "steady").strip().lower() or "steady"
    if want not in ("steady", "system"):
        raise ValueError(f"{HOST_MALLOC_ENV}={os.environ[HOST_MALLOC_ENV]!r}: expected 'steady' or 'system'")
    lib = _libc() if want == "steady" else None
    ok = lib is not None and all(lib.mallopt(p, v) == 1 for p, v in (
        (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, 0)))
    _HOST_MALLOC["mode"] = "steady" if ok else "system"
    return _HOST_MALLOC["mode"]


def release_host_memory() -> None:
    """Give the C heap's free memory back to the kernel (glibc's ``malloc_trim``; nothing without glibc): as a run
    ends and as its peak-memory window starts (after warm-up), so a run's resident set, and with it its peak, starts
    from what is live, not from what the warm-up or an earlier run of the process freed."""
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)


_CPU_PEAK_RESET = {"ok": False}  # whether this process's resident high-water mark was reset (per-run peak)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA's allocator statistics; on CPU (Linux) the process's resident
    high-water mark, by writing ``5`` to ``/proc/self/clear_refs`` (which resets ``VmHWM`` and ``ru_maxrss``),
    so a process that runs many runs (a worker group) reports each run's own peak."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    release_host_memory()
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


# -- tensor memory: the bytes a training step's tensors take, counted by the allocator -------------------
def state_tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                       ddp_buckets: bool = False) -> int:
    """Bytes of the tensors a training step starts from and keeps, counted from the tensors themselves: this rank's
    parameters (its shards under FSDP), buffers and allocated gradients, every tensor in the optimizer's state
    (nested lists and dicts too: L-BFGS's history), each storage once; ``ddp_buckets``: plus DDP's gradient buckets,
    which its reducer keeps for the whole run (one gradient-sized copy of the trainable parameters; the gradients
    are views into them under ``gradient_as_bucket_view``)."""
    seen: set = set()
    total = 0

    def add(obj) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            t = obj.to_local() if hasattr(obj, "to_local") else obj  # an FSDP shard: this rank's part
            st = t.untyped_storage()
            key = (t.device, st.data_ptr())
            if key not in seen and st.nbytes():
                seen.add(key)
                total += st.nbytes()
        elif isinstance(obj, dict):
            for v in obj.values():
                add(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                add(v)

    for p in model.parameters():
        add(p)
        add(p.grad)
    for b in model.buffers():
        add(b)
    if optimizer is not None:
        for st in optimizer.state.values():
            add(st)
    if ddp_buckets:
        total += sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return total


def allocator_rise_bytes(step, device: torch.device) -> int:
    """Run ``step()`` once and return the most the bytes of live tensors rose above their level at its start, as the
    allocator counts them. CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, less
    ``memory_allocated`` at the start. CPU: torch's profiler with ``profile_memory``: its memory events are each
    allocation (+bytes) and free (-bytes) of the CPU allocator in order, and the running sum's maximum is the rise
    (a block allocated before the profile and freed inside it is not counted down: the rise is an upper bound
    there). Resets CUDA's peak statistics: read the run's peak memory first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return max(0, int(torch.cuda.max_memory_allocated(device)) - int(before))
    from torch.autograd import DeviceType
    from torch.autograd.profiler import profile

    prof = profile(use_cpu=True, profile_memory=True)
    with _quiet_stderr():  # Kineto prints a line to stderr as it starts and stops: not the run's news
        prof.__enter__()
    try:
        step()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    host = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
    events = sorted((e for e in prof.kineto_results.events() if e.name() == "[memory]" and e.device_type() in host),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return int(peak)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the moment inside (C++ code writes there, not through ``sys.stderr``)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (a detached process): nothing to quieten
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def step_tensor_peak_bytes(step, device: torch.device, model: torch.nn.Module,
                           optimizer: torch.optim.Optimizer | None = None, ddp_buckets: bool = False) -> int:
    """The tensor memory of one training step ``step()`` (forward, backward, optimizer): the bytes live at its start
    that it keeps (:func:`state_tensor_bytes`: parameters, buffers, gradients, optimizer state, DDP's buckets) plus
    the most the allocator's live bytes rose during it (:func:`allocator_rise_bytes`: the batch, activations, new
    gradients, communication and optimizer temporaries). Not the process's resident set: the framework's code,
    caches and the data set a process holds on the host are not counted, so the number follows the model's size."""
    return state_tensor_bytes(model, optimizer, ddp_buckets) + allocator_rise_bytes(step, device)


def measure_step_tensor_peak(run) -> int:
    """:func:`step_tensor_peak_bytes` of one extra training step of a :class:`kanlib.train.Run`, after its measured
    steps (untimed; every rank takes it, as DDP's all-reduce and FSDP's gathers are collective): the first
    micro-batch of a next batch through ``run.module`` (forward under the run's autocast, loss, backward), then the
    optimizer's update (L-BFGS: its step with line search). The parameters and buffers are put back afterwards, so
    the trained model is unchanged; the optimizer's state is not (the run is over)."""
    from kanlib import optim

    cfg, info = run.cfg, run.info
    k = cfg.grad_accum_steps
    kept = [t.detach().clone() for t in (*run.model.parameters(), *run.model.buffers())]
    run.optimizer.zero_grad(set_to_none=True)
    batch: list = []

    def forward_backward() -> torch.Tensor:
        x, y = batch
        with run.autocast:
            out = run.module(x)
        loss = run.data.loss(out, y)
        loss.backward()
        return loss.detach()

    def step() -> None:
        x, y = run.data.shard(cfg.steps, cfg.global_batch, info.rank, info.world_size)  # the batch is the step's
        x, y = (x.chunk(k)[0], y.chunk(k)[0]) if k > 1 else (x, y)
        batch[:] = x.to(info.device), y.to(info.device)
        loss = forward_backward()
        if isinstance(run.optimizer, optim.LBFGS):
            optim.lbfgs_step(run.optimizer, forward_backward, loss, info, PhaseClock(info.device),
                             new_batch=cfg.global_batch < run.data.n_train)
        else:
            run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)

    from torch.nn.parallel import DistributedDataParallel

    try:
        return step_tensor_peak_bytes(step, info.device, run.model, run.optimizer,
                                      ddp_buckets=isinstance(run.module, DistributedDataParallel))
    finally:
        with torch.no_grad():
            for t, v in zip((*run.model.parameters(), *run.model.buffers()), kept):
                t.copy_(v)


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


def estimate_memory_bytes(cfg) -> dict[str, int]:
    """A lower estimate of one process's memory for a :class:`kanlib.config.RunConfig`, from the config alone (no
    model is built), by the field that sets each part: ``widths`` (parameters, gradients and optimizer states:
    ``grid_size + spline_order`` coefficients and two more weights per edge of a KAN, the finest grid of
    ``grid_extension``), ``global_batch`` (the spline bases of one micro-batch and their gradients) and
    ``n_train`` (every process holds the whole data set). 4 bytes a number (8 under ``precision=fp64``)."""
    coeff = max((cfg.grid_size, *cfg.grid_extension)) + cfg.spline_order
    edges = [(a, b) for a, b in zip(cfg.widths, cfg.widths[1:])]
    if cfg.model == "mlp":
        params = sum(a * b + b for a, b in edges)
        per_sample = sum(cfg.widths)
    else:
        params = sum(a * b * (coeff + 2) for a, b in edges)
        per_sample = sum(a * coeff + b for a, b in edges)
    states = 2 * cfg.lbfgs_history + 2 if cfg.optimizer == "lbfgs" else 2 if cfg.optimizer == "adam" else 0
    micro = max(1, cfg.global_batch // (cfg.world_size * cfg.grad_accum_steps))
    size = 8 if cfg.precision == "fp64" else 4
    return {"widths": size * params * (2 + states), "global_batch": size * 2 * micro * per_sample,
            "n_train": size * (cfg.n_train + cfg.n_val) * (cfg.widths[0] + cfg.widths[-1])}


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


# -- interference: what else ran where this process ran ------------------------------------------------
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_jiffies() -> dict[int, tuple[int, int]]:
    """Per CPU of ``/proc/stat``: (busy jiffies: user + nice + system + irq + softirq, steal jiffies)."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *vals = line.split()
                v = [int(x) for x in vals] + [0] * 8
                out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7])
    except (OSError, ValueError):
        return {}
    return out


def _threads_schedstat() -> tuple[int, int, int] | None:
    """(ns on a CPU summed over this process's threads, ns its main thread waited runnable, ns all threads waited
    runnable) from ``/proc/self/task/*/schedstat``; None where the kernel does not keep them."""
    try:
        on = wait_all = 0
        main_wait = None
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run_ns, wait_ns, _ = (int(x) for x in f.read().split()[:3])
            except (OSError, ValueError):
                continue
            on += run_ns
            wait_all += wait_ns
            if int(tid) == os.getpid():
                main_wait = wait_ns
        return (on, main_wait or 0, wait_all) if main_wait is not None else None
    except OSError:
        return None


class InterferenceProbe:
    """What other processes took from the CPUs this process may run on, over a window (a run's measured steps).

    :meth:`start` and :meth:`stop` sample ``/proc/stat``'s per-CPU counters (busy and steal jiffies), this
    process's own CPU time and run-queue waits (``/proc/self/task/*/schedstat``, all threads), its involuntary
    context switches (``getrusage``) and the 1-minute load average. :meth:`stop` returns this rank's sample;
    :func:`combine_interference` turns every rank's into the record's fields. Where a counter is unreadable
    (not Linux) its fields are None: unknown, not zero.
    """

    def __init__(self, device: torch.device | None = None):
        self._a: dict | None = None
        self.device = device

    def _sample(self) -> dict:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        return {"t": time.monotonic(), "cpus": cpus, "jiffies": _cpu_jiffies(), "sched": _threads_schedstat(),
                "nivcsw": resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
                "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}

    def start(self) -> None:
        self._a = self._sample()

    @property
    def started(self) -> bool:
        return self._a is not None

    def stop(self) -> dict:
        """This rank's window: seconds, its CPUs, each CPU's busy and steal seconds, its own CPU seconds, its main
        thread's run-queue wait, involuntary switches, load at start and end, and its host."""
        import socket

        a, b = self._a, self._sample()
        if a is None:
            return {}
        busy = {c: (b["jiffies"][c][0] - a["jiffies"][c][0]) / _USER_HZ for c in a["cpus"]
                if c in a["jiffies"] and c in b["jiffies"]}
        steal = {c: (b["jiffies"][c][1] - a["jiffies"][c][1]) / _USER_HZ for c in busy}
        sched = (None if a["sched"] is None or b["sched"] is None
                 else [(y - x) / 1e9 for x, y in zip(a["sched"], b["sched"])])
        out = {"host": socket.gethostname(), "window_s": b["t"] - a["t"], "cpus": list(busy), "busy_s": busy,
               "steal_s": steal, "own_cpu_s": sched[0] if sched else None,
               "main_wait_s": sched[1] if sched else None, "nivcsw": b["nivcsw"] - a["nivcsw"],
               "minflt": b["minflt"] - a["minflt"], "load_start": a["load"], "load_end": b["load"]}
        if self.device is not None and self.device.type == "cuda":
            out.update(gpu_interference(self.device))
        return out


def gpu_interference(device: torch.device) -> dict:
    """Other processes on this rank's GPU and the driver's clock-throttle reasons now, through NVML (``pynvml``)
    where it is installed; ``None`` (unknown) where it is not or the driver does not say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)  # NVML's index; CUDA_VISIBLE_DEVICES may reorder them
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        others = len({p.pid for p in procs} - {os.getpid()})
        reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        idle = getattr(pynvml, "nvmlClocksThrottleReasonGpuIdle", 1)
        app = getattr(pynvml, "nvmlClocksThrottleReasonApplicationsClocksSetting", 2)
        return {"gpu_other_processes": others, "gpu_throttle_reasons": reasons & ~(idle | app)}
    except Exception:  # noqa: BLE001 - no pynvml, no driver support: unknown, not zero
        return {"gpu_other_processes": None, "gpu_throttle_reasons": None}


def combine_interference(per_rank: list[dict]) -> dict:
    """The record's interference fields from every rank's :meth:`InterferenceProbe.stop`.

    Ranks of one host whose CPU sets overlap (unpinned ranks) are taken together: other processes' CPU time on
    their CPUs is the CPUs' busy time minus all those ranks' own. ``foreign_cpu_frac`` is that over the window's
    CPU time (window x CPUs), the largest over hosts and CPU sets; ``steal_frac`` the same for steal time;
    ``runqueue_wait_frac`` the largest share of the window any rank's training thread waited runnable;
    ``foreign_wait_frac`` the largest part of such a wait other processes can explain (at most their CPU time on the
    rank's CPUs: on a pinned rank's one CPU, their share of it).
    """
    gpu = _gpu_fields(per_rank)
    ranks = [r for r in per_rank if r and r.get("busy_s")]
    if not ranks or any(r.get("own_cpu_s") is None for r in ranks):
        return {**gpu, "foreign_cpu_frac": None, "steal_frac": None, "runqueue_wait_frac": None,
                "foreign_wait_frac": None,
                "involuntary_switches": max((r["nivcsw"] for r in per_rank if r), default=None),
                "minor_page_faults": max((r["minflt"] for r in per_rank if r and "minflt" in r), default=None),
                "load_1m_start": per_rank[0].get("load_start") if per_rank and per_rank[0] else None,
                "load_1m_end": per_rank[0].get("load_end") if per_rank and per_rank[0] else None,
                "interference_window_s": None}
    groups: list[list[dict]] = []
    for r in ranks:  # connected components of overlapping CPU sets on one host
        joined = [g for g in groups if g[0]["host"] == r["host"] and any(set(r["cpus"]) & set(x["cpus"]) for x in g)]
        merged = [r] + [x for g in joined for x in g]
        groups = [g for g in groups if g not in joined] + [merged]
    foreign, steal, explained = [], [], []
    for g in groups:
        cpus = sorted({c for r in g for c in r["cpus"]})
        busy = sum(max(r["busy_s"].get(c, 0.0) for r in g) for c in cpus)
        stolen = sum(max(r["steal_s"].get(c, 0.0) for r in g) for c in cpus)
        window = max(r["window_s"] for r in g)
        if window > 0:
            other = max(0.0, busy - sum(r["own_cpu_s"] for r in g))  # other processes' CPU-s on these CPUs
            foreign.append(other / (window * len(cpus)))
            steal.append(stolen / (window * len(cpus)))
            # a training thread waits behind other processes at most as long as they ran on the CPU it waited
            # for: on a pinned rank's own CPU, their share of it; on a set of CPUs, all of theirs on one of them
            explained += [min(r["main_wait_s"], other) / r["window_s"] for r in g if r["window_s"] > 0]
    return {**gpu, "foreign_cpu_frac": max(foreign) if foreign else None, "steal_frac": max(steal) if steal else None,
            "runqueue_wait_frac": max(r["main_wait_s"] / r["window_s"] for r in ranks if r["window_s"] > 0),
            "foreign_wait_frac": max(explained) if explained else None,
            "involuntary_switches": max(r["nivcsw"] for r in ranks),
            "minor_page_faults": max((r["minflt"] for r in ranks if "minflt" in r), default=None),
            "load_1m_start": ranks[0]["load_start"], "load_1m_end": ranks[0]["load_end"],
            "interference_window_s": max(r["window_s"] for r in ranks)}


def _gpu_fields(per_rank: list[dict]) -> dict:
    """The most other processes any rank's GPU had, and every throttle reason any reported (OR); None if unknown."""
    others = [r.get("gpu_other_processes") for r in per_rank if r]
    reasons = [r.get("gpu_throttle_reasons") for r in per_rank if r]
    known_o = [o for o in others if o is not None]
    known_r = [x for x in reasons if x is not None]
    return {"gpu_other_processes": max(known_o) if known_o else None,
            "gpu_throttle_reasons": int(functools.reduce(operator.or_, known_r, 0)) if known_r else None}
