"""A run's data, defined once: the per-step row, the run record, the manifest row, and their writers.

Everything a run writes is declared here as a dataclass whose fields carry units in their names and a
docstring; ``docs/schema.md`` is generated from these classes (:func:`schema_markdown`, checked by a
test). Runtime only: no pandas (analysis lives in kanlib.analysis and kanlib.studies).

- :class:`StepRow` - one row of ``steps.csv`` per step (rank 0's times; long format).
- :class:`RunRecord` - ``record.json``: provenance, the flattened config, measurements, fault counters.
- :class:`ManifestRow` - one line of ``<study>/manifest.jsonl`` per attempt (written by the runner).
- :class:`BenchRecord` - ``record.json`` of a collective benchmark (kanlib.collbench), one :class:`BenchRow` per
  message size.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import fcntl
import json
import math
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, fields

SCHEMA_VERSION = 2
SCHEMA_VERSIONS_READ = (1, 2)
RECORD_NAME = "record.json"
STEPS_NAME = "steps.csv"
CONFIG_NAME = "config.json"
MANIFEST_NAME = "manifest.jsonl"
LAUNCHES_NAME = "launches.jsonl"
SWEEPS_NAME = "sweeps.jsonl"
PREEMPTED_NAME = "preempted.json"
MODEL_NAME = "model.pt"
ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_", "OMP_", "MASTER_", "KANLIB_", "CUDA_VISIBLE_DEVICES")


class RecordError(ValueError):
    """A record file could not be read or fails validation; the message names the file."""


def _doc(text: str, reduce: str | None = None) -> dict:
    return {"doc": text, "reduce": reduce}


# -- per step ---------------------------------------------------------------------------------------
@dataclass
class StepRow:
    """One training step as rank 0 saw it (``steps.csv``). Times are wall seconds of this rank.

    ``reduce`` (field metadata) says how the record combines the ranks' values of a step: ``max``
    (the slowest rank sets the pace), ``mean``, or none (rank 0's value).
    """

    step: int = field(default=0, metadata=_doc("step index from 0"))
    measured: int = field(default=0, metadata=_doc("1 when the step counts in the record's timing (after warm-up, "
                                                    "in the final attempt), else 0"))
    attempt: int = field(default=0, metadata=_doc("which attempt ran the step (torchrun's restart count); rows "
                                                   "after a resumed checkpoint are rewritten"))
    time_unix_s: float = field(default=math.nan, metadata=_doc("wall-clock time at the end of the step (s since the "
                                                                "Unix epoch)"))
    step_time_s: float = field(default=math.nan, metadata=_doc("forward + backward + optimizer time (s)", "max"))
    forward_s: float = field(default=math.nan, metadata=_doc("model forward and loss (s)", "max"))
    backward_s: float = field(default=math.nan, metadata=_doc("backward, including DDP's gradient all-reduce "
                                                               "overlapped with it (s)", "max"))
    optimizer_s: float = field(default=math.nan, metadata=_doc("optimizer step and zeroing (s)", "max"))
    comm_total_s: float = field(default=math.nan, metadata=_doc(
        "time the step's gradient communication was in flight: the union of the buckets' launch-to-completion "
        "intervals (s; NaN without a timed communication hook)", "max"))
    loss: float = field(default=math.nan, metadata=_doc("training loss on this rank's shard (MSE, or cross-entropy "
                                                         "for classification)", "mean"))
    lr: float = field(default=math.nan, metadata=_doc("learning rate used by this step"))
    val_loss: float = field(default=math.nan, metadata=_doc("validation loss after this step (NaN unless evaluated "
                                                             "here: every eval_every steps, outside the timed region)"))
    val_accuracy: float = field(default=math.nan, metadata=_doc("validation accuracy after this step "
                                                                 "(classification; NaN otherwise)"))

    @classmethod
    def columns(cls) -> list[str]:
        """The ``steps.csv`` header, in order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def reduced(cls, how: str) -> list[str]:
        """The fields combined over ranks by ``how`` (``max`` or ``mean``)."""
        return [f.name for f in fields(cls) if f.metadata.get("reduce") == how]


STEP_COLUMNS = StepRow.columns()


class StepWriter:
    """Appends one CSV row per :class:`StepRow` to ``steps.csv`` and flushes it, so a killed run keeps its rows."""

    def __init__(self, path: str):
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)
        if new:
            self._w.writerow(STEP_COLUMNS)
            self._f.flush()

    def write(self, row: StepRow) -> None:
        self._w.writerow([getattr(row, c) for c in STEP_COLUMNS])
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_steps_rows(path: str) -> tuple[list[dict], list[tuple]]:
    """Rows of a ``steps.csv`` as dicts of strings; unreadable rows go to ``bad`` as ``(file, line, reason)``.

    A last line cut short by a crash is dropped (and named), as is a row with the wrong number of fields.
    """
    with open(path, newline="") as f:
        text = f.read()
    lines = text.split("\n")
    complete_last = text.endswith("\n")
    if complete_last:
        lines = lines[:-1]
    if not lines or not lines[0]:
        return [], []
    header = lines[0].rstrip("\r").split(",")
    rows, bad = [], []
    for i, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        vals = line.split(",")
        last = i == len(lines) and not complete_last
        if len(vals) != len(header) or last:
            bad.append((path, i, "truncated row" if last else f"{len(vals)} fields, expected {len(header)}"))
            continue
        try:
            int(vals[header.index("step")])
        except ValueError:
            bad.append((path, i, "step is not an integer"))
            continue
        rows.append(dict(zip(header, vals)))
    return rows, bad


def truncate_steps(path: str, before_step: int) -> None:
    """Rewrite ``steps.csv`` (atomically) keeping only rows of steps before ``before_step``.

    Used when a run resumes from the checkpoint of ``before_step``: rows of steps the failed attempt
    ran past its checkpoint are redone, so they are dropped, as is a truncated line.
    """
    if not os.path.exists(path):
        return
    rows, _ = read_steps_rows(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS)
        w.writeheader()
        for r in rows:
            if int(r["step"]) < before_step:
                w.writerow({k: r.get(k, 0 if k == "attempt" else "") for k in STEP_COLUMNS})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- per run ----------------------------------------------------------------------------------------
@dataclass
class Provenance:
    """Where and with what a run ran."""

    schema_version: int = field(default=SCHEMA_VERSION, metadata=_doc("version of this schema"))
    code_version: str = field(default="", metadata=_doc("hash of the runtime source files "
                                                         "(kanlib.config.code_version); part of the run key"))
    git_sha: str = field(default="unknown", metadata=_doc("commit of the kanlib checkout (`-dirty` when it has "
                                                           "uncommitted changes), or `unknown`"))
    torch_version: str = field(default="", metadata=_doc("`torch.__version__`"))
    cuda_version: str | None = field(default=None, metadata=_doc("`torch.version.cuda`"))
    nccl_version: str | None = field(default=None, metadata=_doc("NCCL version when CUDA is present"))
    device_name: str = field(default="cpu", metadata=_doc("GPU name, or `cpu`"))
    float32_matmul_precision: str = field(default="highest", metadata=_doc(
        "`torch.get_float32_matmul_precision()` (TF32 on CUDA when not `highest`)"))
    hostname: str = field(default="", metadata=_doc("host of rank 0"))
    rank0_cpus: str = field(default="", metadata=_doc(
        "CPUs rank 0 may run on (`os.sched_getaffinity`, e.g. `0` when pinned, `0-1` when not; config "
        "`cpu_affinity`)"))
    slurm_job_id: str | None = field(default=None, metadata=_doc("`SLURM_JOB_ID`"))
    slurm_nodelist: str | None = field(default=None, metadata=_doc("`SLURM_JOB_NODELIST`"))
    launcher: str = field(default="none", metadata=_doc("`local`, `multinode`, `slurm`, or `none` (plain "
                                                         "`python -m kanlib.train`)"))
    env: dict = field(default_factory=dict, metadata=_doc(
        "every `NCCL_*`, `TORCH_*`, `GLOO_*`, `OMP_*`, `MASTER_*`, `KANLIB_*` variable and `CUDA_VISIBLE_DEVICES`"))


def git_sha() -> str:
    """The commit of the checkout this package runs from (``-dirty`` when edited), or 'unknown'."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        sha = out.stdout.strip()
        if out.returncode == 0 and sha:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def cpu_list() -> str:
    """The CPUs this process may run on as ranges (``0-3,8``); empty where the OS does not say."""
    if not hasattr(os, "sched_getaffinity"):
        return ""
    cpus, parts = sorted(os.sched_getaffinity(0)), []
    for c in cpus:
        if parts and parts[-1][1] == c - 1:
            parts[-1][1] = c
        else:
            parts.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def provenance() -> Provenance:
    """This process's provenance: versions, host, SLURM job, relevant environment variables."""
    import torch

    from kanlib.config import code_version

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            nccl = None
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return Provenance(
        code_version=code_version(), git_sha=git_sha(), torch_version=torch.__version__,
        cuda_version=torch.version.cuda, nccl_version=nccl,
        device_name=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        float32_matmul_precision=torch.get_float32_matmul_precision(), hostname=socket.gethostname(),
        rank0_cpus=cpu_list(),
        slurm_job_id=os.environ.get("SLURM_JOB_ID"), slurm_nodelist=os.environ.get("SLURM_JOB_NODELIST"),
        launcher=os.environ.get("KANLIB_LAUNCHER", "local" if "RANK" in os.environ else "none"), env=env)


@dataclass
class RunRecord:
    """``record.json`` of a training run. The config's fields are stored at the top level under their own
    names, except ``backend`` and ``device``, which hold the values used (the requested ones are kept as
    ``config_backend`` and ``config_device``). Medians are over the measured steps of the per-step
    maximum over ranks."""

    provenance: Provenance
    config: dict
    record_kind: str = field(default="train", metadata=_doc("`train` (kanlib.collbench writes `collbench` records)"))
    run_id: str = field(default="", metadata=_doc("unique id of this attempt (UTC time + random suffix)"))
    run_key: str = field(default="", metadata=_doc("stable key of the config and code version; the folder name"))
    data_sha256: str | None = field(default=None, metadata=_doc(
        "task=file: SHA-256 of the data file's content (16 hex digits; part of the run key), null otherwise"))
    status: str = field(default="ok", metadata=_doc("`ok`"))
    config_backend: str = field(default="", metadata=_doc("backend asked for (`auto`, `gloo`, `nccl`)"))
    config_device: str = field(default="", metadata=_doc("device asked for (`auto`, `cpu`, `cuda`)"))
    backend: str = field(default="none", metadata=_doc("process-group backend used (`gloo`, `nccl`, or `none` for "
                                                        "one process without torchrun)"))
    device: str = field(default="cpu", metadata=_doc("device type used (`cpu`, `cuda`)"))
    world_size: int = field(default=1, metadata=_doc("processes in the job (`nnodes * nproc_per_node`)"))
    started_at: str = field(default="", metadata=_doc("wall-clock start of the run (rank 0, ISO 8601 UTC)"))
    finished_at: str = field(default="", metadata=_doc("wall-clock end of the run (rank 0, ISO 8601 UTC)"))
    n_params: int = field(default=0, metadata=_doc("trainable parameters"))
    model_state_bytes: int = field(default=0, metadata=_doc("bytes of parameters + gradients + optimizer states "
                                                             "(analytic, whole model)"))
    kan_path: str = field(default="", metadata=_doc("KAN kernel path(s) that actually ran (`compiled`, `fast`, "
                                                     "`reference`; several joined by `+`); empty for other models"))
    n_measured_steps: int = field(default=0, metadata=_doc("steps timed: after warm-up, in the final attempt"))
    step_time_s: float = field(default=math.nan, metadata=_doc("median step time (s)"))
    step_time_s_p10: float = field(default=math.nan, metadata=_doc("10th percentile of the step time (s)"))
    step_time_s_p90: float = field(default=math.nan, metadata=_doc("90th percentile of the step time (s)"))
    forward_s: float = field(default=math.nan, metadata=_doc("median forward time (s)"))
    backward_s: float = field(default=math.nan, metadata=_doc("median backward time (s), including DDP's overlapped "
                                                               "all-reduce"))
    optimizer_s: float = field(default=math.nan, metadata=_doc("median optimizer time (s)"))
    samples_per_s: float = field(default=math.nan, metadata=_doc("`global_batch / step_time_s` (1/s)"))
    wall_samples_per_s: float = field(default=math.nan, metadata=_doc(
        "samples per second of wall time over the measured steps, everything between them included; the "
        "slowest rank's span (1/s)"))
    comm_total_s: float | None = field(default=None, metadata=_doc(
        "median per-step union of bucket communication intervals (s; only with a timed hook)"))
    n_buckets: int | None = field(default=None, metadata=_doc("gradient buckets per step (only with a timed hook)"))
    bucket_bytes: list | None = field(default=None, metadata=_doc("bytes of each bucket, in the order DDP "
                                                                   "launched them (only with a timed hook)"))
    wire_bytes: list | None = field(default=None, metadata=_doc(
        "bytes each bucket's communication sent through the all-reduce: smaller than `bucket_bytes` under "
        "bf16/fp16/PowerSGD compression (only with a timed hook)"))
    messages_per_bucket: list | None = field(default=None, metadata=_doc(
        "all-reduces each bucket took (1; 2 for PowerSGD's P and Q; only with a timed hook)"))
    powersgd_stats: dict | None = field(default=None, metadata=_doc(
        "comm_hook=powersgd: torch's PowerSGD compression statistics (compress rate, elements before and "
        "after)"))
    emulated_s: float | None = field(default=None, metadata=_doc(
        "median per-step delay the emulated link added, summed over buckets (s; only with emulation)"))
    compile_s: float = field(default=0.0, metadata=_doc("time this process spent compiling kernels (s, rank 0)"))
    time_to_first_step_s: float = field(default=math.nan, metadata=_doc(
        "process start (for a later run of a worker group: the moment the run was handed over) to the start of "
        "the first step: imports, rendezvous, data, model (s, rank 0)"))
    launch_id: str = field(default="", metadata=_doc(
        "the launch (worker group: one torchrun, N joined torchruns, or one srun step) that ran this attempt; "
        "empty for a run started on its own (`python -m kanlib.train`)"))
    runs_before_in_launch: int = field(default=0, metadata=_doc(
        "runs that launch ran before this one (0: the launch's first run, which paid the process start-up)"))
    peak_mem_bytes: int = field(default=0, metadata=_doc("maximum over ranks of the peak memory of the measured "
                                                          "steps (see `peak_mem_kind`)"))
    peak_mem_kind: str = field(default="", metadata=_doc(
        "`cuda_max_allocated` (allocator peak after warm-up), `cpu_peak_rss` (the process's peak resident set "
        "after warm-up: its high-water mark reset through `/proc/self/clear_refs`) or `cpu_peak_rss_process` "
        "(since the process started, where that reset is not possible)"))
    peak_reserved_bytes: int | None = field(default=None, metadata=_doc(
        "CUDA: maximum over ranks of the allocator's peak reserved memory (null on CPU)"))
    device_used_bytes: int | None = field(default=None, metadata=_doc(
        "CUDA: maximum over ranks of total - free device memory at the end (`mem_get_info`; includes NCCL buffers "
        "and the CUDA context; null on CPU)"))
    final_train_loss: float = field(default=math.nan, metadata=_doc("training loss of the last step's global batch "
                                                                     "(mean over ranks)"))
    final_val_loss: float = field(default=math.nan, metadata=_doc("validation loss after training"))
    final_val_accuracy: float | None = field(default=None, metadata=_doc(
        "validation accuracy after training (classification; null otherwise)"))
    chance_accuracy: float | None = field(default=None, metadata=_doc(
        "validation accuracy of always predicting the most frequent training class (classification; null otherwise)"))
    target_mean: float | None = field(default=None, metadata=_doc(
        "regression on a standardised target (Feynman equations, data sets, files): the training rows' mean it was "
        "standardised with, in the target's units; null where the target is used as it is (synthetic tasks) and for "
        "classification"))
    target_std: float | None = field(default=None, metadata=_doc(
        "... and their standard deviation: `sqrt(final_val_loss) * target_std` is the validation RMSE in the target's "
        "units (null as `target_mean`)"))
    param_dtype: str = field(default="", metadata=_doc(
        "dtype the parameters were trained in: `float32` (fp32, and bf16's master weights) or `float64` (fp64); empty "
        "in records written before it was recorded"))
    reached_target: bool | None = field(default=None, metadata=_doc(
        "whether the validation loss reached `target_val_loss` (null without a target)"))
    steps_to_target: int | None = field(default=None, metadata=_doc("optimizer steps until the target was reached"))
    samples_to_target: int | None = field(default=None, metadata=_doc("training samples until the target was reached"))
    time_to_target_s: float | None = field(default=None, metadata=_doc(
        "training wall time until the target was reached (s; sum of step wall times, evaluations excluded)"))
    resumed_from_step: int = field(default=0, metadata=_doc("step the final attempt started from (0, or the step "
                                                             "of the checkpoint it resumed)"))
    attempt: int = field(default=0, metadata=_doc("attempt number of the final attempt (torchrun's restart count)"))
    n_skipped_steps: int = field(default=0, metadata=_doc("steps whose update was skipped on every rank for a "
                                                           "non-finite loss (`nan_policy=skip`)"))
    n_grid_updates: int = field(default=0, metadata=_doc("grid refits of this attempt (`grid_update_every`)"))
    evals_per_step: float = field(default=math.nan, metadata=_doc(
        "median over the measured steps of the loss-and-gradient evaluations (forward and backward over the "
        "global batch) per optimizer step: 1 for adam and sgd, up to `lbfgs_max_iter * 5 // 4` for lbfgs"))
    n_evals: int = field(default=0, metadata=_doc("loss-and-gradient evaluations of this attempt's steps"))
    final_grid_size: int | None = field(default=None, metadata=_doc(
        "grid intervals of the splines at the end (the last of `grid_extension`, else `grid_size`; null for "
        "models without B-spline grids)"))
    foreign_cpu_frac: float | None = field(default=None, metadata=_doc(
        "share of the CPU time of the CPUs the ranks ran on that other processes took during the measured steps "
        "(`/proc/stat` busy time minus the ranks' own; the largest over hosts and sets of CPUs; 0 quiet, 1 another "
        "process had them whole; null where unreadable; docs/measurement.md)"))
    cpus_shared: bool | None = field(default=None, metadata=_doc(
        "whether a rank that was to get CPUs of its own (`cpu_affinity=auto` on CPU) found none free, other kanlib "
        "processes (another study on this host) holding them, and shared cores: a disturbed run"))
    steal_frac: float | None = field(default=None, metadata=_doc(
        "share of that CPU time the hypervisor gave to other guests (steal), the same way"))
    runqueue_wait_frac: float | None = field(default=None, metadata=_doc(
        "largest share of the measured window any rank's training thread waited runnable for a CPU "
        "(`/proc/self/task/*/schedstat`)"))
    foreign_wait_frac: float | None = field(default=None, metadata=_doc(
        "largest part of such a wait, as a share of the window, that other processes' CPU time on that rank's CPUs "
        "can explain (on a pinned rank's one CPU: at most their share of it; the rest waited behind the rank's own "
        "threads)"))
    involuntary_switches: int | None = field(default=None, metadata=_doc(
        "largest number of involuntary context switches of any rank's process during the measured steps"))
    minor_page_faults: int | None = field(default=None, metadata=_doc(
        "largest number of minor page faults of any rank's process during the measured steps (`getrusage`): memory "
        "the allocator gave back to the kernel and took again (see `host_malloc`)"))
    host_malloc: str = field(default="", metadata=_doc(
        "the host allocator's setting: `steady` (every block from glibc malloc's heap, not trimmed during a run: "
        "kanlib.metrics.steady_host_allocator), `system` (glibc's defaults: KANLIB_HOST_MALLOC=system, or no glibc); "
        "empty in records written before it was recorded"))
    load_1m_start: float | None = field(default=None, metadata=_doc("1-minute load average when the measured steps "
                                                                    "began (rank 0's host)"))
    load_1m_end: float | None = field(default=None, metadata=_doc("1-minute load average when they ended"))
    interference_window_s: float | None = field(default=None, metadata=_doc(
        "wall seconds the interference counters covered (the measured steps, evaluations included)"))
    gpu_other_processes: int | None = field(default=None, metadata=_doc(
        "CUDA: most other processes any rank's GPU ran (NVML through pynvml; null when unknown, and on CPU)"))
    gpu_throttle_reasons: int | None = field(default=None, metadata=_doc(
        "CUDA: NVML clock-throttle reasons any rank's GPU reported at the end (bit mask, idle and application-clock "
        "bits cleared; 0 none; null when unknown)"))
    earlier_attempts: list | None = field(default=None, metadata=_doc(
        "earlier complete attempts of this run that were set aside (a disturbed run rerun by the sweep): each "
        "`{run_id, step_time_s, foreign_cpu_frac, runqueue_wait_frac, foreign_wait_frac, disturbed}`; their records "
        "are kept in `attempts/`"))

    def to_dict(self) -> dict:
        """The flat JSON object of ``record.json``."""
        out = {**self.config}
        out.update(dataclasses.asdict(self.provenance))
        for f in fields(self):
            if f.name not in ("provenance", "config"):
                out[f.name] = getattr(self, f.name)
        return out


# -- interference: when a run's machine was busy ------------------------------------------------------------
ATTEMPTS_DIR = "attempts"
DISTURBED_FOREIGN_CPU_FRAC = 0.10
"""A run is disturbed when other processes took more than this share of its CPUs' time during its measured steps."""
DISTURBED_RUNQUEUE_WAIT_FRAC = 0.10
"""... or any rank's training thread waited runnable for a CPU more than this share of the measured window behind
other processes (``foreign_wait_frac``: at most their CPU time on its CPUs; the rest of a wait is behind its own
threads)."""
MIN_INTERFERENCE_CPU_S = 0.2
"""The per-CPU counters tick every 10 ms: below this much window x CPUs (20 ticks, a share resolved to 5%, half the
thresholds) their share is too coarse to judge. At 0.5, the default study's shortest 2-process runs (36 steps of
6 ms: 0.43 CPU-s) went unjudged, and their waits behind gloo's own threads (10-14%, no other process on their CPUs)
flagged 9 of 45 strong-scaling runs on a quiet machine."""


def disturbance(rec: dict) -> str:
    """Why the run of record ``rec`` counts as disturbed (docs/measurement.md), or '' when it was not (or cannot
    be told: unknown is not disturbed, and the record says unknown with nulls)."""
    why = []
    foreign, wait = rec.get("foreign_cpu_frac"), rec.get("runqueue_wait_frac")
    window = rec.get("interference_window_s") or 0.0
    n_cpus = max(1, int(rec.get("world_size") or 1) * int(rec.get("threads") or 1))
    if _finite(foreign) and foreign > DISTURBED_FOREIGN_CPU_FRAC and window * n_cpus >= MIN_INTERFERENCE_CPU_S:
        why.append(f"other processes took {foreign:.0%} of its CPUs")
    # a training thread also waits behind its own process's threads (gloo's, a timed hook's with many small
    # buckets: 10-18% on a quiet machine): only the part other processes' CPU time can explain counts; where the
    # per-CPU counters are too coarse to say, the wait alone decides. Records before foreign_wait_frac bound it by
    # twice foreign_cpu_frac.
    judged = _finite(foreign) and window * n_cpus >= MIN_INTERFERENCE_CPU_S
    bound = rec.get("foreign_wait_frac") if _finite(rec.get("foreign_wait_frac")) else (
        2 * foreign if _finite(foreign) else None)
    explained = min(wait, bound) if judged and _finite(wait) and bound is not None else wait
    if _finite(explained) and explained > DISTURBED_RUNQUEUE_WAIT_FRAC:
        why.append(f"a training thread waited for a CPU {wait:.0%} of the time"
                   + (f" while other processes took {foreign:.0%} of its CPUs" if _finite(foreign) else ""))
    if rec.get("cpus_shared"):
        why.append("a rank found no CPUs of its own free (another kanlib run held them) and shared cores")
    if rec.get("gpu_other_processes"):
        why.append(f"{rec['gpu_other_processes']} other process(es) on its GPU")
    if rec.get("gpu_throttle_reasons"):
        why.append(f"GPU clocks throttled (NVML reasons {rec['gpu_throttle_reasons']:#x})")
    return "; ".join(why)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def set_aside(run_dir: str) -> str | None:
    """Move a complete attempt's record (and its per-step rows) into ``<run_dir>/attempts/`` so the run can run
    again; returns the kept record's path, or None when there is no record."""
    path = os.path.join(run_dir, RECORD_NAME)
    try:
        rec = read_record(path)
    except RecordError:
        return None
    keep = os.path.join(run_dir, ATTEMPTS_DIR)
    os.makedirs(keep, exist_ok=True)
    rid = rec.get("run_id") or new_run_id()
    steps = os.path.join(run_dir, STEPS_NAME)
    if os.path.exists(steps):
        os.replace(steps, os.path.join(keep, f"{rid}.steps.csv"))
    dest = os.path.join(keep, f"{rid}.json")
    os.replace(path, dest)
    return dest


def earlier_attempts(run_dir: str) -> list | None:
    """Summaries of the attempts :func:`set_aside` kept for this run (oldest first), or None when there are none."""
    keep = os.path.join(run_dir, ATTEMPTS_DIR)
    if not os.path.isdir(keep):
        return None
    out = []
    for name in sorted(os.listdir(keep)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(keep, name)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        out.append({"run_id": rec.get("run_id"), "step_time_s": rec.get("step_time_s"),
                    "foreign_cpu_frac": rec.get("foreign_cpu_frac"), "runqueue_wait_frac": rec.get("runqueue_wait_frac"),
                    "foreign_wait_frac": rec.get("foreign_wait_frac"), "disturbed": disturbance(rec)})
    return out or None


MEASUREMENT_FIELDS = [f.name for f in fields(RunRecord) if f.name not in ("provenance", "config")]


BENCH_KIND = "collbench"
"""``record_kind`` of a collective benchmark's record (a training run's is ``train``)."""


@dataclass
class BenchRow:
    """One message size of a collective benchmark (an element of the record's ``rows``), nccl-tests'
    definitions: times are the maximum over ranks of one all-reduce, taken over the timed iterations."""

    size_bytes: int = field(default=0, metadata=_doc("message size (bytes; whole elements of `dtype`)"))
    count: int = field(default=0, metadata=_doc("elements all-reduced"))
    dtype: str = field(default="float32", metadata=_doc("element type"))
    n_iters: int = field(default=0, metadata=_doc("timed all-reduces (after the warm-up ones)"))
    time_s: float = field(default=math.nan, metadata=_doc("median over iterations of the slowest rank's time (s)"))
    time_s_p10: float = field(default=math.nan, metadata=_doc("10th percentile of that time (s)"))
    time_s_p90: float = field(default=math.nan, metadata=_doc("90th percentile of that time (s)"))
    emulated_s: float = field(default=0.0, metadata=_doc("delay the emulated link added to each all-reduce (s)"))
    algbw_bytes_per_s: float = field(default=math.nan, metadata=_doc("`size_bytes / time_s` (bytes/s)"))
    busbw_bytes_per_s: float = field(default=math.nan, metadata=_doc(
        "`algbw_bytes_per_s * 2 (N - 1) / N`: what each rank's link carried in a ring all-reduce (bytes/s)"))
    nccl_algo_used: str | None = field(default=None, metadata=_doc(
        "algorithm NCCL logged for this size (several joined by `+`); null on gloo or when NCCL did not say"))
    nccl_proto_used: str | None = field(default=None, metadata=_doc("protocol NCCL logged for this size, or null"))


# Row fields that must be finite and positive, and those that must be finite and non-negative.
_BENCH_ROW_POSITIVE = ("size_bytes", "count", "time_s", "algbw_bytes_per_s")
_BENCH_ROW_NON_NEGATIVE = ("time_s_p10", "time_s_p90", "busbw_bytes_per_s", "emulated_s")


@dataclass
class BenchRecord:
    """``record.json`` of a collective benchmark (``python -m kanlib.collbench``), under
    ``out_dir/<study>/<run_key>/`` as a training run's. As in a training run's record, the config's fields
    are at the top level under their own names, except ``backend`` and ``device``, which hold the values used."""

    provenance: Provenance
    config: dict
    rows: list = field(default_factory=list, metadata=_doc("one `BenchRow` per message size, smallest first"))
    record_kind: str = field(default=BENCH_KIND, metadata=_doc(f"`{BENCH_KIND}`"))
    data_sha256: str | None = field(default=None, metadata=_doc(
        "task=file: SHA-256 of the data file's content (16 hex digits; part of the run key), null otherwise"))
    status: str = field(default="ok", metadata=_doc("`ok`"))
    run_key: str = field(default="", metadata=_doc("stable key of the config and code version; the folder name"))
    run_id: str = field(default="", metadata=_doc("unique id of this attempt (UTC time + random suffix)"))
    started_at: str = field(default="", metadata=_doc("wall-clock start of the run (rank 0, ISO 8601 UTC)"))
    finished_at: str = field(default="", metadata=_doc("wall-clock end of the run (rank 0, ISO 8601 UTC)"))
    config_backend: str = field(default="", metadata=_doc("backend asked for (`auto`, `gloo`, `nccl`)"))
    config_device: str = field(default="", metadata=_doc("device asked for (`auto`, `cpu`, `cuda`)"))
    backend: str = field(default="none", metadata=_doc("process-group backend used (`gloo`, `nccl`, `none`)"))
    device: str = field(default="cpu", metadata=_doc("device type used (`cpu`, `cuda`)"))
    world_size: int = field(default=1, metadata=_doc("processes in the job (`nnodes * nproc_per_node`)"))
    placement: str = field(default="1x1", metadata=_doc("`NxP`: nodes x processes per node"))
    nccl_debug_file: str | None = field(default=None, metadata=_doc(
        "NCCL's debug log of rank 0, parsed for the algorithm and protocol of each size (null on gloo)"))
    nccl_note: str | None = field(default=None, metadata=_doc("why no NCCL choice was read, when none was"))
    launch_id: str = field(default="", metadata=_doc("the launch (worker group) that ran it; empty when it ran alone"))
    runs_before_in_launch: int = field(default=0, metadata=_doc("runs that launch ran before this one"))

    def to_dict(self) -> dict:
        """The flat JSON object of ``record.json``."""
        out = {**self.config}
        out.update(dataclasses.asdict(self.provenance))
        for f in fields(self):
            if f.name not in ("provenance", "config"):
                v = getattr(self, f.name)
                out[f.name] = [dataclasses.asdict(r) if isinstance(r, BenchRow) else r for r in v] \
                    if f.name == "rows" else v
        return out


def check_bench_record(rec) -> str | None:
    """Why ``rec`` (a parsed collective-benchmark ``record.json``) cannot be used, or None when it is valid.

    Checks the schema version, ``record_kind``, the placement fields, and every row: positive finite size,
    count, time and algbw; non-negative finite percentiles, busbw and emulated delay.
    """
    if not isinstance(rec, dict) or "schema_version" not in rec:
        return "not a run record (no schema_version)"
    if rec["schema_version"] not in SCHEMA_VERSIONS_READ:
        return f"schema_version {rec['schema_version']!r} is not one this version reads ({SCHEMA_VERSIONS_READ})"
    if rec.get("record_kind") != BENCH_KIND:
        return f"record_kind is {rec.get('record_kind')!r}, not {BENCH_KIND!r}"
    if rec.get("status", "ok") != "ok":
        return f"status is {rec.get('status')!r}, not 'ok'"
    for name in ("world_size", "nnodes", "nproc_per_node"):
        v = rec.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{name} is {v!r}, not a positive integer"
    if rec["world_size"] != rec["nnodes"] * rec["nproc_per_node"]:
        return (f"world_size {rec['world_size']} is not nnodes x nproc_per_node = "
                f"{rec['nnodes']} x {rec['nproc_per_node']}")
    rows = rec.get("rows")
    if not isinstance(rows, list) or not rows:
        return "rows is missing or empty"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"rows[{i}] is not an object"
        why = _out_of_range(row, _BENCH_ROW_POSITIVE, _BENCH_ROW_NON_NEGATIVE, required=True)
        if why:
            return f"rows[{i}].{why}"
    return None


@dataclass
class ManifestRow:
    """One attempt of one run, appended to ``<study>/manifest.jsonl`` by the runner."""

    run_key: str = field(metadata=_doc("which run"))
    study: str = field(default="", metadata=_doc("the run's study"))
    world_size: int = field(default=1, metadata=_doc("processes in the run"))
    placement: str = field(default="1x1", metadata=_doc("nodes x processes per node"))
    launcher: str = field(default="local", metadata=_doc("`local`, `multinode` or `slurm`"))
    run_dir: str = field(default="", metadata=_doc("the run's folder"))
    status: str = field(default="failed", metadata=_doc(
        "`ok`, `failed`, `timeout` (the runner's deadline passed), `preempted` (SIGTERM; a checkpoint was saved) or "
        "`disturbed` (an ok attempt whose machine was busy, set aside into `attempts/` to run again; `error` says why)"))
    exit_code: int | None = field(default=None, metadata=_doc("the launcher's exit code; null for a timeout or a "
                                                               "config refused before launch"))
    error: str = field(default="", metadata=_doc("the root cause: the first error line of the failing rank, a signal "
                                                  "that killed a process, or the deadline"))
    attempt_at: str = field(default="", metadata=_doc("when the attempt started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=_doc("how long the attempt took (s)"))
    pid: int = field(default=0, metadata=_doc("process id of the runner that made the attempt"))
    launch_id: str = field(default="", metadata=_doc("the launch (worker group) that ran the attempt; empty when "
                                                     "it was refused before any launch"))


@dataclass
class LaunchRow:
    """One launch of a worker group (one torchrun, N joined torchruns, or one srun step running a plan of
    runs; kanlib.worker), appended to ``<study>/launches.jsonl`` by the runner when the launch ends."""

    launch_id: str = field(metadata=_doc("which launch; the folder `<study>/launches/<launch_id>/` holds its plan, "
                                         "events and logs"))
    study: str = field(default="", metadata=_doc("the study of its runs"))
    placement: str = field(default="1x1", metadata=_doc("nodes x processes per node"))
    launcher: str = field(default="local", metadata=_doc("`local`, `multinode` or `slurm`"))
    n_planned: int = field(default=0, metadata=_doc("runs handed to the launch"))
    n_began: int = field(default=0, metadata=_doc("runs it began"))
    n_ok: int = field(default=0, metadata=_doc("runs it ended ok"))
    started_at: str = field(default="", metadata=_doc("when it started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=_doc("from its start to the end of its processes (s): start-up, "
                                                         "every run, teardown"))
    exit_code: int | None = field(default=None, metadata=_doc("the launch's exit code; null when the runner ended it "
                                                              "(deadline, interruption)"))
    logs: list = field(default_factory=list, metadata=_doc("its log files"))
    status: str = field(default="ok", metadata=_doc("`ok` (the row is complete)"))
    n_parts: int = field(default=1, metadata=_doc("parts of its plan it was handed: a group kept open across a "
                                                  "sweep's rounds gets one per round it served"))
    waiting_s: float = field(default=0.0, metadata=_doc("of `duration_s`, the time it waited between parts of its "
                                                        "plan, holding no CPU, while other groups ran (s)"))


@dataclass
class SweepRow:
    """One sweep (runners.sweep.run_sweep) over a study folder, appended to ``<study>/sweeps.jsonl`` when it ends:
    how long it took and how many launches it made, against which the records' measured steps are weighed."""

    study: str = field(metadata=_doc("the study of its runs"))
    started_at: str = field(default="", metadata=_doc("when it started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=_doc("from its start to its end (s): every launch, its waits, "
                                                         "the reruns"))
    n_runs: int = field(default=0, metadata=_doc("runs it was given (after removing duplicates)"))
    n_ok: int = field(default=0, metadata=_doc("runs that have an ok record at its end"))
    n_failed: int = field(default=0, metadata=_doc("runs that failed"))
    n_skipped: int = field(default=0, metadata=_doc("runs already done before it started"))
    n_launches: int = field(default=0, metadata=_doc("worker-group launches it made"))
    n_rerun: int = field(default=0, metadata=_doc("runs run again because their first attempt was disturbed"))
    launcher: str = field(default="local", metadata=_doc("`local`, `multinode` or `slurm`"))


MANIFEST_STATUSES = ("ok", "failed", "timeout", "preempted", "disturbed")


def manifest_path(out_dir: str, study: str) -> str:
    """``out_dir/<study>/manifest.jsonl``."""
    return os.path.join(out_dir, study, MANIFEST_NAME)


def append_manifest(path: str, row: ManifestRow | dict) -> None:
    """Append ``row`` as one JSON line with a single ``O_APPEND`` write.

    Concurrent appenders do not interleave (one ``write`` of a line to a local file in append mode
    lands whole). When the file ends in a line cut short by a crash, a newline is written first so the
    new row starts on its own line (the cut line stays unreadable and is skipped when loading).
    """
    row = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
    if row.get("status") not in MANIFEST_STATUSES:
        raise ValueError(f"status: unknown value {row.get('status')!r}; choose one of {', '.join(MANIFEST_STATUSES)}")
    append_jsonl(path, row)


def append_jsonl(path: str, row) -> None:
    """Append ``row`` (a dict or dataclass) to ``path`` as one JSON line, as :func:`append_manifest` does."""
    row = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = json.dumps(row, sort_keys=True, default=_json_default) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        _write_all(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n != len(data):  # a full disk: say so rather than leave half a line
        raise OSError(f"wrote {n} of {len(data)} bytes (disk full?)")


def read_events(path: str) -> list[dict]:
    """The events of a worker group (``events.jsonl``) in order."""
    return read_jsonl(path)


def append_event(path: str, event: dict) -> None:
    """Append one event of a worker group (``events.jsonl``, kanlib.worker): one ``O_APPEND`` write, synced."""
    append_jsonl(path, event)


def read_jsonl(path: str) -> list[dict]:
    """The complete JSON-object lines of ``path`` in order (events, launches; a missing file has none; a cut or
    garbled line is skipped)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_manifest_rows(path: str) -> tuple[list[dict], list[tuple]]:
    """Rows of a manifest in the order written, and the unreadable lines as ``(file, line, reason)``."""
    rows, bad = [], []
    if os.path.exists(path):
        with open(path, "rb") as f:
            for i, raw in enumerate(f.read().split(b"\n"), start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                    if not isinstance(obj, dict) or "run_key" not in obj or "status" not in obj:
                        raise ValueError("not a manifest row (no run_key or status)")
                except ValueError as e:
                    bad.append((path, i, getattr(e, "msg", None) or str(e)))
                    continue
                rows.append(obj)
    return rows, bad


# -- writing ----------------------------------------------------------------------------------------
def new_run_id() -> str:
    """A unique id for one attempt of a run."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def iso(t: float) -> str:
    """A wall time (s since the epoch) as ISO 8601 UTC."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def atomic_write_json(path: str, obj) -> None:
    """Write ``obj`` to a temporary file, fsync it and rename it into place (a crash or a full disk
    leaves the old file, or none, never half a file; the temporary file is removed)."""
    if dataclasses.is_dataclass(obj):
        obj = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True, default=_json_default)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _json_default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- the run-folder lock ---------------------------------------------------------------------------
class RunLock:
    """``<run_dir>/.lock``: held (``flock``) by the one process that runs the folder's run now.

    The kernel drops the lock when the holding process dies, however it dies. The file says who holds it
    (pid, host, since) for the message another runner prints while it waits.
    """

    NAME = ".lock"

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, self.NAME)
        self._fd = None

    def holder(self) -> str:
        try:
            with open(self.path) as f:
                info = json.load(f)
            return f"pid {info['pid']} on {info['host']} since {info['since']}"
        except (OSError, ValueError, KeyError):
            return "another process"

    def acquire(self, wait: bool = True, echo=None, poll_s: float = 0.5) -> bool:
        """Take the lock; while another process holds it, wait (saying once who holds it, on ``echo`` or else
        stderr, so a sweep that streams nothing still says why it waits) or return False.

        A failure after the lock was taken (writing who holds it on a full disk) releases it again before
        raising: a process never keeps a lock it does not know it has."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        said = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        os.close(fd)
                        return False
                    if not said:
                        (echo or sys.stderr).write(f"kanlib: {os.path.dirname(self.path)} is being run by "
                                                   f"{self.holder()}; waiting\n")
                        said = True
                    time.sleep(poll_s)
            os.ftruncate(fd, 0)
            data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}).encode()
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(f"{self.path}: short write (disk full?)")
        except BaseException:
            os.close(fd)  # closing the descriptor drops the flock
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# -- reading and checking ---------------------------------------------------------------------------
# Record fields that must be finite and positive for a record to be used, and those that must be
# finite and non-negative when present.
_POSITIVE = ("step_time_s", "world_size", "global_batch")
_NON_NEGATIVE = ("forward_s", "backward_s", "optimizer_s", "comm_total_s", "peak_mem_bytes", "n_params",
                 "emulated_s", "time_to_target_s")


def _out_of_range(rec: dict, positive, non_negative, required: bool = False) -> str | None:
    """``name is value, ...`` for the first field of ``rec`` that is not a finite number in its range (``positive``:
    > 0 and always required; ``non_negative``: >= 0, required only with ``required``), or None."""
    for name in (*positive, *non_negative):
        v = rec.get(name)
        if v is None and name not in positive and not required:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{name} is {v!r}, not a number"
        if not math.isfinite(v) or (v <= 0 if name in positive else v < 0):
            return f"{name} is {v!r}, outside its range ({'> 0' if name in positive else '>= 0'}, finite)"
    return None


def check_record(rec) -> str | None:
    """Why ``rec`` (a parsed ``record.json``) cannot be used, or None when it is a valid record.

    Checks the schema version and the value ranges of the measurements: a NaN, zero or negative step
    time, a non-numeric field, an unknown schema version are reasons to refuse it. A collective
    benchmark's record is checked by :func:`check_bench_record`.
    """
    if not isinstance(rec, dict) or "schema_version" not in rec:
        return "not a run record (no schema_version)"
    if rec.get("record_kind") == BENCH_KIND:  # its rows have their own ranges
        return check_bench_record(rec)
    if rec["schema_version"] not in SCHEMA_VERSIONS_READ:
        return f"schema_version {rec['schema_version']!r} is not one this version reads ({SCHEMA_VERSIONS_READ})"
    why = _out_of_range(rec, _POSITIVE, _NON_NEGATIVE)
    if why:
        return why
    loss = rec.get("final_val_loss")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)):
        return f"final_val_loss is {loss!r}, not a finite number (an ok run ends with a finite validation loss)"
    nodes, per_node = rec.get("nnodes"), rec.get("nproc_per_node")
    if isinstance(nodes, int) and isinstance(per_node, int) and rec["world_size"] != nodes * per_node:
        return (f"world_size is {rec['world_size']!r}, but the placement nnodes x nproc_per_node is "
                f"{nodes}x{per_node}: the run did not run with the processes its placement says")
    if rec.get("status", "ok") != "ok":
        return f"status is {rec.get('status')!r}, not 'ok'"
    return None


def read_record(path: str) -> dict:
    """A validated ``record.json``; :class:`RecordError` names the file, the line and the reason otherwise."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        line = getattr(e, "lineno", None)
        raise RecordError(f"{path}" + (f", line {line}" if line else "") + f": {getattr(e, 'msg', None) or e}") from e
    why = check_record(rec)
    if why:
        raise RecordError(f"{path}: {why}")
    return rec


# -- the generated schema ---------------------------------------------------------------------------
def _type_name(f) -> str:
    t = str(f.type).replace("typing.", "")
    return t.replace("| None", "or null").replace("list", "list").replace("dict", "object").strip()


def _rows(cls, skip=()) -> list[str]:
    out = []
    for f in fields(cls):
        if f.name in skip:
            continue
        out.append(f"| `{f.name}` | {_type_name(f)} | {f.metadata.get('doc', '')} |")
    return out


def _doc(cls, first_paragraph: bool = False, join: bool = True) -> str:
    """A record class's docstring as one markdown paragraph (its first only, or its lines kept, when asked)."""
    doc = cls.__doc__.strip()
    doc = doc.split("\n\n")[0] if first_paragraph else doc
    return (doc.replace("\n    ", " ") if join else doc).replace("``", "`")


def _table(cls, head: str = "field", skip: tuple = ()) -> list[str]:
    """A markdown table of a record class's fields: name, type and meaning."""
    return [f"| {head} | type | meaning |", "|---|---|---|", *_rows(cls, skip=skip)]


def schema_markdown() -> str:
    """``docs/schema.md``, generated from :class:`Provenance`, :class:`RunRecord`, :class:`StepRow`,
    :class:`ManifestRow`, :class:`BenchRecord` and :class:`BenchRow` (``python -m kanlib.records >
    docs/schema.md``; a test keeps them equal)."""
    lines = [
        f"# Result records (schema version {SCHEMA_VERSION})",
        "",
        "Generated from the dataclasses in `kanlib/records.py` by `python -m kanlib.records > docs/schema.md`;",
        "a test fails when this file and the code differ. Units are in the field names (`_s` seconds, `_bytes`",
        "bytes, `_per_s` per second).",
        "",
        "Each run writes one folder, `out_dir/<study>/<run_key>/`, with:",
        "",
        "| file | written | content |",
        "|---|---|---|",
        f"| `{CONFIG_NAME}` | first, by rank 0 | the run's `RunConfig` as JSON |",
        f"| `{STEPS_NAME}` | one row per step, appended and flushed as it comes (rank 0) | `StepRow`, below |",
        "| `launch.log` (`launch-node<i>.log`, `slurm-<job>.log`) | by the runner | the launch command and every "
        "line the run printed |",
        f"| `{MODEL_NAME}` | at the end (rank 0) | the final `state_dict`, on CPU (`torch.load(..., weights_only=True)`) |",
        "| `checkpoints/ckpt-<step>.pt`, `checkpoints/latest` | every `checkpoint_every` steps and on SIGTERM | "
        "resumable state; removed once the record exists ([faults](faults.md)) |",
        f"| `{PREEMPTED_NAME}` | when SIGTERM stopped the run | step, checkpoint, time, attempt |",
        f"| `{RECORD_NAME}` | last, atomically (temporary file, fsync, rename) | `RunRecord`, below; its presence "
        "marks the run complete |",
        "",
        f"## `{RECORD_NAME}`",
        "",
        _doc(RunRecord),
        "Every field of `kanlib.config.RunConfig` (see its field docstrings) is there too.",
        "",
        *_table(Provenance),
        *_rows(RunRecord, skip=("provenance", "config")),
        "",
        "Derived quantities (speedup, efficiency, Karp-Flatt serial fraction, exposed communication, bootstrap",
        "intervals) are computed from records by the study modules of `kanlib.studies`, never stored.",
        "`kanlib.analysis.load` refuses records that fail `kanlib.records.check_record` (unknown schema version,",
        "NaN or non-positive step time, non-numeric measurements) and names them.",
        "",
        f"## `{STEPS_NAME}`",
        "",
        _doc(StepRow, first_paragraph=True),
        "",
        *_table(StepRow, head="column"),
        "",
        f"## `<study>/{MANIFEST_NAME}`",
        "",
        _doc(ManifestRow, join=False),
        "",
        *_table(ManifestRow),
        "",
        f"## `<study>/{LAUNCHES_NAME}`",
        "",
        _doc(LaunchRow),
        "Each launch's folder `<study>/launches/<launch_id>/` holds `plan.json` (the runs handed to it, in order),",
        "`events.jsonl` (rank 0's `begin` and `end` of each run) and its logs (`launch.log`, `launch-node<i>.log`,",
        "`srun.log` or `slurm-<job>.log`); each run's part of them is copied into the run's own folder.",
        "",
        *_table(LaunchRow),
        "",
        f"## `<study>/{SWEEPS_NAME}`",
        "",
        _doc(SweepRow),
        "",
        *_table(SweepRow),
        "",
        f"## `{RECORD_NAME}` of a collective benchmark",
        "",
        _doc(BenchRecord),
        "Every field of `kanlib.collbench.BenchConfig` is there too, and the provenance fields of a training run's",
        "record. `kanlib.records.check_bench_record` refuses a record whose rows are not finite and in range.",
        "",
        *_table(BenchRecord, skip=("provenance", "config")),
        "",
        "Each element of `rows`:",
        "",
        _doc(BenchRow),
        "",
        *_table(BenchRow),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown(), end="")
