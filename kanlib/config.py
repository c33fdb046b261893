"""RunConfig: one dataclass fully describing one training run.

Every field is typed and documented; ``__post_init__`` checks each value once and
raises :class:`ConfigError` naming the field and the bad value, so a bad config
fails before any process starts. ``--key=value`` overrides (the torchrun entry
point) are parsed against the dataclass: an unknown key is an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass, fields

MODELS = ("kan", "kan_rbf", "kan_cheb", "mlp")
KAN_IMPLS = ("reference", "fast", "compiled")
TASKS = ("exp_sin", "highdim", "product", "file")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
COMM_HOOKS = ("default", "timed", "noop")
NAN_POLICIES = ("stop", "skip")
OPTIMIZERS = ("adam", "sgd")
NCCL_ALGOS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")

# Inputs of fixed width for the tasks that have one (``highdim`` takes widths[0]).
TASK_INPUT_DIM = {"exp_sin": 2, "product": 2}


class ConfigError(ValueError):
    """A config field holds a value that cannot run; the message names the field."""


@dataclass
class RunConfig:
    """One run of DDP KAN training. Field docstrings follow each field."""

    study: str = "adhoc"
    """Name of the study this run belongs to; records are written under ``out_dir/<study>/``."""
    model: str = "kan"
    """Model kind: kan (exact B-spline), kan_rbf (Gaussian RBF basis), kan_cheb (Chebyshev basis), mlp."""
    widths: tuple[int, ...] = (2, 16, 16, 1)
    """Layer widths, input first, output last (at least two entries)."""
    grid_size: int = 5
    """Number of grid intervals of each spline (KAN models)."""
    spline_order: int = 3
    """B-spline order k (3 = cubic)."""
    grid_range: tuple[float, float] = (-1.0, 1.0)
    """Lower and upper end of the initial spline grid."""
    kan_impl: str = "fast"
    """B-spline KAN implementation: reference (Cox-de Boor recursion), fast (closed form, fused GEMM,
    basis recomputed in backward) or compiled (fast with torch.compile'd basis kernels)."""
    task: str = "exp_sin"
    """Regression task: exp_sin (exp(sin(pi x1) + x2^2)), highdim (exp(mean sin^2(pi x_i/2))), product (x1 x2),
    or file (real data from ``data_path``)."""
    data_path: str = ""
    """task=file: a CSV file with a header row (numeric columns) or an .npz file with arrays x and y."""
    target: str = ""
    """task=file, CSV: the target column (default: the last column); every other column is a feature."""
    n_train: int = 16384
    """Number of training samples generated from ``seed``."""
    n_val: int = 2048
    """Number of held-out validation samples."""
    global_batch: int = 256
    """Samples per optimizer step summed over all processes; split evenly across ranks."""
    steps: int = 30
    """Optimizer steps in total, warm-up included."""
    warmup_steps: int = 5
    """Leading steps excluded from timing (DDP rebuilds buckets in the first iteration)."""
    lr: float = 1e-3
    """Learning rate."""
    optimizer: str = "adam"
    """Optimizer: adam or sgd."""
    seed: int = 0
    """Seed of data, initialisation and sampling order."""
    repeat: int = 0
    """Repeat index of an otherwise identical run (each repeat is its own process group)."""
    nnodes: int = 1
    """Number of nodes (one torchrun per node)."""
    nproc_per_node: int = 1
    """Processes per node; world size = nnodes * nproc_per_node."""
    backend: str = "auto"
    """Process-group backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""
    device: str = "auto"
    """Device: auto (cuda if available), cpu or cuda."""
    threads: int = 1
    """torch intra-op threads per process."""
    precision: str = "fp32"
    """fp32, or bf16 autocast with float32 master weights (CUDA)."""
    comm_hook: str = "default"
    """DDP communication: default (built-in all-reduce), timed (all-reduce timed per bucket), noop (no network)."""
    nccl_algo: str = ""
    """NCCL all-reduce algorithm exported as NCCL_ALGO (e.g. Ring, Tree); empty lets NCCL choose."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MiB."""
    gradient_as_bucket_view: bool = False
    """DDP option: gradients are views into the all-reduce buckets."""
    static_graph: bool = False
    """DDP option: the graph is the same every iteration."""
    broadcast_buffers: bool = False
    """DDP option: broadcast buffers (the KAN grids) from rank 0 before every forward. Off: the grids
    change only in grid updates, which already leave every rank equal, so the broadcast is a wasted
    collective per step."""
    grid_update_every: int = 0
    """Refit spline grids to the data (all ranks' batches) every this many steps (0 = never; kan only)."""
    grid_eps: float = 0.02
    """Grid update mix: 0 = knots at data quantiles, 1 = uniform knots (keeps the fast path exact-fast)."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0 = never)."""
    nan_policy: str = "stop"
    """On a non-finite loss on any rank: stop the run, or skip the step on every rank."""
    pg_timeout_s: float = 300.0
    """Process-group collective timeout in seconds (a hung rank fails the run after this)."""
    out_dir: str = "outputs"
    """Root output folder; the run writes to ``out_dir/<study>/<run_key>/``."""

    def __post_init__(self) -> None:
        # Coerce numbers to the declared types, so RunConfig(lr=1) and the CLI's --lr=1.0 are the
        # same config (the same run_key) and a bool given as a string is refused.
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("float", float) and isinstance(v, int) and not isinstance(v, bool):
                setattr(self, f.name, float(v))
            elif f.type in ("int", int) and isinstance(v, float) and v.is_integer():
                setattr(self, f.name, int(v))
            elif f.type in ("bool", bool) and not isinstance(v, bool):
                raise ConfigError(f"{f.name}: must be true or false, got {v!r}")
            want = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else "")
            v = getattr(self, f.name)
            if want is not None and (not isinstance(v, want) or isinstance(v, bool)):
                raise ConfigError(f"{f.name}: expected {want.__name__}, got {v!r}")
            if f.type.startswith("tuple") and not (isinstance(v, (tuple, list))
                                                   and all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                           for e in v)):
                raise ConfigError(f"{f.name}: expected a sequence of numbers, got {v!r}")
        self.widths = tuple(int(w) for w in self.widths)
        self.grid_range = tuple(float(v) for v in self.grid_range)
        _choice(self, "model", MODELS)
        _choice(self, "kan_impl", KAN_IMPLS)
        _choice(self, "task", TASKS)
        _choice(self, "backend", BACKENDS)
        _choice(self, "device", DEVICES)
        _choice(self, "precision", PRECISIONS)
        _choice(self, "comm_hook", COMM_HOOKS)
        _choice(self, "nan_policy", NAN_POLICIES)
        _choice(self, "optimizer", OPTIMIZERS)
        if len(self.widths) < 2:
            raise ConfigError(f"widths: need at least 2 entries (input, output), got {list(self.widths)}")
        if any(w <= 0 for w in self.widths):
            raise ConfigError(f"widths: every width must be positive, got {list(self.widths)}")
        for name in ("grid_size", "spline_order", "n_train", "n_val", "global_batch", "steps",
                     "nnodes", "nproc_per_node", "threads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "repeat", "seed", "grid_update_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.warmup_steps >= self.steps:
            raise ConfigError(f"warmup_steps: must be smaller than steps={self.steps}, got {self.warmup_steps}")
        if not 0.0 <= self.grid_eps <= 1.0:
            raise ConfigError(f"grid_eps: must be in [0, 1], got {self.grid_eps!r}")
        if self.grid_update_every and self.model != "kan":
            raise ConfigError(f"grid_update_every: grid updates refit B-spline grids, but model={self.model!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr: must be positive, got {self.lr!r}")
        if not self.bucket_cap_mb > 0:
            raise ConfigError(f"bucket_cap_mb: must be positive, got {self.bucket_cap_mb!r}")
        if not self.pg_timeout_s > 0:
            raise ConfigError(f"pg_timeout_s: must be positive, got {self.pg_timeout_s!r}")
        lo, hi = self.grid_range if len(self.grid_range) == 2 else (0.0, 0.0)
        if len(self.grid_range) != 2 or not lo < hi:
            raise ConfigError(f"grid_range: need (low, high) with low < high, got {self.grid_range}")
        if self.task == "file":
            if not self.data_path:
                raise ConfigError("data_path: task 'file' needs a data file (CSV or .npz), got ''")
            if not os.path.isfile(self.data_path):
                raise ConfigError(f"data_path: no such file {self.data_path!r}")
            if not self.data_path.endswith((".csv", ".npz")):
                raise ConfigError(f"data_path: expected a .csv or .npz file, got {self.data_path!r}")
        elif self.data_path or self.target:
            raise ConfigError(f"data_path: only task 'file' reads a data file, but task={self.task!r}")
        want = TASK_INPUT_DIM.get(self.task)
        if want is not None and self.widths[0] != want:
            raise ConfigError(f"widths: task {self.task!r} has {want} inputs, but widths[0]={self.widths[0]}")
        if self.widths[-1] != 1:
            raise ConfigError(f"widths: the regression tasks have 1 output, but widths[-1]={self.widths[-1]}")
        if self.global_batch % self.world_size:
            raise ConfigError(
                f"global_batch: {self.global_batch} is not divisible by the world size "
                f"{self.world_size} (nnodes={self.nnodes} x nproc_per_node={self.nproc_per_node})")
        if self.global_batch > self.n_train and self.task != "file":
            raise ConfigError(f"global_batch: {self.global_batch} exceeds n_train={self.n_train}")
        if self.nccl_algo and self.nccl_algo.split(",")[0].split(":")[-1].lower() not in NCCL_ALGOS:
            raise ConfigError(f"nccl_algo: unknown value {self.nccl_algo!r}; choose from {', '.join(NCCL_ALGOS)}")
        if self.nccl_algo and (self.backend == "gloo" or self.device == "cpu"):
            raise ConfigError(f"nccl_algo: {self.nccl_algo!r} needs the nccl backend, got backend={self.backend!r}")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("backend: 'nccl' needs device cuda, got device='cpu'")

    # -- derived ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Total number of processes."""
        return self.nnodes * self.nproc_per_node

    @property
    def local_batch(self) -> int:
        """Samples per process per step."""
        return self.global_batch // self.world_size

    def to_dict(self) -> dict:
        """Plain JSON-able dict of every field (tuples become lists)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}

    def replace(self, **changes) -> "RunConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def run_key(self, code_version: str | None = None) -> str:
        """Stable key of this run: the study, a readable prefix and a hash of the canonical config.

        ``out_dir`` is left out (moving a study keeps its keys); ``code_version``
        (default: the package version) is hashed in, so changed code reruns.
        """
        from kanlib import __version__

        d = self.to_dict()
        d.pop("out_dir")
        d["code_version"] = code_version or __version__
        digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        return (f"{self.model}-w{self.nnodes}x{self.nproc_per_node}-b{self.global_batch}"
                f"-r{self.repeat}-{digest}")

    def run_dir(self) -> str:
        """Folder of this run's files: ``out_dir/<study>/<run_key>``."""
        return os.path.join(self.out_dir, self.study, self.run_key())

    # -- command line -----------------------------------------------------------------
    def to_cli(self) -> list[str]:
        """``--key=value`` arguments that :meth:`from_cli` turns back into this config."""
        out = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = ",".join(repr(x) if isinstance(x, float) else str(x) for x in v)
            out.append(f"--{f.name}={v}")
        return out

    @classmethod
    def from_cli(cls, argv: list[str]) -> "RunConfig":
        """Parse ``--key=value`` arguments, type-checked against the fields."""
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for arg in argv:
            if not arg.startswith("--") or "=" not in arg:
                raise ConfigError(f"expected --key=value, got {arg!r}")
            key, raw = arg[2:].split("=", 1)
            key = key.replace("-", "_")
            if key not in hints:
                known = ", ".join(f.name for f in fields(cls))
                raise ConfigError(f"{key}: unknown config field (known: {known})")
            kwargs[key] = _parse(key, raw, hints[key])
        return cls(**kwargs)


def field_docs() -> dict[str, str]:
    """Field name -> its docstring, read from this module's source (for docs and notebooks)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(RunConfig))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = b.value.value
    return docs


def _choice(cfg: RunConfig, name: str, allowed: tuple[str, ...]) -> None:
    v = getattr(cfg, name)
    if v not in allowed:
        raise ConfigError(f"{name}: unknown value {v!r}; choose one of {', '.join(allowed)}")


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def _parse(key: str, raw: str, hint):
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            args = typing.get_args(hint)
            elem = args[0]
            return tuple(elem(x) for x in raw.split(",") if x.strip() != "")
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
    except ValueError:
        raise ConfigError(f"{key}: cannot read {raw!r} as {getattr(hint, '__name__', hint)}") from None


__all__ = ["RunConfig", "ConfigError", "field_docs", "MODELS", "TASKS"]
