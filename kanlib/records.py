"""A run's data, defined once: the per-step row, the run record, the benchmark record, and their writers and checks.

Everything a run writes into its folder is declared here as a dataclass whose fields carry units in their names
and a docstring; ``docs/schema.md`` is generated from these classes and the study logs' rows of kanlib.manifest
(kanlib.schema, checked by a test). Runtime only: no pandas (analysis lives in kanlib.analysis and
kanlib.studies), and torch only inside :func:`provenance`.

- :class:`StepRow` - one row of ``steps.csv`` per step (rank 0's times; long format).
- :class:`RunRecord` - ``record.json``: provenance, the flattened config, measurements, fault counters.
- :class:`BenchRecord` - ``record.json`` of a collective benchmark (kanlib.collbench), one :class:`BenchRow` per
  message size.

The study's logs (manifest, launches, sweeps), the run-folder lock and attempts set aside for a rerun are
kanlib.manifest's; whether a run was disturbed is kanlib.disturbance's.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
import os
import socket
import subprocess
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


def field_doc(text: str, reduce: str | None = None) -> dict:
    """A record field's metadata: ``doc``, its meaning (docs/schema.md prints it), and ``reduce``, how the record
    combines the ranks' values of a step (``max``, ``mean``, or None: rank 0's)."""
    return {"doc": text, "reduce": reduce}


_doc = field_doc  # the short name this module's fields are written with


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
                                                         "(kanlib.runkey.code_version); part of the run key"))
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

    from kanlib.runkey import code_version

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
    kan_path_steps: dict | None = field(default=None, metadata=_doc(
        "training steps of this attempt that ran each KAN kernel path, forward or backward (`{path: steps}`; a "
        "step that ran two paths counts for both; grid updates and evaluations are not steps); null for other "
        "models"))
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
    tensor_peak_bytes: int | None = field(default=None, metadata=_doc(
        "rank 0's tensor memory of one training step (bytes): the tensors it starts from and keeps (parameters, "
        "buffers, gradients, optimizer state, DDP's gradient buckets; counted from the tensors) plus the most the "
        "allocator's live bytes rose during it (batch, activations, temporaries): on CPU from torch's profiler's "
        "memory events (`profile_memory`), on CUDA from `max_memory_allocated`; one extra, untimed step after the "
        "measured ones, the trained parameters put back. Not the resident set: it follows the model's size "
        "(kanlib.metrics.step_tensor_peak_bytes); null in records written before it was measured"))
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
    """Write ``obj`` as JSON with :func:`write_synced` (a crash or a full disk leaves the old file, or none, never
    half a file; the temporary file is removed)."""
    if dataclasses.is_dataclass(obj):
        obj = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
    write_synced(path, json.dumps(obj, indent=1, sort_keys=True, default=json_default) + "\n")


def write_synced(path: str, data) -> None:
    """Write ``data`` (text or bytes) to a temporary file beside ``path``, fsync it, rename it into place and fsync
    the folder: a reader sees the old file or the whole new one; on any error the temporary file is removed."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_dir(folder: str) -> None:
    """fsync a folder, so a rename into it survives a crash."""
    dfd = os.open(os.path.abspath(folder), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def json_default(o):
    """``o`` as JSON for :func:`json.dump`'s ``default``: numpy scalars as numbers, tuples as lists; TypeError
    otherwise."""
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- reading and checking ---------------------------------------------------------------------------
# Record fields that must be finite and positive for a record to be used, and those that must be
# finite and non-negative when present.
_POSITIVE = ("step_time_s", "world_size", "global_batch")
_NON_NEGATIVE = ("forward_s", "backward_s", "optimizer_s", "comm_total_s", "peak_mem_bytes", "tensor_peak_bytes",
                 "n_params", "emulated_s", "time_to_target_s")


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
