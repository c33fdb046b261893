"""Run configurations: one typed dataclass per launchable program, checked once.

:class:`Config` is the shared machinery: every field's type comes from its annotation, and one
generic rule (:func:`coerce`) coerces and checks every value against it - numbers to the
declared type (so ``lr=1`` and the CLI's ``--lr=1.0`` are the same config), ``Literal[...]`` choices,
finite floats, sequences of numbers, strings without control characters. A bad value raises
:class:`ConfigError` naming the field, before any process starts. ``--key=value`` arguments (the
torchrun entry points) are parsed against the same annotations; an unknown key is an error.

:class:`RunConfig` describes one DDP/FSDP training run (``python -m kanlib.train``);
``kanlib.collbench.BenchConfig`` one collective benchmark. Both have a stable :meth:`Config.run_key`
that hashes the canonical config and the version of the code that runs it (:mod:`kanlib.runkey`), so
changed code never reuses or silently pools old results.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import typing
from dataclasses import dataclass, fields
from typing import ClassVar, Literal

from kanlib import runkey
from kanlib.errors import ConfigError

Model = Literal["kan", "kan_rbf", "kan_cheb", "mlp"]
KanImpl = Literal["reference", "fast", "compiled"]
Backend = Literal["auto", "gloo", "nccl"]
Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["fp32", "bf16", "fp64"]
CommHook = Literal["default", "timed", "noop", "bf16", "fp16", "powersgd"]
NanPolicy = Literal["stop", "skip"]
Optimizer = Literal["lbfgs", "adam", "sgd"]
Parallelism = Literal["ddp", "fsdp"]
LrRule = Literal["none", "linear", "sqrt"]
CpuAffinity = Literal["auto", "none"]
NCCL_ALGOS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
NCCL_PROTOS = ("ll", "ll128", "simple")

# A study name becomes a folder name: letters, digits, '_', '-', '.', not starting with '.'.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_placement(text) -> tuple[int, int]:
    """``"NxP"`` -> ``(N, P)``: N nodes x P processes per node (both positive integers)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"placements: {text!r} is not 'NxP' (N nodes x P processes per node, both >= 1), "
                          f"e.g. '2x1'")
    return int(m.group(1)), int(m.group(2))


# What the processes of a worker group share, so every run the group runs must agree on it (kanlib.worker): the
# placement, the process group (backend, device, collective timeout, NCCL's settings, read once per communicator)
# and each process's CPUs and threads.
GROUP_FIELDS = ("nnodes", "nproc_per_node", "backend", "device", "threads", "cpu_affinity", "pg_timeout_s",
                "nccl_algo", "nccl_proto")


def group_key(cfg) -> tuple:
    """Runs with equal keys can run one after another in one worker group: the config's kind, its study
    folder and :data:`GROUP_FIELDS`."""
    return (type(cfg).__name__, os.path.abspath(cfg.out_dir), cfg.study,
            *(getattr(cfg, f) for f in GROUP_FIELDS))




@dataclass
class Config:
    """Shared machinery of typed, validated, CLI-parsable run configs (subclasses are dataclasses)."""

    ENTRY: ClassVar[str] = ""
    """The module torchrun runs for this kind of config (``python -m <ENTRY> --key=value ...``)."""
    NAME_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields that become folder or job names: restricted to letters, digits, '_', '-' and '.'."""

    def __post_init__(self) -> None:
        self._check_types()
        self.validate()

    def validate(self) -> None:
        """Cross-field checks of a subclass (the generic type rule has run)."""

    # -- the one type rule ---------------------------------------------------------------
    def _check_types(self) -> None:
        hints = _hints(type(self))
        for f in fields(self):
            setattr(self, f.name, coerce(f.name, getattr(self, f.name), hints[f.name]))
        for name in self.NAME_FIELDS:
            v = getattr(self, name)
            if not _NAME.fullmatch(v) or ".." in v:
                raise ConfigError(f"{name}: {v!r} is not a name (letters, digits, '_', '-', '.'; "
                                  f"not a path, no leading '.')")

    # -- derived -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Total number of processes: ``nnodes * nproc_per_node``."""
        return self.nnodes * self.nproc_per_node

    @property
    def placement(self) -> str:
        """``"NxP"``: N nodes x P processes per node."""
        return f"{self.nnodes}x{self.nproc_per_node}"

    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field (tuples become lists)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}

    def replace(self, **changes):
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def key_prefix(self) -> str:
        """The readable start of :meth:`run_key`."""
        return f"w{self.placement}-r{self.repeat}"

    def run_key(self, code_version: str | None = None) -> str:
        """Stable key of this run: a readable prefix and a hash of the canonical config and code.

        ``out_dir`` is left out (moving a study keeps its keys); ``code_version`` (default
        :func:`kanlib.runkey.code_version`) is hashed in, so changed code reruns instead of reusing old records.
        """
        d = self.to_dict()
        d.pop("out_dir", None)
        d["code_version"] = code_version or runkey.code_version()
        d["kind"] = type(self).__name__
        d.update(self.key_inputs())
        digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.key_prefix()}-{digest}"

    def key_inputs(self) -> dict:
        """What a run's result depends on besides the config and the code, hashed into :meth:`run_key` (each read by
        :mod:`kanlib.runkey`): the torch version (``torch_version``), for ``task=file`` the data file's content
        (``data_fingerprint``), and a host allocator other than the default (``host_malloc_asked``), so a torch
        upgrade, rewritten data or ``KANLIB_HOST_MALLOC=system`` reruns instead of reusing (and later pooling with)
        old records. The default allocator adds nothing, so the keys of existing folders stay as they were."""
        out = {"torch_version": runkey.torch_version()}
        if getattr(self, "task", "") == "file" and getattr(self, "data_path", ""):
            out["data_sha256"] = runkey.data_fingerprint(self.data_path)
        if runkey.host_malloc_asked() != "steady":
            out["host_malloc"] = runkey.host_malloc_asked()
        return out

    def run_dir(self) -> str:
        """Folder of this run's files: ``out_dir/<study>/<run_key>``."""
        return os.path.join(self.out_dir, self.study, self.run_key())

    # -- command line --------------------------------------------------------------------
    def to_cli(self) -> list[str]:
        """``--key=value`` arguments that :meth:`from_cli` turns back into this config."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = ",".join(repr(x) if isinstance(x, float) else str(x) for x in v)
            elif isinstance(v, float):
                v = repr(v)
            out.append(f"--{f.name}={v}")
        return out

    @classmethod
    def from_cli(cls, argv: list[str]):
        """Parse ``--key=value`` arguments against the field annotations."""
        hints = _hints(cls)
        kwargs = {}
        for arg in argv:
            if not arg.startswith("--") or "=" not in arg:
                raise ConfigError(f"expected --key=value, got {arg!r}")
            key, raw = arg[2:].split("=", 1)
            key = key.replace("-", "_")
            if key not in hints:
                known = ", ".join(f.name for f in fields(cls))
                raise ConfigError(f"{key}: unknown config field (known: {known})")
            kwargs[key] = parse_text(key, raw, hints[key])
        return cls(**kwargs)

    @classmethod
    def usage(cls, prog: str) -> str:
        """The ``--help`` text: every field with its type, default and docstring."""
        docs = cls.field_docs()
        lines = [f"usage: {prog} --key=value ...", "", (cls.__doc__ or "").strip(), "", "fields:"]
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            lines.append(f"  --{f.name}={shown}")
            lines += [f"      {line.strip()}" for line in docs.get(f.name, "").splitlines()]
        return "\n".join(lines)

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Field name -> its docstring, read from the class source (for docs and notebooks)."""
        return field_docs(cls)


MAX_SEED = 2**32 - 1
MAX_PG_TIMEOUT_S = 365 * 86400.0


@dataclass
class RunConfig(Config):
    """One run of data-parallel KAN training. Field docstrings follow each field."""

    ENTRY: ClassVar[str] = "kanlib.train"
    NAME_FIELDS: ClassVar[tuple[str, ...]] = ("study",)

    study: str = "adhoc"
    """Name of the study this run belongs to; records are written under ``out_dir/<study>/``."""
    model: Model = "kan"
    """Model kind: kan (exact B-spline), kan_rbf (Gaussian RBF basis), kan_cheb (Chebyshev basis), mlp."""
    widths: tuple[int, ...] = (2, 16, 16, 1)
    """Layer widths, input first, output last (at least two entries)."""
    grid_size: int = 5
    """Number of grid intervals of each spline (KAN models)."""
    spline_order: int = 3
    """B-spline order k (3 = cubic)."""
    grid_range: tuple[float, float] = (-1.0, 1.0)
    """Lower and upper end of the initial spline grid."""
    kan_impl: KanImpl = "compiled"
    """B-spline KAN implementation: compiled (closed form with torch.compile'd kernels; falls back to
    fast, with a warning, where compilation fails), fast (the same closed form, eager) or reference
    (Cox-de Boor recursion). All three compute the same function; the record says which ran."""
    task: str = "exp_sin"
    """Task (kanlib.data): exp_sin, highdim, product (synthetic regression), digits (classification),
    diabetes (regression), feynman:<name> (a Feynman equation), or file (real data from ``data_path``)."""
    data_path: str = ""
    """task=file: a CSV file with a header row (numeric columns) or an .npz file with arrays x and y."""
    target: str = ""
    """task=file, CSV: the target column (default: the last column); every other column is a feature."""
    n_train: int = 1024
    """Training samples: generated from ``seed`` (synthetic tasks), or at most this many rows (data sets)."""
    n_val: int = 0
    """Held-out validation samples (bundled data sets and files: rows of the set; must leave training rows). 0 (the
    default): 2048, or for a bundled set a fifth of its rows if that is fewer (digits: 359, diabetes: 88); the
    config holds the number chosen."""
    global_batch: int = 0
    """Samples per optimizer step summed over all processes; split evenly across ranks. 0 (the default): the whole
    training set (``n_train``, or the training rows of a data set or file), rounded down to a multiple of
    ``nproc_per_node * nnodes * grad_accum_steps``; the config holds the number chosen. Full-batch steps are L-BFGS's
    natural batch (pykan's recipe); a smaller batch gives L-BFGS a mini-batch per step (kanlib.optim: no curvature
    pair spans two batches, and its line search backs off from non-finite losses)."""
    steps: int = 30
    """Optimizer steps in total, warm-up included."""
    warmup_steps: int = 5
    """Leading steps excluded from timing (compilation, DDP's bucket rebuild in the first iteration)."""
    lr: float = 1.0
    """Learning rate (before ``lr_rule`` and ``lr_warmup_steps``); for lbfgs the first trial step of each line
    search (1.0, pykan's), for adam and sgd the step size (set it: 1e-3 to 1e-2)."""
    lr_rule: LrRule = "none"
    """Learning-rate scaling with the global batch: none, linear (lr * B / lr_base_batch) or sqrt
    (lr * sqrt(B / lr_base_batch))."""
    lr_base_batch: int = 0
    """The global batch ``lr`` is tuned for (needed by lr_rule linear or sqrt)."""
    lr_warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from lr/steps to the scaled lr (0 = none)."""
    optimizer: Optimizer = "lbfgs"
    """Optimizer: lbfgs (pykan's L-BFGS, kanlib.optim: strong Wolfe line search, history ``lbfgs_history``,
    ``lbfgs_max_iter`` iterations per step; ``lr`` is its first trial step, 1.0 as in pykan; every rank takes
    the same step), adam or sgd (which want an ``lr`` near 1e-3 to 1e-2)."""
    lbfgs_max_iter: int = 20
    """optimizer=lbfgs: iterations per optimizer step (pykan: 20). A step evaluates the loss and gradients of its
    global batch (one forward and backward) at most ``lbfgs_max_iter * 5 // 4`` times; the record says how often."""
    lbfgs_history: int = 10
    """optimizer=lbfgs: curvature pairs kept (pykan: 10); each costs two vectors the size of the parameters."""
    seed: int = 0
    """Seed of data, initialisation and sampling order."""
    repeat: int = 0
    """Repeat index of an otherwise identical run (each repeat is its own process group)."""
    nnodes: int = 1
    """Number of nodes (one torchrun per node)."""
    nproc_per_node: int = 1
    """Processes per node; world size = nnodes * nproc_per_node."""
    backend: Backend = "auto"
    """Process-group backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    device: Device = "auto"
    """Device: auto (cuda if available), cpu or cuda."""
    threads: int = 1
    """torch intra-op threads per process."""
    cpu_affinity: CpuAffinity = "auto"
    """auto: on CPU, each launched process runs on ``threads`` CPUs that no other kanlib process on this host
    holds (kanlib.distributed.pin_cpus), or where none are free, wherever the OS puts it; on CUDA the OS places
    it. none: the OS always places it. Unpinned, 2-process runs on 2 cores took 3.2-4.0 ms per step in 4 of 14
    runs and 2.3-2.6 ms in the rest; pinned, 2.1-2.3 ms in all 14 (docs/measurement.md)."""
    precision: Precision = "fp32"
    """fp32; bf16 autocast with float32 master weights; or fp64: data, parameters, gradients, loss, optimizer state
    and DDP's all-reduce in float64, as KAN users fit (pykan's tutorials set float64 as torch's default dtype); twice
    the bytes of fp32 per number, and on most GPUs a fraction of its arithmetic throughput."""
    parallelism: Parallelism = "ddp"
    """Data parallelism: ddp (replicated parameters, all-reduced gradients) or fsdp (parameters,
    gradients and optimizer state sharded across ranks with torch.distributed.fsdp.fully_shard)."""
    comm_hook: CommHook = "default"
    """DDP gradient communication: default (DDP's built-in all-reduce), timed (all-reduce timed per
    bucket), noop (no network; for exposed communication), bf16 / fp16 (all-reduce of a compressed
    copy, timed), powersgd (low-rank PowerSGD, timed; rank ``powersgd_rank``)."""
    powersgd_rank: int = 1
    """comm_hook=powersgd: rank of the low-rank gradient approximation."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; gradients are all-reduced once per step (DDP no_sync on the
    others). The global batch stays the samples per optimizer step."""
    nccl_algo: str = ""
    """NCCL all-reduce algorithm (e.g. Ring, Tree), applied to all-reduce only; empty lets NCCL choose."""
    nccl_proto: str = ""
    """NCCL protocol (LL, LL128, Simple), applied to all-reduce only; empty lets NCCL choose."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MiB; every bucket, the first included, has this cap (torch 2.13 gives the
    first bucket 1 MiB only when no cap is passed)."""
    gradient_as_bucket_view: bool = False
    """DDP option: gradients are views into the all-reduce buckets (saves a copy and memory)."""
    static_graph: bool = False
    """DDP option: the graph is the same every iteration."""
    broadcast_buffers: bool = False
    """DDP option: broadcast buffers (the KAN grids) from rank 0 before every forward. Off: the grids
    change only in grid updates, which already leave every rank equal, so the broadcast is a wasted
    collective per step."""
    emulate_latency_s: float = 0.0
    """Emulated inter-node link latency per message (s); only for runs with nnodes > 1 (0 = off).
    Each bucket's all-reduce is delayed by what a ring all-reduce costs on such a link (docs/measurement.md)."""
    emulate_bandwidth_bytes_per_s: float = 0.0
    """Emulated inter-node link bandwidth (bytes/s); only for nnodes > 1 (0 = no limit)."""
    grid_update_every: int = 0
    """Refit spline grids to the data (all ranks' batches) every this many steps of each grid stage, from its step
    ``grid_update_every`` on (0 = never; kan only). Never at the first step of a run: there the hidden layers'
    inputs are those of the initialisation, several times narrower than a step later (docs/measurement.md)."""
    grid_update_until: int = 0
    """Grid updates stop at this step of each grid stage (pykan's ``stop_grid_update_step``: 50; 0 = update
    through every stage)."""
    grid_eps: float = 0.02
    """Grid update mix: 0 = knots at data quantiles, 1 = uniform knots (keeps the closed-form path exact)."""
    grid_extension: tuple[int, ...] = ()
    """Grid extension (kan only): the finer grid sizes the run moves to in turn after ``grid_size``, e.g. (10, 20)
    for pykan's 5 -> 10 -> 20. At each switch every layer's splines are refit onto the finer grid by least squares
    on the step's global batch (the function is kept) and the optimizer starts afresh; () = ``grid_size``
    throughout."""
    grid_extension_steps: tuple[int, ...] = ()
    """The step at which each ``grid_extension`` size starts (increasing); () = ``steps`` split evenly between
    ``grid_size`` and the extension sizes."""
    eval_every: int = 0
    """Evaluate the validation loss every this many steps, outside the timed region (0 = at the end only)."""
    target_val_loss: float = 0.0
    """Stop once the validation loss is at most this (needs eval_every; 0 = train all steps)."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0 = never)."""
    nan_policy: NanPolicy = "stop"
    """On a non-finite loss on any rank: stop the run, or skip the step on every rank."""
    pg_timeout_s: float = 300.0
    """Process-group collective timeout in seconds (a hung rank fails the run after this)."""
    out_dir: str = "outputs"
    """Root output folder; the run writes to ``out_dir/<study>/<run_key>/``."""

    def validate(self) -> None:
        if self.n_val == 0:
            self.n_val = default_n_val(self.task)
        if len(self.widths) < 2:
            raise ConfigError(f"widths: need at least 2 entries (input, output), got {list(self.widths)}")
        if any(w <= 0 for w in self.widths):
            raise ConfigError(f"widths: every width must be positive, got {list(self.widths)}")
        check_at_least(self, 1, "grid_size", "spline_order", "n_train", "n_val", "steps", "nnodes",
                       "nproc_per_node", "threads", "powersgd_rank", "grad_accum_steps", "lbfgs_max_iter",
                       "lbfgs_history")
        check_at_least(self, 0, "warmup_steps", "repeat", "seed", "grid_update_every", "checkpoint_every",
                       "lr_base_batch", "lr_warmup_steps", "eval_every", "grid_update_until", "global_batch")
        if self.global_batch == 0:
            self.global_batch = self._whole_training_set()
        check_positive(self, "lr", "bucket_cap_mb", "pg_timeout_s")
        # torch seeds with 64-bit integers (the data's per-epoch seed is seed * 1_000_003 + epoch), and the process
        # group's timeout is a count of milliseconds: bounded here rather than overflowing in the run (issue 23)
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed: must be at most 2**32 - 1 = {MAX_SEED}, got {self.seed!r}")
        if self.pg_timeout_s > MAX_PG_TIMEOUT_S:
            raise ConfigError(f"pg_timeout_s: must be at most {MAX_PG_TIMEOUT_S:g} s (one year), got "
                              f"{self.pg_timeout_s!r}")
        check_non_negative(self, "emulate_latency_s", "emulate_bandwidth_bytes_per_s", "target_val_loss")
        if self.warmup_steps >= self.steps:
            raise ConfigError(f"warmup_steps: must be smaller than steps={self.steps}, got {self.warmup_steps}")
        if not 0.0 <= self.grid_eps <= 1.0:
            raise ConfigError(f"grid_eps: must be in [0, 1], got {self.grid_eps!r}")
        if self.grid_update_every and self.model != "kan":
            raise ConfigError(f"grid_update_every: grid updates refit B-spline grids, but model={self.model!r}")
        self._validate_grid_extension()
        if self.optimizer == "lbfgs" and self.comm_hook in ("noop", "powersgd"):
            raise ConfigError(f"comm_hook: optimizer='lbfgs' needs the gradient of the loss on every rank, the same on "
                              f"all (its line search decides from it); comm_hook={self.comm_hook!r} gives "
                              f"{'each rank its own' if self.comm_hook == 'noop' else 'a low-rank approximation'}")
        lo, hi = self.grid_range if len(self.grid_range) == 2 else (0.0, 0.0)
        if len(self.grid_range) != 2 or not lo < hi:
            raise ConfigError(f"grid_range: need (low, high) with low < high, got {self.grid_range}")
        if self.global_batch % self.world_size:
            raise ConfigError(
                f"global_batch: {self.global_batch} is not divisible by the world size "
                f"{self.world_size} (nnodes={self.nnodes} x nproc_per_node={self.nproc_per_node})")
        if self.local_batch % self.grad_accum_steps:
            raise ConfigError(f"grad_accum_steps: the per-process batch {self.local_batch} is not divisible "
                              f"into {self.grad_accum_steps} micro-batches")
        if self.lr_rule != "none" and not self.lr_base_batch:
            raise ConfigError(f"lr_base_batch: lr_rule={self.lr_rule!r} scales lr by global_batch / lr_base_batch; "
                              f"set the batch lr is tuned for")
        if self.target_val_loss and not self.eval_every:
            raise ConfigError("eval_every: target_val_loss is checked at evaluations; set eval_every > 0")
        if self.target_val_loss and self.eval_every <= self.warmup_steps:
            raise ConfigError(f"eval_every: {self.eval_every} would let the target stop the run before the "
                              f"warm-up ({self.warmup_steps} steps) ends, leaving no step timed; use more")
        check_nccl(self)
        self._validate_comm()
        # the task and data-file checks live with the data; imported here, not at the top, because kanlib.data
        # imports torch and this module must stay importable without it (the analysis reads config fields)
        from kanlib.data import check_task

        check_task(self)

    def _whole_training_set(self) -> int:
        """What ``global_batch=0`` stands for: the training rows, rounded down to a multiple of the processes times
        the micro-batches, so that every rank's micro-batches are equal."""
        from kanlib.data import training_rows  # imports torch: late, as check_task

        rows = training_rows(self)
        unit = self.world_size * self.grad_accum_steps
        if rows < unit:
            raise ConfigError(f"global_batch: 0 stands for the whole training set, {rows} rows, fewer than the "
                              f"{self.world_size} processes x {self.grad_accum_steps} micro-batches; set n_train "
                              f"or global_batch")
        return rows // unit * unit

    def _validate_grid_extension(self) -> None:
        sizes = (self.grid_size, *self.grid_extension)
        if self.grid_extension and self.model != "kan":
            raise ConfigError(f"grid_extension: grid extension refines B-spline grids, but model={self.model!r}")
        if any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ConfigError(f"grid_extension: each size must be finer than the one before "
                              f"(grid_size={self.grid_size} first), got {list(self.grid_extension)}")
        if self.grid_extension_steps:
            starts = self.grid_extension_steps
            if len(starts) != len(self.grid_extension):
                raise ConfigError(f"grid_extension_steps: one start step per grid_extension size "
                                  f"({len(self.grid_extension)}), got {list(starts)}")
            if any(b <= a for a, b in zip((0, *starts), (*starts, self.steps))):
                raise ConfigError(f"grid_extension_steps: need 0 < s1 < s2 < ... < steps={self.steps}, "
                                  f"got {list(starts)}")
        elif self.steps < len(sizes):
            raise ConfigError(f"steps: {self.steps} steps cannot be split between {len(sizes)} grid sizes "
                              f"{list(sizes)}")

    def _validate_comm(self) -> None:
        emulated = self.emulate_latency_s > 0 or self.emulate_bandwidth_bytes_per_s > 0
        if emulated and self.comm_hook in ("default", "noop"):
            raise ConfigError(f"emulate_latency_s: the emulated link is a communication hook; it needs comm_hook "
                              f"timed, bf16, fp16 or powersgd, got comm_hook={self.comm_hook!r}")
        if self.parallelism == "fsdp":
            for name, off in (("comm_hook", "default"), ("grad_accum_steps", 1), ("static_graph", False),
                              ("gradient_as_bucket_view", False)):
                if getattr(self, name) != off:
                    raise ConfigError(f"{name}: a DDP option; parallelism='fsdp' needs {name}={off!r}, "
                                      f"got {getattr(self, name)!r}")

    @property
    def local_batch(self) -> int:
        """Samples per process per optimizer step."""
        return self.global_batch // self.world_size

    @property
    def emulated_link(self) -> bool:
        """Whether this run's gradient all-reduce goes through an emulated inter-node link."""
        return self.nnodes > 1 and (self.emulate_latency_s > 0 or self.emulate_bandwidth_bytes_per_s > 0)

    def key_prefix(self) -> str:
        return f"{self.model}-w{self.placement}-b{self.global_batch}-r{self.repeat}"


def default_n_val(task: str) -> int:
    """The validation rows ``n_val=0`` stands for: 2048, or a fifth of a bundled set's rows if fewer (so every
    bundled task runs with its defaults)."""
    from kanlib.data import BUNDLED  # imports torch: late, as check_task

    return min(2048, BUNDLED[task].rows // 5) if task in BUNDLED else 2048


# -- the generic rule ------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def coerce(name: str, v, hint):
    """``v`` as the type ``hint`` declares, or :class:`ConfigError` naming ``name``: the one coercion rule of
    every config field, CLI argument and notebook parameter (runners.notebook)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if v not in allowed:
            raise ConfigError(f"{name}: unknown value {v!r}; choose one of {', '.join(map(str, allowed))}")
        return v
    if hint is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name}: must be true or false, got {v!r}")
        return v
    if hint is int:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{name}: expected an integer, got {v!r}")
        return v
    if hint is float:
        if isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, float):
            raise ConfigError(f"{name}: expected a number, got {v!r}")
        if not math.isfinite(v):
            raise ConfigError(f"{name}: must be finite, got {v!r}")
        return v
    if hint is str:
        if not isinstance(v, str):
            raise ConfigError(f"{name}: expected a string, got {v!r}")
        if _CONTROL.search(v):
            raise ConfigError(f"{name}: control characters (newline, tab, ...) are not allowed, got {v!r}")
        return v
    if origin is tuple:
        args = typing.get_args(hint)
        elem = args[0]
        if isinstance(v, (str, bytes)) or not isinstance(v, (tuple, list)):
            raise ConfigError(f"{name}: expected a sequence of numbers, got {v!r}")
        if len(args) != 2 or args[1] is not Ellipsis:
            if len(v) != len(args):
                raise ConfigError(f"{name}: expected {len(args)} numbers, got {v!r}")
        return tuple(coerce(name, e, elem) for e in v)
    raise TypeError(f"{name}: config fields of type {hint!r} are not supported")


def parse_text(name: str, raw: str, hint):
    """A string of the command line (or of papermill) turned into the Python value ``hint`` asks for, checked
    afterwards by :func:`coerce`; :class:`ConfigError` naming ``name`` when it cannot be read."""
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            elem = typing.get_args(hint)[0]
            if raw.strip() == "":
                return ()
            parts = raw.split(",")
            if any(x.strip() == "" for x in parts):
                raise ConfigError(f"{name}: an empty entry in {raw!r} (two commas, or one at an end); write the "
                                  f"numbers separated by single commas")
            return tuple(elem(x) for x in parts)
        if hint is bool:
            low = raw.lower()
            if low in ("1", "true", "yes"):
                return True
            if low in ("0", "false", "no"):
                return False
            raise ValueError(raw)
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        return raw
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"{name}: cannot read {raw!r} as {getattr(hint, '__name__', hint)}") from None


def check_at_least(cfg, low: int, *names: str) -> None:
    """Refuse, naming the field, any of ``names`` whose value is below ``low`` (shared by every config)."""
    for name in names:
        if getattr(cfg, name) < low:
            raise ConfigError(f"{name}: must be {'positive' if low == 1 else f'>= {low}'}, got {getattr(cfg, name)!r}")


def check_positive(cfg, *names: str) -> None:
    """Refuse, naming the field, any of ``names`` that is not > 0."""
    for name in names:
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name}: must be positive, got {getattr(cfg, name)!r}")


def check_non_negative(cfg, *names: str) -> None:
    """Refuse, naming the field, any of ``names`` that is not >= 0."""
    for name in names:
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"{name}: must be >= 0, got {getattr(cfg, name)!r}")


def check_nccl(cfg) -> None:
    """The NCCL settings of a config (``nccl_algo``, ``nccl_proto``, ``backend``, ``device``): known values, and
    only where NCCL runs (gloo would ignore them, and the record would say they were used)."""
    for name, allowed in (("nccl_algo", NCCL_ALGOS), ("nccl_proto", NCCL_PROTOS)):
        v = getattr(cfg, name)
        if v and v.lower() not in allowed:
            raise ConfigError(f"{name}: unknown value {v!r}; choose from {', '.join(allowed)} (any case)")
        if v and (cfg.backend == "gloo" or cfg.device == "cpu"):
            raise ConfigError(f"{name}: {v!r} is an NCCL setting, but backend={cfg.backend!r}, "
                              f"device={cfg.device!r} (gloo would ignore it)")
    if cfg.backend == "nccl" and cfg.device == "cpu":
        raise ConfigError("backend: 'nccl' needs device cuda, got device='cpu'")


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def field_docs(cls=RunConfig) -> dict[str, str]:
    """Field name -> its docstring, read from the source of ``cls`` (for docs and notebooks)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if (isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                and "ClassVar" not in ast.unparse(a.annotation)):
            docs[a.target.id] = b.value.value
    return docs


__all__ = ["Config", "RunConfig", "ConfigError", "parse_placement", "field_docs", "GROUP_FIELDS", "group_key"]
