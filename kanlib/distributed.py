"""Process-group set-up from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE), and the few
collectives the training loop itself issues.

nccl on CUDA, gloo on CPU; a single process without torch.distributed when RANK is unset. Every
collective here moves its tensor to ``info.device`` first: an nccl group handles CUDA tensors only.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kanlib.errors import ConfigError


@dataclass
class DistInfo:
    """Where this process stands: rank, world, device and backend (None when not distributed)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; an explicit choice is checked."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' was asked for, but no CUDA device is visible")
    return device


def resolve_backend(backend: str, device: str) -> str:
    """'auto' -> nccl on CUDA, gloo on CPU."""
    if backend == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise RuntimeError("backend: 'nccl' needs CUDA devices; use gloo on CPU")
    return backend


def nccl_env(algo: str, proto: str) -> dict[str, str]:
    """NCCL variables restricting the all-reduce algorithm and protocol, and only all-reduce.

    Tree exists for all-reduce only, so a plain ``NCCL_ALGO=Tree`` makes broadcast and all-gather fail
    on some NCCL versions ("no algorithm/protocol available"); the per-collective form
    ``allreduce:<value>`` (NCCL >= 2.24) limits it to all-reduce. Older NCCL does not parse that form,
    so there the plain value is used. Empty values set nothing (NCCL chooses).
    """
    out = {}
    per_collective = _nccl_version() >= (2, 24, 0)
    if algo and not per_collective:
        import warnings

        warnings.warn(f"nccl_algo={algo!r}: NCCL {'.'.join(map(str, _nccl_version()))} has no per-collective "
                      f"NCCL_ALGO (2.24+), so it applies to every collective; Tree fails broadcast and all-gather "
                      f"on some versions")
    for var, value in (("NCCL_ALGO", algo), ("NCCL_PROTO", proto)):
        if value:
            out[var] = f"allreduce:{value}" if per_collective else value
    return out


def _nccl_version() -> tuple[int, ...]:
    try:
        return tuple(torch.cuda.nccl.version())
    except Exception:  # no NCCL in this build
        return (0,)


_CPU_CLAIMS: list = []  # open lock files of the CPUs this process holds (released when it exits)
CPUS_SHARED = False
"""Whether this process asked for CPUs of its own (:func:`pin_cpus`) and found none free: it shares cores with
another kanlib process (a second study on this host), which its record says (``cpus_shared``)."""


def cpu_slot_dir() -> str:
    """Where processes of this host claim CPUs: ``$KANLIB_CPU_SLOTS``, else ``<tmp>/kanlib-cpu-slots``."""
    return os.environ.get("KANLIB_CPU_SLOTS") or os.path.join(tempfile.gettempdir(), "kanlib-cpu-slots")


def _claim(cpus: list[int], where: str) -> list:
    """Lock files of ``cpus`` (all or none): an exclusive, non-blocking flock on ``<where>/cpu<i>``."""
    held = []
    try:
        for c in cpus:
            held.append(os.open(os.path.join(where, f"cpu{c}"), os.O_RDONLY | os.O_CREAT, 0o444))
            fcntl.flock(held[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # taken by another process, or the file cannot be opened: hold none of the block
        for fd in held:
            os.close(fd)  # closing the last descriptor releases its lock
        return []
    return held


def pin_cpus(cfg, device: str) -> list[int]:
    """Pin this launched process (and the threads it starts later) to ``cfg.threads`` CPUs no other kanlib
    process on this host holds; returns the CPUs, or ``[]`` when it is left to the OS.

    Left to the OS, two ranks on two cores sometimes shared one core for a whole run (steps twice as long,
    docs/measurement.md). Only with ``cfg.cpu_affinity == "auto"``, on CPU, on Linux, in a process a
    launcher started (torchrun sets ``RANK``: a notebook kernel or test process calling ``train`` is never
    pinned, nor are the processes it starts later). Each process claims a free block of CPUs among those it
    may use (``os.sched_getaffinity``, which honours taskset, cgroups and SLURM's binding) with a lock file
    per CPU, held until it exits, so torchruns of several "nodes" on one host and two sweeps at once get
    CPUs of their own; when no block is free the process is not pinned.
    """
    if (cfg.cpu_affinity != "auto" or device != "cpu" or "RANK" not in os.environ
            or not hasattr(os, "sched_setaffinity") or _CPU_CLAIMS):
        return []
    allowed = _ALLOWED_CPUS or sorted(os.sched_getaffinity(0))
    _ALLOWED_CPUS[:] = allowed
    where = cpu_slot_dir()
    try:
        os.makedirs(where, exist_ok=True)
        if os.stat(where).st_uid == os.getuid():
            os.chmod(where, 0o1777)  # other users of this host claim CPUs in the same folder
    except OSError:
        return []
    n = cfg.threads
    for start in range(0, len(allowed) - n + 1, n):
        block = allowed[start:start + n]
        held = _claim(block, where)
        if held:
            _CPU_CLAIMS.extend(held)
            os.sched_setaffinity(0, block)
            return block
    global CPUS_SHARED
    CPUS_SHARED = True
    print(f"kanlib: rank {os.environ.get('RANK')}: no {n} free CPU(s) among {len(allowed)} (other kanlib processes on "
          f"this host hold them, {where}); running where the OS puts it, sharing cores: its timings are "
          f"disturbed, and its record says cpus_shared", file=sys.stderr, flush=True)
    return []


def unpin_cpus() -> None:
    """Give back the CPUs :func:`pin_cpus` claimed (a worker group waiting between two sweep rounds holds none,
    so the groups of other placements that run meanwhile get CPUs of their own); the process may then run on
    any CPU it is allowed."""
    while _CPU_CLAIMS:
        os.close(_CPU_CLAIMS.pop())  # closing the descriptor releases its lock
    _set_affinity_of_threads(_ALLOWED_CPUS or sorted(os.sched_getaffinity(0)))


def repin_cpus(cfg, device: str, wait_s: float = 2.0) -> list[int]:
    """Claim CPUs again after :func:`unpin_cpus` (as :func:`pin_cpus`) and move every thread of this process
    there, the threads gloo and OpenMP started earlier included. The group that ran just before may still be
    giving its CPUs back: a free block is waited for up to ``wait_s`` before the process shares cores."""
    global CPUS_SHARED
    CPUS_SHARED = False
    if cfg.cpu_affinity == "auto" and device == "cpu" and hasattr(os, "sched_setaffinity"):
        allowed, n = _ALLOWED_CPUS or sorted(os.sched_getaffinity(0)), cfg.threads
        until = time.monotonic() + wait_s
        while not _CPU_CLAIMS and time.monotonic() < until:
            if any(_free(allowed[i:i + n]) for i in range(0, len(allowed) - n + 1, n)):
                break
            time.sleep(0.02)
    block = pin_cpus(cfg, device)
    if block:
        _set_affinity_of_threads(block)
    return block


def _free(cpus: list[int]) -> bool:
    """Whether no kanlib process holds any of ``cpus`` now (a look, not a claim)."""
    held = _claim(cpus, cpu_slot_dir())
    for fd in held:
        os.close(fd)
    return bool(held)


_ALLOWED_CPUS: list[int] = []  # the CPUs this process could use before it pinned itself


def _set_affinity_of_threads(cpus: list[int]) -> None:
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def check_launch(cfg) -> None:
    """Refuse a config whose processes are not the ones launched: one process without a launcher for an N-process
    config, or a launcher's ``WORLD_SIZE`` other than ``nnodes x nproc_per_node`` (``torchrun --nproc-per-node 2``
    without ``--nproc_per_node=2``). Cheap and collective-free, so the entry point checks it before it creates the
    run's folder: a mismatch leaves nothing behind."""
    if "RANK" not in os.environ:
        if cfg.world_size != 1:
            # one process would train and file its result as an N-process run (issue 23)
            raise ConfigError(
                f"nproc_per_node: nnodes x nproc_per_node = {cfg.nnodes} x {cfg.nproc_per_node} processes, but "
                f"this is one process without a launcher (RANK is unset); start it with torchrun or "
                f"runners.launch.run, or set nnodes=1 nproc_per_node=1")
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != cfg.world_size:
        raise ConfigError(
            f"nproc_per_node: the launcher started WORLD_SIZE={world} processes, but the config asks for nnodes x "
            f"nproc_per_node = {cfg.nnodes} x {cfg.nproc_per_node} = {cfg.world_size}; torchrun's own "
            f"--nproc-per-node/--nnodes do not set the config's: pass the same numbers as --nnodes=N "
            f"--nproc_per_node=P after the module (runners.launch.run does both)")


def setup(cfg) -> DistInfo:
    """Initialise the process group (if launched by torchrun) and pick this rank's device.

    Pins the process to CPUs of its own first (:func:`pin_cpus`), so gloo's and OpenMP's threads, started
    later, inherit it."""
    check_launch(cfg)
    device = resolve_device(cfg.device)
    pin_cpus(cfg, device)
    torch.set_num_threads(cfg.threads)
    if "RANK" not in os.environ:
        dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        if device == "cuda":
            torch.cuda.set_device(dev)
        return DistInfo(0, 0, 1, dev, None)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ["WORLD_SIZE"])
    backend = resolve_backend(cfg.backend, device)
    if backend == "nccl":
        os.environ.update(nccl_env(getattr(cfg, "nccl_algo", ""), getattr(cfg, "nccl_proto", "")))
    if device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    kwargs = {"device_id": dev} if device == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=cfg.pg_timeout_s), **kwargs)
    return DistInfo(rank, local_rank, world, dev, backend)


def teardown(info: DistInfo) -> None:
    """Destroy the process group if one was created."""
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


class StopRequest:
    """Turns SIGTERM into a request to stop at the next step boundary (agreed by every rank)."""

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
            self._prev = None


@dataclass
class Group:
    """The processes that run one or more runs together: their process group (``info``), the SIGTERM
    stop request they share, and which launch they are (kanlib.worker runs many runs per launch).

    ``launch_id`` names the launch (empty for a run that set up its own processes); ``runs_before`` counts the
    runs this launch ran before the current one (0 for the first), so the analysis can compare a group's
    first run with later ones."""

    info: DistInfo
    stop: StopRequest
    launch_id: str = ""
    runs_before: int = 0
    started_at: float = field(default=0.0)  # wall time (s since the epoch) the current run was handed over


@contextlib.contextmanager
def own_group(cfg):
    """Set up the process group of one run and tear it down afterwards (a run not in a worker group)."""
    info = setup(cfg)
    stop = StopRequest()
    try:
        yield Group(info, stop)
    finally:
        stop.restore()
        teardown(info)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so a host clock reads the true time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the training loop's own collectives (tensors on info.device) -------------------------------------
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def all_reduce(t: torch.Tensor, info: DistInfo, op: str = "sum") -> torch.Tensor:
    """``t`` reduced over all ranks by ``op`` (sum, max, min), computed on the device; a CPU copy."""
    if not info.distributed:
        return t.detach().cpu()
    dt = t.detach().to(info.device).clone()
    dist.all_reduce(dt, op=_OPS[op])
    return dt.cpu()


def all_gather(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's ``t`` stacked in rank order: ``(world, *t.shape)``, gathered on the device; a CPU copy."""
    if not info.distributed:
        return t.detach().cpu().unsqueeze(0)
    dt = t.detach().to(info.device).reshape(-1).contiguous()
    out = torch.empty(info.world_size * dt.numel(), dtype=dt.dtype, device=info.device)
    # all_gather_single replaces all_gather_into_tensor (deprecated in torch 2.13); same arguments
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, dt)
    return out.view(info.world_size, *t.shape).cpu()


def all_gather_objects(obj, info: DistInfo) -> list:
    """Every rank's picklable ``obj`` in rank order (outside timed regions: it pickles and may sync the device)."""
    if not info.distributed:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast(t: torch.Tensor, info: DistInfo, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``t`` on every rank (on the device); a CPU copy."""
    if not info.distributed:
        return t.detach().cpu()
    dt = t.detach().to(info.device).clone()
    dist.broadcast(dt, src=src)
    return dt.cpu()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


class AsyncFlag:
    """A flag (e.g. "stop requested") agreed by all ranks without blocking the step: :meth:`start`
    launches an all-reduce (max) of this rank's value, :meth:`result` waits for it (normally long done)
    and says whether any rank raised it. All ranks call both at the same points."""

    def __init__(self, info: DistInfo):
        self.info = info
        self._t = torch.zeros(1, dtype=torch.float32, device=info.device)
        self._work = None
        self._local = False

    def start(self, value: bool) -> None:
        self._local = bool(value)
        if not self.info.distributed:
            return
        self._t.fill_(float(value))
        self._work = dist.all_reduce(self._t, op=dist.ReduceOp.MAX, async_op=True)

    def result(self) -> bool:
        if self._work is None:
            return self._local
        self._work.wait()
        self._work = None
        return bool(self._t.item() > 0)


# -- dying with the launcher --------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """Arrange (Linux) for this process to be killed when its parent (torchrun) dies, and exit now if
    it already has. torchrun starts each worker in a session of its own, so killing torchrun alone
    would otherwise leave the workers training, reparented to PID 1, writing files for a run the
    runner has recorded as failed."""
    if not sys.platform.startswith("linux") or "RANK" not in os.environ:
        return
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:  # the parent died before the signal was armed
        os._exit(1)
