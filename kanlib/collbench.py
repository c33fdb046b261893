"""Collective benchmark: barrier-synchronised all-reduce over message sizes, nccl-tests style.

``python -m kanlib.collbench --key=value ...`` is a torchrun entry point (every
:class:`BenchConfig` field is a ``--key=value``). For each message size from ``min_bytes`` to
``max_bytes`` (times ``size_factor`` each step, ``max_bytes`` always included) every rank runs
``warmup_iters`` untimed and then timed all-reduces (sum) of a ``dtype`` tensor, ``iters`` timed ones per size
split over ``rounds`` sweeps of the sizes (a burst of load on a shared host then lands on several windows of a
size far apart, not on one, and the lower quantiles read a quiet one); before each one all ranks meet at a
barrier, so the time is the transfer itself, not a rank arriving late (the DDP hook's time includes that wait;
kanlib.analysis.commmodel splits the two). Per size, with nccl-tests' definitions:

- ``time_s``: the median over iterations of the maximum over ranks of one all-reduce
  (``time_s_p10`` / ``time_s_p90``: its 10th / 90th percentiles);
- ``algbw_bytes_per_s = size_bytes / time_s``;
- ``busbw_bytes_per_s = algbw_bytes_per_s * 2 (N - 1) / N``: the bandwidth each rank's link carried
  in a ring all-reduce, comparable across world sizes N.

Timing: the host clock around the blocking all-reduce on CPU; CUDA events on the current stream on
GPU (the device is idle after the barrier and a synchronize, so the start event marks the launch).

An emulated inter-node link (``emulate_latency_s``, ``emulate_bandwidth_bytes_per_s``, for
``nnodes > 1``) adds :func:`kanlib.hooks.emulated_allreduce_s` to every timed all-reduce (a sleep on
CPU, a ``torch.cuda._sleep`` spin on GPU), so a fit of the results must recover the injected latency
and bandwidth (the known-signal check of docs/measurement.md).

On NCCL the benchmark runs with ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING`` and
``NCCL_DEBUG_FILE=<run_dir>/nccl-debug.rank<r>.log``; rank 0's file (NCCL logs its tuning choice on
rank 0 only) is parsed (:func:`parse_nccl_tuning`) for the algorithm and protocol NCCL used for each
size, read from the lines logged while that size ran.

Rank 0 writes ``<out_dir>/<study>/<run_key>/record.json``: a :class:`kanlib.records.BenchRecord`
(``record_kind: "collbench"``, provenance, the flattened config, and one :class:`kanlib.records.BenchRow` per
size, units in the names), checked by :func:`kanlib.records.check_bench_record` and read by
:func:`kanlib.analysis.load.load_bench`.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

from kanlib.config import (Backend, Config, ConfigError, CpuAffinity, Device, check_at_least, check_nccl,
                           check_non_negative, check_positive, parse_placement)

DType = Literal["float32", "bfloat16", "float16"]
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class BenchConfig(Config):
    """One collective-benchmark run (``python -m kanlib.collbench``). Field docstrings follow each field."""

    ENTRY: ClassVar[str] = "kanlib.collbench"
    NAME_FIELDS: ClassVar[tuple[str, ...]] = ("study",)

    study: str = "collbench"
    """Name of the study this run belongs to; the record goes under ``out_dir/<study>/``."""
    nnodes: int = 1
    """Number of nodes (one torchrun per node); a placement is ``nnodes x nproc_per_node``."""
    nproc_per_node: int = 2
    """Processes per node; world size = nnodes * nproc_per_node."""
    repeat: int = 0
    """Repeat index of an otherwise identical run (each repeat is its own process group)."""
    seed: int = 0
    """Seed (the benchmark itself is deterministic; kept so repeats and runs key alike)."""
    out_dir: str = "outputs"
    """Root output folder; the run writes to ``out_dir/<study>/<run_key>/``."""
    backend: Backend = "auto"
    """Process-group backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    device: Device = "auto"
    """Device of the all-reduced tensors: auto (cuda if available), cpu or cuda."""
    threads: int = 1
    """torch intra-op threads per process."""
    cpu_affinity: CpuAffinity = "auto"
    """auto: on CPU each process runs on CPUs of its own, as a training run (RunConfig.cpu_affinity); none: the OS
    places it."""
    pg_timeout_s: float = 300.0
    """Process-group collective timeout in seconds (a hung rank fails the run after this)."""
    min_bytes: int = 8
    """Smallest message in bytes (at least one element of ``dtype``)."""
    max_bytes: int = 64 * 1024 * 1024
    """Largest message in bytes; past the largest gradient bucket to model (DDP's default is 25 MiB): 64 MiB puts two
    sizes past it at a size factor of 2 or 4 (32 and 64 MiB), so the fit's bandwidth there is measured, not
    extrapolated from below (about 7 s more than stopping at 4 MiB per run on a 2-core CPU host, gloo 1x2)."""
    size_factor: int = 2
    """Each message is this many times the previous one (nccl-tests' ``-f``); max_bytes is always run."""
    iters: int = 20
    """Timed all-reduces per size (over all rounds)."""
    warmup_iters: int = 5
    """Untimed all-reduces per size before the timed ones of each round (connection set-up, caches)."""
    rounds: int = 2
    """Sweeps over the sizes, ``iters`` split between them: on a shared machine a burst of load then hits each
    size in several short windows far apart instead of one, and the lower quantiles read a quiet one."""
    dtype: DType = "float32"
    """Element type of the all-reduced tensor (float32 for gradients; bfloat16 / float16 for compressed ones)."""
    nccl_algo: str = ""
    """NCCL all-reduce algorithm (e.g. Ring, Tree), applied to all-reduce only; empty lets NCCL choose."""
    nccl_proto: str = ""
    """NCCL protocol (LL, LL128, Simple), applied to all-reduce only; empty lets NCCL choose."""
    emulate_latency_s: float = 0.0
    """Emulated inter-node link latency per message (s); only for nnodes > 1 (0 = off)."""
    emulate_bandwidth_bytes_per_s: float = 0.0
    """Emulated inter-node link bandwidth (bytes/s); only for nnodes > 1 (0 = no limit)."""

    def validate(self) -> None:
        check_at_least(self, 1, "nnodes", "nproc_per_node", "threads", "iters", "rounds", "min_bytes", "max_bytes")
        check_at_least(self, 0, "repeat", "seed", "warmup_iters")
        check_positive(self, "pg_timeout_s")
        check_non_negative(self, "emulate_latency_s", "emulate_bandwidth_bytes_per_s")
        elem = _DTYPE_BYTES[self.dtype]
        if self.min_bytes < elem:
            raise ConfigError(f"min_bytes: {self.min_bytes} is less than one {self.dtype} element ({elem} bytes)")
        if self.max_bytes < self.min_bytes:
            raise ConfigError(f"max_bytes: {self.max_bytes} is smaller than min_bytes={self.min_bytes}")
        if self.size_factor < 2:
            raise ConfigError(f"size_factor: must be at least 2, got {self.size_factor!r}")
        if self.rounds > self.iters:
            raise ConfigError(f"rounds: {self.rounds} is more than iters={self.iters} (each round times at least one)")
        check_nccl(self)

    @property
    def emulated_link(self) -> bool:
        """Whether the all-reduces go through an emulated inter-node link (nnodes > 1 and a setting)."""
        return self.nnodes > 1 and (self.emulate_latency_s > 0 or self.emulate_bandwidth_bytes_per_s > 0)

    def key_prefix(self) -> str:
        return f"coll-w{self.placement}-{self.nccl_algo or 'auto'}-{self.nccl_proto or 'auto'}-r{self.repeat}"

    def sizes(self) -> list[int]:
        """Message sizes in bytes: ``min_bytes * size_factor**k`` up to ``max_bytes``, then ``max_bytes``
        itself, each rounded down to whole ``dtype`` elements."""
        elem = _DTYPE_BYTES[self.dtype]
        out, s = [], self.min_bytes
        while s < self.max_bytes:
            out.append(s // elem * elem)
            s *= self.size_factor
        out.append(self.max_bytes // elem * elem)
        return sorted(set(out))


def bench_configs(placements, base: BenchConfig, algos=("",), protos=("",), repeats: int = 1) -> list[BenchConfig]:
    """The benchmark runs of a study: every placement (``"NxP"``) x NCCL algorithm x protocol x repeat.

    NCCL's own choice (``""``) is always part of the sweep, added first when ``algos`` / ``protos``
    leave it out, so every forced setting has its automatic twin. On gloo the algorithm and
    protocol are NCCL settings and must stay ``("",)``.
    """
    if repeats <= 0:
        raise ConfigError(f"repeats: must be positive, got {repeats}")
    algos = [""] + [a for a in algos if a] if "" not in algos else list(dict.fromkeys(algos))
    protos = [""] + [p for p in protos if p] if "" not in protos else list(dict.fromkeys(protos))
    cfgs = []
    for r in range(repeats):
        for text in placements:
            n, p = parse_placement(text)
            for a in algos:
                for pr in protos:
                    cfgs.append(base.replace(nnodes=n, nproc_per_node=p, nccl_algo=a, nccl_proto=pr, repeat=r))
    return cfgs


# -- NCCL's debug output ------------------------------------------------------------------------------
# The algorithm/protocol NCCL picked, from its INFO lines (subsystem TUNING, rank 0 only). Formats by
# NCCL version (src/enqueue.cc, src/scheduler/symmetric_sched.cc):
#   2.20-2.22: "%ld Bytes -> Algo %d proto %d time %f"
#   2.23:      "%s: %ld Bytes -> Algo %d proto %d time %f"          (function name first)
#   2.24+:     "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}"
#   2.27+:     "%s [Symmetric]: %ld Bytes -> Kernel %s nchannels %d nthreads %d ..." (symmetric kernels)
# each after NCCL's prefix "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO ". Before 2.20 the line was
# commented out (no INFO output of the choice).
_TUNING_LINE = re.compile(
    r"NCCL INFO (?:(?P<func>[A-Za-z]+)(?: \[(?P<kind>[^\]]+)\])?: )?(?P<bytes>\d+) Bytes -> "
    r"(?:Algo (?P<algo>\S+) proto (?P<proto>\S+)|Kernel (?P<kernel>\S+))")
# Numeric codes of NCCL 2.20-2.23 (src/include/nccl_common.h: NCCL_ALGO_*, NCCL_PROTO_*)
_ALGO_CODES = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
_PROTO_CODES = {0: "LL", 1: "LL128", 2: "SIMPLE"}


def parse_nccl_tuning(text: str) -> list[dict]:
    """NCCL's per-collective tuning choices in ``text`` (its debug output), in order.

    Each entry: ``func`` (e.g. ``AllReduce``; None for NCCL 2.20-2.22, which does not print it),
    ``bytes`` (message size), ``algo`` (``RING``, ``TREE``, ... or ``SYMMETRIC`` for NCCL's symmetric
    kernels) and ``proto`` (``LL``, ``LL128``, ``SIMPLE``, or the symmetric kernel's name). Numeric codes
    of older versions are translated to these names.
    """
    out = []
    for m in _TUNING_LINE.finditer(text):
        if m.group("kernel"):
            algo, proto = "SYMMETRIC", m.group("kernel")
        else:
            algo, proto = m.group("algo"), m.group("proto")
            if algo.isdigit():
                algo = _ALGO_CODES.get(int(algo), f"ALGO{algo}")
            if proto.isdigit():
                proto = _PROTO_CODES.get(int(proto), f"PROTO{proto}")
        out.append({"func": m.group("func"), "bytes": int(m.group("bytes")), "algo": algo.upper(),
                    "proto": proto if m.group("kernel") else proto.upper()})
    return out


def nccl_choice(entries: list[dict], n_bytes: int) -> tuple[str | None, str | None]:
    """``(algo, proto)`` NCCL used for all-reduces of ``n_bytes`` among parsed ``entries`` (several
    choices joined by ``+``), or ``(None, None)`` when none was logged."""
    mine = [e for e in entries if e["bytes"] == n_bytes and e["func"] in (None, "AllReduce")]
    if not mine:
        return None, None
    algos = sorted({e["algo"] for e in mine})
    protos = sorted({e["proto"] for e in mine})
    return "+".join(algos), "+".join(protos)


def nccl_debug_env(run_dir: str, rank: int) -> dict[str, str]:
    """The NCCL variables that make it log its tuning choice to ``<run_dir>/nccl-debug.rank<rank>.log``."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
            "NCCL_DEBUG_FILE": os.path.join(os.path.abspath(run_dir), f"nccl-debug.rank{rank}.log")}


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: NCCL before 2.27 writes its debug file block-buffered; flush it before reading."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


# -- the benchmark ------------------------------------------------------------------------------------
def run_bench(cfg: BenchConfig, group=None) -> dict | None:
    """Run the sweep on this rank (every rank calls it); rank 0 writes and returns the record.

    ``group``: the processes of a worker group (kanlib.worker), whose process group the benchmark uses and
    leaves as it is; without one it sets up its own and tears it down."""
    import contextlib

    from kanlib import distributed, records

    started_at = records.now_iso()
    run_dir = cfg.run_dir()
    rank = int(os.environ.get("RANK", "0"))
    device_kind = distributed.resolve_device(cfg.device)
    nccl = distributed.resolve_backend(cfg.backend, device_kind) == "nccl" and "RANK" in os.environ
    debug_path = None
    if nccl and group is None:  # before NCCL's first call: it reads these once
        env = nccl_debug_env(run_dir, rank)
        os.makedirs(run_dir, exist_ok=True)
        os.environ.update(env)
        debug_path = env["NCCL_DEBUG_FILE"]
    elif nccl:  # a worker group set NCCL's debug file for the whole group (kanlib.worker)
        debug_path = os.environ.get("NCCL_DEBUG_FILE")
    with contextlib.nullcontext(group) if group is not None else distributed.own_group(cfg) as group:
        return _bench(cfg, group, run_dir, debug_path, nccl, started_at)


def _bench(cfg: BenchConfig, group, run_dir: str, debug_path, nccl: bool, started_at: str) -> dict | None:
    import torch

    from kanlib import distributed, records

    info = group.info
    if info.is_main:
        os.makedirs(run_dir, exist_ok=True)
        records.atomic_write_json(os.path.join(run_dir, records.CONFIG_NAME), cfg.to_dict())
    dtype = getattr(torch, cfg.dtype)
    n = info.world_size
    cycles_per_s = None
    if cfg.emulated_link and info.device.type == "cuda":
        from kanlib.hooks import spin_cycles_per_s

        cycles_per_s = spin_cycles_per_s(info.device)
    sizes = cfg.sizes()
    local: dict[int, list[float]] = {size: [] for size in sizes}  # this rank's seconds per timed all-reduce
    algo: dict[int, tuple] = {}
    for r in range(cfg.rounds):  # iters split between the rounds: the first ones take the remainder
        iters = cfg.iters // cfg.rounds + (1 if r < cfg.iters % cfg.rounds else 0)
        for size in sizes:
            t = torch.zeros(size // _DTYPE_BYTES[cfg.dtype], dtype=dtype, device=info.device)  # zeros: no overflow
            offset = _file_size(debug_path) if info.is_main and debug_path and r == 0 else 0
            local[size] += _time_allreduces(t, cfg, info, _delay(cfg, size, n), cycles_per_s, iters)
            if info.is_main and debug_path and r == 0:  # the sizes' tuning choices, read as each first ran
                _flush_c_stdio()
                algo[size] = nccl_choice(parse_nccl_tuning(_read_from(debug_path, offset)), size)
            del t
    rows = []
    for size in sizes:
        per_iter = distributed.all_gather(torch.tensor(local[size], dtype=torch.float64), info).max(dim=0).values
        times = sorted(per_iter.tolist())
        median = _quantile(times, 0.5)
        row = records.BenchRow(size, size // _DTYPE_BYTES[cfg.dtype], cfg.dtype, len(times), median,
                               _quantile(times, 0.1), _quantile(times, 0.9), _delay(cfg, size, n), size / median,
                               size / median * (2 * (n - 1) / n if n > 1 else 0.0))
        if size in algo:
            row.nccl_algo_used, row.nccl_proto_used = algo[size]
        rows.append(row)
    if not info.is_main:
        distributed.barrier(info)  # wait for rank 0's record before the group goes on
        return None
    note = None
    if nccl and n == 1:
        note = "world size 1: NCCL copies locally and logs no algorithm"
    elif nccl and not any(r.nccl_algo_used for r in rows):
        note = "NCCL logged no tuning choice (NCCL older than 2.20 does not print it at INFO level)"
    rec = records.BenchRecord(
        records.provenance(), cfg.to_dict(), rows, run_key=cfg.run_key(), run_id=records.new_run_id(),
        started_at=started_at, finished_at=records.now_iso(), config_backend=cfg.backend,
        config_device=cfg.device, backend=info.backend or "none", device=info.device.type, world_size=n,
        placement=cfg.placement, nccl_debug_file=debug_path, nccl_note=note, launch_id=group.launch_id,
        runs_before_in_launch=group.runs_before).to_dict()
    records.atomic_write_json(os.path.join(run_dir, records.RECORD_NAME), rec)
    distributed.barrier(info)
    return rec


def _delay(cfg: BenchConfig, size: int, n: int) -> float:
    """Seconds the emulated link adds to an all-reduce of ``size`` bytes over ``n`` ranks (0 without one)."""
    from kanlib.hooks import emulated_allreduce_s

    if not cfg.emulated_link:
        return 0.0
    return float(emulated_allreduce_s(size, n, cfg.emulate_latency_s, cfg.emulate_bandwidth_bytes_per_s))


def _time_allreduces(t, cfg: BenchConfig, info, delay: float, cycles_per_s: float | None, iters: int) -> list[float]:
    """Seconds of each of ``iters`` timed all-reduces of ``t`` on this rank, after ``cfg.warmup_iters`` untimed
    ones (barrier before each; ``delay``: emulated link seconds added to each)."""
    import torch
    import torch.distributed as dist

    from kanlib.hooks import sleep_until

    cuda = info.device.type == "cuda"
    out = []
    for i in range(cfg.warmup_iters + iters):
        if info.distributed:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize(info.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if info.distributed:
                dist.all_reduce(t)
            if delay > 0:
                torch.cuda._sleep(max(1, int(delay * cycles_per_s)))
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            if info.distributed:
                dist.all_reduce(t)
            if delay > 0:
                # the link's extra time after the real transfer, waited by polling throughout: this
                # process has nothing else to do, and a sleeping rank wakes late on a loaded machine
                sleep_until(time.perf_counter() + delay, spin_s=delay)
            dt = time.perf_counter() - t0
        if i >= cfg.warmup_iters:
            out.append(dt)
    return out


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _file_size(path: str) -> int:
    _flush_c_stdio()
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    from kanlib import distributed

    distributed.die_with_launcher()
    cfg = BenchConfig.from_cli(sys.argv[1:] if argv is None else argv)
    rec = run_bench(cfg)
    if rec is not None:
        for row in rec["rows"]:
            print(f"kanlib.collbench: {row['size_bytes']:>10d} B  time {row['time_s'] * 1e6:10.1f} us  "
                  f"algbw {row['algbw_bytes_per_s'] / 1e9:8.3f} GB/s  busbw {row['busbw_bytes_per_s'] / 1e9:8.3f} GB/s"
                  + (f"  {row['nccl_algo_used']}/{row['nccl_proto_used']}" if row["nccl_algo_used"] else ""),
                  flush=True)
        print(f"kanlib.collbench: record={os.path.join(cfg.run_dir(), 'record.json')}", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # as kanlib.train: leave without C++ static destructors (gloo's threads can abort the exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
